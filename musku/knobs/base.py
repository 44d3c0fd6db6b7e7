"""The knob contract every knob plugin implements.

``probe -> read -> validate -> apply(dry_run) -> verify -> rollback``

A knob never spells a kernel path: it reads and writes through the :class:`musku.hostfs.HostFS`
it is given. ``apply`` saves the original bytes of every file it is about to write
(:class:`Snapshot`) before writing, so ``rollback`` restores them byte for byte, in reverse order.
Dry-run returns the planned writes without performing them; ``verify`` reuses the plan.
"""

from __future__ import annotations

import re
import struct
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, ClassVar

from musku.domain import Value
from musku.errors import HostError, InputError, MuskuError, UnsupportedError
from musku.hostfs import MSR_DEV_DIR, HostFSError

# re-exported: defined with the specs, so that musku.knobs builds one without this module
from musku.knob_spec import Support as Support

if TYPE_CHECKING:
    from musku.hostfs import HostFS
    from musku.knob_spec import KnobSpec


@dataclass(frozen=True)
class Write:
    """One planned or performed write: a file (relative to the host root) or an MSR field."""

    # host path as the kernel names it (a musku.hostfs constant such as THP_DIR + "/enabled")
    path: str
    data: bytes  # for files: the bytes written; for MSRs: the 8-byte little-endian new value
    msr: int | None = None  # register number when path is an MSR device
    mask: int | None = None  # bits changed (read-modify-write)
    op: str = "write"  # "write" (one store), "replace" (atomic + backup), "mkdir", "rmdir"

    def describe(self) -> str:
        """One line for logs and dry-run output."""
        if self.msr is not None:
            value = int.from_bytes(self.data, "little")
            return f"msr {self.path} {self.msr:#x} &{self.mask or 0:#x} = {value:#x}"
        if self.op in ("mkdir", "rmdir"):
            return f"{self.op} {self.path}"
        text = self.data.decode(errors="replace").strip()
        if self.op == "replace":
            return f"replace {self.path} ({len(self.data)} bytes)"
        return f"write {self.path} <- {text!r}"


@dataclass(frozen=True)
class Snapshot:
    """Original state saved before a write, enough to restore it byte for byte."""

    knob: str
    files: tuple[tuple[str, bytes], ...] = ()  # (path, original bytes)
    # (device path, register, mask, original value)
    msrs: tuple[tuple[str, int, int, int], ...] = ()
    # e.g. created resctrl group, bootloader backup
    extra: dict[str, object] = field(default_factory=dict)

    def to_json(self) -> dict[str, object]:
        return {
            "knob": self.knob,
            "files": [[p, b.hex()] for p, b in self.files],
            "msrs": [list(m) for m in self.msrs],
            "extra": self.extra,
        }

    @classmethod
    def from_json(cls, d: dict[str, object]) -> Snapshot:
        files = tuple((str(p), bytes.fromhex(str(h))) for p, h in d.get("files", []))  # type: ignore[attr-defined]
        msrs = tuple(
            (str(m[0]), int(m[1]), int(m[2]), int(m[3]))
            for m in d.get("msrs", [])  # type: ignore[attr-defined]
        )
        extra = d.get("extra", {})
        return cls(str(d["knob"]), files, msrs, dict(extra) if isinstance(extra, dict) else {})


class KnobError(HostError):
    """A knob operation failed on the host (write refused, verify failed)."""


class InvalidSetting(InputError):
    """The value is outside what this host can take (nothing was written)."""


class Drift(KnobError):
    """Verification found a state other than the one applied (outside change)."""


class Shortfall(KnobError):
    """The kernel granted less than asked (e.g. fewer huge pages); the host is at ``granted``."""

    def __init__(self, message: str, *, requested: Value, granted: Value) -> None:
        self.requested = requested
        self.granted = granted
        super().__init__(message)


class Knob(ABC):
    """One knob on one host. Subclasses set ``spec`` to their :class:`~musku.knob_spec.KnobSpec`
    (declared in the knob's module) and ``name`` to ``spec.name``."""

    name: ClassVar[str]
    spec: ClassVar[KnobSpec]

    def __init__(self, fs: HostFS, **options: object) -> None:
        self.fs = fs
        self.options = options

    @abstractmethod
    def probe(self) -> Support:
        """Can this host change this knob, and how? Never raises for 'unsupported'."""

    @abstractmethod
    def read(self) -> Value:
        """The current setting, in the canonical form of musku.domain."""

    @abstractmethod
    def validate(self, value: Value) -> Value:
        """Canonical value if this host can take it; raise :class:`InvalidSetting` otherwise."""

    @abstractmethod
    def plan(self, value: Value) -> list[Write]:
        """The writes that would bring the host to ``value`` (empty when already there)."""

    @abstractmethod
    def snapshot(self) -> Snapshot:
        """Save what ``apply`` may change (called before the first write)."""

    def apply(self, value: Value, *, dry_run: bool = False) -> list[Write]:
        """Validate, then perform (or with ``dry_run`` only return) the planned writes."""
        support = self.probe()
        if not support.supported:
            raise UnsupportedError(f"{self.name}: {support.reason}")
        value = self.validate(value)
        writes = self.plan(value)
        if not dry_run:
            self._perform(writes)
        return writes

    @abstractmethod
    def _perform(self, writes: list[Write]) -> None:
        """Carry out planned writes (read-modify-write for MSRs)."""

    def verify(self, value: Value) -> bool:
        """True when the host is at ``value`` (re-plans and finds nothing to write)."""
        return not self.plan(self.validate(value))

    def check(self, value: Value) -> None:
        """Raise :class:`Drift` when the host is not at ``value`` (an outside change)."""
        if not self.verify(value):
            raise Drift(f"{self.name}: expected {value!r}, the host is at {self.read()!r}")

    def pending_reboot(self) -> bool:
        """True when an applied change only takes effect at the next boot (reboot-mode knobs)."""
        return False

    @abstractmethod
    def rollback(self, snapshot: Snapshot) -> None:
        """Restore the saved state byte for byte, in reverse order of the writes."""


_MSR_PATH = re.compile(r"^" + re.escape(MSR_DEV_DIR) + r"/(\d+)/msr$")


def msr_cpu(path: str) -> int:
    """The CPU number of an MSR device path (``/dev/cpu/3/msr`` -> 3)."""
    m = _MSR_PATH.match(path)
    if not m:
        raise KnobError(f"not an MSR device path: {path}")
    return int(m.group(1))


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
