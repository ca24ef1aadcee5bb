"""The command line: parse options, call the stages and faces, print. Nothing imports this module.

Heavy libraries (torch, transformers, matplotlib) are imported inside the commands,
so that `attnviz --help` stays instant.
"""

from __future__ import annotations

import os
import signal
import sys
from dataclasses import replace
from enum import Enum
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console

try:  # typer 0.2x vendors click; older typers use click itself
    from typer._click.exceptions import UsageError
except ImportError:
    from click.exceptions import UsageError

from attnviz.errors import AttnvizError, Interrupted
from attnviz.spec import MAX_SEED, check_text, check_trace_texts, refuse_causal_cross_attention

app = typer.Typer(
    help="See and check what multi-head attention does, with a real BERT's parameters.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,  # click's plain help: a tenth of a second faster than Rich panels, and it wraps at 80 columns
)
console = Console(highlight=False)
errors = Console(stderr=True, highlight=False, markup=False)

DEFAULT_OUTPUTS = Path("outputs")
HELP_TYPE_WORDS = {"<str>": "TEXT", "<int>": "INTEGER", "<int range>": "INTEGER", "<path>": "PATH", "<float>": "NUMBER"}
INTERRUPTED = 130  # the shell's exit code for Ctrl-C (128 + SIGINT)


class Weights(str, Enum):
    pretrained = "pretrained"
    random = "random"


class Device(str, Enum):
    auto = "auto"
    cpu = "cpu"
    cuda = "cuda"


class ImageFormat(str, Enum):
    png = "png"
    svg = "svg"
    pdf = "pdf"


class Layout(str, Enum):  # attnviz.trace.LAYOUTS, and all (not imported: trace imports torch)
    view_permute = "view-permute"
    merged_batch = "merged-batch"
    fused_qkv = "fused-qkv"
    single_head = "single-head"
    all = "all"


class Mistake(str, Enum):  # attnviz.trace.MISTAKES
    view_without_permute = "view-without-permute"
    merge_without_permute = "merge-without-permute"


def _version(asked: bool) -> None:
    if asked:
        console.print(f"attnviz {package_version()}")
        raise typer.Exit()


@app.callback()
def _main(
    version: bool = typer.Option(
        False, "--version", callback=_version, is_eager=True, help="Print attnviz's version and exit."
    ),
) -> None:
    """See and check what multi-head attention does, with a real BERT's parameters."""


def package_version() -> str:
    """The installed package's version, else (running from a source tree) attnviz.__version__."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("attnviz")
    except PackageNotFoundError:
        from attnviz import __version__

        return __version__


def _help_types_as_words() -> None:
    """Write option types in --help as words (TEXT, INTEGER, PATH) and choices as [a|b].

    typer 0.2x writes them as <str>, <int>, <path>, <a|b>; click and older typers already
    write words, and have no display_type to wrap. An argument's type is its metavar (TEXT).
    """
    from typer import core

    if not hasattr(core.TyperArgument, "display_type") or getattr(core.TyperOption.display_type, "as_words", False):
        return
    for kind in (core.TyperArgument, core.TyperOption):
        shown = kind.display_type

        def display_type(self, ctx, _shown=shown):
            label = _shown(self, ctx)
            if label in HELP_TYPE_WORDS:
                return HELP_TYPE_WORDS[label]
            return f"[{label[1:-1]}]" if label.startswith("<") and label.endswith(">") else label

        display_type.as_words = True
        kind.display_type = display_type
    core.TyperArgument.display_type_rich = lambda self, ctx: None  # an argument's metavar (TEXT) says its type


_help_types_as_words()


# Options that several commands share, declared once.
DeviceOption = typer.Option(Device.auto, help="Where to run: auto is the GPU when torch sees one.")
TruncateOption = typer.Option(False, help="Cut texts longer than the model's positions instead of refusing them.")
FormatOption = typer.Option(ImageFormat.png, "--format", help="Image file format.")
WeightsOption = typer.Option(
    Weights.pretrained,
    help="The layer's parameters (W_q, W_k, W_v, W_o, not the attention weights): "
    "BERT's trained ones, or fresh random ones from --seed.",
)
SeedOption = typer.Option(0, min=0, max=MAX_SEED, help="Seed of the random parameters of --weights random.")
CausalOption = typer.Option(False, "--causal", help="Mask future keys (each token sees only itself and earlier).")
EveryLayerCausalOption = typer.Option(
    False,
    "--causal",
    help="Mask future keys in every layer: a causal mask over a bidirectional model's hidden states "
    "(each layer's input comes from BERT's own pass and already holds later tokens).",
)
AllowPickleOption = typer.Option(
    False, help="Let a model whose weights are pickle files (pytorch_model.bin, .bin shards) load (unpickling can run code)."
)
ModelOption = typer.Option(
    None,
    "--model",
    "-m",
    help="Hugging Face hub id or local folder of a BERT model. "
    "(default: bert-base-chinese; offline, the bundled all-MiniLM-L6-v2)",
    show_default=False,
)


@app.command(short_help="Heatmaps and a table of one layer's heads, for a text or a file of texts.")
def heads(
    text: Optional[str] = typer.Argument(
        None, metavar="TEXT", help="The text to attend over, e.g. 我想吃酸菜鱼. Or give --file.", show_default=False
    ),
    file: Optional[str] = typer.Option(
        None,
        "--file",
        "-f",
        metavar="PATH",
        help="A batch: one text per line (blank lines skipped; - reads standard input), "
        "one run folder per text and a summary.",
    ),
    model: Optional[str] = ModelOption,
    layer: int = typer.Option(0, "--layer", "-l", help="BERT layer whose parameters (W_q, W_k, W_v, W_o) and input to use."),
    num_heads: Optional[int] = typer.Option(
        None, "--heads", help="Split the projections into this many heads (default: the model's own)."
    ),
    weights: Weights = WeightsOption,
    seed: int = SeedOption,
    kv: Optional[str] = typer.Option(
        None, "--kv", help="Cross-attention: keys and values from this text, queries from TEXT."
    ),
    causal: bool = CausalOption,
    show_trace: bool = typer.Option(
        False, "--trace", help="Also print the shape trace of the heads (as attnviz trace) and write trace.json, trace.md."
    ),
    device: Device = DeviceOption,
    image_format: ImageFormat = FormatOption,
    out: Optional[Path] = typer.Option(
        None, "--out", "-o", help="Run folder to write into (default: a new folder under outputs/ named after the text)."
    ),
    truncate: bool = TruncateOption,
    allow_pickle: bool = AllowPickleOption,
) -> None:
    """Per-head attention heatmaps, a summary table and attention.json for one text, or each line of --file."""
    from attnviz.analysis.statistics import summarize_heads
    from attnviz.output.export import write_attention_json
    from attnviz.render.heatmap import write_heatmaps
    from attnviz.models.loading import load_model
    from attnviz.pipeline import device_label, resolve_device, resolve_num_heads, run_attention
    from attnviz.output.runs import StagedRunFolder, run_folder_name
    from attnviz.render import terminal

    if text is not None and file is not None:
        raise AttnvizError("give either a TEXT or --file PATH, not both")
    if text is None and file is None:
        raise AttnvizError("missing argument 'TEXT': give a text, or --file PATH with one text per line")
    check_text(text)
    check_text(kv, "the --kv text")
    if file is not None and show_trace:
        raise AttnvizError("--trace traces one text: for a batch use attnviz trace --file PATH")
    refuse_causal_cross_attention(kv, causal)
    if file is not None:
        return _heads_for_file(
            file,
            model=model,
            allow_pickle=allow_pickle,
            device=device.value,
            image_format=image_format.value,
            out=out,
            run_options=dict(
                kv_text=kv, layer=layer, num_heads=num_heads, weights=weights.value, seed=seed, causal=causal,
                truncate=truncate,
            ),
        )
    target = _run_target(out, run_folder_name(text))
    device_name = resolve_device(device.value)
    loaded = load_model(model, device_name, allow_pickle=allow_pickle)
    spec = _run_spec(
        model, loaded, device_name, layer=layer, num_heads=resolve_num_heads(loaded, num_heads), weights=weights.value,
        seed=seed, causal=causal, kv_text=kv, truncate=truncate,
    )
    (run,) = run_attention(loaded, [text], spec)

    terminal.print_notices(errors, run.notices)
    terminal.print_setup(console, run, loaded.source, device_label(device_name), seed=seed)
    terminal.print_tokens(console, run)
    console.print(terminal.heads_table(run, summarize_heads(run.attention, run.causal)))
    traced = None
    if show_trace:
        from attnviz.trace import trace_texts
        from attnviz.render.trace_render import print_trace

        traced = trace_texts(loaded, [text], spec)
        print_trace(console, traced, text_tokens=[run.query_tokens])

    folder = StagedRunFolder(target, unique=out is None)
    with console.status("writing heatmaps…"), folder as staging:
        written = write_heatmaps(run, staging, image_format.value, seed=seed)
        written.append(write_attention_json(run, spec, staging / "attention.json"))
        if traced is not None:
            from attnviz.output.trace_files import write_trace_files

            written += write_trace_files(traced, [run], spec, staging, image_format.value)
    terminal.print_files(console, folder.final, [folder.final / path.name for path in written])
    if traced is not None and not traced.agree:
        return _layouts_disagree(traced)


def _heads_for_file(
    file: str, *, model, allow_pickle: bool, device: str, image_format: str, out: Optional[Path], run_options: dict
) -> None:
    """`heads --file`: every line through the same layer, batch by batch; a folder per text."""
    from attnviz.output import batch
    from attnviz.render import terminal
    from attnviz.models.loading import load_model
    from attnviz.pipeline import device_label, resolve_device, resolve_num_heads
    from attnviz.output.runs import StagedRunFolder

    texts = batch.read_texts(file)
    target = _run_target(out, batch.batch_folder_name(file))
    if out is not None:
        batch.check_batch_target(target, batch.text_folder_names(texts))
    device_name = resolve_device(device)
    loaded = load_model(model, device_name, allow_pickle=allow_pickle)
    batch.check_lengths(loaded.tokenizer, texts, loaded.max_positions, run_options["truncate"])
    run_options["num_heads"] = resolve_num_heads(loaded, run_options["num_heads"])
    spec = _run_spec(model, loaded, device_name, **run_options)

    folder = StagedRunFolder(target, unique=out is None)
    progress = terminal.progress_bar(console, len(texts), "attention and heatmaps", batch.PROGRESS_MIN_TEXTS)
    with progress as advance, folder as staging:
        result = batch.write_batch(loaded, texts, staging, image_format, spec, on_text=lambda: advance(1))

    shown = result.notices[:MAX_NOTICES_SHOWN]
    if len(result.notices) > len(shown):
        shown.append(f"… and {len(result.notices) - len(shown)} more notices like these")
    terminal.print_notices(errors, shown)
    terminal.print_setup(console, result.first_run, loaded.source, device_label(device_name), seed=run_options["seed"])
    console.print(terminal.batch_table(result.rows, result.first_run.causal))
    numbers = [row["folder"].split("-", 1)[0] for row in result.rows]
    folders = result.rows[0]["folder"] if len(numbers) == 1 else f"{numbers[0]}-… to {numbers[-1]}-… (a folder per text)"
    terminal.print_files(console, folder.final, [folder.final / folders, *result.files])


MAX_NOTICES_SHOWN = 3  # over many texts: the first few notices, then a count


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
    from attnviz.output.batch import PROGRESS_MIN_TEXTS, batch_folder_name, check_lengths, read_texts
    from attnviz.models.loading import load_model
    from attnviz.analysis.measure import measure_heads
    from attnviz.pipeline import device_label, resolve_device, resolve_num_heads, run_attention
    from attnviz.output.runs import StagedRunFolder, run_folder_name
    from attnviz.output.stats_export import write_stats_csv, write_stats_json
    from attnviz.render.stats_figures import write_js_distance
    from attnviz.models.tokens import text_truncations
    from attnviz.render import terminal

    if text is not None and file is not None:
        raise AttnvizError("give either a TEXT or --file PATH, not both")
    if text is None and file is None:
        raise AttnvizError("missing argument 'TEXT': give a text, or --file PATH with one text per line")
    check_text(text)
    lines = read_texts(file) if file is not None else None
    texts = [entry.text for entry in lines] if lines is not None else [text]
    target = _run_target(out, batch_folder_name(file) if file else run_folder_name(text))
    device_name = resolve_device(device.value)
    loaded = load_model(model, device_name, allow_pickle=allow_pickle)
    if lines is not None:
        check_lengths(loaded.tokenizer, lines, loaded.max_positions, truncate)
    spec = _run_spec(
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
    from attnviz.pipeline import device_label, resolve_device, resolve_num_heads, run_layers
    from attnviz.output.runs import StagedRunFolder, run_folder_name
    from attnviz.output.stats_export import write_rollout_json
    from attnviz.render.stats_figures import write_layers_grid, write_rollout
    from attnviz.render import terminal

    check_text(text)
    target = _run_target(out, run_folder_name(text))
    device_name = resolve_device(device.value)
    loaded = load_model(model, device_name, allow_pickle=allow_pickle)
    spec = _run_spec(
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


@app.command(short_help="One layer's projections split into different numbers of heads.")
def compare(
    text: str = typer.Argument(..., metavar="TEXT", help="The text to attend over, e.g. 我想吃酸菜鱼."),
    head_counts: Optional[str] = typer.Option(
        None,
        "--heads",
        metavar="COUNTS",
        help="Comma list of head counts, each dividing the model size, e.g. 1,4,12 "
        "(default: 1, 4 and the model's own).",
        show_default=False,
    ),
    weights: str = typer.Option(
        "pretrained",
        "--weights",
        metavar="PARAMETERS",
        help="The layer's parameters, as a comma list: pretrained (BERT's), random (from --seed), "
        "or pretrained,random to set them side by side.",
    ),
    model: Optional[str] = ModelOption,
    layer: int = typer.Option(0, "--layer", "-l", help="BERT layer whose projections and input to use."),
    seed: int = typer.Option(0, min=0, max=MAX_SEED, help="Seed of the random parameters."),
    device: Device = DeviceOption,
    image_format: ImageFormat = FormatOption,
    out: Optional[Path] = typer.Option(
        None, "--out", "-o", help="Run folder to write into (default: a new folder under outputs/ named after the text)."
    ),
    truncate: bool = TruncateOption,
    allow_pickle: bool = AllowPickleOption,
) -> None:
    """The same W_q, W_k, W_v split into 1, 4, 12... heads, and BERT's parameters beside random ones."""
    from attnviz.analysis.compare import compare_splits, default_head_counts, parse_head_counts, parse_weights
    from attnviz.render.compare_figures import write_comparison_figure
    from attnviz.models.loading import load_model
    from attnviz.output.compare_json import write_comparison_json
    from attnviz.pipeline import device_label, resolve_device
    from attnviz.output.runs import StagedRunFolder, run_folder_name
    from attnviz.render import terminal

    check_text(text)
    counts = parse_head_counts(head_counts) if head_counts is not None else None
    weights_list = parse_weights(weights)
    target = _run_target(out, run_folder_name(text))
    device_name = resolve_device(device.value)
    loaded = load_model(model, device_name, allow_pickle=allow_pickle)
    counts = counts or default_head_counts(loaded.hidden_size, loaded.num_heads)
    spec = _run_spec(  # what the splits share; each split's head count and weights are its own
        model, loaded, device_name, layer=layer, num_heads=None, weights=None, seed=seed, causal=False, kv_text=None,
        truncate=truncate,
    )
    splits = compare_splits(loaded, text, counts, weights_list, spec)

    first = splits[0].run
    terminal.print_notices(errors, first.notices)
    terminal.print_compare_setup(console, first, loaded.source, device_label(device_name), weights_list, seed)
    terminal.print_tokens(console, first)
    console.print(terminal.compare_table(splits))

    folder = StagedRunFolder(target, unique=out is None)
    with console.status("drawing the comparison…"), folder as staging:
        written = [
            write_comparison_figure(splits, staging, image_format.value, seed=seed),
            write_comparison_json(splits, spec, staging / "compare.json"),
        ]
    terminal.print_files(console, folder.final, [folder.final / path.name for path in written])


@app.command(short_help='Why attention needs position embeddings.')
def position(
    text: str = typer.Argument(..., metavar="TEXT", help="The text to permute, e.g. 我想吃酸菜鱼."),
    permutation: Optional[str] = typer.Option(
        None,
        "--permutation",
        "-p",
        help="New order of the token positions, [CLS] and [SEP] included, e.g. 0,2,1,3 "
        "(default: [CLS] and [SEP] stay, the tokens between them reversed).",
        show_default=False,
    ),
    head: Optional[int] = typer.Option(
        None, "--head", help="Head to draw (default: the one the position embeddings change most).", show_default=False
    ),
    model: Optional[str] = ModelOption,
    device: Device = DeviceOption,
    image_format: ImageFormat = FormatOption,
    out: Optional[Path] = typer.Option(
        None, "--out", "-o", help="Run folder to write into (default: a new folder under outputs/ named after the text)."
    ),
    allow_pickle: bool = AllowPickleOption,
) -> None:
    """Why attention needs position embeddings: permute the tokens, with and without them."""
    from attnviz.render.compare_figures import write_position_figure
    from attnviz.models.loading import load_model
    from attnviz.pipeline import device_label, resolve_device
    from attnviz.analysis.position import LAYER, position_experiment
    from attnviz.output.position_json import write_position_json
    from attnviz.output.runs import StagedRunFolder, run_folder_name
    from attnviz.render import terminal

    check_text(text)
    target = _run_target(out, run_folder_name(text))
    device_name = resolve_device(device.value)
    loaded = load_model(model, device_name, allow_pickle=allow_pickle)
    spec = _run_spec(  # position runs layer 0 with the model's own parameters and heads
        model, loaded, device_name, layer=LAYER, num_heads=loaded.num_heads, weights="pretrained", seed=0,
        causal=False, kv_text=None, truncate=False,
    )
    result = position_experiment(loaded, text, permutation, head, device_name)

    terminal.print_notices(errors, result.notices)
    terminal.print_position(console, result, loaded.source, device_label(device_name))

    folder = StagedRunFolder(target, unique=out is None)
    with console.status("drawing the maps…"), folder as staging:
        written = [
            write_position_figure(result, staging, image_format.value),
            write_position_json(result, spec, staging / "position.json"),
        ]
    terminal.print_files(console, folder.final, [folder.final / path.name for path in written])


@app.command(short_help='Every split and merge of the heads, step by step, with real shapes.')
def trace(
    text: Optional[str] = typer.Argument(
        None, metavar="TEXT", help="The text to trace, e.g. 我想吃酸菜鱼. Or give --file.", show_default=False
    ),
    batch: list[str] = typer.Option(
        [], "--batch", "-b", metavar="TEXT", help="Another text in the same padded batch (repeatable): shows the padding path.",
        show_default=False,
    ),
    file: Optional[str] = typer.Option(
        None, "--file", "-f", metavar="PATH", help="A padded batch: one text per line (blank lines skipped; - reads standard input)."
    ),
    layout: Layout = typer.Option(
        Layout.view_permute, "--layout", help="How the heads are split and merged, as a tutorial writes it; "
        "all runs every layout on the same weights and checks that they agree.",
    ),
    mistake: Optional[Mistake] = typer.Option(
        None, "--mistake", help="Make a common reshape mistake in view-permute and show where it goes wrong.",
        show_default=False,
    ),
    model: Optional[str] = ModelOption,
    layer: int = typer.Option(0, "--layer", "-l", help="BERT layer whose parameters (W_q, W_k, W_v, W_o) and input to use."),
    num_heads: Optional[int] = typer.Option(
        None, "--heads", help="Split the projections into this many heads (default: the model's own)."
    ),
    weights: Weights = WeightsOption,
    seed: int = SeedOption,
    kv: Optional[str] = typer.Option(
        None, "--kv", help="Cross-attention: keys and values from this text, queries from TEXT (not with fused-qkv)."
    ),
    causal: bool = CausalOption,
    device: Device = DeviceOption,
    image_format: ImageFormat = typer.Option(ImageFormat.png, "--format", help="Image format of --mistake's heatmaps."),
    out: Optional[Path] = typer.Option(
        None, "--out", "-o", help="Run folder to write into (default: a new folder under outputs/ named after the text)."
    ),
    truncate: bool = TruncateOption,
    allow_pickle: bool = AllowPickleOption,
) -> int:
    """Every split and merge of the heads, step by step with the real shapes; trace.json and trace.md.

    Exits 1 when the layouts disagree by more than 1e-5 (the files are still written).
    """
    from attnviz.output.batch import batch_folder_name, read_texts
    from attnviz.models.loading import load_model
    from attnviz.pipeline import device_label, resolve_device, resolve_num_heads, run_attention
    from attnviz.output.runs import StagedRunFolder, run_folder_name
    from attnviz.trace import LAYOUTS, trace_texts
    from attnviz.output.trace_files import write_trace_files
    from attnviz.render.trace_render import print_trace
    from attnviz.render import terminal

    if text is not None and file is not None:
        raise AttnvizError("give either a TEXT or --file PATH, not both")
    if text is None and file is None:
        raise AttnvizError("missing argument 'TEXT': give a text, or --file PATH with one text per line")
    if file is not None and batch:
        raise AttnvizError("--batch adds texts to TEXT: put them in the --file instead")
    texts = [entry.text for entry in read_texts(file)] if file is not None else [text, *batch]
    for given in texts:
        check_text(given)
    check_text(kv, "the --kv text")
    refuse_causal_cross_attention(kv, causal)
    check_trace_texts(texts)
    target = _run_target(out, batch_folder_name(file) if file else run_folder_name(text))
    device_name = resolve_device(device.value)
    loaded = load_model(model, device_name, allow_pickle=allow_pickle)
    spec = _run_spec(
        model, loaded, device_name, layer=layer, num_heads=resolve_num_heads(loaded, num_heads), weights=weights.value,
        seed=seed, causal=causal, kv_text=kv, truncate=truncate,
    )
    traced = trace_texts(
        loaded, texts, spec, layouts=LAYOUTS if layout == Layout.all else (layout.value,),
        mistake=mistake.value if mistake else None,
    )
    runs = run_attention(loaded, texts, spec)  # tokens, notices and heatmaps

    terminal.print_notices(errors, [notice for run in runs for notice in run.notices])
    terminal.print_setup(console, runs[0], loaded.source, device_label(device_name), seed=seed)
    terminal.print_tokens(console, runs[0])
    print_trace(console, traced, text_tokens=[run.query_tokens for run in runs])

    folder = StagedRunFolder(target, unique=out is None)
    figure_notes: list[str] = []  # figures capped in size or thinned
    with console.status("writing the trace…"), folder as staging:
        written = write_trace_files(traced, runs, spec, staging, image_format.value, figure_notes)
    terminal.print_files(console, folder.final, [folder.final / path.name for path in written])
    for note in figure_notes:
        errors.print(f"note: {note}", soft_wrap=True)
    return 0 if traced.agree else _layouts_disagree(traced)


def _layouts_disagree(traced) -> int:
    """A check that failed is a bug, not bad input: one line on stderr and exit code 1."""
    worst = max(traced.checks, key=lambda check: max(check.weights_diff, check.output_diff))
    errors.print(
        f"error: the layouts disagree: {worst.layout} differs from {worst.reference} by "
        f"{max(worst.weights_diff, worst.output_diff):.1e}, more than 1e-05 (see trace.json)",
        soft_wrap=True,
    )
    return 1


@app.command(short_help='List the models that can be used now.')
def models() -> None:
    """List the models that can be used now: the bundled one and BERT models in the local hub cache."""
    from attnviz.models.loading import list_models
    from attnviz.render import terminal

    console.print(terminal.models_table(list_models()))


def _run_spec(model: Optional[str], loaded, device: str, **settings):
    """The run's settings (attnviz.spec.RunSpec), built once: the options as given, with the model that loaded."""
    from attnviz.spec import run_spec

    return run_spec(loaded, model, device=device, **settings)


def _run_target(out: Optional[Path], default_name: str) -> Path:
    """--out, or a folder under outputs/ named for the run; checked before any work is done."""
    from attnviz.output.runs import check_target

    return check_target(out if out is not None else DEFAULT_OUTPUTS / default_name)


def run(args: list[str] | None = None) -> int:
    """Run the command line and return its exit code; errors become one line on stderr."""
    from attnviz.runs import forget_written_folders

    forget_written_folders()
    try:
        _refuse_empty_out(sys.argv[1:] if args is None else args)
        result = app(args=args, prog_name="attnviz", standalone_mode=False)
    except UsageError as error:
        command = error.ctx.command_path if error.ctx else "attnviz"
        errors.print(f"error: {error.format_message()} (see {command} --help)", soft_wrap=True)
        return 2
    except AttnvizError as error:
        errors.print(f"error: {error}", soft_wrap=True)
        return 2
    except Interrupted as interrupted:
        return _interrupted(interrupted)
    except (KeyboardInterrupt, typer.Abort):  # Python's own Ctrl-C, where attnviz's handlers are not set
        return _interrupted(Interrupted(signal.SIGINT))
    except Exception as error:  # a bug: still one line, the traceback on request
        if os.environ.get("ATTNVIZ_DEBUG"):
            raise
        errors.print(
            f"error: unexpected {type(error).__name__}: {error} (set ATTNVIZ_DEBUG=1 for the traceback)", soft_wrap=True
        )
        return 1
    if result == INTERRUPTED:  # typer turns a KeyboardInterrupt into this exit code; run folders clean up on it
        return _interrupted(Interrupted(signal.SIGINT))
    return result if isinstance(result, int) else 0


def _refuse_empty_out(args: list[str]) -> None:
    """--out "" would mean the current folder (Path("") is "."): refuse it, before typer turns it into "."."""
    options = args[: args.index("--")] if "--" in args else args
    for option, value in zip(options, [*options[1:], None]):
        if option == "--out=" or option in ("--out", "-o") and value == "":
            raise AttnvizError("--out is empty: give a folder (--out . for the current one)")


def _interrupted(interrupted: Interrupted) -> int:
    from attnviz.runs import interrupted_message

    errors.print(interrupted_message(interrupted.written), soft_wrap=True)
    return interrupted.exit_code


def main() -> None:
    """The `attnviz` command: signals end a run cleanly, a closed pipe loses no files."""
    from attnviz.output.runs import handle_signals
    from attnviz.output.streams import PipeSafeStream

    handle_signals()
    if sys.stdout is not None:  # None: started with stdout closed (>&-); Rich then prints nowhere
        sys.stdout = PipeSafeStream(sys.stdout)
    if sys.stderr is not None:
        sys.stderr = PipeSafeStream(sys.stderr)
    sys.exit(run())
