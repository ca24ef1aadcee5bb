"""Issue 46's `why` row: a score of SmolLM2 split into its terms, against transformers' SDPA forward of the same text.

    python bench/why.py [--tokens 1024] [--repeat 3] [--layer 18] [--head 6]

The text (sample_inputs/en.txt repeated, cut to --tokens of SmolLM2's tokenizer) goes, in one process, through
transformers' AutoModelForCausalLM (SDPA, float32: one forward pass, the model's own cost) and through attnviz.why
(the model loaded once before: its one pass capturing each layer's input, W_o inputs and MLP outputs, attnviz's layer
at the layer, the parts at the query's and the key's positions, the terms), the last token as the query. Each the
best of --repeat after a warm-up; the process's peak resident set after each. Prints one JSON line.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from timing import best_of, peak_mb, smollm2_forward  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=1024)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--layer", type=int, default=18)
    parser.add_argument("--head", type=int, default=6)
    args = parser.parse_args()
    import attnviz

    text, forward_s, forward_peak = smollm2_forward(args.tokens, args.repeat)
    model = attnviz.load("smollm2", device="cpu")
    query = len(model.loaded.tokenizer.encode_batch([text])[0]) - 1
    result = []
    why_s = best_of(lambda: result.append(attnviz.why(text, model=model, layer=args.layer, head=args.head, query=query)), args.repeat)
    terms = result[-1].terms
    row = {"model": "SmolLM2-135M", "tokens": query + 1, "layer": args.layer, "head": args.head, "key": terms.key,
           "terms": int(terms.terms.size), "sum_minus_score": terms.total - terms.score, "forward_s": round(forward_s, 3),
           "forward_peak_mb": round(forward_peak), "why_s": round(why_s, 3), "why_over_forward": round(why_s / forward_s, 2),
           "peak_mb": round(peak_mb())}  # fmt: skip
    print(json.dumps(row))


if __name__ == "__main__":
    main()
