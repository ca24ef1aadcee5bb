"""A small BERT encoder for Hugging Face BERT checkpoints (config.json + safetensors).

It exists for speed: importing transformers' modeling code takes seconds, longer than
everything else `attnviz heads` does. The modules carry the names of transformers' BertModel
(embeddings.word_embeddings, encoder.layer[i].attention.self.query, ...), so a checkpoint's
tensors load by name (weight_files.py checks and reads them), and the tests check that its
hidden states equal transformers' own.

Its attention only feeds the next layer; the weights attnviz shows come from attnviz's own
layer (attention/layer.py), built from the same projections (check_attention_weights first).

NaN or infinity in the weights is an AttnvizError naming the tensor, found where a run uses
them: the embeddings and every layer's output are tested as they are computed (one cheap
test each), where scanning every weight on every load would cost more than the load itself,
and weights a run never touches cannot make its numbers wrong.
"""

from __future__ import annotations

import contextlib
import math
import reprlib
from dataclasses import dataclass, fields

import torch
import torch.nn.functional as F
from torch import nn

from attnviz.attention.layer import AttentionWeights, merge_heads, split_heads
from attnviz.errors import AttnvizError
from attnviz.models.capture import Capture, Captured, HookPoints, Wanted, capture
from attnviz.models.layer_runs import LayerStack, Recorded, differentiable_run, run_from

ACTIVATIONS = {
    "gelu": F.gelu,
    "gelu_new": lambda x: F.gelu(x, approximate="tanh"),
    "gelu_pytorch_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "relu": F.relu,
}


@dataclass
class BertConfig:
    """The fields of a BERT config.json that the encoder needs, with BertConfig's defaults."""

    vocab_size: int = 30522
    hidden_size: int = 768
    num_hidden_layers: int = 12
    num_attention_heads: int = 12
    intermediate_size: int = 3072
    hidden_act: str = "gelu"
    max_position_embeddings: int = 512
    type_vocab_size: int = 2
    layer_norm_eps: float = 1e-12
    position_embedding_type: str = "absolute"

    @classmethod
    def from_dict(cls, values: dict) -> BertConfig:
        """The config from config.json's values (BertConfig's defaults for the ones it omits), checked.

        Raises ValueError, naming the field, for a value of the wrong type, a size below 1, or a
        variant this encoder cannot run.
        """
        config = cls(**{field.name: values[field.name] for field in fields(cls) if field.name in values})
        config._check()
        return config

    def _check(self) -> None:
        for field in fields(self):
            value = getattr(self, field.name)
            wanted, words = CONFIG_TYPES[field.type]
            if isinstance(value, bool) or not isinstance(value, wanted):
                raise ValueError(f"config.json: {field.name} must be {words}, not {reprlib.repr(value)}")
            if field.type == "int" and value < 1:
                raise ValueError(f"config.json: {field.name} must be at least 1, not {value}")
        if not (math.isfinite(self.layer_norm_eps) and self.layer_norm_eps >= 0):
            raise ValueError(f"config.json: layer_norm_eps must be a finite number, at least 0, not {self.layer_norm_eps}")
        if self.hidden_size % self.num_attention_heads:
            raise ValueError(
                f"config.json: num_attention_heads {self.num_attention_heads} does not divide hidden_size {self.hidden_size}"
            )
        if self.position_embedding_type != "absolute" or self.hidden_act not in ACTIVATIONS:
            raise ValueError(
                f"unsupported BERT variant: position embeddings {self.position_embedding_type!r}, "
                f"activation {self.hidden_act!r}"
            )


# The type of each BertConfig field as config.json must give it, and how to say it in an error.
CONFIG_TYPES = {
    "int": (int, "a positive whole number"),
    "float": ((int, float), "a number"),
    "str": (str, "a string"),
}


class BertEmbeddings(nn.Module):
    def __init__(self, config: BertConfig):
        super().__init__()
        self.word_embeddings = _table(config.vocab_size, config.hidden_size)
        self.position_embeddings = _table(config.max_position_embeddings, config.hidden_size)
        self.token_type_embeddings = _table(config.type_vocab_size, config.hidden_size)
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)

    def forward(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor, positions: bool = True) -> torch.Tensor:
        """LayerNorm(word + token type [+ position]) embeddings (B, N, D).

        With positions=False the position embeddings are left out: attention over the result
        cannot tell word order, which is what `attnviz position` shows.
        """
        x = self.word_embeddings(input_ids) + self.token_type_embeddings(token_type_ids)  # (B, N, D)
        if positions:
            x = x + self.position_embeddings(torch.arange(input_ids.shape[1], device=input_ids.device))  # (N, D) broadcast
        return require_finite(self.LayerNorm(x), self, "embeddings.", "the embeddings")  # (B, N, D)


def _table(rows: int, size: int) -> nn.Embedding:
    """An embedding table left as it is allocated: load_bert fills it from the checkpoint.

    (nn.Embedding's own random initialisation, on the meta device, imports seconds of torch.)
    """
    return nn.Embedding(rows, size, _weight=torch.empty(rows, size))


def _dense_and_norm(config: BertConfig, size_in: int) -> nn.Module:
    block = nn.Module()
    block.dense = nn.Linear(size_in, config.hidden_size)
    block.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
    return block


class BertLayer(nn.Module):
    """Self-attention, then a feed-forward block, each with a residual and LayerNorm (post-norm)."""

    def __init__(self, config: BertConfig, index: int = 0):
        super().__init__()
        size = config.hidden_size
        self.index = index  # encoder.layer[index]: for messages
        self.num_heads = config.num_attention_heads
        self.activation = ACTIVATIONS[config.hidden_act]
        self.attention = nn.Module()
        self.attention.self = nn.Module()
        self.attention.self.query = nn.Linear(size, size)
        self.attention.self.key = nn.Linear(size, size)
        self.attention.self.value = nn.Linear(size, size)
        self.attention.output = _dense_and_norm(config, size)
        self.intermediate = nn.Module()
        self.intermediate.dense = nn.Linear(size, config.intermediate_size)
        self.output = _dense_and_norm(config, config.intermediate_size)

    def forward(self, x: torch.Tensor, allowed: torch.Tensor) -> torch.Tensor:
        return self.finish(x, self.attend(x, allowed))

    def attend(self, x: torch.Tensor, allowed: torch.Tensor) -> torch.Tensor:
        """Multi-head self-attention's output (B, N, D), projected by attention.output.dense."""
        projections = self.attention.self
        q = split_heads(projections.query(x), self.num_heads)  # (B, H, N, d)
        k = split_heads(projections.key(x), self.num_heads)  # (B, H, N, d)
        v = split_heads(projections.value(x), self.num_heads)  # (B, H, N, d)
        z = F.scaled_dot_product_attention(q, k, v, attn_mask=allowed)  # (B, H, N, d)
        return self.attention.output.dense(merge_heads(z))  # (B, N, D)

    def finish(self, x: torch.Tensor, attended: torch.Tensor) -> torch.Tensor:
        """The rest of the layer after attention: residual and LayerNorm, feed-forward, residual and LayerNorm."""
        x = self.attention.output.LayerNorm(x + attended)  # (B, N, D)
        hidden = self.activation(self.intermediate.dense(x))  # (B, N, 4D)
        output = self.output.LayerNorm(x + self.output.dense(hidden))  # (B, N, D)
        return require_finite(output, self, f"encoder.layer.{self.index}.", f"the output of layer {self.index}")

    def attention_weights(self) -> AttentionWeights:
        """The layer's W_q, W_k, W_v and W_o (checked for NaN and infinity first), for attnviz's layer."""
        self.check_attention_weights()
        projections = self.attention.self
        linears = (projections.query, projections.key, projections.value, self.attention.output.dense)
        prefix = f"encoder.layer.{self.index}.attention."
        return AttentionWeights(
            *((linear.weight, linear.bias) for linear in linears),
            num_heads=self.num_heads,
            num_kv_heads=self.num_heads,
            head_dim=linears[0].out_features // self.num_heads,
            names=dict(zip(("w_q", "w_k", "w_v", "w_o"), (prefix + name for name in ("self.query", "self.key", "self.value", "output.dense")))),
        )

    def check_attention_weights(self) -> None:
        """An AttnvizError naming the tensor, if the projections that attnviz's layer copies hold NaN or infinity."""
        prefix = f"encoder.layer.{self.index}.attention."
        check_parameters(self.attention.self, prefix + "self.")
        check_parameters(self.attention.output.dense, prefix + "output.dense.")


class BertEncoder(nn.Module):
    """BERT's embeddings and encoder layers. Its embedding tables start uninitialised: build it with weight_files.load_bert."""

    def __init__(self, config: BertConfig):
        super().__init__()
        self.config = config
        self.embeddings = BertEmbeddings(config)
        self.encoder = nn.Module()
        self.encoder.layer = nn.ModuleList(BertLayer(config, index) for index in range(config.num_hidden_layers))

    def forward(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, token_type_ids: torch.Tensor, num_layers: int | None = None
    ) -> list[torch.Tensor]:
        """Hidden states [embeddings, after layer 0, ...], `num_layers` layers deep (default all): each (B, N, D)."""
        allowed = attention_mask.bool()[:, None, None, :]  # (B, 1, 1, N): padding keys masked
        states = [self.embeddings(input_ids, token_type_ids)]
        for layer in self.encoder.layer[: self.config.num_hidden_layers if num_layers is None else num_layers]:
            states.append(layer(states[-1], allowed))
        return states

    def get_input_embeddings(self) -> nn.Embedding:
        """The word embeddings (as transformers' models name them): the masked-LM head's W_U (models/masked_lm.py)."""
        return self.embeddings.word_embeddings

    # ---- the layers one by one: the output with a head taken out, or patched (analysis/effect.py, patching.py) ------
    # The interface of transformers_model.TransformersModel's, for an encoder's one stack (stack is None).

    def attention_weights(self, layer: int, stack: str | None = None) -> AttentionWeights:
        return self.encoder.layer[layer].attention_weights()

    def position_bias(self, stack: str | None, num_queries: int, num_keys: int, device: str) -> None:
        return None  # learned absolute positions, added to the embeddings

    def resident(self, *names: str):
        """Nothing to do: attnviz's BERT holds its weights whole (TransformersModel.resident reads a layer's)."""
        return contextlib.nullcontext()

    def norms_resident(self):
        return contextlib.nullcontext()

    @torch.inference_mode()
    def capture(
        self, inputs: dict[str, torch.Tensor], layers: list[int], stack: str | None = None, source=None, entered=lambda done: None
    ) -> dict[int, Captured]:
        """What enters each of `layers`' attention: the layer's input (post-norm: no norm before attention), from one
        pass stopped after the last of them; entered(1) as each is reached."""
        return self.capture_pass(inputs, Wanted(frozenset(layers)), entered=entered).x

    @torch.inference_mode()
    def capture_pass(self, inputs: dict[str, torch.Tensor], wanted: Wanted, stack: str | None = None, source=None, entered=lambda done: None) -> Capture:
        """One pass over inputs (Encoded.model_inputs) with what `wanted` names captured (models/capture.py); its
        last_hidden the last layer's output (B, N, D), when the pass runs whole."""
        return capture(self.hook_points(), lambda: self(**inputs)[-1], wanted, entered)

    def hook_points(self, stack: str | None = None) -> HookPoints:
        """The modules by role (models/capture.py): a layer's input is its attention's (x), its call's first argument."""
        layers = list(self.encoder.layer)
        projections = {role: [getattr(layer.attention.self, name) for layer in layers] for role, name in (("q", "query"), ("k", "key"), ("v", "value"))}
        return HookPoints(self.layer_stack(), layers, projections, [layer.output.dense for layer in layers], embedding_norm=self.embeddings.LayerNorm)

    def layer_stack(self, stack: str | None = None) -> LayerStack:
        """The layers, each one's W_o (attention.output.dense), no final norm (BERT's layers end with their own)."""
        return LayerStack(list(self.encoder.layer), [layer.attention.output.dense for layer in self.encoder.layer])

    @torch.inference_mode()
    def layer_calls(self, inputs: dict[str, torch.Tensor], stack: str | None = None, source=None) -> tuple[Recorded, torch.Tensor]:
        """One forward pass over inputs (Encoded.model_inputs): the layers' calls and z_merged, and the last hidden state."""
        captured = self.capture_pass(inputs, Wanted(calls=True, z_merged=True))
        return captured.recorded(), captured.last_hidden

    def recorded(self, captured: Capture, inputs=None, stack: str | None = None, source=None) -> Recorded:
        """A whole pass's calls and z_merged as run_from replays them."""
        return captured.recorded()

    @torch.inference_mode()
    def run_from(
        self, layer: int, hidden: torch.Tensor, recorded: Recorded, heads=None, stack: str | None = None, output=None
    ) -> torch.Tensor:
        """The last hidden state (B, N, D) when hidden (B, N, D) enters layer `layer` (layer_runs.run_from)."""
        return run_from(self.layer_stack(), layer, hidden, recorded, heads, output)

    def differentiable_run(self, hidden: torch.Tensor, recorded: Recorded, stack: str | None = None, hooks=lambda: []) -> torch.Tensor:
        """layer_runs.differentiable_run: hidden (B, N, D) entering layer 0, autograd on (analysis/edges.py)."""
        return differentiable_run(self.layer_stack(), hidden, recorded, hooks)


def require_finite(x: torch.Tensor, module: nn.Module, prefix: str, what: str) -> torch.Tensor:
    """x, the output of `module`; if it holds NaN or infinity, an AttnvizError naming the parameter at fault."""
    if not torch.isfinite(x).all():
        check_parameters(module, prefix)
        raise AttnvizError(f"NaN or infinity in {what}, though the weights that made it are finite: they overflow")
    return x


def check_parameters(module: nn.Module, prefix: str) -> None:
    """An AttnvizError naming the first tensor of `module` (its names start with prefix) that holds NaN or infinity."""
    from attnviz.models.families.family import check_finite

    for name, tensor in module.state_dict(prefix=prefix).items():
        if tensor.is_floating_point():
            check_finite(tensor, name)
