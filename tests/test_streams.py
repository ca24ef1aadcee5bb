"""output/streams.py's PipeSafeStream on a real pipe and a real text stream (the slow tier runs whole commands
into a closed pipe and an ASCII terminal: test_robustness.py)."""

import io
import os

from attnviz.output.streams import PipeSafeStream


def test_a_reader_that_closes_the_pipe_ends_the_writes_quietly_and_says_so():
    read_end, write_end = os.pipe()
    os.close(read_end)  # the reader is gone: a write now fails with EPIPE (Python ignores SIGPIPE)
    stream = PipeSafeStream(io.TextIOWrapper(os.fdopen(write_end, "wb"), encoding="utf-8"))
    assert not stream.broken

    assert stream.write("the cat sat\n") == len("the cat sat\n")  # buffered
    stream.flush()  # EPIPE here, and no error
    assert stream.broken
    assert stream.write("more\n") == len("more\n")  # dropped, as the run goes on
    stream.flush()
    stream.close()  # the descriptor now points at /dev/null: closing flushes nothing into the broken pipe


def test_a_character_the_encoding_lacks_is_written_escaped():
    raw = io.BytesIO()
    stream = PipeSafeStream(io.TextIOWrapper(raw, encoding="ascii"))
    stream.write("我 and café\n")
    stream.flush()
    assert raw.getvalue() == b"\\u6211 and caf\\xe9\n"
    assert stream.encoding == "ascii"  # everything but write and flush is the wrapped stream's
