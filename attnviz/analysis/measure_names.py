"""The measures beside the weights, by name: what each is and where it comes from (no heavy imports:
--help, the JSON and the figures name them; analysis/measures.py computes them)."""

from __future__ import annotations

from attnviz.errors import AttnvizError

# What each measure is, for --help, docs/measures.md, the figures' titles and the JSON.
MEASURES = {
    "weights": ("attention weights", "Vaswani et al. 2017", "α^h_ij = softmax_j(q_i·k_j / √d): the maps of attnviz heads"),
    "norm": (
        "norm of the weighted, transformed values",
        "Kobayashi et al. 2020, Attention is Not Only a Weight",
        "‖α^h_ij f^h(x_j)‖ per head and ‖Σ_h α^h_ij f^h(x_j)‖ summed over heads, f^h(x) = (x W_v^h + b_v^h) W_o^h; raw norms",
    ),
    "value-zeroing": (
        "value zeroing",
        "Mohebbi et al. 2023, Quantifying Context Mixing in Transformers",
        "cosine distance between token i's attention-layer output and that output with key j's value vectors "
        "zeroed in every head (after W_o, before the residual); rows divided by their sums",
    ),
    "flow": (
        "attention flow",
        "Abnar & Zuidema 2020, Quantifying Attention Flow in Transformers",
        "maximum flow from token i after the layer down to input token j through the layers' graph, "
        "capacities (mean_h A + I) / 2; rows divided by their sums",
    ),
}
MEASURE_CHOICES = (*MEASURES, "all")


def measure_names(measure: str) -> tuple[str, ...]:
    """--measure's choice as the measures it asks for besides the weights: "all" is every one."""
    if measure not in MEASURE_CHOICES:
        raise AttnvizError(f"unknown measure {measure!r}: choose {', '.join(MEASURE_CHOICES)}")
    return tuple(name for name in MEASURES if name != "weights" and measure in (name, "all"))
