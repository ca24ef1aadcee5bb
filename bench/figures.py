"""Every figure attnviz draws, timed at 512 tokens in one process after loading (issue 15, part 3):

    python bench/figures.py [--repeat 3] [--tokens 512] [--only layers.png,merge.png]

The bundled model (6 layers, 12 heads) runs every computation first; then each figure is drawn and
saved as a PNG --repeat times, the figures interleaved round by round (a drift of a shared machine
falls on all alike). Per figure one line:

    drawn: files=1 wall_s=0.61 cpu_s=0.60 cpu_per_file_s=0.60 width=1272 height=1091 within_cap=yes figure=layers.png

with the medians of wall-clock and CPU seconds (this process's, every thread's), the PNG's pixels
(the largest file's) and whether it is within its stated size (attnviz.render.sizes). Target: every
figure under 2 s. Figures drawn as a set (the 12 head_XX maps, a wrong split's heads and their
grid) are timed as the set: their line names the set, and cpu_per_file_s is the set's mean.
flow.png and measures.png (--measure flow, all) have no case: flow refuses texts past 88 tokens.
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import tempfile
import time
from pathlib import Path

WORDS = "the animal did not cross the street because it was too tired and the quick brown fox ran over the lazy dog".split()


def long_text(num_tokens: int) -> str:
    """More words than num_tokens: --truncate (truncate=True) cuts the text to the model's positions or fewer."""
    return " ".join(WORDS[index % len(WORDS)] for index in range(num_tokens + 40))


def figure_cases(num_tokens: int) -> dict:
    """Each figure's name and a function out_dir -> paths that draws and saves it, all computed beforehand."""
    import attnviz
    from attnviz.render import compare_figures, heatmap, measure_figures, position_figure, stats_figures, mistake_figures

    text = long_text(num_tokens)
    model = attnviz.load("bundled", device="cpu")
    common = {"model": model, "device": "cpu", "truncate": True}
    heads = attnviz.heads(text, **common)
    run = heads.run
    measured = attnviz.heads(text, measure="norm", **common)
    zeroed = attnviz.heads(text, measure="value-zeroing", **common)
    layers = attnviz.layers(text, **common)
    layers_norm = attnviz.layers(text, measure="norm", **common)
    stats = attnviz.stats([text], **common)
    compare = attnviz.compare(text, model=model, device="cpu", truncate=True)
    position_text = " ".join(text.split()[: num_tokens - 2])  # position has no --truncate: [CLS] and [SEP] added
    position = attnviz.position(position_text, model=model, device="cpu")
    merge = attnviz.trace(text, mistake="merge-without-permute", **common)
    split = attnviz.trace(text, mistake="view-without-permute", **common)
    print(f"tokens={len(run.query_tokens)}", file=sys.stderr)

    def merge_figure(out_dir: Path) -> list[Path]:
        path = out_dir / f"{mistake_figures.mistake_prefix('merge-without-permute')}merge.png"
        return [mistake_figures.write_merge_figure(merge.trace, merge.runs[0], path, [], 0)]

    def split_figures(out_dir: Path) -> list[Path]:
        return mistake_figures.write_split_heatmaps(split.trace, split.runs[0], out_dir, "png", [], 0)

    def norm_figures(out_dir: Path) -> list[Path]:
        return measure_figures.write_measure_figures(measured.run, measured.measures, out_dir)

    def zeroing_figures(out_dir: Path) -> list[Path]:
        return measure_figures.write_measure_figures(zeroed.run, zeroed.measures, out_dir)

    def layers_norm_figure(out_dir: Path) -> list[Path]:
        runs = layers_norm.layer_runs
        return measure_figures.write_layers_measure_figures(runs, layers_norm.rollout, layers_norm.measures, out_dir)

    return {
        "head_XX.png (12 heads)": lambda out: heatmap.write_head_heatmaps(run, out),
        "heads.png": lambda out: [heatmap.write_heads_grid(run, out)],
        "layers.png": lambda out: [stats_figures.write_layers_grid(layers.layer_runs, out)],
        "rollout.png": lambda out: [stats_figures.write_rollout(layers.layer_runs, layers.rollout, out)],
        "js_distance.png": lambda out: [stats_figures.write_js_distance(stats.stats.js_distance, stats.first_run, stats.texts, out)],
        "compare.png": lambda out: [compare_figures.write_comparison_figure(compare.splits, out)],
        "position.png": lambda out: [position_figure.write_position_figure(position.result, out)],
        "merge.png (trace --mistake merge-without-permute)": merge_figure,
        "wrong heads (trace --mistake view-without-permute)": split_figures,
        "norm_heads.png + norm.png (--measure norm)": norm_figures,
        "value_zeroing.png (--measure value-zeroing)": zeroing_figures,
        "norm_layers.png (layers --measure norm)": layers_norm_figure,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--tokens", type=int, default=512)
    parser.add_argument("--only", default="", help="comma-separated names' beginnings, e.g. layers,merge")
    parser.add_argument("--keep", default="", help="a folder to keep the last round's PNGs in, to look at")
    args = parser.parse_args()

    from PIL import Image

    from attnviz.render.sizes import figure_max_px

    cases = figure_cases(args.tokens)
    if args.only:
        cases = {name: draw for name, draw in cases.items() if name.startswith(tuple(args.only.split(",")))}
    timings = {name: [] for name in cases}
    sizes, counts, within = {}, {}, {}
    with tempfile.TemporaryDirectory() as scratch:
        out = Path(args.keep) if args.keep else Path(scratch)
        out.mkdir(parents=True, exist_ok=True)
        next(iter(cases.values()))(out)  # untimed: fonts and matplotlib's caches loaded before any timing
        for _ in range(args.repeat):
            for name, draw in cases.items():
                gc.collect()  # untimed: the figures of the case before are not collected in this one's time
                wall, cpu = time.perf_counter(), time.process_time()
                paths = draw(out)
                timings[name].append((time.perf_counter() - wall, time.process_time() - cpu))
                sizes[name] = max((Image.open(path).size for path in paths), key=lambda size: size[0] * size[1])
                counts[name] = len(paths)
                within[name] = all(fits(Image.open(path).size, figure_max_px(path.name)) for path in paths)
    for name, runs in timings.items():
        wall = statistics.median(w for w, _ in runs)
        cpu = statistics.median(c for _, c in runs)
        width, height = sizes[name]
        print(
            f"drawn: files={counts[name]} wall_s={wall:.3f} cpu_s={cpu:.3f} cpu_per_file_s={cpu / counts[name]:.3f} "
            f"width={width} height={height} within_cap={'yes' if within[name] else 'NO'} figure={name}"
        )


def fits(size: tuple[int, int], most: tuple[int, int]) -> bool:
    return size[0] <= most[0] and size[1] <= most[1]


if __name__ == "__main__":
    main()
