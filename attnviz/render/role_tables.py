"""`attnviz roles` in the terminal: every layer × head's roles as a grid of letters, then each role's top heads."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table
from rich.text import Text

from attnviz.render.role_figures import ROLE_COLOURS, SHORT, role_code
from attnviz.render.summary_tables import MAX_LAYERS_SHOWN

TOP_HEADS = 5  # a role's heads listed


def role_grid(roles, width: int = 80) -> list[Table]:
    """Layers × heads, each cell its head's roles as letters joined by '+' (role_code), the main role's colour; '·' none; the heads in
    blocks of columns that fit width, at most MAX_LAYERS_SHOWN rows (every layer in roles.json)."""
    from attnviz.analysis.roles import ROLE_NAMES

    labels = roles.labels()
    num_layers, num_heads = len(labels), len(labels[0])
    cell = max(1, max((len(role_code(names)) for row in labels for names in row), default=1))
    label = len(f"L{num_layers - 1}")
    per_block = max(1, (width - (label + 4)) // (max(cell, 3) + 3))
    tables = []
    for first in range(0, num_heads, per_block):
        heads = range(first, min(first + per_block, num_heads))
        table = Table(title="roles by layer and head" if first == 0 else None, title_justify="left")
        table.add_column("", justify="right", no_wrap=True, min_width=label)
        for head in heads:
            table.add_column(f"H{head}", justify="center", no_wrap=True, min_width=cell)
        for layer in range(min(num_layers, MAX_LAYERS_SHOWN)):
            cells = []
            for head in heads:
                names = labels[layer][head]
                colour = ROLE_COLOURS[ROLE_NAMES.index(names[0])] if names else ""
                cells.append(Text(role_code(names) or "·", style=f"bold {colour}" if colour else "dim"))
            table.add_row(f"L{layer}", *cells)
        tables.append(table)
    if num_layers > MAX_LAYERS_SHOWN:
        tables[-1].caption = f"… {num_layers - MAX_LAYERS_SHOWN} more layers in roles.json"
    return tables


def print_roles(console: Console, roles) -> None:
    """The grid of roles, each role's top heads with their scores and its threshold, and what was not computed."""
    from attnviz.analysis.roles import ROLES

    for table in role_grid(roles, console.width):
        console.print(table)
    table = Table(title="top heads by role", title_justify="left")
    for column in ("role", "score > threshold", f"top {TOP_HEADS} heads"):
        table.add_column(column, no_wrap=column != f"top {TOP_HEADS} heads")
    for role in ROLES:
        if roles.role_values(role) is None:
            continue
        heads = ", ".join(f"L{layer}H{head} {score:.2f}" for layer, head, score in roles.top_heads(role, TOP_HEADS))
        table.add_row(f"{SHORT[role.name]} = {role.name}", f"{role.score} > {role.threshold:g}", heads or "none")
    console.print(table)
    for name, why in roles.skipped.items():  # a score not computed, or a role this text cannot tell ("local role")
        console.print(Text(f"{name}: {'not labelled' if name.endswith(' role') else 'left out'}: {why}", style="dim"))
    console.print(Text("every score of every head, the thresholds and their sources: roles.json", style="dim"))
