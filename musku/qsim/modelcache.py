"""Normalised qsim documents cached by what they were built from.

Validating a model (pydantic: its import and the schema build) costs about 0.3 CPU-s, ten times
what a small simulation does, and a curve, a script or a sweep runs the same model again and
again. The engine document that :func:`musku.qsim.model.load` builds is therefore kept in
``$MUSKU_CACHE_DIR/qsim`` (default ``$XDG_CACHE_HOME/musku/qsim``, else ``~/.cache/musku/qsim``)
in a file named by a checksum of the model's real path, with everything it depends on, all of
which must match for the entry to be used:

- the model file's real path and exact text (compared, not hashed: no hashlib on a hit);
- each histogram file it names (``file = ...``): real path and SHA-256, checked on every hit;
- the code that builds it: name, size and modification time of every module of
  ``musku.qsim``, ``musku.schema`` and ``musku.inputfiles`` (an upgrade or an edit misses).

A hit returns the same document the full load would; anything unusual (no cache folder, an
unreadable or corrupt entry, a histogram that changed) falls back to the full load, which
reports bad input exactly as before. ``MUSKU_QSIM_CACHE=0`` turns the cache off. At most
:data:`MAX_ENTRIES` documents are kept (the oldest go first); each is written to a temporary
file and renamed, so concurrent runs never read half an entry.
"""

from __future__ import annotations

import contextlib
import json
import os
import zlib
from pathlib import Path

import musku
from musku.errors import InputError
from musku.inputfiles import parse_toml, read_text

TYPE_CHECKING = False  # not typing's: the qsim quick path never imports typing
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

MAX_ENTRIES = 256
"""Most cached documents; writing one more removes the least recently written."""

FORMAT = 2
"""The entries' layout (an entry of another format is a miss)."""


def cache_dir() -> Path | None:
    """Where the documents go, or None when the cache is off."""
    if os.environ.get("MUSKU_QSIM_CACHE", "").strip() == "0":
        return None
    base = os.environ.get("MUSKU_CACHE_DIR") or ""
    if base:
        return Path(base) / "qsim"
    xdg = os.environ.get("XDG_CACHE_HOME") or ""
    root = Path(xdg) if xdg else Path.home() / ".cache"
    return root / "musku" / "qsim"


def _code_stamp() -> str:
    """Name, size and mtime of every module the document depends on."""
    pkg = Path(musku.__file__).parent
    parts: list[str] = []
    for folder in (pkg / "qsim", pkg / "schema"):
        with contextlib.suppress(OSError):
            for entry in sorted(os.scandir(folder), key=lambda e: e.name):
                if entry.name.endswith(".py"):
                    st = entry.stat()
                    parts.append(f"{folder.name}/{entry.name}:{st.st_size}:{st.st_mtime_ns}")
    st = (pkg / "inputfiles.py").stat()
    parts.append(f"inputfiles.py:{st.st_size}:{st.st_mtime_ns}")
    return "\n".join(parts)


def _sha(data: bytes) -> str:
    import hashlib  # lazy: ~0.01 CPU-s (OpenSSL), paid only by models with histogram files

    return hashlib.sha256(data).hexdigest()


def _name(real: str) -> str:
    """The entry's file name: a checksum of the model's real path (two paths with the same one
    share a file and only cost each other a load: an entry is used only when everything it
    records is what this run has)."""
    return f"{zlib.crc32(real.encode()):08x}-{len(real)}"


def _file_names(node: Any) -> list[str]:
    """Every string under a ``file`` key of the parsed model (its histogram files)."""
    out: list[str] = []
    if isinstance(node, dict):
        for k, v in node.items():
            if k == "file" and isinstance(v, str):
                out.append(v)
            else:
                out.extend(_file_names(v))
    elif isinstance(node, list):
        for v in node:
            out.extend(_file_names(v))
    return out


def _deps(
    path: Path, text: str, histogram_path: Callable[[Path, str], Path]
) -> list[list[str]] | None:
    """(real path, SHA-256) of each histogram file the model names; None if one cannot be read
    (the full load then reports it, and nothing is cached)."""
    try:
        names = _file_names(parse_toml(text, str(path)))
        out = []
        for name in names:
            real = histogram_path(path, name)
            out.append([str(real), _sha(real.read_bytes())])
        return out
    except Exception:  # any doubt: do not cache (the full load has already said what is wrong)
        return None


def _hit(entry: dict[str, Any], key: dict[str, Any]) -> dict[str, Any] | None:
    """The entry's document when it records exactly ``key`` (format, model, code stamp, text)
    and its histogram files are unchanged; else None."""
    if any(entry.get(k) != v for k, v in key.items()):
        return None
    for real, digest in entry.get("deps", []):
        try:
            if _sha(Path(real).read_bytes()) != digest:
                return None
        except OSError:
            return None
    doc = entry.get("engine")
    return doc if isinstance(doc, dict) else None


def _store(folder: Path, key: str, entry: dict[str, Any]) -> None:
    try:
        folder.mkdir(parents=True, exist_ok=True, mode=0o700)
        # a name of this run's own (O_EXCL: never another's file), renamed into place
        tmp = folder / f".tmp-{os.getpid()}-{os.urandom(6).hex()}.json"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            with os.fdopen(fd, "w") as f:
                json.dump(entry, f, separators=(",", ":"))
            os.replace(tmp, folder / f"{key}.json")
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
        entries = sorted(folder.glob("*.json"), key=lambda p: p.stat().st_mtime_ns)
        for old in entries[:-MAX_ENTRIES]:
            with contextlib.suppress(OSError):
                old.unlink()
    except OSError:
        pass  # a read-only or full cache folder only costs the next run its load


def engine_document(path: Path | str) -> dict[str, Any]:
    """The normalised engine document of the model file ``path``, from the cache when what
    it was built from is unchanged, else by :func:`musku.qsim.model.load` (and cached).
    Bad input raises the same InputError the full load raises."""
    path = Path(path)
    folder = cache_dir()
    text: str | None = None
    if folder is not None:
        try:
            text = read_text(path)  # the full load's size and type checks (its wording below)
        except InputError:
            folder = None  # the full load raises the error as it words it
    real = os.path.realpath(path)
    key = {"format": FORMAT, "model": real, "stamp": "", "text": text}
    name = _name(real)
    if folder is not None and text is not None:
        key["stamp"] = _code_stamp()
        try:
            entry = json.loads((folder / f"{name}.json").read_text())
            doc = _hit(entry, key) if isinstance(entry, dict) else None
        except (OSError, ValueError):
            doc = None
        if doc is not None:
            return doc
    # lazy: pydantic (the model, ~0.3 CPU-s) only on a miss: a cache hit loads neither pydantic
    # nor typer (tests/qsim/test_quick.py)
    from musku.qsim.model import histogram_path, load

    engine = load(path).engine
    if folder is not None and text is not None:
        deps = _deps(path, text, histogram_path)
        if deps is not None:
            _store(folder, name, {**key, "deps": deps, "engine": engine})
    return engine
