"""`attnviz heads` on BERT, a GPT-2-sized decoder and SmolLM2, each against transformers' bare forward pass.

    python bench/families.py                               # 5 runs each
    python bench/families.py --repeat 1                    # a quick check
    python bench/families.py --old-tree /tmp/bench-old     # also an older checkout's BERT run, for the same machine now

Every case is `attnviz heads TEXT --model M --out ... --device cpu` as a new process, as a user
runs it; its baseline is bench/bare_forward.py on the same model folder and text: AutoModel
(eager attention) and AutoTokenizer, one forward pass with output_attentions=True. Medians and
ratios come from run.py's run_process, in one run. The models:

- bundled: the bundled all-MiniLM-L6-v2 (attnviz's own BERT path).
- GPT-2-sized: transformers.GPT2Config()'s defaults (12 layers, 12 heads, 768 wide, vocab
  50257: 124M parameters), randomly initialised with seed 0, saved as safetensors into a
  temporary hub cache as the snapshot of `bench/gpt2-124m`, with SmolLM2's byte-level BPE
  tokenizer (49152 tokens, so every id has a row in the 50257-row embedding).
- SmolLM2: `--model smollm2` with an empty temporary ATTNVIZ_CACHE: the first run converts the
  GGUF file (timed once, as its own row), the others find the conversion cached.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # run.py, beside this file

from run import ATTNVIZ, BENCH, PYTHON, Timing, bundled_model_dir, print_table, run_process  # noqa: E402

REPO = BENCH.parent
TEXT = "The cat sat on the mat because it was tired."
GPT2_REPO_ID = "bench/gpt2-124m"
GPT2_REVISION = "0" * 40  # the snapshot's commit hash in the temporary hub cache
SMOLLM2_FOLDER_GLOB = "models/SmolLM2-135M-Instruct-*"  # where attnviz's cache keeps the conversion


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--old-tree", type=Path, help="a checkout of an older attnviz: its BERT heads run is timed too")
    args = parser.parse_args()

    rows, forward_only = [], {}
    with tempfile.TemporaryDirectory(prefix="attnviz-bench-") as scratch:
        scratch = Path(scratch)
        env = {
            **os.environ,
            "PYTHONPATH": str(REPO),  # this checkout's attnviz, whatever the venv has installed
            "HF_HUB_OFFLINE": "1",
            "HF_HUB_CACHE": str(scratch / "hub"),
            "ATTNVIZ_CACHE": str(scratch / "attnviz-cache"),
            "COLUMNS": "100",
        }
        text_file = scratch / "text.txt"
        text_file.write_text(TEXT + "\n", encoding="utf-8")

        def heads(model: str, run_env: dict = env) -> Timing:
            command = [*ATTNVIZ, "heads", TEXT, "--model", model, "--out", str(scratch / "heads"), "--device", "cpu"]
            return run_process(command, args.repeat, run_env)

        def bare(folder: Path | str, case: str) -> Timing:
            command = [PYTHON, str(BENCH / "bare_forward.py"), str(folder), str(text_file), "1", "cpu"]
            forward_only[case] = run_process(command, args.repeat, env), token_count(folder)
            return forward_only[case][0]

        # The parts every case pays for before any model: starting Python, torch, transformers' classes.
        python_pass = run_process([PYTHON, "-c", "pass"], args.repeat, env)
        import_torch = run_process([PYTHON, "-c", "import torch"], args.repeat, env)
        import_transformers = run_process(
            [PYTHON, "-c", "import torch, transformers; transformers.AutoModel, transformers.AutoTokenizer"], args.repeat, env
        )
        rows.append(("import torch", import_torch, "python -c pass", python_pass, "-", None))
        rows.append(("import torch, transformers' Auto classes", import_transformers, "import torch", import_torch, "-", None))

        bert = heads("bundled")
        rows.append(("heads, bundled BERT", bert, "bare forward", bare(bundled_model_dir(), "bundled BERT"), "-", None))
        if args.old_tree:
            old_env = {**env, "PYTHONPATH": str(args.old_tree.resolve())}
            old = heads("bundled", old_env)
            rows.append(("heads, bundled BERT", bert, "the same, old tree", old, "≤ 1.10×", bert.seconds <= 1.10 * old.seconds))

        smollm2_model, first_run = prepare_smollm2(scratch, env)
        smollm2_folder = Path(smollm2_model) if first_run is None else next((scratch / "attnviz-cache").glob(SMOLLM2_FOLDER_GLOB))
        build_gpt2(scratch / "hub", smollm2_folder)
        gpt2_folder = scratch / "hub" / f"models--{GPT2_REPO_ID.replace('/', '--')}" / "snapshots" / GPT2_REVISION
        rows.append(("heads, GPT-2-sized (hub cache)", heads(GPT2_REPO_ID), "bare forward", bare(gpt2_folder, "GPT-2-sized"), "-", None))

        smollm2 = heads(smollm2_model)
        if first_run is not None:
            rows.append(("heads, smollm2, first run (converts)", first_run, "later runs", smollm2, "-", None))
        rows.append(("heads, SmolLM2", smollm2, "bare forward", bare(smollm2_folder, "SmolLM2"), "-", None))

    print(f"text: {TEXT!r}; attnviz from {REPO}" + (f"; old tree {args.old_tree}" if args.old_tree else ""))
    print_table(rows, argparse.Namespace(repeat=args.repeat, gpu=False))
    print()
    for case, (timing, tokens) in forward_only.items():
        print(f"bare forward, {case}, {tokens} tokens: the forward pass alone {timing.loop_seconds:.3f} s of {timing.seconds:.2f} s")


def prepare_smollm2(scratch: Path, env: dict) -> tuple[str, Timing | None]:
    """What to pass as --model for SmolLM2, and the first run's timing if that run converted the GGUF file.

    With attnviz's `--model smollm2` (attnviz/models/smollm2.py), its first run converts into the
    empty ATTNVIZ_CACHE; without it, this bench converts the same way and passes the folder.
    """
    has_alias = (REPO / "attnviz" / "models" / "smollm2.py").exists()
    if has_alias:
        command = [*ATTNVIZ, "heads", TEXT, "--model", "smollm2", "--out", str(scratch / "heads"), "--device", "cpu"]
        return "smollm2", run_process(command, 1, env)
    folder = scratch / "smollm2"
    run_process([PYTHON, __file__.replace("families.py", "convert_smollm2.py"), str(folder)], 1, env)
    return str(folder), None


def token_count(folder: Path | str) -> int:
    from transformers import AutoTokenizer

    return len(AutoTokenizer.from_pretrained(folder)(TEXT)["input_ids"])


def build_gpt2(hub_cache: Path, tokenizer_folder: Path) -> None:
    """GPT2Config()'s defaults, seed 0, saved (safetensors) with the tokenizer as a snapshot in the hub cache."""
    import torch
    from transformers import GPT2Config, GPT2Model
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # save_pretrained's bar for one shard
    repo = hub_cache / f"models--{GPT2_REPO_ID.replace('/', '--')}"
    snapshot = repo / "snapshots" / GPT2_REVISION
    torch.manual_seed(0)
    model = GPT2Model(GPT2Config())
    model.save_pretrained(snapshot)  # config.json and model.safetensors
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        if (tokenizer_folder / name).exists():
            shutil.copy(tokenizer_folder / name, snapshot / name)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(GPT2_REVISION)


if __name__ == "__main__":
    main()
