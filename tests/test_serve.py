"""`attnviz serve`'s HTTP API (docs/formats.md, "attnviz serve's HTTP API") through a real server on a free port,
in a thread of this process, asked with http.client as any script would ask it.

The maps are checked against transformers' eager attentions (conftest.py's reference_bert), the refusals by their
status and one-line JSON error, the load by every answer's tokens against the tokenizer's own for its text.
"""

from __future__ import annotations

import http.client
import json
import re
import threading
import time

import numpy as np
import pytest
from helpers import serving

from attnviz.serve.http import MAX_BODY_BYTES

ENGLISH = "The cat sat on the mat because it was warm."
FUZZ_TEXTS = {
    "empty": "",
    "20,000 characters": "attention " * 2000,
    "NUL": "the cat\x00sat",
    "lone surrogates": "cat \ud800 dog \udfff",
    "RTL": "مرحبا بالعالم שלום עולם",
    "emoji": "I 💜 attention 👩‍👩‍👧‍👦 🇨🇳",
    "mixed scripts": "我想吃酸菜鱼 the cat ñ Ωμέγα привет ١٢٣",
}


@pytest.fixture(scope="module")
def bundled():
    import attnviz

    return attnviz.load("bundled", device="cpu")


@pytest.fixture(scope="module")
def server(bundled):
    with serving({"bundled": bundled}) as server:
        yield server


def ask(server, method: str, path: str, body=None, headers=None, token: bool = True, raw: bytes | None = None):
    """(status, the answer's JSON) of one request; token: an Authorization: Bearer header with the server's token."""
    host, port = server.server_address[:2]
    connection = http.client.HTTPConnection(host, port, timeout=60)
    sent = dict(headers or {})
    if token:
        sent.setdefault("Authorization", f"Bearer {server.token}")
    data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
    connection.request(method, path, body=data, headers=sent)
    response = connection.getresponse()
    text = response.read().decode("utf-8")
    connection.close()
    return response.status, (json.loads(text) if response.getheader("Content-Type") == "application/json" else text), response


def heads(server, body, **options):
    status, answer, _ = ask(server, "POST", "/api/heads", body, **options)
    return status, answer


@pytest.mark.parametrize("layer", [0, 3])
def test_the_map_of_post_api_heads_is_transformers_eager_attention_to_4_decimals(server, reference_bert, layer):
    import torch

    tokenizer, bert = reference_bert
    batch = tokenizer([ENGLISH], return_tensors="pt")
    with torch.no_grad():
        expected = bert(**batch, output_attentions=True).attentions[layer][0].numpy()  # (H, N, N)
    status, record = heads(server, {"text": ENGLISH, "layer": layer})
    assert status == 200
    assert record["format"] == "attnviz-attention" and record["layer"] == layer and record["settings"]["layer"] == layer
    assert record["query_tokens"] == tokenizer.convert_ids_to_tokens(batch["input_ids"][0])
    attention = np.array(record["attention"])
    assert attention.shape == expected.shape
    np.testing.assert_allclose(attention, expected, atol=1e-4, rtol=0)
    assert not re.search(r"\d\.\d{5}", json.dumps(record["attention"]))  # 4 decimals, as the page reads them out


def test_the_report_answer_is_the_record_that_report_html_embeds(server, bundled):
    import attnviz
    from helpers import assert_records_match, decoded

    status, record = heads(server, {"text": ENGLISH, "layer": 2, "as": "report"})
    assert status == 200
    assert record.pop("font") is None  # no CJK character: no font (test_serve_page.py: the font of Chinese)
    assert_records_match(record, json.loads(json.dumps(attnviz.heads(ENGLISH, model=bundled, layer=2, vectors=None).report().record)))
    (text,) = record["texts"]
    assert text["vectors"]["q"]["shape"][0] == bundled.num_heads  # the neuron view's q and k: a text of at most 64 tokens
    np.testing.assert_allclose(decoded(text["attention"]), attnviz.heads(ENGLISH, model=bundled, layer=2).attention.numpy(), atol=5e-5 + 1e-9, rtol=0)


def test_the_token_is_needed_as_a_bearer_header_or_in_the_query(server):
    assert heads(server, {"text": ENGLISH}, token=False) == (403, {"error": "no valid token: open the URL that `attnviz serve` printed"})
    assert heads(server, {"text": ENGLISH}, headers={"Authorization": "Bearer not-the-token"})[0] == 403
    assert heads(server, {"text": ENGLISH}, headers={"Authorization": f"Basic {server.token}"}, token=False)[0] == 403
    status, _, _ = ask(server, "POST", f"/api/heads?token={server.token}", {"text": ENGLISH}, token=False)
    assert status == 200
    for path in ("/", "/api/models", "/?token=", f"/?token={server.token[:-1]}"):
        status, answer, _ = ask(server, "GET", path, token=False)
        assert status == 403 and set(answer) == {"error"}, path


def test_a_foreign_host_or_origin_is_refused_even_with_the_token(server):
    port = server.server_address[1]
    for headers in (
        {"Host": f"attacker.example:{port}"},
        {"Host": "127.0.0.1"},  # no port: not the bound address
        {"Host": f"127.0.0.1:{port + 1}"},
        {"Origin": "http://attacker.example"},
        {"Origin": f"http://127.0.0.1:{port + 1}"},
        {"Origin": "null"},
    ):
        status, answer = heads(server, {"text": ENGLISH}, headers=headers)
        assert status == 403 and set(answer) == {"error"}, headers
    for headers in ({"Host": f"localhost:{port}"}, {"Origin": f"http://127.0.0.1:{port}"}, {"Origin": f"http://localhost:{port}", "Host": f"localhost:{port}"}):
        assert heads(server, {"text": ENGLISH}, headers=headers)[0] == 200, headers


def test_the_page_is_served_with_its_content_security_policy_and_holds_the_report_views(server):
    status, page, response = ask(server, "GET", f"/?token={server.token}", token=False)
    assert status == 200 and response.getheader("Content-Type") == "text/html; charset=utf-8"
    policy = response.getheader("Content-Security-Policy")
    assert policy.startswith("default-src 'none'; script-src 'sha256-") and "connect-src 'self'" in policy
    assert "unsafe-eval" not in policy and "script-src 'unsafe-inline'" not in policy
    assert response.getheader("Referrer-Policy") == "no-referrer" and response.getheader("Cache-Control") == "no-store"
    meta = re.search(r'http-equiv="Content-Security-Policy" content="([^"]*)"', page).group(1).replace("&#x27;", "'")
    assert policy == f"{meta}; frame-ancestors 'none'"
    for view in ("head_view.js", "heatmap_view.js", "model_view.js", "explorer.js", "main.js"):
        assert f"// ---- {view} ----" in page
    assert " src=" not in page and "http://" not in page.split("<script>")[0]


def test_models_lists_those_loaded_and_the_token_limit(server, bundled):
    status, answer, _ = ask(server, "GET", "/api/models")
    assert status == 200
    assert answer == {
        "models": [{"name": "bundled", "family": "BERT", "kind": "encoder", "num_layers": bundled.num_layers, "num_heads": bundled.num_heads,
                    "num_kv_heads": bundled.num_kv_heads, "device": "cpu"}],
        "max_tokens": 2048,
    }  # fmt: skip


@pytest.mark.parametrize(
    "body, status, error",
    [
        ({"text": ENGLISH, "model": "/etc"}, 400, "model '/etc' is not loaded here: this server has bundled"),
        ({"text": ENGLISH, "model": "gpt2"}, 400, "model 'gpt2' is not loaded here: this server has bundled"),
        ({"text": ENGLISH, "model": ["bundled"]}, 400, "model \"['bundled']\" is not loaded here"),
        ({"text": ENGLISH, "layer": 99}, 400, None),
        ({"text": ENGLISH, "layer": "2"}, 400, None),
        ({"text": ENGLISH, "allow_pickle": True}, 400, "unknown field 'allow_pickle'"),
        ({"text": ENGLISH, "as": "pickle"}, 400, None),
        ({"layer": 1}, 400, 'the request has no "text" string'),
        ([ENGLISH], 400, "the request body is not a JSON object"),
    ],
)
def test_a_bad_request_gets_one_json_line_and_a_4xx(server, body, status, error):
    got, answer = heads(server, body)
    assert got == status and set(answer) == {"error"} and "\n" not in answer["error"] and "Traceback" not in answer["error"]
    if error is not None:
        assert answer["error"].startswith(error)


def test_a_body_that_is_not_json_or_too_large_or_a_path_unknown_is_refused(server):
    assert ask(server, "POST", "/api/heads", raw=b"{not json")[0] == 400
    assert ask(server, "POST", "/api/heads", raw=b"\xff\xfe")[0] == 400
    # a body past the cap is refused by its Content-Length, before a byte of it is read
    connection = http.client.HTTPConnection(*server.server_address[:2], timeout=60)
    connection.putrequest("POST", "/api/heads")
    connection.putheader("Authorization", f"Bearer {server.token}")
    connection.putheader("Content-Length", str(MAX_BODY_BYTES + 1))
    connection.endheaders()
    response = connection.getresponse()
    assert response.status == 413 and json.loads(response.read())["error"].startswith("the request body has 1,048,577 bytes: at most 1,048,576")
    connection.close()
    assert ask(server, "POST", "/api/heads", raw=b"{}", headers={"Content-Length": "nan"})[0] in (400, 411)
    assert ask(server, "GET", "/api/heads")[0] == 404
    assert ask(server, "POST", "/api/other", {"text": "x"})[0] == 404
    assert ask(server, "GET", "/../../etc/passwd")[0] == 404
    assert heads(server, {"text": ENGLISH})[0] == 200  # still serving


def test_texts_past_max_tokens_are_refused_in_one_clear_line(bundled):
    with serving({"bundled": bundled}, max_tokens=8) as server:
        status, answer = heads(server, {"text": ENGLISH})
        assert (status, answer) == (400, {"error": "the text has 13 tokens: this server takes at most 8 (--max-tokens)"})
        assert heads(server, {"text": "the cat", "kv": ENGLISH})[1] == {"error": "the kv text has 13 tokens: this server takes at most 8 (--max-tokens)"}
        assert heads(server, {"text": "the cat sat"})[0] == 200


def raw_answer(server, request: bytes, address=None) -> bytes:
    """What the server sends back for these bytes, to the end of the connection."""
    import socket

    with socket.create_connection(address or server.server_address[:2], timeout=30) as connection:
        connection.sendall(request)
        answer = b""
        while chunk := connection.recv(65536):
            answer += chunk
    return answer


@pytest.mark.parametrize(
    "request_line, status, error",
    [
        (b"GARBAGE", 400, "Bad request syntax ('GARBAGE')"),
        (b'GET / HTTP/"9', 400, None),
        (b"GET / HTTP/9.9", 400, "Invalid HTTP version (9.9): this server speaks HTTP/1.1"),
        (b"GET /", 400, "the request line names no HTTP version: this server speaks HTTP/1.1"),  # HTTP/0.9's
        (b"PUT /api/heads HTTP/1.1\r\nHost: x", 501, None),
    ],
)
def test_what_http_server_refuses_itself_is_an_http_1_1_answer_with_json(server, request_line, status, error):
    """http.server answers a request line it cannot read as HTTP/0.9 (the body alone): here, a status line and headers."""
    answer = raw_answer(server, request_line + b"\r\n\r\n")
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(f"HTTP/1.1 {status} ".encode()), answer
    assert b"\r\nContent-Type: application/json\r\n" in head and f"Content-Length: {len(body)}".encode() in head
    assert set(json.loads(body)) == {"error"}
    if error is not None:
        assert json.loads(body)["error"] == error
    assert heads(server, {"text": ENGLISH})[0] == 200


@pytest.mark.parametrize(
    "body",
    [b"[" * 100_000, b'{"text": ' + b"[" * 50_000 + b"]" * 50_000 + b"}", b'{"text": "x", "heads": ' + b"[" * 33 + b"]" * 33 + b"}"],
    ids=["100,000 [", "a text nested 50,000 deep", "33 levels"],
)
def test_json_nested_too_deep_is_a_400_before_the_parser_recurses(server, body):
    status, answer, _ = ask(server, "POST", "/api/heads", raw=body)
    assert (status, answer) == (400, {"error": "the request body is nested too deep: at most 32 levels of [ and {"})
    assert heads(server, {"text": ENGLISH})[0] == 200


def test_brackets_inside_strings_are_no_nesting(server):
    text = "[{" * 40 + '"\\' + "]}" * 3  # brackets, a quote and a backslash inside the JSON string: 32 levels hold
    status, record = heads(server, {"text": text, "heads": [[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[2]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]})
    assert status == 400 and "nested" not in record["error"]  # refused by RunOptions' check of heads, after parsing
    status, record = heads(server, {"text": text})
    assert status == 200 and record["text"] == text


def test_a_content_length_that_is_not_ascii_digits_is_a_400_saying_so(server):
    for length, status, error in (
        ("²", 400, "the Content-Length header '²' is not a number of bytes"),  # str.isdigit takes it, int() does not
        ("-1", 400, "the Content-Length header '-1' is not a number of bytes"),
        ("9" * 5000, 413, "the request body has a 5,000-digit number of bytes: at most 1,048,576"),  # int() refuses 4,301 digits
        ("00000000000000000000000000002", 400, 'the request body is not a JSON object: give {"text": ..., "layer": ...}'),  # the 2 bytes read
    ):
        connection = http.client.HTTPConnection(*server.server_address[:2], timeout=60)
        connection.putrequest("POST", "/api/heads")
        connection.putheader("Authorization", f"Bearer {server.token}")
        connection.putheader("Content-Length", length)
        connection.endheaders(b"[]")
        response = connection.getresponse()
        assert (response.status, json.loads(response.read())) == (status, {"error": error}), length
        connection.close()
    assert heads(server, {"text": ENGLISH})[0] == 200


def test_clients_that_hang_up_leave_nothing_on_stderr(server, capsys):
    """Connections closed with a reset (SO_LINGER 0) mid-body, after the request, and before the answer is written."""
    import socket
    import struct

    request = json.dumps({"text": " ".join(["the cat sat on the mat"] * 60)}).encode()
    head = f"POST /api/heads HTTP/1.1\r\nHost: 127.0.0.1:{server.server_address[1]}\r\nAuthorization: Bearer {server.token}\r\n"
    head += f"Content-Length: {len(request)}\r\n\r\n"
    for sent in (head.encode(), head.encode() + request[:10], head.encode() + request, b"GET / HT"):
        for _ in range(5):
            connection = socket.create_connection(server.server_address[:2], timeout=30)
            connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # close() sends a reset
            connection.sendall(sent)
            connection.close()
    time.sleep(1.0)
    assert heads(server, {"text": ENGLISH})[0] == 200  # after the runs of the hung-up requests (one at a time per model)
    time.sleep(0.5)
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize("name", list(FUZZ_TEXTS))
def test_a_fuzz_text_gets_200_or_a_4xx_and_the_server_serves_on(server, name):
    status, answer = heads(server, {"text": FUZZ_TEXTS[name]})
    assert status == 200 or 400 <= status < 500 and set(answer) == {"error"}, (status, answer)
    assert heads(server, {"text": ENGLISH})[0] == 200


def test_a_full_queue_answers_503_and_the_others_their_own_maps(bundled):
    """No request may wait while one computes (waiting=0): of 8 at once, those that came while it ran get 503."""
    long_text = " ".join(["the cat sat on the mat"] * 70)  # 422 tokens: long enough for the others to arrive
    with serving({"bundled": bundled}, waiting=0) as server:
        answers = []
        start = threading.Barrier(8)

        def client():
            start.wait()
            answers.append(heads(server, {"text": long_text}))

        threads = [threading.Thread(target=client) for _ in range(8)]
        for each in threads:
            each.start()
        for each in threads:
            each.join()
        statuses = sorted(status for status, _ in answers)
        assert set(statuses) == {200, 503} and len(statuses) == 8
        assert all(answer == {"error": "the model is busy: try again in a moment"} for status, answer in answers if status == 503)
        assert heads(server, {"text": ENGLISH})[0] == 200


def test_eight_clients_of_fifty_requests_each_get_their_own_texts_tokens(server, reference_bert):
    """8 clients at once, 50 requests each, every text different: none lost, each answer its own text's tokens."""
    tokenizer, _ = reference_bert
    results: dict[tuple[int, int], tuple] = {}
    failures = []

    def client(index: int):
        for request in range(50):
            text = f"client {index} asks question {request} about the {['cat', 'dog', 'bird'][request % 3]}"
            started = time.perf_counter()
            status, record = heads(server, {"text": text, "layer": request % 6})
            results[index, request] = (text, status, record, time.perf_counter() - started)

    threads = [threading.Thread(target=client, args=(index,)) for index in range(8)]
    for each in threads:
        each.start()
    for each in threads:
        each.join()
    assert len(results) == 400
    for (index, request), (text, status, record, _) in results.items():
        if status != 200 or record["text"] != text or record["layer"] != request % 6:
            failures.append((index, request, status))
            continue
        if record["query_tokens"] != tokenizer.convert_ids_to_tokens(tokenizer(text)["input_ids"]):
            failures.append((index, request, "tokens"))
    assert failures == []


def test_cross_attention_takes_keys_and_values_from_kv(server, reference_bert):
    tokenizer, _ = reference_bert
    status, record = heads(server, {"text": "the cat sat", "kv": ENGLISH, "layer": 1})
    assert status == 200 and record["kv_text"] == ENGLISH
    assert record["key_tokens"] == tokenizer.convert_ids_to_tokens(tokenizer(ENGLISH)["input_ids"])
    attention = np.array(record["attention"])  # (H, Nq, Nk): every row a distribution over the kv text's tokens
    assert attention.shape == (len(record["attention"]), 5, len(record["key_tokens"]))
    np.testing.assert_allclose(attention.sum(axis=-1), 1, atol=len(record["key_tokens"]) * 5e-5)


def outward_address() -> str | None:
    """This machine's address on its default route (a UDP socket's connect picks it and sends nothing), or None."""
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect(("203.0.113.1", 9))
        except OSError:
            return None
        address = probe.getsockname()[0]
    return None if address.startswith("127.") else address


def test_a_server_on_every_address_answers_a_host_header_naming_the_machines_own_address(bundled):
    """--host 0.0.0.0: a request to the machine's real address, naming it in Host (as another machine's browser
    does), gets its map; a name of another site still gets 403."""
    import socket

    address = outward_address()
    if address is None:
        pytest.skip("this machine has no address but the loopback")
    with serving({"bundled": bundled}, host="0.0.0.0") as server:
        port = server.server_address[1]
        assert address in server.addresses and "127.0.0.1" in server.addresses

        def status(at: str, host: str, origin: str | None = None) -> int:
            connection = http.client.HTTPConnection(at, port, timeout=60)
            headers = {"Host": host, "Authorization": f"Bearer {server.token}", **({"Origin": origin} if origin else {})}
            connection.request("POST", "/api/heads", body=json.dumps({"text": "the cat sat"}), headers=headers)
            answer = connection.getresponse()
            answer.read()
            connection.close()
            return answer.status

        assert status(address, f"{address}:{port}") == 200
        assert status(address, f"{address}:{port}", origin=f"http://{address}:{port}") == 200
        assert status("127.0.0.1", f"127.0.0.1:{port}") == 200 and status("127.0.0.1", f"localhost:{port}") == 200
        assert status("127.0.0.1", f"{socket.gethostname()}:{port}") == 200
        assert status(address, f"attacker.example:{port}") == 403
        assert status(address, f"{address}:{port}", origin=f"http://attacker.example:{port}") == 403
        assert status(address, f"{address}:{port + 1}") == 403


@pytest.mark.parametrize(
    "body, error",
    [
        ({"text": ENGLISH, "layer": 1, "head": 2}, "the request has no 'query': a score's split needs a layer, a head and a query"),
        ({"text": ENGLISH, "layer": 1, "head": 12, "query": 1}, "head 12 is out of range"),
        ({"text": ENGLISH, "layer": 1, "head": 2, "query": 99}, "query=99 is past the text"),
        ({"text": ENGLISH, "layer": 1, "head": 2, "query": 1, "words": True}, "unknown field 'words'"),
    ],
)
def test_why_refuses_a_cell_it_cannot_split_in_one_json_line(server, body, error):
    got, answer, _ = ask(server, "POST", "/api/why", body)
    assert got == 400 and set(answer) == {"error"} and "\n" not in answer["error"] and error in answer["error"], answer


def test_why_answers_the_largest_terms_of_attnviz_whys_split(server, bundled):
    import attnviz

    got, answer, _ = ask(server, "POST", "/api/why", {"text": ENGLISH, "layer": 2, "head": 3, "query": 4, "key": 1})
    expected = attnviz.why(ENGLISH, model=bundled, layer=2, head=3, query=4, key=1)
    assert got == 200 and answer["score"] == expected.score and answer["num_terms"] == expected.terms.terms.size
    assert [tuple(each) for each in answer["top"]] == expected.top(12) and "terms" not in answer
    # the rest: every other term summed, so that the top and the rest add up to the score
    assert answer["rest"] == pytest.approx(expected.terms.terms.sum() - sum(term for _, _, term in expected.top(12)), abs=1e-9)
    assert sum(term for _, _, term in answer["top"]) + answer["rest"] == pytest.approx(answer["score"], abs=1e-5 * max(1.0, abs(answer["score"])))
