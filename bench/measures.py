"""The measures' costs (issue 14, part 4), in one process on the bundled model (6 layers, 12 heads):

    python bench/measures.py [--repeat 9] [--tokens 128] [--flow-lengths 8,16,32,48,64,80,96] [--threads N]

1. norm and value zeroing of every layer of a --tokens text (analysis.measures.measure_layers: the
   layers' weights with both measures) against the plain weights run of the same text
   (attnviz.layers, with rollout), --repeat pairs of warm calls: medians, and the best of each. Target: within 3 times.
   Then the same measures over the text's words (--words), against the measures over its tokens.
2. attention flow (analysis.flow.attention_flow) through the 6 layers of texts of each of
   --flow-lengths tokens, once each (one thread: scipy's flows): FLOW_MAX_TOKENS is the longest under 10 s.
"""

from __future__ import annotations

import argparse
import statistics
import time

WORDS = "the animal did not cross the street because it was too tired and the quick brown fox ran over the lazy dog".split()  # one token each


def text_of(loaded, num_tokens: int) -> str:
    """An English text of exactly num_tokens tokens for the model, [CLS] and [SEP] included."""
    from attnviz.models.tokens import encode

    text = " ".join(WORDS[index % len(WORDS)] for index in range(num_tokens - 2))
    count = len(encode(loaded.tokenizer, [text], 10**6, False).ids[0])
    if count != num_tokens:
        raise ValueError(f"the text meant to be {num_tokens} tokens has {count}")
    return text


def seconds(call) -> tuple[float, float]:
    """Wall-clock and CPU seconds (this process's, every thread's) of one call."""
    wall, cpu = time.perf_counter(), time.process_time()
    call()
    return time.perf_counter() - wall, time.process_time() - cpu


def paired_timings(first, second, repeat: int) -> dict[str, tuple[float, float, float]]:
    """Per statistic: first's time, second's time and their ratio, wall clock, each pair timed back to back
    (the shared machine's load drifts; a pair sees about the same), after one warm call of each.
    "median": medians of the times and of the pairs' ratios; "best": the fastest of each, the least
    disturbed by other processes, and the ratio of the two."""
    first(), second()
    pairs = [(seconds(first)[0], seconds(second)[0]) for _ in range(repeat)]
    best_first, best_second = min(a for a, _ in pairs), min(b for _, b in pairs)
    return {
        "median": (
            statistics.median(a for a, _ in pairs),
            statistics.median(b for _, b in pairs),
            statistics.median(b / a for a, b in pairs),
        ),
        "best": (best_first, best_second, best_second / best_first),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=9)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--flow-lengths", default="8,16,32,48,64,80,96")
    parser.add_argument("--threads", type=int, default=None, help="torch's threads (default: torch's own choice)")
    args = parser.parse_args()

    import torch

    if args.threads:
        torch.set_num_threads(args.threads)

    import attnviz
    from attnviz.analysis.flow import FLOW_MAX_TOKENS, attention_flow
    from attnviz.analysis.measures import measure_layers

    model = attnviz.load("bundled", "cpu")
    loaded = model.loaded
    spec = attnviz.RunOptions(model=model).run_spec(model, layer=None)
    text = text_of(loaded, args.tokens)
    timings = paired_timings(
        lambda: attnviz.layers(text, model=model), lambda: measure_layers(loaded, [text], spec), args.repeat
    )
    print(f"{args.tokens} tokens, {torch.get_num_threads()} threads, {args.repeat} pairs, wall s (median, best):")
    (plain, measured, ratio), (plain_best, measured_best, ratio_best) = timings["median"], timings["best"]
    print(f"  weights (attnviz.layers)            {plain:.3f}  {plain_best:.3f}")
    print(f"  weights + norm + value zeroing      {measured:.3f}  {measured_best:.3f}")
    print(f"  ratio                               {ratio:.2f} x  {ratio_best:.2f} x  (median of the pairs' ratios; ratio of the bests)")
    from dataclasses import replace

    words_spec = replace(spec, words=True)  # the same text over its words: word_measures.py's definitions
    words = paired_timings(lambda: measure_layers(loaded, [text], spec), lambda: measure_layers(loaded, [text], words_spec), args.repeat)
    (tokens_median, words_median, words_ratio), _ = words["median"], words["best"]
    print(f"  the same over words (--words)       {words_median:.3f}         {words_ratio:.2f} x the measures over tokens")
    print(f"attention flow through {loaded.num_layers} layers (FLOW_MAX_TOKENS = {FLOW_MAX_TOKENS}):")
    for length in map(int, args.flow_lengths.split(",")):
        (layers,) = measure_layers(loaded, [text_of(loaded, length)], spec)
        wall, cpu = seconds(lambda: attention_flow([layer.run.attention for layer in layers], max_tokens=None))
        print(f"  {length:4d} tokens  {wall:7.2f} s wall  {cpu:7.2f} s CPU")


if __name__ == "__main__":
    main()
