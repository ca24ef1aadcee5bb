"""Every family but BERT, through transformers: its model gives each layer's input, attnviz's layer computes.

transformers' model (eager attention, float32, eval mode) runs the text; a hook on each
attention module takes what enters it: the hidden state after the family's own norms (pre-norm
decoders normalise first: RMSNorm, LayerNorm), and for cross-attention the encoder's output.
attnviz's own layer (attention/layer.py) then computes the weights from the module's
projections, read here as AttentionWeights: W_q, W_k and W_v (GPT-2's fused c_attn split, its
Conv1D weights transposed), W_o, the key/value heads, the scale, RoPE's frequencies, Qwen3's
q/k norms; and T5's relative position bias, from the model's own bucket table.

transformers is imported only here, on this path: `attnviz --help` and BERT runs never pay for it.
Only safetensors are loaded (use_safetensors=True), and nothing from the folder is run
(trust_remote_code is never set).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

import torch
from torch import nn

from attnviz.attention.layer import AttentionWeights
from attnviz.errors import AttnvizError
from attnviz.models.families import DECODER, ENCODER_DECODER, Family
from attnviz.models.words import tokenizer_scheme

# transformers' base model class (no task head) of each model_type.
MODEL_CLASSES = {
    "roberta": "RobertaModel",
    "xlm-roberta": "XLMRobertaModel",
    "distilbert": "DistilBertModel",
    "albert": "AlbertModel",
    "electra": "ElectraModel",
    "gpt2": "GPT2Model",
    "llama": "LlamaModel",
    "mistral": "MistralModel",
    "qwen2": "Qwen2Model",
    "qwen3": "Qwen3Model",
    "bart": "BartModel",
    "marian": "MarianModel",
    "t5": "T5Model",
}

@dataclass
class Captured:
    """What entered one attention module: the hidden state (B, Nq, D) and, for cross-attention, the encoder's (B, Nk, D)."""

    hidden: torch.Tensor
    kv_hidden: torch.Tensor | None = None

class _Stop(Exception):
    """Raised by a hook once every layer asked for is captured: the rest of the forward pass is not needed."""

def load_transformers_model(folder: Path, family: Family, config: dict, device: str) -> "TransformersModel":
    """transformers' base model of the family from a checked folder (safetensors only), in eval mode on device."""
    import transformers
    from transformers.utils import logging as hf_logging

    model_class = getattr(transformers, MODEL_CLASSES[config["model_type"]])
    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()  # e.g. "some weights were not used": a task head attnviz does not need
    hf_logging.disable_progress_bar()
    try:
        model = model_class.from_pretrained(
            folder,
            use_safetensors=True,
            attn_implementation="eager",
            dtype=torch.float32,
            local_files_only=True,
        )
    finally:
        hf_logging.set_verbosity(verbosity)
    return TransformersModel(family, config, model.to(device).eval())

class TransformersModel:
    """A transformers model of a supported family, and what attnviz's layer needs from it.

    stack is None for encoders and decoders; for an encoder-decoder, "encoder", "decoder" (the
    decoder's self-attention) or "cross" (the decoder's attention over the encoder's output).
    """

    def __init__(self, family: Family, config: dict, model: nn.Module):
        self.family = family
        self.config = config
        self.model = model
        self.model_type = config["model_type"]
        if self.model_type == "albert" and config.get("inner_group_num", 1) != 1:
            raise AttnvizError("ALBERT with inner_group_num other than 1 is not supported: every released ALBERT has 1")

    # ---- sizes -----------------------------------------------------------------------------

    def num_layers(self, stack: str | None = None) -> int:
        key = "decoder_layers" if stack in ("decoder", "cross") else "layers"
        return self.family.size(self.config, key)

    def num_heads(self, stack: str | None = None) -> int:
        key = "decoder_heads" if stack in ("decoder", "cross") else "heads"
        return self.family.size(self.config, key)

    # ---- the attention modules and their projections ---------------------------------------

    def attention_module(self, layer: int, stack: str | None = None) -> tuple[str, nn.Module]:
        """The module (and its name in the model) whose input is layer `layer`'s attention input."""
        name = self._module_names(layer, stack)[0]
        return name, self.model.get_submodule(name)

    def _module_names(self, layer: int, stack: str | None) -> tuple[str, dict[str, str]]:
        """(the hooked module's name, the names of w_q, w_k, w_v, w_o) in the base model."""
        kind, i = self.model_type, layer
        if kind in ("roberta", "xlm-roberta", "electra"):
            base = f"encoder.layer.{i}.attention"
            return f"{base}.self", _names(f"{base}.self", "query", "key", "value", f"{base}.output.dense")
        if kind == "distilbert":
            base = f"transformer.layer.{i}.attention"
            return base, _names(base, "q_lin", "k_lin", "v_lin", "out_lin")
        if kind == "albert":
            groups, layers = self.config.get("num_hidden_groups", 1), self.num_layers()
            base = f"encoder.albert_layer_groups.{i * groups // layers}.albert_layers.0.attention"  # shared by layers
            return base, _names(base, "query", "key", "value", "dense")
        if kind == "gpt2":
            base = f"h.{i}.attn"
            return base, _names(base, "c_attn", "c_attn", "c_attn", "c_proj")
        if kind in ("llama", "mistral", "qwen2", "qwen3"):
            base = f"layers.{i}.self_attn"
            return base, _names(base, "q_proj", "k_proj", "v_proj", "o_proj")
        side = "decoder" if stack in ("decoder", "cross") else "encoder"
        if kind in ("bart", "marian"):
            base = f"{side}.layers.{i}.{'encoder_attn' if stack == 'cross' else 'self_attn'}"
            return base, _names(base, "q_proj", "k_proj", "v_proj", "out_proj")
        if kind == "t5":
            base = f"{side}.block.{i}.layer.1.EncDecAttention" if stack == "cross" else f"{side}.block.{i}.layer.0.SelfAttention"
            return base, _names(base, "q", "k", "v", "o")
        raise AssertionError(f"no attention modules for {kind}")  # families.py and MODEL_CLASSES list the same types

    def attention_weights(self, layer: int, stack: str | None = None) -> AttentionWeights:
        """Layer `layer`'s projections and settings, as attnviz's layer takes them."""
        module_name, names = self._module_names(layer, stack)
        module = self.model.get_submodule(module_name)
        heads = self.num_heads(stack)
        if self.model_type == "gpt2":
            projections = _gpt2_projections(module)
        else:
            projections = [_linear(self.model.get_submodule(names[key])) for key in ("w_q", "w_k", "w_v", "w_o")]
        kv_heads = heads
        if self.family.rotary:
            kv_heads = self.family.size(self.config, "kv_heads")
        for key, (weight, bias) in zip(("w_q", "w_k", "w_v", "w_o"), projections):
            _require_finite(weight, names[key] + ".weight")
            if bias is not None:
                _require_finite(bias, names[key] + ".bias")
        head_dim = projections[0][0].shape[0] // heads
        weights = AttentionWeights(
            *projections,
            num_heads=heads,
            num_kv_heads=kv_heads,
            head_dim=head_dim,
            names=names,
            scale=float(module.scaling),
            family=self.family.name,
        )
        if self.family.rotary:
            rotary = self.model.rotary_emb
            weights.rotary_inv_freq = rotary.inv_freq.detach().float()
            weights.rotary_scaling = float(getattr(rotary, "attention_scaling", 1.0))
            weights.rope_theta = _rope_theta(self.config)
        if getattr(module, "q_norm", None) is not None:  # Qwen3
            weights.q_norm = (module.q_norm.weight.detach(), module.q_norm.variance_epsilon)
            weights.k_norm = (module.k_norm.weight.detach(), module.k_norm.variance_epsilon)
        weights.position_bias = self.family.position_bias and stack != "cross"
        if self.model_type == "gpt2":
            weights.fused_qkv = names["w_q"]  # one Conv1D, c_attn, stores W_q, W_k and W_v side by side, transposed
        return weights

    def position_bias(self, stack: str | None, num_queries: int, num_keys: int, device: str) -> torch.Tensor | None:
        """T5's relative position bias (1, H, Nq, Nk), from the stack's first block's bucket table; None for other families."""
        if not self.family.position_bias or stack == "cross":
            return None
        side = "decoder" if stack == "decoder" else "encoder"
        first = self.model.get_submodule(f"{side}.block.0.layer.0.SelfAttention")
        with torch.inference_mode():
            return first.compute_bias(num_queries, num_keys, device=device)

    # ---- layer inputs ------------------------------------------------------------------------

    @torch.inference_mode()
    def capture(
        self,
        inputs: dict[str, torch.Tensor],
        layers: list[int],
        stack: str | None = None,
        source: dict[str, torch.Tensor] | None = None,
    ) -> dict[int, Captured]:
        """What enters the attention of each of `layers`, from one forward pass stopped after the last of them.

        inputs are the padded batch's input_ids and attention_mask (for an encoder-decoder's
        decoder or cross stack, the decoder's); source the encoder's, for those stacks.
        """
        wanted = sorted(set(layers))
        seen: dict[int, list] = {}  # id(module) -> the calls it has had (ALBERT's layers share one module)
        captured: dict[int, Captured] = {}
        owners: dict[int, list[int]] = {}  # id(module) -> the layers it serves, in order
        for layer in range(max(wanted) + 1):
            owners.setdefault(id(self.attention_module(layer, stack)[1]), []).append(layer)

        def hook(module: nn.Module, args: tuple, kwargs: dict[str, Any]) -> None:
            calls = seen.setdefault(id(module), [])
            layer = owners[id(module)][len(calls)]
            calls.append(layer)
            if layer in wanted:
                hidden = args[0] if args else kwargs["hidden_states"]
                if not torch.isfinite(hidden).all():
                    raise AttnvizError(f"NaN or infinity in the input of layer {layer}: the model's weights hold them, or overflow")
                kv = kwargs.get("key_value_states") if stack == "cross" else None
                captured[layer] = Captured(hidden.detach().clone(), None if kv is None else kv.detach().clone())
            if len(captured) == len(wanted):
                raise _Stop

        modules = {id(module): module for module in (self.attention_module(layer, stack)[1] for layer in wanted)}
        handles = [module.register_forward_pre_hook(hook, with_kwargs=True) for module in modules.values()]
        try:
            self._forward(inputs, stack, source)
        except _Stop:
            pass
        finally:
            for handle in handles:
                handle.remove()
        return captured

    def _forward(self, inputs: dict[str, torch.Tensor], stack: str | None, source: dict[str, torch.Tensor] | None) -> None:
        kwargs = {"input_ids": inputs["input_ids"], "attention_mask": inputs["attention_mask"], "use_cache": False}
        if self.family.kind != ENCODER_DECODER:
            if self.family.kind != DECODER:
                kwargs.pop("use_cache")
            self.model(**kwargs)
        elif stack in (None, "encoder"):
            self.model.get_encoder()(input_ids=inputs["input_ids"], attention_mask=inputs["attention_mask"])
        else:
            self.model(
                input_ids=source["input_ids"],
                attention_mask=source["attention_mask"],
                decoder_input_ids=inputs["input_ids"],
                decoder_attention_mask=inputs["attention_mask"],
                use_cache=False,
            )

def _require_finite(tensor: torch.Tensor, name: str) -> None:
    """An AttnvizError naming the tensor if it holds NaN or infinity (a finite sum, the usual case, means none)."""
    if not torch.isfinite(tensor.sum()):
        count = int((~torch.isfinite(tensor)).sum())
        if count:
            raise AttnvizError(f"the model's {name} holds {count} NaN or infinite value{'s' if count > 1 else ''}: its checkpoint is damaged")


def _names(base: str, q: str, k: str, v: str, o: str) -> dict[str, str]:
    """The model's names of w_q, w_k, w_v, w_o; o may be a full name (RoBERTa's sits beside the module)."""
    full = lambda name: name if "." in name else f"{base}.{name}"  # noqa: E731
    return {"w_q": full(q), "w_k": full(k), "w_v": full(v), "w_o": full(o)}

def _linear(module: nn.Linear) -> tuple[torch.Tensor, torch.Tensor | None]:
    return module.weight.detach(), None if module.bias is None else module.bias.detach()

def _gpt2_projections(module: nn.Module) -> list[tuple[torch.Tensor, torch.Tensor | None]]:
    """GPT-2's fused c_attn split into W_q, W_k, W_v, and c_proj: Conv1D stores (in, out), nn.Linear (out, in)."""
    weight, bias = module.c_attn.weight.detach(), module.c_attn.bias.detach()  # (D, 3D), (3D,)
    size = weight.shape[1] // 3
    projections = [(weight[:, part * size : (part + 1) * size].T, bias[part * size : (part + 1) * size]) for part in range(3)]
    projections.append((module.c_proj.weight.detach().T, module.c_proj.bias.detach()))
    return projections

def _rope_theta(config: dict) -> float:
    parameters = config.get("rope_parameters") or config.get("rope_scaling") or {}
    return float(parameters.get("rope_theta") or config.get("rope_theta") or 10000.0)

class TransformersTokenizer:
    """A family's own tokenizer (transformers' AutoTokenizer, never remote code) with the interface encode() needs.

    start_token_id set: a decoder's view of it, the ids shifted right behind the decoder's start
    token, as an encoder-decoder's decoder reads a text (teacher forcing).
    """

    def __init__(self, tokenizer: Any, embedding_rows: int, start_token_id: int | None = None):
        self._tokenizer = tokenizer
        self.embedding_rows = embedding_rows
        self.start_token_id = start_token_id
        self.unk_token = tokenizer.unk_token or "<unk>"
        self.unk_token_id = tokenizer.unk_token_id
        pad = tokenizer.pad_token_id
        self.pad_token_id = pad if pad is not None else (tokenizer.eos_token_id or 0)
        self.all_special_ids = sorted(set(tokenizer.all_special_ids))
        ids = self._raw_ids(["a"])[0]
        # e.g. [SEP], </s>: --truncate keeps it. A decoder's shifted view ends with the text's own last token.
        self.ends_with_special = start_token_id is None and bool(ids) and ids[-1] in self.all_special_ids

    @cached_property
    def word_scheme(self) -> str | None:
        """How its tokens mark words (models/words.py), from the fast tokenizer's tokenizer.json; None (guessed from the tokens) for a slow one."""
        backend = getattr(self._tokenizer, "backend_tokenizer", None)
        return tokenizer_scheme(json.loads(backend.to_str())) if backend is not None else None

    def for_decoder(self, start_token_id: int) -> "TransformersTokenizer":
        return TransformersTokenizer(self._tokenizer, self.embedding_rows, start_token_id)

    def _raw_ids(self, texts: list[str]) -> list[list[int]]:
        return [list(ids) for ids in self._tokenizer(texts, add_special_tokens=True)["input_ids"]]

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        ids = self._raw_ids(texts)
        if self.start_token_id is not None:
            ids = [[self.start_token_id, *row[:-1]] for row in ids]
        for row in ids:
            if row and max(row) >= self.embedding_rows:
                raise AttnvizError(
                    f"the tokenizer gives the id {max(row)}, past the {self.embedding_rows} rows of the model's "
                    "embedding table: the tokenizer is not this model's"
                )
        return ids

    def convert_ids_to_tokens(self, ids: list[int]) -> list[str]:
        return self._tokenizer.convert_ids_to_tokens(ids)

def load_transformers_tokenizer(folder: Path, embedding_rows: int) -> TransformersTokenizer:
    from transformers import AutoTokenizer
    from transformers.utils import logging as hf_logging

    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        tokenizer = AutoTokenizer.from_pretrained(folder, local_files_only=True, trust_remote_code=False)
    finally:
        hf_logging.set_verbosity(verbosity)
    return TransformersTokenizer(tokenizer, embedding_rows)

def embedding_rows(model: nn.Module) -> int:
    return model.get_input_embeddings().weight.shape[0]
