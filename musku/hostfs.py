"""The one root-relative host filesystem object.

Every read and write of a kernel interface (``/sys``, ``/proc``, ``/dev/cpu/N/msr``, the resctrl
mount, cgroups, the bootloader configuration ``/etc/default/grub``) goes through a
:class:`HostFS` built with a root and passed in (``HostFS(root="/")`` on a real host, a tmp tree in
tests). No other module spells a kernel path: the constants below are the only place they live.

Writes are deliberately plain (``open(O_WRONLY|O_TRUNC)``, one ``write``) so that a sysfs/procfs
attribute sees exactly one store; the kernel's refusal surfaces as :class:`HostFSError` carrying the
errno. Model-specific registers are read and written with ``os.pread``/``os.pwrite`` of 8 bytes at
offset = register on ``/dev/cpu/N/msr``, only for the registers and bits of an allow-list, always
read-modify-write of the intended bits. Regular files (the bootloader configuration) are replaced
atomically (temp file + fsync + rename) after a backup copy is written.

Every path is resolved with its symbolic links confined to the root (:meth:`HostFS.resolve`,
like ``openat2(RESOLVE_IN_ROOT)``: an absolute link target starts at the root, ``..`` stops
there), and the final open uses ``O_NOFOLLOW``: a link in a fake or chroot root never leads out
of it. Reads are capped at :data:`MAX_READ_BYTES`.

Test fakes subclass :class:`HostFS` and override the primitives (:meth:`HostFS.write_bytes`,
:meth:`HostFS.mkdir`, :meth:`HostFS.rmdir`) to enforce the kernel's rules at this interface.
"""

from __future__ import annotations

import errno
import os
import stat
import struct
import tempfile
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from musku.errors import HostError, InputError, UnsupportedError
from musku.knobs.spec import knob_names, spec_of

# --- kernel paths: the only place they are spelled -------------------------------------------

SYS_CPU = "/sys/devices/system/cpu"
CPUFREQ = SYS_CPU + "/cpufreq"
INTEL_PSTATE = SYS_CPU + "/intel_pstate"
INTEL_UNCORE = SYS_CPU + "/intel_uncore_frequency"
THP_DIR = "/sys/kernel/mm/transparent_hugepage"
HUGEPAGES_DIR = "/sys/kernel/mm/hugepages"
PROC_NR_HUGEPAGES = "/proc/sys/vm/nr_hugepages"
RESCTRL = "/sys/fs/resctrl"
CGROUP_ROOT = "/sys/fs/cgroup"
CGROUP_V1_CPUSET = CGROUP_ROOT + "/cpuset"
MSR_DEV_DIR = "/dev/cpu"
MSR_ALLOW_WRITES = "/sys/module/msr/parameters/allow_writes"
POWERCAP = "/sys/class/powercap"  # RAPL energy counters (intel-rapl:N/energy_uj)
PROC_CMDLINE = "/proc/cmdline"
PROC_CPUINFO = "/proc/cpuinfo"
PROC_MEMINFO = "/proc/meminfo"
PROC_MOUNTS = "/proc/mounts"
GRUB_DEFAULT = "/etc/default/grub"
GRUB_DEFAULT_D = "/etc/default/grub.d"  # *.cfg snippets sourced after GRUB_DEFAULT

BACKUP_SUFFIX = ".musku.bak"

MAX_SYMLINKS = 40
"""Most symbolic links followed resolving one host path (the kernel's own limit)."""

MAX_READ_BYTES = 64 << 20
"""Largest host file HostFS reads (kernel attributes are a page; /proc/cpuinfo well under 1 MiB)."""


def cpu_dir(cpu: int) -> str:
    return f"{SYS_CPU}/cpu{cpu}"


def msr_path(cpu: int) -> str:
    return f"{MSR_DEV_DIR}/{cpu}/msr"


# --- errors ----------------------------------------------------------------------------------


class HostFSError(HostError):
    """A read or write of a host path failed (the kernel refused it, or it is missing)."""

    def __init__(self, message: str, *, path: str = "", err: int = 0) -> None:
        self.path = path
        self.errno = err
        super().__init__(message)


class MsrNotAllowed(InputError):
    """A register, or bits of it, outside musku's MSR allow-list: refused, nothing written."""


class MsrUnavailable(UnsupportedError):
    """No usable ``/dev/cpu/N/msr`` (msr module not loaded, no such CPU, writes disabled)."""


# --- the MSR allow-list ----------------------------------------------------------------------


@dataclass(frozen=True)
class MsrRule:
    """What musku may do with one register: read it, and write only ``write_mask`` bits."""

    name: str
    write_mask: int = 0  # 0 = read-only


def default_msr_allow() -> dict[int, MsrRule]:
    """The MSR allow-list: every register a registered knob declares in its spec
    (:attr:`musku.knobs.spec.KnobSpec.msrs`; the registers and masks live with the knobs)."""
    out: dict[int, MsrRule] = {}
    for name in knob_names():
        for msr in spec_of(name).msrs:
            known = out.get(msr.register)
            mask = msr.write_mask | (known.write_mask if known else 0)
            out[msr.register] = MsrRule(known.name if known else msr.name, mask)
    return out


# --- cpu lists -------------------------------------------------------------------------------


def parse_cpulist(text: str) -> list[int]:
    """``"0-3,8,10-11"`` -> ``[0, 1, 2, 3, 8, 10, 11]`` (the kernel's cpulist format)."""
    cpus: set[int] = set()
    text = text.strip()
    if not text:
        return []
    for part in text.split(","):
        part = part.strip()
        lo, sep, hi = part.partition("-")
        if not lo.isdigit() or (sep and not hi.isdigit()):
            raise ValueError(f"not a cpu list: {text!r}")
        a, b = int(lo), int(hi) if sep else int(lo)
        if b < a:
            raise ValueError(f"not a cpu list: {text!r}")
        cpus.update(range(a, b + 1))
    return sorted(cpus)


def format_cpulist(cpus: Iterable[int]) -> str:
    """``[0, 1, 2, 3, 8]`` -> ``"0-3,8"``."""
    out: list[str] = []
    items = sorted(set(cpus))
    i = 0
    while i < len(items):
        j = i
        while j + 1 < len(items) and items[j + 1] == items[j] + 1:
            j += 1
        out.append(str(items[i]) if i == j else f"{items[i]}-{items[j]}")
        i = j + 1
    return ",".join(out)


# --- HostFS ----------------------------------------------------------------------------------

_NOFOLLOW = os.O_NOFOLLOW | os.O_CLOEXEC


class HostFS:
    """Root-relative access to a host's kernel interfaces."""

    def __init__(
        self,
        root: str | os.PathLike[str] = "/",
        *,
        msr_allow: Mapping[int, MsrRule] | None = None,  # default: the knobs' registers
        read_only: bool = False,
    ) -> None:
        self.root = Path(root).resolve()
        self.msr_allow = dict(default_msr_allow() if msr_allow is None else msr_allow)
        self.read_only = read_only  # probes and reports: every write is refused

    def _writable(self, path: str) -> None:
        if self.read_only:
            raise HostFSError(f"refusing to change {path}: this HostFS is read-only", path=path)

    def __repr__(self) -> str:
        return f"HostFS(root={str(self.root)!r})"

    # paths

    def host(self, path: str) -> Path:
        """The real path of a host path (absolute, as the kernel names it) under the root."""
        p = PurePosixPath(path)
        if not p.is_absolute():
            raise InputError(f"host path must be absolute: {path!r}")
        if ".." in p.parts:
            raise InputError(f"host path must not contain '..': {path!r}")
        return self.root.joinpath(*p.parts[1:])

    def resolve(self, path: str, *, follow: bool = True) -> Path:
        """The real path of a host path with every symbolic link resolved *inside the root*,
        as the kernel's ``openat2(RESOLVE_IN_ROOT)`` does: an absolute link target starts
        again at the root, and ``..`` never climbs above it. So a link under a fake or
        chroot root can never lead out of it (on the real host, root ``/``, this is the
        ordinary resolution). With ``follow=False`` the last component is not followed
        (for lstat-like questions, mkdir, rmdir). What is returned holds no symbolic link
        (but its last component with ``follow=False``); the final open also uses
        ``O_NOFOLLOW``, so a link swapped in meanwhile is refused, not followed."""
        self.host(path)  # absolute, no '..'
        todo = [part for part in reversed(PurePosixPath(path).parts[1:])]
        done: list[str] = []
        links = 0
        missing = False
        while todo:
            name = todo.pop()
            if name in ("", "."):
                continue
            if name == "..":
                if done:
                    done.pop()
                continue
            if missing or (not todo and not follow):
                done.append(name)
                continue
            real = self.root.joinpath(*done, name)
            try:
                st = os.lstat(real)
            except OSError:
                missing = True  # the rest is taken as written: opening it will fail
                done.append(name)
                continue
            if not stat.S_ISLNK(st.st_mode):
                done.append(name)
                continue
            links += 1
            if links > MAX_SYMLINKS:
                raise HostFSError(
                    f"cannot resolve {path}: more than {MAX_SYMLINKS} symbolic links",
                    path=path,
                    err=errno.ELOOP,
                )
            try:
                target = os.readlink(real)
            except OSError as exc:
                raise self._error("resolve", path, exc) from None
            if target.startswith("/"):
                done = []  # an absolute target starts again at the host root
            todo.extend(reversed(PurePosixPath(target).parts[1 if target.startswith("/") else 0 :]))
        return self.root.joinpath(*done)

    def exists(self, path: str) -> bool:
        return self.resolve(path).exists()

    def is_dir(self, path: str) -> bool:
        return self.resolve(path).is_dir()

    def is_file(self, path: str) -> bool:
        return self.resolve(path).is_file()

    def is_symlink(self, path: str) -> bool:
        return self.resolve(path, follow=False).is_symlink()

    def listdir(self, path: str) -> list[str]:
        try:
            fd = os.open(self.resolve(path), os.O_RDONLY | os.O_DIRECTORY | _NOFOLLOW)
            try:
                return sorted(os.listdir(fd))
            finally:
                os.close(fd)
        except OSError as exc:
            raise self._error("list", path, exc) from None

    # reads

    def read_bytes(self, path: str) -> bytes:
        try:
            fd = os.open(self.resolve(path), os.O_RDONLY | _NOFOLLOW)
            with os.fdopen(fd, "rb") as f:
                data = f.read(MAX_READ_BYTES + 1)
        except OSError as exc:
            raise self._error("read", path, exc) from None
        if len(data) > MAX_READ_BYTES:
            raise HostFSError(f"{path}: larger than {MAX_READ_BYTES >> 20} MiB", path=path)
        return data

    def read_text(self, path: str) -> str:
        return self.read_bytes(path).decode("utf-8", errors="replace")

    def read_value(self, path: str) -> str:
        """A one-value attribute, whitespace stripped."""
        return self.read_text(path).strip()

    def read_int(self, path: str) -> int:
        text = self.read_value(path)
        try:
            return int(text, 0) if text.startswith("0x") else int(text)
        except ValueError:
            raise HostFSError(f"{path}: expected an integer, read {text!r}", path=path) from None

    # writes

    def write_bytes(self, path: str, data: bytes) -> None:
        """One write of ``data`` to an existing attribute/file (no create, truncates files)."""
        self._writable(path)
        real = self.resolve(path)
        try:
            fd = os.open(real, os.O_WRONLY | os.O_TRUNC | _NOFOLLOW)
        except OSError as exc:
            raise self._error("open for writing", path, exc) from None
        try:
            n = os.write(fd, data)
            if n != len(data):
                raise HostFSError(f"{path}: short write ({n} of {len(data)} bytes)", path=path)
        except OSError as exc:
            raise self._error("write", path, exc) from None
        finally:
            os.close(fd)

    def write_text(self, path: str, text: str) -> None:
        self.write_bytes(path, text.encode())

    def mkdir(self, path: str) -> None:
        self._writable(path)
        try:
            os.mkdir(self.resolve(path, follow=False))
        except OSError as exc:
            raise self._error("mkdir", path, exc) from None

    def rmdir(self, path: str) -> None:
        self._writable(path)
        try:
            os.rmdir(self.resolve(path, follow=False))
        except OSError as exc:
            raise self._error("rmdir", path, exc) from None

    def atomic_replace(self, path: str, data: bytes, *, backup: bool = True) -> str | None:
        """Replace a regular file atomically (temp + fsync + rename), keeping its mode.

        With ``backup`` the current content is first written to ``path + BACKUP_SUFFIX``
        (also atomically); returns the backup's host path.
        """
        self._writable(path)
        real = self.resolve(path, follow=False)
        if real.is_symlink():
            raise HostFSError(
                f"{path} is a symbolic link (managed elsewhere?): musku will not replace it",
                path=path,
                err=errno.ELOOP,
            )
        if not real.is_file():
            raise HostFSError(f"{path}: not a regular file", path=path, err=errno.ENOENT)
        backup_path: str | None = None
        if backup:
            backup_path = path + BACKUP_SUFFIX
            self._replace(real.with_name(real.name + BACKUP_SUFFIX), real.read_bytes(),
                          real.stat().st_mode)  # fmt: skip
        self._replace(real, data, real.stat().st_mode)
        return backup_path

    def _replace(self, real: Path, data: bytes, mode: int) -> None:
        fd, tmp = tempfile.mkstemp(prefix="." + real.name + ".", dir=real.parent)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.chmod(tmp, mode & 0o7777)
            os.replace(tmp, real)
        except BaseException:
            if os.path.exists(tmp):
                os.unlink(tmp)
            raise
        dfd = os.open(real.parent, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)

    # MSRs

    def msr_writes_allowed(self) -> tuple[bool, str]:
        """Whether the msr driver accepts writes (``msr.allow_writes``; absent = pre-5.9 kernel)."""
        if not self.exists(MSR_ALLOW_WRITES):
            return True, ""
        value = self.read_value(MSR_ALLOW_WRITES)
        if value == "off":
            return False, "msr.allow_writes is off (boot with msr.allow_writes=on)"
        return True, ""

    def _msr_offset(self, reg: int) -> int:
        """File offset of a register in /dev/cpu/N/msr: the register number (the msr driver's
        ABI). Test fakes backed by sparse files space registers apart instead, because
        neighbouring registers (0x199, 0x1A0, 0x1A4) are closer than 8 bytes."""
        return reg

    def has_msr(self, cpu: int = 0) -> bool:
        return self.exists(msr_path(cpu))

    def _msr_rule(self, reg: int) -> MsrRule:
        rule = self.msr_allow.get(reg)
        if rule is None:
            raise MsrNotAllowed(f"MSR {reg:#x} is not on musku's allow-list")
        return rule

    def read_msr(self, cpu: int, reg: int) -> int:
        self._msr_rule(reg)
        path = msr_path(cpu)
        try:
            fd = os.open(self.resolve(path), os.O_RDONLY | _NOFOLLOW)
        except FileNotFoundError:
            raise MsrUnavailable(f"{path} is missing (load the msr module: modprobe msr)") from None
        except OSError as exc:
            raise self._error("open", path, exc) from None
        try:
            data = os.pread(fd, 8, self._msr_offset(reg))
        except OSError as exc:
            raise self._error(f"read MSR {reg:#x} from", path, exc) from None
        finally:
            os.close(fd)
        if len(data) == 0:  # a fake device never written at this offset reads as zeros
            data = b"\0" * 8
        if len(data) != 8:
            raise HostFSError(f"{path}: short MSR read at {reg:#x}", path=path)
        return int(struct.unpack("<Q", data)[0])

    def write_msr(self, cpu: int, reg: int, value: int, mask: int) -> int:
        """Read-modify-write of ``mask`` bits of ``reg`` on ``cpu``; returns the old value.

        Refuses (nothing written) a register outside the allow-list, a mask with bits the
        allow-list does not permit, or a value with bits outside the mask.
        """
        rule = self._msr_rule(reg)
        if mask <= 0 or mask & ~rule.write_mask:
            raise MsrNotAllowed(
                f"MSR {reg:#x} ({rule.name}): bits {mask & ~rule.write_mask:#x} may not be written"
                f" (writable: {rule.write_mask:#x})"
            )
        if value & ~mask:
            raise MsrNotAllowed(
                f"MSR {reg:#x} ({rule.name}): value {value:#x} has bits outside mask {mask:#x}"
            )
        ok, why = self.msr_writes_allowed()
        if not ok:
            raise MsrUnavailable(why)
        self._writable(msr_path(cpu))
        old = self.read_msr(cpu, reg)
        new = (old & ~mask) | value
        if new == old:
            return old
        path = msr_path(cpu)
        try:
            fd = os.open(self.resolve(path), os.O_WRONLY | _NOFOLLOW)
        except OSError as exc:
            raise self._error("open for writing", path, exc) from None
        try:
            n = os.pwrite(fd, struct.pack("<Q", new), self._msr_offset(reg))
            if n != 8:
                raise HostFSError(f"{path}: short MSR write at {reg:#x}", path=path)
        except OSError as exc:
            raise self._error(f"write MSR {reg:#x} to", path, exc) from None
        finally:
            os.close(fd)
        return old

    # host facts

    def read_cpulist(self, path: str) -> list[int]:
        text = self.read_value(path)
        try:
            return parse_cpulist(text)
        except ValueError:
            raise HostFSError(f"{path}: not a cpu list: {text!r}", path=path) from None

    def online_cpus(self) -> list[int]:
        return self.read_cpulist(SYS_CPU + "/online")

    def present_cpus(self) -> list[int]:
        return self.read_cpulist(SYS_CPU + "/present")

    def cpu_vendor(self) -> str:
        """``"intel"``, ``"amd"`` or ``"other"`` from /proc/cpuinfo."""
        if not self.exists(PROC_CPUINFO):
            return "other"
        for line in self.read_text(PROC_CPUINFO).splitlines():
            key, _, val = line.partition(":")
            if key.strip() == "vendor_id":
                v = val.strip()
                if v == "GenuineIntel":
                    return "intel"
                if v in ("AuthenticAMD", "HygonGenuine"):
                    return "amd"
                return "other"
        return "other"

    def cpu_flags(self) -> set[str]:
        if not self.exists(PROC_CPUINFO):
            return set()
        for line in self.read_text(PROC_CPUINFO).splitlines():
            key, _, val = line.partition(":")
            if key.strip() == "flags":
                return set(val.split())
        return set()

    def meminfo(self) -> dict[str, int]:
        """/proc/meminfo as name -> value (kB for sizes, counts for HugePages_*)."""
        out: dict[str, int] = {}
        for line in self.read_text(PROC_MEMINFO).splitlines():
            key, _, rest = line.partition(":")
            fields = rest.split()
            if fields and fields[0].isdigit():
                out[key.strip()] = int(fields[0])
        return out

    def mounts(self) -> list[tuple[str, str, str, str]]:
        """/proc/mounts as (source, mountpoint, fstype, options)."""
        if not self.exists(PROC_MOUNTS):
            return []
        rows = []
        for line in self.read_text(PROC_MOUNTS).splitlines():
            f = line.split()
            if len(f) >= 4:
                rows.append((f[0], f[1], f[2], f[3]))
        return rows

    def _error(self, what: str, path: str, exc: OSError) -> HostFSError:
        reason = os.strerror(exc.errno) if exc.errno else str(exc)
        return HostFSError(f"cannot {what} {path}: {reason}", path=path, err=exc.errno or 0)
