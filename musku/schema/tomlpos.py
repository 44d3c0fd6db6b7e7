"""Line numbers of TOML keys, so that pydantic errors keep the ``file:line`` form.

``tomllib`` gives no positions. This scanner follows the table headers (``[a]``, ``[[a.b]]``)
and ``key = value`` lines of a document and records, for each location path such as
``("services", 2, "stages", 0, "time")``, the line where it starts. A pydantic error location
is then mapped to the line of its longest recorded prefix. Inline tables and arrays map to the
line of their key (good enough to point a user at the right place).
"""

from __future__ import annotations

import re
from collections.abc import Sequence

_HEADER = re.compile(r"^\s*(\[\[?)\s*([^\]]+?)\s*\]\]?\s*(#.*)?$")
_KEY = re.compile(r"""^\s*("[^"]*"|'[^']*'|[A-Za-z0-9_.\-"' ]+?)\s*=""")


def _split_key(text: str) -> list[str]:
    parts = re.findall(r'"[^"]*"|\'[^\']*\'|[^.]+', text)
    return [p.strip().strip("\"'") for p in parts if p.strip()]


class Positions:
    """Maps location tuples to 1-based line numbers in a TOML document."""

    def __init__(self, text: str) -> None:
        self.lines: dict[tuple[str | int, ...], int] = {}
        counts: dict[tuple[str | int, ...], int] = {}  # array-of-tables path -> entries so far
        current: tuple[str | int, ...] = ()
        depth = 0  # open brackets of a multi-line value: its lines are not keys
        for no, raw in enumerate(text.splitlines(), start=1):
            line = raw.split("#", 1)[0] if '"' not in raw and "'" not in raw else raw
            if depth > 0:
                depth += line.count("[") + line.count("{") - line.count("]") - line.count("}")
                continue
            m = _HEADER.match(line)
            if m and "=" not in line.split("]")[0]:
                names = _split_key(m.group(2))
                path = self._resolve(names[:-1], counts)
                key = (*path, names[-1])
                if m.group(1) == "[[":
                    idx = counts.get(key, 0)
                    counts[key] = idx + 1
                    current = (*key, idx)
                else:
                    current = key
                self.lines.setdefault(current, no)
                continue
            k = _KEY.match(line)
            if k:
                loc = (*current, *_split_key(k.group(1)))
                self.lines.setdefault(loc, no)
                value = line[k.end() :]
                depth = max(
                    0, value.count("[") + value.count("{") - value.count("]") - value.count("}")
                )

    def _resolve(
        self, names: Sequence[str], counts: dict[tuple[str | int, ...], int]
    ) -> tuple[str | int, ...]:
        """A dotted header prefix, with each array of tables resolved to its latest entry."""
        path: tuple[str | int, ...] = ()
        for name in names:
            path = (*path, name)
            if path in counts:
                path = (*path, counts[path] - 1)
        return path

    def line(self, loc: Sequence[str | int]) -> int | None:
        """Line of the longest recorded prefix of ``loc`` (None if nothing matches)."""
        key = tuple(loc)
        while key:
            if key in self.lines:
                return self.lines[key]
            key = key[:-1]
        return None
