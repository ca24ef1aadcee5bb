"""Issue 38's patching row: every head of SmolLM2 patched from a clean text into a corrupted one, on a 20-token pair.

    python bench/patch_budget.py [--repeat 3]

Two ways to the same 270 scores (30 layers × 9 heads), in one process, each the best of --repeat after a warm-up:
- attnviz: analysis.patching.patch_heads (output patching, with the direct attribution): one forward pass of each
  text records what enters each layer and each W_o; each layer's 9 copies of the corrupted run (each with another
  head's output from the clean run) run from that layer on as one batch;
- forwards: transformers' AutoModelForCausalLM (SDPA, float32) run whole 270 times over the corrupted text, once
  per head, with a pre-hook on that layer's o_proj that puts the clean run's slice there (the naive way, and the
  tests' reference).
And the direct attribution alone (the clean pass recorded, then analysis.attribution.direct_attribution) against one
forward pass of transformers' model: its budget is 2 passes. Prints one JSON line.
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

# 20 tokens each in SmolLM2's tokenizer: the indirect object (Mary) and the subject (John) swapped at the second mention
CLEAN = "When Mary and John went to the big store in the town on Friday, John gave a drink to"
CORRUPT = "When Mary and John went to the big store in the town on Friday, Mary gave a drink to"
ANSWER, WRONG = " Mary", " John"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()

    from transformers import AutoModelForCausalLM, AutoTokenizer

    from attnviz.analysis.attribution import direct_attribution
    from attnviz.analysis.effect import text_inputs
    from attnviz.analysis.patching import patch_heads, recorded_pass
    from attnviz.models.loading import load_model
    from smollm2_reference import reference_folder
    from attnviz.spec import RunSpec

    folder = reference_folder()  # transformers' float32 model of the GGUF file
    tokenizer = AutoTokenizer.from_pretrained(folder)
    clean_ids, corrupt_ids = (tokenizer(text, return_tensors="pt")["input_ids"] for text in (CLEAN, CORRUPT))
    assert clean_ids.shape[1] == corrupt_ids.shape[1] == 20, (clean_ids.shape, corrupt_ids.shape)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32, attn_implementation="sdpa").eval()
    config = model.config
    num_layers, num_heads = config.num_hidden_layers, config.num_attention_heads
    head_dim = config.hidden_size // num_heads
    seen = {}
    hooks = [
        model.model.layers[layer].self_attn.o_proj.register_forward_pre_hook(lambda m, a, layer=layer: seen.__setitem__(layer, a[0].clone()))
        for layer in range(num_layers)
    ]
    with torch.inference_mode():
        model(clean_ids, use_cache=False)
    for hook in hooks:
        hook.remove()

    def forwards() -> None:
        for layer in range(num_layers):
            projection = model.model.layers[layer].self_attn.o_proj
            for head in range(num_heads):
                part = slice(head * head_dim, (head + 1) * head_dim)

                def patch(module, inputs, part=part, layer=layer):
                    x = inputs[0].clone()
                    x[..., part] = seen[layer][..., part]
                    return (x,)

                hook = projection.register_forward_pre_hook(patch)
                with torch.inference_mode():
                    model(corrupt_ids, use_cache=False)
                hook.remove()

    def one_forward() -> None:
        with torch.inference_mode():
            model(clean_ids, use_cache=False)

    forwards_s = best_of(forwards, args.repeat)
    forward_s = best_of(one_forward, args.repeat * 3)
    forwards_peak = peak_mb()

    loaded = load_model("smollm2", device="cpu")
    spec = RunSpec("smollm2", loaded.name, loaded.source, device="cpu")
    patching = lambda: patch_heads(loaded, CLEAN, CORRUPT, ANSWER, WRONG, spec)  # noqa: E731
    assert len(patching().tokens) == 20
    attnviz_s = best_of(patching, args.repeat)
    inputs, source, _, _ = text_inputs(loaded, CLEAN, spec)
    weight, _ = loaded.model.output_head()
    direction = (weight[tokenizer(ANSWER, add_special_tokens=False)["input_ids"][0]] - weight[tokenizer(WRONG, add_special_tokens=False)["input_ids"][0]]).double()

    def attribution() -> None:
        with torch.inference_mode():
            recorded, _, final_input = recorded_pass(loaded.model, inputs, None, source)
            direct_attribution(loaded, None, recorded, final_input, 19, direction, 0.0)

    direct_s = best_of(attribution, args.repeat * 3)
    print(json.dumps({
        "model": "SmolLM2-135M", "tokens": 20, "heads_patched": num_layers * num_heads, "threads": torch.get_num_threads(),
        "forwards_s": round(forwards_s, 3), "forwards_peak_mb": round(forwards_peak),
        "attnviz_s": round(attnviz_s, 3), "peak_mb": round(peak_mb()),
        "attnviz_over_forwards": round(attnviz_s / forwards_s, 3),
        "forward_s": round(forward_s, 4), "direct_s": round(direct_s, 4), "direct_over_forward": round(direct_s / forward_s, 2),
    }))  # fmt: skip


if __name__ == "__main__":
    main()
