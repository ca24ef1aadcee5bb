"""What a family adapter is: one layout of weights, and everything attnviz must know about it.

A Family holds its name and model_types (config.json's), its kind (an encoder, a decoder or an
encoder-decoder), where its config.json keeps each size (with the defaults of transformers'
config class for the keys a config.json may leave out), its transformers base model class, the
names of each layer's attention module and projections, how those split into attnviz's
AttentionWeights, and its position scheme (learned positions, RoPE, T5's relative bias).

Each adapter module (bert.py, distilbert.py, albert.py, gpt2.py, llama.py, bart.py, t5.py)
subclasses Family for its layout and lists its families; families/__init__.py gathers them.
torch and transformers are imported only inside the methods that take a model: the table alone
(`attnviz --help`, `attnviz models`) never imports them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

ENCODER, DECODER, ENCODER_DECODER = "encoder", "decoder", "encoder-decoder"
ROLES = ("w_q", "w_k", "w_v", "w_o")
# The sizes every config must give as positive whole numbers (those its family has a key for).
CHECKED_SIZES = ("layers", "heads", "kv_heads", "hidden", "head_dim", "positions", "decoder_layers", "decoder_heads")


@dataclass(frozen=True)
class MaskedLM:
    """Where a checkpoint saved from the family's *ForMaskedLM class keeps its masked-LM head, beside the base model's
    tensors: logits = LayerNorm(activation(dense(h))) @ W_U^T + bias, h the last hidden state. W_U is the word
    embeddings, which every such class ties to it (decoder: its own W_U's name, where a checkpoint holds one).
    activation and eps: (config.json's key, or None where the class fixes it; the value without one)."""

    dense: str
    norm: str
    bias: str
    decoder: str
    activation: tuple[str | None, str] = ("hidden_act", "gelu")
    eps: tuple[str | None, float] = ("layer_norm_eps", 1e-12)


@dataclass(frozen=True)
class Family:
    """One family: its name as people write it, its model_types, its kind, its config keys and its transformers class.

    keys maps each size to (config.json key, default): layers, heads, kv_heads, hidden, positions,
    vocab, and head_dim where a config may set it apart from hidden / heads. For an encoder-decoder,
    layers and heads are the encoder's; decoder_layers and decoder_heads the decoder's.
    model_class is transformers' base model class (no task head); None where attnviz reads the
    checkpoint itself (BERT).
    """

    name: str
    model_types: tuple[str, ...]
    kind: str  # ENCODER, DECODER or ENCODER_DECODER
    keys: dict[str, tuple[str, object]] = field(default_factory=dict)
    model_class: str | None = None
    position_offset: int = 0  # RoBERTa and BART number positions from an offset: fewer usable positions
    masked_lm: MaskedLM | None = None  # an encoder's masked-LM head (models/masked_lm.py), when its checkpoint has one

    rotary: ClassVar[bool] = False  # RoPE: q and k are rotated by position before the scores
    position_bias: ClassVar[bool] = False  # T5: a learned bias by relative position is added to the scores
    # Tensors attnviz never reads, which a checkpoint may hold or lack (a pooler after the last layer).
    unused_weights: ClassVar[tuple[str, ...]] = ()
    # The norm after a stack's last layer, the base model's module (Llama's norm, GPT-2's ln_f, T5's
    # {side}.final_layer_norm, side "encoder" or "decoder"); None where the last layer's output is the stack's (the
    # post-norm BERTs, BART). analysis/effect.py runs the layers itself, then this.
    final_norm: ClassVar[str | None] = None
    # The norm before layer {index}'s attention, the base model's module (Llama's input_layernorm, GPT-2's ln_1);
    # None where the adapter names none. analysis/circuits.py folds its weight into the OV circuit, as fold_ln does.
    attention_norm: ClassVar[str | None] = None
    # A pre-norm encoder-decoder's norm before decoder layer {index}'s cross-attention (T5's layer.1.layer_norm), the
    # base model's module; None where the adapter names none. analysis/why_cross.py splits cross-attention's scores.
    cross_attention_norm: ClassVar[str | None] = None
    # The attention module's forward is no more than W_o over its heads' outputs, merged, of attention over its input
    # (hidden (B, N, D) -> (output, weights): Llama's self_attn). A pass with attnviz's layer in the model's place then
    # runs it in the whole module's place (TransformersModel.in_place_pass): the model's own q, k, v never computed.
    attention_is_one_module: ClassVar[bool] = False

    def sublayer_norms(self, index: int, stack: str | None) -> tuple[str, ...] | None:
        """A post-norm encoder-decoder's (BART's): the norms after each sublayer of stored layer `index` of the stack's
        side, in order (the decoder's after its self-attention, its cross-attention and its MLP; the encoder's after
        its self-attention and its MLP); None where the adapter names none (analysis/why_cross.py)."""
        return None

    def embedding_norm_name(self, stack: str | None) -> str | None:
        """The norm over an encoder-decoder side's embeddings (BART's layernorm_embedding), if the adapter names one."""
        return None

    @property
    def causal(self) -> bool:
        """A decoder's own attention is causal: each token sees itself and the tokens before it."""
        return self.kind == DECODER

    def final_norm_name(self, stack: str | None) -> str | None:
        """The module name of the stack's final norm (final_norm), None where it has none."""
        if self.final_norm is None:
            return None
        return self.final_norm.format(side="decoder" if stack in ("decoder", "cross") else "encoder")

    @property
    def stacks(self) -> tuple[str | None, ...]:
        """The attention stacks of the model: one, or an encoder-decoder's encoder, decoder and cross-attention."""
        return ("encoder", "decoder", "cross") if self.kind == ENCODER_DECODER else (None,)

    # ---- sizes -----------------------------------------------------------------------------

    def size(self, config: dict, key: str) -> int | None:
        """A size from config.json's values, or what transformers' config class makes of it when absent.

        kv_heads and head_dim exist for every family (one key/value head per query head without
        grouped-query attention; head_dim = hidden / heads where no key sets it apart); the
        decoder's sizes only for an encoder-decoder (None otherwise).
        """
        name, default = self.keys.get(key, (None, None))
        value = config.get(name, default) if name else None
        if value is not None:
            return value
        if key == "kv_heads":  # no key/value head count: one per query head
            return self.size(config, "heads")
        if key == "head_dim":  # the model size split evenly over the heads
            return self.size(config, "hidden") // self.size(config, "heads")
        if key == "decoder_layers" and self.kind == ENCODER_DECODER:  # T5: the decoder as deep as the encoder
            return self.size(config, "layers")
        return None

    def stack_size(self, config: dict, key: str, stack: str | None) -> int:
        """layers or heads of a stack: the decoder's for an encoder-decoder's decoder and cross stacks."""
        return self.size(config, f"decoder_{key}" if stack in ("decoder", "cross") else key)

    def key_name(self, key: str, stack: str | None = None) -> str:
        """config.json's name of a size, for messages."""
        key = f"decoder_{key}" if stack in ("decoder", "cross") and f"decoder_{key}" in self.keys else key
        return self.keys.get(key, (key,))[0]

    def check_config(self, config: dict) -> None:
        """A ValueError for a config.json that cannot describe a model: sizes that are not positive whole numbers."""
        for key in CHECKED_SIZES:
            value = self.size(config, key) if key in self.keys else None
            if key in self.keys and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise ValueError(f"config.json: {self.keys[key][0]} must be a positive whole number, not {value!r}")

    # ---- module names: each adapter says where its attention lives ---------------------------

    def layer_names(self, config: dict, index: int, stack: str | None) -> tuple[str, dict[str, str]]:
        """(the attention module's name, the names of w_q, w_k, w_v, w_o) of stored layer `index` in the base model."""
        raise NotImplementedError

    def mlp_name(self, config: dict, index: int, stack: str | None) -> str:
        """The name of the module whose output is stored layer `index`'s MLP's share of the residual stream, before
        it is added (and before a post-norm layer's own norm): what the capture's mlp role keeps."""
        raise NotImplementedError

    def post_norm_names(self, index: int) -> tuple[str, str] | None:
        """A post-norm encoder's: the names of stored layer `index`'s norm after its attention and its norm after its
        MLP (analysis/why.py carries each part of the stream through them); None for a family that normalises first."""
        return None

    # A post-norm encoder's projection of its embeddings up to its layers' width (ELECTRA's, ALBERT's), else None.
    embedding_projection: ClassVar[str | None] = None

    def stored_index(self, config: dict, layer: int, stack: str | None) -> int:
        """Which stored layer computes layer `layer` (ALBERT's layers share a few)."""
        return layer

    def stored_layers(self, config: dict, stack: str | None) -> tuple[int, str]:
        """How many layers the weights hold for a stack, and config.json's key that says so."""
        return self.stack_size(config, "layers", stack), self.key_name("layers", stack)

    # ---- the weights' shapes, checked against the safetensors headers before anything is built -----

    def projection_shapes(self, config: dict, stack: str | None) -> dict[str, tuple[tuple[int, ...], str]]:
        """Each projection's weight shape (nn.Linear's (out, in)) and the config keys it follows from."""
        heads, kv_heads = self.stack_size(config, "heads", stack), self.size(config, "kv_heads")
        hidden, head_dim = self.size(config, "hidden"), self.size(config, "head_dim")
        kv_heads = kv_heads if self.rotary else heads
        h, kv, d, size = self.key_name("heads", stack), self.key_name("kv_heads"), self.key_name("head_dim"), self.key_name("hidden")
        d = d if "head_dim" in self.keys else f"{size} / {h}"
        return {
            "w_q": ((heads * head_dim, hidden), f"{h} × {d} by {size}"),
            "w_k": ((kv_heads * head_dim, hidden), f"{kv if self.rotary else h} × {d} by {size}"),
            "w_v": ((kv_heads * head_dim, hidden), f"{kv if self.rotary else h} × {d} by {size}"),
            "w_o": ((hidden, heads * head_dim), f"{size} by {h} × {d}"),
        }

    def embedding_shapes(self, config: dict) -> dict[str, tuple[tuple[int, ...], str]]:
        """The embedding tables' shapes and the config keys they follow from."""
        return {}

    def check_weights(self, config: dict, shapes: dict[str, tuple[int, ...]]) -> None:
        """A ValueError naming the first size of config.json that the weights' headers contradict.

        shapes are the base model's tensors (a task head's prefix taken off). Layers are counted
        before their shapes are read, so that a config of a million layers is refused at once.
        """
        for name, (shape, why) in self.embedding_shapes(config).items():
            self._require(config, shapes, name, shape, why)
        for stack in self.stacks:
            count, key = self.stored_layers(config, stack)
            held = 0
            while held <= count and self.layer_names(config, held, stack)[1]["w_q"] + ".weight" in shapes:
                held += 1
            if held != count:
                first = self.layer_names(config, 0, stack)[1]["w_q"] + ".weight"
                which = f"{stack} " if stack in ("encoder", "decoder") else ""
                held_text = f"{held}" if held else f"none (no {first})"
                raise ValueError(f"config.json's {key} is {count}, but the weights hold {held_text} of those {which}layers")
            expected = self.projection_shapes(config, stack)
            for index in range(count):
                names = self.layer_names(config, index, stack)[1]
                for role in ROLES:
                    shape, why = expected[role]
                    self._require(config, shapes, names[role] + ".weight", shape, why)

    def _require(self, config: dict, shapes: dict, name: str, shape: tuple[int, ...], why: str) -> None:
        if name not in shapes:
            raise ValueError(
                f"the weights lack {name}, which every {self.name} model has: config.json's model_type "
                f"{config.get('model_type')!r} does not describe them, or they are damaged"
            )
        if tuple(shapes[name]) != tuple(shape):
            raise ValueError(f"config.json does not match the weights: {name} is {_shape(shapes[name])} there, but {why} make it {_shape(shape)}")

    # ---- weight splitting: the projections as attnviz's layer takes them -------------------------

    def projections(self, model: Any, names: dict[str, str]) -> list[tuple[Any, Any]]:
        """(weight (out, in), bias or None) of w_q, w_k, w_v, w_o: nn.Linear modules by their names."""
        return [_linear(model.get_submodule(names[role])) for role in ROLES]

    def attention_weights(self, model: Any, config: dict, layer: int, stack: str | None) -> Any:
        """Layer `layer`'s projections and settings as attnviz's AttentionWeights, with the family's position scheme."""
        from attnviz.attention.layer import AttentionWeights

        module_name, names = self.layer_names(config, self.stored_index(config, layer, stack), stack)
        module = model.get_submodule(module_name)
        projections = self.projections(model, names)
        for role, (weight, bias) in zip(ROLES, projections):
            check_finite(weight, names[role] + ".weight")
            if bias is not None:
                check_finite(bias, names[role] + ".bias")
        heads = self.stack_size(config, "heads", stack)
        weights = AttentionWeights(
            *projections,
            num_heads=heads,
            num_kv_heads=self.size(config, "kv_heads") if self.rotary else heads,
            head_dim=projections[0][0].shape[0] // heads,
            names=names,
            scale=float(module.scaling),
            family=self.name,
        )
        self.add_position_scheme(weights, model, module, stack)
        return weights

    def add_position_scheme(self, weights: Any, model: Any, module: Any, stack: str | None) -> None:
        """What the family adds to the scores or to q and k by position (RoPE, T5's bias); learned positions: nothing."""

    def relative_bias(self, model: Any, stack: str | None, num_queries: int, num_keys: int, device: str) -> Any:
        """A bias (1, H, Nq, Nk) added to the scores by relative position (T5); None for other families."""
        return None


def _linear(module: Any) -> tuple[Any, Any]:
    return module.weight.detach(), None if module.bias is None else module.bias.detach()


def check_finite(tensor: Any, name: str) -> None:
    """An AttnvizError naming the tensor if it holds NaN or infinity (a finite sum, the usual case, means none): every
    weight a run reads is checked so, the projections here, a task head's tensors in weight_files.stored_tensors."""
    import torch

    from attnviz.errors import AttnvizError

    if not torch.isfinite(tensor.sum()):
        count = int((~torch.isfinite(tensor)).sum())
        if count:
            raise AttnvizError(f"the model's {name} holds {count} NaN or infinite value{'s' if count > 1 else ''}: its checkpoint is damaged")


def _shape(shape: tuple[int, ...]) -> str:
    return "(" + ", ".join(map(str, shape)) + ")"
