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
  tokenizer (49152 tokens, so every id has a row in the 50257-row embedding): bench/gpt2_sized.py.
- SmolLM2: `--model smollm2` with an empty temporary ATTNVIZ_CACHE: the first run converts the
  GGUF file (timed once, as its own row), the others find the conversion cached.

heads runs on layer 0 (the default) and on the model's last layer. Beside them, a process that
only imports attnviz's loader and calls load_model (its share of heads); and the imports alone:
torch, and transformers' classes.
Whatever needs torch runs in a process of its own, so the bench's own memory never counts in
a timed process's peak (a child's max RSS starts from its parent's).
"""

from __future__ import annotations

import argparse
import os
import subprocess
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
IMPORT_CLASSES = "import torch, transformers; transformers.GPT2Model, transformers.LlamaModel, transformers.AutoTokenizer"
TOKEN_COUNTS = (
    "import sys; from transformers import AutoTokenizer as T; "
    "[print(len(T.from_pretrained(folder)(sys.argv[1])['input_ids'])) for folder in sys.argv[2:]]"
)
LOAD_ONLY = "import sys; from attnviz.models.loading import load_model; load_model(sys.argv[1])"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--old-tree", type=Path, help="a checkout of an older attnviz: its BERT heads run is timed too")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="attnviz-bench-") as scratch:
        cases = Cases(Path(scratch), args.repeat)
        rows = cases.import_rows()
        bert_rows = cases.model_rows("bundled BERT", "bundled", Path(bundled_model_dir()), last_layer=5)
        rows += bert_rows
        if args.old_tree:
            bert, old = bert_rows[0][1], cases.heads("bundled", PYTHONPATH=str(args.old_tree.resolve()))
            within_noise = bert.seconds <= 1.10 * old.seconds
            rows.append(("heads, bundled BERT", bert, "the same, old tree", old, "≤ 1.10×", within_noise))

        smollm2_folder, first_run = convert_smollm2(cases)
        gpt2_folder, gpt2_parameters = build_gpt2(cases.scratch / "hub", smollm2_folder)
        cases.notes.append(f"GPT-2-sized: {gpt2_parameters:,} parameters")
        rows += cases.model_rows("GPT-2-sized, hub cache", GPT2_REPO_ID, gpt2_folder, last_layer=11)
        smollm2_rows = cases.model_rows("SmolLM2", "smollm2", smollm2_folder, last_layer=29)
        rows += smollm2_rows
        rows.append(("heads, SmolLM2, first run (converts)", first_run, "heads, SmolLM2", smollm2_rows[0][1], "-", None))

        bert_tokens, gpt2_tokens, smollm2_tokens = token_counts([Path(bundled_model_dir()), gpt2_folder, smollm2_folder])
        cases.notes.append(f"tokens: BERT {bert_tokens}, GPT-2-sized {gpt2_tokens}, SmolLM2 {smollm2_tokens}")

    print(f"text: {TEXT!r}; attnviz from {REPO}" + (f"; old tree {args.old_tree}" if args.old_tree else ""))
    print_table(rows, argparse.Namespace(repeat=args.repeat, gpu=False))
    print()
    print("\n".join(cases.notes))


class Cases:
    """The processes timed, all with one environment: this checkout's attnviz, offline, temporary caches."""

    def __init__(self, scratch: Path, repeat: int):
        self.scratch, self.repeat, self.notes = scratch, repeat, []
        self.env = {
            **os.environ,
            "PYTHONPATH": str(REPO),  # this checkout's attnviz, whatever the venv has installed
            "HF_HUB_OFFLINE": "1",
            "HF_HUB_CACHE": str(scratch / "hub"),
            "ATTNVIZ_CACHE": str(scratch / "attnviz-cache"),
            "COLUMNS": "100",
        }
        self.text_file = scratch / "text.txt"
        self.text_file.write_text(TEXT + "\n", encoding="utf-8")

    def run(self, command: list[str], repeat: int | None = None, **env: str) -> Timing:
        return run_process(command, repeat or self.repeat, {**self.env, **env})

    def heads(self, model: str, *options: str, repeat: int | None = None, **env: str) -> Timing:
        command = [*ATTNVIZ, "heads", TEXT, "--model", model, "--out", str(self.scratch / "heads"), "--device", "cpu", *options]
        return self.run(command, repeat, **env)

    def import_rows(self) -> list[tuple]:
        """What a transformers run pays before any model: torch, then transformers' GPT-2 and Llama classes."""
        python_pass = self.run([PYTHON, "-c", "pass"])
        torch = self.run([PYTHON, "-c", "import torch"])
        classes = self.run([PYTHON, "-c", IMPORT_CLASSES])
        return [
            ("import torch", torch, "python -c pass", python_pass, "-", None),
            ("import torch, transformers' GPT2Model, LlamaModel", classes, "import torch", torch, "-", None),
        ]

    def model_rows(self, name: str, model: str, folder: Path, last_layer: int) -> list[tuple]:
        """heads (layer 0, and the last) against the bare forward pass, first; load_model alone against heads.

        heads on layer L runs the model up to L's input and stops; the bare pass runs every layer.
        """
        heads_run = self.heads(model)
        last_layer_run = self.heads(model, "--layer", str(last_layer))
        bare = self.run([PYTHON, str(BENCH / "bare_forward.py"), str(folder), str(self.text_file), "1", "cpu"])
        load = self.run([PYTHON, "-c", LOAD_ONLY, model])
        self.notes.append(f"{name}: the bare forward pass alone {bare.loop_seconds:.3f} s of its {bare.seconds:.2f} s")
        return [
            (f"heads, {name}", heads_run, "bare forward", bare, "-", None),
            (f"heads --layer {last_layer} (the last), {name}", last_layer_run, "bare forward", bare, "-", None),
            (f"load_model only, {name}", load, f"heads, {name}", heads_run, "-", None),
        ]


def convert_smollm2(cases: Cases) -> tuple[Path, Timing]:
    """The first `--model smollm2` run, which converts the GGUF file into the empty ATTNVIZ_CACHE: folder, timing."""
    first_run = cases.heads("smollm2", repeat=1)
    return next((cases.scratch / "attnviz-cache").glob(SMOLLM2_FOLDER_GLOB)), first_run


def token_counts(folders: list[Path]) -> list[int]:
    """How many tokens each model's tokenizer makes of TEXT (in a process of its own: the bench stays small)."""
    command = [PYTHON, "-c", TOKEN_COUNTS, TEXT, *map(str, folders)]
    output = subprocess.run(command, capture_output=True, text=True, check=True).stdout
    return [int(line) for line in output.split()]


def build_gpt2(hub_cache: Path, tokenizer_folder: Path) -> tuple[Path, int]:
    """bench/gpt2_sized.py's checkpoint as the `main` snapshot of GPT2_REPO_ID in a hub cache: folder, parameters."""
    repo = hub_cache / f"models--{GPT2_REPO_ID.replace('/', '--')}"
    snapshot = repo / "snapshots" / GPT2_REVISION
    command = [PYTHON, str(BENCH / "gpt2_sized.py"), str(snapshot), str(tokenizer_folder)]
    parameters = int(subprocess.run(command, capture_output=True, text=True, check=True).stdout)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(GPT2_REVISION)
    return snapshot, parameters


if __name__ == "__main__":
    main()
