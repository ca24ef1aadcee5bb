"""`attnviz models`: the models that can be used now."""

from __future__ import annotations

from attnviz.cli.options import app, console


@app.command(short_help='List the models that can be used now.')
def models() -> None:
    """List the models that can be used now: the bundled ones and the local hub cache's models of every supported family.

    The default model (used without --model) is marked; before its download it is listed too, as not offline.
    """
    from attnviz.models.listing import list_models, with_default
    from attnviz.models.loading import BUNDLED_INSTALL_COMMAND, BUNDLED_NAME, DEFAULT_MODEL, bundled_installed
    from attnviz.render import terminal

    console.print(terminal.models_table(
        with_default(list_models()), DEFAULT_MODEL, BUNDLED_NAME if bundled_installed() else None, BUNDLED_INSTALL_COMMAND
    ))
