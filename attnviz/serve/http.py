"""`attnviz serve`'s HTTP server: the standard library's ThreadingHTTPServer, a thread per connection.

Every request is checked before anything else, in this order, and refused with a JSON {"error": "one line"}:
- its Host header names the address the server is bound to (and its Origin, when it has one, that address's
  http:// origin): a page of another site whose name resolves here (DNS rebinding) is refused, 403;
- it carries the server's token, as ?token= or an Authorization: Bearer header (compared in constant time), 403;
- a body at most MAX_BODY_BYTES (413), a JSON object (400).
Then GET / is the explorer's page (html/page.py's explorer_page: the report's views and explorer.js), GET
/api/models the models loaded, POST /api/heads, /api/roles and /api/patch a run (serve/explorer.py). A request
that fails gets its error as JSON with a 4xx status (503 when the model's queue is full; 500 with one line, never
a traceback, for a bug), and the server goes on serving. Every answer says no-store, nosniff and no-referrer (the
token is in the page's URL).
"""

from __future__ import annotations

import hmac
import json
import secrets
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

from attnviz.errors import AttnvizError
from attnviz.serve.explorer import Busy, Explorer, ServeSettings

MAX_BODY_BYTES = 1 << 20  # 1 MiB: a text of 2,048 tokens is at most a few tens of kB, even as \u escapes
LOOPBACK_NAMES = ("127.0.0.1", "localhost")
POST_ROUTES = {"/api/heads": "heads", "/api/roles": "roles", "/api/patch": "patch"}  # path -> the Explorer's method
SECURITY_HEADERS = {
    "Cache-Control": "no-store",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",  # the page's URL holds the token: no request it makes sends it on
    "X-Frame-Options": "DENY",
}


class Refused(Exception):
    """A request refused before any work: its status and one line."""

    def __init__(self, status: HTTPStatus, message: str):
        super().__init__(message)
        self.status = status


class ExplorerServer(ThreadingHTTPServer):
    """The server: the explorer it runs requests on, its token, and the Host names it answers to."""

    daemon_threads = True  # a connection still open does not hold the process at its end
    allow_reuse_address = False  # a port in use is refused, not shared

    def __init__(self, settings: ServeSettings, token: str | None = None):
        """Bound at once (a port in use is refused before any model loads); serve_forever once .explorer is set."""
        try:
            super().__init__((settings.host, settings.port), ExplorerHandler)
        except OSError as error:
            raise AttnvizError(f"cannot listen on {settings.host} port {settings.port}: {error.strerror or error}") from None
        self.explorer: Explorer | None = None
        self.token = token or secrets.token_urlsafe(24)
        port = self.server_address[1]
        names = LOOPBACK_NAMES if settings.host in LOOPBACK_NAMES else (settings.host,)
        shown = [f"[{name}]" if ":" in name else name for name in names]  # an IPv6 address in brackets
        self.hosts = {f"{name}:{port}" for name in shown}
        self.origins = {f"http://{host}" for host in self.hosts}
        self.url = f"http://{shown[0]}:{port}/?token={self.token}"


class ExplorerHandler(BaseHTTPRequestHandler):
    server: ExplorerServer
    server_version = "attnviz"
    sys_version = ""
    protocol_version = "HTTP/1.1"  # keep-alive: a page's requests reuse one connection

    def do_GET(self) -> None:
        self.answer(self.get)

    def do_POST(self) -> None:
        self.answer(self.post)

    def get(self) -> tuple[HTTPStatus, str, str, dict]:
        path = urlsplit(self.path).path
        if path == "/":
            from attnviz.html.page import explorer_page

            page, policy = explorer_page({**self.server.explorer.models(), "token": self.server.token})
            # frame-ancestors holds only as a header (a <meta> policy may not say it): no other site frames the page
            return HTTPStatus.OK, "text/html; charset=utf-8", page, {"Content-Security-Policy": f"{policy}; frame-ancestors 'none'"}
        if path == "/api/models":
            return HTTPStatus.OK, "application/json", json.dumps(self.server.explorer.models()), {}
        raise Refused(HTTPStatus.NOT_FOUND, f"no page {path[:80]!r}: GET / or /api/models, POST {', '.join(POST_ROUTES)}")

    def post(self) -> tuple[HTTPStatus, str, str, dict]:
        path = urlsplit(self.path).path
        if path not in POST_ROUTES:
            raise Refused(HTTPStatus.NOT_FOUND, f"nothing to POST at {path[:80]!r}: POST {', '.join(POST_ROUTES)}")
        try:
            request = json.loads(self.body())
        except (UnicodeDecodeError, ValueError) as error:
            raise Refused(HTTPStatus.BAD_REQUEST, f"the request body is not JSON: {error}") from None
        return HTTPStatus.OK, "application/json", getattr(self.server.explorer, POST_ROUTES[path])(request), {}

    def body(self) -> bytes:
        length = self.headers.get("Content-Length")
        if length is None or not length.isdigit():
            raise Refused(HTTPStatus.LENGTH_REQUIRED, "a POST needs a Content-Length")
        if int(length) > MAX_BODY_BYTES:
            raise Refused(HTTPStatus.REQUEST_ENTITY_TOO_LARGE, f"the request body has {int(length):,} bytes: at most {MAX_BODY_BYTES:,}")
        return self.rfile.read(int(length))

    def check(self) -> None:
        """The Host and Origin name this server (DNS rebinding), and the request holds its token."""
        if self.headers.get("Host") not in self.server.hosts:
            raise Refused(HTTPStatus.FORBIDDEN, "the Host header does not name this server's address")
        origin = self.headers.get("Origin")
        if origin is not None and origin not in self.server.origins:
            raise Refused(HTTPStatus.FORBIDDEN, "the Origin header is not this server's")
        given = parse_qs(urlsplit(self.path).query).get("token", [""])[0]
        authorization = self.headers.get("Authorization", "")
        if authorization.startswith("Bearer "):
            given = authorization.removeprefix("Bearer ")
        if not hmac.compare_digest(given.encode("utf-8", "replace"), self.server.token.encode("ascii")):
            raise Refused(HTTPStatus.FORBIDDEN, "no valid token: open the URL that `attnviz serve` printed")

    def answer(self, respond) -> None:
        headers = {}
        try:
            self.check()
            status, content_type, text, headers = respond()
        except Refused as refused:
            status, content_type, text = refused.status, "application/json", error_json(str(refused))
        except AttnvizError as error:
            status, content_type, text = HTTPStatus.BAD_REQUEST, "application/json", error_json(str(error))
        except Busy:
            status, content_type, text = HTTPStatus.SERVICE_UNAVAILABLE, "application/json", error_json("the model is busy: try again in a moment")
        except Exception as error:  # a bug: one line, the server keeps serving
            status, content_type, text = HTTPStatus.INTERNAL_SERVER_ERROR, "application/json", error_json(f"unexpected {type(error).__name__}: {error}")
        body = text.encode("utf-8")
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        for name, value in {**SECURITY_HEADERS, **headers}.items():
            self.send_header(name, value)
        if status >= 400:
            self.close_connection = True  # a body refused unread must not be read as the next request
        self.end_headers()
        self.wfile.write(body)

    def send_error(self, code: int, message: str | None = None, explain: str | None = None) -> None:
        """What http.server itself refuses (a malformed request line, a method it has no do_ for) as JSON too."""
        body = error_json(message or HTTPStatus(code).phrase).encode("utf-8")
        self.close_connection = True
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        for name, value in SECURITY_HEADERS.items():
            self.send_header(name, value)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def log_message(self, format: str, *args) -> None:  # stderr stays quiet: the first stdout line is the URL
        pass


def error_json(message: str) -> str:
    return json.dumps({"error": " ".join(message.split())}, ensure_ascii=False)
