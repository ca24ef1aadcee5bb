"""`attnviz serve`'s POST /api/roles and /api/patch, and the font of its answers (docs/formats.md, "attnviz serve's HTTP
API"), through a real server on a free port in a thread of this process, asked with http.client.

Roles run on the bundled encoder, patching on a tiny Llama with its language-model head (tests/tiny_families.py, a
real transformers checkpoint): each answer is checked against the API's own result of the same call within float32's
reach, and against numbers computed here (the patching metric from transformers' own logits).
"""

from __future__ import annotations

import base64
import http.client
import io
import json
import threading

import numpy as np
import pytest
from helpers import serving

import attnviz

ENGLISH = "The cat sat on the mat because it was warm."
ZH = "我想吃酸菜鱼"
CLEAN = "The cat sat on the mat because it was tired."
CORRUPT = "The mat sat on the cat because it was tired."
ANSWER, WRONG = " cat", " mat"


@pytest.fixture(scope="module")
def bundled():
    return attnviz.load("bundled", device="cpu")


@pytest.fixture(scope="module")
def server(bundled):
    with serving({"bundled": bundled}) as server:
        yield server


@pytest.fixture(scope="module")
def decoder_server(bundled, decoder_folder):
    with serving({"bundled": bundled, "tiny": attnviz.load(str(decoder_folder), device="cpu")}) as server:
        yield server


def post(server, path: str, body) -> tuple[int, dict]:
    connection = http.client.HTTPConnection(*server.server_address[:2], timeout=120)
    connection.request("POST", path, json.dumps(body), {"Authorization": f"Bearer {server.token}"})
    response = connection.getresponse()
    answer = json.loads(response.read())
    connection.close()
    return response.status, answer


def test_roles_answers_the_record_of_attnviz_roles_report_with_its_trace_and_statistics(server, bundled):
    status, record = post(server, "/api/roles", {"text": ENGLISH, "exclude_bos": True})
    assert status == 200 and record.pop("font") is None
    expected = attnviz.roles(ENGLISH, model=bundled, exclude_bos=True).report().record
    (text,) = record["texts"]
    (wanted,) = expected["texts"]
    assert record["format"] == "attnviz-report" and text["text"] == ENGLISH and text["roles"]["exclude_bos"] is True
    assert set(text) == set(wanted) and set(text["roles"]) == set(wanted["roles"])
    for name, values in wanted["roles"]["scores"].items():  # two runs of one computation: float32's reach
        np.testing.assert_allclose(np.array(text["roles"]["scores"][name], dtype=float), np.array(values, dtype=float), atol=1e-4, rtol=0)
    assert text["roles"]["ids"] == wanted["roles"]["ids"]
    # the Trace view's and the Statistics tab's data: a roles answer holds them (the report's assembly)
    assert text["trace"] is not None and text["statistics"] is not None and text["layers"] is not None


@pytest.mark.slow  # a checkpoint built and loaded by transformers
def test_patch_answers_the_record_of_attnviz_patch_report_and_its_metric_is_transformers_logits(decoder_server, decoder_folder):
    import torch
    import transformers

    server = decoder_server
    status, record = post(server, "/api/patch", {"text": CLEAN, "corrupt": CORRUPT, "answer": ANSWER, "wrong": WRONG, "model": "tiny"})
    assert status == 200 and record.pop("font") is None
    (text,) = record["texts"]
    patch = text["patch"]
    assert (patch["answer"], patch["wrong"], patch["corrupt"]) == (ANSWER, WRONG, CORRUPT)
    expected = attnviz.patch(CLEAN, corrupt=CORRUPT, answer=ANSWER, wrong=WRONG, model=str(decoder_folder), device="cpu")
    np.testing.assert_allclose(np.array(patch["scores"]["output"], dtype=float), expected.scores["out"], atol=1e-4, rtol=0)
    # m = logit(answer) - logit(wrong) at the last position, from transformers' own model of the folder
    tokenizer = transformers.AutoTokenizer.from_pretrained(decoder_folder)
    model = transformers.AutoModelForCausalLM.from_pretrained(decoder_folder).eval()
    (answer_id,), (wrong_id,) = tokenizer(ANSWER, add_special_tokens=False)["input_ids"], tokenizer(WRONG, add_special_tokens=False)["input_ids"]
    for which, sentence in (("clean", CLEAN), ("corrupt", CORRUPT)):
        with torch.no_grad():
            logits = model(**tokenizer(sentence, return_tensors="pt")).logits[0, -1]
        assert patch["metric"][which] == pytest.approx(float(logits[answer_id] - logits[wrong_id]), abs=1e-3)
    assert text["trace"] is not None and text["statistics"] is not None
    # the API's own refusals, one line each: texts of different lengths, a missing or wrong-typed corrupted text
    for body in ({"corrupt": "The mat sat on the cat."}, {"corrupt": 7}, {"corrupt": None}):
        status, answer = post(server, "/api/patch", {"text": CLEAN, "answer": ANSWER, "wrong": WRONG, "model": "tiny", **body})
        assert status == 400 and set(answer) == {"error"} and "\n" not in answer["error"], (body, answer)


@pytest.mark.parametrize(
    "path, body, error",
    [
        ("/api/patch", {"text": ENGLISH, "corrupt": "The dog sat on the mat because it was warm.", "answer": " cat", "wrong": " dog"},
         "all-MiniLM-L6-v2 is an encoder without a masked-LM head"),
        ("/api/patch", {"text": CLEAN, "corrupt": CLEAN, "answer": ANSWER, "wrong": WRONG}, "the clean text and the"),
        ("/api/patch", {"text": CLEAN, "answer": ANSWER, "wrong": WRONG}, "the request has no 'corrupt': a patch needs corrupt, answer, wrong"),
        ("/api/patch", {"text": CLEAN, "corrupt": CORRUPT, "answer": ANSWER, "wrong": WRONG, "layer": 1}, "unknown field 'layer'"),
        ("/api/roles", {"text": ENGLISH, "retrieval": True}, "unknown field 'retrieval': a request takes text, model, stack, "),
        ("/api/roles", {"text": ENGLISH, "sinks": "4"}, None),
        ("/api/roles", {"text": "   "}, "the text is empty"),
        ("/api/roles", {"text": ENGLISH, "model": "gpt2"}, "model 'gpt2' is not loaded here"),
    ],
)  # fmt: skip
def test_a_refused_roles_or_patch_request_is_one_json_line_and_a_400(server, path, body, error):
    status, answer = post(server, path, body)
    assert status == 400 and set(answer) == {"error"} and "\n" not in answer["error"] and "Traceback" not in answer["error"], answer
    if error is not None:
        assert answer["error"].startswith(error)
    assert post(server, "/api/heads", {"text": ENGLISH})[0] == 200  # still serving


def test_texts_past_max_tokens_are_refused_by_roles_and_patch_before_they_run(bundled):
    with serving({"bundled": bundled}, max_tokens=8) as server:
        assert post(server, "/api/roles", {"text": ENGLISH}) == (400, {"error": "the text has 13 tokens: this server takes at most 8 (--max-tokens)"})
        assert post(server, "/api/patch", {"text": "the cat", "corrupt": ENGLISH, "answer": " a", "wrong": " b"}) == (
            400, {"error": "the corrupted text has 13 tokens: this server takes at most 8 (--max-tokens)"})  # fmt: skip
        assert post(server, "/api/roles", {"text": "the cat sat"})[0] == 200


def test_roles_take_their_turn_on_the_model_with_heads(bundled):
    """One computation at a time per model, whatever the route: with no place to wait, of 6 at once some get 503."""
    long_text = " ".join(["the cat sat on the mat"] * 40)  # 242 tokens: a roles run long enough for the others to arrive
    with serving({"bundled": bundled}, waiting=0) as server:
        answers = []
        start = threading.Barrier(6)

        def client(path):
            start.wait()
            answers.append(post(server, path, {"text": long_text}))

        threads = [threading.Thread(target=client, args=(path,)) for path in ["/api/roles", "/api/heads"] * 3]
        for each in threads:
            each.start()
        for each in threads:
            each.join()
        assert {status for status, _ in answers} == {200, 503}
        assert all(answer == {"error": "the model is busy: try again in a moment"} for status, answer in answers if status == 503)


def test_an_answer_of_chinese_carries_the_glyphs_of_its_record_and_of_the_page_and_no_others(server):
    from fontTools.ttLib import TTFont

    from attnviz.html.font import FAMILY, is_cjk
    from attnviz.html.page import page_script, record_json

    status, record = post(server, "/api/heads", {"text": ZH, "as": "report"})
    assert status == 200
    font = record.pop("font")
    assert font["family"] == FAMILY and font["url"].startswith("data:font/woff;base64,")
    woff = base64.b64decode(font["url"].removeprefix("data:font/woff;base64,"))
    assert woff[:4] == b"wOFF" and len(woff) < 16_000  # a few glyphs, not the 16 MB font
    drawn = {chr(code) for code in TTFont(io.BytesIO(woff)).getBestCmap()}
    shown = record_json(record)
    assert set(ZH) <= drawn and {char for char in shown if is_cjk(char)} <= drawn  # the text, its tokens, its title
    page = shown + record_json(server.explorer.models()) + page_script(explorer=True)
    assert drawn <= {char for char in page if ord(char) > 127} and not any(char.isascii() for char in drawn)
    status, roles = post(server, "/api/roles", {"text": ZH})
    assert status == 200 and set(ZH) <= {chr(code) for code in TTFont(io.BytesIO(base64.b64decode(roles["font"]["url"].split(",")[1]))).getBestCmap()}
