"""`attnviz stats` and `attnviz layers`: every head of every layer."""

from __future__ import annotations

from dataclasses import replace
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
    DeviceOption,
    TruncateOption,
    FormatOption,
    WeightsOption,
    SeedOption,
    EveryLayerCausalOption,
    AllowPickleOption,
    ModelOption,
)
from attnviz.cli.shared import MAX_NOTICES_SHOWN, build_spec, run_target
from attnviz.errors import AttnvizError
from attnviz.spec import check_text


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
    num_heads: Optional[int] = typer.Option(
        None, "--heads", help="Split each layer's projections into this many heads (default: the model's own)."
    ),
    weights: Weights = WeightsOption,
    seed: int = SeedOption,
    causal: bool = EveryLayerCausalOption,
    device: Device = DeviceOption,
    image_format: ImageFormat = FormatOption,
    out: Optional[Path] = typer.Option(
        None,
        "--out",
        "-o",
        help="Run folder to write into (default: a new folder under outputs/ named after the text or file).",
    ),
    truncate: bool = TruncateOption,
    allow_pickle: bool = AllowPickleOption,
) -> None:
    """What every head of every layer does: entropy, [CLS], [SEP], previous/next token, labels; stats.csv and .json.

    The statistics of Clark et al. 2019, three of them defined otherwise. js_distance is the
    Jensen-Shannon distance (the square root of the divergence, base-2 logarithms, 0 to 1)
    averaged over queries; Clark et al. sum the Jensen-Shannon divergence over tokens.
    punctuation is any token made only of Unicode punctuation; Clark et al. count "." and ",".
    With --file, each statistic is averaged per text, then over the texts (every text weighs
    the same); Clark et al. average over all tokens of their data.
    """
    from attnviz.analysis.measure import measure_heads
    from attnviz.models.loading import load_model
    from attnviz.models.tokens import text_truncations
    from attnviz.output.batch import PROGRESS_MIN_TEXTS, batch_folder_name, check_lengths, read_texts
    from attnviz.output.runs import StagedRunFolder, run_folder_name
    from attnviz.output.stats_export import write_stats_csv, write_stats_json
    from attnviz.pipeline import device_label, resolve_device, resolve_num_heads, run_attention
    from attnviz.render import terminal
    from attnviz.render.stats_figures import write_js_distance

    if text is not None and file is not None:
        raise AttnvizError("give either a TEXT or --file PATH, not both")
    if text is None and file is None:
        raise AttnvizError("missing argument 'TEXT': give a text, or --file PATH with one text per line")
    check_text(text)
    lines = read_texts(file) if file is not None else None
    texts = [entry.text for entry in lines] if lines is not None else [text]
    target = run_target(out, batch_folder_name(file) if file else run_folder_name(text))
    device_name = resolve_device(device.value)
    loaded = load_model(model, device_name, allow_pickle=allow_pickle)
    if lines is not None:
        check_lengths(loaded.tokenizer, lines, loaded.max_positions, truncate)
    spec = build_spec(
        model, loaded, device_name, layer=None, num_heads=resolve_num_heads(loaded, num_heads), weights=weights.value,
        seed=seed, causal=causal, kv_text=None, truncate=truncate,
    )

    with terminal.progress_bar(console, len(texts), "measuring heads", PROGRESS_MIN_TEXTS) as advance:
        result, notices = measure_heads(loaded, texts, spec, advance=advance)
    # what the terminal and stats.json say about the setup: the first text through layer 0
    (first_run,) = run_attention(loaded, texts[:1], replace(spec, layer=0))
    truncated = text_truncations(loaded.tokenizer, texts, loaded.max_positions) if truncate else [None] * len(texts)

    shown = list(notices)[:MAX_NOTICES_SHOWN]
    if len(notices) > len(shown):
        shown.append(f"… and {len(notices) - len(shown)} more such notes, one per text")
    terminal.print_notices(errors, shown)
    terminal.print_setup(
        console, first_run, loaded.source, device_label(device_name), loaded.num_layers, len(texts), seed=seed
    )
    for table in terminal.stats_grid(result, console.width):
        console.print(table)
    console.print(terminal.labelled_heads_table(result))

    folder = StagedRunFolder(target, unique=out is None)
    with console.status("writing statistics…"), folder as staging:
        written = [
            write_stats_csv(result, staging / "stats.csv"),
            write_stats_json(result, texts, truncated, first_run, spec, staging / "stats.json"),
            write_js_distance(result.js_distance, first_run, texts, staging, image_format.value, seed=seed),
        ]
    terminal.print_files(console, folder.final, [folder.final / path.name for path in written])


@app.command(short_help="Every layer's heads at a glance, and attention rollout.")
def layers(
    text: str = typer.Argument(..., metavar="TEXT", help="The text to attend over, e.g. 我想吃酸菜鱼."),
    model: Optional[str] = ModelOption,
    num_heads: Optional[int] = typer.Option(
        None, "--heads", help="Split each layer's projections into this many heads (default: the model's own)."
    ),
    weights: Weights = WeightsOption,
    seed: int = SeedOption,
    causal: bool = EveryLayerCausalOption,
    device: Device = DeviceOption,
    image_format: ImageFormat = FormatOption,
    out: Optional[Path] = typer.Option(
        None,
        "--out",
        "-o",
        help="Run folder to write into (default: a new folder under outputs/ named after the text).",
    ),
    truncate: bool = TruncateOption,
    allow_pickle: bool = AllowPickleOption,
) -> None:
    """Every layer and head at a glance (layers.png) and attention rollout through the layers (rollout.png)."""
    from attnviz.analysis.rollout import attention_rollout
    from attnviz.models.loading import load_model
    from attnviz.output.runs import StagedRunFolder, run_folder_name
    from attnviz.output.stats_export import write_rollout_json
    from attnviz.pipeline import device_label, resolve_device, resolve_num_heads, run_layers
    from attnviz.render import terminal
    from attnviz.render.stats_figures import write_layers_grid, write_rollout

    check_text(text)
    target = run_target(out, run_folder_name(text))
    device_name = resolve_device(device.value)
    loaded = load_model(model, device_name, allow_pickle=allow_pickle)
    spec = build_spec(
        model, loaded, device_name, layer=None, num_heads=resolve_num_heads(loaded, num_heads), weights=weights.value,
        seed=seed, causal=causal, kv_text=None, truncate=truncate,
    )
    (layer_runs,) = run_layers(loaded, [text], spec)
    rollout = attention_rollout([run.attention for run in layer_runs])  # (N, N)

    first = layer_runs[0]
    terminal.print_notices(errors, first.notices)
    terminal.print_setup(console, first, loaded.source, device_label(device_name), len(layer_runs), seed=seed)
    terminal.print_tokens(console, first)
    terminal.print_rollout(console, first.query_tokens, rollout, first.causal)

    folder = StagedRunFolder(target, unique=out is None)
    with console.status("writing figures…"), folder as staging:
        written = [
            write_layers_grid(layer_runs, staging, image_format.value, seed=seed),
            write_rollout(layer_runs, rollout, staging, image_format.value, seed=seed),
            write_rollout_json(layer_runs, rollout, spec, staging / "rollout.json"),
        ]
    terminal.print_files(console, folder.final, [folder.final / path.name for path in written])
