"""What `attnviz serve` computes: the models named at start, loaded once, and a request's run through attnviz.heads.

A request is a JSON object (docs/formats.md, "attnviz serve's HTTP API"): its text, the model among those loaded,
and a few of attnviz.heads' options. Every check is the API's own (RunOptions, check_text, the model's positions);
the server adds only what a shared process needs: no model but those named at start (a handle is passed, so no path
or hub id from a request ever loads), at most max_tokens tokens, and one computation at a time per model, with at
most `waiting` requests waiting for it (Busy past that: the server answers 503).
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass

from attnviz.errors import AttnvizError

DEFAULT_MAX_TOKENS = 2048
DEFAULT_WAITING = 16  # requests that may wait for a model busy with another: 8 clients at once all get their answer
REQUEST_OPTIONS = ("layer", "heads", "kv", "causal", "words", "stack")  # attnviz.heads' options a request may set
REQUEST_FIELDS = ("text", "model", "as", *REQUEST_OPTIONS)
ANSWERS = ("attention", "report")  # "as": attention.json's record (4 decimals), or the report's record (the page's)
DECIMALS = 4  # the page's read-out, and the report's exact weights


class Busy(Exception):
    """A model is computing and `waiting` requests wait for it already: the server answers 503."""


@dataclass(frozen=True)
class ServeSettings:
    """The server's own settings, not a run's (so not RunOptions): where it listens and what one request may ask."""

    host: str = "127.0.0.1"
    port: int = 8000
    max_tokens: int = DEFAULT_MAX_TOKENS
    waiting: int = DEFAULT_WAITING

    def __post_init__(self) -> None:
        if not 0 <= self.port <= 65535:
            raise AttnvizError(f"--port {self.port} is out of range: give 0 (any free port) to 65535")
        if self.max_tokens < 1:
            raise AttnvizError(f"--max-tokens {self.max_tokens}: give at least 1")


class ModelTurns:
    """One computation at a time on a model, and at most `waiting` requests waiting for their turn."""

    def __init__(self, waiting: int):
        self.lock = threading.Lock()
        self.places = threading.BoundedSemaphore(waiting + 1)  # the one computing and those waiting

    def __enter__(self):
        if not self.places.acquire(blocking=False):
            raise Busy()
        self.lock.acquire()
        return self

    def __exit__(self, *exc) -> None:
        self.lock.release()
        self.places.release()


class Explorer:
    """The loaded models by name (the names given at start, in order) and the runs of requests on them."""

    def __init__(self, handles: dict, settings: ServeSettings):
        self.handles = dict(handles)  # name -> attnviz.Model
        self.settings = settings
        self.turns = {name: ModelTurns(settings.waiting) for name in self.handles}

    @staticmethod
    def load(names: list[str], settings: ServeSettings, device: str = "auto", dtype: str = "auto") -> "Explorer":
        """The named models loaded once each, through attnviz.load (None or []: the default model)."""
        from attnviz.api.models import load

        handles = {}
        for name in dict.fromkeys(names or [None]):
            handle = load(name, device, dtype=dtype)
            handles[name or handle.resolved] = handle  # the default model by the name it resolved to
        return Explorer(handles, settings)

    def models(self) -> dict:
        """GET /api/models: each model's name, family, kind and sizes, and the longest text a request may give."""
        return {
            "models": [
                {
                    "name": name, "family": handle.family, "kind": handle.kind, "num_layers": handle.num_layers,
                    "num_heads": handle.num_heads, "num_kv_heads": handle.num_kv_heads, "device": handle.device,
                }
                for name, handle in self.handles.items()
            ],
            "max_tokens": self.settings.max_tokens,
        }  # fmt: skip

    def heads(self, request: dict) -> str:
        """POST /api/heads: the request's run through attnviz.heads, as the JSON text of its record (raises AttnvizError
        for a request refused, Busy when the model's queue is full)."""
        import attnviz

        text, name, answer, options = self.checked(request)
        handle = self.handles[name]
        self.check_length(handle, text, options.get("kv"))
        with self.turns[name]:
            # the page's record: with the neuron view's q and k where a report holds them (up to 64 tokens)
            result = attnviz.heads(text, model=handle, vectors=None if answer == "report" else False, **options)
            if answer == "report":
                return json.dumps(result.report().record, ensure_ascii=False)
            return attention_json(result)

    def checked(self, request) -> tuple[str, str, str, dict]:
        """The request's text, model name, answer and options, each checked before any work."""
        from attnviz.api.options import RunOptions
        from attnviz.spec import check_text

        if not isinstance(request, dict):
            raise AttnvizError("the request body is not a JSON object: give {\"text\": ..., \"layer\": ...}")
        unknown = [field for field in request if field not in REQUEST_FIELDS]
        if unknown:
            raise AttnvizError(f"unknown field {unknown[0]!r}: a request takes {', '.join(REQUEST_FIELDS)}")
        text = request.get("text")
        if not isinstance(text, str):
            raise AttnvizError("the request has no \"text\" string")
        check_text(text)
        name = request.get("model", next(iter(self.handles)))
        if not isinstance(name, str) or name not in self.handles:
            raise AttnvizError(f"model {str(name)[:80]!r} is not loaded here: this server has {', '.join(self.handles)}")
        answer = request.get("as", "attention")
        if answer not in ANSWERS:
            raise AttnvizError(f"\"as\" is one of {', '.join(ANSWERS)}, not {str(answer)[:40]!r}")
        options = {field: request[field] for field in REQUEST_OPTIONS if field in request}
        RunOptions(**options)  # every option's type and value checked as the API checks them
        return text, name, answer, options

    def check_length(self, handle, text: str, kv: str | None) -> None:
        """A text (or kv text) past max_tokens tokens is refused before it runs, in one line."""
        from attnviz.api.functions import token_counts

        limit = self.settings.max_tokens
        for what, each in (("the text", text), ("the kv text", kv)):
            if each is None:
                continue
            (count,) = token_counts(handle.loaded, [each])
            if count > limit:
                raise AttnvizError(f"{what} has {count:,} tokens: this server takes at most {limit:,} (--max-tokens)")


def attention_json(result) -> str:
    """attention.json's record of a HeadsResult with its weights to DECIMALS decimals, written as the file writes them."""
    import numpy as np

    from attnviz.output.export import attention_record, weights_json

    record = json.dumps(attention_record(result.run, result.spec, effects=result.effects), ensure_ascii=False)
    weights = weights_json(np.asarray(result.run.attention), DECIMALS)  # (H, Nq, Nk); a map on disk read whole
    return record.removesuffix("null}") + weights + "}"
