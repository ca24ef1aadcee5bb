"""The analysis stage: numbers computed from attention.

statistics (per-head statistics and labels, plain NumPy), rollout (attention rollout through the
layers), measure (every head of every layer, batch by batch, for `stats`), compare (one layer split
into several head counts) and position (the permutation experiment). It runs the pipeline and
never draws or writes: attnviz.render and attnviz.output read its results.
"""
