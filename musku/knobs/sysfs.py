"""A generic sysctl/sysfs knob that one catalog line configures, as TuneD makes swappiness one
profile line::

    [knobs.swappiness]
    kind = "sysfs"
    path = "/proc/sys/vm/swappiness"
    settings = [10, 60]
    reboot = false          # optional; true: the sweep switches it with a reboot

The knob is one attribute under ``/proc/sys`` or ``/sys``: it reads the attribute (a number,
a word, or the kernel's ``a [b] c`` choice format, whose active word is the value), writes
one value, verifies by reading it back, and rolls back to the saved original (the generic
:class:`~musku.knobs.base.KnobBase` machinery). Its value kind follows the catalog's
settings: all integers (a ``COUNT``-like number, ordered, any sign) or all words (a
``CHOICE``). The kernel decides what it accepts; a refused store is a
:class:`~musku.knobs.base.KnobError` with nothing left changed.

Registered under the catalog's name with the target ``sysfs:{"name": ..., "path": ...,
"type": "int"|"str"}`` (see :data:`musku.knob_spec.CONFIGURED`), which any process can turn
back into the knob: the results database's ``knobs`` table stores it.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from pathlib import PurePosixPath
from typing import ClassVar

from musku.domain import Value
from musku.errors import InputError
from musku.hostfs import PROC_SYS, SYSFS
from musku.knob_spec import (
    BUILTIN,
    Kind,
    KnobSpec,
    LineError,
    is_knob,
    register_knob,
    target_of,
)
from musku.knobs.base import InvalidSetting, KnobBase, KnobError, Snapshot, Support, Write
from musku.knobs.helpers import bracketed

ROOTS = (PROC_SYS + "/", SYSFS + "/")
"""A sysfs knob's attribute lives under one of these."""
MAX_PATH = 255
"""Longest attribute path a catalog may give."""
MAX_WORD = 64
"""Longest word setting."""
SORT_ORDER = 500
"""Sweep order of every sysfs knob (after the built-ins, ties by name)."""

_PATH_CHARS = re.compile(r"[A-Za-z0-9_.:/+-]+")
_WORD = re.compile(r"[A-Za-z0-9_.:+-]+")


def check_path(path: object) -> str:
    """``path`` if it may name a sysfs knob's attribute; ValueError saying why not."""
    if not isinstance(path, str):
        raise ValueError(f"path must be a string, not {path!r}")
    if len(path) > MAX_PATH:
        raise ValueError(f"path is {len(path)} characters long (the limit is {MAX_PATH})")
    if not path.startswith(ROOTS):
        raise ValueError(f"path {path!r} must be under /proc/sys or /sys")
    if not _PATH_CHARS.fullmatch(path):
        raise ValueError(f"path {path!r} may hold only letters, digits and _ . : / + -")
    parts = path.split("/")[1:]
    if str(PurePosixPath(path)) != path or any(p in ("", ".", "..") for p in parts):
        raise ValueError(f"path {path!r} must be a plain absolute path (no '//', '.', '..')")
    if path.rstrip("/") + "/" in ROOTS:
        raise ValueError(f"path {path!r} names a directory, not an attribute")
    return path


def value_type(settings: Sequence[object]) -> str:
    """``"int"`` or ``"str"``: the one type of a sysfs knob's settings; ValueError otherwise."""
    if not settings:
        raise ValueError("settings must be a non-empty list")
    if all(isinstance(v, int) and not isinstance(v, bool) for v in settings):
        return "int"
    if all(isinstance(v, str) for v in settings):
        for v in settings:
            assert isinstance(v, str)
            if not _WORD.fullmatch(v) or len(v) > MAX_WORD:
                raise ValueError(
                    f"setting {v!r} must be one word of letters, digits and _ . : + - "
                    f"(at most {MAX_WORD} characters)"
                )
        return "str"
    raise ValueError(
        "settings must be all integers or all words (a sysfs knob writes one of them), "
        f"not {list(settings)!r}"
    )


class SysfsKnob(KnobBase):
    """One attribute under /proc/sys or /sys; subclasses made by :func:`knob_class` set
    ``spec``, ``name``, ``path`` and ``value_type``."""

    path: ClassVar[str]
    value_type: ClassVar[str]  # "int" or "str"

    def probe(self) -> Support:
        if not self.fs.exists(self.path):
            return Support(False, f"no {self.path} on this host")
        if self.fs.is_dir(self.path):
            return Support(False, f"{self.path} is a directory, not an attribute")
        try:
            current = self.read()
        except KnobError as exc:
            return Support(False, exc.message)
        return Support(True, backend="sysfs", details={"path": self.path, "value": current})

    def read(self) -> Value:
        text = self.fs.read_text(self.path).strip()
        if "[" in text:
            text, _ = bracketed(text)
        if self.value_type == "int":
            try:
                return int(text)
            except ValueError:
                raise KnobError(f"{self.name}: {self.path} holds {text!r}, not a number") from None
        if not text or any(c.isspace() for c in text):
            raise KnobError(f"{self.name}: {self.path} holds {text!r}, not one word")
        return text

    def validate(self, value: Value) -> Value:
        try:
            value_type([value])
            return self.spec.canonical(value)
        except (TypeError, ValueError) as exc:
            raise InvalidSetting(f"{self.name}: {exc}") from None

    def plan(self, value: Value) -> list[Write]:
        if self.read() == value:
            return []
        return [Write(self.path, f"{value}\n".encode())]

    def snapshot(self) -> Snapshot:
        return Snapshot(self.name, ((self.path, self.fs.read_bytes(self.path)),))

    def restore_data(self, path: str, original: bytes) -> bytes:
        """A choice attribute reads back ``a [b] c``; storing ``b`` brings it back."""
        text = original.decode(errors="replace")
        if "[" in text:
            active, _ = bracketed(text)
            if not active:
                raise KnobError(f"{self.name}: saved {path} has no [active] word: cannot restore")
            return active.encode()
        return original


def target(name: str, path: str, vtype: str) -> str:
    """The registry target of a sysfs knob (``sysfs:{json}``)."""
    return "sysfs:" + json.dumps(
        {"name": name, "path": path, "type": vtype}, sort_keys=True, separators=(",", ":")
    )


def define(definition: str) -> type[SysfsKnob]:
    """The knob class a ``sysfs:`` target's JSON defines; :class:`InputError` if it is not a
    valid definition (the registry calls this, see :data:`musku.knob_spec.CONFIGURED`)."""
    try:
        d = json.loads(definition)
    except ValueError:
        raise InputError(f"sysfs knob {definition!r}: not a JSON definition") from None
    if not isinstance(d, dict) or set(d) != {"name", "path", "type"}:
        raise InputError(f"sysfs knob {definition!r}: needs exactly name, path and type")
    name, path, vtype = d["name"], d["path"], d["type"]
    if not isinstance(name, str) or vtype not in ("int", "str"):
        raise InputError(f"sysfs knob {definition!r}: type must be 'int' or 'str'")
    try:
        check_path(path)
    except ValueError as exc:
        raise InputError(f"sysfs knob {name!r}: {exc}") from None
    if vtype == "int":
        spec = KnobSpec(
            name=name,
            kind=Kind.COUNT,
            order=SORT_ORDER,
            description=f"sysfs {path}",
            low=-(1 << 63),
            high=(1 << 63) - 1,
        )
    else:
        spec = KnobSpec(name=name, kind=Kind.CHOICE, order=SORT_ORDER, description=f"sysfs {path}")
    attrs = {"name": name, "spec": spec, "path": path, "value_type": vtype, "__module__": __name__}
    return type(f"SysfsKnob_{name}", (SysfsKnob,), attrs)


def check(fields: Mapping[str, object]) -> str:
    """The value type (``"int"``/``"str"``) of the sysfs knob a catalog line's ``path`` and
    ``settings`` define; :class:`LineError` naming the key at fault otherwise."""
    path, settings = fields.get("path"), fields.get("settings")
    if path is None:
        raise LineError("kind", "kind = \"sysfs\" needs 'path'")
    try:
        check_path(path)
    except ValueError as exc:
        raise LineError("path", str(exc)) from None
    if not isinstance(settings, list | tuple):
        where = "kind" if settings is None else "settings"
        raise LineError(where, "kind = \"sysfs\" needs a non-empty 'settings' list")
    try:
        return value_type(settings)
    except ValueError as exc:
        raise LineError("settings", str(exc)) from None


def configure(name: str, fields: Mapping[str, object]) -> str:
    """Register the sysfs knob ``name`` a catalog line defines; returns its registered name.

    Raises :class:`LineError` for a bad line (the path, mixed settings) and
    :class:`InputError` when ``name`` is already another knob (a built-in, or a sysfs knob on
    another path)."""
    vtype = check(fields)
    path = str(fields["path"])
    wanted = target(name, path, vtype)
    if is_knob(name) and target_of(name) != wanted:
        known = target_of(name)
        what = "built in" if name in BUILTIN else f"already {known}"
        raise InputError(f"knob {name!r} is {what}; give this sysfs knob another name")
    return register_knob(wanted).name


__all__ = [
    "ROOTS",
    "SysfsKnob",
    "check",
    "check_path",
    "configure",
    "define",
    "target",
    "value_type",
]
