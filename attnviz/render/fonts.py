"""Make matplotlib draw Chinese, Japanese and Korean tokens as characters, not empty boxes.

matplotlib's default font, DejaVu Sans, has no CJK glyphs. We keep DejaVu for Latin text and
add a CJK family behind it: matplotlib falls back per glyph along rcParams["font.family"].
"""

from __future__ import annotations

import functools
from pathlib import Path

# Families that cover CJK ideographs, in order of preference, if the system already has one.
SYSTEM_CJK_FAMILIES = (
    "Noto Sans CJK SC",
    "Noto Sans CJK JP",
    "Noto Sans CJK KR",
    "Noto Sans CJK TC",
    "Source Han Sans SC",
    "Source Han Sans",
    "WenQuanYi Zen Hei",
    "WenQuanYi Micro Hei",
    "Microsoft YaHei",
    "PingFang SC",
    "Hiragino Sans GB",
    "SimHei",
)

BUNDLED_FONT_FILE = "NotoSansCJKsc-Regular.otf"  # shipped by the PyPI package mplfonts


def use_cjk_font() -> str:
    """Set matplotlib's rcParams so CJK text renders; return the CJK family used.

    Returns "DejaVu Sans" when no CJK font is found (CJK would then show as boxes, Latin is
    fine). Cheap to call again: the font search runs once, only the rcParams are set each time.
    """
    import matplotlib

    families = _cjk_families()
    matplotlib.rcParams["font.family"] = ["DejaVu Sans", *families]
    # Type 3 (the default, pinned against a user's matplotlibrc): matplotlib writes each used
    # glyph's outline, read through FreeType, so the CFF-flavoured Noto .otf works. Type 42 would
    # embed that CFF data labelled as a TrueType font (FontFile2), which strict PDF readers reject.
    matplotlib.rcParams["pdf.fonttype"] = 3
    # Glyphs as paths: the SVG shows the same characters on a viewer without CJK fonts.
    matplotlib.rcParams["svg.fonttype"] = "path"
    return families[0] if families else "DejaVu Sans"


def displayable(text: str) -> str:
    """text with every character that no configured font can draw written as <U+XXXX>.

    Emoji, private-use and control characters would otherwise draw as empty boxes (with a
    warning per glyph); a code point at least says what the token holds.
    """
    covered = _covered_code_points()
    return "".join(char if ord(char) in covered else f"<U+{ord(char):04X}>" for char in text)


@functools.cache
def _covered_code_points() -> frozenset[int]:
    """Code points with a glyph in DejaVu Sans or the CJK family: what the labels can show."""
    from matplotlib import font_manager
    from matplotlib.ft2font import FT2Font

    covered = set()
    for family in ("DejaVu Sans", *_cjk_families()):
        path = font_manager.findfont(font_manager.FontProperties(family=family), fallback_to_default=False)
        covered.update(FT2Font(path).get_charmap())
    return frozenset(code for code in covered if chr(code).isprintable() or chr(code) == " ")


@functools.cache
def _cjk_families() -> tuple[str, ...]:
    """A system CJK family if there is one, then the bundled Noto Sans CJK SC.

    The bundled font stays last in the list even behind a system font, because some system
    fonts (SimHei, Microsoft YaHei, PingFang SC) have no Korean hangul.
    """
    from matplotlib import font_manager

    known = {font.name for font in font_manager.fontManager.ttflist}
    system = [family for family in SYSTEM_CJK_FAMILIES if family in known]
    bundled = _register_bundled_font()
    families = system[:1] + ([bundled] if bundled else [])
    return tuple(dict.fromkeys(families))  # the system font may be Noto Sans CJK SC itself


def _register_bundled_font() -> str | None:
    """Add mplfonts' Noto Sans CJK SC to matplotlib's font manager; return its family name."""
    from matplotlib import font_manager

    font_file = bundled_font_file()
    if font_file is None:
        return None
    font_manager.fontManager.addfont(font_file)
    return font_manager.FontProperties(fname=font_file).get_name()


def bundled_font_file() -> Path | None:
    """The font file inside the installed mplfonts package (None without it), found without importing it.

    report.html embeds a subset of it (attnviz/html/font.py).

    Importing mplfonts would pull in its own dependencies; we only need one of its files.
    """
    import importlib.util

    spec = importlib.util.find_spec("mplfonts")
    if spec is None or not spec.submodule_search_locations:
        return None
    for package_dir in spec.submodule_search_locations:
        font_file = Path(package_dir) / "fonts" / BUNDLED_FONT_FILE
        if font_file.is_file():
            return font_file
    return None
