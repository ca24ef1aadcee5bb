"""`attnviz patch`: which heads carry the answer, each head patched from a clean text into a corrupted one."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from attnviz.cli.options import (
    run_options,
    MAX_COUNT,
    AllowPickleOption,
    LayerAtATimeOption,
    Component,
    Device,
    DeviceOption,
    Dtype,
    DtypeOption,
    FormatOption,
    ImageFormat,
    PatchModelOption,
    OutOption,
    QuietOption,
    TruncateOption,
    app,
    console,
)
from attnviz.cli.shared import print_model_note, run_command
from attnviz.render.progress import progress_bar


@app.command(short_help="Which heads carry the answer: each head patched from a clean text into a corrupted one.")
def patch(
    text: str = typer.Argument(..., metavar="TEXT", help="The clean text, e.g. 'When Mary and John went to the store, John gave a drink to'."),
    corrupt: str = typer.Option(
        ..., "--corrupt", metavar="TEXT", help="The corrupted text, of as many tokens as the clean one (e.g. its names swapped)."
    ),
    answer: str = typer.Option(..., "--answer", metavar="TOKEN", help="The clean text's answer, one token of the model's (e.g. ' Mary')."),
    wrong: str = typer.Option(..., "--wrong", metavar="TOKEN", help="The wrong answer, one token (e.g. ' John'): m = logit(answer) - logit(wrong)."),
    position: Optional[int] = typer.Option(None, "--position", min=0, max=MAX_COUNT, metavar="N", help="The position whose logits are read (default: the last)."),
    per_position: bool = typer.Option(False, "--per-position", help="Also patch the most affecting heads one position at a time (patch_positions.png)."),
    component: Component = typer.Option(
        Component.out,
        "--component",
        help="What of each head is patched: its output, its query, its key or value (through its key/value head with "
        "grouped-query attention: a group's heads share the score), or its map (the clean map over the corrupted values).",
    ),
    edges: bool = typer.Option(
        False, "--edges", help="Also every edge between heads (a head's output into a later head's q, k or v input, and "
        "into the logits) by edge attribution patching, the top ones checked by path patching (edges.png, edges.json)."
    ),
    ig: Optional[int] = typer.Option(None, "--ig", max=MAX_COUNT, metavar="N", help="With --edges: EAP-IG, the gradient averaged over N inputs between the corrupted and the clean one."),
    checked_edges: int = typer.Option(10, "--checked-edges", max=MAX_COUNT, metavar="N", help="With --edges: how many top edges path patching checks."),
    model: Optional[str] = PatchModelOption,
    device: Device = DeviceOption,
    dtype: Dtype = DtypeOption,
    image_format: ImageFormat = FormatOption,
    out: Optional[Path] = OutOption,
    truncate: bool = TruncateOption,
    allow_pickle: bool = AllowPickleOption,
    layer_at_a_time: bool = LayerAtATimeOption,
    quiet: bool = QuietOption,
) -> None:
    """Every layer × head of a decoder (an encoder-decoder's decoder) patched from the clean text into the corrupted
    one: (m_patched - m_corrupt) / (m_clean - m_corrupt), m = logit(answer) - logit(wrong), 0 no effect, 1 the
    clean answer restored (Wang et al. 2022); beside it each head's direct logit attribution on the clean run.
    Writes patch.png, patch_positions.png (--per-position), patch.json, and with --edges edges.png and edges.json."""
    from attnviz.api.patch import patch as patch_heads

    def compute(options):
        with progress_bar(console) as bar:  # the heads patched, then (--per-position) the positions' heads
            return patch_heads(
                text, corrupt=corrupt, answer=answer, wrong=wrong, position=position, per_position=per_position,
                component=component.value, edges=edges, ig=ig, checked_edges=checked_edges, progress=bar, **options.keywords(),
            )  # fmt: skip

    options = run_options(model=model, device=device, dtype=dtype, truncate=truncate, allow_pickle=allow_pickle, layer_at_a_time=layer_at_a_time)
    run_command(options, compute, print_patch, "drawing the patching…", out=out, text=text, image_format=image_format)


def print_patch(result) -> None:
    print_model_note(result.loaded)
    console.print(result)  # its __rich__: the metric, the most affecting heads, a legend
