"""attnviz's Python API: the functions and results that `import attnviz` exposes.

models: attnviz.load and the model handle (loaded once per process); functions: heads, trace,
stats, layers, compare, position; file_runs: heads_file and stats_file, the commands' --file over
a file or an iterable of texts, streamed; drawn: the checks of what heads draws (head, window,
figures); report: attnviz.report, every stage's numbers of a text gathered for the interactive
page; results and experiment_results: what they return, each able to draw itself (.figure()),
write the command's files (.save()), make the interactive report (.report(), a ReportResult) and
display itself in Jupyter (_repr_html_) and Rich (__rich__); display: the HTML. Heavy libraries
load inside functions.
"""
