"""A GGUF file's weights under transformers' names, each tensor dequantised to float32 when it is read.

llama.cpp's GGUF files hold a model's tensors quantised in blocks (Q4_0, Q4_1, Q8_0, Q4_K, Q6_K, ...),
under llama.cpp's names (`blk.3.attn_q.weight`), with the model's sizes as metadata
(`llama.attention.head_count`). GGUFWeights reads the header (gguf_file.py: the metadata's scalars, each tensor's
shape, type and place) and answers as a read-only mapping from the names of transformers' LlamaForCausalLM to
float32 tensors:

    weights = GGUFWeights("SmolLM2-135M-Instruct.Q4_1.gguf")
    weights.shapes()["model.layers.3.self_attn.q_proj.weight"]   # (576, 576), from the header alone
    weights["model.layers.3.self_attn.q_proj.weight"]             # that tensor alone, dequantised now
    weights.config                                                # LlamaConfig's keys, from the metadata

Each read dequantises one tensor with `gguf.quants.dequantize` (the function transformers' own GGUF loader
calls): the values are those of `from_pretrained(gguf_file=...)`, bit for bit, without the whole model in
float32 at once. A mapping of names to tensors read on demand is what accelerate's offload hooks take
(`weights_map`), so the layer-at-a-time engine can read a layer's tensors from it when the layer runs.

llama.cpp's converter permutes the rows of W_q and W_k of a Llama (its RoPE pairs a head's features i and
i + d/2, llama.cpp's pairs 2i and 2i + 1); reading them back undoes it (_unpermute).

Llama's architecture alone (SmolLM2, Llama 2 and 3 without RoPE scaling, TinyLlama, ...): Mistral is the
same names and permutation with another model_type, Qwen2 adds q, k and v biases left unpermuted (a small
step each); RoPE scaling (`llama.rope.scaling.*`, Llama 3.1's `rope_freqs.weight`) is refused: the file
does not hold what transformers' config needs to compute it.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from attnviz.errors import AttnvizError, first_line
from attnviz.models.gguf_file import GGUFFormatError, read_header, tensor_bytes

ARCHITECTURE = "llama"

# llama.cpp's names (gguf's MODEL_TENSOR names for LLM_ARCH_LLAMA) -> transformers' LlamaForCausalLM names
MODEL_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",  # absent when the head is tied to the embeddings
}
LAYER_NAMES = {
    "attn_norm.weight": "input_layernorm.weight",
    "attn_q.weight": "self_attn.q_proj.weight",
    "attn_k.weight": "self_attn.k_proj.weight",
    "attn_v.weight": "self_attn.v_proj.weight",
    "attn_output.weight": "self_attn.o_proj.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "ffn_gate.weight": "mlp.gate_proj.weight",
    "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
}

# GGUF metadata key (after "llama.") -> LlamaConfig's key: the sizes transformers' loader reads too
CONFIG_KEYS = {
    "block_count": "num_hidden_layers",
    "embedding_length": "hidden_size",
    "feed_forward_length": "intermediate_size",
    "attention.head_count": "num_attention_heads",
    "attention.head_count_kv": "num_key_value_heads",
    "attention.layer_norm_rms_epsilon": "rms_norm_eps",
    "rope.freq_base": "rope_theta",
    "context_length": "max_position_embeddings",
}
REQUIRED = ("block_count", "embedding_length", "feed_forward_length", "attention.head_count", "attention.layer_norm_rms_epsilon")
# Values the gguf package dequantises a call (dequantised): its own dequantize takes 16 rows a call, 9,721 calls and
# 1.3 s of CPU for SmolLM2's file on the project's Xeon (0.8 s so); 2**20 (4 MB of float32) keeps a call's temporaries small.
VALUES_AT_ONCE = 2**20
TOKEN_IDS = {"bos_token_id": "bos_token_id", "eos_token_id": "eos_token_id", "unknown_token_id": "unk_token_id", "padding_token_id": "pad_token_id"}


class GGUFWeights(Mapping):
    """A GGUF file's tensors by transformers' LlamaForCausalLM names (read-only), each dequantised to float32 when read.

    Opening reads the header alone (the tensors stay memory-mapped) and refuses, with one line, a file that is not
    GGUF or is cut short, another architecture than Llama's, a tensor attnviz cannot name, or a tensor type the
    gguf package cannot dequantise: before any weight is used. With dequantised False, the header alone (`attnviz
    models`' sizes: the config), neither the gguf package imported nor the types checked.
    """

    def __init__(self, path: str | Path, dequantised: bool = True):
        self.path = Path(path)
        if dequantised:
            try:
                import gguf  # noqa: F401  its dequantisation, read below
            except ImportError as error:
                raise AttnvizError(f"reading a GGUF file needs the gguf package ({first_line(error)}): pip install gguf") from error
        try:
            header = read_header(self.path)
        except (OSError, GGUFFormatError) as error:  # a truncated or garbled file, said in one line
            raise AttnvizError(f"cannot read the GGUF file {self.path}: {first_line(error) or type(error).__name__}") from error
        fields = header.fields
        architecture = fields.get("general.architecture")
        if architecture != ARCHITECTURE:
            raise AttnvizError(f"cannot read the GGUF file {self.path}: its architecture is {architecture!r}; attnviz reads GGUF files of Llama's ({ARCHITECTURE!r})")
        self._tensors = {self._name_of(tensor.name): tensor for tensor in header.tensors}  # where each lies, not read
        self.config = self._read_config(fields)
        self.has_tokenizer = "tokenizer.ggml.tokens" in fields  # the vocabulary that tokenizer() reads
        if dequantised:
            self._check_types()

    # ---- the mapping -------------------------------------------------------------------------

    def __getitem__(self, name: str):
        """The tensor `name` (transformers' name) in float32, dequantised from the file now: (out, in) for a matrix."""
        import numpy as np
        import torch

        tensor = self._tensors[name]
        values = dequantised(self._bytes(tensor), tensor.type).reshape(self._shape(tensor))
        if name.endswith("self_attn.q_proj.weight"):
            values = _unpermute(values, self.config["num_attention_heads"])
        elif name.endswith("self_attn.k_proj.weight"):
            values = _unpermute(values, self.config["num_key_value_heads"])
        return torch.from_numpy(np.require(values, np.float32, ["C", "W"]))

    def stored_tensor(self, name: str):
        """The tensor `name` dequantised, or None where the file holds none (a tied head's): TransformersModel.mapped."""
        return self[name] if name in self._tensors else None

    def __iter__(self) -> Iterator[str]:
        return iter(self._tensors)

    def __len__(self) -> int:
        return len(self._tensors)

    def shapes(self) -> dict[str, tuple[int, ...]]:
        """Every tensor's shape in transformers' order, from the header alone (no tensor read)."""
        return {name: self._shape(tensor) for name, tensor in self._tensors.items()}

    def types(self) -> dict[str, str]:
        """Every tensor's stored type by name: "Q4_1", "Q8_0", "F32", ..."""
        from gguf import GGMLQuantizationType

        return {name: GGMLQuantizationType(tensor.type).name for name, tensor in self._tensors.items()}

    def tokenizer(self):
        """transformers' tokenizer of the file (its vocabulary, merges and special tokens are metadata), through
        transformers' public AutoTokenizer: a few seconds for a vocabulary of 50,000 tokens."""
        import contextlib
        import io

        from transformers import AutoTokenizer
        from transformers.utils import logging as hf_logging

        verbosity = hf_logging.get_verbosity()
        hf_logging.set_verbosity_error()
        try:
            with contextlib.redirect_stderr(io.StringIO()):  # its progress bar over the vocabulary
                return AutoTokenizer.from_pretrained(self.path.parent, gguf_file=self.path.name, local_files_only=True)
        except Exception as error:
            raise AttnvizError(f"cannot read the tokenizer of the GGUF file {self.path}: {first_line(error) or type(error).__name__}") from error
        finally:
            hf_logging.set_verbosity(verbosity)

    # ---- the header ------------------------------------------------------------------------

    def _name_of(self, gguf_name: str) -> str:
        if gguf_name in MODEL_NAMES:
            return MODEL_NAMES[gguf_name]
        block, _, rest = gguf_name.removeprefix("blk.").partition(".")
        if gguf_name.startswith("blk.") and block.isdigit() and rest in LAYER_NAMES:
            return f"model.layers.{block}.{LAYER_NAMES[rest]}"
        why = ": Llama 3's RoPE scaling, which attnviz does not read from GGUF" if gguf_name == "rope_freqs.weight" else ""
        raise AttnvizError(f"cannot read the GGUF file {self.path}: its tensor {gguf_name!r} is not one of a Llama model's{why}")

    @staticmethod
    def _shape(tensor) -> tuple[int, ...]:
        return tuple(reversed(tensor.dims))  # ggml lists the fastest axis first

    def _bytes(self, tensor):
        try:
            return tensor_bytes(self.path, tensor)
        except (OSError, GGUFFormatError) as error:
            raise AttnvizError(f"cannot read the GGUF file {self.path}: {first_line(error)}") from error

    def _read_config(self, fields: Mapping) -> dict[str, Any]:
        """LlamaConfig's keys from the metadata's fields, as transformers' GGUF loader reads them."""
        missing = [f"llama.{key}" for key in REQUIRED if f"llama.{key}" not in fields]
        if missing:
            raise AttnvizError(f"cannot read the GGUF file {self.path}: its metadata has no {missing[0]}")
        scaling = fields.get("llama.rope.scaling.type", "none")
        if scaling != "none":
            raise AttnvizError(f"cannot read the GGUF file {self.path}: its RoPE is scaled ({scaling}), which attnviz does not read from GGUF")
        config: dict[str, Any] = {"model_type": "llama", "architectures": ["LlamaForCausalLM"]}
        for key, name in CONFIG_KEYS.items():
            if f"llama.{key}" in fields:
                config[name] = fields.get(f"llama.{key}")
        config.setdefault("num_key_value_heads", config["num_attention_heads"])
        head_dim = fields.get("llama.attention.key_length", fields.get("llama.rope.dimension_count"))
        config["head_dim"] = head_dim if head_dim is not None else config["hidden_size"] // config["num_attention_heads"]
        embeddings = self._tensors.get("model.embed_tokens.weight")
        if embeddings is None:
            raise AttnvizError(f"cannot read the GGUF file {self.path}: it holds no token embeddings (token_embd.weight)")
        config["vocab_size"] = fields.get("llama.vocab_size", self._shape(embeddings)[0])
        config["tie_word_embeddings"] = "lm_head.weight" not in self._tensors
        for key, name in TOKEN_IDS.items():
            if f"tokenizer.ggml.{key}" in fields:
                config[name] = fields.get(f"tokenizer.ggml.{key}")
        return config

    def _check_types(self) -> None:
        """Each type the file stores must be one the gguf package dequantises (tried on a block of zeros): another is
        refused now, naming it, before any layer runs."""
        for tensor_type in sorted({tensor.type for tensor in self._tensors.values()}):
            stored = _known_type(tensor_type)
            if stored is None or not _dequantisable(stored):
                name = next(name for name, tensor in self._tensors.items() if tensor.type == tensor_type)
                raise AttnvizError(
                    f"cannot read the GGUF file {self.path}: its tensor {name} is stored as "
                    f"{stored.name if stored is not None else f'type {tensor_type}'}, which the gguf package cannot dequantise"
                )


def _known_type(number: int):
    """gguf's GGMLQuantizationType of that number, or None where the package knows no such type."""
    from gguf import GGMLQuantizationType

    try:
        return GGMLQuantizationType(number)
    except ValueError:
        return None


def _dequantisable(stored) -> bool:
    import numpy as np
    from gguf import GGML_QUANT_SIZES
    from gguf.quants import dequantize

    try:
        dequantize(np.zeros((1, GGML_QUANT_SIZES[stored][1]), np.uint8), stored)
    except (KeyError, NotImplementedError):
        return False
    return True


def dequantised(data, stored_type: int, values_at_once: int = VALUES_AT_ONCE):
    """data (rows, bytes a row), as tensor_bytes reads it, dequantised by the gguf package: float32 (rows, values a row).
    A quantised type through its class's dequantize_rows, values_at_once at a time: the same blocks through the same
    steps as gguf.quants.dequantize, which takes 16 rows a call, so the same bits in fewer calls; F32 and F16 (a view,
    a cast) through dequantize itself."""
    import numpy as np
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, quants

    stored = GGMLQuantizationType(stored_type)
    kind = getattr(quants, stored.name, None)  # Q4_K -> gguf.quants.Q4_K
    if not hasattr(kind, "dequantize_rows"):
        return quants.dequantize(data, stored)
    kind.init_grid()  # the i-quants' grids, as dequantize makes them first
    block_size, type_size = GGML_QUANT_SIZES[stored]
    out = np.empty((data.shape[0], data.shape[1] // type_size * block_size), np.float32)
    step = max(1, values_at_once // out.shape[1])
    for start in range(0, len(out), step):
        out[start : start + step] = kind.dequantize_rows(data[start : start + step])
    return out


def _unpermute(weight, num_heads: int):
    """W_q or W_k (num_heads * d, D) in transformers' order of each head's rows, from llama.cpp's.

    llama.cpp's converter wrote each head's rows (2, d/2) -> (d/2, 2): the halves that transformers' RoPE
    rotates together interleaved, for llama.cpp's RoPE, which rotates neighbours. Read back: (d/2, 2) -> (2, d/2).
    """
    rows, columns = weight.shape
    head_dim = rows // num_heads
    return weight.reshape(num_heads, head_dim // 2, 2, columns).swapaxes(1, 2).reshape(rows, columns)


def load_gguf_model(weights: GGUFWeights, family, device: str, dtype, layer_at_a_time: bool = False):
    """transformers' base model of the family (LlamaModel) from weights, in eval mode on device, in dtype; no float32
    copy of the file is written. Whole: built on the meta device from weights.config, then each parameter set to its
    tensor, dequantised one at a time. A layer at a time (layer_at_a_time: the loader's choice, asked or by size): the
    same weights map read by the layer-at-a-time engine as each layer runs (transformers_loading.layered_model).
    Every parameter must come from the file and every tensor but the language-model head go into the model.
    """
    import transformers
    from accelerate import init_empty_weights
    from accelerate.utils import PrefixedDataset

    from attnviz.models.transformers_loading import layered_model
    from attnviz.models.transformers_model import TransformersModel

    model_class = getattr(transformers, family.model_class)
    prefix = model_class.base_model_prefix + "."
    shapes = {name.removeprefix(prefix): shape for name, shape in weights.shapes().items() if name.startswith(prefix)}
    family.check_weights(weights.config, shapes)
    if layer_at_a_time:
        handle = layered_model(family, weights.config, None, PrefixedDataset(weights, prefix), shapes, None, device, dtype)
        handle.mapped = weights.stored_tensor  # an untied head's tensor, by its own name (output_head)
        return handle
    with init_empty_weights(include_buffers=False):  # parameters on meta; buffers (RoPE's frequencies) computed
        model = model_class(transformers.AutoConfig.for_model(**weights.config))
    expected = set(model.state_dict())
    for what, names in (("missing from the file", expected - set(shapes)), ("in the file but not in the model", set(shapes) - expected)):
        if names:
            raise AttnvizError(f"cannot read the GGUF file {weights.path}: {len(names)} tensors {what} ({', '.join(sorted(names)[:3])})")
    model.load_state_dict({name: weights[prefix + name].to(dtype) for name in sorted(expected)}, strict=True, assign=True)
    model.set_attn_implementation("eager")
    handle = TransformersModel(family, model.config.to_dict(), model.to(device).eval())
    handle.mapped = weights.stored_tensor  # an untied head's tensor, by its own name (output_head)
    return handle


def weights_bytes(weights: GGUFWeights, dtype) -> int:
    """The file's weights' size in dtype once dequantised, from its header alone."""
    import math

    return sum(math.prod(shape) for shape in weights.shapes().values()) * dtype.itemsize


def quantisation(weights: GGUFWeights):
    """What the file stores each kind of tensor as, in the wording of run_data.Quantisation (titles, setup lines, JSON)."""
    from attnviz.run_data import Quantisation

    kinds: dict[str, set[str]] = {}
    for name, stored in weights.types().items():
        kind = ("RMSNorm weights" if "norm" in name else "token embeddings" if "embed_tokens" in name
                else "the language-model head" if name.startswith("lm_head") else "W_q, W_k, W_v, W_o and the MLP's matrices")  # fmt: skip
        kinds.setdefault(kind, set()).add(stored)
    tensor_types = {kind: ", ".join(sorted(types)) for kind, types in kinds.items()}
    matrices = tensor_types.get("W_q, W_k, W_v, W_o and the MLP's matrices", "")
    detail = "; ".join(f"{kind} {types}" for kind, types in tensor_types.items())
    return Quantisation(f"{matrices} GGUF, dequantised", f"the GGUF file's weights: {detail}; dequantised to float32 a tensor at a time by the gguf package", tensor_types)
