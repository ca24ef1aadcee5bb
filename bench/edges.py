"""Issue 46 part 3's row: every edge of SmolLM2 by EAP (and EAP-IG) on bench/patch_budget.py's 20-token pair; with
--encoder, part 4's: a BERT-base-shaped masked LM's (a post-norm encoder: analysis/edges_postnorm.py) on a 20-token pair.

    python bench/edges.py [--ig 5] [--repeat 3] [--encoder /tmp/bert-base-mlm]

--encoder FOLDER: BertForMaskedLM of BertConfig()'s shape (12 layers of 12 heads, 768 wide, transformers' own random
initialisation, seed 0) with the bundled model's WordPiece tokenizer, saved there once (built where absent); its
unit pass is BertForMaskedLM's forward (SDPA, float32) and backward of m at the mask.

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
    parser.add_argument("--encoder", type=Path, default=None)
    args = parser.parse_args()

    from transformers import AutoModelForCausalLM, AutoModelForMaskedLM, AutoTokenizer

    from attnviz.analysis.edges import EdgeSettings, ReadOut, circuit_edges
    from attnviz.analysis.patching import read_out, text_pass
    from attnviz.layer_inputs import encode_texts
    from attnviz.models.loading import load_model
    from attnviz.spec import RunSpec
    from smollm2_reference import reference_folder

    if args.encoder is not None:
        folder, texts, (answer_text, wrong_text) = built_encoder(args.encoder), MASKED[:2], MASKED[2:]
        model = AutoModelForMaskedLM.from_pretrained(folder, dtype=torch.float32, attn_implementation="sdpa").eval()
        loaded = load_model(str(folder), device="cpu")
        spec = RunSpec(str(folder), str(folder), "local folder", device="cpu")
    else:
        folder, texts, (answer_text, wrong_text) = reference_folder(), (CLEAN, CORRUPT), (ANSWER, WRONG)  # transformers' float32 model of the GGUF file
        model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32, attn_implementation="sdpa").eval()
        loaded = load_model("smollm2", device="cpu")
        spec = RunSpec("smollm2", loaded.name, loaded.source, device="cpu")
    tokenizer = AutoTokenizer.from_pretrained(folder)
    corrupt_ids = tokenizer(texts[1], return_tensors="pt")["input_ids"]
    assert corrupt_ids.shape[1] == 20, corrupt_ids.shape
    position = corrupt_ids[0].tolist().index(tokenizer.mask_token_id) if args.encoder is not None else 19
    answer, wrong = (tokenizer(token, add_special_tokens=False)["input_ids"][0] for token in (answer_text, wrong_text))

    def forward_backward() -> None:
        model.zero_grad(set_to_none=True)
        logits = model(corrupt_ids, **({} if args.encoder else {"use_cache": False})).logits[0, position]
        (logits[answer] - logits[wrong]).backward()

    transform, weight, bias = read_out(loaded)
    offset = 0.0 if bias is None else float(bias[answer].double() - bias[wrong].double())
    read = ReadOut(position, (weight[answer].double() - weight[wrong].double()).detach(), offset, transform)

    def edges(settings: EdgeSettings):
        with torch.inference_mode():
            clean, corrupted = (text_pass(loaded, encode_texts(loaded, [text], spec), spec) for text in texts)
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
        "model": "BERT-base-shaped masked LM (random)" if args.encoder else "SmolLM2-135M", "tokens": 20, "edges": count, "threads": torch.get_num_threads(), "ig_steps": args.ig,
        "wall_s": {name: round(value, 3) for name, value in wall.items()}, "cpu_s": {name: round(value, 3) for name, value in cpu.items()},
        "passes_wall": {name: ratio(wall, name) for name in ("eap", "eap_ig", "eap_and_10_checked")},
        "passes_cpu": {name: ratio(cpu, name) for name in ("eap", "eap_ig", "eap_and_10_checked")},
        "peak_mb": round(peak_mb()), "load_average": os.getloadavg(),
    }))  # fmt: skip


# 20 tokens each in BERT's WordPiece with [CLS] and [SEP], the answer at the [MASK]
MASKED = ("the cat sat on the [MASK] because it was tired after the long walk in the park .",
          "the dog sat on the [MASK] because it was tired after the long walk in the park .", "mat", "floor")  # fmt: skip


def built_encoder(folder: Path) -> Path:
    """folder with a BERT-base-shaped BertForMaskedLM (random, seed 0) and the bundled WordPiece tokenizer, saved once."""
    from transformers import BertConfig, BertForMaskedLM, PreTrainedTokenizerFast

    from attnviz.models.loading import bundled_model_path

    if not (folder / "config.json").is_file():
        torch.manual_seed(0)
        BertForMaskedLM(BertConfig()).save_pretrained(folder)
        tokenizer = PreTrainedTokenizerFast(tokenizer_file=str(bundled_model_path() / "tokenizer.json"), cls_token="[CLS]",
                                            sep_token="[SEP]", pad_token="[PAD]", unk_token="[UNK]", mask_token="[MASK]")  # fmt: skip
        tokenizer.save_pretrained(folder)
    return folder


if __name__ == "__main__":
    main()
