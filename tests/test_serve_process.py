"""`attnviz serve` as a user starts it: a process of its own, whose first stdout line is the URL, that a script asks
with urllib, that SIGINT and SIGTERM end within a second, and that refuses a port in use in one line, exit code 2."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # fresh processes that import torch and load a model

REPOSITORY = Path(__file__).resolve().parent.parent
URL_PREFIX = "http://127.0.0.1:"


def start(*arguments: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "attnviz", "serve", "--model", "bundled", "--device", "cpu", "--port", "0", *arguments],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPOSITORY, env={**os.environ, "PYTHONPATH": str(REPOSITORY)},
    )  # fmt: skip


def first_line(process: subprocess.Popen) -> str:
    line = process.stdout.readline().strip()
    assert line, process.stderr.read()
    return line


def post_heads(url: str, body: dict, bearer: str | None, headers: dict | None = None) -> tuple[int, dict]:
    base = url.split("/?")[0]
    headers = {"Content-Type": "application/json", **({"Authorization": f"Bearer {bearer}"} if bearer else {}), **(headers or {})}
    request = urllib.request.Request(f"{base}/api/heads", data=json.dumps(body).encode(), headers=headers, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


@pytest.fixture(scope="module")
def served():
    process = start()
    url = first_line(process)
    yield process, url
    process.kill()
    process.wait()


def test_the_first_stdout_line_is_the_url_with_a_token_and_a_script_gets_a_map(served):
    process, url = served
    assert url.startswith(URL_PREFIX) and "/?token=" in url
    token = url.split("token=")[1]
    assert len(token) >= 32
    status, record = post_heads(url, {"text": "the cat sat", "layer": 1}, token)
    assert status == 200 and record["query_tokens"] == ["[CLS]", "the", "cat", "sat", "[SEP]"]
    assert len(record["attention"]) == record["num_heads"] and len(record["attention"][0]) == 5
    assert post_heads(url, {"text": "the cat sat"}, None)[0] == 403
    with urllib.request.urlopen(url, timeout=60) as page:  # the URL as printed opens the page
        assert page.status == 200 and b"explorer.js" in page.read()
    assert process.poll() is None


@pytest.mark.parametrize("number", [signal.SIGINT, signal.SIGTERM])
def test_sigint_and_sigterm_end_it_within_a_second(number):
    process = start()
    first_line(process)
    sent = time.monotonic()
    process.send_signal(number)
    process.wait(timeout=10)
    assert time.monotonic() - sent < 1.0
    assert process.returncode == 128 + number


def test_a_port_in_use_is_one_line_and_exit_code_2():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = subprocess.run(
            [sys.executable, "-m", "attnviz", "serve", "--model", "bundled", "--port", str(port)],
            capture_output=True, text=True, timeout=120, cwd=REPOSITORY, env={**os.environ, "PYTHONPATH": str(REPOSITORY)},
        )  # fmt: skip
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.splitlines() == [f"error: cannot listen on 127.0.0.1 port {port}: Address already in use"]


def test_another_host_prints_a_warning_and_answers_only_to_its_own_name():
    process = start("--host", "127.0.0.2")
    try:
        url = first_line(process)
        assert url.startswith("http://127.0.0.2:")
        warning = process.stderr.readline()
        assert warning.startswith("warning: --host 127.0.0.2: other machines")
        token = url.split("token=")[1]
        assert post_heads(url, {"text": "the cat"}, token)[0] == 200
        port = url.split(":")[2].split("/")[0]
        assert post_heads(url, {"text": "the cat"}, token, {"Host": f"localhost:{port}"})[0] == 403  # not the address it is bound to
    finally:
        process.kill()
        process.wait()


def test_every_address_names_the_machines_addresses_in_its_warning_and_answers_on_them():
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect(("203.0.113.1", 9))  # picks the default route's address; sends nothing
            address = probe.getsockname()[0]
        except OSError:
            pytest.skip("this machine has no address but the loopback")
    process = start("--host", "0.0.0.0")
    try:
        url = first_line(process)
        warning = process.stderr.readline()
        assert warning.startswith("warning: --host 0.0.0.0: other machines that reach any address of this machine (127.0.0.1, ")
        assert address in warning.split("(")[1].split(")")[0].split(", ")
        token, port = url.split("token=")[1], url.split(":")[2].split("/")[0]
        assert post_heads(f"http://{address}:{port}/", {"text": "the cat"}, token)[0] == 200  # Host: the address asked
        assert post_heads(f"http://{address}:{port}/", {"text": "the cat"}, token, {"Host": f"attacker.example:{port}"})[0] == 403
    finally:
        process.kill()
        process.wait()
