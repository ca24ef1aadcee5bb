"""How a result shows itself: self-contained HTML for Jupyter, and Rich renderables for a terminal.

The HTML is a figure as an inline base64 PNG, the tokens, and a short table: no scripts, no
network, so a saved notebook shows it anywhere.
"""

from __future__ import annotations

import base64
import html
import io

def figure_png(figure) -> bytes:
    """The figure as a PNG at its own dpi, the one its maps were fitted to (render/scales.show_attention).

    At a lower dpi Agg would drop rows and columns of a map that has a pixel per cell or per block, so
    a head that puts all its weight on one key could lose it inline, and "max of ≤k×k cells" would
    overstate what is shown: a notebook shows the pixels the files have.
    """
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=figure.dpi)
    return buffer.getvalue()


def figure_html(figure, alt: str) -> str:
    encoded = base64.b64encode(figure_png(figure)).decode("ascii")
    return f'<img src="data:image/png;base64,{encoded}" alt="{html.escape(alt)}" style="max-width:100%">'


def tokens_html(tokens: list[str], label: str = "tokens") -> str:
    """ "0:[CLS] 1:我 …": each token with its index, as the terminal and the tables name them."""
    cells = " ".join(f"<code>{index}:{html.escape(token)}</code>" for index, token in enumerate(tokens))
    return f"<p><b>{html.escape(label)}</b> {cells}</p>"


def notes_html(notes: list[str]) -> str:
    return "".join(f"<p><i>note: {html.escape(note)}</i></p>" for note in dict.fromkeys(notes))


def table_html(headers: list[str], rows: list[list], caption: str = "") -> str:
    head = "".join(f"<th>{html.escape(str(name))}</th>" for name in headers)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(str(cell))}</td>" for cell in row) + "</tr>" for row in rows)
    caption_html = f"<caption style='caption-side:bottom'>{html.escape(caption)}</caption>" if caption else ""
    return f"<table>{caption_html}<thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def result_html(title: str, *parts: str) -> str:
    return f"<div class='attnviz'><h4>{html.escape(title)}</h4>{''.join(parts)}</div>"


def number(value: float, digits: int = 2) -> str:
    return f"{value:.{digits}f}"


class Printed:
    """A console stand-in for the CLI's print_* renderers: it keeps what they print, as a Rich Group.

        printed = Printed(width)
        stats_tables.print_rollout(printed, tokens, rollout)
        printed.group()  # what the CLI would have printed
    """

    def __init__(self, width: int = 80):
        self.width = width
        self.renderables: list = []

    def print(self, *objects, **_options) -> None:
        from rich.text import Text

        self.renderables.extend(objects or [Text("")])

    def group(self):
        from rich.console import Group

        return Group(*self.renderables)
