"""A checkpoint run a layer's weights at a time: the model built empty, each layer's weights read just before it runs.

accelerate's hooks are the engine (the one under `accelerate.dispatch_model` and transformers' `device_map` with
offloading): each layer module (Llama's layers.{i}) gets an `AlignDevicesHook(offload=True, weights_map=...)`, which
puts the layer's weights on the device in the model's dtype as its forward begins and back on the meta device (no
memory) as it ends. What the hooks read is a weights map: a Mapping from the base model's parameter names to tensors,
read on access. For a safetensors checkpoint it is accelerate's `OffloadedWeightsLoader` with an index that points at
the checkpoint's own files (nothing copied): each access reads one tensor as stored (bfloat16, float16, float32), and
the hook casts it to the model's dtype. Any other Mapping of the same names (a GGUF file dequantised on access) plugs
in as weights_map= of load_layer_at_a_time. The rest of the model (the embeddings, the final norm) is read once, the
embedding table kept as stored and read by rows (StoredEmbedding). On GPUs, accelerate's infer_auto_device_map
places the layers (layer_places): those that fit in KEPT_GPU_SHARE of the free memory of the GPU that computes are
read once and stay there, unhooked; those that fit in HELD_GPU_SHARE of each other GPU's are read once onto it and
copied to the computing GPU as each runs (their weights map overlaid on the files'); the rest are read from the
files as each runs. Every layer thus computes on one device, where its weights are as it runs: no activation
crosses devices, and the stages' device is the one they were given.

Outside a layer's forward, whoever reads a module's weights (attnviz's own layer its attention's, the circuits and
why a norm's) does so within `resident`, which reads that module's alone from the same weights map (not its whole
layer, as accelerate's `align_module_device` would: a Llama-3.2-1B layer's MLP is 4 times its attention); within
the layer's forward the weights are there already and resident does nothing.
"""

from __future__ import annotations

import collections
import contextlib
import functools
import json
import mmap
from collections.abc import Mapping
from pathlib import Path

import torch
from torch import nn

# Past this many bytes of weights in the compute dtype (read from the safetensors headers), a checkpoint runs a layer
# at a time by default.
LAYER_AT_A_TIME_BYTES = 10**9
LOGIT_ROWS = 8192  # the vocabulary's rows of an unembedding cast at a time (64 MB of a 2,048-wide float32 one)
# glibc's malloc serves blocks of this many bytes or more straight from the system, and gives them back when freed
# (keep_large_blocks_apart); under it, from its heap.
MMAP_THRESHOLD = 4 * 2**20
# An MLP's widest activation for one chunk of positions (run_by_positions): Llama-3.2-1B's (N, 8,192) in float32 is
# 256 MB at 8,192 tokens, three of them at once; 2,048 positions a chunk keep each to 64 MB.
MLP_CHUNK_BYTES = 64 * 2**20
# A layer at a time on GPUs (gpu_budgets): the layers that fit in this share of the free memory of the GPU that computes
# stay on it, read once (attnviz's blocks take half of what is left as they run) ...
KEPT_GPU_SHARE = 0.5
# ... and those that fit in this share of each other GPU's (which holds weights alone) are held there, read once.
HELD_GPU_SHARE = 0.9
STORED_DTYPES = {"F32": torch.float32, "BF16": torch.bfloat16, "F16": torch.float16}
HALF_UNIT_ROUNDOFF = {"bfloat16": "2^-8", "float16": "2^-11"}  # the largest relative error of one rounding (layer_at_a_time_note)


def stored_entries(folder: Path, prefix: str) -> dict[str, tuple[Path, str, tuple[int, ...], str]]:
    """Every tensor of the checkpoint's safetensors files from their headers (no data read), by the base model's name (a
    task head's checkpoint's prefix taken off; the head's own tensors by their names, lm_head.weight): (file, name in
    the file, shape, safetensors dtype)."""
    from safetensors import safe_open

    from attnviz.models.weight_files import safetensors_shapes, weight_files

    entries = {}
    for path in weight_files(folder, safetensors=True, allow_pickle=False):
        safetensors_shapes(path)  # a damaged or truncated file refused here, naming it
        with safe_open(str(path), framework="pt") as file:
            for key in file.keys():
                tensor = file.get_slice(key)
                entries[key] = (path, key, tuple(tensor.get_shape()), tensor.get_dtype())
    return {key.removeprefix(prefix + "."): entry for key, entry in entries.items()}  # a task head's (lm_head.weight) kept


def weights_bytes(folder: Path, dtype: torch.dtype) -> int:
    """The checkpoint's weights' size in dtype, from its safetensors headers alone (before anything loads)."""
    entries = stored_entries(folder, prefix="")
    return sum(_numel(shape) for _, _, shape, _ in entries.values()) * dtype.itemsize


def layer_at_a_time_note(name: str, size: int, dtype: str, asked: bool) -> str | None:
    """The run's note of a model read a layer's weights at a time: asked, or its size (its weights' bytes in dtype) past
    LAYER_AT_A_TIME_BYTES; None where it is read whole (the loaders' one test of the choice)."""
    if not asked and size <= LAYER_AT_A_TIME_BYTES:
        return None
    why = "as asked" if asked else f"its weights are {size / 1e9:.1f} GB in {dtype}, past {LAYER_AT_A_TIME_BYTES / 1e9:.1f} GB"
    note = f"{name} ran a layer's weights at a time ({why}): each layer's read from its files as it ran, then let go"
    if dtype in HALF_UNIT_ROUNDOFF:  # the bound tests/test_layer_at_a_time.py holds the maps to (docs/models.md)
        note += (
            f"; computed in {dtype}, each head's weights at layer l (from 0) lie within (l + 1) x {HALF_UNIT_ROUNDOFF[dtype]} x "
            "its largest possible score (max |q| max |k| / sqrt(d)) of the float32 run's"
        )
    return note


def gpu_budgets(device: str) -> dict[str, int]:
    """The bytes of a layer-at-a-time model's layers that each GPU may hold, read once, the one that computes (device)
    first: KEPT_GPU_SHARE of its free memory, HELD_GPU_SHARE of each other's; none on the CPU, where reading each
    layer as it runs is the point."""
    if device != "cuda":
        return {}
    here = torch.cuda.current_device()
    others = [index for index in range(torch.cuda.device_count()) if index != here]
    budgets = {device: int(KEPT_GPU_SHARE * torch.cuda.mem_get_info(here)[0])}
    return budgets | {f"cuda:{index}": int(HELD_GPU_SHARE * torch.cuda.mem_get_info(index)[0]) for index in others}


def placed_note(note: str | None, model) -> str | None:
    """A layer-at-a-time run's note (layer_at_a_time_note's) saying which of the model's layers (a TransformersModel's)
    stay on the device that computes and which other GPUs hold (layer_places)."""
    places, device = model.layer_places, model.weights_device
    if note is None or not places:
        return note
    kept = sum(place == device for place in places.values())
    note += f"; {kept} of its {len(model.layer_names())} layers kept on {device}, read once"
    held = collections.Counter(place for place in places.values() if place != device)
    if held:
        note += f"; held, read once and copied to {device} as each runs: " + ", ".join(f"{count} on {place}" for place, count in held.items())
    where = f"{KEPT_GPU_SHARE:.0%} of {device}'s free memory" + (f" and {HELD_GPU_SHARE:.0%} of each other GPU's" if held else "")
    return f"{note} (accelerate's device map, within {where if device == 'cuda' else 'a budget'})"


def stored_weights(entries: dict[str, tuple[Path, str, tuple[int, ...], str]]) -> Mapping[str, torch.Tensor]:
    """The weights map of a safetensors checkpoint: name -> the tensor as stored, read from its file on access."""
    from accelerate.utils import OffloadedWeightsLoader

    index = {name: {"safetensors_file": str(path), "weight_name": key} for name, (path, key, _, _) in entries.items()}
    return OffloadedWeightsLoader(index=index)


def build_empty(model_class: type, config: dict, dtype: torch.dtype) -> nn.Module:
    """transformers' base model of model_class from config.json's values, its parameters on the meta device (no
    memory) in dtype; its buffers (RoPE's frequencies) computed on the CPU as its own __init__ makes them."""
    from accelerate import init_empty_weights

    with init_empty_weights(include_buffers=False):
        model = model_class(model_class.config_class.from_dict(config))
    for module in model.modules():
        for name, parameter in module.named_parameters(recurse=False):
            setattr(module, name, nn.Parameter(parameter.to(dtype), requires_grad=False))  # meta: nothing allocated
    model.tie_weights()  # one parameter under the names the config ties (T5's and BART's shared embeddings), as from_pretrained ties them
    model.set_attn_implementation("eager")
    return model.eval()


def safetensors_map(folder: Path, prefix: str):
    """A safetensors checkpoint as load_layer_at_a_time reads it: (its weights map, every tensor's shape, and mapped:
    name -> the tensor as stored, memory-mapped (mapped_tensor), or None where the files hold no such name), by the base
    model's names (a task head's prefix taken off)."""
    entries = stored_entries(folder, prefix)
    shapes = {name: shape for name, (_, _, shape, _) in entries.items()}

    def mapped(name: str) -> torch.Tensor | None:
        return mapped_tensor(*entries[name][:2]) if name in entries else None

    return stored_weights(entries), shapes, mapped


def loading_info(empty: nn.Module, shapes: dict[str, tuple[int, ...]]) -> dict[str, list]:
    """What transformers' from_pretrained reports as its loading info (missing, unexpected and mismatched names), for
    empty (build_empty's model) and the checkpoint's shapes by the same names: the caller refuses what it must before
    load_layer_at_a_time reads a tensor."""
    parameters = dict(empty.named_parameters())
    return {
        "missing_keys": sorted(set(parameters) - set(shapes)),
        "unexpected_keys": sorted(set(shapes) - set(parameters)),
        "mismatched_keys": sorted(name for name in set(parameters) & set(shapes) if tuple(parameters[name].shape) != tuple(shapes[name])),
    }


def load_layer_at_a_time(
    empty: nn.Module,
    layer_names: list[str],
    weights_map: Mapping[str, torch.Tensor],
    shapes: dict[str, tuple[int, ...]],
    device: str,
    mapped=None,
) -> tuple[dict[str, str], Mapping[str, torch.Tensor]]:
    """empty (build_empty's model) made to run on device with weights read from weights_map a layer at a time: each
    module of layer_names hooked (its weights on the device during its forward alone) but those layer_places keeps
    there, the other parameters read once. Returns layer_places' answer and the weights map the hooks read: weights_map
    with the layers that other GPUs hold laid over it. shapes: each weight's shape, by the same names (the
    safetensors headers'), checked by the caller (loading_info); a parameter outside the layers that they lack, one
    the caller found unused (a pooler that a masked-LM checkpoint leaves out), is zeros, as no number of attnviz reads
    it. mapped(name), when given, is a tensor as stored and memory-mapped (or None): a plain nn.Embedding's table that
    it gives is read by rows (StoredEmbedding), never from weights_map."""
    from accelerate.hooks import AlignDevicesHook, add_hook_to_module
    from accelerate.utils import PrefixedDataset, set_module_tensor_to_device

    parameters = dict(empty.named_parameters())
    keep_large_blocks_apart()
    places = layer_places(empty, layer_names, gpu_budgets(device))
    streamed = [name for name in layer_names if places.get(name) != device]
    held = {
        f"{name}.{parameter_name}": weights_map[f"{name}.{parameter_name}"].to(place, parameter.dtype)
        for name, place in places.items() if place != device
        for parameter_name, parameter in empty.get_submodule(name).named_parameters()
    }  # fmt: skip
    if held:
        weights_map = collections.ChainMap(held, weights_map)
    in_layers = tuple(name + "." for name in streamed)
    for name in streamed:
        hook = AlignDevicesHook(execution_device=device, offload=True, weights_map=PrefixedDataset(weights_map, name + "."), place_submodules=True)
        add_hook_to_module(empty.get_submodule(name), hook)
        empty.get_submodule(name).register_forward_hook(give_back_freed_memory)
    table, stored = None, None  # the input embeddings' table, read by rows where mapped gives it
    embeddings = empty.get_input_embeddings()
    if type(embeddings) is nn.Embedding and mapped is not None:  # not a scaled one (BART's): its forward is its own
        rows = mapped(next(name for name, parameter in parameters.items() if parameter is embeddings.weight))
        if rows is not None:
            table, stored = embeddings.weight, StoredEmbedding(rows, embeddings.weight.dtype)
    for name, parameter in parameters.items():
        if not name.startswith(in_layers) and parameter is not table:
            value = weights_map[name] if name in shapes else torch.zeros(parameter.shape, dtype=parameter.dtype)
            set_module_tensor_to_device(empty, name, device, value=value)
    empty.tie_weights()  # the tied names to the parameters just read (set_module_tensor_to_device put new ones in)
    if stored is not None:
        empty.set_input_embeddings(stored)
    return places, weights_map


def layer_places(model: nn.Module, layer_names: list[str], budgets: dict[str, int]) -> dict[str, str]:
    """Where each layer's weights stay, read once (gpu_budgets' devices: the first computes, the others hold): as
    accelerate's device map places the layers (infer_auto_device_map, in order, none split) on those devices in their
    order, within each one's bytes, with room kept on the first for a layer read as it runs. A layer left out is read
    from its files as it runs."""
    if not budgets:
        return {}
    from accelerate import infer_auto_device_map

    devices = list(budgets)  # accelerate names them by index; the first keeps room for a layer read as it runs
    layers = nn.ModuleDict({str(index): model.get_submodule(name) for index, name in enumerate(layer_names)})
    placed = infer_auto_device_map(
        layers, max_memory={index: budgets[device] for index, device in enumerate(devices)} | {"disk": 2**62}, clean_result=False,
        no_split_module_classes=list({type(layer).__name__ for layer in layers.values()}),
    )  # fmt: skip
    return {name: devices[placed[str(index)]] for index, name in enumerate(layer_names) if placed.get(str(index)) != "disk"}


def run_by_positions(module: nn.Module) -> None:
    """module (a layer's MLP, whose output at a position is computed from that position's input alone) made to run over
    chunks of positions of its input (B, N, D), each chunk's widest activation (positions x the largest size of its
    weights) within MLP_CHUNK_BYTES, the chunks' outputs written into one (B, N, D): the same numbers, its
    intermediates never whole. Its forward is wrapped on the instance (as accelerate's hooks wrap a layer's); hooks
    on the module see the whole input and output."""
    forward = module.forward

    def by_positions(hidden: torch.Tensor, *args, **kwargs):
        width = max((max(parameter.shape) for parameter in module.parameters()), default=1)
        rows = max(1, MLP_CHUNK_BYTES // (width * hidden.element_size()))
        if hidden.dim() != 3 or hidden.shape[1] <= rows:
            return forward(hidden, *args, **kwargs)
        output = None
        for first in range(0, hidden.shape[1], rows):
            chunk = forward(hidden[:, first : first + rows], *args, **kwargs)  # (B, rows, D)
            if output is None:
                output = chunk.new_empty(chunk.shape[0], hidden.shape[1], *chunk.shape[2:])
            output[:, first : first + rows] = chunk
        return output

    module.forward = by_positions


def give_back_freed_memory(*ignored) -> None:
    """After a layer has run and its weights are let go (a forward hook): the pages malloc keeps of what was freed given
    back to the system (glibc's malloc_trim; elsewhere nothing). glibc serves blocks under its mmap threshold, which
    rises to 32 MB as large blocks are freed, from its heap, where each layer's freed weights otherwise stay in the
    process's memory: the 1B-shaped Llama's peak summarising every head, 1,454 MB without, 1,172 MB with
    (bench/layer_at_a_time.py)."""
    libc = _glibc()
    if libc is not None:
        libc.malloc_trim(0)


def keep_large_blocks_apart() -> None:
    """glibc's malloc told to take every block of MMAP_THRESHOLD bytes or more from the system on its own (mmap) and to
    give it back as it is freed (mallopt's M_MMAP_THRESHOLD; elsewhere nothing), for the rest of the process. By
    default the threshold rises to 32 MB as large blocks are freed, and a long text's blocks under it (each block of
    queries' weights, of a new width each; a layer's weights) come from the heap, where small tensors kept between
    them leave holes that later blocks do not fit: the 1B-shaped Llama at 2,048 tokens peaked at 1,341 MB so, 1,150 MB
    with a threshold of 4 MB, no slower (bench/layer_at_a_time.py)."""
    libc = _glibc()
    if libc is not None:
        libc.mallopt(-3, MMAP_THRESHOLD)  # M_MMAP_THRESHOLD (malloc.h); also stops glibc's raising it


@functools.cache
def _glibc():
    """glibc's C library, None where there is none (macOS, Windows, musl)."""
    import ctypes

    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.malloc_trim  # glibc's alone
        return libc
    except (OSError, AttributeError):
        return None


def mapped_tensor(path: Path, key: str) -> torch.Tensor:
    """A safetensors file's tensor as stored, memory-mapped: no byte read until used (its header: 8 bytes of length, then
    JSON giving each tensor's dtype, shape and byte offsets from the header's end)."""
    with open(path, "rb") as file:
        length = int.from_bytes(file.read(8), "little")
        entry = json.loads(file.read(length))[key]
    begin, end = (8 + length + offset for offset in entry["data_offsets"])
    dtype = STORED_DTYPES.get(entry["dtype"])
    if dtype is None or begin % dtype.itemsize:  # another dtype, or not aligned for a view (safetensors aligns its data): read it
        from safetensors import safe_open

        with safe_open(str(path), framework="pt") as tensors:
            return tensors.get_tensor(key)
    with open(path, "rb") as file:  # the file's bytes mapped copy-on-write (nothing of it is written), as torch.from_file maps them
        mapping = mmap.mmap(file.fileno(), end, access=mmap.ACCESS_COPY)
    tensor = torch.frombuffer(mapping, dtype=torch.uint8, count=end - begin, offset=begin).view(dtype).view(entry["shape"])
    tensor.file_pages = (mapping, begin)  # for give_back_rows
    return tensor


def vocabulary_chunks(*tables: torch.Tensor):
    """The rows of tables (V, ...) LOGIT_ROWS at a time, as slices; after each, what the rows of a memory-mapped table
    (mapped_tensor's) brought into memory given back (give_back_rows): a pass over the vocabulary holds one chunk of
    a table read from its file, not the whole table (Llama-3.2-1B's is 525 MB in bfloat16)."""
    for first in range(0, tables[0].shape[0], LOGIT_ROWS):
        rows = slice(first, first + LOGIT_ROWS)
        yield rows
        for table in tables:
            give_back_rows(table, rows)


def give_back_rows(table: torch.Tensor, rows: slice) -> None:
    """The pages that reading those rows of a memory-mapped table (mapped_tensor's; any other: nothing) brought into the
    process's memory given back to the system (madvise's MADV_DONTNEED; where there is none, nothing). The file's bytes
    stay in the page cache, and rows read again are mapped again from there: a mapping nothing writes loses nothing."""
    mapping, begin = getattr(table, "file_pages", (None, 0))
    if mapping is None or not hasattr(mmap, "MADV_DONTNEED"):
        return
    row_bytes = table.stride(0) * table.element_size()
    first = begin + rows.start * row_bytes
    start = first - first % mmap.PAGESIZE
    stop = min(begin + min(rows.stop, table.shape[0]) * row_bytes, len(mapping))
    mapping.madvise(mmap.MADV_DONTNEED, start, stop - start)


class StoredEmbedding(nn.Module):
    """An input embedding table read by rows from its memory-mapped file: forward(ids) gives the ids' rows (..., D) in
    the model's dtype, the table (V, D) never copied whole (a 128,256-row table in float32 is 1 GB); weight is the
    table as stored (the output head's, where tied: logits in chunks, unembed)."""

    def __init__(self, table: torch.Tensor, dtype: torch.dtype):
        super().__init__()
        self.table, self.dtype = table, dtype

    @property
    def weight(self) -> torch.Tensor:
        return self.table

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return nn.functional.embedding(ids.to(self.table.device), self.table).to(ids.device, self.dtype)


def unembed(hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """The logits hidden (..., D) @ weight (V, D)^T + bias (V,), in hidden's dtype and on its device: whole where the
    weight is already so, else LOGIT_ROWS of the vocabulary at a time, each cast from the weight as stored (a
    memory-mapped bfloat16 table is never whole in float32)."""
    if weight.dtype == hidden.dtype and weight.device == hidden.device:
        return nn.functional.linear(hidden, weight, bias)
    chunks = [
        nn.functional.linear(hidden, weight[rows].to(hidden), None if bias is None else bias[rows].to(hidden))
        for rows in vocabulary_chunks(weight)
    ]
    return torch.cat(chunks, dim=-1)


@contextlib.contextmanager
def resident(model: nn.Module, names: tuple[str, ...], weights_map: Mapping[str, torch.Tensor] | None, device: str | None):
    """Within, the weights of the model's modules of those names are on the device in the model's dtype, read from
    weights_map (None: the model is held whole; nothing to do); after, let go. For what reads a module's weights
    outside its layer's forward (attnviz's own layer, a norm's weight): that module's alone, not its layer's. A weight
    there already (in its layer's forward, or read by an enclosing resident) is left as it is."""
    from accelerate.utils import set_module_tensor_to_device

    read = []
    if weights_map is not None:
        for name in names:
            for parameter_name, parameter in model.get_submodule(name).named_parameters():
                if parameter.is_meta:
                    full = f"{name}.{parameter_name}"
                    set_module_tensor_to_device(model, full, device, value=weights_map[full])
                    read.append(full)
    try:
        yield
    finally:
        for full in read:
            set_module_tensor_to_device(model, full, "meta")
        if read:  # what was read (and a copy of it let go since: a layer of attnviz's) given back to the system
            give_back_freed_memory()


@contextlib.contextmanager
def let_go_after(modules: list[nn.Module]):
    """Within, a pass; after, the weights of those modules still on the device let go (on the meta device), as their
    hooks' post_forward does: a pass stopped inside a layer (a capture that needs no later layer) never gets there."""
    from accelerate.utils import set_module_tensor_to_device

    try:
        yield
    finally:
        for module in modules:
            for name, parameter in module.named_parameters():
                if not parameter.is_meta:
                    set_module_tensor_to_device(module, name, "meta")


def _numel(shape: tuple[int, ...]) -> int:
    count = 1
    for size in shape:
        count *= size
    return count

