"""`attnviz serve`: a local page where a typed text is its heads a moment later, on models loaded once."""

from __future__ import annotations

from typing import List, Optional

import typer

from attnviz.cli.options import MAX_COUNT, Device, DeviceOption, Dtype, DtypeOption, LayerAtATimeOption, app, errors
from attnviz.errors import AttnvizError


@app.command(short_help="A local page where a text typed is its heads a moment later (and an HTTP API).")
def serve(
    model: Optional[List[str]] = typer.Option(
        None, "--model", "-m", metavar="NAME", help="A model to load and offer (hub id, local folder, bundled, smollm2); give it again for more. "
        "(default: the default model)", show_default=False,
    ),
    port: int = typer.Option(8000, "--port", min=0, max=65535, help="The port to listen on (0: any free one)."),
    host: str = typer.Option(
        "127.0.0.1", "--host", help="The address to listen on. Another than 127.0.0.1 lets other machines reach the page (with the token); "
        "0.0.0.0 (or ::) listens on every address of this machine."
    ),
    max_tokens: int = typer.Option(2048, "--max-tokens", min=1, max=MAX_COUNT, metavar="N", help="The most tokens a text of a request may have."),
    device: Device = DeviceOption,
    dtype: Dtype = DtypeOption,
    layer_at_a_time: bool = LayerAtATimeOption,
) -> None:
    """Serve a page of the report's views that runs each text typed on the warm models (its heads, roles or patching),
    and POST /api/heads, /api/roles and /api/patch.

    The first line printed is the page's URL, with its token (every request needs it). The page and the API answer
    only this machine unless --host says otherwise; docs/formats.md documents the API.
    """
    from attnviz.serve.explorer import Explorer, ServeSettings
    from attnviz.serve.http import LOOPBACK_NAMES, WILDCARDS, ExplorerServer

    if not host.strip():
        raise AttnvizError("--host is empty: give an address, e.g. 127.0.0.1")
    settings = ServeSettings(host=host, port=port, max_tokens=max_tokens)
    server = ExplorerServer(settings)  # the port taken before the models load: a port in use is one line, exit 2
    if host not in LOOPBACK_NAMES:
        reach = f"any address of this machine ({', '.join(server.addresses)})" if host in WILDCARDS else "this address"
        errors.print(f"warning: --host {host}: other machines that reach {reach} can use the server (with its token)", soft_wrap=True)
    with server:
        server.explorer = Explorer.load(model or [], settings, device.value, dtype.value, layer_at_a_time)
        print(server.url, flush=True)
        errors.print(f"serving {', '.join(server.explorer.handles)}; Ctrl-C ends it", soft_wrap=True)
        server.serve_forever()
