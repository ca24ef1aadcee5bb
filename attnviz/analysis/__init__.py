"""The analysis stage: numbers computed from attention.

statistics (per-head statistics and labels, plain NumPy), rollout (attention rollout through the
layers), measure (every head of every layer, batch by batch, for `stats`), compare (one layer split
into several head counts), position (the permutation experiment), and what the weights leave
out: norms (Kobayashi et al. 2020), value_zeroing (Mohebbi et al. 2023) and flow (Abnar & Zuidema
2020), run layer by layer by measures. It runs the pipeline and
never draws or writes: attnviz.render and attnviz.output read its results.
"""
