"""The baseline attnviz is measured against: the tutorials' way, written by hand.

BertTokenizer + BertModel give the embeddings, a fresh multi-head attention layer (as the
tutorials build it) computes the weights, and seaborn draws one annotated heatmap per head,
saved one by one, plus a grid and a JSON file: the same files `attnviz heads` writes.

    python bench/reference_tutorial.py MODEL_DIR "text" OUT_DIR
"""

import json
import math
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import seaborn as sns  # noqa: E402
import torch  # noqa: E402
from torch import nn  # noqa: E402
from transformers import BertModel, BertTokenizer  # noqa: E402


class MultiHeadAttention(nn.Module):
    def __init__(self, d_model, num_heads):
        super().__init__()
        self.num_heads, self.d_k = num_heads, d_model // num_heads
        self.query, self.key, self.value = (nn.Linear(d_model, d_model) for _ in range(3))
        self.fc_out = nn.Linear(d_model, d_model)

    def forward(self, x):
        batch, length, _ = x.shape
        q = self.query(x).view(batch, length, self.num_heads, self.d_k).permute(0, 2, 1, 3)
        k = self.key(x).view(batch, length, self.num_heads, self.d_k).permute(0, 2, 1, 3)
        v = self.value(x).view(batch, length, self.num_heads, self.d_k).permute(0, 2, 1, 3)
        weights = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(self.d_k), dim=-1)
        out = (weights @ v).permute(0, 2, 1, 3).contiguous().view(batch, length, -1)
        return self.fc_out(out), weights


def main(model_dir: str, text: str, out_dir: str) -> None:
    plt.rcParams["font.sans-serif"] = ["Noto Sans CJK SC", "DejaVu Sans"]
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = BertTokenizer.from_pretrained(model_dir)
    bert = BertModel.from_pretrained(model_dir).eval()
    inputs = tokenizer(text, return_tensors="pt")
    tokens = tokenizer.convert_ids_to_tokens(inputs["input_ids"][0])
    with torch.no_grad():
        embeddings = bert(**inputs, output_hidden_states=True).hidden_states[0]
        attention = MultiHeadAttention(bert.config.hidden_size, bert.config.num_attention_heads).eval()
        _, weights = attention(embeddings)
    weights = weights[0].numpy()

    for head in range(weights.shape[0]):
        plt.figure(figsize=(8, 6))
        sns.heatmap(weights[head], annot=True, fmt=".2f", cmap="viridis", xticklabels=tokens, yticklabels=tokens)
        plt.title(f"head {head}")
        plt.xlabel("key")
        plt.ylabel("query")
        plt.tight_layout()
        plt.savefig(out / f"head_{head:02d}.png", dpi=120)
        plt.close()

    columns = 4
    rows = math.ceil(weights.shape[0] / columns)
    fig, axes = plt.subplots(rows, columns, figsize=(4 * columns, 4 * rows))
    for head, ax in enumerate(axes.flat):
        sns.heatmap(weights[head], ax=ax, cmap="viridis", xticklabels=tokens, yticklabels=tokens, cbar=False)
        ax.set_title(f"head {head}")
    plt.tight_layout()
    plt.savefig(out / "heads.png", dpi=120)
    plt.close()
    (out / "attention.json").write_text(json.dumps({"tokens": tokens, "attention": weights.tolist()}))


if __name__ == "__main__":
    main(*sys.argv[1:4])
