"""The rendering face: figures (heatmap, stats_figures, compare_figures, trace_figures, with fonts,
scales and titles) and the terminal's tables (terminal, trace_render).

Renderers read results (attnviz.result, the analysis and trace results) and never compute
attention; matplotlib and rich are imported here, never below.
"""
