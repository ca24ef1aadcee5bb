"""Issue 46 part 3's row: every edge of SmolLM2 by EAP (and EAP-IG) on bench/patch_budget.py's 20-token pair.

    python bench/edges.py [--ig 5] [--repeat 3]

Each the best of --repeat after a warm-up, in one process:
- one forward and backward pass of transformers' model: AutoModelForCausalLM (SDPA, float32) over the corrupted text,
  m = logit(answer) - logit(wrong) at the last position, m.backward() (the parameters' gradients included, as a
  training step's backward takes them), the unit of the budget;
- EAP: attnviz's analysis.edges.circuit_edges with no edge checked, after the two texts' recorded passes
  (analysis.patching.text_pass: patch's own, counted here): every edge's score, budget 3 passes;
- EAP-IG with --ig N steps the same way: budget N + 2 passes;
- path patching of the top 10 edges (the default --checked-edges), on top of EAP.
Prints one JSON line.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from patch_budget import ANSWER, CLEAN, CORRUPT, WRONG  # noqa: E402
from timing import best_of, peak_mb  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ig", type=int, default=5)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()

    from transformers import AutoModelForCausalLM, AutoTokenizer

    from attnviz.analysis.edges import EdgeSettings, ReadOut, circuit_edges
    from attnviz.analysis.patching import text_pass
    from attnviz.layer_inputs import encode_texts
    from attnviz.models.loading import load_model
    from attnviz.models.smollm2 import smollm2_folder
    from attnviz.spec import RunSpec

    folder = smollm2_folder()
    tokenizer = AutoTokenizer.from_pretrained(folder)
    corrupt_ids = tokenizer(CORRUPT, return_tensors="pt")["input_ids"]
    assert corrupt_ids.shape[1] == 20, corrupt_ids.shape
    answer, wrong = (tokenizer(token, add_special_tokens=False)["input_ids"][0] for token in (ANSWER, WRONG))
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32, attn_implementation="sdpa").eval()

    def forward_backward() -> None:
        model.zero_grad(set_to_none=True)
        logits = model(corrupt_ids, use_cache=False).logits[0, -1]
        (logits[answer] - logits[wrong]).backward()

    pass_s = best_of(forward_backward, args.repeat * 3)
    del model

    loaded = load_model("smollm2", device="cpu")
    spec = RunSpec("smollm2", loaded.name, loaded.source, device="cpu")
    weight, _ = loaded.model.output_head()
    read = ReadOut(19, (weight[answer] - weight[wrong]).detach().double(), 0.0)

    def edges(settings: EdgeSettings):
        with torch.inference_mode():
            clean, corrupted = (text_pass(loaded, encode_texts(loaded, [text], spec), spec) for text in (CLEAN, CORRUPT))
            m_clean, m_corrupt = (float(read.metric(each.captured.last_hidden)[0]) for each in (clean, corrupted))
        return circuit_edges(loaded, spec, clean, corrupted, read, m_clean, m_corrupt, settings)

    found = edges(EdgeSettings(checked=0))
    count = sum(int(torch.isfinite(torch.from_numpy(values)).sum()) for values in found.scores.values())
    eap_s = best_of(lambda: edges(EdgeSettings(checked=0)), args.repeat)
    ig_s = best_of(lambda: edges(EdgeSettings(ig=args.ig, checked=0)), args.repeat)
    checked_s = best_of(lambda: edges(EdgeSettings()), args.repeat)
    print(json.dumps({
        "model": "SmolLM2-135M", "tokens": 20, "edges": count, "threads": torch.get_num_threads(),
        "forward_backward_s": round(pass_s, 4),
        "eap_s": round(eap_s, 3), "eap_passes": round(eap_s / pass_s, 2),
        "ig_steps": args.ig, "eap_ig_s": round(ig_s, 3), "eap_ig_passes": round(ig_s / pass_s, 2),
        "eap_and_10_checked_s": round(checked_s, 3), "path_patching_10_s": round(checked_s - eap_s, 3),
        "peak_mb": round(peak_mb()),
    }))  # fmt: skip


if __name__ == "__main__":
    main()
