"""Issue 26's effect row: every head of every layer of SmolLM2 taken out, one at a time, on a 64-token text.

    python bench/effect.py [--tokens 64] [--ablation zero] [--repeat 3]

Two ways to the same 270 numbers (30 layers × 9 heads), in one process, each the best of --repeat after a warm-up:
- attnviz: analysis.effect.head_effects: one forward pass records what enters each layer; each layer's 9 copies
  (each with another head taken out) run from that layer on as one batch;
- forwards: transformers' AutoModelForCausalLM (SDPA, float32) run whole 270 times, once per head, with a pre-hook
  on that layer's o_proj that zeroes the head's slice (the naive way, and the tests' reference).
Peak memory: the process's peak resident set after each (ru_maxrss; the forwards run first). Prints one JSON line.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from timing import best_of, peak_mb  # noqa: E402

TEXT = (
    "Attention lets every token look at every other token of the text, weighting each by how well its key "
    "matches the query; a head is one such weighting, and a model has hundreds of them, in layer after layer. "
) * 4


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--ablation", default="zero", choices=("zero", "mean"))
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()

    from transformers import AutoModelForCausalLM, AutoTokenizer

    from attnviz.analysis.effect import head_effects
    from attnviz.models.loading import load_model
    from smollm2_reference import reference_folder
    from attnviz.spec import RunSpec

    folder = reference_folder()  # transformers' float32 model of the GGUF file
    tokenizer = AutoTokenizer.from_pretrained(folder)
    ids = tokenizer(TEXT, return_tensors="pt")["input_ids"][:, : args.tokens]
    text = tokenizer.decode(ids[0])
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32, attn_implementation="sdpa").eval()
    config = model.config
    num_layers, num_heads = config.num_hidden_layers, config.num_attention_heads
    head_dim = config.hidden_size // num_heads

    def forwards() -> None:
        for layer in range(num_layers):
            projection = model.model.layers[layer].self_attn.o_proj
            for head in range(num_heads):
                def zero(module, inputs, head=head):
                    x = inputs[0].clone()
                    x[..., head * head_dim : (head + 1) * head_dim] = 0.0
                    return (x,)

                hook = projection.register_forward_pre_hook(zero)
                with torch.inference_mode():
                    model(ids, use_cache=False)
                hook.remove()

    forwards_s = best_of(forwards, args.repeat)
    forwards_peak = peak_mb()

    loaded = load_model("smollm2", device="cpu")
    spec = RunSpec("smollm2", loaded.name, loaded.source, device="cpu")
    measured = head_effects(loaded, text, spec, args.ablation)
    assert len(measured.tokens) == ids.shape[1], (len(measured.tokens), ids.shape[1])
    attnviz_s = best_of(lambda: head_effects(loaded, text, spec, args.ablation), args.repeat)
    print(json.dumps({
        "model": "SmolLM2-135M", "tokens": ids.shape[1], "heads_taken_out": num_layers * num_heads,
        "ablation": args.ablation, "threads": torch.get_num_threads(),
        "forwards_s": round(forwards_s, 3), "forwards_peak_mb": round(forwards_peak),
        "attnviz_s": round(attnviz_s, 3), "peak_mb": round(peak_mb()),
        "attnviz_over_forwards": round(attnviz_s / forwards_s, 3),
    }))  # fmt: skip


if __name__ == "__main__":
    main()
