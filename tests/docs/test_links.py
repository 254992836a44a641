"""Every relative link of README.md and docs/**/*.md reaches a file or folder that exists.

Markdown links ``[text](path)`` and HTML ``<img src="path">``; code (fenced blocks and inline
spans) is not read. A link with an anchor is checked for its file only; web (``http(s)://``),
``mailto:`` and same-page (``#...``) links are skipped.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.scripts import ROOT

PAGES = sorted([ROOT / "README.md", *(ROOT / "docs").rglob("*.md")])
FENCE = re.compile(r"^ {0,3}(```|~~~).*?^ {0,3}\1", re.DOTALL | re.MULTILINE)
INLINE_CODE = re.compile(r"`[^`\n]*`")
MD_LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
IMG_SRC = re.compile(r"<img\b[^>]*\bsrc=[\"']([^\"']+)[\"']", re.IGNORECASE)
SKIP = ("http://", "https://", "mailto:", "#")


def links(text: str) -> list[str]:
    """The link targets of a markdown text, code left out."""
    text = INLINE_CODE.sub("", FENCE.sub("", text))
    return [m.group(1) for m in MD_LINK.finditer(text)] + [m.group(1) for m in IMG_SRC.finditer(text)]


def broken(page: Path) -> list[str]:
    out = []
    for target in links(page.read_text()):
        if target.startswith(SKIP):
            continue
        path = target.split("#", 1)[0].split("?", 1)[0]
        if path and not (page.parent / path).exists():
            out.append(target)
    return out


@pytest.mark.parametrize("page", PAGES, ids=[p.relative_to(ROOT).as_posix() for p in PAGES])
def test_every_relative_link_resolves(page):
    assert broken(page) == [], f"{page.relative_to(ROOT)}: links to nothing"


def test_the_link_reader_sees_links_and_images_but_not_code():
    text = ('[a](x.md#part) ![b](img/p.png "title") <img src="c.png" width="3"> `[d](code.md)` '
            '[e](https://x.org) [[f]](g/) [h](#top)\n```\n[i](fenced.md)\n```\n')
    assert links(text) == ["x.md#part", "img/p.png", "https://x.org", "g/", "#top", "c.png"]
