"""Shared machinery of the built-in knobs: performing writes, generic rollback, option parsing."""

from __future__ import annotations

import re
import struct
from collections.abc import Mapping, Sequence

from musku.domain import Value
from musku.errors import InputError, MuskuError, UnsupportedError
from musku.hostfs import MSR_DEV_DIR, HostFS, HostFSError
from musku.knobs.base import InvalidSetting, Knob, KnobError, Snapshot, Write

_MSR_PATH = re.compile(r"^" + re.escape(MSR_DEV_DIR) + r"/(\d+)/msr$")


def msr_cpu(path: str) -> int:
    m = _MSR_PATH.match(path)
    if not m:
        raise KnobError(f"not an MSR device path: {path}")
    return int(m.group(1))


def msr_write(path: str, reg: int, value: int, mask: int) -> Write:
    return Write(path=path, data=struct.pack("<Q", value), msr=reg, mask=mask)


def bracketed(text: str) -> tuple[str, list[str]]:
    """Parse the kernel's ``a [b] c`` choice format -> (active, choices)."""
    words = text.split()
    active = ""
    choices = []
    for w in words:
        if w.startswith("[") and w.endswith("]"):
            w = w[1:-1]
            active = w
        choices.append(w)
    return active, choices


def opt_str(options: dict[str, object], key: str, default: str) -> str:
    v = options.get(key, default)
    if not isinstance(v, str):
        raise InputError(f"knob option {key!r} must be a string, not {v!r}")
    return v


def opt_bool(options: dict[str, object], key: str, default: bool) -> bool:
    v = options.get(key, default)
    if not isinstance(v, bool):
        raise InputError(f"knob option {key!r} must be true or false, not {v!r}")
    return v


def opt_argv(options: dict[str, object], key: str, default: Sequence[str]) -> list[str]:
    """An argv list option (never a shell string)."""
    v = options.get(key, list(default))
    if isinstance(v, str) or not isinstance(v, list | tuple):
        raise InputError(
            f"knob option {key!r} must be an argv list such as ['systemctl', 'reboot']"
        )
    if not all(isinstance(a, str) and a for a in v):
        raise InputError(f"knob option {key!r}: every argument must be a non-empty string")
    return [str(a) for a in v]


def choose(value: Value, allowed: Sequence[str], knob: str) -> str:
    if not isinstance(value, str) or value not in allowed:
        raise InvalidSetting(f"{knob}: {value!r} is not one of {', '.join(allowed)} on this host")
    return value


class KnobBase(Knob):
    """Knob with the common ``_perform`` and ``rollback``.

    Subclasses list the files/MSRs they may change in ``snapshot`` and may override
    :meth:`restore_data` (what to store to bring a file back to its original bytes, e.g. the
    active word of a ``[bracketed]`` attribute) and :meth:`rollback_extra`.
    """

    def apply(self, value: Value, *, dry_run: bool = False) -> list[Write]:
        """As :meth:`Knob.apply`, and all-or-nothing: the state is saved before the first
        write and, if a write fails part-way, the writes already made are undone before the
        error is raised (the caller's own snapshot stays valid either way)."""
        support = self.probe()
        if not support.supported:
            raise UnsupportedError(f"{self.name}: {support.reason}")
        value = self.validate(value)
        writes = self.plan(value)
        if dry_run or not writes:
            return writes
        guard = self.snapshot()
        try:
            self._perform(writes)
        except KnobError as exc:
            try:
                self.rollback(guard)
            except MuskuError as undo:
                raise KnobError(
                    f"{exc.message}; undoing the partial change ALSO failed: {undo.one_line()}"
                ) from None
            raise KnobError(f"{exc.message} (partial change undone)") from None
        return writes

    def _perform(self, writes: list[Write]) -> None:
        for w in writes:
            try:
                if w.msr is not None:
                    value = struct.unpack("<Q", w.data)[0]
                    self.fs.write_msr(msr_cpu(w.path), w.msr, value, w.mask or 0)
                elif w.op == "write":
                    self.fs.write_bytes(w.path, w.data)
                elif w.op == "replace":
                    self.fs.atomic_replace(w.path, w.data, backup=True)
                elif w.op == "mkdir":
                    self.fs.mkdir(w.path)
                elif w.op == "rmdir":
                    self.fs.rmdir(w.path)
                else:
                    raise KnobError(f"{self.name}: unknown write operation {w.op!r}")
            except HostFSError as exc:
                raise self.refused(w, exc) from None

    def refused(self, w: Write, exc: HostFSError) -> KnobError:
        """The error to raise when the kernel refuses a write (subclasses add context)."""
        return KnobError(f"{self.name}: {exc.message}")

    def restore_data(self, path: str, original: bytes) -> bytes:
        return original

    def rollback(self, snapshot: Snapshot) -> None:
        if snapshot.knob != self.name:
            raise InputError(f"snapshot is of knob {snapshot.knob!r}, not {self.name!r}")
        self.rollback_extra_before(snapshot)
        for path, original in reversed(snapshot.files):
            if not self.fs.exists(path):
                continue
            if self.fs.read_bytes(path) == original:
                continue
            data = self.restore_data(path, original)
            try:
                if self.restore_is_replace(path):
                    self.fs.atomic_replace(path, data, backup=False)
                else:
                    self.fs.write_bytes(path, data)
            except HostFSError as exc:
                raise KnobError(f"{self.name}: rollback of {path} failed: {exc.message}") from None
        for dev, reg, mask, original_value in reversed(snapshot.msrs):
            self.fs.write_msr(msr_cpu(dev), reg, original_value & mask, mask)
        self.rollback_extra_after(snapshot)

    def restore_is_replace(self, path: str) -> bool:
        return False

    def rollback_extra_before(self, snapshot: Snapshot) -> None:
        """Knob-specific undo run before files are restored."""

    def rollback_extra_after(self, snapshot: Snapshot) -> None:
        """Knob-specific undo run after files and MSRs are restored."""


def ordered_min_max(
    min_path: str, max_path: str, cur_min: int, cur_max: int, new_min: int, new_max: int
) -> list[Write]:
    """Writes taking a (min, max) attribute pair to new values without ever storing
    min > max (the kernel refuses that): lower the floor first when the new ceiling is below
    the current floor, else raise/lower the ceiling first."""
    writes: list[Write] = []
    pair_min = [Write(min_path, str(new_min).encode())] if new_min != cur_min else []
    pair_max = [Write(max_path, str(new_max).encode())] if new_max != cur_max else []
    writes = pair_min + pair_max if new_max < cur_min else pair_max + pair_min
    return writes


def restore_min_max(
    fs: HostFS, saved: Mapping[str, str | bytes], min_path: str, max_path: str
) -> list[Write]:
    """:func:`ordered_min_max` back to a snapshot's values (none when the snapshot lacks the
    pair)."""
    if min_path not in saved or max_path not in saved:
        return []
    return ordered_min_max(
        min_path,
        max_path,
        fs.read_int(min_path),
        fs.read_int(max_path),
        int(saved[min_path].strip()),
        int(saved[max_path].strip()),
    )


def ghz_to_khz(value: float) -> int:
    return int(round(value * 1_000_000))


def khz_to_ghz(khz: int) -> float:
    return round(khz / 1_000_000, 3)


def as_ghz(value: Value, knob: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InvalidSetting(f"{knob}: takes a frequency in GHz, not {value!r}")
    if not 0 < value < 100:
        raise InvalidSetting(f"{knob}: {value!r} GHz is not a plausible frequency")
    return float(value)
