"""A GGUF file read a tensor at a time (attnviz/models/gguf_weights.py), on a tiny Llama written as llama.cpp writes it.

tests/tiny_families.py's write_gguf stores a tiny LlamaForCausalLM with the gguf package's GGUFWriter under gguf's own
tensor names, W_q and W_k permuted as llama.cpp's converter permutes them, quantised with gguf.quants.quantize (Q8_0,
Q4_0, Q4_1, BF16, F16, F32). The gguf package cannot quantise Q4_K nor Q6_K (it only dequantises them): those files hold
random blocks. The expectation is each stored tensor dequantised by the gguf package, in transformers' order; the F32
file's is the model's own parameters. SmolLM2's file, against transformers' own GGUF loader, is tests/test_smollm2.py's.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import transformers

from attnviz.errors import AttnvizError
from attnviz.models.gguf_weights import LAYER_NAMES, MODEL_NAMES, GGUFWeights
from tiny_families import GGUF_LLAMA, gguf_llama, write_gguf

TEXT = "The cat sat on the mat because it was tired."
# what a file stores: its matrices' type and its token embeddings' (None: the same)
FILES = {"F32": None, "F16": None, "BF16": None, "Q8_0": None, "Q4_0": None, "Q4_1": None, "Q4_K": "Q6_K"}


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    """{file type: (path, the model written, what each tensor must read as)}; the F32 file's head tied to the embeddings."""
    folder = tmp_path_factory.mktemp("gguf")
    files = {}
    for kind, embeddings in FILES.items():
        model = gguf_llama(tied=kind == "F32")
        path = folder / f"tiny-llama.{kind}.gguf"
        files[kind] = (path, model, write_gguf(model, path, kind, embeddings))
    return files


@pytest.mark.parametrize("kind", FILES)
def test_each_tensor_reads_as_the_gguf_packages_dequantisation_of_it(written, kind):
    """Bit for bit, in transformers' names and order (W_q and W_k unpermuted), float32; shapes from the header."""
    path, model, expected = written[kind]
    weights = GGUFWeights(path)
    assert set(weights) == set(expected) and len(weights) == len(expected)
    assert weights.shapes() == {name: values.shape for name, values in expected.items()}
    for name, values in expected.items():
        tensor = weights[name]
        assert tensor.dtype == torch.float32 and torch.equal(tensor, torch.from_numpy(values)), name
    stored = weights.types()
    assert stored["model.layers.0.self_attn.q_proj.weight"] == kind and stored["model.norm.weight"] == "F32"
    assert stored["model.embed_tokens.weight"] == (FILES[kind] or kind)


@pytest.mark.parametrize("kind", FILES)
def test_dequantised_a_few_rows_a_call_is_the_gguf_packages_dequantize_bit_for_bit(written, kind):
    """gguf_weights.dequantised calls the package's dequantize_rows on chunks of rows (its dequantize takes 16 rows a
    call): with 3 blocks' values a call, each tensor of each file is read in many chunks (one row each, or a few)."""
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
    from gguf.quants import dequantize

    from attnviz.models.gguf_file import read_header, tensor_bytes
    from attnviz.models.gguf_weights import dequantised

    path = written[kind][0]
    for tensor in read_header(path).tensors:
        data = tensor_bytes(path, tensor)
        values_at_once = 3 * GGML_QUANT_SIZES[GGMLQuantizationType(tensor.type)][0]
        expected = dequantize(data, GGMLQuantizationType(tensor.type))
        got = dequantised(data, tensor.type, values_at_once)
        assert got.dtype == np.float32 and np.array_equal(got.reshape(expected.shape), expected, equal_nan=True), tensor.name


def test_the_f32_file_reads_back_the_models_own_parameters(written):
    """Independent of the gguf package's dequantisation: F32 stores the floats themselves, so every tensor read back is
    the parameter that was written, whatever llama.cpp's names and W_q/W_k permutation did on the way."""
    path, model, _ = written["F32"]
    weights = GGUFWeights(path)
    parameters = model.state_dict()
    assert set(weights) == set(parameters) - {"lm_head.weight"}  # tied: the head is the embeddings
    for name in weights:
        assert torch.equal(weights[name], parameters[name]), name


def test_the_names_are_the_gguf_packages_own_map():
    """attnviz's table of names against gguf's own (get_tensor_name_map for LLM_ARCH_LLAMA): every entry, both ways."""
    import gguf

    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.LLAMA, 3)
    ours = {**MODEL_NAMES, **{f"blk.2.{gguf_name}": f"model.layers.2.{name}" for gguf_name, name in LAYER_NAMES.items()}}
    assert {names.get_name(name, try_suffixes=(".weight",)): name for name in ours.values()} == ours


def test_the_config_is_the_models_from_the_metadata(written):
    path, model, _ = written["Q8_0"]
    config = GGUFWeights(path).config
    sizes = {key: config[key] for key in GGUF_LLAMA}
    assert sizes == {**GGUF_LLAMA, "rms_norm_eps": float(np.float32(GGUF_LLAMA["rms_norm_eps"]))}  # stored as float32
    assert config["head_dim"] == 32 and config["tie_word_embeddings"] is False
    assert GGUFWeights(written["F32"][0]).config["tie_word_embeddings"] is True  # no output.weight


@pytest.mark.parametrize("kind", ["Q8_0", "Q4_K", "F16"])
def test_transformers_gguf_loader_reads_the_same_tensors(written, kind):
    """transformers' own GGUF loader (from_pretrained(gguf_file=...)) reads the file to the same floats, bit for bit."""
    path, _, _ = written[kind]
    theirs = transformers.AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32).state_dict()
    weights = GGUFWeights(path)
    assert set(weights) == set(theirs)
    for name in weights:
        assert torch.equal(weights[name], theirs[name]), name


@pytest.mark.parametrize("kind", ["Q8_0", "Q4_K", "F32"])
def test_the_model_run_from_the_gguf_file_is_the_whole_model_of_its_dequantised_weights(written, kind):
    """`--model file.gguf`: attnviz's heads of every layer equal the eager attention of transformers' LlamaForCausalLM
    built from the same dequantised weights and run whole (1e-5); and generate's tokens are its greedy ones (the
    untied head read from the file, the tied one from the embeddings); held whole or a layer's weights at a time."""
    import attnviz

    path, model, expected = written[kind]
    reference = transformers.LlamaForCausalLM(model.config).eval()
    reference.load_state_dict({name: torch.from_numpy(values) for name, values in expected.items()}, strict=False)
    if model.config.tie_word_embeddings:
        reference.tie_weights()
    reference.set_attn_implementation("eager")

    for layer_at_a_time in (False, True):  # the file's tensors held whole, or read by the layer-at-a-time engine
        result = attnviz.layers(TEXT, model=str(path), device="cpu", layer_at_a_time=layer_at_a_time)
        ids = torch.tensor([result.layer_runs[0].query_ids])
        with torch.no_grad():
            attentions = reference.model(ids, output_attentions=True).attentions
        for layer, run in enumerate(result.layer_runs):
            torch.testing.assert_close(torch.from_numpy(run.attention), attentions[layer][0], atol=1e-5, rtol=0)

        generated = attnviz.generate(TEXT, model=str(path), tokens=4, device="cpu", layer_at_a_time=layer_at_a_time).generation
        with torch.no_grad():
            greedy = reference.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=4, do_sample=False, pad_token_id=2)
        assert generated.ids == greedy[0, ids.shape[1]:].tolist()


def test_a_gguf_files_run_says_what_it_stores(written):
    import attnviz

    path, _, _ = written["Q4_K"]
    result = attnviz.heads(TEXT, model=str(path), device="cpu")
    assert (result.spec.model_source, result.spec.resolved_model) == ("local file", str(path.resolve()))
    quantisation = result.to_dict()["quantisation"]
    assert quantisation["short"] == "Q4_K GGUF, dequantised"
    assert quantisation["tensor_types"] == {
        "token embeddings": "Q6_K", "RMSNorm weights": "F32", "W_q, W_k, W_v, W_o and the MLP's matrices": "Q4_K", "the language-model head": "Q4_K",
    }  # fmt: skip


# ---- bad input: one line, exit 2, before any layer runs, nothing written ------------------------------


def refused(path, tmp_path, capsys) -> str:
    from attnviz.cli import run

    out = tmp_path / "run"
    assert run(["heads", TEXT, "--model", str(path), "--device", "cpu", "--out", str(out)]) == 2
    error = capsys.readouterr().err.strip()
    assert "\n" not in error and not out.exists()
    return error


def test_a_truncated_file_is_refused_in_one_line(written, tmp_path, capsys):
    path, _, _ = written["Q8_0"]
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(path.read_bytes()[: path.stat().st_size * 2 // 3])
    assert f"cannot read the GGUF file {cut}" in refused(cut, tmp_path, capsys)


def test_a_file_that_is_not_gguf_is_refused_in_one_line(tmp_path, capsys):
    path = tmp_path / "not.gguf"
    path.write_bytes(b"PK\x03\x04 a zip file, say")
    assert f"cannot read the GGUF file {path}" in refused(path, tmp_path, capsys)


def with_type(path, tensor_name: str, type_id: int, out):
    """A copy of the GGUF file at path with one tensor's type id in its header changed to type_id (its bytes as they are)."""
    import gguf

    tensor = next(tensor for tensor in gguf.GGUFReader(str(path)).tensors if tensor.name == tensor_name)
    # the tensor's header: name length, name, number of dimensions, dimensions, type, data offset
    at = tensor.field.offset + sum(part.nbytes for part in tensor.field.parts[:4])
    data = bytearray(path.read_bytes())
    data[at : at + 4] = np.uint32(type_id).tobytes()
    out.write_bytes(bytes(data))
    return out


def test_a_type_the_gguf_package_cannot_dequantise_is_refused_naming_it(written, tmp_path, capsys):
    """Q8_1 (llama.cpp's intermediate type): the gguf package knows its sizes but cannot dequantise it."""
    import gguf

    path = with_type(written["Q8_0"][0], "blk.1.ffn_up.weight", gguf.GGMLQuantizationType.Q8_1, tmp_path / "q8_1.gguf")
    error = refused(path, tmp_path, capsys)
    assert "its tensor model.layers.1.mlp.up_proj.weight is stored as Q8_1, which the gguf package cannot dequantise" in error


def test_a_type_unknown_to_the_gguf_package_is_refused_naming_it(written, tmp_path, capsys):
    path = with_type(written["Q8_0"][0], "blk.1.ffn_up.weight", 99, tmp_path / "type-99.gguf")
    error = refused(path, tmp_path, capsys)
    assert f"cannot read the GGUF file {path}" in error and "99" in error


def test_a_file_without_a_tokenizer_is_refused_before_its_tensors_are_read(written, tmp_path, capsys, monkeypatch):
    import gguf

    _, model, _ = written["Q8_0"]
    path = tmp_path / "no-tokenizer.gguf"
    monkeypatch.setattr(gguf.GGUFWriter, "add_token_list", lambda writer, tokens: None)  # the vocabulary left out
    write_gguf(model, path, "Q8_0")
    monkeypatch.undo()
    read = []
    monkeypatch.setattr(GGUFWeights, "__getitem__", lambda weights, name: read.append(name))
    assert "the GGUF file holds no tokenizer (tokenizer.ggml.tokens)" in refused(path, tmp_path, capsys)
    assert read == []


def test_another_architecture_is_refused_naming_it(tmp_path, capsys):
    import gguf

    path = tmp_path / "gpt2.gguf"
    writer = gguf.GGUFWriter(str(path), "gpt2")
    writer.add_tensor("token_embd.weight", np.zeros((8, 32), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    assert "its architecture is 'gpt2'; attnviz reads GGUF files of Llama's ('llama')" in refused(path, tmp_path, capsys)


@pytest.mark.parametrize("name", ["absent.gguf", "/nowhere/absent.GGUF"])
def test_a_gguf_file_that_is_not_there_is_no_such_file(name):
    from attnviz.models.loading import load_model

    with pytest.raises(AttnvizError, match="no such file$"):
        load_model(name)


def test_opening_reads_no_tensor(written, monkeypatch):
    """The header alone: GGUFWeights(path) and shapes() never dequantise a whole tensor (the type check reads one row)."""
    import gguf.quants

    path, _, expected = written["Q4_K"]
    rows = []
    real = gguf.quants.dequantize
    monkeypatch.setattr(gguf.quants, "dequantize", lambda data, qtype: rows.append(data.shape[0]) or real(data, qtype))
    weights = GGUFWeights(path)
    weights.shapes()
    assert rows and set(rows) == {1}  # one row of each type


@pytest.mark.parametrize("kind", ["Q8_0", "Q4_K", "F32"])
def test_the_header_is_the_gguf_packages_reading_of_it(written, kind):
    """gguf_file.read_header (struct, arrays stepped over) against the gguf package's GGUFReader: every scalar and
    string field, every array's length, and each tensor's name, dimensions, type and first byte."""
    import gguf

    from attnviz.models.gguf_file import ArrayLength, read_header

    path = written[kind][0]
    reader = gguf.GGUFReader(str(path))
    header = read_header(path)
    assert list(header.fields) == [name for name in reader.fields if not name.startswith("GGUF.")]  # its own 3 aside
    for name, value in header.fields.items():
        field = reader.fields[name]
        if isinstance(value, ArrayLength):
            assert value == len(field.data), name
        else:
            assert value == field.contents() and type(value) is type(field.contents()), name
    assert [(t.name, t.dims, t.type, t.offset) for t in header.tensors] == [
        (t.name, tuple(int(size) for size in t.shape), int(t.tensor_type), int(t.data_offset)) for t in reader.tensors
    ]
