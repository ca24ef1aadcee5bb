"""Where copying's threshold comes from (analysis/roles.py ROLES, docs/measures.md "Roles: when a head is labelled").

    python bench/copying_threshold.py [--tokens 64] [--rotations 5]

On SmolLM2-135M, every head's copying score Σ Re λ / Σ |λ| (analysis/circuits.copying), beside two readings:
- what the head does: its full OV circuit (the norms' weights folded in, as copying's) read for --tokens random
  tokens of the ordinary vocabulary (its middle 80 %, seed 0): the attended token's own logit ranked among all
  V, and the share of tokens where it is in the top 1 %;
- a null: the same head with W_O turned by --rotations random rotations of its d_head space (the same singular
  values, the alignment of W_V and W_O broken), scored the same way.
Prints one JSON line: per band of the score, the heads and their mean top-1 % share; the null's shares above
0.5, 0.8 and 0.9; the heads above each.
"""

from __future__ import annotations

import argparse
import json

import numpy as np
import torch


def ratio(eigenvalues) -> float:
    return float(eigenvalues.real.sum() / eigenvalues.abs().sum())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--rotations", type=int, default=5)
    args = parser.parse_args()

    import attnviz
    from attnviz.analysis.circuits import copying

    loaded = attnviz.load("smollm2", device="cpu").loaded
    model, family = loaded.model, loaded.family
    base = model.model
    scores = copying(loaded)  # (L, H)
    generator = torch.Generator().manual_seed(0)
    top_share, null = [], []
    with torch.no_grad():
        unembedding, _ = model.output_head()
        unembedding = unembedding.float() * base.get_submodule(family.final_norm_name(None)).weight.float()  # (V, D)
        embedding = base.get_input_embeddings().weight.float()  # (V, D)
        vocabulary = embedding.shape[0]
        tokens = torch.randint(vocabulary // 10, vocabulary - vocabulary // 10, (args.tokens,), generator=generator)
        through_vocabulary = (embedding.T @ unembedding).double()  # (D, D)
        for layer in range(model.num_layers()):
            weights = model.attention_weights(layer)
            norm = base.get_submodule(family.attention_norm.format(index=layer)).weight.float()
            values, outputs = weights.w_v[0].float() * norm, weights.w_o[0].float()  # (H_kv d, D), (D, H d)
            head_dim, group = weights.head_dim, weights.num_heads // weights.num_kv_heads
            for head in range(weights.num_heads):
                w_v = values[(head // group) * head_dim : (head // group + 1) * head_dim]  # (d, D)
                w_o = outputs[:, head * head_dim : (head + 1) * head_dim]  # (D, d)
                logits = embedding[tokens] @ w_v.T @ w_o.T @ unembedding.T  # (T, V): the OV circuit's rows
                own = logits[torch.arange(args.tokens), tokens]
                rank = (logits > own[:, None]).sum(-1)  # 0: the token's own logit is the largest
                top_share.append(float((rank < vocabulary / 100).float().mean()))
                for _ in range(args.rotations):
                    rotation, _ = torch.linalg.qr(torch.randn(head_dim, head_dim, dtype=torch.float64, generator=generator))
                    null.append(ratio(torch.linalg.eigvals(w_v.double() @ through_vocabulary @ w_o.double() @ rotation)))
    flat, top_share, null = scores.ravel(), np.array(top_share), np.array(null)
    bands = [(-1.0, 0.5), (0.5, 0.8), (0.8, 0.9), (0.9, 1.0)]
    result = {
        "heads": int(flat.size),
        "bands": [{"score": f"({low}, {high}]", "heads": int(((flat > low) & (flat <= high)).sum()),
                   "mean_top_1pct": round(float(top_share[(flat > low) & (flat <= high)].mean()), 3),
                   "max_top_1pct": round(float(top_share[(flat > low) & (flat <= high)].max()), 3)} for low, high in bands],  # fmt: skip
        "null_above": {str(t): round(float((null > t).mean()), 4) for t in (0.5, 0.8, 0.9)},
        "heads_above": {str(t): int((flat > t).sum()) for t in (0.5, 0.8, 0.9)},
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
