"""Tiny random checkpoints of every family attnviz loads, built with transformers' own classes.

Each is saved as safetensors with a real tokenizer: the bundled BERT's WordPiece for encoders
and encoder-decoders, a small byte-level BPE trained here with the `tokenizers` library for
decoders (with Llama's <s> in front; GPT-2 adds nothing). The parameters are drawn wider than
transformers' initialisation (std 0.02), so that the attention is far from uniform: a wrong
rotation, scale or mask then moves the weights by far more than the tolerance.
"""

from __future__ import annotations

from pathlib import Path

import torch
import transformers
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import PreTrainedTokenizerFast

from attnviz.models.loading import bundled_model_path

CORPUS = [
    "The cat sat on the mat because it was tired.",
    "Attention is all you need, they said.",
    "我想吃酸菜鱼",
]
BPE_VOCAB = 400
WORDPIECE_VOCAB = 30522
PARAMETER_STD = 0.4


def bpe_tokenizer(bos: bool) -> PreTrainedTokenizerFast:
    """A byte-level BPE (GPT-2's kind) trained on CORPUS; bos: <s> before every text, as Llama's tokenizers do."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=BPE_VOCAB,
        special_tokens=["<s>", "</s>", "<pad>", "<unk>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tokenizer.train_from_iterator(CORPUS * 10, trainer)
    if bos:
        tokenizer.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 0)])
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, bos_token="<s>", eos_token="</s>", pad_token="<pad>", unk_token="<unk>"
    )


def wordpiece_tokenizer() -> PreTrainedTokenizerFast:
    """The bundled all-MiniLM-L6-v2's WordPiece: [CLS] text [SEP]."""
    return PreTrainedTokenizerFast(
        tokenizer_file=str(bundled_model_path() / "tokenizer.json"),
        cls_token="[CLS]", sep_token="[SEP]", pad_token="[PAD]", unk_token="[UNK]", mask_token="[MASK]",
    )


_ENCODER = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64, max_position_embeddings=64)
_DECODER = dict(vocab_size=BPE_VOCAB, hidden_size=48, num_hidden_layers=2, num_attention_heads=6, intermediate_size=64,
                max_position_embeddings=64)
_SEQ2SEQ = dict(vocab_size=WORDPIECE_VOCAB, d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
                decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64, max_position_embeddings=64,
                pad_token_id=0, bos_token_id=101, eos_token_id=102, decoder_start_token_id=102)

# model_type -> (config, base model class, tokenizer): each family's own twists kept in, small.
FAMILY_CHECKPOINTS = {
    "roberta": lambda: (transformers.RobertaConfig(vocab_size=WORDPIECE_VOCAB, pad_token_id=0, **_ENCODER), transformers.RobertaModel, wordpiece_tokenizer),
    "xlm-roberta": lambda: (transformers.XLMRobertaConfig(vocab_size=WORDPIECE_VOCAB, pad_token_id=0, **_ENCODER), transformers.XLMRobertaModel, wordpiece_tokenizer),
    "distilbert": lambda: (
        transformers.DistilBertConfig(vocab_size=WORDPIECE_VOCAB, dim=32, n_layers=2, n_heads=4, hidden_dim=64, max_position_embeddings=64),
        transformers.DistilBertModel,
        wordpiece_tokenizer,
    ),
    # ALBERT: one layer's parameters shared by both layers, embeddings of 16 projected up to 32
    "albert": lambda: (transformers.AlbertConfig(vocab_size=WORDPIECE_VOCAB, embedding_size=16, **_ENCODER), transformers.AlbertModel, wordpiece_tokenizer),
    "electra": lambda: (transformers.ElectraConfig(vocab_size=WORDPIECE_VOCAB, embedding_size=16, **_ENCODER), transformers.ElectraModel, wordpiece_tokenizer),
    # GPT-2: fused c_attn, Conv1D weights stored transposed
    "gpt2": lambda: (transformers.GPT2Config(vocab_size=BPE_VOCAB, n_embd=32, n_layer=2, n_head=4, n_positions=64), transformers.GPT2Model, lambda: bpe_tokenizer(bos=False)),
    # Llama: 6 query heads share 2 key/value heads (groups of 3), RoPE, RMSNorm
    "llama": lambda: (transformers.LlamaConfig(num_key_value_heads=2, **_DECODER), transformers.LlamaModel, lambda: bpe_tokenizer(bos=True)),
    # Mistral: one key/value head for all (multi-query)
    "mistral": lambda: (transformers.MistralConfig(num_key_value_heads=1, **_DECODER), transformers.MistralModel, lambda: bpe_tokenizer(bos=True)),
    # Qwen2: q, k and v biases
    "qwen2": lambda: (transformers.Qwen2Config(num_key_value_heads=3, **_DECODER), transformers.Qwen2Model, lambda: bpe_tokenizer(bos=True)),
    # Qwen3: RMSNorm over each head's q and k, head size 16 set apart from 48 / 6
    "qwen3": lambda: (transformers.Qwen3Config(num_key_value_heads=2, head_dim=16, **_DECODER), transformers.Qwen3Model, lambda: bpe_tokenizer(bos=True)),
    "bart": lambda: (transformers.BartConfig(**_SEQ2SEQ), transformers.BartModel, wordpiece_tokenizer),
    "marian": lambda: (transformers.MarianConfig(**{**_SEQ2SEQ, "decoder_start_token_id": 0}), transformers.MarianModel, wordpiece_tokenizer),
    # T5: relative position bias, no 1/sqrt(d) scaling, no biases
    "t5": lambda: (
        transformers.T5Config(vocab_size=WORDPIECE_VOCAB, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_heads=4,
                              pad_token_id=0, eos_token_id=102, decoder_start_token_id=0),
        transformers.T5Model,
        wordpiece_tokenizer,
    ),
}


def build_checkpoint(model_type: str, folder: Path, seed: int = 0) -> transformers.PreTrainedModel:
    """Save a tiny random checkpoint of model_type (safetensors, with its tokenizer) to folder; returns the model."""
    config, model_class, tokenizer = FAMILY_CHECKPOINTS[model_type]()
    return save_checkpoint(config, model_class, tokenizer(), folder, seed)


def save_checkpoint(
    config, model_class, tokenizer, folder: Path, seed: int = 0, dtype: torch.dtype = torch.float32
) -> transformers.PreTrainedModel:
    """Save model_class built from config, its parameters drawn wide from seed, with tokenizer, to folder, stored in dtype;
    returns the model (in float32, its parameters the values stored)."""
    torch.manual_seed(seed)
    model = model_class(config)
    model.set_attn_implementation("eager")
    model.eval()
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if parameter.dim() > 1 or "bias" in name:
                parameter.normal_(0.0, PARAMETER_STD)
            parameter.copy_(parameter.to(dtype))  # the values the file stores
    model.to(dtype).save_pretrained(folder)  # safetensors
    model.float()
    tokenizer.save_pretrained(folder)
    return model


# ---- a tiny Llama as llama.cpp writes it: GGUF (tests/test_gguf_weights.py) --------------------------------------

# 256 features a row: K-quants (Q4_K, Q6_K) quantise rows in blocks of 256, the others in blocks of 32.
GGUF_LLAMA = dict(vocab_size=BPE_VOCAB, hidden_size=256, intermediate_size=256, num_hidden_layers=2, num_attention_heads=8,
                  num_key_value_heads=2, max_position_embeddings=64, rope_theta=50000.0, rms_norm_eps=1e-5)  # fmt: skip
GGUF_PARAMETER_STD = 0.15  # 256 wide: its scores about as wide as the 48-wide decoders' at PARAMETER_STD
RANDOM_BLOCKS = {"Q4_K": ((0, 2), (2, 4)), "Q6_K": ((208, 210),)}  # where each block's float16 scales lie (d, dmin)
RANDOM_SCALE = {"Q4_K": 0.0006, "Q6_K": 0.00015}  # so that the values spread about as GGUF_PARAMETER_STD


def gguf_llama(tied: bool, seed: int = 0) -> transformers.LlamaForCausalLM:
    """A tiny LlamaForCausalLM (8 query heads over 2 key/value heads, 256 wide), drawn from seed (GGUF_PARAMETER_STD),
    its RMSNorm weights drawn about 1 too (a norm read in another's place then changes the numbers)."""
    torch.manual_seed(seed)
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(tie_word_embeddings=tied, **GGUF_LLAMA)).eval()
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            parameter.normal_(0.0, GGUF_PARAMETER_STD) if parameter.dim() > 1 else parameter.normal_(1.0, 0.1)
    return model


def write_gguf(model: transformers.LlamaForCausalLM, path: Path, matrices: str, embeddings: str | None = None, seed: int = 0) -> dict:
    """Write model to path as llama.cpp's converter does (gguf's own tensor names, W_q and W_k rows permuted for
    llama.cpp's RoPE, the sizes and bpe_tokenizer(bos=True) as metadata): the matrices (and the head) stored as the
    type named (gguf's type names), the token embeddings as `embeddings` (default: the same), the norms as F32.

    Types the gguf package quantises are quantised with gguf.quants.quantize; those it can only dequantise (Q4_K,
    Q6_K) are stored as random blocks (RANDOM_BLOCKS). Returns {transformers' name: float32 array (out, in)}: what
    each stored tensor is, dequantised by the gguf package, in transformers' order: what reading the file must give.
    """
    import gguf
    import numpy as np
    from gguf.quants import dequantize, quantize

    config = model.config
    rng = np.random.default_rng(seed)
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.LLAMA, config.num_hidden_layers)
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_block_count(config.num_hidden_layers)
    writer.add_context_length(config.max_position_embeddings)
    writer.add_embedding_length(config.hidden_size)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_head_count(config.num_attention_heads)
    writer.add_head_count_kv(config.num_key_value_heads)
    writer.add_layer_norm_rms_eps(config.rms_norm_eps)
    writer.add_rope_freq_base(config.rope_parameters["rope_theta"])
    writer.add_rope_dimension_count(config.hidden_size // config.num_attention_heads)
    writer.add_vocab_size(config.vocab_size)
    _add_tokenizer(writer, bpe_tokenizer(bos=True))

    expected = {}
    for name, tensor in model.state_dict().items():
        if name == "lm_head.weight" and config.tie_word_embeddings:
            continue
        values = tensor.numpy()
        kind = "F32" if values.ndim == 1 else (embeddings or matrices) if "embed_tokens" in name else matrices
        qtype = gguf.GGMLQuantizationType[kind]
        if kind in RANDOM_BLOCKS:
            stored = _random_blocks(values.shape, kind, rng)
        else:
            stored = quantize(values, qtype)
        expected[name] = dequantize(stored, qtype).reshape(values.shape)
        if name.endswith(("q_proj.weight", "k_proj.weight")):  # llama.cpp's LlamaModel.permute, on rows (of bytes)
            heads = config.num_attention_heads if "q_proj" in name else config.num_key_value_heads
            stored = stored.reshape(heads, 2, stored.shape[0] // heads // 2, *stored.shape[1:]).swapaxes(1, 2).reshape(stored.shape)
        raw = None if kind in ("F32", "F16") else qtype
        writer.add_tensor(names.get_name(name, try_suffixes=(".weight",)), stored, raw_dtype=raw)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return expected


def _random_blocks(shape: tuple[int, int], kind: str, rng):
    """Blocks of a type gguf.quants cannot quantise: random bits, their float16 scales drawn small (RANDOM_SCALE)."""
    import gguf
    import numpy as np

    block_size, type_size = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[kind]]
    blocks = rng.integers(0, 256, size=(shape[0], shape[1] // block_size, type_size), dtype=np.uint8)
    for start, end in RANDOM_BLOCKS[kind]:
        scales = rng.normal(0.0, RANDOM_SCALE[kind], size=blocks.shape[:2]).astype(np.float16)
        blocks[..., start:end] = scales.view(np.uint8).reshape(*blocks.shape[:2], 2)
    return blocks.reshape(shape[0], -1)


def _add_tokenizer(writer, tokenizer: PreTrainedTokenizerFast) -> None:
    """A byte-level BPE as llama.cpp stores one (tokenizer.ggml.*): the tokens by id, their types, the merges."""
    import json

    vocabulary = tokenizer.backend_tokenizer.get_vocab(with_added_tokens=True)
    tokens = sorted(vocabulary, key=vocabulary.get)
    special = set(tokenizer.all_special_tokens)
    merges = json.loads(tokenizer.backend_tokenizer.to_str())["model"]["merges"]
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(tokens)
    writer.add_token_types([3 if token in special else 1 for token in tokens])  # 3: control, 1: normal
    writer.add_token_merges([merge if isinstance(merge, str) else " ".join(merge) for merge in merges])
    for add, token in ((writer.add_bos_token_id, "<s>"), (writer.add_eos_token_id, "</s>"), (writer.add_pad_token_id, "<pad>"), (writer.add_unk_token_id, "<unk>")):
        add(vocabulary[token])
    writer.add_add_bos_token(True)
