"""`attnviz serve`'s HTTP server: the standard library's ThreadingHTTPServer, a thread per connection.

Every request is checked before anything else, in this order, and refused with a JSON {"error": "one line"}:
- its Host header names the address the request arrived on, or the server's own name (localhost on the loopback;
  the machine's name when bound to every address, 0.0.0.0 or ::), with the port (and its Origin, when it has one,
  that host's http:// origin): a page of another site whose name resolves here (DNS rebinding) is refused, 403;
- it carries the server's token, as ?token= or an Authorization: Bearer header (compared in constant time), 403;
- a body at most MAX_BODY_BYTES (413; a Content-Length of ASCII digits, 400), JSON nested at most MAX_NESTING deep
  (400, before the parser recurses), a JSON object (400).
A request line http.server cannot read, or one with no HTTP version or one past 1.x, is a 400 with a status line
and headers as every answer has; a client that hangs up costs no traceback.
Then GET / is the explorer's page (html/page.py's explorer_page: the report's views and explorer.js), GET
/api/models the models loaded, POST /api/heads, /api/roles and /api/patch a run (serve/explorer.py). A request
that fails gets its error as JSON with a 4xx status (503 when the model's queue is full; 500 with one line, never
a traceback, for a bug), and the server goes on serving. Every answer says no-store, nosniff and no-referrer (the
token is in the page's URL).
"""

from __future__ import annotations

import hmac
import ipaddress
import json
import re
import secrets
import socket
import sys
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

from attnviz.errors import AttnvizError
from attnviz.serve.explorer import Busy, Explorer, ServeSettings

MAX_BODY_BYTES = 1 << 20  # 1 MiB: a text of 2,048 tokens is at most a few tens of kB, even as \u escapes
MAX_NESTING = 32  # a request is an object of strings, numbers and lists: 32 levels of [ and { leave room
JSON_TOKEN = re.compile(r'"(?:[^"\\]|\\.?)*"?|[][{}]', re.DOTALL)  # a string (unclosed: to the end) or a bracket
LOOPBACK_NAMES = ("127.0.0.1", "localhost")
POST_ROUTES = {"/api/heads": "heads", "/api/roles": "roles", "/api/patch": "patch", "/api/why": "why"}  # path -> the Explorer's method
WILDCARDS = ("0.0.0.0", "::")  # every address of the machine
ROUTE_PROBES = {socket.AF_INET: "198.51.100.1", socket.AF_INET6: "2001:db8::1"}  # documentation addresses: never reached
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
        self.address_family = socket.AF_INET6 if ":" in settings.host else socket.AF_INET  # read when the socket is made
        try:
            super().__init__((settings.host, settings.port), ExplorerHandler)
        except OSError as error:
            raise AttnvizError(f"cannot listen on {settings.host} port {settings.port}: {error.strerror or error}") from None
        self.explorer: Explorer | None = None
        self.token = token or secrets.token_urlsafe(24)
        # the names a Host header may give besides the address a request arrived on (ExplorerHandler.check)
        names = [settings.host]
        self.addresses = [settings.host]  # where other machines reach it, for `serve`'s warning
        if settings.host in LOOPBACK_NAMES:
            names = list(LOOPBACK_NAMES)
        elif settings.host in WILDCARDS:
            self.addresses = machine_addresses(settings.host)
            names += [*LOOPBACK_NAMES, socket.gethostname()]
        self.hosts = {host_and_port(name, self.server_port) for name in names}
        self.url = f"http://{host_and_port(names[0], self.server_port)}/?token={self.token}"

    def handle_error(self, request, client_address) -> None:
        """A client that hangs up (its connection reset, or closed before the answer is written) costs no traceback."""
        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)


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
        return HTTPStatus.OK, "application/json", getattr(self.server.explorer, POST_ROUTES[path])(self.json_body()), {}

    def json_body(self):
        """The request body read as JSON: UTF-8, nested at most MAX_NESTING deep (checked before the parser recurses)."""
        try:
            text = self.body().decode("utf-8")
            check_nesting(text)
            return json.loads(text)
        except (UnicodeDecodeError, ValueError) as error:
            raise Refused(HTTPStatus.BAD_REQUEST, f"the request body is not JSON: {error}") from None

    def body(self) -> bytes:
        length = self.headers.get("Content-Length")
        if length is None:
            raise Refused(HTTPStatus.LENGTH_REQUIRED, "a POST needs a Content-Length")
        if not (length.isascii() and length.isdigit()):  # str.isdigit alone takes '²' and '٣', which int() does not
            raise Refused(HTTPStatus.BAD_REQUEST, f"the Content-Length header {length[:40]!r} is not a number of bytes")
        digits = length.lstrip("0") or "0"
        if len(digits) > 18 or int(digits) > MAX_BODY_BYTES:  # int() would refuse 4,301 digits and more
            size = f"{int(digits):,}" if len(digits) <= 18 else f"a {len(digits):,}-digit number of"
            raise Refused(HTTPStatus.REQUEST_ENTITY_TOO_LARGE, f"the request body has {size} bytes: at most {MAX_BODY_BYTES:,}")
        return self.rfile.read(int(digits))

    def check(self) -> None:
        """The Host and Origin name this server (DNS rebinding), and the request holds its token."""
        arrived = ipaddress.ip_address(self.connection.getsockname()[0].split("%")[0])  # the address the client asked
        if isinstance(arrived, ipaddress.IPv6Address) and arrived.ipv4_mapped:  # IPv4 on a server bound to ::
            arrived = arrived.ipv4_mapped
        hosts = self.server.hosts | {host_and_port(str(arrived), self.server.server_port)}
        if self.headers.get("Host") not in hosts:
            raise Refused(HTTPStatus.FORBIDDEN, "the Host header does not name this server's address")
        origin = self.headers.get("Origin")
        if origin is not None and origin not in {f"http://{host}" for host in hosts}:
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

    def parse_request(self) -> bool:
        """http.server's parsing of the request line and headers, and a line with no HTTP version refused: HTTP/0.9's
        "GET /" has no headers, so no Host or token, and its answer would be a body alone."""
        if not super().parse_request():
            return False
        if self.request_version == self.default_request_version:
            self.send_error(HTTPStatus.BAD_REQUEST, "the request line names no HTTP version: this server speaks HTTP/1.1")
            return False
        return True

    def send_error(self, code: int, message: str | None = None, explain: str | None = None) -> None:
        """What http.server itself refuses (a malformed request line, a method it has no do_ for) as JSON too, with
        a status line and headers even when the request line could not be read (http.server would answer as HTTP/0.9,
        a body alone); an HTTP version past 1.x (http.server's 505) is a bad request like any other, a 4xx."""
        if code == HTTPStatus.HTTP_VERSION_NOT_SUPPORTED:
            code, message = HTTPStatus.BAD_REQUEST, f"{message}: this server speaks HTTP/1.1"
        self.request_version = self.protocol_version
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


def machine_addresses(wildcard: str) -> list[str]:
    """The addresses of this machine that a server bound to 0.0.0.0 (or ::, IPv6 and IPv4) answers on, as far as the
    standard library finds them: the loopback's, the host name's, and the one the default route leaves from (a UDP
    socket's connect picks it and sends nothing)."""
    families = [socket.AF_INET] if wildcard == "0.0.0.0" else [socket.AF_INET6, socket.AF_INET]
    found = []
    for family in families:
        found.append("127.0.0.1" if family == socket.AF_INET else "::1")
        try:
            found += [info[4][0] for info in socket.getaddrinfo(socket.gethostname(), None, family, socket.SOCK_STREAM)]
        except OSError:  # a host name that does not resolve
            pass
        with socket.socket(family, socket.SOCK_DGRAM) as probe:
            try:
                probe.connect((ROUTE_PROBES[family], 9))
                found.append(probe.getsockname()[0])
            except OSError:  # no route: no network
                pass
    return list(dict.fromkeys(found))


def host_and_port(name: str, port: int) -> str:
    """A Host header's value: the name (an IPv6 address in brackets) and the port."""
    return f"[{name}]:{port}" if ":" in name else f"{name}:{port}"


def check_nesting(text: str) -> None:
    """Refuse JSON nested deeper than MAX_NESTING before json.loads, which recurses once per level (a body of 1 MiB
    of [ would end in a RecursionError): brackets are counted outside strings, which JSON_TOKEN consumes whole."""
    depth = 0
    for token in JSON_TOKEN.finditer(text):
        if token.group() in ("[", "{"):
            depth += 1
            if depth > MAX_NESTING:
                raise Refused(HTTPStatus.BAD_REQUEST, f"the request body is nested too deep: at most {MAX_NESTING} levels of [ and {{")
        elif token.group() in ("]", "}"):
            depth -= 1


def error_json(message: str) -> str:
    return json.dumps({"error": " ".join(message.split())}, ensure_ascii=False)
