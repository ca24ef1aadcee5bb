"""The Hugging Face hub's side of loading a model: whether the hub answers, and what a failed download means.

models/loading.py asks here before it downloads: a short HEAD request to the hub, in a daemon thread, so that a
machine without network falls back (the default model) or says why (a named one) within about two seconds.
huggingface_hub is imported inside the functions, so importing this module stays instant.
"""

from __future__ import annotations

import threading
from pathlib import Path

from attnviz.errors import AttnvizError

# How long the hub check may wait for an answer. DNS lookups ignore socket timeouts, so the check
# runs in a daemon thread that we stop waiting for after HUB_PROBE_TIMEOUT_S + HUB_PROBE_GRACE_S.
HUB_PROBE_TIMEOUT_S = 1.5
HUB_PROBE_GRACE_S = 0.5


class HubUnavailable(Exception):
    """The model is not in the local cache and the hub cannot be had; `reason` completes a sentence."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


def check_hub_cache(cache: Path) -> None:
    """Refuse a hub cache that is a file or lies under one (the hub library would fail on it mid-way)."""
    existing = next(path for path in (cache, *cache.parents) if path.exists())
    if not existing.is_dir():
        where = "is a file" if existing == cache else f"lies under a file, {existing}"
        raise AttnvizError(f"the hub cache {cache} {where}: point HF_HUB_CACHE (or HF_HOME) at a folder, or unset it")


def hub_answers(endpoint: str) -> bool:
    """True if the hub answers a HEAD request within about HUB_PROBE_TIMEOUT_S without a server error.

    A 4xx counts as an answer: some hub proxies serve models but not their front page. A 5xx
    (e.g. a proxy that cannot reach the hub) does not: the hub client would retry it for a while.
    """
    from huggingface_hub import get_session  # imported here, not in the thread: imports take a lock

    session = get_session()  # the hub's own client: the same proxies and certificates as a download
    answered = threading.Event()

    def probe() -> None:
        try:
            response = session.head(endpoint, timeout=HUB_PROBE_TIMEOUT_S)
        except Exception:  # refused, DNS failure, TLS error, timeout: all mean "cannot be reached"
            return
        if response.status_code < 500:
            answered.set()

    # daemon: a DNS lookup that hangs must not keep the process alive after we stop waiting.
    thread = threading.Thread(target=probe, name="attnviz-hub-probe", daemon=True)
    thread.start()
    thread.join(HUB_PROBE_TIMEOUT_S + HUB_PROBE_GRACE_S)
    return answered.is_set()


def is_connection_error(error: BaseException) -> bool:
    from huggingface_hub.errors import LocalEntryNotFoundError  # what the hub raises when it could not connect

    if isinstance(error, (LocalEntryNotFoundError, ConnectionError, TimeoutError)):
        return True
    try:
        from huggingface_hub.utils import httpx  # the hub's HTTP client (httpx2), for a connection lost mid-download
    except ImportError:
        return False
    return isinstance(error, httpx.TransportError)


def causes(error: BaseException) -> list[BaseException]:
    """The error and the chain of errors it was raised from."""
    chain = []
    while error is not None and error not in chain:
        chain.append(error)
        error = error.__cause__ or error.__context__
    return chain
