"""Issue 26's generate row: SmolLM2 continues a prompt by --tokens tokens, greedy, every generated token's attention kept.

    python bench/generate.py [--prompt-tokens 64] [--tokens 64] [--repeat 3]

In one process, each the best of --repeat after a warm-up; the peak resident set (ru_maxrss) after attnviz, which
runs first, and after both (transformers' eager generate holds every layer's attentions of the prompt):
- transformers: AutoModelForCausalLM.generate (float32, eager attention, output_attentions=True,
  return_dict_in_generate=True): the library's own way to the same rows (the tests' reference);
- transformers, no attentions: generate with SDPA and no attentions: the cost of generating alone;
- attnviz: analysis.generation.generate, the numbers of `attnviz generate` (no figures): the model generating with
  its cache, attnviz's layers reading each new token with their own cache.
Prints one JSON line.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from timing import best_of, peak_mb, sample_ids  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompt-tokens", type=int, default=64)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()

    from transformers import AutoModelForCausalLM, AutoTokenizer

    from attnviz.analysis.generation import generate
    from attnviz.models.loading import load_model
    from smollm2_reference import reference_folder
    from attnviz.spec import run_spec

    folder = reference_folder()  # transformers' float32 model of the GGUF file
    tokenizer = AutoTokenizer.from_pretrained(folder)
    ids, prompt = sample_ids(tokenizer, args.prompt_tokens)
    options = dict(max_new_tokens=args.tokens, min_new_tokens=args.tokens, do_sample=False, pad_token_id=0)
    eager = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32, attn_implementation="eager").eval()
    sdpa = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32, attn_implementation="sdpa").eval()

    def library(model, attentions: bool):
        def run():
            with torch.inference_mode():
                model.generate(ids, attention_mask=torch.ones_like(ids), output_attentions=attentions, return_dict_in_generate=True, **options)

        return run

    loaded = load_model("smollm2", device="cpu")  # attnviz first: its peak is its own, the library's comes after
    spec = run_spec(loaded, "smollm2", layer=0, device="cpu")
    made = generate(loaded, prompt, spec, args.tokens)
    attnviz_s = best_of(lambda: generate(loaded, prompt, spec, args.tokens), args.repeat)
    attnviz_peak = peak_mb()
    eager_s = best_of(library(eager, True), args.repeat)
    sdpa_s = best_of(library(sdpa, False), args.repeat)
    print(json.dumps({
        "model": "SmolLM2-135M", "prompt_tokens": made.num_prompt, "generated": len(made.ids), "threads": torch.get_num_threads(),
        "transformers_eager_attentions_s": round(eager_s, 3), "transformers_sdpa_s": round(sdpa_s, 3),
        "attnviz_s": round(attnviz_s, 3), "attnviz_peak_mb": round(attnviz_peak), "peak_mb_after_both": round(peak_mb()),
        "attnviz_over_eager_attentions": round(attnviz_s / eager_s, 2), "attnviz_over_sdpa": round(attnviz_s / sdpa_s, 2),
    }))  # fmt: skip


if __name__ == "__main__":
    main()
