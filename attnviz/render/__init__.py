"""The rendering face: figures (heatmap, stats_figures, compare_figures, mistake_figures, with fonts,
scales and titles) and the terminal's tables (terminal, trace_tables).

Renderers read results (attnviz.run_data, the analysis and trace results) and never compute
attention; matplotlib and rich are imported here, never below.
"""
