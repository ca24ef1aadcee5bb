"""attnviz.generate and what it returns: a decoder continues a prompt, the attention around every generated token
kept: the row that chose it, and its own row as the query (analysis/generation.py's ROWS)."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from attnviz.api import display
from attnviz.api.arguments import must_be_bool, must_be_int, must_be_one_of, must_be_progress
from attnviz.api.checks import _texts, refuse_before_loading, require_decoder
from attnviz.api.options import GENERATE_OPTIONS, run_options, takes_options
from attnviz.api.run_results import Rendered, save_run_files
from attnviz.errors import AttnvizError, option
from attnviz.layer_inputs import check_layer
from attnviz.spec import RunSpec


@takes_options(GENERATE_OPTIONS)
def generate(prompt: str, *, tokens: int = 32, sample: bool = False, rows: str = "chosen", progress=None, **options):
    """A decoder continues prompt by `tokens` tokens (a GenerateResult): greedy (the most likely next token), or
    sample=True from the next-token distribution with seed. The attention around each generated token, per layer
    and head, from attnviz's layers with the model's projections and their own key/value cache as the model
    generates (analysis/generation.py); a token that ends a text ends the continuation. rows: which row of each
    generated token the figure, the terminal, the JSON and the report show first: "chosen", the row that chose it
    (that of the position before it: what transformers' generate(output_attentions=True) gives at its step), or
    "read", its own row as the query; the result keeps both (.chosen, .read).
    options: model, layer (the one the figure and the JSON show; the report has every layer), seed, device, dtype.
    progress(1), when given, is called after each token generated; a progress that also has .stage(what, total) is
    told first ("tokens generated", tokens).
    """
    from attnviz.analysis.generation import ROWS, generate as continue_prompt

    options = run_options("generate", options, GENERATE_OPTIONS)
    (prompt,) = _texts(prompt, one=True, name="prompt")
    if must_be_int("tokens", tokens) < 1:
        raise AttnvizError(f"{option('tokens', tokens)}: generate makes at least 1 token")
    must_be_bool("sample", sample)
    must_be_one_of("rows", rows, tuple(ROWS))
    progress = must_be_progress(progress)
    refuse_before_loading(options)
    handle = options.load()
    require_decoder(handle, "generate")  # what can be checked is, before generating
    check_layer(handle.loaded, options.layer)
    spec = options.run_spec(handle)
    generation = continue_prompt(handle.loaded, prompt, spec, tokens, sample, options.seed, progress)
    return GenerateResult(generation, spec, handle.loaded, rows, generation_report(handle.loaded, generation, spec, rows))


def generation_report(loaded, generation, spec: RunSpec, rows: str):
    """The interactive report of the prompt (as attnviz.report gives it), opening on the Generation view: the prompt
    and its continuation, one generated token at a time, coloured by the row that chose it or by its own (rows' first).
    Made of the prompt's one capture (captured_report's: its run, every layer, the traces, the vectors); generation's
    own decode passes are not read."""
    from attnviz.analysis.neurons import MAX_VECTOR_TOKENS
    from attnviz.api.report_parts import captured_report, report_of_parts

    ((_, part, notes),) = captured_report(loaded, [generation.prompt], spec, vector_tokens=0 if spec.words else MAX_VECTOR_TOKENS)
    return report_of_parts(loaded, [(replace(part, generation=generation, generation_rows=rows), notes)], spec)


@dataclass(frozen=True, repr=False)
class GenerateResult:
    """generation (analysis.generation.Generation): .ids, .continuation, .shown_tokens, .query_rows; .chosen and
    .read (L, H, n, P + n), the two rows of each generated token, and .rows, those named by rows_are."""

    generation: Any
    spec: RunSpec
    loaded: Any = field(default=None, compare=False)  # the model's LoadedModel
    rows_are: str = "chosen"  # analysis.generation.ROWS: the rows shown
    report_result: Any = field(default=None, compare=False)  # the ReportResult, made while the prompt's capture was at hand

    @property
    def ids(self) -> list[int]:
        return self.generation.ids

    @property
    def continuation(self) -> str:
        return self.generation.continuation

    @property
    def rows(self) -> np.ndarray:
        """(L, H, n, P + n): row t is generated token t's row named by rows_are."""
        return self.generation.rows(self.rows_are)

    @property
    def chosen(self) -> np.ndarray:
        """(L, H, n, P + n): row t is the row that chose generated token t (the position before it as the query)."""
        return self.generation.rows("chosen")

    @property
    def read(self) -> np.ndarray:
        """(L, H, n, P + n): row t is generated token t's own row as the query."""
        return self.generation.rows("read")

    def figure(self, layer: int | None = None, head: int | None = None):
        """generate.png: each head of the layer (default: the run's; or the one head), a row per generated token
        (rows_are's row) over every token."""
        from attnviz.render.generation_figures import generation_figure

        layer = self.spec.layer if layer is None else must_be_int("layer", layer)
        if not 0 <= layer < self.rows.shape[0] or (head is not None and not 0 <= must_be_int("head", head) < self.rows.shape[1]):
            raise AttnvizError(f"layer {layer}, head {head}: the model has {self.rows.shape[0]} layers of {self.rows.shape[1]} heads")
        return generation_figure(self.generation, layer, self.rows_are, head)

    def to_dict(self) -> dict:
        """generate.json's content."""
        from attnviz.output.summaries_json import generation_record

        return generation_record(self.generation, self.spec, self.rows_are)

    def save(self, folder: str | Path, format: str = "png") -> list[Path]:
        """Write what `attnviz generate --out folder` writes: generate.<format>, generate.json and report.html."""
        return save_run_files(folder, lambda staging: self.write_files(staging, format), format)

    def write_files(self, folder: Path, format: str = "png") -> list[Path]:
        from attnviz.output.summaries_json import write_generation_json
        from attnviz.render.generation_figures import write_generation_figure

        figure = write_generation_figure(self.generation, self.spec.layer, self.rows_are, folder, format)
        record = write_generation_json(self.generation, self.spec, self.rows_are, folder / "generate.json")
        return [figure, record, *self.report().write_files(folder)]

    def report(self):
        """The interactive report of the prompt (generation_report's, made by attnviz.generate), opening on the
        Generation view."""
        return self.report_result

    def __rich_console__(self, console, options):
        from attnviz.render.generation_text import print_generation

        printed = display.Printed(options.max_width)
        print_generation(printed, self.generation, self.spec.layer, self.rows_are)
        yield printed.group()

    def __rich__(self):
        return Rendered(self)

    def _repr_html_(self) -> str:
        from attnviz.analysis.generation import ROWS

        g = self.generation
        parts = [
            display.tokens_html(g.shown_tokens[: g.num_prompt], "prompt"),
            display.tokens_html(g.shown_tokens[g.num_prompt :], "continuation"),
            display.figure_html(self.figure(), f"layer {self.spec.layer}: {ROWS[self.rows_are]}"),
        ]
        return display.result_html(f"{g.model} · {g.prompt} → {g.continuation}", *parts)

    def __repr__(self) -> str:
        g = self.generation
        return f"<attnviz.GenerateResult {g.prompt!r} + {g.continuation!r}: {len(g.ids)} tokens generated>"
