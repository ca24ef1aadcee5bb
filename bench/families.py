"""`attnviz heads` on BERT, a GPT-2-sized decoder and SmolLM2, each against transformers' bare forward pass.

    python bench/families.py                               # 5 runs each
    python bench/families.py --repeat 1                    # a quick check
    python bench/families.py --old-tree /tmp/bench-old     # also an older checkout's BERT run, for the same machine now

Every case is `attnviz heads TEXT --model M --out ... --device cpu` as a new process, as a user
runs it; its baseline is bench/bare_forward.py on the same model folder and text: AutoModel
(eager attention) and AutoTokenizer, one forward pass with output_attentions=True. Medians and
ratios come from run.py's run_rounds, in one run: every case once per round, so that a drift of
the machine falls on every case alike. The models:

- bundled: the bundled all-MiniLM-L6-v2 (attnviz's own BERT path).
- GPT-2-sized: transformers.GPT2Config()'s defaults (12 layers, 12 heads, 768 wide, vocab
  50257: 124M parameters), randomly initialised with seed 0, saved as safetensors into a
  temporary hub cache as the snapshot of `bench/gpt2-124m`, with SmolLM2's byte-level BPE
  tokenizer (49152 tokens, so every id has a row in the 50257-row embedding): bench/gpt2_sized.py.
- SmolLM2: `--model smollm2` with an empty temporary ATTNVIZ_CACHE: the first run reads the GGUF
  file's tokenizer into the cache (timed once, as its own row), the others find it cached; every run
  dequantises the file's tensors. Its bare forward pass loads transformers' own GGUF model saved as a
  float32 folder (bench/smollm2_reference.py).

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
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # run.py, beside this file

from run import ATTNVIZ, BENCH, PYTHON, Timing, bundled_model_dir, print_table, run_process, run_rounds  # noqa: E402

REPO = BENCH.parent
TEXT = "The cat sat on the mat because it was tired."
GPT2_REPO_ID = "bench/gpt2-124m"
GPT2_REVISION = "0" * 40  # the snapshot's commit hash in the temporary hub cache
REFERENCE = "from smollm2_reference import reference_folder; print(reference_folder())"  # SmolLM2 as a float32 folder
IMPORT_CLASSES = "import torch, transformers; transformers.GPT2Model, transformers.LlamaModel, transformers.AutoTokenizer"
TOKEN_COUNTS = (
    "import sys; from transformers import AutoTokenizer as T; "
    "[print(len(T.from_pretrained(folder)(sys.argv[1])['input_ids'])) for folder in sys.argv[2:]]"
)
IMPORT_CLASSES_CASE = "import torch, transformers' GPT2Model, LlamaModel"
OLD_BERT = "heads, bundled BERT, old tree"
LOAD_ONLY = "import sys; from attnviz.models.loading import load_model; load_model(sys.argv[1])"


@dataclass
class Model:
    name: str
    model: str  # what --model gets
    folder: Path  # what bench/bare_forward.py loads
    last_layer: int


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--old-tree", type=Path, help="a checkout of an older attnviz: its BERT heads run is timed too")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="attnviz-bench-") as scratch:
        cases = Cases(Path(scratch))
        smollm2_folder, first_run = cases.first_smollm2_run()
        gpt2_folder, gpt2_parameters = build_gpt2(cases.scratch / "hub", smollm2_folder)
        models = [
            Model("bundled BERT", "bundled", Path(bundled_model_dir()), last_layer=5),
            Model("GPT-2-sized, hub cache", GPT2_REPO_ID, gpt2_folder, last_layer=11),
            Model("SmolLM2", "smollm2", smollm2_folder, last_layer=29),
        ]
        timings = run_rounds(cases.commands(models, args.old_tree), args.repeat)
        tokens = token_counts([model.folder for model in models])

    print(f"text: {TEXT!r}; attnviz from {REPO}" + (f"; old tree {args.old_tree}" if args.old_tree else ""))
    print_table(table_rows(timings, models, first_run), argparse.Namespace(repeat=args.repeat, gpu=False))
    print()
    print(f"GPT-2-sized: {gpt2_parameters:,} parameters")
    for model, count in zip(models, tokens):
        bare = timings[f"bare forward, {model.name}"]
        print(f"{model.name}: {count} tokens; the bare forward pass alone {bare.loop_seconds:.3f} s of its {bare.seconds:.2f} s")


class Cases:
    """The processes timed, all with one environment: this checkout's attnviz, offline, temporary caches."""

    def __init__(self, scratch: Path):
        self.scratch = scratch
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

    def heads(self, model: str, *options: str) -> list[str]:
        return [*ATTNVIZ, "heads", TEXT, "--model", model, "--out", str(self.scratch / "heads"), "--device", "cpu", *options]

    def first_smollm2_run(self) -> tuple[Path, Timing]:
        """The first `--model smollm2` run, in the empty ATTNVIZ_CACHE (it caches the tokenizer's files), timed; and
        SmolLM2 as a float32 folder for the bare forward pass (bench/smollm2_reference.py, in a process of its own)."""
        first_run = run_process(self.heads("smollm2"), 1, self.env)
        made = subprocess.run([PYTHON, "-c", REFERENCE], cwd=BENCH, env=self.env, capture_output=True, text=True, check=True)
        return Path(made.stdout.strip().splitlines()[-1]), first_run

    def commands(self, models: list[Model], old_tree: Path | None) -> dict[str, tuple[list[str], dict]]:
        """Every case by name: the imports alone; per model heads on layer 0 and the last, the bare pass, load_model alone."""
        commands = {
            "python -c pass": [PYTHON, "-c", "pass"],
            "import torch": [PYTHON, "-c", "import torch"],
            IMPORT_CLASSES_CASE: [PYTHON, "-c", IMPORT_CLASSES],
        }
        for model in models:
            commands[f"heads, {model.name}"] = self.heads(model.model)
            commands[f"heads --layer {model.last_layer} (the last), {model.name}"] = self.heads(
                model.model, "--layer", str(model.last_layer)
            )
            bare = [PYTHON, str(BENCH / "bare_forward.py"), str(model.folder), str(self.text_file), "1", "cpu"]
            commands[f"bare forward, {model.name}"] = bare
            commands[f"load_model only, {model.name}"] = [PYTHON, "-c", LOAD_ONLY, model.model]
        timed = {name: (command, self.env) for name, command in commands.items()}
        if old_tree:
            timed[OLD_BERT] = (self.heads("bundled"), {**self.env, "PYTHONPATH": str(old_tree.resolve())})
        return timed


def table_rows(timings: dict[str, Timing], models: list[Model], first_run: Timing) -> list[tuple]:
    """run.py's rows: (case, timing, baseline's name, baseline, target, met); None for met where there is no target."""
    rows = [
        ("import torch", timings["import torch"], "python -c pass", timings["python -c pass"], "-", None),
        (IMPORT_CLASSES_CASE, timings[IMPORT_CLASSES_CASE], "import torch", timings["import torch"], "-", None),
    ]
    for model in models:
        heads, bare = timings[f"heads, {model.name}"], timings[f"bare forward, {model.name}"]
        last = f"heads --layer {model.last_layer} (the last), {model.name}"
        load = f"load_model only, {model.name}"
        rows += [
            (f"heads, {model.name}", heads, "bare forward", bare, "-", None),
            (last, timings[last], "bare forward", bare, "-", None),
            (load, timings[load], f"heads, {model.name}", heads, "-", None),
        ]
    if OLD_BERT in timings:
        bert, old = timings["heads, bundled BERT"], timings[OLD_BERT]
        rows.append(("heads, bundled BERT", bert, OLD_BERT, old, "≤ 1.10×", bert.seconds <= 1.10 * old.seconds))
    rows.append(("heads, SmolLM2, first run (caches the tokenizer)", first_run, "heads, SmolLM2", timings["heads, SmolLM2"], "-", None))
    return rows


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
