"""A 1B- or 8B-shaped Llama read a layer's weights at a time: peak memory and time against the whole model's run (issue 47).

The checkpoint has Llama-3.2-1B's config (16 layers, 32 heads on 8 key/value heads, 2,048 wide, an MLP of 8,192,
vocabulary 128,256, tied embeddings, llama3 RoPE) with random weights (std 0.02, seed 0), stored in bfloat16: about
2.5 GB. It is written a layer at a time (a shard per layer, model.safetensors.index.json naming them), so building it
never holds the model; its tokenizer is the bundled BERT's WordPiece (every id has a row). Not committed: build it
under /tmp and remove it after.

    python bench/layer_at_a_time.py build /tmp/llama-1b          # the checkpoint
    python bench/layer_at_a_time.py compare /tmp/llama-1b        # both runs, each in a process of its own, and a row
    python bench/layer_at_a_time.py run /tmp/llama-1b [--whole]  # one run: `attnviz.layers` at TOKENS tokens
    python bench/layer_at_a_time.py run /tmp/llama-1b --tokens 8192 --stages  # and where its memory peaks (StagePeaks)
    python bench/layer_at_a_time.py compare /tmp/llama-1b --command roles  # another command (COMMANDS) in place of layers

The 8B-shaped row (Llama-3-8B's config: 32 layers, 32 heads on 8 key/value heads, 4,096 wide, an MLP of 14,336, an
untied head; about 15 GB in bfloat16): `--shape 8b` to build, `--tokens 2048` (and `--dtype bfloat16`) to run, and
`forward` for the baseline, transformers' own bfloat16 forward pass (SDPA) of the same ids with the model whole:

    python bench/layer_at_a_time.py build /tmp/llama-8b --shape 8b
    python bench/layer_at_a_time.py run /tmp/llama-8b --tokens 2048 [--dtype bfloat16]
    python bench/layer_at_a_time.py forward /tmp/llama-8b --tokens 2048

The GPU row (issue 47 part 5: the 8B-shaped model at 32,768 tokens on one GPU), where a GPU is lent: its positions
raised to the run's length, blocks of a GPU's size, and each run's GPU peak (gpu_peak_mb) beside its process's:

    python bench/layer_at_a_time.py build /tmp/llama-8b --shape 8b --positions 32768
    python bench/layer_at_a_time.py run /tmp/llama-8b --tokens 32768 --dtype bfloat16 --device cuda --memory 8192
    python bench/layer_at_a_time.py forward /tmp/llama-8b --tokens 32768 --device cuda

A run is `attnviz.layers` over a text of about TOKENS tokens with memory=MEMORY_MB: every head of every layer
summarised in blocks, in one pass with attnviz's layers in the model's, no map held whole (the 16 layers' maps at
512 tokens are 512 MB, which the default budget would hold). Layer at a time is the default for this checkpoint (its weights pass 1 GB
in float32); --whole raises the threshold past it, so the model loads whole in float32 (about 5 GB). Each run prints
its wall time, its process's peak memory (ru_maxrss) and the checkpoint's size, and saves its summaries;
compare checks the two runs' summaries equal within 1e-5 and prints the bench row.
"""

from __future__ import annotations

import json
import resource
import subprocess
import sys
import time
from pathlib import Path

TOKENS = 512
MEMORY_MB = 64  # layers' budget: every layer's maps (512 MB at 512 tokens) are not held, the summaries made in blocks
TOLERANCE = 1e-5
LLAMA_3_2_1B = dict(
    hidden_size=2048, intermediate_size=8192, num_hidden_layers=16, num_attention_heads=32, num_key_value_heads=8,
    head_dim=64, vocab_size=128256, tie_word_embeddings=True, max_position_embeddings=131072, rms_norm_eps=1e-5,
    rope_parameters={"rope_type": "llama3", "rope_theta": 500000.0, "factor": 32.0, "high_freq_factor": 4.0,
                     "low_freq_factor": 1.0, "original_max_position_embeddings": 8192},
)  # fmt: skip
LLAMA_3_8B = dict(
    hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8,
    head_dim=128, vocab_size=128256, tie_word_embeddings=False, max_position_embeddings=8192, rms_norm_eps=1e-5,
    rope_parameters={"rope_type": "default", "rope_theta": 500000.0},
)  # fmt: skip
SHAPES = {"1b": LLAMA_3_2_1B, "8b": LLAMA_3_8B}
PAIR = ("the cat sat on the mat because the mat was warm and the cat", "the cat sat on the rug because the rug was warm and the cat",
        "mat", "rug")  # patch's: clean, corrupt, answer, wrong (single WordPiece tokens)
COMMANDS = {  # --command: what a run computes, each giving its result (its numbers compared: numbers_of)
    "layers": lambda attnviz, model, text: attnviz.layers(text, model=model, memory=MEMORY_MB),
    "roles": lambda attnviz, model, text: attnviz.roles(text, model=model, memory=MEMORY_MB),
    "patch": lambda attnviz, model, text: attnviz.patch(PAIR[0], model=model, corrupt=PAIR[1], answer=PAIR[2], wrong=PAIR[3]),
    "edges": lambda attnviz, model, text: attnviz.patch(PAIR[0], model=model, corrupt=PAIR[1], answer=PAIR[2], wrong=PAIR[3], edges=True),
    "generate": lambda attnviz, model, text: attnviz.generate(PAIR[0], model=model, tokens=8),
    "heads": lambda attnviz, model, text: attnviz.heads(text, model=model, memory=MEMORY_MB, report=True),  # its report: every layer
    "stats": lambda attnviz, model, text: attnviz.stats(text, model=model, memory=MEMORY_MB),
    "effect": lambda attnviz, model, text: attnviz.heads(PAIR[0], model=model, layer=1, effect="zero"),  # each head taken out
    "diff": lambda attnviz, model, text: attnviz.diff(text, model=model, against="random", memory=MEMORY_MB),
}
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.txt")
PARAGRAPH = (
    "The cat sat on the mat because it was tired, and the dog that had chased it all morning lay down by the door. "
    "Attention lets each token look back at the tokens before it and take what it needs from them. "
)


def build(folder: Path, shape: str = "1b", positions: int | None = None) -> None:
    """The checkpoint, a shard per layer (and one for the embeddings and the final norm), each tensor drawn in float32
    and stored in bfloat16; positions: max_position_embeddings in place of the shape's (the weights are the same:
    RoPE's frequencies do not depend on it)."""
    import shutil

    import torch
    import transformers
    from safetensors.torch import save_file

    from attnviz.models.loading import bundled_model_path

    folder.mkdir(parents=True, exist_ok=True)
    config = transformers.LlamaConfig(**{**SHAPES[shape], **({"max_position_embeddings": positions} if positions else {})})
    with torch.device("meta"):
        shapes = {name: tuple(parameter.shape) for name, parameter in transformers.LlamaModel(config).named_parameters()}
    groups: dict[str, list[str]] = {}
    for name in shapes:
        group = ".".join(name.split(".")[:2]) if name.startswith("layers.") else "rest"
        groups.setdefault(group, []).append(name)
    generator = torch.Generator().manual_seed(0)
    weight_map, total = {}, 0
    for index, (group, names) in enumerate(groups.items()):
        shard = f"model-{index:05d}-of-{len(groups):05d}.safetensors"
        tensors = {}
        for name in names:
            if name.endswith("norm.weight"):
                tensor = torch.ones(shapes[name])
            else:
                tensor = torch.empty(shapes[name]).normal_(0.0, 0.02, generator=generator)
            tensors[name] = tensor.to(torch.bfloat16)
            weight_map[name] = shard
            total += tensors[name].numel() * 2
        save_file(tensors, str(folder / shard), metadata={"format": "pt"})
    (folder / "model.safetensors.index.json").write_text(json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}))
    config.dtype = "bfloat16"
    config.save_pretrained(folder)
    for name in TOKENIZER_FILES:
        shutil.copy(bundled_model_path() / name, folder / name)
    print(f"{sum(map(_numel, shapes.values())):,} parameters, {total / 1e9:.2f} GB in bfloat16, {len(groups)} shards: {folder}")


def bench_ids(model, tokens: int) -> str:
    """A text of `tokens` tokens in the checkpoint's tokenizer (the bundled BERT's WordPiece)."""
    text = PARAGRAPH * (tokens // 20 + 10)
    ids = model.tokenizer.encode_batch([text])[0][:tokens]
    return model.tokenizer.decode(ids[1:-1])


class StagePeaks:
    """Where the memory goes: the process's resident memory (Linux's /proc/self/statm) read every 2 ms by a thread, its
    peak kept per stage, the module of the model running (pre- and post-forward hooks on every module of the base
    model down to an MLP's projections, the layer's index left out: "layers.i.mlp.up_proj"), "outside" between them."""

    def __init__(self, base_model):
        import os
        import threading

        self.page = os.sysconf("SC_PAGE_SIZE")
        self.running, self.peaks, self.stack = True, {}, ["outside"]
        for name, module in base_model.named_modules():
            if name and name.count(".") <= 3 and "rotary" not in name:
                stage = ".".join("i" if part.isdigit() else part for part in name.split("."))
                module.register_forward_pre_hook(lambda module, args, stage=stage: self.stack.append(stage))
                module.register_forward_hook(self._leave)
        self.thread = threading.Thread(target=self._sample, daemon=True)
        self.thread.start()

    def _leave(self, module, args, output) -> None:
        self.stack.pop()

    def _sample(self) -> None:
        while self.running:
            with open("/proc/self/statm") as file:
                resident = int(file.read().split()[1]) * self.page / 2**20
            stage = self.stack[-1]
            self.peaks[stage] = max(self.peaks.get(stage, 0.0), resident)
            time.sleep(0.002)

    def stop(self) -> dict[str, int]:
        """Each stage's peak MB, largest first."""
        self.running = False
        self.thread.join()
        return {stage: round(peak) for stage, peak in sorted(self.peaks.items(), key=lambda item: -item[1])}


def run_once(
    folder: Path, whole: bool, summaries: Path | None, tokens: int = TOKENS, dtype: str = "auto", stages: bool = False, command: str = "layers",
    device: str = "cpu",
) -> None:  # fmt: skip
    """attnviz.layers over a text of about `tokens` tokens (or another of COMMANDS) on device; prints one JSON line
    (seconds, peak MB, mode, on a GPU its peak too; with stages, each stage's peak: StagePeaks); summaries: its numbers
    saved there (numbers_of)."""
    import warnings

    import numpy as np

    import attnviz
    import attnviz.models.layer_weights as layer_weights

    if whole:
        layer_weights.LAYER_AT_A_TIME_BYTES = 1 << 40  # past this checkpoint: it loads whole
    warnings.simplefilter("ignore")  # the run's note (a layer at a time) is in the JSON line
    start = time.perf_counter()
    model = attnviz.load(str(folder), device, dtype=dtype)
    loaded = time.perf_counter()
    sampler = StagePeaks(model.model.model) if stages else None
    text = bench_ids(model, tokens)
    result = COMMANDS[command](attnviz, model, text)
    done = time.perf_counter()
    if summaries is not None:
        if command == "layers":  # its summaries' arrays (L, H) and top keys, not its maps as lists
            kept = result.summaries
            numbers = {**kept.values, "top_keys": kept.top_keys, "top_shares": kept.top_shares}
        else:
            numbers = numbers_of(result.to_dict())
        np.savez(summaries, **numbers)
    tokens = len(model.tokenizer.encode_batch([text if command in ("layers", "roles", "heads", "stats", "diff") else PAIR[0]])[0])
    print(json.dumps({
        "mode": "layer at a time" if model.model.layer_at_a_time else "whole", "dtype": model.dtype, "tokens": tokens, "load_s": round(loaded - start, 2),
        "layers_s": round(done - loaded, 2), "total_s": round(done - start, 2),
        "peak_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024), "checkpoint_mb": round(_checkpoint_bytes(folder) / 1e6),
    } | ({"stages_mb": sampler.stop()} if stages else {}) | gpu_peak(device)))  # fmt: skip


def forward(folder: Path, tokens: int, device: str = "cpu") -> None:
    """transformers' LlamaModel loaded whole in bfloat16 (SDPA) on device and its forward pass over the same ids as a
    run's; one JSON line (load and forward seconds, peak MB, on a GPU its peak too)."""
    import torch
    import transformers

    import attnviz

    handle = attnviz.load(str(folder), "cpu")  # its tokenizer: the ids of a run's text (its weights a layer at a time)
    ids = handle.tokenizer.encode_batch([bench_ids(handle, tokens)])[0]
    del handle
    start = time.perf_counter()
    model = transformers.LlamaModel.from_pretrained(folder, dtype=torch.bfloat16, attn_implementation="sdpa").to(device).eval()
    loaded = time.perf_counter()
    with torch.inference_mode():
        model(torch.tensor([ids], device=device))
        if device == "cuda":
            torch.cuda.synchronize()
    done = time.perf_counter()
    print(json.dumps({
        "mode": "transformers' bfloat16 forward", "tokens": len(ids), "load_s": round(loaded - start, 2), "forward_s": round(done - loaded, 2),
        "peak_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024),
    } | gpu_peak(device)))  # fmt: skip


def gpu_peak(device: str) -> dict:
    """On a GPU, the most of its memory torch held at once (max_memory_allocated), in MB; elsewhere nothing."""
    if device != "cuda":
        return {}
    import torch

    return {"gpu_peak_mb": round(torch.cuda.max_memory_allocated() / 2**20)}


def numbers_of(value, path: str = "") -> dict[str, np.ndarray]:
    """Every number of a result's to_dict() by its path ("layers.3.entropy"), lists of numbers as arrays (NaN for None)."""
    import numpy as np

    if isinstance(value, dict):
        return {name: array for key, each in value.items() for name, array in numbers_of(each, f"{path}.{key}").items()}
    if isinstance(value, (list, tuple)):
        flat = np.array(value, dtype=object).ravel() if value else np.array([])
        if all(each is None or isinstance(each, (int, float)) and not isinstance(each, bool) for each in flat):
            return {path: np.array([np.nan if each is None else each for each in flat], dtype=float)}
        return {name: array for index, each in enumerate(value) for name, array in numbers_of(each, f"{path}.{index}").items()}
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return {path: np.array([value], dtype=float)}
    return {}


def compare(folder: Path, command: str = "layers") -> None:
    """Both runs, each a process of its own (so that each peak is its own), every number of their results compared
    (numbers_of), a row printed."""
    import numpy as np

    rows = {}
    for mode, flag in (("layer at a time", []), ("whole", ["--whole"])):
        saved = folder.parent / f"{folder.name}-{mode.replace(' ', '-')}.npz"
        argv = [sys.executable, __file__, "run", str(folder), "--summaries", str(saved), *flag, "--command", command]
        output = subprocess.run(argv, capture_output=True, text=True, check=True).stdout
        rows[mode] = json.loads(output.strip().splitlines()[-1]) | {"saved": saved}
        print(rows[mode])
    mine, theirs = (np.load(rows[mode]["saved"]) for mode in ("layer at a time", "whole"))
    largest = max(float(np.nanmax(np.abs(mine[name].astype(float) - theirs[name].astype(float)), initial=0.0)) for name in theirs.files)
    for mode in rows:
        rows[mode]["saved"].unlink()
    lat, whole = rows["layer at a time"], rows["whole"]
    print(
        f"| layer at a time: 1B-shaped Llama (bf16, {lat['checkpoint_mb']} MB), "
        f"`attnviz.{command}` at {lat['tokens']} tokens | {lat['total_s']} s (load {lat['load_s']} s) | whole float32 model {whole['total_s']} s (load {whole['load_s']} s), "
        f"peak {whole['peak_mb']} MB | time {lat['total_s'] / whole['total_s']:.2f}; peak / checkpoint {lat['peak_mb'] / lat['checkpoint_mb']:.2f} "
        f"(< 0.5: {'yes' if lat['peak_mb'] < lat['checkpoint_mb'] / 2 else 'NO'}); numbers' largest difference {largest:.1e} "
        f"(≤ {TOLERANCE:g}: {'yes' if largest <= TOLERANCE else 'NO'}) | {lat['peak_mb']} MB |"
    )


def _checkpoint_bytes(folder: Path) -> int:
    return sum(path.stat().st_size for path in folder.glob("*.safetensors"))


def _numel(shape: tuple[int, ...]) -> int:
    count = 1
    for size in shape:
        count *= size
    return count


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("action", choices=("build", "run", "compare", "forward"))
    parser.add_argument("folder", type=Path)
    parser.add_argument("--shape", choices=tuple(SHAPES), default="1b")
    parser.add_argument("--tokens", type=int, default=TOKENS)
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--whole", action="store_true")
    parser.add_argument("--summaries", type=Path)
    parser.add_argument("--stages", action="store_true", help="run: each stage's peak memory too (StagePeaks)")
    parser.add_argument("--command", choices=tuple(COMMANDS), default="layers", help="run, compare: what the runs compute")
    parser.add_argument("--device", default="cpu", help="run, forward: cpu or cuda")
    parser.add_argument("--memory", type=int, default=MEMORY_MB, help="run: the commands' memory budget in MB (on a GPU: larger blocks)")
    parser.add_argument("--positions", type=int, help="build: the config's max_position_embeddings, where a run is longer than the shape's")
    args = parser.parse_args()
    MEMORY_MB = args.memory
    if args.action == "build":
        build(args.folder, args.shape, args.positions)
    elif args.action == "run":
        run_once(args.folder, args.whole, args.summaries, args.tokens, args.dtype, args.stages, args.command, args.device)
    elif args.action == "forward":
        forward(args.folder, args.tokens, args.device)
    else:
        compare(args.folder, args.command)
