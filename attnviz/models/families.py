"""The model families attnviz loads, read from config.json's model_type: plain data, no torch.

Each family says what kind of transformer it is (an encoder, a decoder, or an encoder-decoder)
and where its config.json keeps the sizes `attnviz models` lists and the runs check (layers,
heads, key/value heads, model size, positions), with the defaults of transformers' config
class for the keys a config.json may leave out. BERT keeps attnviz's own fast encoder
(bert.py); every other family's layer inputs come from transformers' model (transformers_model.py),
and attnviz's own layer (attention/layer.py) computes the weights from its projections.
"""

from __future__ import annotations

from dataclasses import dataclass, field

ENCODER, DECODER, ENCODER_DECODER = "encoder", "decoder", "encoder-decoder"


@dataclass(frozen=True)
class Family:
    """One family: its name as people write it, its model_types, its kind and its config keys.

    keys maps each size to (config.json key, default): layers, heads, kv_heads, hidden, positions,
    vocab, and head_dim where a config may set it apart from hidden / heads. For an encoder-decoder,
    layers and heads are the encoder's; decoder_layers and decoder_heads the decoder's.
    """

    name: str
    model_types: tuple[str, ...]
    kind: str  # ENCODER, DECODER or ENCODER_DECODER
    keys: dict[str, tuple[str, object]] = field(default_factory=dict)
    rotary: bool = False  # RoPE: q and k are rotated by position before the scores
    position_bias: bool = False  # T5: a learned bias by relative position is added to the scores
    position_offset: int = 0  # RoBERTa and BART number positions from an offset: fewer usable positions

    @property
    def causal(self) -> bool:
        """A decoder's own attention is causal: each token sees itself and the tokens before it."""
        return self.kind == DECODER

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


_BERT_KEYS = {
    "layers": ("num_hidden_layers", 12),
    "heads": ("num_attention_heads", 12),
    "hidden": ("hidden_size", 768),
    "positions": ("max_position_embeddings", 512),
    "vocab": ("vocab_size", 30522),
}
_LLAMA_KEYS = {
    "layers": ("num_hidden_layers", 32),
    "heads": ("num_attention_heads", 32),
    "kv_heads": ("num_key_value_heads", None),
    "hidden": ("hidden_size", 4096),
    "head_dim": ("head_dim", None),
    "positions": ("max_position_embeddings", 2048),
    "vocab": ("vocab_size", 32000),
}
_QWEN_KEYS = {  # Qwen2Config's and Qwen3Config's defaults: 32 key/value heads, a vocabulary of 151936
    **_LLAMA_KEYS,
    "kv_heads": ("num_key_value_heads", 32),
    "positions": ("max_position_embeddings", 32768),
    "vocab": ("vocab_size", 151936),
}
_BART_KEYS = {
    "layers": ("encoder_layers", 12),
    "heads": ("encoder_attention_heads", 16),
    "decoder_layers": ("decoder_layers", 12),
    "decoder_heads": ("decoder_attention_heads", 16),
    "hidden": ("d_model", 1024),
    "positions": ("max_position_embeddings", 1024),
    "vocab": ("vocab_size", 50265),
}

FAMILIES = (
    Family("BERT", ("bert",), ENCODER, _BERT_KEYS),
    Family("RoBERTa", ("roberta",), ENCODER, {**_BERT_KEYS, "vocab": ("vocab_size", 50265)}, position_offset=2),
    Family("XLM-RoBERTa", ("xlm-roberta",), ENCODER, _BERT_KEYS, position_offset=2),
    Family(
        "DistilBERT",
        ("distilbert",),
        ENCODER,
        {
            "layers": ("n_layers", 6),
            "heads": ("n_heads", 12),
            "hidden": ("dim", 768),
            "positions": ("max_position_embeddings", 512),
            "vocab": ("vocab_size", 30522),
        },
    ),
    Family(
        "ALBERT",
        ("albert",),
        ENCODER,
        {**_BERT_KEYS, "hidden": ("hidden_size", 4096), "heads": ("num_attention_heads", 64), "vocab": ("vocab_size", 30000)},
    ),
    Family("ELECTRA", ("electra",), ENCODER, {**_BERT_KEYS, "hidden": ("hidden_size", 256), "heads": ("num_attention_heads", 4)}),
    Family(
        "GPT-2",
        ("gpt2",),
        DECODER,
        {
            "layers": ("n_layer", 12),
            "heads": ("n_head", 12),
            "hidden": ("n_embd", 768),
            "positions": ("n_positions", 1024),
            "vocab": ("vocab_size", 50257),
        },
    ),
    Family("Llama", ("llama",), DECODER, _LLAMA_KEYS, rotary=True),
    Family("Mistral", ("mistral",), DECODER, {**_LLAMA_KEYS, "kv_heads": ("num_key_value_heads", 8), "positions": ("max_position_embeddings", 131072)}, rotary=True),
    Family("Qwen2", ("qwen2",), DECODER, _QWEN_KEYS, rotary=True),
    Family("Qwen3", ("qwen3",), DECODER, {**_QWEN_KEYS, "head_dim": ("head_dim", 128)}, rotary=True),
    Family("BART", ("bart",), ENCODER_DECODER, _BART_KEYS, position_offset=2),
    Family("Marian", ("marian",), ENCODER_DECODER, {**_BART_KEYS, "vocab": ("vocab_size", 58101)}),
    Family(
        "T5",
        ("t5",),
        ENCODER_DECODER,
        {
            "layers": ("num_layers", 6),
            "heads": ("num_heads", 8),
            "decoder_layers": ("num_decoder_layers", None),
            "decoder_heads": ("num_heads", 8),
            "hidden": ("d_model", 512),
            "head_dim": ("d_kv", 64),
            "positions": ("n_positions", 512),  # relative positions have no end; 512 is what T5 was trained on
            "vocab": ("vocab_size", 32128),
        },
        position_bias=True,
    ),
)

_BY_MODEL_TYPE = {model_type: family for family in FAMILIES for model_type in family.model_types}


def family_of(config: dict) -> Family | None:
    """The family of a config.json's values, None when attnviz does not support it."""
    model_type = config.get("model_type") if isinstance(config, dict) else None
    return _BY_MODEL_TYPE.get(model_type) if isinstance(model_type, str) else None


def supported_names() -> str:
    """'BERT, RoBERTa, ..., T5': for the error that refuses another family."""
    return ", ".join(family.name for family in FAMILIES)
