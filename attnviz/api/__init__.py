"""attnviz's Python API: the functions and results that `import attnviz` exposes.

models: attnviz.load and the model handle (loaded once per process); functions: heads, trace,
stats, layers, compare, position; report: attnviz.report, every stage's numbers of a text gathered
for the interactive page; results and experiment_results: what they return, each able to
draw itself (.figure()), write the command's files (.save()), make the interactive report
(.report(), a ReportResult) and display itself in Jupyter (_repr_html_) and Rich (__rich__);
display: the HTML. Heavy libraries load inside functions.
"""
