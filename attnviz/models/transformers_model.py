"""Every family but BERT, through transformers: its model gives each layer's input, attnviz's layer computes.

transformers' model (in --dtype's dtype, float32 by default on the CPU; eval mode; blocked_attention.py's
attention) runs the text; a hook on each attention module takes what enters it: the hidden state after the
family's own norms (pre-norm decoders normalise first: RMSNorm, LayerNorm), and for cross-attention the
encoder's output.
attnviz's own layer (attention/layer.py) then computes the weights from the module's
projections, which the family's adapter (families/) names and splits into AttentionWeights,
with its position scheme (RoPE's frequencies, T5's relative position bias). This module is the
same for every family: the model's class, module names and weights come from the adapter.
The forward pass up to the chosen layer runs an attention that never makes the (H, N, N) maps whole, at any
length and on any device (blocked_attention.py): attnviz's blocks of queries (eager's very operations) for a
text whose scores fit one block, under a padding mask or a position bias; SDPA's fused kernels for a longer text.

transformers is imported only here, on this path: `attnviz --help` and BERT runs never pay for it.
Only safetensors are loaded (use_safetensors=True), and nothing from the folder is run
(trust_remote_code is never set).
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any, Callable

import torch
from torch import nn

from attnviz.attention.layer import AttentionWeights
from attnviz.errors import AttnvizError
from attnviz.models import blocked_attention
from attnviz.models.capture import Capture, Captured, HookPoints, Wanted, capture, hook_layers
from attnviz.models.layer_runs import LayerStack, Recorded, differentiable_run, run_from
from attnviz.models.families import DECODER, ENCODER_DECODER, Family
from attnviz.models.shown import space_before
from attnviz.models.words import tokenizer_scheme


def load_transformers_model(
    folder: Path, family: Family, config: dict, device: str, dtype: torch.dtype = torch.float32, layer_at_a_time: bool = False
) -> "TransformersModel":
    """transformers' base model of the family from a checked folder (safetensors only), in eval mode on device, in dtype.

    The weights are read once, in dtype: a model in bfloat16 never holds a float32 copy. layer_at_a_time: each
    layer's weights read from the files as it runs and dropped after (models/layer_weights.py).

    Before anything is built, the family's adapter checks config.json's sizes against the
    safetensors headers; after, every weight the model has must have come from the files, and
    every tensor in them (but a task head's, and those the adapter says attnviz never reads)
    must have gone into the model: a config that names the wrong family never runs on random weights.
    """
    import transformers
    from transformers.utils import logging as hf_logging

    model_class = getattr(transformers, family.model_class)
    _check_headers(folder, family, config, model_class.base_model_prefix)
    if layer_at_a_time:
        from attnviz.models.layer_weights import safetensors_map

        return layered_model(family, config, folder, *safetensors_map(folder, model_class.base_model_prefix), device, dtype)
    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()  # e.g. "some weights were not used": a task head attnviz does not need
    hf_logging.disable_progress_bar()
    try:
        model, info = model_class.from_pretrained(
            folder,
            use_safetensors=True,
            attn_implementation="eager",
            dtype=dtype,
            local_files_only=True,
            ignore_mismatched_sizes=True,  # reported in info, refused below with attnviz's message
            output_loading_info=True,
        )
    finally:
        hf_logging.set_verbosity(verbosity)
    _check_loading_info(family, info, model)
    return TransformersModel(family, config, model.to(device).eval(), folder)


def layered_model(
    family: Family, config: dict, folder: Path | None, weights_map, shapes: dict, mapped, device: str, dtype: torch.dtype
) -> "TransformersModel":
    """The family's base model run a layer's weights at a time (models/layer_weights.py) from weights_map: any Mapping
    of the base model's parameter names to tensors read on access (the safetensors files' through safetensors_map; a
    GGUF file's, dequantised on access, plugs in the same way), shapes each tensor's shape by the same names (read
    without the data), mapped(name) a tensor as stored and memory-mapped or None (the embeddings read by rows; None
    for all: read from weights_map once). Missing, unused or mis-shaped tensors are refused as a whole load's are."""
    import transformers

    from attnviz.models import layer_weights

    model_class = getattr(transformers, family.model_class)
    handle = TransformersModel(family, config, layer_weights.build_empty(model_class, config, dtype), folder)
    info = layer_weights.load_layer_at_a_time(handle.model, handle.layer_names(), weights_map, shapes, device, mapped)
    _check_loading_info(family, info, handle.model)
    for mlp in handle.mlps():  # a long text's MLP intermediates by chunks of positions (Llama-3.2-1B's: 3 x 256 MB at 8,192)
        layer_weights.run_by_positions(mlp)
    handle.weights_map, handle.weights_device, handle.mapped = weights_map, device, mapped
    return handle


def _check_headers(folder: Path, family: Family, config: dict, prefix: str) -> None:
    """The adapter's sizes against the safetensors headers (names and shapes: no tensor is read)."""
    from attnviz.models.weight_files import safetensors_shapes, weight_files

    shapes: dict[str, tuple[int, ...]] = {}
    for path in weight_files(folder, safetensors=True, allow_pickle=False):
        shapes.update(safetensors_shapes(path))
    # saved from a model with a task head (LlamaForCausalLM): the base model's tensors under its prefix, the head's beside
    if any(name.startswith(prefix + ".") for name in shapes):
        shapes = {name.removeprefix(prefix + "."): shape for name, shape in shapes.items() if name.startswith(prefix + ".")}
    family.check_weights(config, shapes)


def _check_loading_info(family: Family, info: dict, model: nn.Module) -> None:
    """A ValueError when weights were missing (left random), unused, or of another shape: naming how many and a few.

    Unused tensors outside the base model's modules are a task head's (lm_head, final_logits_bias,
    a classifier): attnviz does not need them. Those the adapter names unused (a pooler) may be
    absent or extra.
    """
    prefix = model.base_model_prefix + "."
    modules = {name for name, _ in model.named_children()}
    unused = lambda name: any(part in name for part in family.unused_weights)  # noqa: E731
    in_model = lambda name: name.removeprefix(prefix).split(".")[0] in modules  # noqa: E731
    problems = [
        ("missing from the weights (they would be random)", [name for name in info["missing_keys"] if not unused(name)]),
        ("in the weights but not in the model", [name for name in info["unexpected_keys"] if in_model(name) and not unused(name)]),
        ("of another shape than the model's", [str(entry[0]) if isinstance(entry, tuple) else str(entry) for entry in info["mismatched_keys"]]),
    ]
    for what, names in problems:
        if names:
            few = ", ".join(sorted(names)[:3]) + (", ..." if len(names) > 3 else "")
            raise ValueError(
                f"{len(names)} tensor{'s' if len(names) > 1 else ''} {what} ({few}): config.json does not describe "
                f"these weights as a {family.name} model"
            )
    if info.get("error_msgs"):
        raise ValueError(f"the weights could not be loaded: {info['error_msgs'][0]}")


class TransformersModel:
    """A transformers model of a supported family, and what attnviz's layer needs from it (through the family's adapter).

    stack is None for encoders and decoders; for an encoder-decoder, "encoder", "decoder" (the
    decoder's self-attention) or "cross" (the decoder's attention over the encoder's output).
    A handle may be used from several threads: capture's hooks run one forward pass at a time.
    """

    def __init__(self, family: Family, config: dict, model: nn.Module, folder: Path | None = None):
        self.family = family
        self.config = config
        self.model = model
        self.folder = folder  # the checkpoint's: a task head's tensors (output_head) are read from it
        self.model_type = config["model_type"]
        # read a layer at a time (models/layer_weights.py): the weights by name, read on access, and their device
        self.weights_map, self.weights_device = None, None
        # name -> a tensor as stored (the safetensors files' memory-mapped: layer_weights.safetensors_map; a GGUF file's
        # dequantised: gguf_weights.stored_tensor) or None: a task head's tensors read from it, not from folder
        self.mapped = None
        self._forward_lock = threading.Lock()

    # ---- sizes -----------------------------------------------------------------------------

    def num_layers(self, stack: str | None = None) -> int:
        return self.family.stack_size(self.config, "layers", stack)

    def num_heads(self, stack: str | None = None) -> int:
        return self.family.stack_size(self.config, "heads", stack)

    # ---- the attention modules and their projections ---------------------------------------

    def get_submodule(self, name: str) -> nn.Module:
        """The base model's module of that name (as attnviz's BertEncoder, an nn.Module, answers it)."""
        return self.model.get_submodule(name)

    def get_input_embeddings(self) -> nn.Embedding:
        """The base model's word embeddings (as attnviz's BertEncoder answers it)."""
        return self.model.get_input_embeddings()

    def attention_module(self, layer: int, stack: str | None = None) -> tuple[str, nn.Module]:
        """The module (and its name in the model) whose input is layer `layer`'s attention input."""
        index = self.family.stored_index(self.config, layer, stack)
        name = self.family.layer_names(self.config, index, stack)[0]
        return name, self.model.get_submodule(name)

    def attention_weights(self, layer: int, stack: str | None = None) -> AttentionWeights:
        """Layer `layer`'s projections and settings, as attnviz's layer takes them (the family's adapter splits them)."""
        name, names = self.family.layer_names(self.config, self.family.stored_index(self.config, layer, stack), stack)
        with self.resident(name, *names.values()):  # W_o may lie outside the attention module (BERT's)
            return self.family.attention_weights(self.model, self.config, layer, stack)

    @property
    def layer_at_a_time(self) -> bool:
        """Whether each layer's weights are read from the checkpoint's files as it runs (models/layer_weights.py)."""
        return self.weights_map is not None

    def resident(self, *names: str):
        """A context within which the weights of the base model's modules of those names are on the device, for what
        reads them outside their layer's forward (read a layer at a time: layer_weights.resident; else nothing to do)."""
        from attnviz.models.layer_weights import resident

        return resident(self.model, names, self.weights_map, self.weights_device)

    def _letting_go(self):
        """Around a pass that may stop inside a layer: its weights let go after, where read a layer at a time."""
        from attnviz.models.layer_weights import let_go_after

        return let_go_after([self.model.get_submodule(name) for name in self.layer_names()] if self.layer_at_a_time else [])

    def layer_name(self, layer: int, stack: str | None = None) -> str:
        """The name of the module of the stack's layer `layer` (Llama's layers.{i}, T5's encoder.block.{i}): the
        first list on the way down to its attention module."""
        parts = self.attention_module(layer, stack)[0].split(".")
        listed = next(index for index, part in enumerate(parts) if part.isdigit())
        return ".".join(parts[: listed + 1])

    def layer_names(self) -> list[str]:
        """Every stack's layer modules' names, each once (ALBERT's layers share one)."""
        stacks = [stack for stack in self.family.stacks if stack != "cross"]  # the decoder's layers hold its cross-attention
        return list(dict.fromkeys(self.layer_name(layer, stack) for stack in stacks for layer in range(self.num_layers(stack))))

    def position_bias(self, stack: str | None, num_queries: int, num_keys: int, device: str) -> torch.Tensor | None:
        """T5's relative position bias (1, H, Nq, Nk); None for families without one."""
        with self.resident(self.attention_module(0, stack)[0]):  # the first layer's table (T5's)
            return self.family.relative_bias(self.model, stack, num_queries, num_keys, device)

    # ---- layer inputs ------------------------------------------------------------------------

    @torch.inference_mode()
    def capture(
        self,
        inputs: dict[str, torch.Tensor],
        layers: list[int],
        stack: str | None = None,
        source: dict[str, torch.Tensor] | None = None,
        entered=lambda done: None,
    ) -> dict[int, Captured]:
        """What enters the attention of each of `layers`, from one forward pass stopped after the last of them.

        inputs are the padded batch's input_ids and attention_mask (for an encoder-decoder's
        decoder or cross stack, the decoder's); source the encoder's, for those stacks.
        entered(1) as each of layers is reached.
        """
        return self.capture_pass(inputs, Wanted(frozenset(layers)), stack, source, entered).x

    @torch.inference_mode()
    def capture_pass(
        self,
        inputs: dict[str, torch.Tensor],
        wanted: Wanted,
        stack: str | None = None,
        source: dict[str, torch.Tensor] | None = None,
        entered=lambda done: None,
    ) -> Capture:
        """One forward pass over inputs (source as for capture) with what `wanted` names of the stack captured
        (models/capture.py); stopped after the last layer asked for when wanted is x alone. A pass that runs whole
        runs the whole model (an encoder-decoder's encoder and decoder) and its Capture.last_hidden is the model's
        last hidden state (B, N, D) after its final norm, the decoder's for an encoder-decoder. The hooks sit on
        modules the threads share: one pass at a time."""
        points = self.hook_points(stack)
        with self._forward_lock, self._letting_go():
            # blocks of queries, never a whole (B, H, N, N) of scores: run_from's batches of copies at any length
            self.model.set_attn_implementation(blocked_attention.register())
            if not wanted.whole_pass:
                return capture(points, lambda: self._forward(inputs, stack, source), wanted, entered)
            if self.family.kind == ENCODER_DECODER:
                seq2seq = dict(input_ids=source["input_ids"], attention_mask=source["attention_mask"],
                               decoder_input_ids=inputs["input_ids"], decoder_attention_mask=inputs["attention_mask"])  # fmt: skip
                forward = lambda: self.model(**seq2seq, use_cache=False).last_hidden_state  # noqa: E731
            else:
                forward = lambda: self._forward(inputs, stack, source)  # noqa: E731
            return capture(points, forward, wanted, entered)

    @torch.inference_mode()
    def stacks_pass(self, inputs: dict[str, torch.Tensor], source: dict[str, torch.Tensor], wanted: dict[str, Wanted]) -> dict[str, Capture]:
        """One whole pass of an encoder-decoder (inputs: the decoder's, source: the encoder's) with what `wanted` names
        of each of its stacks ("encoder", "decoder", "cross") captured: each stack's hooks installed around the next's
        (capture's forward is any call), the model's forward innermost. Returns each stack's Capture."""
        seq2seq = dict(input_ids=source["input_ids"], attention_mask=source["attention_mask"],
                       decoder_input_ids=inputs["input_ids"], decoder_attention_mask=inputs["attention_mask"])  # fmt: skip
        captured: dict[str, Capture] = {}

        def nested(stacks: list[str]):
            if not stacks:
                return self.model(**seq2seq, use_cache=False).last_hidden_state
            stack, *rest = stacks
            captured[stack] = capture(self.hook_points(stack), lambda: nested(rest), wanted[stack])

        with self._forward_lock:
            self.model.set_attn_implementation(blocked_attention.register())
            nested(list(wanted))
        return captured

    @torch.inference_mode()
    def in_place_pass(
        self, inputs: dict[str, torch.Tensor], attend: Callable[[int, torch.Tensor], torch.Tensor], keep: frozenset[int] = frozenset(),
        whole: bool = True, entered=lambda done: None, parts: bool = False,
    ) -> Capture:
        """One forward pass of a decoder's or an encoder's one stack over inputs with attnviz's layer in the place of
        every layer's attention: attend(layer, x) gives the heads' outputs (B, N, H, d) over what entered that layer's
        attention module, x (B, N, D), and the module's own W_o and the rest of the model go on from them (its own
        query, key and value projections run, unread: the attention function is what transformers lets be replaced).
        Returns the Capture of what entered each layer of keep (entered(1) as each is reached); whole=False stops the
        pass there, before the last of keep attends. parts: the capture also holds the residual stream's parts (each
        layer's call, z_merged, MLP output, the embeddings' norm's input), and the pass runs whole."""
        points = self.hook_points()
        entering: list[tuple[int, torch.Tensor]] = []

        def enter(layer: int, args: tuple, kwargs: dict) -> None:
            entering[:] = [(layer, args[0] if args else kwargs["hidden_states"])]

        called: set[int] = set()

        def in_place() -> torch.Tensor:
            layer, hidden = entering.pop()  # each attention module calls its function once
            called.add(layer)
            return attend(layer, hidden)

        with self._forward_lock, self._letting_go():
            self.model.set_attn_implementation(blocked_attention.register())
            handles = hook_layers(points.attention, enter)
            try:
                wanted = Wanted(keep, whole=whole, calls=parts, z_merged=parts, mlp=parts, embedded=parts)
                captured = capture(points, lambda: self._forward(inputs, None, None, attnviz_in_place=in_place), wanted, entered)
            finally:
                for handle in handles:
                    handle.remove()
        attended = len(points.attention) if whole or parts else max(keep)
        if called != set(range(attended)):
            raise RuntimeError(f"{attended - len(called)} layers' attention did not call transformers' attention function")
        return captured

    def mlps(self) -> list[nn.Module]:
        """Every stack's MLP modules (the family's mlp_name), each once."""
        stacks = [stack for stack in self.family.stacks if stack != "cross"]
        names = {self.family.mlp_name(self.config, self.family.stored_index(self.config, layer, stack), stack): None
                 for stack in stacks for layer in range(self.num_layers(stack))}  # fmt: skip
        return [self.model.get_submodule(name) for name in names]

    def hook_points(self, stack: str | None = None) -> HookPoints:
        """The stack's modules by role (models/capture.py): layer_stack's, each layer's attention module (x), and
        its W_q, W_k, W_v as the family's adapter names them (one module for all three: GPT-2's c_attn), and its MLP."""
        attention, projections, mlps = [], {"q": [], "k": [], "v": []}, []
        for layer in range(self.num_layers(stack)):
            index = self.family.stored_index(self.config, layer, stack)
            name, names = self.family.layer_names(self.config, index, stack)
            attention.append(self.model.get_submodule(name))
            for role, modules in projections.items():
                modules.append(self.model.get_submodule(names["w_" + role]))
            mlps.append(self.model.get_submodule(self.family.mlp_name(self.config, index, stack)))
        post_norm = stack is None and self.family.post_norm_names(0) is not None  # an encoder's embeddings' LayerNorm
        name = "embeddings.LayerNorm" if post_norm else self.family.embedding_norm_name(stack)
        embedding_norm = None
        if name is not None and any(each == name for each, _ in self.model.named_modules()):  # Marian's sides have none
            embedding_norm = self.model.get_submodule(name)
        return HookPoints(self.layer_stack(stack), attention, projections, mlps, cross=stack == "cross", embedding_norm=embedding_norm)

    # ---- the layers one by one: the model's output with a head taken out (analysis/effect.py) -----------------

    def layer_stack(self, stack: str | None = None) -> LayerStack:
        """The stack's layers (the modules its attention sits in: Llama's layers.{i}, T5's block.{i}), their output
        projections W_o, and its final norm."""
        layers, projections = [], []
        for layer in range(self.num_layers(stack)):
            layers.append(self.model.get_submodule(self.layer_name(layer, stack)))
            index = self.family.stored_index(self.config, layer, stack)
            projections.append(self.model.get_submodule(self.family.layer_names(self.config, index, stack)[1]["w_o"]))
        final = self.family.final_norm_name(stack)
        return LayerStack(layers, projections, None if final is None else self.model.get_submodule(final))

    @torch.inference_mode()
    def layer_calls(
        self, inputs: dict[str, torch.Tensor], stack: str | None = None, source: dict[str, torch.Tensor] | None = None
    ) -> tuple[Recorded, torch.Tensor]:
        """One forward pass of the whole model over inputs (an encoder-decoder's decoder's, source its encoder's):
        the stack's calls and z_merged (capture_pass), and the model's last hidden state (B, N, D) after its final
        norm, the decoder's for an encoder-decoder."""
        captured = self.capture_pass(inputs, Wanted(calls=True, z_merged=True), stack, source)
        return self.recorded(captured, inputs, stack, source), captured.last_hidden

    def recorded(
        self, captured: Capture, inputs: dict[str, torch.Tensor], stack: str | None = None, source: dict[str, torch.Tensor] | None = None
    ) -> Recorded:
        """A whole pass's calls and z_merged as run_from replays them. For an encoder-decoder's encoder stack, what the
        stack's output becomes is the decoder's pass over it (Recorded.rest)."""
        if self.family.kind == ENCODER_DECODER and stack == "encoder":
            return captured.recorded(lambda encoded: self._decode(inputs, source, encoded))
        return captured.recorded()

    def _decode(self, inputs: dict[str, torch.Tensor], source: dict[str, torch.Tensor], encoded: torch.Tensor) -> torch.Tensor:
        """The decoder's last hidden state (B, N, D) over inputs (batch 1, broadcast to B), reading encoded (B, Ns, D)."""
        batch = encoded.shape[0]
        return self.model.get_decoder()(
            input_ids=inputs["input_ids"].expand(batch, -1),
            attention_mask=inputs["attention_mask"].expand(batch, -1),
            encoder_hidden_states=encoded,
            encoder_attention_mask=source["attention_mask"].expand(batch, -1),
            use_cache=False,
        ).last_hidden_state

    @torch.inference_mode()
    def run_from(
        self, layer: int, hidden: torch.Tensor, recorded: Recorded, heads=None, stack: str | None = None, output=None
    ) -> torch.Tensor:
        """The model's last hidden state (B, N, D) when hidden (B, N, D) enters the stack's layer `layer`, heads(x)
        changing what enters its W_o, output what one of its projections gives (layer_runs.run_from)."""
        with self._forward_lock:  # hooks on modules the threads share
            return run_from(self.layer_stack(stack), layer, hidden, recorded, heads, output)

    def differentiable_run(self, hidden: torch.Tensor, recorded: Recorded, stack: str | None = None, hooks=lambda: []) -> torch.Tensor:
        """layer_runs.differentiable_run over the stack (analysis/edges.py differentiates the metric), with the capture
        pass's attention (blocked_attention: its mask None is causal, as the recorded calls of one text leave it); hooks()
        installs the caller's hooks once the lock is held and returns their handles, removed after."""
        with self._forward_lock:
            self.model.set_attn_implementation(blocked_attention.register())
            return differentiable_run(self.layer_stack(stack), hidden, recorded, hooks)

    @torch.inference_mode()
    def decode(self, ids: torch.Tensor, steps: int, choose):
        """A decoder continuing ids (1, P) with transformers' key/value cache: yields, for each forward pass, the ids
        it read (1, n) and what entered each layer's attention module (1, n, D) (after the layer's norm), then
        choose(logits (V,) of the last position) -> the next id. The prompt first, then each chosen token, steps
        + 1 passes at most: the last chosen token is read too (for its attention), its successor never chosen; a
        token that ends a text (end_ids) ends the generation, as transformers' generate stops there."""
        from transformers import DynamicCache

        from attnviz.models.layer_weights import unembed

        entering: dict[int, torch.Tensor] = {}

        def keep(layer: int, args: tuple, kwargs: dict[str, Any]) -> None:
            entering[layer] = (args[0] if args else kwargs["hidden_states"]).detach().clone()

        modules = [self.attention_module(layer)[1] for layer in range(self.num_layers())]
        weight, bias, ends = *self.output_head(), self.end_ids()
        with self._forward_lock:
            self.model.set_attn_implementation("sdpa")  # the model's own pass: fused, no (H, P, P) of scores at once
            handles = hook_layers(modules, keep)
            try:
                cache, current = DynamicCache(config=self.model.config), ids
                for step in range(steps + 1):
                    entering.clear()
                    last = self.model(input_ids=current, cache=cache, use_cache=True).last_hidden_state[0, -1]  # (D,)
                    yield current, [entering[layer] for layer in range(self.num_layers())]
                    if step == steps or (step and int(current[0, -1]) in ends):
                        break
                    current = ids.new_tensor([[choose(unembed(last, weight, bias))]])
            finally:
                for handle in handles:
                    handle.remove()

    def end_ids(self) -> set[int]:
        """The ids that end a generated text: generation_config.json's eos_token_id where the checkpoint has one (as
        transformers' generate reads it), else config.json's."""
        path = self.folder / "generation_config.json" if self.folder is not None else None
        settings = json.loads(path.read_text(encoding="utf-8")) if path is not None and path.is_file() else self.config
        value = settings.get("eos_token_id")
        return {int(each) for each in (value if isinstance(value, list) else [value]) if isinstance(each, int)}

    def output_head(self) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The language-model head, weight (V, D) and bias (V,) or None, as the family's *ForCausalLM or
        *ForConditionalGeneration class makes its logits from the last hidden state: the input embeddings where
        the config ties them (SmolLM2, GPT-2, T5, BART), else the checkpoint's lm_head (the base model leaves it
        out); BART's final_logits_bias added; T5's hidden state scaled by d_model^-0.5 first (scale_decoder_outputs),
        here folded into the weight."""
        from attnviz.models.weight_files import stored_tensors

        from attnviz.models.families.family import check_finite

        embeddings = self.get_input_embeddings().weight
        names = ("lm_head.weight", "lm_head.bias", "final_logits_bias")
        if self.mapped is not None:  # as stored (unembed casts it a chunk at a time)
            stored = {name: tensor if name == names[0] else tensor.float() for name in names if (tensor := self.mapped(name)) is not None}
            for name, tensor in stored.items():
                check_finite(tensor, name)
        else:
            stored = stored_tensors(self.folder, names, embeddings)
        if getattr(self.model.config, "tie_word_embeddings", False):
            weight, bias = embeddings, None
        elif "lm_head.weight" in stored:
            weight, bias = stored["lm_head.weight"], stored.get("lm_head.bias")
        else:
            raise AttnvizError(f"{self.folder or 'the model'} holds no language-model head (lm_head.weight) and does not tie it to the embeddings")
        if "final_logits_bias" in stored:  # (1, V)
            bias = stored["final_logits_bias"][0] + (0 if bias is None else bias)
        if getattr(self.model.config, "scale_decoder_outputs", False):
            weight = weight * self.family.size(self.config, "hidden") ** -0.5
        return weight, bias

    def _forward(self, inputs: dict[str, torch.Tensor], stack: str | None, source: dict[str, torch.Tensor] | None, **passed):
        """The model's forward pass over inputs' ids and mask alone (an encoding's token_type_ids would be added to GPT-2's
        stream as wte(token_type_ids)); source: the encoder's, for an encoder-decoder's decoder and cross stacks; passed:
        keywords the forward hands down to the attention function (blocked_attention's), an encoder's or a decoder's
        alone. Returns a decoder's or an encoder's last hidden state (B, N, D); None for an encoder-decoder's stack."""
        kwargs = {"input_ids": inputs["input_ids"], "attention_mask": inputs["attention_mask"], "use_cache": False, **passed}
        if self.family.kind != ENCODER_DECODER:
            if self.family.kind != DECODER:
                kwargs.pop("use_cache")
            return self.model(**kwargs).last_hidden_state
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
        self.mask_token, self.mask_token_id = tokenizer.mask_token, tokenizer.mask_token_id  # an encoder's, else None
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
        return self._as_read(self._raw_ids(texts))

    def encode_with_spaces(self, texts: list[str]) -> tuple[list[list[int]], list[list[bool]] | None]:
        """encode_batch's ids, and whether whitespace precedes each of their tokens, from one call of the tokenizer:
        a fast tokenizer's offsets of the same encoding; None for a slow one (it has no offsets)."""
        if not self._tokenizer.is_fast:
            return self.encode_batch(texts), None
        encoded = self._tokenizer(texts, add_special_tokens=True, return_offsets_mapping=True)
        spaces = [space_before(text, row) for text, row in zip(texts, encoded["offset_mapping"])]
        if self.start_token_id is not None:  # the decoder's view: shifted right behind its start token
            spaces = [[False, *row[:-1]] for row in spaces]
        return self._as_read([list(ids) for ids in encoded["input_ids"]]), spaces

    def _as_read(self, ids: list[list[int]]) -> list[list[int]]:
        """ids as the model reads them: shifted for a decoder's view (start_token_id), each row checked against the embedding table."""
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

    def pieces(self, text: str) -> list[int]:
        """The ids of a piece of text alone, no special token around it (an answer token: analysis/patching.py)."""
        return list(self._tokenizer(text, add_special_tokens=False)["input_ids"])

    def decode(self, ids: list[int]) -> str:
        """The text of ids (a continuation: generate), special tokens kept as they are."""
        return self._tokenizer.decode(ids)

    def chat_prompt(self, text: str) -> str | None:
        """text as the user's turn of the checkpoint's chat template, the assistant's turn opened after it (an
        instruct model's prompt); None where the checkpoint has no chat template."""
        if not getattr(self._tokenizer, "chat_template", None):
            return None
        return self._tokenizer.apply_chat_template([{"role": "user", "content": text}], tokenize=False, add_generation_prompt=True)


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
