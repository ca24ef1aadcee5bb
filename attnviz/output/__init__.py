"""The output face: run folders (runs), pipe-safe streams (streams), the JSON and CSV files
(export for attention.json, stats_export, compare_json, position_json, trace_files), and the
batch of `heads --file` (batch), which runs the pipeline batch by batch and writes a folder per
text with render's heatmaps: it may use the stages and render, never the reverse.
"""
