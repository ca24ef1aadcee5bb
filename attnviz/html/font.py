"""A CJK font inside report.html: the bundled Noto Sans CJK SC, cut to the characters the page shows.

The figures draw Chinese with the Noto Sans CJK SC that the mplfonts package ships
(render/fonts.py); the page would otherwise depend on the reader's system fonts and show empty
boxes without a CJK one. So the page carries the glyphs it needs: a subset of that font holding
only the non-ASCII characters of its text (tokens, texts, titles, notes, and the scripts' own
words), as a WOFF file (zlib; WOFF2 would need brotli) in a data: URL, which the page's
Content-Security-Policy allows (font-src data:). report.css names the family after the system
CJK fonts, so a system font still wins where there is one. `attnviz serve`'s page gets such a subset with each
answer (html/page.py's explorer_font); font_url keeps the 32 latest, as a page asks again for a text at each layer.

The subset keeps the font's copyright and licence names (name IDs 0 and 13-14: the SIL Open Font
License asks that they travel with the font).
"""

from __future__ import annotations

import base64
import functools
import io
import re

from attnviz.render.fonts import bundled_font_file

FAMILY = "attnviz Noto Sans CJK SC"  # report.css's --font and --mono name it
NAME_IDS = [0, 1, 2, 3, 4, 5, 6, 13, 14]  # copyright, names, version, licence and its URL
_COMMENT = re.compile(r"^\s*//.*$|\s// .*$", re.M)  # a script's comments: not shown, so not embedded


# Where Chinese, Japanese and Korean live in Unicode: the radicals and CJK punctuation to Hangul syllables
# (kana, bopomofo and the ideographs between), compatibility ideographs, fullwidth forms, the supplementary
# ideographs. A page without any of them needs no CJK font: its other characters are in the reader's fonts.
CJK_RANGES = ((0x2E80, 0xD7AF), (0xF900, 0xFAFF), (0xFE30, 0xFE4F), (0xFF00, 0xFFEF), (0x20000, 0x3FFFF))


def is_cjk(char: str) -> bool:
    return any(low <= ord(char) <= high for low, high in CJK_RANGES)


def shown_characters(record_json: str, script: str) -> str:
    """The non-ASCII characters the page can show, sorted (those of the record and of the scripts' code); "" when
    none of them is Chinese, Japanese or Korean, so that a page without such text embeds no font."""
    text = record_json + _COMMENT.sub("", script)
    shown = {char for char in text if ord(char) > 127}
    return "".join(sorted(shown)) if any(is_cjk(char) for char in shown) else ""


def font_face(characters: str) -> str:
    """An @font-face rule for FAMILY with the subset of the bundled font that draws characters.

    "" when there are no characters, mplfonts is not installed or the font has none of the characters.
    """
    url = font_url(characters)
    return f'@font-face {{ font-family: "{FAMILY}"; src: url("{url}") format("woff"); font-display: block; }}' if url else ""


@functools.lru_cache(maxsize=32)  # `attnviz serve` asks again for a text's glyphs at each layer picked: 0.7 s each
def font_url(characters: str) -> str:
    """The subset of the bundled font that draws characters, as a data: URL of a WOFF file ("" as font_face says)."""
    font_file = bundled_font_file() if characters else None
    if font_file is None:
        return ""
    from fontTools import subset
    from fontTools.ttLib import TTFont

    # lazy: reads only the tables the subsetter asks for; the original head.modified keeps the page reproducible
    font = TTFont(font_file, lazy=True, recalcTimestamp=False)
    covered = font.getBestCmap()
    drawn = [char for char in characters if ord(char) in covered]
    if not drawn:
        return ""
    # desubroutinize: each glyph's outline written out whole, so the subsetter need not read every glyph's charstring
    # to find the subroutines left unused (0.29 s of CPU for 我想吃酸菜鱼, 0.165 s so; the WOFF 3,144 bytes, 3,056 so)
    options = subset.Options(
        flavor="woff", layout_features=[], hinting=False, desubroutinize=True, bidi_closure=False, name_IDs=NAME_IDS
    )
    subsetter = subset.Subsetter(options)
    subsetter.populate(text="".join(drawn))
    subsetter.subset(font)
    woff = io.BytesIO()
    subset.save_font(font, woff, options)  # as options.flavor says
    return "data:font/woff;base64," + base64.b64encode(woff.getvalue()).decode("ascii")
