"""`attnviz stats` and `attnviz layers`: every head of every layer."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from attnviz.cli.options import (
    app,
    console,
    errors,
    Weights,
    Device,
    ImageFormat,
    Stack,
    DeviceOption,
    TruncateOption,
    WordsOption,
    Measure,
    LayersMeasureOption,
    FormatOption,
    WeightsOption,
    SeedOption,
    EveryLayerCausalOption,
    AllowPickleOption,
    ModelOption,
    EveryLayerHeadsOption,
    EveryLayerStackOption,
    FileOutOption,
    OutOption,
)
from attnviz.cli.shared import MAX_NOTICES_SHOWN, run_target, write_run
from attnviz.errors import AttnvizError
from attnviz.spec import check_text, refuse_cross_over_every_layer


@app.command(short_help='What every head of every layer does: statistics and labels.')
def stats(
    text: Optional[str] = typer.Argument(
        None, metavar="TEXT", help="The text whose heads to measure. Or give --file.", show_default=False
    ),
    file: Optional[str] = typer.Option(
        None,
        "--file",
        "-f",
        metavar="PATH",
        help="Average over texts: one per line (blank lines skipped; - reads standard input).",
    ),
    model: Optional[str] = ModelOption,
    num_heads: Optional[int] = EveryLayerHeadsOption,
    weights: Weights = WeightsOption,
    seed: int = SeedOption,
    causal: bool = EveryLayerCausalOption,
    stack: Optional[Stack] = EveryLayerStackOption,
    device: Device = DeviceOption,
    image_format: ImageFormat = FormatOption,
    out: Optional[Path] = FileOutOption,
    truncate: bool = TruncateOption,
    words: bool = WordsOption,
    allow_pickle: bool = AllowPickleOption,
) -> None:
    """What every head of every layer does: entropy, [CLS], [SEP], previous/next token, labels; stats.csv and .json.

    The statistics of Clark et al. 2019, three of them defined otherwise. js_distance is the
    Jensen-Shannon distance (the square root of the divergence, base-2 logarithms, 0 to 1)
    averaged over queries; Clark et al. sum the Jensen-Shannon divergence over tokens.
    punctuation is any token made only of Unicode punctuation; Clark et al. count "." and ",".
    With --file, each statistic is averaged per text, then over the texts (every text weighs
    the same); Clark et al. average over all tokens of their data. With --words, every statistic
    is over words: previous and next are the words beside, distance counts words.
    """
    from attnviz.api import functions
    from attnviz.api.models import load
    from attnviz.output.batch import PROGRESS_MIN_TEXTS, batch_folder_name, check_lengths, read_texts
    from attnviz.output.runs import run_folder_name
    from attnviz.render import terminal

    if text is not None and file is not None:
        raise AttnvizError("give either a TEXT or --file PATH, not both")
    if text is None and file is None:
        raise AttnvizError("missing argument 'TEXT': give a text, or --file PATH with one text per line")
    check_text(text)
    lines = read_texts(file) if file is not None else None
    texts = [entry.text for entry in lines] if lines is not None else [text]
    refuse_cross_over_every_layer(stack.value if stack else None)
    functions.refuse_before_loading(model, stack.value if stack else None)
    target = run_target(out, batch_folder_name(file) if file else run_folder_name(text))
    handle = load(model, device.value, allow_pickle=allow_pickle, cache=False)
    if lines is not None:  # named by line number, before any work
        check_lengths(handle.tokenizer, lines, handle.loaded.max_positions, truncate)

    with terminal.progress_bar(console, len(texts), "measuring heads", PROGRESS_MIN_TEXTS) as advance:
        result = functions.stats(
            texts, model=handle, heads=num_heads, weights=weights.value, seed=seed, causal=causal, truncate=truncate,
            stack=stack.value if stack else None, words=words, progress=advance,
        )  # fmt: skip

    notices = result.notices
    shown = list(notices)[:MAX_NOTICES_SHOWN]
    if len(notices) > len(shown):
        shown.append(f"… and {len(notices) - len(shown)} more such notes, one per text")
    terminal.print_notices(errors, shown)
    terminal.print_setup(
        console, result.first_run, handle.source, handle.device_label, handle.num_layers, len(texts), seed=seed
    )
    for table in terminal.stats_grid(result.stats, console.width, result.first_run.model_causal):
        console.print(table)
    console.print(terminal.labelled_heads_table(result.stats))
    write_run(out, target, "writing statistics…", lambda staging: result.write_files(staging, image_format.value))


@app.command(short_help="Every layer's heads at a glance, and attention rollout.")
def layers(
    text: str = typer.Argument(..., metavar="TEXT", help="The text to attend over, e.g. 我想吃酸菜鱼."),
    model: Optional[str] = ModelOption,
    num_heads: Optional[int] = EveryLayerHeadsOption,
    weights: Weights = WeightsOption,
    seed: int = SeedOption,
    causal: bool = EveryLayerCausalOption,
    stack: Optional[Stack] = EveryLayerStackOption,
    device: Device = DeviceOption,
    image_format: ImageFormat = FormatOption,
    out: Optional[Path] = OutOption,
    truncate: bool = TruncateOption,
    words: bool = WordsOption,
    measure: Measure = LayersMeasureOption,
    allow_pickle: bool = AllowPickleOption,
) -> None:
    """Every layer and head at a glance (layers.png) and attention rollout through the layers (rollout.png)."""
    from attnviz.api import functions
    from attnviz.api.models import load
    from attnviz.output.runs import run_folder_name
    from attnviz.render import terminal

    check_text(text)
    refuse_cross_over_every_layer(stack.value if stack else None)
    functions.refuse_before_loading(model, stack.value if stack else None)
    target = run_target(out, run_folder_name(text))
    handle = load(model, device.value, allow_pickle=allow_pickle, cache=False)
    result = functions.layers(
        text, model=handle, heads=num_heads, weights=weights.value, seed=seed, causal=causal, truncate=truncate,
        stack=stack.value if stack else None, words=words, measure=measure.value,
    )

    first = result.layer_runs[0]
    terminal.print_notices(errors, first.notices)
    terminal.print_setup(console, first, handle.source, handle.device_label, len(result.layer_runs), seed=seed)
    terminal.print_tokens(console, first)
    terminal.print_rollout(console, first.query_tokens, result.rollout, first.causal and not first.model_causal)
    if result.measures is not None and result.measures.flow is not None:
        terminal.print_rollout(console, first.query_tokens, result.measures.flow.normalised, name="flow")
    write_run(out, target, "writing figures…", lambda staging: result.write_files(staging, image_format.value))
