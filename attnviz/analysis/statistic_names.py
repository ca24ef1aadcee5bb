"""The statistics of `attnviz stats`, named: what statistics.py computes from whole maps and blockwise.py from blocks."""

from __future__ import annotations

import math

# The statistics of one head over one text, in this order in arrays, stats.csv and stats.json.
# A "share" is the mean over queries of the total weight on keys of a kind.
STATISTICS = (
    "entropy",  # mean row entropy, nats
    "relative_entropy",  # mean over queries of entropy / log(keys the query may see): 1 is uniform
    "mean_max",  # mean of the row maxima
    "cls",  # share on [CLS]
    "sep",  # share on [SEP]
    "punctuation",  # share on tokens made only of punctuation characters
    "same",  # share on the query's own token (the diagonal)
    "previous",  # share on key i-1 for query i, over the queries that have one
    "next",  # share on key i+1 for query i, over the queries that have one
    "distance",  # mean over queries of sum_j A_ij |i - j|, in tokens
)
KEY_KINDS = ("cls", "sep", "punctuation")  # the statistics that are shares on a kind of key
LN2 = math.log(2)  # nats per bit
