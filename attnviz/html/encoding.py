"""The report's weights encoded compactly, as the page decodes them (ENCODED in docs/formats.md, "report.html").

A report of a 512-token text holds every layer's maps, 19 million weights (6 layers × 12 heads
× 512²): as JSON numbers that would be about 150 MB. So the weights travel as integers,
zlib-compressed and base64-encoded:

- exact: the weight rounded to 4 decimals, the precision the page reads out, as uint16 in units
  of 1e-4. The run's layer ("attention"), the rollout, and every layer of a text short enough;
- quantised: past MAX_EXACT_VALUES weights, the other layers' maps are drawn from uint8 codes,
  the 256 levels of the log colour scale from LOG_MIN to 1 that long maps use; the page marks
  their read-outs as approximate (≈).
"""

from __future__ import annotations

import base64
import math
import zlib

import numpy as np

EXACT_UNIT = 1e-4  # the read-out's 4 decimals
LOG_MIN = 1e-3  # the bottom of the log colour scale (render/scales.py's LOG_SCALE_MIN)
LOG_LEVELS = 255  # uint8 codes 1..255 on the log scale; code 0 is below LOG_MIN
EXACT_CHUNK = 2**20  # weights rounded at a time (encode_exact): 8 MB in float64
MAX_EXACT_VALUES = 2**22  # a text's every-layer maps are exact up to this many weights (6×12×240²)
COMPRESSION_LEVEL = 6


def encode_exact(weights: np.ndarray) -> dict:
    """Weights in [0, 1] rounded to 4 decimals: uint16 codes in units of EXACT_UNIT."""
    codes = np.empty(np.shape(weights), dtype="<u2")
    exact_codes(weights, codes)
    return _exact_record(codes)


def exact_codes(weights: np.ndarray, out: np.ndarray) -> None:
    """out (uint16, C-contiguous, weights' shape) = the weights' codes in units of EXACT_UNIT, computed in float64
    EXACT_CHUNK weights at a time (a layer's map of 32 heads at 512 tokens is 67 MB in float64)."""
    if out.size == 0:
        return
    rows, out = np.asarray(weights).reshape(-1, out.shape[-1]), out.reshape(-1, out.shape[-1])  # views
    step = max(1, EXACT_CHUNK // max(1, rows.shape[1]))
    for first in range(0, rows.shape[0], step):
        out[first : first + step] = np.rint(rows[first : first + step].astype(np.float64) / EXACT_UNIT)


def _exact_record(codes: np.ndarray) -> dict:
    return {"shape": list(codes.shape), "dtype": "uint16", "unit": EXACT_UNIT, "data": _packed(codes)}


def encode_quantised(weights: np.ndarray) -> dict:
    """Weights in [0, 1] as uint8 codes on the log scale: 0 below LOG_MIN, else 10 ** (3 * (c - 1) / 254 - 3)."""
    codes = np.empty(np.shape(weights), dtype=np.uint8)
    log_codes(weights, codes)
    return _log_record(codes)


def log_codes(weights: np.ndarray, out: np.ndarray) -> None:
    """out (uint8, weights' shape) = the weights' codes on the log scale, computed in float32 in one copy of them, in
    place (its cost: bench/RESULTS.md, "Timings behind the code")."""
    position = np.array(weights, dtype=np.float32)
    decades = -math.log10(LOG_MIN)  # 3
    with np.errstate(divide="ignore"):
        np.log10(position, out=position)  # 0 -> -inf, which clips to code 0
    position += decades
    position *= (LOG_LEVELS - 1) / decades
    position += 1  # 1 at LOG_MIN, 255 at 1
    np.rint(position, out=position)
    np.clip(position, 0, LOG_LEVELS, out=position)
    out[...] = position


def _log_record(codes: np.ndarray) -> dict:
    return {"shape": list(codes.shape), "dtype": "uint8", "log_min": LOG_MIN, "data": _packed(codes)}


class LayerCodes:
    """Every layer's maps (each (H, N, N)) as the page holds them, one (L, H, N, N) array, added a layer at a time in
    order (add), then encoded: exact up to MAX_EXACT_VALUES weights in all, else on the log scale's codes. Only the
    codes are held (uint16 or uint8), so a caller that lets each layer's map go once added does not hold every layer's
    maps in float32 (the 16 layers' of a Llama-3.2-1B-shaped model at 512 tokens are 537 MB; their codes, 134 MB)."""

    def __init__(self, num_layers: int):
        self.num_layers, self.codes, self.added = num_layers, None, 0

    def add(self, weights: np.ndarray) -> None:
        if self.codes is None:
            exact = self.num_layers * np.size(weights) <= MAX_EXACT_VALUES
            self.codes = np.empty((self.num_layers, *np.shape(weights)), dtype="<u2" if exact else np.uint8)
        (exact_codes if self.codes.dtype == np.uint16 else log_codes)(weights, self.codes[self.added])
        self.added += 1

    def encoded(self) -> dict:
        """The ENCODED array of every layer added (all num_layers of them)."""
        if self.added != self.num_layers:
            raise ValueError(f"{self.added} layers' maps added of {self.num_layers}")
        return (_exact_record if self.codes.dtype == np.uint16 else _log_record)(self.codes)


def encode_layers(maps: list[np.ndarray]) -> dict:
    """Every layer's maps (each (H, N, N)) as one (L, H, N, N) ENCODED array (LayerCodes')."""
    codes = LayerCodes(len(maps))
    for weights in maps:
        codes.add(weights)
    return codes.encoded()


def decode_weights(encoded: dict) -> np.ndarray:
    """The weights (or values: encode_values') an ENCODED array holds (what the page decodes), as float64."""
    raw = zlib.decompress(base64.b64decode(encoded["data"]))
    if encoded["dtype"] == "float32":
        return np.frombuffer(raw, dtype="<f4").reshape(encoded["shape"]).astype(np.float64)
    codes = np.frombuffer(raw, dtype="<u2" if encoded["dtype"] == "uint16" else np.uint8).reshape(encoded["shape"])
    if "unit" in encoded:  # uint16 or uint8 codes in units (encode_exact's, encode_values' indices)
        return codes * encoded["unit"]
    decades = -math.log10(encoded["log_min"])
    return np.where(codes == 0, 0.0, 10.0 ** (decades * (codes.astype(np.float64) - 1) / (LOG_LEVELS - 1) - decades))


def encode_values(values: np.ndarray, dtype: str) -> dict:
    """An array as the page decodes it with no unit: "float32" (why's terms, to float32's rounding: the page shows
    a few digits; why.json has them in float64), "uint16" or "uint8" (indices)."""
    codes = np.ascontiguousarray(values, dtype={"float32": "<f4", "uint16": "<u2", "uint8": "u1"}[dtype])
    return {"shape": list(codes.shape), "dtype": dtype, "unit": 1, "data": _packed(codes)}


def _packed(codes: np.ndarray) -> str:
    return base64.b64encode(zlib.compress(np.ascontiguousarray(codes), COMPRESSION_LEVEL)).decode("ascii")
