"""The agent's side of co-tuning (:mod:`musku.tune.cotune`) on a real host: the mid-tier
reached through ``musku_admin`` (:class:`AdminEndpoint`), tables trained with
:mod:`musku.tune.train` on the running mid-tier (:class:`ServiceTrainer`), and the
``threading`` field of an ``apply`` request (:class:`AgentRequest`, built by the controller's
:class:`musku.hosts.cotune.ControllerTables`).

The two host files a request names, the mid-tier's port file and the load generator's data,
are read through the agent's :class:`~musku.hostfs.HostFS` (:func:`read_port_file`,
:func:`stage_load_data`) before the agent takes its lock: strictly beneath the host root (no
symbolic link at any component), regular files only, world-readable only (a request never
makes the agent, root, read what its sender could not), size-capped, and no error quotes
their content. The load data is copied into the agent's state directory and the trainer reads
that copy: nothing a request names reaches another program."""

from __future__ import annotations

import hashlib
import os
import socket
import stat
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from musku.cotune_spec import CotuneSpec
from musku.errors import HostError, InputError
from musku.hostfs import HostFS
from musku.services import runtime
from musku.tune.cotune import Endpoint, ThreadingState

MAX_PORT_FILE = 64
"""Bytes of a mid-tier's port file the agent reads (a port number and a newline)."""
MAX_LOAD_DATA = 256 << 20
"""Largest load-generator data file the agent copies for a training (256 MiB)."""
MAX_LOAD_COPIES = 4
"""Load-data copies the agent keeps (one per host path, the least recently written dropped)."""
COPY_CHUNK = 1 << 20


def _request_file(fs: HostFS, path: str, what: str) -> tuple[int, os.stat_result]:
    """An open descriptor and the status of a file a request names: beneath the root with no
    symbolic link at any component, a regular file, readable by every user."""
    fd = fs.open_regular(path, strict=True)
    st = os.fstat(fd)
    if not st.st_mode & stat.S_IROTH:
        os.close(fd)
        raise HostError(
            f"cannot read {path}: not readable by every user (mode "
            f"{stat.S_IMODE(st.st_mode):04o}; the agent reads only world-readable files a "
            f"request names, such as {what})"
        )
    return fd, st


def _reason(exc: HostError, path: str) -> str:
    """Why a request's file could not be read, without repeating its path."""
    return exc.one_line().removeprefix(f"cannot read {path}: ")


def read_port_file(fs: HostFS, path: str) -> str:
    """The mid-tier's Admin address from its port file (``127.0.0.1:PORT``); HostError (which
    quotes nothing of the file) when it cannot be read or holds no port number."""
    where = f"cannot read the mid-tier's port from {path}"
    try:
        fd, _ = _request_file(fs, path, "the port file")
    except HostError as exc:
        raise HostError(f"{where}: {_reason(exc, path)}") from None
    try:
        data = os.read(fd, MAX_PORT_FILE + 1)
    except OSError as exc:
        raise HostError(f"{where}: {exc.strerror}") from None
    finally:
        os.close(fd)
    text = data.decode("ascii", errors="replace").strip()
    if len(data) > MAX_PORT_FILE or not text.isdigit() or not 0 < int(text) < 65536:
        raise HostError(f"{where}: not a port number (1-65535) on one line")
    return f"127.0.0.1:{int(text)}"


def stage_load_data(fs: HostFS, path: str, into: Path) -> Path:
    """Copy the load generator's data a request names (``path`` on the host) into the agent's
    own directory ``into`` (kept while the file is unchanged) and return the copy: the trainer
    and its load generator read only that. At most :data:`MAX_LOAD_DATA` bytes."""
    try:
        fd, st = _request_file(fs, path, "the load generator's data")
    except HostError as exc:
        raise InputError(f"[threading] load_data {path}: {_reason(exc, path)}") from None
    try:
        if st.st_size > MAX_LOAD_DATA:
            raise InputError(f"[threading] load_data {path}: larger than {MAX_LOAD_DATA >> 20} MiB")
        into.mkdir(mode=0o700, parents=True, exist_ok=True)
        name = hashlib.sha256(f"{fs.root}\0{path}".encode()).hexdigest()[:24]
        copy, stamp = into / name, into / (name + ".id")
        ident = f"{st.st_dev}:{st.st_ino}:{st.st_size}:{st.st_mtime_ns}"
        try:
            if copy.is_file() and stamp.read_text() == ident:
                return copy
        except OSError:
            pass
        _prune(into, keep=name)
        tmp = into / (name + ".tmp")
        size = 0
        with open(tmp, "wb") as out:
            while chunk := os.read(fd, COPY_CHUNK):
                size += len(chunk)
                if size > MAX_LOAD_DATA:
                    raise InputError(
                        f"[threading] load_data {path}: larger than {MAX_LOAD_DATA >> 20} MiB"
                    )
                out.write(chunk)
        os.replace(tmp, copy)
        stamp.write_text(ident)
        return copy
    except OSError as exc:
        raise HostError(f"cannot copy the load generator's data {path}: {exc.strerror}") from None
    finally:
        os.close(fd)


def _prune(into: Path, *, keep: str) -> None:
    """Keep at most :data:`MAX_LOAD_COPIES` - 1 other copies (the least recently written
    go), so requests naming many files cannot fill the agent's disk."""
    copies = sorted(
        (p for p in into.iterdir() if p.is_file() and not p.suffix and p.name != keep),
        key=lambda p: p.stat().st_mtime,
    )
    for old in copies[: max(0, len(copies) - (MAX_LOAD_COPIES - 1))]:
        for f in (old, old.with_name(old.name + ".id")):
            f.unlink(missing_ok=True)


def stage(fs: HostFS, spec: CotuneSpec, into: Path, *, port_file: bool = True) -> CotuneSpec:
    """``spec`` with the host files it names read: the port file turned into the address it
    holds (with ``port_file``), the load data into the agent's copy (:func:`stage_load_data`).
    Call before taking the agent's lock."""
    if port_file and spec.admin_port_file and not spec.admin:
        spec = replace(spec, admin=read_port_file(fs, spec.admin_port_file), admin_port_file="")
    if spec.load_data:
        spec = replace(spec, load_data=str(stage_load_data(fs, spec.load_data, into)))
    return spec


class AdminEndpoint:
    """A real mid-tier through ``musku_admin`` (:func:`musku.services.runtime.admin`)."""

    def __init__(
        self,
        admin: str = "",
        admin_port_file: str = "",
        *,
        host: str = "",
        fs: HostFS | None = None,
    ) -> None:
        if not admin and not admin_port_file:
            raise InputError("co-tuning needs the mid-tier's admin address or admin_port_file")
        self.admin = admin
        self.port_file = admin_port_file
        self.host = host or socket.gethostname()
        self.fs = fs

    def address(self) -> str:
        """The Admin address (a port file is read each time: the mid-tier may have restarted),
        through the host filesystem (:func:`read_port_file`)."""
        if self.admin:
            return self.admin
        if self.fs is None:
            self.fs = HostFS("/", read_only=True)
        return read_port_file(self.fs, self.port_file)

    def get(self) -> ThreadingState:
        return ThreadingState.from_json(runtime.admin(self.address(), "get"))

    def set_auto(self, table_path: Path) -> ThreadingState:
        return ThreadingState.from_json(
            runtime.set_threading(self.address(), "auto", table=str(table_path))
        )

    def set_fixed(self, state: ThreadingState) -> ThreadingState:
        return ThreadingState.from_json(
            runtime.set_threading(
                self.address(),
                state.model,
                pollers=state.pollers,
                workers=state.workers,
                responders=state.responders,
            )
        )

    def cpus(self) -> int:
        return os.cpu_count() or 1


class ServiceTrainer:
    """Trains on the host's running mid-tier with :func:`musku.tune.train.train` (open-loop
    ``musku_loadgen`` points, switching the mid-tier over the Admin RPC)."""

    def __init__(self, loadgen_cpus: Sequence[int] | None = None) -> None:
        self.loadgen_cpus = loadgen_cpus

    def train(self, endpoint: Endpoint, spec: CotuneSpec) -> tuple[dict[str, Any], float]:
        # lazy: the training code pulls in numpy and scipy, which only a training needs
        from musku.tune import train as tr

        if not isinstance(endpoint, AdminEndpoint):
            raise InputError("ServiceTrainer trains on a real mid-tier (AdminEndpoint)")
        if spec.load_data:
            data = Path(spec.load_data)
            if not data.is_file():
                raise InputError(f"the load generator's data {data} does not exist on this host")
        elif spec.service == "setalgebra":
            data = runtime.setalgebra_data(runtime.default_data_dir())[1]
        else:
            raise InputError(f"co-tuning {spec.service} needs [threading] load_data (the load "
                             "generator's data on the host)")  # fmt: skip
        t0 = time.monotonic()
        table, _grid = tr.train(
            tr.Target(endpoint.address(), spec.service, data),
            list(spec.loads),
            spec.candidates(),
            duration_s=spec.duration_s,
            warmup_s=spec.warmup_s,
            loadgen_cpus=self.loadgen_cpus,
        )
        table["host"] = endpoint.host
        return table, time.monotonic() - t0


@dataclass(frozen=True)
class AgentRequest:
    """The ``threading`` field of an agent ``apply`` request:
    ``{"spec": CotuneSpec JSON, "platform": NAME, "table": TABLE or null}``."""

    spec: CotuneSpec
    platform: str
    table: Mapping[str, Any] | None = None

    @classmethod
    def parse(cls, raw: object) -> AgentRequest | None:
        if raw is None:
            return None
        if not isinstance(raw, Mapping):
            raise InputError("threading must be an object {spec, platform, table}")
        unknown = set(raw) - {"spec", "platform", "table"}
        if unknown:
            raise InputError(f"threading: unknown key(s) {', '.join(sorted(unknown))}")
        spec = CotuneSpec.from_json(raw.get("spec"))
        if not spec.admin and not spec.admin_port_file:
            raise InputError("threading spec needs admin or admin_port_file")
        platform = raw.get("platform", "")
        table = raw.get("table")
        if not isinstance(platform, str) or (table is not None and not isinstance(table, Mapping)):
            raise InputError("threading: platform must be text and table an object")
        return cls(spec, platform, table)

    def to_json(self) -> dict[str, Any]:
        return {"spec": self.spec.to_json(), "platform": self.platform, "table": self.table}
