"""The command line's options: the Typer app, its consoles, the choices and the options several commands share.

A run's option is declared here once (its flag and help) and once in api/options.py (RunOptions'
field); a command offers it by naming its parameter as the field (model, layer, heads, ...) and passing it to
run_options by that name (run_options(model=model, layer=layer, ...)): the run's RunOptions, which the command hands
to cli/shared.run_command. Heavy libraries (torch,
transformers, matplotlib) are imported inside the commands, so that `attnviz --help` stays instant.
"""

from __future__ import annotations

from enum import Enum
from pathlib import Path

import typer
from rich.console import Console

from attnviz.api.options import RunOptions
from attnviz.models.families import DECODER, supported_names
from attnviz.spec import MAX_HEAD_SIZE, MAX_SEED
from attnviz.version import package_version

app = typer.Typer(
    help="See and check what multi-head attention does, with a real model's parameters.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,  # click's plain help: a tenth of a second faster than Rich panels, and it wraps at 80 columns
)
console = Console(highlight=False)
errors = Console(stderr=True, highlight=False, markup=False)

DEFAULT_OUTPUTS = Path("outputs")

# Every integer option has a maximum: click takes any integer, and one past a C integer ends in an OverflowError deep
# in a run. These are past any model or machine; the commands' own checks say more (a layer the model has not).
MAX_LAYER = 1023  # --layer: the deepest models have ~128 layers
MAX_HEADS = 4096  # --heads, --head
MAX_COUNT = 1 << 24  # tokens, positions, lines, megabytes: 16,777,216


class Weights(str, Enum):
    pretrained = "pretrained"
    random = "random"


class Device(str, Enum):
    auto = "auto"
    cpu = "cpu"
    cuda = "cuda"


class Dtype(str, Enum):  # attnviz.api.arguments.DTYPES
    auto = "auto"
    float32 = "float32"
    bfloat16 = "bfloat16"
    float16 = "float16"


class ImageFormat(str, Enum):
    png = "png"
    svg = "svg"
    pdf = "pdf"


class Layout(str, Enum):  # attnviz.tracing.LAYOUTS, and all (not imported: trace imports torch)
    view_permute = "view-permute"
    merged_batch = "merged-batch"
    fused_qkv = "fused-qkv"
    single_head = "single-head"
    all = "all"


class Stack(str, Enum):  # attnviz.spec.STACKS
    encoder = "encoder"
    decoder = "decoder"
    cross = "cross"


class Engine(str, Enum):  # attnviz.output.corpus_stats.ENGINES and attnviz.output.retrieval_heads.ENGINES
    local = "local"
    ray = "ray"


class Figures(str, Enum):  # attnviz.output.batch.FIGURES
    all = "all"
    grid = "grid"
    none = "none"


class Component(str, Enum):  # attnviz.analysis.patching.COMPONENTS: what of a head patch patches
    out = "out"
    q = "q"
    k = "k"
    v = "v"
    pattern = "pattern"


class Mistake(str, Enum):  # attnviz.tracing.MISTAKES
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
    """See and check what multi-head attention does, with a real model's parameters."""


def _quiet(quiet: bool) -> bool:
    console.quiet = quiet  # Rich prints nothing on a quiet console; print_files still prints the run folder
    return quiet


def run_options(**given) -> RunOptions:
    """The run's RunOptions from a command's parameters, each passed by its field's name (model=model, layer=layer):
    a choice becomes its value ("random"); the options a command does not offer keep RunOptions' defaults."""
    return RunOptions(**{name: value.value if isinstance(value, Enum) else value for name, value in given.items()})


# Options that several commands share, declared once.
DeviceOption = typer.Option(Device.auto, help="Where to run: auto is the GPU when torch sees one.")
DtypeOption = typer.Option(
    Dtype.auto,
    help="What the model loads and computes in: auto is the checkpoint's own on a GPU (config.json's torch_dtype), "
    "float32 on the CPU. attnviz's layer computes in it too; the weights written are float32 numbers.",
)
TruncateOption = typer.Option(False, help="Cut texts longer than the model's positions instead of refusing them.")


def _memory_option(past_it: str):
    """--memory (RunOptions.memory), with what happens past the budget for the commands that take it."""
    budget = "The most memory a block of attention may take (default: 512 on the CPU, half the GPU's free memory). "
    return typer.Option(None, "--memory", min=1, max=MAX_COUNT, metavar="MB", help=budget + past_it)


MemoryOption = _memory_option(
    "Past it the weights are computed a block of queries at a time; a map past 64 MB (or past --memory) is a temporary "
    "file (heads --save-map writes it as attention.npy)."
)
EveryLayerMemoryOption = _memory_option(
    "Past it, or when a layer's map passes 64 MB (or --memory), every layer's weights are computed a block of "
    "queries at a time and no map is held whole."
)
FormatOption = typer.Option(ImageFormat.png, "--format", help="Image file format.")
WeightsOption = typer.Option(
    Weights.pretrained,
    help="The layer's parameters (W_q, W_k, W_v, W_o, not the attention weights): "
    "the model's trained ones, or fresh random ones from --seed.",
)
SeedOption = typer.Option(0, min=0, max=MAX_SEED, help="Seed of the random parameters of --weights random.")
CausalOption = typer.Option(
    False, "--causal", help="Mask future keys (each token sees only itself and earlier); a decoder's attention is causal already."
)
EveryLayerCausalOption = typer.Option(
    False,
    "--causal",
    help="Mask future keys in every layer: a causal mask over a bidirectional model's hidden states "
    "(each layer's input comes from the model's own pass and already holds later tokens); "
    "a decoder's attention is causal already.",
)
LayerOption = typer.Option(
    0, "--layer", "-l", max=MAX_LAYER, help="Model layer whose parameters (W_q, W_k, W_v, W_o) and input to use."
)
StackOption = typer.Option(
    None,
    "--stack",
    help="Which attention of an encoder-decoder (BART, Marian, T5): the encoder's self-attention (default), "
    "the decoder's (causal; the encoder reads the same text), or the decoder's cross-attention over the "
    "encoder (--kv gives the source text; without it each text is its own source).",
    show_default=False,
)
EveryLayerStackOption = typer.Option(
    None,
    "--stack",
    help="Which self-attention of an encoder-decoder (BART, Marian, T5): the encoder's (default) or the "
    "decoder's (causal); cross is refused here: for cross-attention use attnviz heads --stack cross.",
    show_default=False,
)
KvOption = typer.Option(None, "--kv", help="Cross-attention: keys and values from this text, queries from TEXT.")
HeadsOption = typer.Option(None, "--heads", max=MAX_HEADS, help="Split the projections into this many heads (default: the model's own).")
DQOption = typer.Option(
    None, "--d-q", max=MAX_HEAD_SIZE, metavar="N", help="The single-head tutorial's own d_q: W_q and W_k map D to d_q, the scale is 1/sqrt(d_q) "
    "(with --layout single-head --weights random; default D).", show_default=False,
)
DOutOption = typer.Option(
    None, "--d-out", max=MAX_HEAD_SIZE, metavar="N", help="The single-head tutorial's own d_out: W_v maps D to d_out, no W_o "
    "(with --layout single-head --weights random; default D).", show_default=False,
)
EveryLayerHeadsOption = typer.Option(
    None, "--heads", max=MAX_HEADS, help="Split each layer's projections into this many heads (default: the model's own)."
)
HeadOption = typer.Option(
    None,
    "--head",
    max=MAX_HEADS - 1,
    metavar="N",
    help="Draw one head: head N as the model numbers it (from 0, as the figures and tables do): only head_NN.png and "
    "its row of the table; attention.json and report.html keep every head. Not --heads, which re-splits the layer.",
    show_default=False,
)
WindowOption = typer.Option(
    None,
    "--window",
    metavar="Q0:Q1,K0:K1",
    help="Also draw one region of each head's map (or --head N's) at full resolution with its tokens: queries Q0 to "
    "Q1 - 1, keys K0 to K1 - 1 (window_head_NN.png; an end left out is the map's; at most 512 a side). "
    "The whole-map heatmaps are still written.",
    show_default=False,
)
FiguresOption = typer.Option(
    None,
    "--figures",
    help="Which heatmaps to write: all (every head's head_NN.png and the grid heads.png), grid (heads.png only) "
    "or none (attention.json and the report only). Default: all for a TEXT, grid for --file.",
    show_default=False,
)
QuietOption = typer.Option(
    False,
    "--quiet",
    "-q",
    callback=_quiet,
    help="Print nothing but the run folder's path (one line); notes and errors still go to stderr.",
)
OutOption = typer.Option(
    None, "--out", "-o", help="Run folder to write into (default: a new folder under outputs/ named after the text)."
)
FileOutOption = typer.Option(  # for the commands that also take --file
    None,
    "--out",
    "-o",
    help="Run folder to write into (default: a new folder under outputs/ named after the text, or after the --file).",
)
AllowPickleOption = typer.Option(
    False, help="Let a model whose weights are pickle files (pytorch_model.bin, .bin shards) load (unpickling can run code)."
)
LayerAtATimeOption = typer.Option(
    False,
    help="Read a layer's weights at a time from the checkpoint's files as the layer runs (memory: about one layer's "
    "weights, not the model's). Taken anyway by a checkpoint whose weights pass 1 GB; BERT loads whole.",
)
ModelOption = typer.Option(
    None,
    "--model",
    "-m",
    help=f"Hugging Face hub id, local folder or GGUF file (.gguf, Llama's) of a model ({supported_names()}). "
    "(default: bert-base-chinese; offline, the bundled all-MiniLM-L6-v2)",
    show_default=False,
)
# generate's and patch's: the default model (an encoder) cannot run them, so their help says what can
GenerateModelOption = typer.Option(
    None,
    "--model",
    "-m",
    help=f"Hugging Face hub id, local folder or GGUF file of a decoder ({supported_names(DECODER)}); smollm2: the bundled "
    "SmolLM2-135M-Instruct. (no default that generates: without --model the default model, bert-base-chinese, an "
    "encoder, is refused; give --model smollm2)",
    show_default=False,
)
PatchModelOption = typer.Option(
    None,
    "--model",
    "-m",
    help=f"Hugging Face hub id or local folder of a decoder, an encoder-decoder or an encoder saved with its "
    f"masked-LM head ({supported_names()}); smollm2: the bundled decoder. (default: bert-base-chinese, read at a "
    "[MASK] both texts hold; offline its stand-in, the bundled all-MiniLM-L6-v2, has no masked-LM head and is "
    "refused: give --model smollm2)",
    show_default=False,
)
WordsOption = typer.Option(
    False,
    "--words",
    help="Show words, not word pieces (Clark et al. 2019): attention to a word is the sum over its pieces, "
    "from a word the mean, so rows still sum to 1. Words from the tokenizer's marks (## ▁ Ġ), "
    "rjieba's words for Chinese, single characters for Japanese, spaces for Korean; special tokens stay apart.",
)


class Effect(str, Enum):  # attnviz.analysis.effect.ABLATIONS
    zero = "zero"
    mean = "mean"


EffectOption = typer.Option(
    None,
    "--effect",
    help="Also measure what each head does to the model's output (Michel et al. 2019): the head taken out, the rest "
    "of the model run again. zero: its output set to 0; mean: replaced by its mean over the text's positions. "
    "Shown beside each head: for a decoder or an encoder-decoder (a head of any --stack), KL(p ‖ q) of the "
    "next-token distributions, mean over positions, and the change of the text's loss (nats per token); for an "
    "encoder, the cosine distance of each token's last hidden state, mean over the tokens, and of the sentence "
    "embedding for a sentence-transformers model. The model's own heads and weights.",
    show_default=False,
)


class Measure(str, Enum):  # attnviz.analysis.measure_names.MEASURE_CHOICES
    weights = "weights"
    norm = "norm"
    value_zeroing = "value-zeroing"
    flow = "flow"
    all = "all"


MeasureOption = typer.Option(
    Measure.weights,
    "--measure",
    help="What else to show beside the attention weights α (always drawn). "
    "norm: ‖α f(x)‖, the weighted value vectors' norms per head and heads summed (Kobayashi et al. 2020); "
    "value-zeroing: how much token i's attention output turns (cosine distance) when key j's values are zeroed "
    "(Mohebbi et al. 2023); flow: maximum flow through the layers up to this one (Abnar & Zuidema 2020; "
    "texts of up to 88 tokens); all: every one, and measures.png side by side.",
)
BandOption = typer.Option(
    8,
    "--band",
    min=0,
    max=MAX_COUNT,
    help="The local band's half-width w in tokens: summaries.json's local share is each query's weight on keys with "
    "|i - j| <= w.",
)
LayersMeasureOption = typer.Option(
    Measure.weights,
    "--measure",
    help="Every layer's measures beside the weights (always drawn). norm: ‖Σ_h α f(x)‖ of each layer "
    "(Kobayashi et al. 2020); value-zeroing: each layer's (Mohebbi et al. 2023); flow: maximum flow through "
    "every layer beside the rollout (Abnar & Zuidema 2020; texts of up to 88 tokens); all: every one.",
)
