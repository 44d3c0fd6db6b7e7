"""The structure of a report page, without its text, data or images' bytes: the landmark
elements (headings, sections, figures, images' types, navigation links, tables, comparison
boxes) with their ids and classes in page order, numbers in ids replaced by ``#`` and a run
of repeats (a table's rows, the comparisons' boxes of up to four elements) kept once. Two reports of one
database have the same skeleton unless their layout differs."""

from __future__ import annotations

import re
from html.parser import HTMLParser

LANDMARKS = {"h1", "h2", "h3", "section", "figure", "figcaption", "img", "nav", "a", "table"}
LANDMARKS |= {"details", "ul", "pre", "th"}
KEPT = ("id", "class", "data-knob", "href", "loading")


class _Skeleton(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.lines: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag not in LANDMARKS:
            return
        found = dict(attrs)
        parts = [tag]
        for key in KEPT:
            value = found.get(key)
            if value is not None:
                parts.append(f"{key}={re.sub(r'[0-9]+', '#', value)}")
        src = found.get("src")
        if tag == "img" and src:
            parts.append("src=" + src.split(";", 1)[0])
        self.lines.append(" ".join(parts))


def _collapse(lines: list[str], longest: int = 4) -> list[str]:
    out = list(lines)
    i = 0
    while i < len(out):
        for k in range(1, longest + 1):
            while out[i : i + k] == out[i + k : i + 2 * k] and len(out[i : i + k]) == k:
                del out[i + k : i + 2 * k]
        i += 1
    return out


def skeleton(html: str) -> list[str]:
    p = _Skeleton()
    p.feed(html)
    p.close()
    return _collapse(p.lines)
