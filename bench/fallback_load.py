"""How long the default model takes to fall back to the bundled one when the hub never answers.

The worst case of a machine without network: HF_ENDPOINT points at a socket that accepts
connections and then says nothing, and the hub cache is empty. Prints the seconds load_model
took after the imports (torch's and the tokenizer's); with "bundled", the plain load of the bundled model, for comparison.

    python bench/fallback_load.py default|bundled
"""

import os
import socket
import sys
import tempfile
import time


def main(which: str) -> None:
    with socket.socket() as listener, tempfile.TemporaryDirectory() as home:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        os.environ.update(HF_ENDPOINT=f"http://127.0.0.1:{listener.getsockname()[1]}", HF_HOME=home)
        os.environ.pop("HF_HUB_OFFLINE", None)
        import attnviz.models.bert_encoder, tokenizers, torch  # noqa: F401  imported first: this times the loading, not the imports
        from attnviz.models.loading import load_model  # huggingface_hub reads the environment on import

        start = time.perf_counter()
        loaded = load_model(None if which == "default" else "bundled")
        seconds = time.perf_counter() - start
        assert loaded.source == "bundled", loaded.source
        print(f"loop_seconds={seconds:.3f}")


if __name__ == "__main__":
    main(sys.argv[1])
