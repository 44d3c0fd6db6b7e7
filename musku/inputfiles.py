"""Reading the files musku is given, within documented limits (docs/cli.md, "Input limits").

Every input file (experiment files, platform catalogs, simulator models, the agent's
configuration) is read through :func:`read_text`: it must be a regular file (not a FIFO, a
device such as ``/dev/zero``, or a directory) of at most :data:`MAX_FILE_BYTES`, in UTF-8.
Anything else is one :class:`~musku.errors.InputError` (exit 3), never a hang, an unbounded
read or a traceback. The limits on what a parsed document may hold (nesting, name lengths,
list sizes) are here too, so the parsers share them.
"""

from __future__ import annotations

import errno
import os
import re
import stat
from pathlib import Path

from musku.errors import InputError

TYPE_CHECKING = False  # not typing's: the qsim quick path never imports typing
if TYPE_CHECKING:
    from typing import Any

MAX_FILE_BYTES = 1 << 20
"""Largest input file musku reads (1 MiB: the shipped files are under 20 KiB)."""

MAX_NAME_CHARS = 200
"""Longest experiment name (the results database stores it in a ``VARCHAR(200)``; SQLite
would take a longer one, PostgreSQL not, so musku refuses it on both)."""

MAX_LABEL_CHARS = 100
"""Longest service name, platform name or metric name (``VARCHAR(100)`` columns)."""

MAX_PATH_CHARS = 4096
"""Longest file name given inside an input file (Linux's PATH_MAX)."""

MAX_NESTING = 32
"""Deepest nesting of tables and arrays in an input document."""

MAX_INT = (1 << 63) - 1
"""Largest integer (in absolute value) in an input document: a 64-bit database integer."""

MAX_KEY_CHARS = 200
"""Longest key in an input document."""

MAX_LIST_ITEMS = 10_000
"""Most items in one list of an input document (settings, loads, worker counts...)."""


def parse_toml(text: str, where: str) -> dict[str, Any]:
    """``tomllib.loads`` with the document limits: one InputError for malformed TOML (with
    ``file:line`` where tomllib gives it), nesting deeper than :data:`MAX_NESTING` (which
    would otherwise end in a RecursionError), a list over :data:`MAX_LIST_ITEMS` items, or a
    number too large to convert."""
    import tomllib  # lazy: a cached qsim run (musku/qsim/quick.py) reads no TOML

    _check_key_depth(text, where)
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        msg = str(exc)
        m = re.search(r"\(at line (\d+), column (\d+)\)", msg[-80:])
        at = f"{where}:{m.group(1)}" if m else where
        msg = re.sub(r"\s*\(at line \d+, column \d+\)", "", msg)
        raise InputError(f"malformed TOML: {msg}", where=at) from None
    except RecursionError:
        raise InputError(f"nested deeper than {MAX_NESTING} levels", where=where) from None
    except ValueError as exc:  # e.g. an integer of more than 4,300 digits
        raise InputError(f"malformed TOML: {exc}", where=where) from None
    check_shape(data, where)
    return data


def _check_key_depth(text: str, where: str) -> None:
    """Refuse a dotted key or table header of more than :data:`MAX_NESTING` parts before
    tomllib sees it: tomllib takes time quadratic in the parts (a 100 KB dotted key: minutes).
    A scan in linear time; dots inside quotes do not count."""
    for number, line in enumerate(text.splitlines(), start=1):
        s = line.lstrip()
        if not s or s[0] == "#":
            continue
        if s[0] == "[":
            key = s.lstrip("[").partition("]")[0]
        elif "=" in s:
            key = s.partition("=")[0]
        else:
            continue
        if key.count(".") <= MAX_NESTING:
            continue
        dots, quote = 0, ""
        for ch in key:
            if quote:
                quote = "" if ch == quote else quote
            elif ch in "\"'":
                quote = ch
            elif ch == ".":
                dots += 1
        if dots > MAX_NESTING:
            raise InputError(
                f"a key nested deeper than {MAX_NESTING} levels", where=f"{where}:{number}"
            )


def check_shape(data: Any, where: str) -> None:
    """Refuse a document nested deeper than :data:`MAX_NESTING`, with a list longer than
    :data:`MAX_LIST_ITEMS`, a key longer than :data:`MAX_KEY_CHARS` or an integer beyond
    :data:`MAX_INT` (walked without recursion)."""
    stack: list[tuple[Any, int]] = [(data, 0)]
    while stack:
        node, depth = stack.pop()
        if depth > MAX_NESTING:
            raise InputError(f"nested deeper than {MAX_NESTING} levels", where=where)
        if isinstance(node, int) and not -MAX_INT <= node <= MAX_INT:
            raise InputError(f"integer out of range (the limit is +-{MAX_INT})", where=where)
        if isinstance(node, dict):
            if any(len(k) > MAX_KEY_CHARS for k in node):
                raise InputError(f"a key longer than {MAX_KEY_CHARS} characters", where=where)
            stack.extend((v, depth + 1) for v in node.values())
        elif isinstance(node, list):
            if len(node) > MAX_LIST_ITEMS:
                raise InputError(
                    f"a list of {len(node):,} items (the limit is {MAX_LIST_ITEMS:,})", where=where
                )
            stack.extend((v, depth + 1) for v in node)


def size_text(n: int) -> str:
    return f"{n / (1 << 20):.0f} MiB" if n >= 1 << 20 else f"{n / 1024:.0f} KiB"


def read_text(path: str | Path, *, limit: int = MAX_FILE_BYTES) -> str:
    """The text of the regular file ``path``: at most ``limit`` bytes of UTF-8."""
    where = str(path)
    if len(where) > MAX_PATH_CHARS:
        raise InputError(f"file name longer than {MAX_PATH_CHARS} characters", where=where[:80])
    if "\0" in where:
        raise InputError("cannot read: the file name holds a NUL character", where=repr(where))
    try:
        # O_NONBLOCK: opening a FIFO must not wait for a writer; it is refused below
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        raise InputError("no such file", where=where) from None
    except OSError as exc:
        raise InputError(f"cannot read: {_reason(exc)}", where=where) from None
    try:
        st = os.fstat(fd)
        if stat.S_ISDIR(st.st_mode):
            raise InputError("cannot read: is a directory", where=where)
        if not stat.S_ISREG(st.st_mode):
            raise InputError("cannot read: not a regular file", where=where)
        if st.st_size > limit:
            raise InputError(
                f"file is {st.st_size:,} bytes, over the {size_text(limit)} limit for input files",
                where=where,
            )
        os.set_blocking(fd, True)
        chunks: list[bytes] = []
        total = 0
        while total <= limit:  # the file may grow while it is read: never read past the limit
            chunk = os.read(fd, limit + 1 - total)
            if not chunk:
                break
            chunks.append(chunk)
            total += len(chunk)
        if total > limit:
            raise InputError(
                f"file is over the {size_text(limit)} limit for input files", where=where
            )
    except OSError as exc:
        raise InputError(f"cannot read: {_reason(exc)}", where=where) from None
    finally:
        os.close(fd)
    try:
        return b"".join(chunks).decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InputError(f"cannot read: not UTF-8 text (byte {exc.start})", where=where) from None


def _reason(exc: OSError) -> str:
    if exc.errno == errno.ENAMETOOLONG:
        return "file name too long"
    return exc.strerror or type(exc).__name__


def safe_exists(path: Path) -> bool:
    """``path.exists()`` that answers False for a name the kernel refuses (too long, a NUL
    byte), instead of raising."""
    try:
        return path.exists()
    except (OSError, ValueError):
        return False
