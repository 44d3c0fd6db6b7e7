"""Files musku writes because a user named them (``-o``, ``--out``, exports): one helper.

A target is written atomically (a temporary file in the same directory, renamed over it) only
when it is a new path or a regular file. Anything else is refused with one line (exit 3)
before any work: a device (``/dev/full``, ``/dev/null``), a FIFO, a socket, a directory, a
symbolic link (``/dev/stdout`` is one: the rename would replace the link, not write through
it). ``-`` means standard output, written as a plain stream.

The target is checked twice: by :func:`check_target` before the (possibly long) work, so a
bad ``-o`` costs nothing, and again right before the rename, so a target swapped for a device
or a link meanwhile is refused rather than clobbered.
"""

from __future__ import annotations

import os
import stat
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import IO, TypeVar

from musku.errors import InputError

T = TypeVar("T")

STDOUT = "-"


def is_stdout(out: Path | str) -> bool:
    """``-`` names standard output."""
    return str(out) == STDOUT


def file_kind(mode: int) -> str:
    """What a file of ``st_mode`` ``mode`` is, for a one-line refusal ("a FIFO")."""
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISLNK(mode):
        return "a symbolic link"
    if stat.S_ISCHR(mode):
        return "a character device"
    if stat.S_ISBLK(mode):
        return "a block device"
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISSOCK(mode):
        return "a socket"
    if stat.S_ISREG(mode):
        return "a regular file"
    return "not a regular file"


def check_target(out: Path, *, stdout_ok: bool = True) -> None:
    """Refuse, before any work, an output that is not a new path or a regular file, or whose
    directory does not exist or is not writable. ``-`` (standard output) passes when
    ``stdout_ok``."""
    if is_stdout(out):
        if stdout_ok:
            return
        raise InputError("cannot write to standard output here: give a file name")
    try:
        st = os.lstat(out)
    except FileNotFoundError:
        st = None
    except (OSError, ValueError) as exc:  # ValueError: a NUL byte in the name
        raise InputError(f"cannot write {out}: {getattr(exc, 'strerror', None) or exc}") from None
    if st is not None and not stat.S_ISREG(st.st_mode):
        hint = " (use - for standard output)" if stat.S_ISLNK(st.st_mode) else ""
        raise InputError(
            f"cannot write {out}: it is {file_kind(st.st_mode)}; musku writes only a new file or "
            f"replaces a regular one{hint}"
        )
    parent = out.parent if str(out.parent) else Path(".")
    if not parent.is_dir():
        raise InputError(f"cannot write {out}: no directory {parent}")
    if not os.access(parent, os.W_OK) or (st is not None and not os.access(out, os.W_OK)):
        raise InputError(f"cannot write {out}: permission denied")


def write_atomic(out: Path, body: Callable[[IO[bytes]], T]) -> T:
    """Run ``body`` on a temporary file next to ``out`` and rename it over ``out``: a reader
    never sees half a file, and nothing is left behind on failure. ``-`` writes ``body`` to
    standard output as it goes. The file gets the mode ``open()`` would give a new file."""
    if is_stdout(out):
        sink = sys.stdout.buffer
        n = body(sink)
        sink.flush()
        return n
    check_target(out)
    parent = out.parent if str(out.parent) else Path(".")
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{out.name}.", dir=parent)
    except OSError as exc:
        raise InputError(f"cannot write {out}: {exc.strerror or exc}") from None
    try:
        mask = os.umask(0)
        os.umask(mask)
        os.fchmod(fd, 0o666 & ~mask)  # as open() would create it, not mkstemp's 0600
        with os.fdopen(fd, "wb") as f:
            n = body(f)
        check_target(out)  # swapped for a device or a link while we worked: refuse
        os.replace(tmp, out)
        return n
    except OSError as exc:
        raise InputError(f"cannot write {out}: {exc.strerror or exc}") from None
    finally:
        if os.path.lexists(tmp):
            os.unlink(tmp)


def write_bytes(out: Path, data: bytes) -> None:
    """:func:`write_atomic` of ``data``."""
    write_atomic(out, lambda f: f.write(data))


def write_text(out: Path, text: str) -> None:
    """:func:`write_atomic` of ``text`` as UTF-8."""
    write_bytes(out, text.encode("utf-8"))


def check_directory(out_dir: Path) -> None:
    """An output directory (``--format png -o DIR``): a directory or a new path, not a link,
    a device or a file; created (with its parents) here."""
    if is_stdout(out_dir):
        raise InputError("-o -: figures go to a directory, not standard output")
    try:
        st = os.lstat(out_dir)
    except FileNotFoundError:
        st = None
    except (OSError, ValueError) as exc:
        raise InputError(
            f"cannot write to {out_dir}: {getattr(exc, 'strerror', None) or exc}"
        ) from None
    if st is not None and not stat.S_ISDIR(st.st_mode):
        raise InputError(
            f"cannot write to {out_dir}: it is {file_kind(st.st_mode)}, not a directory"
        )
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise InputError(f"cannot write to {out_dir}: {exc.strerror or exc}") from None
