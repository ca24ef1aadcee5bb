"""`attnviz roles`' figure: roles.png, every layer × head coloured by its role and shaded by that role's score."""

from __future__ import annotations

import numpy as np

from attnviz.render.heatmap import new_figure
from attnviz.render.summary_figures import MAX_NUMBERED_CELLS, PANEL_INCHES, _label_axes, _title

# One colour a role, in analysis.roles.ROLES' order (matplotlib's tab10, which keeps them apart); none: light grey.
ROLE_COLOURS = ("#d62728", "#9467bd", "#8c564b", "#1f77b4", "#2ca02c", "#17becf", "#ff7f0e", "#7f7f7f")
NO_ROLE = "#eeeeee"
SHORT = {"retrieval": "R", "induction": "I", "duplicate-token": "D", "previous-token": "P", "copying": "C", "local": "L",
         "sink": "S", "streaming": "W"}  # fmt: skip
CODE_JOIN = "+"  # between a head's letters, so that none reads as a token ("C+L+S", never "CLS")


def role_code(names) -> str:
    """A head's roles as letters joined by CODE_JOIN ("I+P"), in ROLES' order; "" for none."""
    return CODE_JOIN.join(SHORT[name] for name in names)


def legend_label(role) -> str:
    """'C = copying: copying > 0.9': the role's letter spelled, its score and threshold."""
    return f"{SHORT[role.name]} = {role.name}: {role.score} > {role.threshold:g}"


def left_out_notes(roles) -> list[str]:
    """The title's lines on what is not labelled here: the share roles this text cannot tell (a uniform head's score
    beside each), then the scores not computed, grouped by the first clause of why."""
    from attnviz.analysis.roles import ROLE_NAMES, ROLES, SEPARATION, role_key

    notes = []
    untold = [name for name in ROLE_NAMES if role_key(name) in roles.skipped]
    if untold:
        thresholds = {role.name: role.threshold for role in ROLES}
        scores = ", ".join(f"{name} {roles.uniform[name]:.2f} > {thresholds[name]:g}/{SEPARATION}" for name in untold)
        notes.append(f"not labelled on {len(roles.ids):,} tokens, a uniform head's share over half the threshold: {scores}")
    reasons: dict[str, list[str]] = {}
    for name, why in roles.skipped.items():
        if name not in {role_key(role) for role in untold}:
            reasons.setdefault(why.split(":")[0], []).append(name)
    notes += [f"{', '.join(names)} left out: {why}" for why, names in reasons.items()]
    return notes


def role_cells(roles) -> np.ndarray:
    """(L, H, 3) RGB: each head's main role's colour (analysis.roles.RoleScores.main_roles), mixed with white by how far
    its score is from 1 (at its threshold a third of the colour, at 1 all of it); no role: NO_ROLE."""
    from matplotlib.colors import to_rgb

    from attnviz.analysis.roles import ROLES

    chosen, strength = roles.main_roles()
    cells = np.empty((*chosen.shape, 3))
    cells[:] = to_rgb(NO_ROLE)
    for index, role in enumerate(ROLES):
        here = chosen == index
        span = max(1.0 - role.threshold, 1e-9)
        depth = 1 / 3 + 2 / 3 * np.clip((strength[here] - role.threshold) / span, 0, 1)  # (n,)
        cells[here] = 1 - depth[:, None] * (1 - np.array(to_rgb(ROLE_COLOURS[index])))
    return cells


def roles_figure(roles):
    """roles.png: one layers × heads grid, each cell its head's main role (ROLES' order: the rarer first), its roles'
    letters (role_code) in the cell when the grid is small; a legend spelling each letter, with the role's score and
    threshold; the title says what is not labelled here and why."""
    from matplotlib.patches import Patch

    from attnviz.analysis.roles import ROLES

    summaries = roles.summaries
    num_layers, num_heads = summaries.values["sink"].shape
    figure = new_figure((PANEL_INCHES[0] * 1.6, PANEL_INCHES[1] + 1.6))
    ax = figure.add_subplot(1, 1, 1)
    ax.imshow(role_cells(roles), aspect="auto", interpolation="nearest")
    _label_axes(ax, num_layers, num_heads)
    if num_layers <= MAX_NUMBERED_CELLS[0] and num_heads <= MAX_NUMBERED_CELLS[1]:
        for layer, row in enumerate(roles.labels()):
            for head, names in enumerate(row):
                ax.text(head, layer, role_code(names), ha="center", va="center", fontsize=5)
    computed = [(index, role) for index, role in enumerate(ROLES) if roles.role_values(role) is not None]
    handles = [Patch(color=ROLE_COLOURS[index], label=legend_label(role)) for index, role in computed]
    ax.legend(handles=[*handles, Patch(color=NO_ROLE, label="none")], loc="upper left", bbox_to_anchor=(1.01, 1), fontsize=7)
    scope = [f"{num_layers} layers × {num_heads} heads", f"{len(roles.ids)} tokens"]
    notes = ["each head's first role above its threshold (the rarer first), deeper as its score nears 1", *left_out_notes(roles)]
    _title(figure, scope, notes, None, None, summaries)
    return figure
