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

_KEY_CHARS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_.-\"' ")


def _header(line: str) -> tuple[bool, str] | None:
    """``(is an array of tables, name)`` of a ``[name]`` / ``[[name]]`` header line, else None.
    Plain scans, linear in the line: the regular expressions these replace backtracked
    cubically on a line of ``[`` and spaces (10 s for 1,000 spaces)."""
    s = line.strip()
    if not s.startswith("["):
        return None
    array = s.startswith("[[")
    inner = s[2:] if array else s[1:]
    end = inner.find("]")
    name = inner[:end].strip() if end > 0 else ""
    if not name or "=" in name:
        return None
    rest = inner[end + 1 :]
    rest = (rest[1:] if array and rest.startswith("]") else rest).strip()
    if rest and not rest.startswith("#"):
        return None
    return array, name


def _key(line: str) -> tuple[str, str] | None:
    """``(key, the value's text)`` of a ``key = value`` line, else None."""
    s = line.lstrip()
    if s[:1] in ('"', "'"):
        close = s.find(s[0], 1)
        after = s[close + 1 :].lstrip() if close > 0 else ""
        if after.startswith("="):
            return s[: close + 1], after[1:]
    eq = s.find("=")
    key = s[:eq].strip() if eq > 0 else ""
    if not key or not all(c in _KEY_CHARS for c in key):
        return None
    return key, s[eq + 1 :]


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
            header = _header(line)
            if header is not None:
                names = _split_key(header[1])
                if not names:
                    continue
                path = self._resolve(names[:-1], counts)
                key = (*path, names[-1])
                if header[0]:
                    idx = counts.get(key, 0)
                    counts[key] = idx + 1
                    current = (*key, idx)
                else:
                    current = key
                self.lines.setdefault(current, no)
                continue
            k = _key(line)
            if k:
                loc = (*current, *_split_key(k[0]))
                self.lines.setdefault(loc, no)
                value = k[1]
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
