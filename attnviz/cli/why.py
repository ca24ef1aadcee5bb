"""`attnviz why`: why a head attends from one token to another, its score split into query part x key part terms."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from attnviz.cli.options import (
    MAX_COUNT,
    MAX_HEADS,
    AllowPickleOption,
    LayerAtATimeOption,
    Device,
    DeviceOption,
    Dtype,
    DtypeOption,
    FormatOption,
    ImageFormat,
    KvOption,
    LayerOption,
    ModelOption,
    OutOption,
    QuietOption,
    Stack,
    StackOption,
    TruncateOption,
    app,
    console,
    run_options,
)
from attnviz.cli.shared import run_command


@app.command(short_help="Why a head attends: one score split into the parts that built its query and its key.")
def why(
    text: str = typer.Argument(..., metavar="TEXT", help="The text to attend over, e.g. 'When Mary and John went to the store, John gave a drink to'."),
    layer: int = LayerOption,
    head: int = typer.Option(..., "--head", min=0, max=MAX_HEADS - 1, metavar="N", help="The head, as the model numbers it (from 0)."),
    query: int = typer.Option(..., "--query", min=0, max=MAX_COUNT, metavar="I", help="The query token's position (from 0, as `attnviz heads` numbers the tokens)."),
    key: Optional[int] = typer.Option(
        None, "--key", min=0, max=MAX_COUNT, metavar="J", help="The key token's position (default: the key the head weighs most from the query).",
        show_default=False,
    ),
    model: Optional[str] = ModelOption,
    kv: Optional[str] = KvOption,
    stack: Optional[Stack] = StackOption,
    device: Device = DeviceOption,
    dtype: Dtype = DtypeOption,
    image_format: ImageFormat = FormatOption,
    out: Optional[Path] = OutOption,
    truncate: bool = TruncateOption,
    allow_pickle: bool = AllowPickleOption,
    layer_at_a_time: bool = LayerAtATimeOption,
    quiet: bool = QuietOption,
) -> None:
    """A head's pre-softmax score of (query, key) split exactly into terms: each a part of the query's residual stream
    (the embeddings, each earlier layer's heads one by one, each MLP, the biases) times a part of the key's, through the
    norms with each position's scale frozen, W_Q or W_K and RoPE. Pre-norm decoders (Llama, Qwen, SmolLM2, GPT-2) and
    post-norm encoders (BERT, RoBERTa, XLM-RoBERTa, ELECTRA, DistilBERT, ALBERT), BART's and Marian's every stack, and T5's cross-attention (--stack cross:
    the decoder's parts × the encoder's, the source text --kv, else TEXT itself). The largest terms as a table, why.png
    (the term matrix) and why.json (every term: they add up to the score)."""
    from attnviz.api.why import why as split_score

    def compute(options):
        with console.status("splitting the score…"):
            return split_score(text, head=head, query=query, key=key, **options.keywords())

    options = run_options(model=model, layer=layer, kv=kv, stack=stack, device=device, dtype=dtype, truncate=truncate, allow_pickle=allow_pickle, layer_at_a_time=layer_at_a_time)
    run_command(options, compute, console.print, "drawing the terms…", out=out, text=text, image_format=image_format)
