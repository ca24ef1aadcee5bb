"""The one capture (attnviz/models/capture.py): each role's tensor from one pass against transformers' own model,
run by transformers (eager attention, output_hidden_states) with hooks written out here; a pass that wants only x
stops after the last layer asked for."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import transformers

from attnviz.models.capture import Wanted
from helpers import record_numbers, written_decimals

TEXT = "The cat sat on the mat because it was tired."
EVERY_ROLE = dict(calls=True, z_merged=True, projections=frozenset("qkv"), final=True, mlp=True)


def reference_pass(model, inputs: dict, projection_names: list[str], final_name: str | None):
    """transformers' model run whole: its hidden states (the input of each layer, then the last hidden state), and
    what entered each layer's output projection and the final norm, by pre-hooks of this test's own."""
    entering, final = {}, []
    modules = [model.get_submodule(name) for name in projection_names]
    handles = [module.register_forward_pre_hook(lambda module, args, layer=layer: entering.setdefault(layer, args[0].clone()))
               for layer, module in enumerate(modules)]  # fmt: skip
    if final_name is not None:
        handles.append(model.get_submodule(final_name).register_forward_pre_hook(lambda module, args: final.append(args[0].clone())))
    try:
        with torch.inference_mode():
            output = model(**inputs, output_hidden_states=True)
    finally:
        for handle in handles:
            handle.remove()
    return output, [entering[layer] for layer in range(len(modules))], final[-1] if final else None


def test_every_role_of_a_decoders_pass_is_transformers_tensor(decoder_folder):
    """The tiny grouped-query Llama: x = input_layernorm(the layer's input), q/k/v = its projections of x (before
    RoPE), z_merged = o_proj's input, the calls' first argument = the layer's input, final_in = the norm's input."""
    import attnviz

    loaded = attnviz.load(str(decoder_folder), device="cpu").loaded
    reference = transformers.LlamaModel.from_pretrained(decoder_folder, attn_implementation="eager").eval()
    inputs = dict(transformers.AutoTokenizer.from_pretrained(decoder_folder)(TEXT, return_tensors="pt"))
    num_layers = reference.config.num_hidden_layers
    projections = [f"layers.{layer}.self_attn.o_proj" for layer in range(num_layers)]
    output, z_merged, final_in = reference_pass(reference, inputs, projections, "norm")
    hidden = output.hidden_states  # (1, N, D) each: embeddings, each layer's output, the last normed

    captured = loaded.model.capture_pass(inputs, Wanted(frozenset(range(num_layers)), **EVERY_ROLE))
    recorded = loaded.model.recorded(captured, inputs)
    close = dict(atol=1e-6, rtol=0)  # one block of queries: eager's very operations (test_blocked_capture.py)
    with torch.inference_mode():
        for layer in range(num_layers):
            block = reference.layers[layer]
            x = block.input_layernorm(hidden[layer])
            torch.testing.assert_close(recorded.entering(layer), hidden[layer], **close)
            torch.testing.assert_close(captured.x[layer].hidden, x, **close)
            assert captured.x[layer].kv_hidden is None
            for role in "qkv":
                torch.testing.assert_close(captured.projections[role][layer], getattr(block.self_attn, f"{role}_proj")(x), **close)
            torch.testing.assert_close(captured.z_merged[layer], z_merged[layer], **close)
            # pre-norm: the layer adds its attention's output (W_o of z_merged) and then its MLP's to the stream
            after = hidden[layer + 1] if layer + 1 < num_layers else final_in  # the last hidden state is normed
            added = hidden[layer] + block.self_attn.o_proj(z_merged[layer]) + captured.mlp[layer]
            torch.testing.assert_close(added, after, atol=1e-5, rtol=0)
    torch.testing.assert_close(captured.final_in, final_in, **close)
    torch.testing.assert_close(captured.last_hidden, output.last_hidden_state, **close)


def test_a_pass_that_wants_x_alone_stops_after_the_last_layer_asked_for(decoder_folder):
    import attnviz

    loaded = attnviz.load(str(decoder_folder), device="cpu").loaded
    inputs = dict(transformers.AutoTokenizer.from_pretrained(decoder_folder)(TEXT, return_tensors="pt"))
    last = loaded.model.model.layers[-1]
    reached = []
    handle = last.register_forward_pre_hook(lambda module, args: reached.append(True))
    try:
        stopped = loaded.model.capture_pass(inputs, Wanted(frozenset({0})))
        whole = loaded.model.capture_pass(inputs, Wanted(frozenset({0}), final=True))
    finally:
        handle.remove()
    assert reached == [True]  # the whole pass's alone
    assert list(stopped.x) == [0] and stopped.last_hidden is None and stopped.final_in is None
    assert torch.equal(stopped.x[0].hidden, whole.x[0].hidden)
    assert whole.last_hidden is not None


def test_berts_roles_are_transformers_berts(bundled_bert, reference_bert):
    """attnviz's BERT: x and the calls' first argument = the layer's input (post-norm: no norm before attention),
    q/k/v = its query, key and value of it, z_merged = attention.output.dense's input, as transformers' BertModel."""
    tokenizer, reference = reference_bert
    inputs = dict(tokenizer(TEXT, return_tensors="pt"))
    num_layers = reference.config.num_hidden_layers
    projections = [f"encoder.layer.{layer}.attention.output.dense" for layer in range(num_layers)]
    output, z_merged, _ = reference_pass(reference, inputs, projections, None)
    captured = bundled_bert.model.capture_pass(inputs, Wanted(frozenset(range(num_layers)), **EVERY_ROLE))
    close = dict(atol=1e-5, rtol=0)  # BERT's SDPA against transformers' eager attention
    with torch.inference_mode():
        for layer in range(num_layers):
            x = output.hidden_states[layer]
            torch.testing.assert_close(captured.x[layer].hidden, x, **close)
            torch.testing.assert_close(captured.recorded().entering(layer), x, **close)
            attention = reference.encoder.layer[layer].attention.self
            for role, name in (("q", "query"), ("k", "key"), ("v", "value")):
                torch.testing.assert_close(captured.projections[role][layer], getattr(attention, name)(x), **close)
            torch.testing.assert_close(captured.z_merged[layer], z_merged[layer], **close)
            # post-norm: the MLP's output is added to the attention's normed sum, then normed: the next layer's input
            block = reference.encoder.layer[layer]
            attended = block.attention.output.LayerNorm(x + block.attention.output.dense(z_merged[layer]))
            after = block.output.LayerNorm(captured.mlp[layer] + attended)
            torch.testing.assert_close(after, output.hidden_states[layer + 1], **close)
    assert captured.final_in is None  # BERT's layers end with their own norm
    torch.testing.assert_close(captured.last_hidden, output.last_hidden_state, **close)


@pytest.mark.parametrize(("family", "stack"), [("gpt2", None), ("distilbert", None), ("albert", None), ("roberta", None),
                                               ("bart", "decoder"), ("t5", "encoder"), ("t5", "decoder")])
def test_every_family_gives_each_layers_mlp_output(family, stack, tmp_path):
    """The mlp role of every family's stack: one (B, N, D) per layer (ALBERT's one shared layer called once for each), as
    its module gives it, and for the pre-norm GPT-2 what its layer adds to the stream after its attention's output."""
    from tiny_families import build_checkpoint

    import attnviz

    build_checkpoint(family, tmp_path)
    loaded = attnviz.load(str(tmp_path), device="cpu").loaded
    inputs = dict(transformers.AutoTokenizer.from_pretrained(tmp_path)(TEXT, return_tensors="pt"))
    source = inputs if stack is not None else None  # an encoder-decoder's whole pass: its encoder reads the text
    captured = loaded.model.capture_pass(inputs, Wanted(mlp=True, z_merged=True), stack, source)
    num_layers = loaded.model.num_layers(stack)
    assert sorted(captured.mlp) == list(range(num_layers))
    width = loaded.model.model.config.hidden_size if family != "distilbert" else loaded.model.model.config.dim
    assert all(tuple(each.shape) == (1, inputs["input_ids"].shape[1], width) for each in captured.mlp.values())
    if family == "albert":  # one module, two layers: two calls, two outputs
        assert not torch.equal(captured.mlp[0], captured.mlp[1])
    if family == "gpt2":
        model = loaded.model.model
        with torch.inference_mode():
            hidden = model(**inputs, output_hidden_states=True).hidden_states
            added = hidden[0] + model.h[0].attn.c_proj(captured.z_merged[0]) + captured.mlp[0]
        torch.testing.assert_close(added, hidden[1], atol=1e-5, rtol=0)


@pytest.mark.parametrize("layers", [[0], [2, 4]])
def test_berts_stopped_capture_is_its_forward_passs_layer_inputs(bundled_bert, layers):
    """BertEncoder.capture through the hooks: bit for bit the hidden states its own pass gives, cut at the last layer."""
    from attnviz.models.tokens import encode

    encoded = encode(bundled_bert.tokenizer, [TEXT, "A dog."], bundled_bert.max_positions, False)
    inputs = encoded.model_inputs("cpu")
    with torch.inference_mode():
        states = bundled_bert.model(**inputs)
    captured = bundled_bert.model.capture(inputs, layers)
    assert sorted(captured) == layers
    for layer in layers:
        assert torch.equal(captured[layer].hidden, states[layer])


@pytest.mark.parametrize("family", ["llama", "bart", "t5"])
def test_a_report_made_of_a_texts_capture_is_the_one_its_own_passes_make_and_runs_nothing(family, decoder_folder, tmp_path):
    """patch's report: text_report(captured=) over patching's one pass of the text (every layer's x under the thread
    rule) gives the very record that text_report's own passes give (run_attention, run_layers, the trace, the
    vectors), and runs the model not once: the tiny Llama, and an encoder-decoder's decoder (BART; T5 with its
    position bias), whose encoder reads the text."""
    from dataclasses import replace

    from helpers import model_runs
    from tiny_families import build_checkpoint

    import attnviz
    from attnviz.analysis.patching import text_pass
    from attnviz.api.report import text_report
    from attnviz.layer_inputs import encode_texts

    folder = decoder_folder if family == "llama" else tmp_path
    if family != "llama":
        build_checkpoint(family, tmp_path)
    handle = attnviz.load(str(folder), device="cpu")
    stack = {} if family == "llama" else {"stack": "decoder"}
    spec = replace(attnviz.heads(TEXT, model=handle, **stack).spec, layer=1)
    encoded = encode_texts(handle.loaded, [TEXT], spec)
    capture = (encoded, text_pass(handle.loaded, encoded, spec).states)
    with model_runs() as runs:
        made = text_report(handle.loaded, TEXT, spec, captured=capture).record
    assert not runs["LlamaModel"] and not runs["BartModel"] and not runs["T5Model"]
    if family != "llama":
        assert made == text_report(handle.loaded, TEXT, spec).record
        return
    # The Llama's own passes run attnviz's layers in the model's place (passes.in_models_place), patch's capture is the
    # model's own pass (its patched passes replay the model's layers): layers >= 1 read inputs within float32 of each
    # other, and every number of the record is within 1e-5 relative, 1e-6 absolute (two attentions' roundings carried
    # through the layers), but the trace's checks and differences: each is itself a rounding residue (how far two
    # computations differ).
    own = record_numbers(text_report(handle.loaded, TEXT, spec).record)
    numbers = record_numbers(made)
    assert list(numbers) == list(own)
    for path, values in own.items():
        if ".checks[]." not in path and not path.endswith("_diff"):  # and one step of a field's last written decimal
            step = 10.0 ** -max(map(written_decimals, values + numbers[path]))
            np.testing.assert_allclose(numbers[path], values, rtol=1e-5, atol=max(1e-6, step), err_msg=path)
