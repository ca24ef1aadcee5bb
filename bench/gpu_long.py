"""Issue 25's long-text rows on one GPU: every head of every layer summarised at 32,768 tokens.

    python bench/gpu_long.py [--tokens 32768] [--layers 16] [--out DIR]

The model is a Llama-architecture decoder of Llama 3.2 1B's shapes (hidden 2048, 32 query heads over
8 key/value heads, MLP 8192, RoPE theta 500,000, tied embeddings; --layers 16 and a 32,000-row
vocabulary make 1.04 billion parameters) with random weights (std 0.02), saved as safetensors with a
byte-level tokenizer trained on a few sentences (tests/tiny_families.py): the shapes and the lengths
are what cost, not what the weights learned. On one run, one GPU, in one process:

1. summaries: attnviz.analysis.head_summaries.summarise_layers over the text (one forward pass for every
   layer's input, SDPA past 64 MB of maps; then each layer's attention a block of queries at a time),
   wall time and peak GPU memory (torch.cuda.max_memory_allocated);
2. sdpa_forward: the same model's forward pass in transformers with SDPA attention over the same ids;
3. one layer's attention alone (bench/blocks.py, Llama 1B's shapes): attnviz's blocks and summaries against
   F.scaled_dot_product_attention on the same q, k, v.

Prints one JSON object (and writes it to DIR/gpu_long.json): the ratios are the rows of bench/RESULTS.md.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import torch

REPOSITORY = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPOSITORY), str(REPOSITORY / "tests"), str(REPOSITORY / "bench")]

WORDS = "the cat sat on the mat because it was tired and attention is all you need they said".split()


def build_model(folder: Path, layers: int, hidden: int, heads: int, kv_heads: int, mlp: int, positions: int) -> int:
    """A Llama of these shapes with random weights, saved to folder; returns its parameter count."""
    import transformers
    from tiny_families import bpe_tokenizer

    config = transformers.LlamaConfig(
        vocab_size=32000, hidden_size=hidden, intermediate_size=mlp, num_hidden_layers=layers,
        num_attention_heads=heads, num_key_value_heads=kv_heads, max_position_embeddings=positions,
        rope_theta=500000.0, tie_word_embeddings=True, bos_token_id=0, eos_token_id=1, pad_token_id=2,
    )  # fmt: skip
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config)
    with torch.no_grad():
        for parameter in model.parameters():
            if parameter.dim() > 1:
                parameter.normal_(0.0, 0.02)
    model.save_pretrained(folder)
    bpe_tokenizer(bos=True).save_pretrained(folder)
    return sum(parameter.numel() for parameter in model.parameters())


def synchronize(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tokens", type=int, default=32768)
    parser.add_argument("--layers", type=int, default=16)
    parser.add_argument("--hidden", type=int, default=2048)
    parser.add_argument("--heads", type=int, default=32)
    parser.add_argument("--kv-heads", type=int, default=8)
    parser.add_argument("--mlp", type=int, default=8192)
    parser.add_argument("--budget-mb", type=int, default=8192, help="a block of attention's scores and weights")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()

    import transformers

    from attnviz.analysis.head_summaries import summarise_layers
    from attnviz.models.loading import load_model
    from attnviz.spec import run_spec

    found: dict = {"device": torch.cuda.get_device_name() if args.device == "cuda" else "cpu", "torch": torch.__version__}
    folder = Path(tempfile.mkdtemp()) / "llama"
    start = time.perf_counter()
    found["parameters"] = build_model(folder, args.layers, args.hidden, args.heads, args.kv_heads, args.mlp, args.tokens)
    found["build_s"] = time.perf_counter() - start

    text = " ".join(WORDS[index % len(WORDS)] for index in range(args.tokens))  # more tokens than --tokens: cut
    loaded = load_model(str(folder), args.device)
    spec = run_spec(loaded, device=args.device, truncate=True)
    if args.device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    synchronize(args.device)
    start = time.perf_counter()
    summaries = summarise_layers(loaded, text, spec, budget_bytes=args.budget_mb * 2**20)
    synchronize(args.device)
    found["summaries_s"] = time.perf_counter() - start
    found["tokens"] = len(summaries.tokens)
    found["rows_per_block"] = summaries.rows_per_block
    found["summaries_peak_gpu_gib"] = torch.cuda.max_memory_allocated() / 2**30 if args.device == "cuda" else None
    found["sink_share_layer_0"] = summaries.values["sink"][0].round(4).tolist()
    found["model_sink_fraction"] = float((summaries.values["sink"] > 0.3).mean())

    ids = torch.tensor([loaded.tokenizer.encode_batch([text])[0][: found["tokens"]]], device=args.device)
    reference = transformers.AutoModelForCausalLM.from_pretrained(folder, attn_implementation="sdpa").to(args.device).eval()
    try:
        with torch.inference_mode():
            reference.model(ids)  # warm-up
            synchronize(args.device)
            start = time.perf_counter()
            reference.model(ids)
            synchronize(args.device)
        found["sdpa_forward_s"] = time.perf_counter() - start
        found["summaries_over_sdpa_forward"] = found["summaries_s"] / found["sdpa_forward_s"]
    except torch.OutOfMemoryError as error:  # float32 over grouped-query heads: SDPA's math kernel makes the maps
        found["sdpa_forward_s"] = f"out of memory: {str(error).splitlines()[0]}"
    del reference
    if args.device == "cuda":
        torch.cuda.empty_cache()

    # One layer's attention alone (bench/blocks.py): attnviz's blocks and summaries against SDPA on the same q, k, v.
    from blocks import layer_alone

    alone = layer_alone(found["tokens"], "llama1b", args.device, args.budget_mb)
    found["layer_sdpa_s"], found["layer_blocks_s"] = alone["sdpa_s"], alone["blocks_and_summaries_s"]
    found["blocks_over_sdpa"] = alone["blocks_over_sdpa"]
    print(json.dumps(found, indent=1))
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "gpu_long.json").write_text(json.dumps(found, indent=1), encoding="utf-8")


if __name__ == "__main__":
    main()
