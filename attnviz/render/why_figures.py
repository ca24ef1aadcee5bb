"""`attnviz why`'s figure and table: a score's terms, query part x key part (analysis/why.py's ScoreTerms).

why.png shows the term matrix over the parts of the largest terms on each side, every other part of a side summed in
one row ("rest") or column, so the cells still add up to the score; red adds to it, blue takes from it.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from attnviz.render.heatmap import check_format, new_figure, save_figure
from attnviz.render.titles import counted, short_model_name

SHOWN_PARTS = 12  # the parts of each side the figure names; the rest of that side is one row or column
REST = "rest"


def shown_terms(terms, count: int = SHOWN_PARTS) -> tuple[list[str], list[str], np.ndarray]:
    """(query parts, key parts, (R, C) terms): each side's `count` parts of largest term, in their own order, and where
    parts are left out a last row or column "rest" holding their terms' sums: the cells add up to every term's sum."""
    matrix = terms.terms
    row_groups, query_names = _groups(np.abs(matrix).max(axis=1), terms.query_parts, count)
    column_groups, key_names = _groups(np.abs(matrix).max(axis=0), terms.key_parts, count)
    shown = np.array([[matrix[np.ix_(rows, columns)].sum() for columns in column_groups] for rows in row_groups])
    return query_names, key_names, shown


def _groups(sizes: np.ndarray, names: list[str], count: int) -> tuple[list[list[int]], list[str]]:
    """The `count` parts of largest size one by one, in index order (a tie to the earlier), then the rest as one."""
    chosen = sorted(int(index) for index in np.argsort(-sizes, kind="stable")[:count])
    rest = [index for index in range(len(names)) if index not in set(chosen)]
    return [[index] for index in chosen] + ([rest] if rest else []), [names[index] for index in chosen] + ([REST] if rest else [])


def why_figure(terms, model: str):
    """why.png's Figure: the shown terms (shown_terms) on a scale centred on 0, each cell's value written in it."""
    import matplotlib

    query_names, key_names, shown = shown_terms(terms)
    figure = new_figure((1.0 + 0.62 * len(key_names) + 2.0, 1.6 + 0.42 * len(query_names) + 1.0))
    ax = figure.add_subplot()
    reach = max(float(np.abs(shown).max()), 1e-12)
    image = ax.imshow(shown, cmap=matplotlib.colormaps["RdBu_r"], vmin=-reach, vmax=reach, aspect="auto", interpolation="nearest")
    for (i, j), value in np.ndenumerate(shown):
        ax.text(j, i, f"{value:.2f}", ha="center", va="center", fontsize=7, color="white" if abs(value) > 0.6 * reach else "black")
    ax.set_xticks(range(len(key_names)), key_names, rotation=90, fontsize=8)
    ax.set_yticks(range(len(query_names)), query_names, fontsize=8)
    ax.set_xlabel(f"key part (key {terms.key}: {terms.shown_key!r})")
    ax.set_ylabel(f"query part (query {terms.query}: {terms.shown_query!r})")
    figure.colorbar(image, ax=ax, shrink=0.8, label="term of the score (red adds, blue takes away)")
    ax.set_title(
        f"{short_model_name(model)} · layer {terms.layer} · head {terms.head}\n"
        f"score {terms.score:.4f} = {sum_of_terms(terms.terms.size)} (weight {terms.weight:.4f})",
        fontsize=10, parse_math=False,
    )  # fmt: skip
    figure.set_layout_engine("constrained")
    return figure


def sum_of_terms(count: int) -> str:
    """What a score is of its terms: "the sum of 64 terms", or "1 term" (one part each side: a RoPE decoder's layer 0,
    which reads the token embeddings alone)."""
    return counted(count, "term") if count == 1 else f"the sum of {counted(count, 'term')}"


def write_why_figure(terms, model: str, folder: Path, fmt: str = "png") -> Path:
    check_format(fmt)
    return save_figure(why_figure(terms, model), folder, f"why.{fmt}")


def print_terms(console, terms, top: list[tuple[str, str, float]], sides: dict) -> None:
    """The largest terms as a table: query part, key part, the term, its share of the score; each side's parts that add
    most (sides: "query" and "key" -> [(part, its terms summed)]); the score and its weight."""
    from rich.table import Table
    from rich.text import Text

    table = Table(title=f"layer {terms.layer} head {terms.head}: {terms.shown_query!r} (query {terms.query}) → "
                        f"{terms.shown_key!r} (key {terms.key})")  # fmt: skip
    for name in ("query part", "key part", "term", "share"):
        table.add_column(name, justify="right" if name in ("term", "share") else "left")
    for query_part, key_part, term in top:
        table.add_row(query_part, key_part, f"{term:+.4f}", f"{term / terms.score:+.1%}" if terms.score else "n/a")
    console.print(table)
    for side, parts in sides.items():
        listed = ", ".join(f"{part} {total:+.4f}" for part, total in parts)
        console.print(Text(f"the {side} side's parts that add most (their terms summed over the {'key' if side == 'query' else 'query'}'s parts): {listed}"))
    shown = f"; {len(top)} largest shown" if len(top) < terms.terms.size else ""
    console.print(Text(f"score {terms.score:.4f} (weight {terms.weight:.4f}) = {sum_of_terms(terms.terms.size)} (why.json){shown}", style="dim"))
