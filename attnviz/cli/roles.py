"""`attnviz roles`: what each head is, every layer × head's roles over one text, with each role's evidence."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from attnviz.cli.options import (
    run_options,
    MAX_COUNT,
    AllowPickleOption,
    LayerAtATimeOption,
    Device,
    DeviceOption,
    Dtype,
    DtypeOption,
    Engine,
    EveryLayerMemoryOption,
    EveryLayerStackOption,
    FormatOption,
    ImageFormat,
    ModelOption,
    OutOption,
    QuietOption,
    Stack,
    TruncateOption,
    app,
    console,
)
from attnviz.cli.shared import print_model_note, run_command
from attnviz.errors import AttnvizError
from attnviz.render.progress import progress_bar


@app.command(short_help="What each head is: previous-token, induction, copying, sink, streaming, ... every layer × head.")
def roles(
    text: str = typer.Argument(..., metavar="TEXT", help="The text to attend over; its templates need two tokens or more."),
    model: Optional[str] = ModelOption,
    exclude_bos: bool = typer.Option(False, "--exclude-bos", help="Leave the weight on the first token (BOS) out of the template scores, as TransformerLens's detect_head(exclude_bos=True)."),
    exclude_current: bool = typer.Option(False, "--exclude-current", help="Leave each query's weight on itself out of the template scores, as TransformerLens's exclude_current_token."),
    sinks: int = typer.Option(4, "--sinks", min=0, max=MAX_COUNT, metavar="S", help="The streaming share's sinks: the first S keys (StreamingLLM's 4)."),
    recent: int = typer.Option(256, "--recent", min=1, max=MAX_COUNT, metavar="W", help="The streaming share's recent window: the W keys ending at each query (DuoAttention's 256)."),
    retrieval: bool = typer.Option(False, "--retrieval", help="Also find retrieval heads (Wu et al. 2024): needle-in-a-haystack tests generated greedily, each head scored by the needle tokens it copies; minutes on a CPU."),
    lengths: Optional[str] = typer.Option(None, "--lengths", metavar="N,N,...", help="With --retrieval: the haystacks' lengths in tokens. [default: 1024,2048,4096]", show_default=False),
    depths: Optional[str] = typer.Option(None, "--depths", metavar="D,D,...", help="With --retrieval: where the needle sits, 0 (start) to 1 (end). [default: 0.1,0.5,0.9]", show_default=False),
    engine: Engine = typer.Option(Engine.local, help='With --retrieval: run the tests here, or on Ray (RAY_ADDRESS, else a local Ray): pip install "attnviz[ray]".'),
    stack: Optional[Stack] = EveryLayerStackOption,
    device: Device = DeviceOption,
    dtype: Dtype = DtypeOption,
    image_format: ImageFormat = FormatOption,
    out: Optional[Path] = OutOption,
    truncate: bool = TruncateOption,
    memory: Optional[int] = EveryLayerMemoryOption,
    allow_pickle: bool = AllowPickleOption,
    layer_at_a_time: bool = LayerAtATimeOption,
    quiet: bool = QuietOption,
) -> None:
    """Every layer × head's roles over one text, a block of queries at a time (any length): TransformerLens's
    previous-token, duplicate-token and induction template scores, the streaming share (--sinks, --recent), the
    top-16/64/256 coverage and the sink, entropy, distance and local-band summaries; for a decoder, Olsson et al.'s
    prefix matching (random repeated tokens) and copying (the OV circuit's eigenvalues). Each head labelled by its
    roles above stated thresholds (local, sink and streaming only on a text long enough for them to tell heads
    apart, said where not): roles.png (a grid coloured by role), roles.json, report.html (the Roles view)."""
    from attnviz.api.roles import roles as head_roles

    for given, name in ((lengths, "--lengths"), (depths, "--depths"), (engine != Engine.local, "--engine ray")):
        if given and not retrieval:
            raise AttnvizError(f"{name} goes with --retrieval: the needle tests' grid and where they run")

    def compute(options):
        with progress_bar(console) as bar:  # a bar per stage: the text's layers, ..., the needle tests
            return head_roles(text, exclude_bos=exclude_bos, exclude_current=exclude_current, sinks=sinks, recent=recent,
                              retrieval=retrieval, lengths=lengths, depths=depths, engine=engine.value, progress=bar,
                              **options.keywords())  # fmt: skip

    options = run_options(
        model=model, stack=stack, device=device, dtype=dtype, truncate=truncate, memory=memory, allow_pickle=allow_pickle, layer_at_a_time=layer_at_a_time
    )
    run_command(options, compute, print_roles, "drawing the roles…", out=out, text=text, image_format=image_format)


def print_roles(result) -> None:
    print_model_note(result.loaded)
    console.print(result)  # its __rich__: the grid of roles and each role's top heads
