"""attnviz.roles and what it returns: what each head is, every layer × head, with the evidence of each role."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from numbers import Integral, Real
from pathlib import Path
from typing import Any

import numpy as np

from attnviz.api import display
from attnviz.api.arguments import must_be_bool, must_be_int, must_be_one_of, must_be_progress, refuse
from attnviz.api.checks import _comma_list, _texts, refuse_before_loading
from attnviz.api.options import ROLES_OPTIONS, run_options, takes_options
from attnviz.api.run_results import Rendered, save_run_files
from attnviz.errors import AttnvizError, option
from attnviz.spec import LOCAL_SOURCES, RunSpec, refuse_cross_over_every_layer


@takes_options(ROLES_OPTIONS)
def roles(text: str, *, exclude_bos: bool = False, exclude_current: bool = False, sinks: int = 4, recent: int = 256,
          retrieval: bool = False, lengths=None, depths=None, engine: str = "local", progress=None, **options):  # fmt: skip
    """Every layer × head's roles over one text (a RolesResult), a block of queries at a time at any length.

    Over the text: TransformerLens's previous-token, duplicate-token and induction template scores (its default
    measure, Σ A·P / Σ A; exclude_bos and exclude_current as its detect_head's), the streaming share (the first
    `sinks` keys and the `recent` keys ending at each query, mean over queries) and the top-16, 64 and 256
    coverages, beside `layers`' summaries (sink, entropy, distance, local band). Text-free, for a decoder: Olsson
    et al.'s prefix matching (random repeated tokens) and copying (the OV circuit's eigenvalues; said and skipped
    for a model without a language-model head). Each head labelled by the roles above analysis.roles.ROLES'
    thresholds; local, sink and streaming only where a uniform head's share on the text is at most half the
    threshold (.roles.skipped says where not, .roles.uniform gives the shares). options: model, stack, device, dtype, truncate, memory, allow_pickle, as in layers.

    retrieval: also Wu et al. 2024's retrieval heads (a decoder's), over needle-in-a-haystack tests of `lengths`
    tokens (default 1,024, 2,048 and 4,096) × `depths` (default 0.1, 0.5 and 0.9), each generated greedily; engine
    "ray" spreads the tests over Ray's actors (the same result).

    progress(n), when given, is called after each n units of work done, stage by stage: the text's layers, the
    layers prefix matching's forward pass reaches and then those it scores, copying's layers (where computed), then
    the needle tests; a progress that also has .stage(what, total) is told as each begins ("layers of the text", 30).
    """
    from attnviz.analysis.head_numbers import RoleSettings
    from attnviz.analysis.roles import head_roles
    from attnviz.api.report import text_report
    from attnviz.budgets import block_budget
    from attnviz.html.pyramid import needs_zoom
    from attnviz.html.record import is_long

    options = run_options("roles", options, ROLES_OPTIONS)
    (text,) = _texts(text, one=True)
    settings = RoleSettings(must_be_bool("exclude_bos", exclude_bos), must_be_bool("exclude_current", exclude_current),
                            must_be_int("sinks", sinks), must_be_int("recent", recent))  # fmt: skip
    if settings.sinks < 0 or settings.recent < 1:
        raise AttnvizError(f"sinks {settings.sinks}, recent {settings.recent}: give sinks >= 0 and recent >= 1 keys")
    progress = must_be_progress(progress)
    needles = _needle_grid(lengths, depths, engine)  # checked whether asked for or not
    needles = needles if must_be_bool("retrieval", retrieval) else None
    if needles is not None and needles["engine"] == "ray":
        from attnviz.output.ray_engine import require_ray

        require_ray()
    refuse_cross_over_every_layer(options.stack)
    refuse_before_loading(options)
    handle = options.load()
    spec = options.run_spec(handle, layer=None)
    if needles is not None:  # refused (not a decoder, a length past its context) before any other work
        from attnviz.output.retrieval_heads import planned_tests

        needles["tests"] = planned_tests(handle.loaded, needles["lengths"], needles["depths"], engine=needles["engine"])
    def keep(tokens: int, run) -> bool:  # a short text's capture, for its report's every map; a long one's before its run
        return not is_long(run) if run is not None else not needs_zoom(tokens, tokens)

    passed = head_roles(handle.loaded, text, spec, block_budget(spec), settings, progress, keep=keep)
    roles = passed.roles
    if needles is not None:
        needles["advance"] = progress.counting("needle tests", len(needles["tests"]))
        roles = roles.with_retrieval(_retrieval(handle, spec, options, needles))
    # The report from the text's own pass: its layer 0 run and, for a short text, its capture (no pass of its own).
    report = text_report(handle.loaded, text, replace(spec, layer=0), roles.summaries, captured=passed.capture,
                         runs=[passed.run], roles=roles)  # fmt: skip
    return RolesResult(roles, spec, handle.loaded, report)


def _retrieval(handle, spec: RunSpec, options, needles: dict):
    """The retrieval heads over the needle tests (output.retrieval_heads), here or on Ray's actors."""
    from attnviz.output.ray_engine import actor_device, actor_loading
    from attnviz.output.retrieval_heads import retrieval_heads

    engine_device = actor_device(options.device) if needles["engine"] == "ray" else spec.device
    model_name = handle.name if handle.source not in LOCAL_SOURCES else spec.resolved_model  # what Ray's actors load
    loading = actor_loading(handle.loaded, options.allow_pickle)
    return retrieval_heads(handle.loaded, spec, **needles, model_name=model_name, loading=loading, engine_device=engine_device)


def _needle_grid(lengths, depths, engine) -> dict:
    """retrieval_heads' grid and engine, checked before loading (the lengths past the context: once it is loaded)."""
    from attnviz.analysis.retrieval import DEPTHS, LENGTHS
    from attnviz.output.retrieval_heads import ENGINES

    lengths, depths = _numbers("lengths", lengths, int, LENGTHS), _numbers("depths", depths, float, DEPTHS)
    if not lengths or min(lengths) < 1:
        raise AttnvizError(f"{option('lengths', _comma_list(lengths))}: give one length or more, each at least 1 token")
    if not depths or not all(0 <= depth <= 1 for depth in depths):
        raise AttnvizError(f"{option('depths', _comma_list(depths))}: give one depth or more, each in [0, 1]")
    engine = must_be_one_of("engine", engine, ENGINES)
    return {"lengths": lengths, "depths": depths, "engine": engine}


def _numbers(name: str, given, kind: type, default: tuple) -> tuple:
    """A comma list as the command line gives it ("1024,2048") or a list of numbers (kind int: whole ones)."""
    if given is None:
        return default
    if isinstance(given, str):
        try:
            return tuple(kind(part) for part in given.split(","))
        except ValueError:
            raise AttnvizError(f"{option(name, given)}: give {'whole numbers' if kind is int else 'numbers'} separated by commas") from None
    whole = kind is int
    if not isinstance(given, (list, tuple)) or not all(
        isinstance(item, Integral if whole else Real) and not isinstance(item, bool) for item in given
    ):
        refuse(name, f"a comma list (str) or a list of {'int' if whole else 'numbers'} or None", given)
    return tuple(kind(item) for item in given)


@dataclass(frozen=True, repr=False)
class RolesResult:
    """roles (analysis.roles.RoleScores): .scores[name] (L, H) per score computed, .summaries (`layers`' LayerSummaries),
    .labels() [layer][head] the head's roles, .ids the text's token ids, .random_ids prefix matching's sequences."""

    roles: Any  # analysis.roles.RoleScores
    spec: RunSpec
    loaded: Any = field(default=None, compare=False)
    kept_report: Any = field(default=None, compare=False)  # ReportResult: made by attnviz.roles from the text's pass

    @property
    def scores(self) -> dict[str, np.ndarray]:
        return self.roles.scores

    @property
    def labels(self) -> list[list[list[str]]]:
        return self.roles.labels()

    def with_retrieval(self, result) -> "RolesResult":
        """This result with analysis/retrieval.py's retrieval heads joined (their scores, labels and tests), in its
        report's Roles view too."""
        roles = self.roles.with_retrieval(result)
        return replace(self, roles=roles, kept_report=self.kept_report and with_roles(self.kept_report, roles, self.spec))

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
        grid of every layer × head by role; a click shows the head's map and its scores. attnviz.roles made it from
        the text's own pass: nothing runs here."""
        if self.kept_report is None:
            raise AttnvizError("this RolesResult holds no report: attnviz.roles makes one from the text's pass")
        return self.kept_report

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
        return Rendered(self)

    def _repr_html_(self) -> str:
        from attnviz.analysis.roles import ROLES, role_key

        def top(role) -> str:
            heads = ", ".join(f"L{layer}H{head} {score:.2f}" for layer, head, score in self.roles.top_heads(role))
            if heads or self.roles.role_values(role) is not None:
                return heads or "none"
            return "not labelled on this text (the notes say why)" if role_key(role.name) in self.roles.skipped else "not computed"

        rows = [[role.name, top(role)] for role in ROLES]
        summaries = self.roles.summaries
        parts = [display.figure_html(self.figure(), "every layer × head by role"),
                 display.table_html(["role", "top heads (score)"], rows, "roles above analysis.roles.ROLES' thresholds"),
                 display.notes_html([f"{name}: {why}" for name, why in self.roles.skipped.items()])]  # fmt: skip
        return display.result_html(f"{summaries.model} · {summaries.text}", *parts)

    def __repr__(self) -> str:
        summaries = self.roles.summaries
        return f"<attnviz.RolesResult {summaries.text!r}: {summaries.model}, {len(self.roles.scores)} scores of {summaries.values['sink'].size} heads>"


def with_roles(report, roles, spec: RunSpec):
    """A roles report (ReportResult) with its Roles view's data made again from roles (analysis.roles.RoleScores)."""
    from attnviz.api.run_results import ReportResult
    from attnviz.html.record import roles_of

    first = {**report.record["texts"][0], "roles": roles_of(roles, replace(spec, layer=0))}
    return ReportResult({**report.record, "texts": [first, *report.record["texts"][1:]]})
