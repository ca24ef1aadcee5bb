"""The offline HTML report: one file, its data inline, its views drawn by plain JavaScript.

    record = report_record(texts, spec, kind="encoder", num_layers=6)   # plain data (record.py)
    page = report_page(record)                                          # the whole HTML file, a str (page.py)

A face over the same results as the figures and files: it reads AttentionRuns, statistics and
traces, never computes attention, and imports no torch or matplotlib. The page's views are the
JavaScript files in static/ (package data, written in this repository, no build step).
"""

from attnviz.html.page import report_page
from attnviz.html.record import ReportText, report_record

__all__ = ["ReportText", "report_page", "report_record"]
