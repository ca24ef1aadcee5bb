"""The report's record and page, without a browser: weights encoded as stated, text kept as data.

The browser tests (test_report_browser.py) open the pages; these check what the page is given.
"""

import base64
import hashlib
import json
import re
import zlib

import numpy as np
from helpers import HOSTILE

from attnviz.html.page import SCRIPTS, content_security_policy, page_script, record_json, report_page
from attnviz.html.encoding import EXACT_UNIT, LOG_MIN, decode_weights, encode_exact, encode_quantised


def attention_rows(shape, seed=0):
    """Rows that sum to 1, from flat to nearly one-hot, as float32 like the runs' weights."""
    rng = np.random.default_rng(seed)
    logits = rng.normal(size=shape) * rng.uniform(0.1, 8.0, size=shape[:-1] + (1,))
    weights = np.exp(logits - logits.max(-1, keepdims=True))
    return (weights / weights.sum(-1, keepdims=True)).astype(np.float32)


def unpack(encoded: dict) -> np.ndarray:
    """The integer codes, decoded here independently of record.py."""
    dtype = "<u2" if encoded["dtype"] == "uint16" else "u1"
    raw = zlib.decompress(base64.b64decode(encoded["data"]))
    return np.frombuffer(raw, dtype=dtype).reshape(encoded["shape"])


def test_exact_weights_are_the_weights_rounded_to_four_decimals():
    weights = attention_rows((3, 7, 9))
    encoded = encode_exact(weights)
    assert encoded["dtype"] == "uint16" and encoded["unit"] == EXACT_UNIT and encoded["shape"] == [3, 7, 9]
    expected = np.round(weights.astype(np.float64), 4)
    assert np.abs(unpack(encoded) * 1e-4 - expected).max() < 1e-12
    assert np.abs(decode_weights(encoded) - weights).max() <= 0.5e-4 + 1e-9


def test_quantised_weights_are_within_half_a_level_of_the_log_scale():
    weights = attention_rows((2, 40, 300), seed=1)
    codes = unpack(encode_quantised(weights)).astype(np.float64)
    half_level = 0.5 * 3 / 254  # in decades: 255 codes span 1e-3 .. 1
    visible = weights >= LOG_MIN
    decoded = 10 ** (3 * (codes - 1) / 254 - 3)
    assert np.abs(np.log10(decoded[visible]) - np.log10(weights[visible])).max() <= half_level + 1e-6
    assert (codes[weights < LOG_MIN * 10 ** -half_level - 1e-9] == 0).all()  # below the scale: code 0
    assert codes.max() == 255 or weights.max() < 1 - 1e-3
    assert np.allclose(decode_weights(encode_quantised(weights))[visible], decoded[visible])


def test_a_one_hot_row_keeps_its_one_and_its_zeros():
    row = np.zeros((1, 5), dtype=np.float32)
    row[0, 2] = 1.0
    assert unpack(encode_exact(row)).tolist() == [[0, 0, 10000, 0, 0]]
    assert unpack(encode_quantised(row)).tolist() == [[0, 0, 255, 0, 0]]


def page_parts(page: str) -> tuple[str, str, str]:
    """The CSP, the data element's text and the inline script's text of a page."""
    csp = re.search(r'http-equiv="Content-Security-Policy" content="([^"]*)"', page).group(1)
    data = re.search(r'<script type="application/json" id="attnviz-data">(.*?)</script>', page, re.S).group(1)
    scripts = re.findall(r"<script>(.*?)</script>", page, re.S)
    assert len(scripts) == 1
    return csp.replace("&#x27;", "'"), data, scripts[0]


def test_hostile_text_stays_data_and_the_policy_allows_only_the_page_script():
    record = {"texts": [{"text": HOSTILE, "query_tokens": [HOSTILE, "我"]}], "note": "<!-- -->"}
    page = report_page(record)
    csp, data, script = page_parts(page)
    assert "<" not in data  # nothing in the data can end its element or open a comment
    assert json.loads(data) == record
    digest = base64.b64encode(hashlib.sha256(script.encode()).digest()).decode()
    assert csp == f"default-src 'none'; script-src 'sha256-{digest}'; style-src 'unsafe-inline'; img-src data: blob:; font-src data:"
    assert script == page_script()
    assert "onerror" not in page.replace(data, "")  # the hostile text appears nowhere but in the data
    assert "<title>attnviz · &lt;/script&gt;" in page


def test_record_json_escapes_every_angle_bracket_and_keeps_characters():
    text = record_json({"t": "a<b 我 \u2028"})
    assert "<" not in text and "我" in text
    assert json.loads(text) == {"t": "a<b 我 \u2028"}


def test_policy_names_the_scripts_hash():
    digest = base64.b64encode(hashlib.sha256(b"let a = 1;").digest()).decode()
    assert f"'sha256-{digest}'" in content_security_policy("let a = 1;")


def test_page_scripts_are_package_data_in_order():
    present = [name for name in SCRIPTS if f"// ---- {name} ----" in page_script()]
    assert present == list(SCRIPTS), "every script of the page ships in attnviz/html/static"
