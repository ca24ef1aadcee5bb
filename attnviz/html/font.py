"""A CJK font inside report.html: the bundled Noto Sans CJK SC's glyphs of the characters the page shows.

The figures draw Chinese with the Noto Sans CJK SC that the mplfonts package ships
(render/fonts.py); the page would otherwise depend on the reader's system fonts and show empty
boxes without a CJK one. So the page carries the glyphs it needs: a font built from that font's outlines
holding only the non-ASCII characters of its text (tokens, texts, titles, notes, and the scripts' own
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
    shown = {char for char in set(text) if ord(char) > 127}  # set(text): a page's few hundred distinct characters
    return "".join(sorted(shown)) if any(is_cjk(char) for char in shown) else ""


def font_face(characters: str) -> str:
    """An @font-face rule for FAMILY with the subset of the bundled font that draws characters.

    "" when there are no characters, mplfonts is not installed or the font has none of the characters.
    """
    url = font_url(characters)
    return f'@font-face {{ font-family: "{FAMILY}"; src: url("{url}") format("woff"); font-display: block; }}' if url else ""


@functools.lru_cache(maxsize=32)  # `attnviz serve` asks again for a text's glyphs at each layer picked
def font_url(characters: str) -> str:
    """The subset of the bundled font that draws characters, as a data: URL of a WOFF file ("" as font_face says)."""
    font_file = bundled_font_file() if characters else None
    if font_file is None:
        return ""
    from matplotlib.ft2font import FT2Font

    source = FT2Font(str(font_file))
    drawn = {ord(char): source.get_char_index(ord(char)) for char in characters}
    drawn = {code: index for code, index in drawn.items() if index}  # glyph 0 is .notdef: a character the font lacks
    if not drawn:
        return ""
    woff = io.BytesIO()
    subset_font(source, drawn).save(woff)
    return "data:font/woff;base64," + base64.b64encode(woff.getvalue()).decode("ascii")


def subset_font(source, drawn: dict[int, int]):
    """A CFF-flavoured WOFF (a fontTools TTFont) holding .notdef and the glyphs drawn ({code point: glyph index}) of
    source (an FT2Font): each glyph's outline and advance as FreeType reads them from the font, unscaled (font units),
    so that it draws the same pixels; the font's vertical metrics, and its names NAME_IDS.

    Built, not cut: fontTools' subsetter decompiles the whole font's cmap, metrics and CFF index to cut 20 glyphs
    from its 65,535 (0.79 s of CPU for 我想吃酸菜鱼's page on the project's Xeon, its imports included; 0.13 s so).
    No hinting and no layout features, as the subsetter was asked for before; head's dates are the font's, so the
    page is reproducible."""
    from fontTools.fontBuilder import FontBuilder
    from fontTools.pens.t2CharStringPen import T2CharStringPen
    from matplotlib.ft2font import LoadFlags
    from matplotlib.path import Path

    names = {0: ".notdef", **{index: f"glyph{index}" for index in sorted(set(drawn.values()))}}
    charstrings, metrics = {}, {}
    for index, name in names.items():
        glyph = source.load_glyph(index, flags=LoadFlags.NO_SCALE)
        vertices, codes = source.get_path()  # in 1/64 of the units loaded: here of font units
        pen = T2CharStringPen(glyph.horiAdvance, None)
        for segment, code in Path(vertices * 64, codes).iter_segments(simplify=False):  # CFF's: cubic curves
            points = segment.reshape(-1, 2).tolist()
            if code == Path.MOVETO:
                pen.moveTo(*points)
            elif code == Path.LINETO:
                pen.lineTo(*points)
            elif code == Path.CURVE4:
                pen.curveTo(*points)
            elif code == Path.CLOSEPOLY:
                pen.closePath()
            else:
                raise ValueError(f"glyph {index} of {source.fname}: a path code {code} that a CFF outline does not have")
        charstrings[name], metrics[name] = pen.getCharString(), (glyph.horiAdvance, glyph.horiBearingX)
    head, hhea, os2 = (source.get_sfnt_table(table) for table in ("head", "hhea", "OS/2"))
    date = head["modified"][0] << 32 | head["modified"][1]  # (high, low) 32 bits
    builder = FontBuilder(source.units_per_EM, isTTF=False)
    builder.font.recalcTimestamp = False
    builder.setupGlyphOrder(list(names.values()))
    builder.setupCharacterMap({code: names[index] for code, index in drawn.items()})
    builder.setupCFF(source.postscript_name, {"FullName": source.postscript_name}, charstrings, {})
    builder.setupHorizontalMetrics(metrics)
    builder.setupHorizontalHeader(ascent=hhea["ascent"], descent=hhea["descent"], lineGap=hhea["lineGap"])
    english = (3, 1, 0x409)  # Windows' English names, in UTF-16 (get_sfnt: {(platform, encoding, language, ID): bytes})
    strings = {key[3]: text.decode("utf-16-be") for key, text in source.get_sfnt().items() if key[:3] == english}
    builder.setupNameTable({name_id: text for name_id, text in strings.items() if name_id in NAME_IDS}, mac=False)
    builder.setupOS2(**{key: os2[key] for key in ("usWeightClass", "fsType", "fsSelection", "achVendID", "sTypoAscender",
                                                  "sTypoDescender", "sTypoLineGap", "usWinAscent", "usWinDescent")})  # fmt: skip
    builder.setupPost()
    builder.setupHead(unitsPerEm=source.units_per_EM, created=date, modified=date)
    builder.font.flavor = "woff"  # zlib; WOFF2 would need brotli
    return builder.font
