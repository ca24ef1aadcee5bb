"""One HTML file: the template with the styles, the scripts and the record inline.

The page needs nothing but a browser: no request to any host, ever. Its Content-Security-Policy
says so to the browser too: no source but the page itself (default-src 'none'), and of scripts
only the one inline script whose sha256 the policy names, so even a text that slipped in as
markup could run nothing (no inline event handler, no injected script). The record goes in as
JSON in a <script type="application/json"> element, with every "<" escaped, so no text can end
that element early. Its CJK glyphs come with it too (font.py: a subset of the bundled Noto Sans
CJK SC as a data: font), so Chinese shows on a machine without a CJK font; `attnviz serve`'s answers carry
theirs (explorer_font), which its page adds as it shows each.
"""

from __future__ import annotations

import base64
import hashlib
import html
import json
import re
from importlib import resources

from attnviz.html.font import FAMILY, font_face, font_url, shown_characters
from attnviz.text import shorten

# The page's scripts, in the order they run: core.js defines window.AV, the views register
# themselves with it, main.js starts the page.
SCRIPTS = (
    "core.js",
    "header.js",
    "selection.js",
    "head_view.js",
    "model_view.js",
    "why_terms.js",
    "heatmap_view.js",
    "neuron_view.js",
    "trace_view.js",
    "stats_view.js",
    "zoom_view.js",
    "main.js",
)
# A report of a long text (html/record.py is_long: a "zoom", no whole map) adds these before main.js: the
# Summaries view, and long_text.js, which shows the Zoom view first and leaves out the views that need whole maps.
# A short report's page is what it was, byte for byte.
LONG_SCRIPTS = ("summaries_view.js", "long_text.js")
DIFF_SCRIPTS = ("diff_view.js",)  # a report of `attnviz diff` (a text with a "diff"): the Diff view, shown first
GENERATE_SCRIPTS = ("generate_view.js",)  # a report of `attnviz generate` (a "generation"): its stepper, shown first
# `attnviz serve`'s page (explorer_page): the report's views, the Summaries view of a long text, the Roles and Patching
# views of its roles and patch answers, and explorer.js (the text box, the model and layer pickers, the inputs of roles
# and patch, the requests) before main.js; any view registered in SCRIPTS shows up there too.
EXPLORER_SCRIPTS = ("summaries_view.js", "roles_view.js", "patch_view.js", "explorer.js")
ROLES_SCRIPTS = ("roles_view.js",)  # a report of `attnviz roles` (a text with "roles"): the Roles view, shown first
# a report of `attnviz patch` (a "patch"): the Patching view, shown first; the Edges view beside it (with --edges)
PATCH_SCRIPTS = ("patch_view.js", "edges_view.js")
STYLES = ("report.css",)
TEMPLATE = "report.html"
TITLE_CHARS = 60
_SLOT = re.compile(r"<!--attnviz:(\w+)-->")


def static_text(name: str) -> str:
    return resources.files("attnviz.html").joinpath("static", name).read_text(encoding="utf-8")


def _static_names() -> set[str]:
    return {entry.name for entry in resources.files("attnviz.html").joinpath("static").iterdir()}


def page_script(long: bool = False, diff: bool = False, generation: bool = False, roles: bool = False,
                patch: bool = False, explorer: bool = False) -> str:
    """The scripts, joined in SCRIPTS' order (each file keeps its names to itself); long: LONG_SCRIPTS before main.js,
    diff: DIFF_SCRIPTS, generation: GENERATE_SCRIPTS, roles: ROLES_SCRIPTS, patch: PATCH_SCRIPTS, explorer:
    EXPLORER_SCRIPTS."""
    present = _static_names()
    extra = [*(LONG_SCRIPTS if long else ()), *(DIFF_SCRIPTS if diff else ()), *(GENERATE_SCRIPTS if generation else ()),
             *(ROLES_SCRIPTS if roles else ()), *(PATCH_SCRIPTS if patch else ()), *(EXPLORER_SCRIPTS if explorer else ())]  # fmt: skip
    names = [*SCRIPTS[:-1], *extra, SCRIPTS[-1]]
    script = "\n".join(f"// ---- {name} ----\n{static_text(name)}" for name in names if name in present)
    if "</script" in script.lower() or "<!--" in script:
        raise ValueError("a report script holds '</script' or '<!--', which the HTML parser reads inside a script")
    return script


def record_json(record: dict) -> str:
    """The record as JSON safe inside a <script> element: every "<" written as \\u003c."""
    return json.dumps(record, ensure_ascii=False, separators=(",", ":")).replace("<", "\\u003c")


def content_security_policy(script: str, connect: bool = False) -> str:
    """The page's policy: its one script by its sha256, nothing loaded from anywhere; connect: it may also send requests
    to the host that served it (`attnviz serve`'s page, and nothing else)."""
    digest = base64.b64encode(hashlib.sha256(script.encode("utf-8")).digest()).decode("ascii")
    policy = f"default-src 'none'; script-src 'sha256-{digest}'; style-src 'unsafe-inline'; img-src data: blob:; font-src data:"
    return policy + ("; connect-src 'self'; form-action 'none'; base-uri 'none'" if connect else "")


def report_page(record: dict) -> str:
    """The report's HTML file (docs/formats.md, "report.html") for a record of html.record.report_record."""
    texts = record.get("texts", ())
    has = lambda name: any(isinstance(text, dict) and text.get(name) is not None for text in texts)  # noqa: E731
    script = page_script(has("zoom"), diff=has("diff"), generation=has("generation"), roles=has("roles"), patch=has("patch"))
    first_text = record["texts"][0]["text"] if record.get("texts") else ""
    return filled_template(record_json(record), script, content_security_policy(script), f"attnviz · {shorten(first_text, TITLE_CHARS)}")


def explorer_page(setup: dict) -> tuple[str, str]:
    """`attnviz serve`'s page and its Content-Security-Policy: the report's template, views and styles around setup
    (format "attnviz-explorer": the models, max_tokens and the token its requests carry), whose explorer.js asks the
    server for records (docs/formats.md, "attnviz serve's HTTP API") and shows each with the report's views. Its font
    holds the CJK glyphs of its own words; each answer brings those of its record (explorer_font)."""
    script = page_script(explorer=True)
    policy = content_security_policy(script, connect=True)
    return filled_template(record_json({"format": "attnviz-explorer", **setup}), script, policy, "attnviz serve"), policy


def explorer_font(record: dict, setup: dict) -> dict | None:
    """The font that an answer of `attnviz serve` carries for its page (font.py's subset, as report_page embeds its
    own): {"family", "url"} of the glyphs of the record's CJK characters and of the page's own (its setup and its
    scripts), so that this one font draws every character the page shows with it; None where there is no CJK."""
    url = font_url(shown_characters(record_json(record) + record_json(setup), page_script(explorer=True)))
    return {"family": FAMILY, "url": url} if url else None


def filled_template(data: str, script: str, policy: str, title: str) -> str:
    """The template with the page's data (record_json's), its script, its policy and its title, and its styles."""
    styles = [font_face(shown_characters(data, script)), *(static_text(name) for name in STYLES if name in _static_names())]
    slots = {
        "csp": html.escape(policy),
        "title": html.escape(title),
        "style": "\n".join(style for style in styles if style),
        "data": data,
        "script": script,
    }
    # One pass over the template: nothing inserted is searched again for slots.
    return _SLOT.sub(lambda match: slots[match.group(1)], static_text(TEMPLATE))
