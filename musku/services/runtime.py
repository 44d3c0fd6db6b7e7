"""Run the C++ services from Python: find the binaries, start tiers, wait for health, drive
load with ``musku_loadgen``, talk to the Admin RPC through ``musku_admin``, stop everything.

Nothing here spells a port: servers bind port 0 and report it through ``--port-file``.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
from platformdirs import user_cache_dir

from musku.cotune_spec import MODELS
from musku.errors import HostError, InputError, MuskuError, UnsupportedError
from musku.process import Child, spawn, tail
from musku.services.binaries import REPO, SERVICES_SRC, binary, build_dir
from musku.services.datasets import setalgebra_data
from musku.services.deployments import SERVICES, recipe

THREADING_MODELS: tuple[str, ...] = MODELS  # the framework's models, listed once (cotune_spec)
# How a mid-tier reaches its leaves (the servers' --leaf-transport; services/framework/README.md).
LEAF_TRANSPORTS: tuple[str, ...] = ("unary", "batch")


def parse_cpus(text: str) -> list[int] | None:
    """A CPU list such as ``"0,1"`` for pinning (``""`` = not pinned)."""
    try:
        return [int(x) for x in text.split(",") if x.strip()] or None
    except ValueError as e:
        raise InputError(f"CPU lists are comma-separated integers, not {text!r}") from e


def build(*, test: bool = False, jobs: int = 2, asan: bool = True) -> Path:
    """Configure and build the services; returns the release build directory.

    Into services/build (and the ASan/UBSan test build services/build-asan unless ``asan`` is
    False) through scripts/build-services; when ``MUSKU_SERVICES_BUILD`` names another
    directory, the release build goes there (where :func:`binary` looks) and no ASan build is
    made. ``test`` also runs ctest.
    """
    out = build_dir()
    if out.resolve() != (SERVICES_SRC / "build").resolve():
        for tool in ("cmake", "ninja"):
            if shutil.which(tool) is None:
                raise UnsupportedError(f"{tool} not found (scripts/setup installs it)")
        steps = [
            ["cmake", "-S", str(SERVICES_SRC), "-B", str(out), "-G", "Ninja",
             "-DCMAKE_BUILD_TYPE=Release"],
            ["ninja", "-C", str(out), "-j", str(jobs)],
        ] + ([["ctest", "--test-dir", str(out), "--output-on-failure", "-j", "1"]]
             if test else [])  # fmt: skip
        for argv in steps:
            rc = subprocess.call(argv)
            if rc != 0:
                raise HostError(f"{argv[0]} failed with exit status {rc} (building {out})")
        return out
    script = REPO / "scripts" / "build-services"
    if not script.is_file():
        raise UnsupportedError(f"{script} not found: not a musku source checkout")
    env = dict(os.environ, MUSKU_JOBS=str(jobs), MUSKU_NO_ASAN="0" if asan else "1")
    rc = subprocess.call([str(script)] + (["--test"] if test else []), env=env)
    if rc != 0:
        raise HostError(f"scripts/build-services failed with exit status {rc}")
    return out


# ------------------------------------------------------------------------------------------
# Processes


@dataclass
class Proc(Child):
    """One server process we started, listening on a loopback port."""

    port: int = 0

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"


def start_server(
    name: str,
    argv: Sequence[str],
    workdir: Path,
    *,
    cpus: Sequence[int] | None = None,
    timeout: float = 60.0,
) -> Proc:
    """Start a musku server with ``--port-file``; return once it answers Health."""
    port_file = workdir / f"{name}.port"
    log = workdir / f"{name}.log"
    port_file.unlink(missing_ok=True)
    popen = spawn([*argv, "--port-file", str(port_file)], log, cpus=cpus)
    try:  # whatever goes wrong (Ctrl-C included), the process does not outlive this call
        deadline = time.monotonic() + timeout
        while not (port_file.exists() and port_file.read_text().strip()):
            if popen.poll() is not None:
                raise HostError(f"{name} exited with status {popen.returncode}: {_tail(log)}")
            if time.monotonic() > deadline:
                raise HostError(f"{name} did not start within {timeout:.0f} s (see {log})")
            time.sleep(0.05)
        port = int(port_file.read_text().strip())
        proc = Proc(name, popen, log, port)
        admin(proc.address, "wait-healthy", "--timeout-ms", str(int(max(1.0, timeout) * 1000)))
    except BaseException:
        if popen.poll() is None:
            popen.kill()
        popen.wait()
        raise
    return proc


def _tail(log: Path, lines: int = 3) -> str:
    return tail(log, lines, " | ")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def memcached_binary() -> Path:
    """Debian's memcached (``apt-get install memcached``); UnsupportedError if absent."""
    found = shutil.which("memcached") or ("/usr/bin/memcached" if os.access("/usr/bin/memcached",
                                                                            os.X_OK) else None)  # fmt: skip
    if not found:
        raise UnsupportedError("memcached is not installed (apt-get install memcached)")
    return Path(found)


def start_memcached(
    name: str,
    workdir: Path,
    *,
    memory_mb: int = 64,
    cpus: Sequence[int] | None = None,
    timeout: float = 10.0,
) -> Proc:
    """Start a real memcached on a free loopback port (TCP only, one worker thread); return once
    it accepts connections. ``Proc.stop()`` (SIGTERM) ends it with exit status 0."""
    exe = memcached_binary()
    log = workdir / f"{name}.log"
    last = ""
    for _attempt in range(5):  # the free port can be taken between probe and bind: retry
        port = _free_port()
        argv = [str(exe), "-l", "127.0.0.1", "-p", str(port), "-U", "0", "-m", str(memory_mb),
                "-t", "1"] + (["-u", "nobody"] if os.geteuid() == 0 else [])  # fmt: skip
        popen = spawn(argv, log, cpus=cpus)
        try:
            deadline = time.monotonic() + timeout
            while popen.poll() is None:
                try:
                    with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                        return Proc(name, popen, log, port)
                except OSError:
                    if time.monotonic() > deadline:
                        raise HostError(f"{name} not listening after {timeout:.0f} s") from None
                    time.sleep(0.02)
        except BaseException:
            if popen.poll() is None:
                popen.kill()
            popen.wait()
            raise
        last = f"{name} exited with status {popen.returncode}: {_tail(log)}"
    raise HostError(last)


def memcached_command(address: str, command: str, timeout: float = 5.0) -> bytes:
    """Send one text-protocol command whose reply ends in ``END`` (``stats``, ``get KEY``) to a
    memcached and return the reply."""
    host, _, port = address.rpartition(":")
    with socket.create_connection((host, int(port)), timeout=timeout) as s:
        s.sendall(command.encode() + b"\r\n")
        buf = b""
        while not buf.endswith(b"END\r\n"):
            chunk = s.recv(65536)
            if not chunk:
                break
            buf += chunk
    return buf


def memcached_stats(address: str) -> dict[str, int]:
    """A memcached's integer counters (``stats``: cmd_get, cmd_set, get_hits, curr_items, ...)."""
    buf = memcached_command(address, "stats")
    out = {}
    for line in buf.decode(errors="replace").splitlines():
        parts = line.split()
        if len(parts) == 3 and parts[0] == "STAT" and parts[2].isdigit():
            out[parts[1]] = int(parts[2])
    return out


def admin(address: str, *args: str, check: bool = True) -> dict[str, Any]:
    """Run ``musku_admin --target ADDRESS ARGS``: its JSON; InputError on a refused request."""
    cp = subprocess.run(
        [str(binary("musku_admin")), "--target", address, *args],
        capture_output=True,
        text=True,
        timeout=60,
    )
    if cp.returncode != 0:
        msg = cp.stderr.strip().removeprefix("musku_admin: ")
        if not check:
            return {"error": msg, "status": cp.returncode}
        if cp.returncode == 3:
            raise InputError(msg)
        raise HostError(f"admin {' '.join(args)} on {address}: {msg}")
    out: dict[str, Any] = json.loads(cp.stdout)
    return out


def set_threading(
    address: str,
    model: str,
    *,
    pollers: int | None = None,
    workers: int | None = None,
    responders: int | None = None,
    table: str | None = None,
) -> dict[str, Any]:
    args = ["set", model]
    for flag, v in (("--pollers", pollers), ("--workers", workers), ("--responders", responders)):
        if v is not None:
            args += [flag, str(v)]
    if table:
        args += ["--table", table]
    return admin(address, *args)


@dataclass(frozen=True)
class BenchPlacement:
    """Where a benchmark runs: servers (and memcached) on ``server_cpus``, the load generator on
    ``loadgen_cpus`` (None = not pinned), with the host's CPU count for the printed notes."""

    server_cpus: list[int] | None
    loadgen_cpus: list[int] | None
    data_dir: Path
    ncpu: int
    as_json: bool

    @staticmethod
    def add_arguments(ap: Any) -> None:
        """The options every ``bench/`` script that deploys services takes."""
        ap.add_argument("--server-cpus", default="0", help="pin the servers to these CPUs")
        ap.add_argument("--loadgen-cpus", default="1", help="pin the load generator")
        ap.add_argument("--data-dir", type=Path, default=None)
        ap.add_argument("--json", action="store_true")

    @classmethod
    def of(cls, args: Any) -> BenchPlacement:
        ncpu = os.cpu_count() or 1
        lg = [c for c in parse_cpus(args.loadgen_cpus) or [] if c < ncpu] or None
        return cls(parse_cpus(args.server_cpus), lg, args.data_dir or default_data_dir(), ncpu,
                   args.json)  # fmt: skip

    def loadgen_list(self) -> list[int]:
        return self.loadgen_cpus or list(range(self.ncpu))


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process (psutil)."""
    t = psutil.Process(pid).cpu_times()
    return float(t.user + t.system)


def idle_cpu_percent(pid: int, seconds: float = 3.0) -> float:
    a = cpu_seconds(pid)
    time.sleep(seconds)
    return 100.0 * (cpu_seconds(pid) - a) / seconds


# ------------------------------------------------------------------------------------------
# Load generation


@dataclass(frozen=True)
class LoadSpec:
    mode: str = "open"  # open | closed
    qps: float = 100.0
    schedule: str | None = None  # "100:2,5000:1,100:2" (open loop phases)
    duration_s: float = 5.0
    warmup_s: float = 1.0
    concurrency: int = 16
    timeout_ms: int = 5000
    seed: int = 1


def run_load(
    address: str,
    service: str,
    data: Path,
    spec: LoadSpec,
    *,
    cpus: Sequence[int] | None = None,
    method: str | None = None,
) -> dict[str, Any]:
    """Drive ``address`` with musku_loadgen; return its JSON result. With ``method``
    (``/package.Service/Method``) ``data`` is a file of length-prefixed serialized requests
    (``--method M --requests FILE``: any gRPC service, e.g. the original μSuite's)."""
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as tf:
        out = Path(tf.name)
    what = ["--method", method, "--requests", str(data)] if method else [
        "--service", service, "--data", str(data)]  # fmt: skip
    argv = [
        str(binary("musku_loadgen")),
        "--target", address,
        *what,
        "--mode", spec.mode,
        "--duration", f"{spec.duration_s:g}",
        "--warmup", f"{spec.warmup_s:g}",
        "--concurrency", str(spec.concurrency),
        "--timeout-ms", str(spec.timeout_ms),
        "--seed", str(spec.seed),
        "--json", str(out),
    ]  # fmt: skip
    if spec.schedule:
        argv += ["--schedule", spec.schedule]
    else:
        argv += ["--qps", f"{spec.qps:g}"]
    affinity = set(cpus) if cpus else None
    try:
        cp = subprocess.run(
            argv,
            capture_output=True,
            text=True,
            timeout=spec.duration_s * 3 + spec.warmup_s + 120,
            preexec_fn=(lambda: os.sched_setaffinity(0, affinity)) if affinity else None,
        )
        if cp.returncode != 0:
            raise HostError(f"musku_loadgen failed: {cp.stderr.strip()}")
        result: dict[str, Any] = json.loads(out.read_text())
        return result
    finally:
        out.unlink(missing_ok=True)


@dataclass(frozen=True)
class Load:
    """An open-loop load: ``qps`` absolute, or a ``fraction`` of the measured saturation."""

    qps: float | None = None
    fraction: float | None = None

    def resolve(self, saturation: float | None) -> float:
        if self.qps is not None:
            return self.qps
        assert self.fraction is not None and saturation is not None
        return max(1.0, self.fraction * saturation)


def parse_load_list(text: str) -> list[Load]:
    """``"500,1000"`` (QPS) or ``"20%,50%,80%"`` (of the closed-loop saturation), mixed allowed."""
    out = []
    for item in (x.strip() for x in text.split(",")):
        if not item:
            continue
        try:
            v = float(item.removesuffix("%"))
        except ValueError as e:
            raise InputError(f"loads are QPS values or percentages, not {item!r}") from e
        if not v > 0 or v != v or v == float("inf"):
            raise InputError(f"loads must be positive, not {item!r}")
        out.append(Load(fraction=v / 100.0) if item.endswith("%") else Load(qps=v))
    if not out:
        raise InputError("no loads given")
    return out


def measure(
    dep: Deployment,
    loads: Sequence[Load],
    *,
    duration_s: float,
    warmup_s: float,
    concurrency: int = 32,
    closed: bool = True,
    loadgen_cpus: Sequence[int] | None = None,
) -> dict[str, Any]:
    """Closed-loop saturation (if ``closed`` or a load is relative to it), then each open-loop
    load: ``{"saturation_qps", "closed_loop": total | None, "open_loop": [{"qps", "fraction",
    **total}]}`` with musku_loadgen's totals (achieved_qps, ok, errors, codes, latency_us)."""
    out: dict[str, Any] = {"saturation_qps": None, "closed_loop": None, "open_loop": []}

    def load(spec: LoadSpec) -> dict[str, Any]:
        dep.check_alive()
        r = run_load(dep.midtier.address, dep.service, dep.load_data, spec, cpus=loadgen_cpus)
        dep.check_alive()  # errors because a tier died are that tier's fault: name it
        return r

    if closed or any(x.fraction is not None for x in loads):
        r = load(LoadSpec(mode="closed", duration_s=duration_s, warmup_s=warmup_s,
                          concurrency=concurrency))  # fmt: skip
        out["closed_loop"] = dict(r["total"], concurrency=concurrency)
        out["saturation_qps"] = float(r["total"]["achieved_qps"])
        if not out["saturation_qps"] > 0:
            raise HostError(f"{dep.service} answered nothing in the closed loop: {r['total']}")
    for x in loads:
        q = x.resolve(out["saturation_qps"])
        r = load(LoadSpec(qps=q, duration_s=duration_s, warmup_s=warmup_s))
        out["open_loop"].append({"qps": q, "fraction": x.fraction, **r["total"]})
    return out


# ------------------------------------------------------------------------------------------
# Deployments


@dataclass
class Deployment:
    """A running service: leaves + mid-tier (+ the leaves' backends: Router's memcacheds).
    ``stop()`` (or leaving ``deploy()``'s context) ends all; the exit statuses stay in
    ``exit_codes``."""

    service: str
    midtier: Proc
    leaves: list[Proc]
    workdir: Path
    load_data: Path  # what the load generator's plug-in reads
    extra: dict[str, Any] = field(default_factory=dict)
    backends: list[Proc] = field(default_factory=list)  # backends[i] serves leaves[i]
    exit_codes: dict[str, int] = field(default_factory=dict)

    def stop(self) -> dict[str, int]:
        """Mid-tier first, then leaves, then backends; idempotent. Name -> exit status."""
        for p in [self.midtier, *self.leaves, *self.backends]:
            self.exit_codes[p.name] = p.stop()
        return dict(self.exit_codes)

    def check_alive(self) -> None:
        """HostError naming the first tier that has exited (with its log's last lines)."""
        for p in [self.midtier, *self.leaves, *self.backends]:
            rc = p.popen.poll()
            if rc is not None:
                how = f"exited with status {rc}" if rc >= 0 else f"was killed by signal {-rc}"
                raise HostError(f"{self.service} {p.name} {how}: {_tail(p.log)} (log {p.log})")

    def stats(self, reset: bool = False) -> dict[str, Any]:
        return admin(self.midtier.address, "stats", *(["--reset"] if reset else []))

    def placement(self) -> dict[str, list[int]]:
        """Process name -> the CPUs it may run on."""
        out = {}
        for p in [self.midtier, *self.leaves, *self.backends]:
            try:
                out[p.name] = sorted(os.sched_getaffinity(p.pid))
            except OSError:
                out[p.name] = []
        return out


@contextlib.contextmanager
def deploy(
    service: str,
    *,
    workdir: Path,
    data_dir: Path,
    shards: int = 2,
    threading: str = "async-dispatch-block",
    pollers: int = 1,
    workers: int = 2,
    responders: int = 1,
    table: Path | None = None,
    leaf_threading: str = "sync-inline-block",
    server_cpus: Sequence[int] | None = None,
    leaf_timeout_ms: int = 1000,
    leaf_transport: str = "unary",
    data_opts: dict[str, Any] | None = None,
    max_pools: tuple[int, int, int] = (4, 8, 4),
    leaf_args: Sequence[str] = (),
    midtier_args: Sequence[str] = (),
    start_timeout_s: float = 120.0,
) -> Iterator[Deployment]:
    """Start a service's tiers, yield the deployment, stop everything (also when a start fails
    half-way or the body raises).

    Order: data (generated once and cached under ``data_dir``, see ``deployments``), then per
    leaf its backend (Router: a memcached on a free port) and the leaf, each waited for (Health
    through ``musku_admin``), then the mid-tier. ``data_opts`` are the service's options
    (``deployments.RECIPES[service].options``; unknown ones are an InputError before anything
    starts); ``leaf_args``/``midtier_args`` are extra flags for those binaries.
    """
    rec = recipe(service)
    if shards < 1:
        raise InputError("shards must be >= 1")
    if leaf_transport not in LEAF_TRANSPORTS:
        raise InputError(
            f"unknown leaf transport {leaf_transport!r}; one of {', '.join(LEAF_TRANSPORTS)}"
        )
    opts = rec.resolve(data_opts)
    for b in (*rec.binaries, "musku_admin"):
        binary(b)
    if rec.backend == "memcached":
        memcached_binary()
    if table is not None and not Path(table).is_file():
        raise InputError(f"decision table {table} does not exist")
    workdir.mkdir(parents=True, exist_ok=True)
    data = rec.prepare(Path(data_dir), workdir, opts)
    backends: list[Proc] = []
    leaves: list[Proc] = []
    dep: Deployment | None = None
    try:
        for s in range(shards):
            backend = None
            if rec.backend == "memcached":
                backends.append(start_memcached(f"memcached{s}", workdir, cpus=server_cpus,
                                                memory_mb=opts["memcached_mb"]))  # fmt: skip
                backend = backends[-1].address
            argv = [str(binary(rec.leaf)), *rec.leaf_argv(data, opts, s, shards, backend),
                    "--threading", leaf_threading, "--pollers", "1", *leaf_args]  # fmt: skip
            leaves.append(start_server(f"leaf{s}", argv, workdir, cpus=server_cpus,
                                       timeout=start_timeout_s))  # fmt: skip
        argv = [
            str(binary(rec.midtier)),
            *rec.midtier_argv(data, opts, shards),
            "--leaves", ",".join(p.address for p in leaves),
            "--leaf-timeout-ms", str(leaf_timeout_ms),
            "--leaf-transport", leaf_transport,
            "--max-pollers", str(max_pools[0]),
            "--max-workers", str(max_pools[1]),
            "--max-responders", str(max_pools[2]),
        ]  # fmt: skip
        if table is not None:
            argv += ["--threading", "auto", "--threading-table", str(table)]
        else:
            argv += ["--threading", threading, "--pollers", str(pollers), "--workers",
                     str(workers), "--responders", str(responders)]  # fmt: skip
        argv += list(midtier_args)
        mid = start_server("midtier", argv, workdir, cpus=server_cpus, timeout=start_timeout_s)
        extra: dict[str, Any] = dict(data.files)
        if backends:
            extra["memcached"] = [p.address for p in backends]
        dep = Deployment(service, mid, leaves, workdir, data.load_data, extra, backends)
        yield dep
    finally:
        if dep is not None:
            dep.stop()
        else:  # a start failed half-way: stop what did start
            for p in [*leaves, *backends]:
                p.stop()


def default_data_dir() -> Path:
    env = os.environ.get("MUSKU_DATA_DIR")
    if env:
        return Path(env)
    return Path(user_cache_dir("musku")) / "services"


def check_service(service: str) -> None:
    """InputError (one line, the services listed) unless ``service`` can be deployed."""
    recipe(service)


__all__ = [
    "SERVICES",
    "THREADING_MODELS",
    "Deployment",
    "Load",
    "LoadSpec",
    "MuskuError",
    "Proc",
    "admin",
    "binary",
    "build",
    "build_dir",
    "deploy",
    "idle_cpu_percent",
    "measure",
    "memcached_stats",
    "parse_load_list",
    "run_load",
    "start_memcached",
    "set_threading",
    "setalgebra_data",
]
