"""attnviz.roles and what it returns: what each head is, every layer × head, with the evidence of each role."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from attnviz.api import display
from attnviz.api.arguments import must_be_bool, must_be_int
from attnviz.api.functions import _texts, refuse_before_loading
from attnviz.api.options import ROLES_OPTIONS, run_options, takes_options
from attnviz.api.run_results import _Rendered, save_run_files
from attnviz.errors import AttnvizError
from attnviz.spec import RunSpec, refuse_cross_over_every_layer


@takes_options(ROLES_OPTIONS)
def roles(text: str, *, exclude_bos: bool = False, exclude_current: bool = False, sinks: int = 4, recent: int = 256, **options):
    """Every layer × head's roles over one text (a RolesResult), a block of queries at a time at any length.

    Over the text: TransformerLens's previous-token, duplicate-token and induction template scores (its default
    measure, Σ A·P / Σ A; exclude_bos and exclude_current as its detect_head's), the streaming share (the first
    `sinks` keys and the `recent` keys ending at each query, mean over queries) and the top-16, 64 and 256
    coverages, beside `layers`' summaries (sink, entropy, distance, local band). Text-free, for a decoder: Olsson
    et al.'s prefix matching (random repeated tokens) and copying (the OV circuit's eigenvalues; said and skipped
    for a model without a language-model head). Each head labelled by the roles above analysis.roles.ROLES'
    thresholds. options: model, stack, device, dtype, truncate, memory, allow_pickle, as in layers.
    """
    from attnviz.analysis.head_numbers import RoleSettings
    from attnviz.analysis.roles import head_roles
    from attnviz.budgets import block_budget

    options = run_options("roles", options, ROLES_OPTIONS)
    (text,) = _texts(text, one=True)
    settings = RoleSettings(must_be_bool("exclude_bos", exclude_bos), must_be_bool("exclude_current", exclude_current),
                            must_be_int("sinks", sinks), must_be_int("recent", recent))  # fmt: skip
    if settings.sinks < 0 or settings.recent < 1:
        raise AttnvizError(f"sinks {settings.sinks}, recent {settings.recent}: give sinks >= 0 and recent >= 1 keys")
    refuse_cross_over_every_layer(options.stack)
    refuse_before_loading(options)
    handle = options.load()
    spec = options.run_spec(handle, layer=None)
    return RolesResult(head_roles(handle.loaded, text, spec, block_budget(spec), settings), spec, handle.loaded)


@dataclass(frozen=True, repr=False)
class RolesResult:
    """roles (analysis.roles.RoleScores): .scores[name] (L, H) per score computed, .summaries (`layers`' LayerSummaries),
    .labels() [layer][head] the head's roles, .ids the text's token ids, .random_ids prefix matching's sequences."""

    roles: Any  # analysis.roles.RoleScores
    spec: RunSpec
    loaded: Any = field(default=None, compare=False)

    @property
    def scores(self) -> dict[str, np.ndarray]:
        return self.roles.scores

    @property
    def labels(self) -> list[list[list[str]]]:
        return self.roles.labels()

    def with_retrieval(self, result) -> "RolesResult":
        """This result with analysis/retrieval.py's retrieval heads joined (their scores, labels and tests)."""
        return replace(self, roles=self.roles.with_retrieval(result))

    def figure(self):
        """roles.png: every layer × head coloured by its role, shaded by that role's score."""
        from attnviz.render.role_figures import roles_figure

        return roles_figure(self.roles)

    def save(self, folder: str | Path, format: str = "png") -> list[Path]:
        """Write what `attnviz roles --out folder` writes: roles.<format>, roles.json, report.html."""
        return save_run_files(folder, lambda staging: self.write_files(staging, format), format)

    def write_files(self, folder: Path, format: str = "png") -> list[Path]:
        from attnviz.output.roles_json import write_roles_json
        from attnviz.render.heatmap import check_format, save_figure

        check_format(format)
        figure = save_figure(self.figure(), folder, f"roles.{format}")
        return [figure, write_roles_json(self.roles, self.spec, folder / "roles.json"), *self.report().write_files(folder)]

    def report(self):
        """The interactive report of the text (as attnviz.report gives it, at layer 0), opening on the Roles view: the
        grid of every layer × head by role; a click shows the head's map and its scores."""
        from attnviz.api.report import text_report

        summaries = self.roles.summaries  # a long text's report shows them: not made again
        return text_report(self.loaded, summaries.text, replace(self.spec, layer=0), summaries, roles=self.roles)

    def to_dict(self) -> dict:
        """roles.json's content."""
        from attnviz.output.roles_json import roles_record

        return roles_record(self.roles, self.spec)

    def __rich_console__(self, console, options):
        from attnviz.render.role_tables import print_roles

        printed = display.Printed(options.max_width)
        print_roles(printed, self.roles)
        yield printed.group()

    def __rich__(self):
        return _Rendered(self)

    def _repr_html_(self) -> str:
        from attnviz.analysis.roles import ROLES

        rows = [[role.name, ", ".join(f"L{layer}H{head} {score:.2f}" for layer, head, score in self.roles.top_heads(role)) or "none"]
                for role in ROLES]  # fmt: skip
        summaries = self.roles.summaries
        parts = [display.figure_html(self.figure(), "every layer × head by role"),
                 display.table_html(["role", "top heads (score)"], rows, "roles above analysis.roles.ROLES' thresholds"),
                 display.notes_html([f"{name}: {why}" for name, why in self.roles.skipped.items()])]  # fmt: skip
        return display.result_html(f"{summaries.model} · {summaries.text}", *parts)

    def __repr__(self) -> str:
        summaries = self.roles.summaries
        return f"<attnviz.RolesResult {summaries.text!r}: {summaries.model}, {len(self.roles.scores)} scores of {summaries.values['sink'].size} heads>"
