"""Issue 46 part 3's row: every edge of SmolLM2 by EAP (and EAP-IG) on bench/patch_budget.py's 20-token pair.

    python bench/edges.py [--ig 5] [--repeat 3]

In one process, after a warm-up of each, --repeat rounds, each timing all of these one after the other (a busy
machine's load then weighs on each alike); each one's best wall time and best process CPU time (time.process_time:
what the load steals from a 2-core machine is wall time, less CPU time) are kept:
- one forward and backward pass of transformers' model: AutoModelForCausalLM (SDPA, float32) over the corrupted text,
  m = logit(answer) - logit(wrong) at the last position, m.backward() (the parameters' gradients included, as a
  training step's backward takes them), the unit of the budget;
- EAP: attnviz's analysis.edges.circuit_edges with no edge checked, after the two texts' recorded passes
  (analysis.patching.text_pass: patch's own, counted here): every edge's score, budget 3 passes;
- EAP-IG with --ig N steps the same way: budget N + 2 passes;
- path patching of the top 10 edges (the default --checked-edges), on top of EAP.
The ratios are of the best times, wall and CPU. Prints one JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from patch_budget import ANSWER, CLEAN, CORRUPT, WRONG  # noqa: E402
from timing import peak_mb  # noqa: E402


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
    from attnviz.spec import RunSpec
    from smollm2_reference import reference_folder

    folder = reference_folder()  # transformers' float32 model of the GGUF file
    tokenizer = AutoTokenizer.from_pretrained(folder)
    corrupt_ids = tokenizer(CORRUPT, return_tensors="pt")["input_ids"]
    assert corrupt_ids.shape[1] == 20, corrupt_ids.shape
    answer, wrong = (tokenizer(token, add_special_tokens=False)["input_ids"][0] for token in (ANSWER, WRONG))
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32, attn_implementation="sdpa").eval()

    def forward_backward() -> None:
        model.zero_grad(set_to_none=True)
        logits = model(corrupt_ids, use_cache=False).logits[0, -1]
        (logits[answer] - logits[wrong]).backward()

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
    count = sum(int(np.isfinite(values).sum()) for values in found.scores.values())
    runs = {
        "forward_backward": forward_backward,
        "eap": lambda: edges(EdgeSettings(checked=0)),
        "eap_ig": lambda: edges(EdgeSettings(ig=args.ig, checked=0)),
        "eap_and_10_checked": lambda: edges(EdgeSettings()),
    }
    wall, cpu = {name: float("inf") for name in runs}, {name: float("inf") for name in runs}
    for run in runs.values():
        run()  # warm-up
    for _ in range(args.repeat):
        for name, run in runs.items():
            start, start_cpu = time.perf_counter(), time.process_time()
            run()
            wall[name] = min(wall[name], time.perf_counter() - start)
            cpu[name] = min(cpu[name], time.process_time() - start_cpu)
    ratio = lambda times, name: round(times[name] / times["forward_backward"], 2)  # noqa: E731
    print(json.dumps({
        "model": "SmolLM2-135M", "tokens": 20, "edges": count, "threads": torch.get_num_threads(), "ig_steps": args.ig,
        "wall_s": {name: round(value, 3) for name, value in wall.items()}, "cpu_s": {name: round(value, 3) for name, value in cpu.items()},
        "passes_wall": {name: ratio(wall, name) for name in ("eap", "eap_ig", "eap_and_10_checked")},
        "passes_cpu": {name: ratio(cpu, name) for name in ("eap", "eap_ig", "eap_and_10_checked")},
        "peak_mb": round(peak_mb()), "load_average": os.getloadavg(),
    }))  # fmt: skip


if __name__ == "__main__":
    main()
