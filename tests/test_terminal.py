"""The terminal's own layout helpers."""

from rich.cells import cell_len

from attnviz.terminal import indented_lines


def test_indented_lines_fill_each_line_up_to_the_width_and_indent_every_line():
    words = [f"head_{i:02d}.png" for i in range(12)] + ["heads.png", "attention.json"]
    lines = indented_lines(words, 80)
    assert [line.split() for line in lines] == [words[:6], words[6:12], words[12:]]
    assert all(line.startswith("  ") and not line.startswith("   ") and len(line) <= 80 for line in lines)


def test_indented_lines_count_terminal_cells_and_keep_a_longer_word_whole():
    lines = indented_lines(["01-我想吃酸菜鱼", "02-酸菜鱼", "x" * 50], 20)
    assert lines == ["  01-我想吃酸菜鱼", "  02-酸菜鱼", "  " + "x" * 50]
    assert cell_len(lines[0]) == 17  # two cells per CJK character
