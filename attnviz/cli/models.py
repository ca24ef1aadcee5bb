"""`attnviz models`: the models that can be used now."""

from __future__ import annotations

from attnviz.cli.options import app, console


@app.command(short_help='List the models that can be used now.')
def models() -> None:
    """List the models that can be used now: the bundled ones and the local hub cache's models of every supported family."""
    from attnviz.models.listing import list_models
    from attnviz.render import terminal

    console.print(terminal.models_table(list_models()))
