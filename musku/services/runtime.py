"""Run the C++ services from Python: find the binaries, start tiers, wait for health, drive
load with ``musku_loadgen``, talk to the Admin RPC through ``musku_admin``, stop everything.

Nothing here spells a port: servers bind port 0 and report it through ``--port-file``.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from musku.errors import HostError, InputError, MuskuError, UnsupportedError

REPO = Path(__file__).resolve().parents[2]
SERVICES_SRC = REPO / "services"

THREADING_MODELS: tuple[str, ...] = tuple(
    f"{leaf}-{disp}-{wait}"
    for leaf in ("sync", "async")
    for disp in ("inline", "dispatch")
    for wait in ("block", "poll")
)


def parse_cpus(text: str) -> list[int] | None:
    """A CPU list such as ``"0,1"`` for pinning (``""`` = not pinned)."""
    try:
        return [int(x) for x in text.split(",") if x.strip()] or None
    except ValueError as e:
        raise InputError(f"CPU lists are comma-separated integers, not {text!r}") from e


def build_dir() -> Path:
    """Release build directory (``MUSKU_SERVICES_BUILD`` overrides services/build)."""
    env = os.environ.get("MUSKU_SERVICES_BUILD")
    return Path(env) if env else SERVICES_SRC / "build"


_BINARIES = {
    "musku_admin": "framework/musku_admin",
    "musku_loadgen": "loadgen/musku_loadgen",
    "setalgebra_leaf": "setalgebra/setalgebra_leaf",
    "setalgebra_midtier": "setalgebra/setalgebra_midtier",
    "setalgebra_gen": "setalgebra/setalgebra_gen",
    "setalgebra_client": "setalgebra/setalgebra_client",
}


def binary(name: str) -> Path:
    """Path of a built binary; UnsupportedError with the fix if it is not built."""
    rel = _BINARIES.get(name, name)
    path = build_dir() / rel
    if not path.is_file() or not os.access(path, os.X_OK):
        raise UnsupportedError(
            f"{name} is not built ({path} missing): run `musku services build` "
            "or scripts/build-services"
        )
    return path


def build(*, test: bool = False, jobs: int = 2) -> None:
    """Configure and build release + ASan/UBSan (scripts/build-services)."""
    script = REPO / "scripts" / "build-services"
    if not script.is_file():
        raise UnsupportedError(f"{script} not found: not a musku source checkout")
    env = dict(os.environ, MUSKU_JOBS=str(jobs))
    args = [str(script)] + (["--test"] if test else [])
    rc = subprocess.call(args, env=env)
    if rc != 0:
        raise HostError(f"scripts/build-services failed with exit status {rc}")


# ------------------------------------------------------------------------------------------
# Processes


@dataclass
class Proc:
    """One server process we started."""

    name: str
    popen: subprocess.Popen[bytes]
    port: int
    log: Path

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def pid(self) -> int:
        return self.popen.pid

    def stop(self, timeout: float = 10.0) -> int:
        """SIGTERM, wait (orderly shutdown), SIGKILL only if it hangs. Returns the exit status."""
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGTERM)
            try:
                self.popen.wait(timeout)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait()
        return self.popen.returncode

    def log_tail(self, lines: int = 5) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""


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
    affinity = set(cpus) if cpus else None

    def _pre() -> None:
        if affinity:
            os.sched_setaffinity(0, affinity)

    with open(log, "wb") as logf:
        popen = subprocess.Popen(
            [*argv, "--port-file", str(port_file)],
            stdout=logf,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            preexec_fn=_pre if affinity else None,
        )
    deadline = time.monotonic() + timeout
    while not port_file.exists():
        if popen.poll() is not None:
            tail = log.read_text(errors="replace").strip().splitlines()[-3:]
            raise HostError(f"{name} exited with status {popen.returncode}: {' | '.join(tail)}")
        if time.monotonic() > deadline:
            popen.kill()
            popen.wait()
            raise HostError(f"{name} did not start within {timeout:.0f} s (see {log})")
        time.sleep(0.05)
    port = int(port_file.read_text().strip())
    proc = Proc(name, popen, port, log)
    admin(proc.address, "wait-healthy", "--timeout-ms", str(int(max(1.0, timeout) * 1000)))
    return proc


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


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process (psutil)."""
    import psutil

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
) -> dict[str, Any]:
    """Drive ``address`` with musku_loadgen; return its JSON result."""
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as tf:
        out = Path(tf.name)
    argv = [
        str(binary("musku_loadgen")),
        "--target", address,
        "--service", service,
        "--data", str(data),
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


# ------------------------------------------------------------------------------------------
# Deployments


@dataclass
class Deployment:
    """A running service: leaves + mid-tier. ``stop()`` (or the context manager) ends all."""

    service: str
    midtier: Proc
    leaves: list[Proc]
    workdir: Path
    load_data: Path  # what the load generator's plug-in reads
    extra: dict[str, Any] = field(default_factory=dict)

    def stop(self) -> dict[str, int]:
        codes = {self.midtier.name: self.midtier.stop()}
        for leaf in self.leaves:
            codes[leaf.name] = leaf.stop()
        return codes

    def stats(self, reset: bool = False) -> dict[str, Any]:
        return admin(self.midtier.address, "stats", *(["--reset"] if reset else []))

    def placement(self) -> dict[str, list[int]]:
        out = {}
        for p in [self.midtier, *self.leaves]:
            try:
                out[p.name] = sorted(os.sched_getaffinity(p.pid))
            except OSError:
                out[p.name] = []
        return out


def setalgebra_data(
    data_dir: Path,
    *,
    corpus: str = "synth",
    docs: int = 1_000_000,
    terms: int = 20_000,
    queries: int = 10_000,
    seed: int = 1,
) -> tuple[Path, Path]:
    """Generate (once, cached by parameters) the Set Algebra index and queries."""
    if corpus not in ("synth", "wordnet"):
        raise InputError(f"corpus is 'synth' or 'wordnet', not {corpus!r}")
    tag = (
        f"{corpus}-{docs}-{terms}-{queries}-{seed}"
        if corpus == "synth"
        else f"wordnet-{queries}-{seed}"
    )
    out = Path(data_dir) / "setalgebra" / tag
    index, qfile = out / "index.msai", out / "queries.txt"
    if index.is_file() and qfile.is_file():
        return index, qfile
    out.mkdir(parents=True, exist_ok=True)
    argv = [str(binary("setalgebra_gen")), corpus, "--out", str(out), "--queries", str(queries),
            "--seed", str(seed)]  # fmt: skip
    if corpus == "synth":
        argv += ["--docs", str(docs), "--terms", str(terms)]
    cp = subprocess.run(argv, capture_output=True, text=True, timeout=600)
    if cp.returncode != 0:
        raise InputError(f"setalgebra_gen: {cp.stderr.strip()}")
    return index, qfile


SERVICES = ("setalgebra",)


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
    data_opts: dict[str, Any] | None = None,
    max_pools: tuple[int, int, int] = (4, 8, 4),
    leaf_args: Sequence[str] = (),
) -> Iterator[Deployment]:
    """Start a service's tiers (leaves first), yield the deployment, stop everything."""
    if service not in SERVICES:
        raise InputError(
            f"unknown service {service!r}; services with a Python deployment: {', '.join(SERVICES)}"
        )
    if shards < 1:
        raise InputError("shards must be >= 1")
    index, queries = setalgebra_data(data_dir, **(data_opts or {}))
    workdir.mkdir(parents=True, exist_ok=True)
    leaves: list[Proc] = []
    mid: Proc | None = None
    try:
        for s in range(shards):
            leaves.append(
                start_server(
                    f"leaf{s}",
                    [
                        str(binary("setalgebra_leaf")),
                        "--index",
                        str(index),
                        "--shard",
                        str(s),
                        "--shards",
                        str(shards),
                        "--threading",
                        leaf_threading,
                        "--pollers",
                        "1",
                        *leaf_args,
                    ],
                    workdir,
                    cpus=server_cpus,
                )  # fmt: skip
            )
        argv = [
            str(binary("setalgebra_midtier")),
            "--leaves", ",".join(p.address for p in leaves),
            "--leaf-timeout-ms", str(leaf_timeout_ms),
            "--max-pollers", str(max_pools[0]),
            "--max-workers", str(max_pools[1]),
            "--max-responders", str(max_pools[2]),
        ]  # fmt: skip
        if table is not None:
            argv += ["--threading", "auto", "--threading-table", str(table)]
        else:
            argv += ["--threading", threading, "--pollers", str(pollers), "--workers",
                     str(workers), "--responders", str(responders)]  # fmt: skip
        mid = start_server("midtier", argv, workdir, cpus=server_cpus)
        dep = Deployment(service, mid, leaves, workdir, queries, {"index": index})
        yield dep
    finally:
        if mid is not None:
            mid.stop()
        for p in leaves:
            p.stop()


def default_data_dir() -> Path:
    env = os.environ.get("MUSKU_DATA_DIR")
    if env:
        return Path(env)
    from platformdirs import user_cache_dir

    return Path(user_cache_dir("musku")) / "services"


def check_service(service: str) -> None:
    if service not in SERVICES:
        raise InputError(f"unknown service {service!r}; one of: {', '.join(SERVICES)}")


__all__ = [
    "THREADING_MODELS",
    "Deployment",
    "LoadSpec",
    "MuskuError",
    "Proc",
    "admin",
    "binary",
    "build",
    "deploy",
    "idle_cpu_percent",
    "run_load",
    "set_threading",
    "setalgebra_data",
]
