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
