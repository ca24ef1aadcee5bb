"""A report's every layer (api/report_parts.py's every_layer, html/record.py's LayerCodes) is made a layer at a time:
each layer's map encoded, measured and rolled in as it is made, then let go, so a short text's report holds the codes
of every layer, not every layer's maps in float32.

A tiny Llama of 64 layers × 8 heads over 512 tokens (a short text: the longest with every map whole): its every
layer's maps are 537 MB in float32, their codes 134 MB. attnviz.report runs in a process of its own, after a first
report of a short text (the imports and the first allocations), its peak resident memory reset (Linux's
/proc/self/clear_refs); what the report adds to the process at its peak stays under the maps' size.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch
import transformers

from tiny_families import _DECODER, bpe_tokenizer, save_checkpoint

LAYERS, HEADS, TOKENS = 64, 8, 512
MAPS_MB = LAYERS * HEADS * TOKENS * TOKENS * 4 / 2**20  # 512 MiB

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="the peak resident memory reset and read in /proc (Linux)")

MEASURE = """
import json, sys
import attnviz

def memory(field):
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) / 1024 for line in status if line.startswith(field))

model = attnviz.load(sys.argv[1], "cpu")
attnviz.report("The cat sat on the mat.", model=model)
text = " ".join(["The cat sat on the mat because it was tired, and the dog lay down by the door."] * 60)
with open("/proc/self/clear_refs", "w") as clear:
    clear.write("5")  # the peak resident size (VmHWM) reset to the resident size now
before = memory("VmRSS:")
result = attnviz.report(text, model=model, truncate=True)
print(json.dumps({"added_mb": memory("VmHWM:") - before, "tokens": len(result.record["texts"][0]["query_tokens"])}))
"""


@pytest.mark.slow  # a checkpoint built, and two reports in a process of their own
def test_a_short_texts_report_holds_every_layers_codes_not_its_maps(tmp_path):
    config = transformers.LlamaConfig(**{**_DECODER, "num_hidden_layers": LAYERS, "num_attention_heads": HEADS,
                                         "hidden_size": 64, "max_position_embeddings": TOKENS})  # fmt: skip
    save_checkpoint(config, transformers.LlamaModel, bpe_tokenizer(bos=True), tmp_path / "llama", seed=0, dtype=torch.float32)
    done = subprocess.run([sys.executable, "-c", MEASURE, str(tmp_path / "llama")], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    measured = json.loads(done.stdout.strip().splitlines()[-1])
    assert measured["tokens"] == TOKENS
    assert measured["added_mb"] < MAPS_MB, measured
