"""The command line: parse options, call the stages, print. Nothing else imports this module.

Heavy libraries (torch, transformers, matplotlib) are imported inside the commands,
so that `attnviz --help` stays instant.
"""

from __future__ import annotations

import os
import sys
from enum import Enum
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console

try:  # typer 0.2x vendors click; older typers use click itself
    from typer._click.exceptions import UsageError
except ImportError:
    from click.exceptions import UsageError

from attnviz.errors import AttnvizError

app = typer.Typer(
    help="See and check what multi-head attention does, with real BERT weights.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
console = Console(highlight=False)
errors = Console(stderr=True, highlight=False, markup=False)

DEFAULT_OUTPUTS = Path("outputs")


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


ModelOption = typer.Option(
    None,
    "--model",
    "-m",
    help="Hugging Face hub id or local folder of a BERT model. "
    "[default: bert-base-chinese; offline, the bundled all-MiniLM-L6-v2]",
    show_default=False,
)


@app.command()
def heads(
    text: str = typer.Argument(..., help="The text to attend over, e.g. 我想吃酸菜鱼."),
    model: Optional[str] = ModelOption,
    layer: int = typer.Option(0, "--layer", "-l", help="BERT layer whose attention weights and input to use."),
    num_heads: Optional[int] = typer.Option(
        None, "--heads", help="Split the projections into this many heads [default: the model's own]."
    ),
    weights: Weights = typer.Option(Weights.pretrained, help="BERT's trained projections, or a fresh random layer."),
    seed: int = typer.Option(0, help="Seed for --weights random."),
    kv: Optional[str] = typer.Option(
        None, "--kv", help="Cross-attention: keys and values from this text, queries from TEXT."
    ),
    causal: bool = typer.Option(False, "--causal", help="Mask future keys (each token sees only itself and earlier)."),
    device: Device = typer.Option(Device.auto, help="Where to run: auto is the GPU when torch sees one."),
    image_format: ImageFormat = typer.Option(ImageFormat.png, "--format", help="Image file format."),
    out: Optional[Path] = typer.Option(
        None, "--out", "-o", help="Run folder to write into [default: a new folder under outputs/ named after the text]."
    ),
    truncate: bool = typer.Option(False, help="Cut texts longer than the model's positions instead of refusing them."),
    allow_pickle: bool = typer.Option(
        False, help="Let a local model whose only weights are a pickle file load (unpickling can run code)."
    ),
) -> None:
    """Per-head attention heatmaps, a summary table and attention.json for one text."""
    from attnviz.analysis import summarize_heads
    from attnviz.export import write_attention_json
    from attnviz.heatmap import write_head_heatmaps, write_heads_grid
    from attnviz.loading import load_model
    from attnviz.pipeline import device_label, resolve_device, run_attention
    from attnviz.runs import StagedRunFolder, run_folder_name
    from attnviz import terminal

    for given, what in ((text, "the text"), (kv, "the --kv text")):
        if given is not None and not given.strip():
            raise AttnvizError(f"{what} is empty: give some words to attend over")
    target = out if out is not None else DEFAULT_OUTPUTS / run_folder_name(text)
    if target.exists() and not target.is_dir():
        raise AttnvizError(f"the output path {target} is a file, not a folder")
    device_name = resolve_device(device.value)
    loaded = load_model(model, device_name, allow_pickle=allow_pickle)
    (run,) = run_attention(
        loaded,
        [text],
        kv_text=kv,
        layer=layer,
        num_heads=num_heads,
        weights=weights.value,
        seed=seed,
        causal=causal,
        device=device_name,
        truncate=truncate,
    )

    terminal.print_notices(console, run.notices)
    terminal.print_setup(console, run, loaded.source, device_label(device_name))
    terminal.print_tokens(console, run)
    console.print(terminal.heads_table(run, summarize_heads(run.attention), console.width))

    folder = StagedRunFolder(target, unique=out is None)
    with console.status("writing heatmaps…"), folder as staging:
        written = write_head_heatmaps(run, staging, image_format.value)
        written.append(write_heads_grid(run, staging, image_format.value))
        written.append(write_attention_json(run, staging / "attention.json"))
    terminal.print_files(console, folder.final, [folder.final / path.name for path in written])


@app.command()
def models() -> None:
    """List the models that can be used now: the bundled one and BERT models in the local hub cache."""
    from attnviz.loading import list_models
    from attnviz import terminal

    console.print(terminal.models_table(list_models()))


def run(args: list[str] | None = None) -> int:
    """Run the command line and return its exit code; errors become one line on stderr."""
    try:
        result = app(args=args, prog_name="attnviz", standalone_mode=False)
    except UsageError as error:
        command = error.ctx.command_path if error.ctx else "attnviz"
        errors.print(f"error: {error.format_message()} (see {command} --help)", soft_wrap=True)
        return 2
    except AttnvizError as error:
        errors.print(f"error: {error}", soft_wrap=True)
        return 2
    except (KeyboardInterrupt, typer.Abort):
        errors.print("interrupted: nothing was written")
        return 130
    except Exception as error:  # a bug: still one line, the traceback on request
        if os.environ.get("ATTNVIZ_DEBUG"):
            raise
        errors.print(
            f"error: unexpected {type(error).__name__}: {error} (set ATTNVIZ_DEBUG=1 for the traceback)", soft_wrap=True
        )
        return 1
    return result if isinstance(result, int) else 0


def main() -> None:
    sys.exit(run())
