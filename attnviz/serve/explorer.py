"""What `attnviz serve` computes: the models named at start, loaded once, and a request's run through attnviz.heads,
attnviz.roles or attnviz.patch.

A request is a JSON object (docs/formats.md, "attnviz serve's HTTP API"): its text, the model among those loaded,
and a few of the API function's arguments. Every check is the API's own (RunOptions, check_text, the model's
positions, roles' and patch's own checks);
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
# POST /api/roles and /api/patch: the text, the model and attnviz.roles' or attnviz.patch's own arguments (which they check)
ROLES_FIELDS = ("text", "model", "stack", "exclude_bos", "exclude_current", "sinks", "recent")
PATCH_FIELDS = ("text", "model", "corrupt", "answer", "wrong", "position", "component", "per_position")
PATCH_NEEDS = ("corrupt", "answer", "wrong")
# POST /api/why: a cell of a head's map, its score split (attnviz.why's arguments, which it checks)
WHY_FIELDS = ("text", "model", "layer", "head", "query", "key")
WHY_TOP = 12  # the terms an answer lists, largest first (why.json has them all)
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
    def load(names: list[str], settings: ServeSettings, device: str = "auto", dtype: str = "auto", layer_at_a_time: bool = False) -> "Explorer":
        """The named models loaded once each, through attnviz.load (None or []: the default model); layer_at_a_time:
        load's."""
        from attnviz.api.models import load

        handles = {}
        for name in dict.fromkeys(names or [None]):
            handle = load(name, device, dtype=dtype, layer_at_a_time=layer_at_a_time)
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
        from attnviz.api.options import RunOptions

        text, name = self.checked(request, REQUEST_FIELDS)
        answer = request.get("as", "attention")
        if answer not in ANSWERS:
            raise AttnvizError(f"\"as\" is one of {', '.join(ANSWERS)}, not {str(answer)[:40]!r}")
        options = {field: request[field] for field in REQUEST_OPTIONS if field in request}
        RunOptions(**options)  # every option's type and value checked as the API checks them
        handle = self.handles[name]
        self.check_length(handle, {"the text": text, "the kv text": options.get("kv")})
        with self.turns[name]:
            # the page's record: with the neuron view's q and k where a report holds them (up to 64 tokens)
            result = attnviz.heads(text, model=handle, vectors=None if answer == "report" else False, **options)
            if answer == "attention":
                return attention_json(result)
            record = result.report().record
        return self.report_json(record)

    def roles(self, request: dict) -> str:
        """POST /api/roles: attnviz.roles of the request's text, as the report's record that `attnviz roles` writes
        into report.html (its Roles view's, every layer's maps, statistics and traces)."""
        import attnviz

        text, name = self.checked(request, ROLES_FIELDS)
        handle = self.handles[name]
        self.check_length(handle, {"the text": text})
        arguments = {field: request[field] for field in ROLES_FIELDS[2:] if field in request}
        with self.turns[name]:
            record = attnviz.roles(text, model=handle, **arguments).report().record
        return self.report_json(record)

    def patch(self, request: dict) -> str:
        """POST /api/patch: attnviz.patch of the request's clean and corrupted texts, as the report's record that
        `attnviz patch` writes into report.html (its Patching view's)."""
        import attnviz

        text, name = self.checked(request, PATCH_FIELDS)
        missing = [field for field in PATCH_NEEDS if field not in request]
        if missing:
            raise AttnvizError(f"the request has no {missing[0]!r}: a patch needs {', '.join(PATCH_NEEDS)} besides the text")
        handle = self.handles[name]
        self.check_length(handle, {"the text": text, "the corrupted text": request.get("corrupt")})
        arguments = {field: request[field] for field in PATCH_FIELDS[2:] if field in request}
        with self.turns[name]:
            record = attnviz.patch(text, model=handle, **arguments).report().record
        return self.report_json(record)

    def why(self, request: dict) -> str:
        """POST /api/why: attnviz.why of the request's cell (layer, head, query, key), as why.json's record with its
        WHY_TOP largest terms in place of every term ("top": [query part, key part, term]; "num_terms"; "rest": the
        other terms summed)."""
        import attnviz

        text, name = self.checked(request, WHY_FIELDS)
        missing = [field for field in WHY_FIELDS[2:5] if field not in request]
        if missing:
            raise AttnvizError(f"the request has no {missing[0]!r}: a score's split needs a layer, a head and a query")
        handle = self.handles[name]
        self.check_length(handle, {"the text": text})
        arguments = {field: request[field] for field in WHY_FIELDS[2:] if field in request}
        with self.turns[name]:
            result = attnviz.why(text, model=handle, **arguments)
        record = {field: value for field, value in result.to_dict().items() if field != "terms"}
        top = result.top(WHY_TOP)
        rest = result.terms.total - sum(term for _, _, term in top)  # the other terms summed
        return json.dumps({**record, "num_terms": int(result.terms.terms.size), "top": top, "rest": rest}, ensure_ascii=False)

    def checked(self, request, fields: tuple[str, ...]) -> tuple[str, str]:
        """The request's text and model name, and its fields among those its route takes, each checked before any work."""
        from attnviz.spec import check_text

        if not isinstance(request, dict):
            raise AttnvizError("the request body is not a JSON object: give {\"text\": ..., \"layer\": ...}")
        unknown = [field for field in request if field not in fields]
        if unknown:
            raise AttnvizError(f"unknown field {unknown[0]!r}: a request takes {', '.join(fields)}")
        text = request.get("text")
        if not isinstance(text, str):
            raise AttnvizError("the request has no \"text\" string")
        check_text(text)
        name = request.get("model", next(iter(self.handles)))
        if not isinstance(name, str) or name not in self.handles:
            raise AttnvizError(f"model {str(name)[:80]!r} is not loaded here: this server has {', '.join(self.handles)}")
        return text, name

    def check_length(self, handle, texts: dict) -> None:
        """A text past max_tokens tokens is refused before it runs, in one line (texts: its words -> the text; one
        not a string is left to the API's own check)."""
        from attnviz.api.checks import token_counts

        limit = self.settings.max_tokens
        for what, each in texts.items():
            if not isinstance(each, str):
                continue
            (count,) = token_counts(handle.loaded, [each])
            if count > limit:
                raise AttnvizError(f"{what} has {count:,} tokens: this server takes at most {limit:,} (--max-tokens)")

    def report_json(self, record: dict) -> str:
        """The report's record as JSON, with the font of its CJK glyphs for the page (html/page.py's explorer_font),
        made after the model's turn (a subset takes 0.03 s, the first 0.2 s with fontTools' imports)."""
        from attnviz.html.page import explorer_font

        return json.dumps({**record, "font": explorer_font(record, self.models())}, ensure_ascii=False)


def attention_json(result) -> str:
    """attention.json's record of a HeadsResult with its weights to DECIMALS decimals, written as the file writes them."""
    import numpy as np

    from attnviz.output.export import attention_record, weights_json

    record = json.dumps(attention_record(result.run, result.spec, effects=result.effects), ensure_ascii=False)
    weights = weights_json(np.asarray(result.run.attention), DECIMALS)  # (H, Nq, Nk); a map on disk read whole
    return record.removesuffix("null}") + weights + "}"
