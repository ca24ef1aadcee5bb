"""The terminal's own layout helpers, and tables that show every entry whole."""

import io

import numpy as np
from rich.cells import cell_len
from rich.console import Console

from attnviz.analysis.statistics import summarize_heads
from attnviz.render.terminal import batch_table, heads_table, indented_lines
from attnviz.run_data import AttentionRun


def test_indented_lines_fill_each_line_up_to_the_width_and_indent_every_line():
    words = [f"head_{i:02d}.png" for i in range(12)] + ["heads.png", "attention.json"]
    lines = indented_lines(words, 80)
    assert [line.split() for line in lines] == [words[:6], words[6:12], words[12:]]
    assert all(line.startswith("  ") and not line.startswith("   ") and len(line) <= 80 for line in lines)


def test_indented_lines_count_terminal_cells_and_keep_a_longer_word_whole():
    lines = indented_lines(["01-我想吃酸菜鱼", "02-酸菜鱼", "x" * 50], 20)
    assert lines == ["  01-我想吃酸菜鱼", "  02-酸菜鱼", "  " + "x" * 50]
    assert cell_len(lines[0]) == 17  # two cells per CJK character


# ---- the heads table and the batch summary: every entry shown whole, tokens by index ----

REPEATED = ["[CLS]", "the", "cat", "saw", "the", "dog", "[SEP]"]  # two "the"


def rendered(renderable, width: int) -> str:
    console = Console(file=io.StringIO(), width=width, highlight=False, color_system=None)
    console.print(renderable)
    return console.file.getvalue()


def last_column(table: str) -> str:
    """The text of a table's last column, its wrapped lines joined, white space removed."""
    cells = [line.split("│")[-2] for line in table.splitlines() if line.count("│") > 1]
    return "".join("".join(cells).split())


def one_hot_run(top_keys: list[int], causal: bool = False) -> AttentionRun:
    """One head whose query i attends only to key top_keys[i]."""
    attention = np.eye(len(REPEATED))[top_keys][None]  # (1, N, N)
    return AttentionRun(
        text="the cat saw the dog", model="m", layer=0, weights="pretrained", num_heads=1, device="cpu",
        query_tokens=REPEATED, key_tokens=REPEATED, query_ids=list(range(7)), key_ids=list(range(7)),
        attention=attention, output=np.zeros((7, 4)), causal=causal,
    )


def test_heads_table_names_tokens_by_index_and_wraps_instead_of_cutting():
    top_keys = [0, 0, 1, 2, 3, 4, 5]  # query i on key i-1: "4:the→3:saw", "2:cat→1:the"
    run = one_hot_run(top_keys)
    table = rendered(heads_table(run, summarize_heads(run.attention)), width=50)
    flat = last_column(table)  # the pairs wrap over lines; their order stays
    expected = "".join(f"{q}:{REPEATED[q]}→{k}:{REPEATED[k]}" for q, k in enumerate(top_keys))
    assert expected in flat
    assert "…" not in table and all(len(line) <= 50 for line in table.splitlines())


def test_heads_table_legend_says_what_rel_divides_by():
    causal, plain = one_hot_run([0] * 7, causal=True), one_hot_run([0] * 7)
    table = rendered(heads_table(causal, summarize_heads(causal.attention, causal=True)), width=300)
    assert "entropy / log(keys the query may see)" in table and "query i sees keys 0..i" in table
    plain = rendered(heads_table(plain, summarize_heads(plain.attention)), width=300)
    assert "query i sees keys 0..i" not in plain  # said only when causal


def test_batch_table_shows_every_text_whole_at_any_width():
    text = "a long line of text that does not fit in a narrow terminal, " * 3
    row = dict(index=1, line=4, folder="001-a", tokens=60, most_focused_head=2,
               most_focused_relative_entropy=0.5, mean_relative_entropy=0.7, text=text.strip())
    table = rendered(batch_table([row]), width=60)
    assert "…" not in table
    assert "".join(text.split()) in last_column(table)


def test_the_heads_table_of_a_run_over_words_names_words_and_a_run_over_tokens_tokens():
    """--words: the rows and columns are words, and the table's header and caption say so."""
    import attnviz

    text = "the cat sat on the mat while the dog slept under the old table near the warm kitchen door"
    for words, noun in ((True, "word"), (False, "token")):
        result = attnviz.heads(text, model="bundled", words=words)
        table = rendered(heads_table(result.run, result.summaries, most=4), width=300)
        assert f"(index:{noun})" in table
        other = "token" if words else "word"
        assert f"(index:{other})" not in table
        count = len(result.run.query_tokens)  # words: fewer than its tokens
        assert f"queries 0 to 3 of {count}{' words' if words else ''} shown" in table
    assert count > len(text.split())  # the last run was over tokens: [CLS], [SEP] besides the words
