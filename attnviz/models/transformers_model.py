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

transformers is imported only here and in the modules beside it (transformers_loading.py builds the model,
transformers_tokenizer.py reads its tokenizer): `attnviz --help` and BERT runs never pay for it.
"""

from __future__ import annotations

import json
import threading
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
        # of those, the layers read once and kept on weights_device or held on another GPU: layer name -> device
        self.layer_places: dict[str, str] = {}
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

    def norms_resident(self):
        """resident for every norm module of the base model (small: what reads the norms after a pass)."""
        return self.resident(*(name for name, module in self.model.named_modules() if "norm" in type(module).__name__.lower()))

    def _letting_go(self):
        """Around a pass that may stop inside a layer: its weights let go after, where read a layer at a time."""
        from attnviz.models.layer_weights import let_go_after

        streamed = [name for name in self.layer_names() if self.layer_places.get(name) != self.weights_device] if self.layer_at_a_time else []
        return let_go_after([self.model.get_submodule(name) for name in streamed])

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
        attention module, x (B, N, D), and the module's own W_o and the rest of the model go on from them. Where the
        family's attention module is one (Family.attention_is_one_module: Llama's), attnviz's layer and the module's
        W_o run in that module's place (its forward replaced on the instance for the pass: the model's own q, k, v
        never computed); elsewhere in the attention function's (what transformers lets be replaced), the module's
        own q, k and v computed, unread.
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

        def in_modules_place(w_o: nn.Module):
            def forward(*args, **kwargs) -> tuple[torch.Tensor, None]:  # as the module's own: (output, weights)
                return w_o(in_place().flatten(2)), None  # the heads' outputs (B, N, H, d) merged, then W_o: (B, N, D)

            return forward

        replaced = points.attention if self.family.attention_is_one_module else []
        own = [vars(module).get("forward") for module in replaced]  # a forward set on the instance already (a hook's)
        with self._forward_lock, self._letting_go():
            self.model.set_attn_implementation(blocked_attention.register())
            handles = hook_layers(points.attention, enter)
            for module, w_o in zip(replaced, points.stack.projections):
                module.forward = in_modules_place(w_o)
            try:
                wanted = Wanted(keep, whole=whole, calls=parts, z_merged=parts, mlp=parts, embedded=parts)
                captured = capture(points, lambda: self._forward(inputs, None, None, attnviz_in_place=in_place), wanted, entered)
            finally:
                for handle in handles:
                    handle.remove()
                for module, forward in zip(replaced, own):
                    if forward is None:
                        del module.forward  # its class's again
                    else:
                        module.forward = forward
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
            return differentiable_run(self.layer_stack(stack), hidden, recorded, hooks, recomputed=self.layer_at_a_time)

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
        from attnviz.models.layer_weights import vocabulary_chunks

        embeddings = self.get_input_embeddings().weight
        names = ("lm_head.weight", "lm_head.bias", "final_logits_bias")
        if self.mapped is not None:  # as stored (unembed casts it a chunk at a time)
            stored = {name: tensor if name == names[0] else tensor.float() for name in names if (tensor := self.mapped(name)) is not None}
            for name, tensor in stored.items():  # a chunk of the vocabulary at a time: the table is never resident whole
                for rows in vocabulary_chunks(tensor):
                    check_finite(tensor[rows], name)
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
