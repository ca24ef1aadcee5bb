"""report.html carries its CJK glyphs: a subset of the bundled Noto Sans CJK SC as a data: font.

Without it, a machine with no CJK system font shows the Chinese tokens as empty boxes. The subset
is read back here with fontTools; the browser test runs a Chromium whose fontconfig sees only
matplotlib's DejaVu (tests/browser.py), where every missing glyph draws the same box: distinct
characters that draw as distinct pixels are drawn from real glyphs.
"""

from __future__ import annotations

import base64
import io
import re

import numpy as np
import pytest

import attnviz
from attnviz.render.fonts import bundled_font_file

ZH = "我想吃酸菜鱼 中国的大学生"  # the bundled vocabulary has 我 中 国 的 大 学 生 (想吃酸菜鱼 are [UNK] there)
SHOWN_TOKENS = "我中国的大学生"
FONT_FACE = re.compile(r'@font-face \{ font-family: "([^"]+)"; src: url\("data:font/woff;base64,([A-Za-z0-9+/=]+)"\) format\("woff"\)')
DATA = re.compile(r'<script type="application/json" id="attnviz-data">(.*?)</script>', re.S)
SCRIPT = re.compile(r"<script>(.*?)</script>", re.S)

pytestmark = pytest.mark.skipif(bundled_font_file() is None, reason="the mplfonts package (the bundled CJK font) is not installed")


@pytest.fixture(scope="module")
def zh_report(tmp_path_factory):
    folder = tmp_path_factory.mktemp("report-fonts")
    (path,) = attnviz.report(ZH, model=attnviz.load("bundled", device="cpu")).save(folder)
    return path


def embedded_font(page: str):
    """(family, the font as fontTools reads it, its WOFF bytes) of the page's one @font-face."""
    from fontTools.ttLib import TTFont

    (match,) = FONT_FACE.finditer(page)
    woff = base64.b64decode(match.group(2))
    return match.group(1), TTFont(io.BytesIO(woff)), woff


def test_the_page_carries_the_glyphs_of_its_characters_and_no_others(zh_report):
    page = zh_report.read_text(encoding="utf-8")
    family, font, woff = embedded_font(page)
    assert woff[:4] == b"wOFF" and len(woff) < 16_000  # a few glyphs, not the 16 MB font
    drawn = {chr(code) for code in font.getBestCmap()}
    assert set(SHOWN_TOKENS) | set(ZH.replace(" ", "")) <= drawn  # the tokens and the text
    # nothing but what the page holds outside the font: its record and its scripts
    without_font = FONT_FACE.sub("", page)
    assert drawn <= {char for char in DATA.search(without_font).group(1) + SCRIPT.search(without_font).group(1) if ord(char) > 127}
    assert not any(char.isascii() for char in drawn)  # Latin comes from the reader's fonts
    csp = re.search(r'http-equiv="Content-Security-Policy" content="([^"]+)"', page).group(1)
    assert "font-src data:" in csp and "default-src &#x27;none&#x27;" in csp
    assert f'"{family}"' in re.search(r"--font:([^;]+);", page).group(1)  # the page's font stack names it


def _glyph_images(page, characters):
    """Each character drawn alone by the page's own CSS in a token's box, as RGB pixels."""
    from PIL import Image

    images = []
    for char in characters:
        shot = page.locator(".token[data-side=query]", has_text=char).first.screenshot()
        images.append(np.asarray(Image.open(io.BytesIO(shot)).convert("RGB")))
    return images


def _cjk_elements(page):
    """(selector, text) of the header's text and of every token that holds a CJK ideograph."""
    found = page.evaluate(
        """() => Array.from(document.querySelectorAll('.report-text, .token')).filter(e => /[\\u4e00-\\u9fff]/.test(e.textContent))
        .map(e => [e.classList.contains('token') ? `.token[data-side=${e.dataset.side}][data-index="${e.dataset.index}"]` : '.report-text', e.textContent])"""
    )
    assert len(found) == 1 + 2 * len(SHOWN_TOKENS)
    return found


def test_chinese_shows_as_glyphs_in_a_browser_without_a_cjk_font(zh_report, browser, tmp_path):
    from browser import OfflinePage, chromium_with_latin_fonts_only, platform_fonts

    stripped = tmp_path / "without-font.html"  # the same page without its font: the control
    stripped.write_text(re.sub(r"@font-face \{[^}]*\}", "", zh_report.read_text(encoding="utf-8")), encoding="utf-8")
    characters = "我国的"  # tokens with no space before them: boxes of one width (中 reads "␣中")
    with chromium_with_latin_fonts_only(browser, tmp_path) as latin_only:
        control = OfflinePage(latin_only, stripped)
        boxes = _glyph_images(control.page, characters)
        control.assert_offline_and_clean()
        control.close()
        # the browser has no CJK font: every character draws the same empty box
        assert all(box.shape == boxes[0].shape and (box == boxes[0]).all() for box in boxes)
        page = OfflinePage(latin_only, zh_report)
        page.wait_until("document.fonts.status === 'loaded'")
        family = embedded_font(zh_report.read_text(encoding="utf-8"))[0]
        assert page.page.evaluate(f"document.fonts.check('16px \"{family}\"', '{characters}')")
        glyphs = _glyph_images(page.page, characters)
        page.page.screenshot(path=str(tmp_path / "report-latin-only.png"))
        page.assert_offline_and_clean()  # before DevTools inspects it: Chromium 150's CSS agent logs an error of its own
        # every element of Chinese text draws its CJK characters with the page's font, as Chromium reports
        for selector, element_text in _cjk_elements(page.page):
            fonts = platform_fonts(page.context, page.page, selector)
            cjk = sum(1 for char in element_text if "\u4e00" <= char <= "\u9fff")
            assert fonts.get(True, 0) == cjk, f"{selector} ({element_text}) drew with {fonts}"
        assert page.requests == [], f"the page tried to load {page.requests}"
        page.close()
    for n, glyph in enumerate(glyphs):  # each a glyph of its own, none the box
        assert not (glyph.shape == boxes[0].shape and (glyph == boxes[0]).all())
        assert all(not (glyph.shape == other.shape and (glyph == other).all()) for other in glyphs[n + 1 :])


def test_a_page_without_chinese_japanese_or_korean_embeds_no_font(tmp_path):
    """The font is for CJK text: an English page's other characters (·, ×, …) come from the reader's fonts."""
    (path,) = attnviz.report("The cat sat on the mat.", model=attnviz.load("bundled", device="cpu")).save(tmp_path)
    page = path.read_text(encoding="utf-8")
    assert "@font-face" not in page
    assert any(ord(char) > 127 for char in SCRIPT.search(page).group(1))  # the scripts do hold non-ASCII symbols


@pytest.mark.parametrize("text", ["我", "ひらがな", "カタカナ", "한국어", "（全角）", "𠀀"])
def test_chinese_japanese_and_korean_characters_ask_for_the_font(text):
    from attnviz.html.font import shown_characters

    assert shown_characters('{"text": "%s"}' % text, "") != ""
    assert shown_characters('{"text": "café – naïve · ≥ →"}', "// 我 in a comment") == ""


def test_each_embedded_glyph_draws_the_bundled_fonts_pixels_and_the_licence_travels_with_it(zh_report):
    """The page's font is built from the bundled font's outlines (html/font.py subset_font): FreeType draws each of its
    characters, at three sizes, pixel for pixel as it draws the bundled font's; its advances are the bundled font's;
    its copyright and licence names (0, 13, 14: the SIL Open Font License's ask) are the bundled font's."""
    from matplotlib.ft2font import FT2Font, LoadFlags

    _, font, _ = embedded_font(zh_report.read_text(encoding="utf-8"))
    font.flavor = None  # the WOFF's tables as a plain OpenType file, which FreeType reads
    plain = io.BytesIO()
    font.save(plain)
    plain.seek(0)
    embedded, bundled = FT2Font(plain), FT2Font(str(bundled_font_file()))
    characters = "".join(chr(code) for code in font.getBestCmap())
    assert set(SHOWN_TOKENS) <= set(characters)
    for size in (11, 16, 48):
        for char in characters:
            drawn = []
            for source in (embedded, bundled):
                source.set_size(size, 72)
                source.set_text(char, flags=LoadFlags.NO_HINTING)
                source.draw_glyphs_to_bitmap(antialiased=True)
                advance = source.load_char(ord(char), flags=LoadFlags.NO_SCALE).horiAdvance
                drawn.append((advance, np.asarray(source.get_image())))
            (advance, pixels), (bundled_advance, bundled_pixels) = drawn
            assert advance == bundled_advance and pixels.shape == bundled_pixels.shape, char
            assert (pixels == bundled_pixels).all() and pixels.any(), char
    names = {key[3]: text for key, text in bundled.get_sfnt().items() if key[:3] == (3, 1, 0x409)}
    for name_id in (0, 13, 14):
        assert font["name"].getName(name_id, 3, 1, 0x409).toUnicode() == names[name_id].decode("utf-16-be")
