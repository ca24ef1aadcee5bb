"""A vocabulary table read from its memory-mapped file (models/layer_weights.py's mapped_tensor) a chunk of rows at a time
gives back each chunk's pages as it goes: a pass over the whole table (the logits of generate and effect, copying's
W_E W_U) holds about one chunk of it in the process's memory, never the table (Llama-3.2-1B's is 525 MB in bfloat16),
and reads the very values the file holds."""

from __future__ import annotations

import os
import sys

import pytest
import torch
from safetensors.torch import save_file

from attnviz.models.layer_weights import LOGIT_ROWS, mapped_tensor, unembed, vocabulary_chunks

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="the process's resident pages read from /proc/self/statm (Linux)")

ROWS, WIDTH = 8 * LOGIT_ROWS, 1024  # 64 K rows of 1,024 in bfloat16: 128 MB, eight chunks
PAGE = os.sysconf("SC_PAGE_SIZE")


def resident_mb() -> float:
    with open("/proc/self/statm") as file:
        return int(file.read().split()[1]) * PAGE / 2**20


@pytest.fixture(scope="module")
def stored(tmp_path_factory):
    """(the table's file, the table as written): random bfloat16 values beside a small tensor before them."""
    path = tmp_path_factory.mktemp("table") / "model.safetensors"
    generator = torch.Generator().manual_seed(0)
    table = torch.randn(ROWS, WIDTH, generator=generator).to(torch.bfloat16)
    save_file({"a.bias": torch.ones(3), "embed_tokens.weight": table}, str(path))
    return path, table


def test_a_pass_over_a_mapped_table_holds_one_chunk_of_it_and_reads_the_files_values(stored):
    path, written = stored
    chunk_mb = LOGIT_ROWS * WIDTH * 2 / 2**20  # 16 MB
    table = mapped_tensor(path, "embed_tokens.weight")
    before = resident_mb()
    for rows in vocabulary_chunks(table):
        assert torch.equal(table[rows], written[rows])
    chunked = resident_mb() - before
    for first in range(0, ROWS, LOGIT_ROWS):  # the same pass, no page given back: the measure sees the whole table
        assert torch.equal(table[first : first + LOGIT_ROWS], written[first : first + LOGIT_ROWS])
    whole = resident_mb() - before
    assert chunked < 2 * chunk_mb < 0.5 * ROWS * WIDTH * 2 / 2**20 < whole


def test_the_logits_of_a_mapped_table_equal_torchs_over_the_table_in_float32(stored):
    path, written = stored
    hidden = torch.randn(3, WIDTH, generator=torch.Generator().manual_seed(1))
    bias = torch.randn(ROWS, generator=torch.Generator().manual_seed(2))
    expected = torch.nn.functional.linear(hidden, written.float(), bias)
    torch.testing.assert_close(unembed(hidden, mapped_tensor(path, "embed_tokens.weight"), bias), expected)  # float32's defaults
