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

Every path is opened beneath the root in one atomic resolution, from a descriptor of the
root (:meth:`HostFS._open`): ``openat2(RESOLVE_IN_ROOT)`` where the kernel has it (5.6+), an
absolute link target starting at the root and ``..`` stopping there, so a link in a fake or
chroot root never leads out of it, even when a directory of the path is swapped for a link
while musku works; without ``openat2``, the same rules component by component with directory
descriptors opened ``O_NOFOLLOW``. Paths a request names (not kernel interfaces) are resolved
*strictly*: ``RESOLVE_BENEATH|RESOLVE_NO_SYMLINKS``, a link at any component refused. Reads and
writes take regular files only (the MSR device excepted), checked before they are opened (a
FIFO, a device is never opened) and opened ``O_NONBLOCK``; every read has a size cap
(:data:`MAX_READ_BYTES` by default) and an error never quotes a file's content. A NUL byte in
a host path is an :class:`~musku.errors.InputError`.

Test fakes subclass :class:`HostFS` and override the primitives (:meth:`HostFS.write_bytes`,
:meth:`HostFS.mkdir`, :meth:`HostFS.rmdir`) to enforce the kernel's rules at this interface.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import secrets
import stat
import struct
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from musku.errors import HostError, InputError, UnsupportedError
from musku.knob_spec import knob_names, spec_of
from musku.outputs import file_kind

# --- kernel paths: the only place they are spelled -------------------------------------------

SYSFS = "/sys"
PROC_SYS = "/proc/sys"  # sysctl's tree (a catalog's sysfs knob lives under one of these two)
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


def proc_pid(pid: int, *parts: object) -> str:
    """A process's procfs path: ``proc_pid(7, "task", 9, "status")`` is
    ``/proc/7/task/9/status``."""
    return "/".join(["/proc", str(pid), *map(str, parts)])


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
    (:attr:`musku.knob_spec.KnobSpec.msrs`; the registers and masks live with the knobs)."""
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


# --- resolution beneath the root --------------------------------------------------------------

_SYS_OPENAT2 = 437  # the same number on every architecture (Linux 5.6)
RESOLVE_NO_MAGICLINKS = 0x02
RESOLVE_NO_SYMLINKS = 0x04
RESOLVE_BENEATH = 0x08
RESOLVE_IN_ROOT = 0x10
_O_PATH = getattr(os, "O_PATH", 0o10000000)
_DIR = _O_PATH | os.O_DIRECTORY | os.O_CLOEXEC
_NOT_THERE = (errno.ENOENT, errno.ENOTDIR, errno.ELOOP, errno.EXDEV)


class _OpenHow(ctypes.Structure):
    _fields_ = [
        ("flags", ctypes.c_uint64),
        ("mode", ctypes.c_uint64),
        ("resolve", ctypes.c_uint64),
    ]


_openat2_state: list[Any] = []  # [] = not probed yet; [None] = unavailable; [fn] = the syscall


def _syscall_openat2() -> Any:
    """libc's ``syscall`` when this kernel (and seccomp filter) has ``openat2``, else None."""
    if not _openat2_state:
        fn: Any = None
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            fn = libc.syscall
            fn.restype = ctypes.c_long
            how = _OpenHow(_O_PATH | os.O_CLOEXEC, 0, RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS)
            fd = fn(_SYS_OPENAT2, -100, b".", ctypes.byref(how), ctypes.sizeof(how))
            if fd < 0:
                fn = None  # ENOSYS (before 5.6), EPERM (a seccomp filter): walk instead
            else:
                os.close(fd)
        except (OSError, AttributeError):
            fn = None
        _openat2_state.append(fn)
    return _openat2_state[0]


def _openat2(fn: Any, dirfd: int, rel: str, flags: int, mode: int, resolve: int) -> int:
    how = _OpenHow(flags, mode if flags & os.O_CREAT else 0, resolve)
    raw = os.fsencode(rel)
    for _ in range(16):  # EAGAIN: a rename raced the lookup (RESOLVE_IN_ROOT/BENEATH); retry
        fd = int(fn(_SYS_OPENAT2, dirfd, raw, ctypes.byref(how), ctypes.sizeof(how)))
        if fd >= 0:
            return fd
        err = ctypes.get_errno()
        if err not in (errno.EAGAIN, errno.EINTR):
            raise OSError(err, os.strerror(err))
    raise OSError(errno.EAGAIN, os.strerror(errno.EAGAIN))


def _split(target: str) -> list[str]:
    return [p for p in target.split("/") if p not in ("", ".")]


def _walk(rootfd: int, parts: list[str], flags: int, mode: int, strict: bool) -> int:
    """``openat2`` without the kernel's help: one component at a time from the root's fd, each
    directory opened ``O_PATH|O_NOFOLLOW`` relative to the last, so a directory swapped for a
    link meanwhile is refused, never followed. A link met on the way is resolved as
    ``RESOLVE_IN_ROOT`` does (an absolute target starts again at the root, ``..`` stops at it),
    or, ``strict``, refused (ELOOP)."""
    todo = list(reversed(parts)) or ["."]
    stack: list[int] = []  # the directories below the root, outermost first
    links = 0
    try:
        while todo:
            name = todo.pop()
            last = not todo
            at = stack[-1] if stack else rootfd
            if name == "..":
                if strict:
                    raise OSError(errno.EXDEV, "leads outside the host root")
                if stack:
                    os.close(stack.pop())
                if not last:
                    continue
                name, at = ".", stack[-1] if stack else rootfd
            if name == ".":
                if last:
                    return os.open(".", flags, mode, dir_fd=at)
                continue
            try:
                target: str | None = os.readlink(name, dir_fd=at)
            except OSError as exc:
                if exc.errno not in (errno.EINVAL, errno.ENOENT):
                    raise
                target = None
            if target is not None and not (last and flags & os.O_NOFOLLOW):
                if strict:
                    raise OSError(errno.ELOOP, "a component is a symbolic link")
                links += 1
                if links > MAX_SYMLINKS or not target:
                    raise OSError(errno.ELOOP if target else errno.ENOENT, "bad symbolic link")
                if target.startswith("/"):
                    while stack:
                        os.close(stack.pop())
                todo.extend(reversed(_split(target) or ["."]))
                continue
            if last:
                return os.open(name, flags | os.O_NOFOLLOW, mode, dir_fd=at)
            stack.append(os.open(name, _DIR | os.O_NOFOLLOW, dir_fd=at))
        raise OSError(errno.ENOENT, "empty path")  # not reached: the last component returns
    finally:
        for fd in stack:
            os.close(fd)


def _read_capped(fd: int, limit: int) -> bytes | None:
    """At most ``limit`` bytes from ``fd``; None when there are more."""
    chunks: list[bytes] = []
    size = 0
    while True:
        chunk = os.read(fd, min(1 << 16, limit + 1 - size))
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)
        size += len(chunk)
        if size > limit:
            return None


# --- HostFS ----------------------------------------------------------------------------------


class HostFS:
    """Root-relative access to a host's kernel interfaces."""

    def __init__(
        self,
        root: str | os.PathLike[str] = "/",
        *,
        msr_allow: Mapping[int, MsrRule] | None = None,  # default: the knobs' registers
        read_only: bool = False,
        openat2: bool | None = None,  # None: use it where the kernel has it; False: walk
    ) -> None:
        self.root = Path(root).resolve()
        self.msr_allow = dict(default_msr_allow() if msr_allow is None else msr_allow)
        self.read_only = read_only  # probes and reports: every write is refused
        self._use_openat2 = openat2

    def _writable(self, path: str) -> None:
        if self.read_only:
            raise HostFSError(f"refusing to change {path}: this HostFS is read-only", path=path)

    def __repr__(self) -> str:
        return f"HostFS(root={str(self.root)!r})"

    @property
    def resolver(self) -> str:
        """How paths are resolved: ``"openat2"`` (the kernel) or ``"walk"`` (component by
        component with directory descriptors)."""
        return "openat2" if self._openat2_fn() is not None else "walk"

    def _openat2_fn(self) -> Any:
        return None if self._use_openat2 is False else _syscall_openat2()

    # paths

    @staticmethod
    def _parts(path: str) -> list[str]:
        """The components of a host path: absolute, no NUL byte, no ``..``."""
        if not isinstance(path, str) or "\0" in path:
            raise InputError(f"host path must be text without NUL bytes: {path!r}"[:200])
        p = PurePosixPath(path)
        if not p.is_absolute():
            raise InputError(f"host path must be absolute: {path!r}")
        if ".." in p.parts:
            raise InputError(f"host path must not contain '..': {path!r}")
        return list(p.parts[1:])

    def host(self, path: str) -> Path:
        """The real path of a host path (absolute, as the kernel names it) under the root.
        For messages and test fakes only: every open goes through :meth:`_open`."""
        return self.root.joinpath(*self._parts(path))

    def _open(self, path: str, flags: int, mode: int = 0, *, strict: bool = False) -> int:
        """A descriptor for ``path`` resolved beneath the root, atomically: ``openat2`` with
        ``RESOLVE_IN_ROOT`` (links followed, but confined to the root: an absolute target starts
        at the root, ``..`` stops there), or, ``strict``, ``RESOLVE_BENEATH|RESOLVE_NO_SYMLINKS``
        (a link at any component is refused: ELOOP). Without ``openat2`` the same rules by a
        component-by-component walk with directory descriptors (:func:`_walk`). Raises
        OSError (InputError for a malformed path)."""
        parts = self._parts(path)
        flags |= os.O_CLOEXEC
        rootfd = os.open(self.root, _DIR)
        try:
            fn = self._openat2_fn()
            if fn is None:
                return _walk(rootfd, parts, flags, mode, strict)
            resolve = RESOLVE_NO_MAGICLINKS | (
                RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS if strict else RESOLVE_IN_ROOT
            )
            return _openat2(fn, rootfd, "/".join(parts) or ".", flags, mode, resolve)
        finally:
            os.close(rootfd)

    def _stat(self, path: str, *, follow: bool = True, strict: bool = False) -> os.stat_result:
        fd = self._open(path, _O_PATH | (0 if follow else os.O_NOFOLLOW), strict=strict)
        try:
            return os.fstat(fd)
        finally:
            os.close(fd)

    def _mode(self, path: str, *, follow: bool = True) -> int:
        """The file type bits of ``path``; 0 when it does not exist (or cannot be reached)."""
        try:
            return self._stat(path, follow=follow).st_mode
        except OSError as exc:
            if exc.errno in _NOT_THERE:
                return 0
            raise self._error("stat", path, exc) from None

    def resolve(self, path: str, *, follow: bool = True) -> Path:
        """The real path a host path names, every symbolic link resolved *inside the root*
        (as ``openat2(RESOLVE_IN_ROOT)`` does). For messages: the answer may be stale by the
        time it is used, so nothing here opens by it (:meth:`_open` resolves atomically)."""
        self._parts(path)
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
                missing = True
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
                done = []
            todo.extend(reversed(PurePosixPath(target).parts[1 if target.startswith("/") else 0 :]))
        return self.root.joinpath(*done)

    def exists(self, path: str) -> bool:
        return self._mode(path) != 0

    def is_dir(self, path: str) -> bool:
        return stat.S_ISDIR(self._mode(path))

    def is_file(self, path: str) -> bool:
        return stat.S_ISREG(self._mode(path))

    def is_symlink(self, path: str) -> bool:
        return stat.S_ISLNK(self._mode(path, follow=False))

    def listdir(self, path: str) -> list[str]:
        try:
            fd = self._open(path, os.O_RDONLY | os.O_DIRECTORY)
            try:
                return sorted(os.listdir(fd))
            finally:
                os.close(fd)
        except OSError as exc:
            raise self._error("list", path, exc) from None

    def _file(
        self, path: str, flags: int, what: str, *, strict: bool = False, device: bool = False
    ) -> int:
        """A descriptor of the regular file ``path`` (or, ``device``, a character device too):
        its type is checked before it is opened (a FIFO, a device, a directory is refused
        unopened: opening some devices has effects), opened ``O_NONBLOCK`` (a FIFO swapped in
        meanwhile cannot block) and checked again to be the same file."""
        try:
            before = self._stat(path, strict=strict)
            ok = stat.S_ISREG(before.st_mode) or (device and stat.S_ISCHR(before.st_mode))
            if not ok:
                raise HostFSError(
                    f"cannot {what} {path}: {file_kind(before.st_mode)}, not a regular file",
                    path=path,
                    err=errno.EINVAL,
                )
            fd = self._open(path, flags | os.O_NONBLOCK | os.O_NOCTTY, strict=strict)
        except OSError as exc:
            raise self._error(what, path, exc, strict=strict) from None
        st = os.fstat(fd)
        if (st.st_dev, st.st_ino, stat.S_IFMT(st.st_mode)) != (
            before.st_dev,
            before.st_ino,
            stat.S_IFMT(before.st_mode),
        ):
            os.close(fd)
            raise HostFSError(f"cannot {what} {path}: it changed while being opened", path=path)
        return fd

    # reads

    def read_bytes(self, path: str, *, limit: int = MAX_READ_BYTES, strict: bool = False) -> bytes:
        """The content of the regular file ``path``, at most ``limit`` bytes (more is an error
        that quotes nothing of it). ``strict``: no symbolic link at any component (paths a
        request names, :meth:`open_regular`)."""
        fd = self._file(path, os.O_RDONLY, "read", strict=strict)
        try:
            data = _read_capped(fd, limit)
        except OSError as exc:
            raise self._error("read", path, exc) from None
        finally:
            os.close(fd)
        if data is None:
            raise HostFSError(f"cannot read {path}: larger than {limit} bytes", path=path)
        return data

    def open_regular(self, path: str, *, strict: bool = True) -> int:
        """An ``O_RDONLY`` descriptor of the regular file ``path`` (the caller closes it), by
        default with no symbolic link at any component: for files a request names."""
        return self._file(path, os.O_RDONLY, "read", strict=strict)

    def read_text(self, path: str, *, limit: int = MAX_READ_BYTES, strict: bool = False) -> str:
        return self.read_bytes(path, limit=limit, strict=strict).decode("utf-8", errors="replace")

    def read_value(self, path: str) -> str:
        """A one-value attribute, whitespace stripped."""
        return self.read_text(path).strip()

    def read_int(self, path: str) -> int:
        text = self.read_value(path)
        try:
            return int(text, 0) if text.startswith("0x") else int(text)
        except ValueError:
            shown = text if len(text) <= 40 else text[:37] + "..."
            raise HostFSError(f"{path}: expected an integer, read {shown!r}", path=path) from None

    # writes

    def write_bytes(self, path: str, data: bytes) -> None:
        """One write of ``data`` to an existing attribute/file (no create, truncates files)."""
        self._writable(path)
        fd = self._file(path, os.O_WRONLY | os.O_TRUNC, "open for writing")
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

    def _parent(self, path: str, what: str) -> tuple[int, str]:
        """(a descriptor of the parent directory, the last component) of ``path``."""
        parts = self._parts(path)
        if not parts:
            raise HostFSError(f"cannot {what} /", path=path, err=errno.EINVAL)
        try:
            return self._open("/" + "/".join(parts[:-1]), os.O_RDONLY | os.O_DIRECTORY), parts[-1]
        except OSError as exc:
            raise self._error(what, path, exc) from None

    def mkdir(self, path: str) -> None:
        self._writable(path)
        pfd, name = self._parent(path, "mkdir")
        try:
            os.mkdir(name, dir_fd=pfd)
        except OSError as exc:
            raise self._error("mkdir", path, exc) from None
        finally:
            os.close(pfd)

    def rmdir(self, path: str) -> None:
        self._writable(path)
        pfd, name = self._parent(path, "rmdir")
        try:
            os.rmdir(name, dir_fd=pfd)
        except OSError as exc:
            raise self._error("rmdir", path, exc) from None
        finally:
            os.close(pfd)

    def atomic_replace(self, path: str, data: bytes, *, backup: bool = True) -> str | None:
        """Replace a regular file atomically (temp + fsync + rename), keeping its mode.

        With ``backup`` the current content is first written to ``path + BACKUP_SUFFIX``
        (also atomically); returns the backup's host path. Everything happens relative to a
        descriptor of the parent directory, so a directory swapped for a link meanwhile
        cannot move the write elsewhere.
        """
        self._writable(path)
        pfd, name = self._parent(path, "replace")
        try:
            try:
                st = os.stat(name, dir_fd=pfd, follow_symlinks=False)
            except FileNotFoundError:
                raise HostFSError(
                    f"{path}: not a regular file", path=path, err=errno.ENOENT
                ) from None
            if stat.S_ISLNK(st.st_mode):
                raise HostFSError(
                    f"{path} is a symbolic link (managed elsewhere?): musku will not replace it",
                    path=path,
                    err=errno.ELOOP,
                )
            if not stat.S_ISREG(st.st_mode):
                raise HostFSError(f"{path}: not a regular file", path=path, err=errno.EINVAL)
            backup_path: str | None = None
            if backup:
                fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC,
                             dir_fd=pfd)  # fmt: skip
                try:
                    if (os.fstat(fd).st_ino, os.fstat(fd).st_dev) != (st.st_ino, st.st_dev):
                        raise HostFSError(f"{path}: it changed while being read", path=path)
                    old = _read_capped(fd, MAX_READ_BYTES)
                finally:
                    os.close(fd)
                if old is None:
                    raise HostFSError(f"{path}: larger than {MAX_READ_BYTES} bytes", path=path)
                backup_path = path + BACKUP_SUFFIX
                self._replace_at(pfd, name + BACKUP_SUFFIX, old, st.st_mode)
            self._replace_at(pfd, name, data, st.st_mode)
            return backup_path
        except OSError as exc:
            raise self._error("replace", path, exc) from None
        finally:
            os.close(pfd)

    @staticmethod
    def _replace_at(pfd: int, name: str, data: bytes, mode: int) -> None:
        tmp = f".{name}.{secrets.token_hex(6)}"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                     0o600, dir_fd=pfd)  # fmt: skip
        try:
            try:
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view) :]
                os.fsync(fd)
                os.fchmod(fd, mode & 0o7777)
            finally:
                os.close(fd)
            os.replace(tmp, name, src_dir_fd=pfd, dst_dir_fd=pfd)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp, dir_fd=pfd)
            raise
        os.fsync(pfd)

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
            fd = self._file(path, os.O_RDONLY, "open", device=True)
        except HostFSError as exc:
            if exc.errno == errno.ENOENT:
                raise MsrUnavailable(
                    f"{path} is missing (load the msr module: modprobe msr)"
                ) from None
            raise
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
        fd = self._file(path, os.O_WRONLY, "open for writing", device=True)
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

    def _error(self, what: str, path: str, exc: OSError, *, strict: bool = False) -> HostFSError:
        if strict and exc.errno == errno.ELOOP:
            reason = "a symbolic link in the path (refused: no links in paths a request names)"
        elif exc.errno == errno.EXDEV:
            reason = "it leads outside the host root"
        else:
            reason = os.strerror(exc.errno) if exc.errno else str(exc)
        return HostFSError(f"cannot {what} {path}: {reason}", path=path, err=exc.errno or 0)
