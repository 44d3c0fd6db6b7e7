"""``musku qsim profile SERVICE``: a qsim model of a μSuite service, measured from its deployment.

The service is deployed as ``musku services`` deploys it (``musku.services.runtime.deploy``:
leaves, then the mid-tier, all pinned to ``server_cpus``) and driven by ``musku_loadgen`` at a low
open-loop rate. Everything the model holds comes from the servers' own statistics (Admin
``Stats``): process CPU time (``getrusage``, less the idle rate measured before the load), and the
framework's per-phase times (``phases``: queue, handler, leaf_wait, finalize; wall-time histograms
and the handler threads' CPU time, ``services/framework``), plus the load generator's end-to-end
latency. The model (docs/qsim.md, "Profiling a μSuite service"):

- one machine, ``server`` (the servers' CPUs as cores);
- the leaves: one service, one single-thread instance per shard (leaves run ``sync-inline-block``
  with one poller), stages ``rpc`` (the process's CPU per call less the handler's, constant) and
  ``handle`` (the handler's measured distribution, scaled to its CPU time);
- the mid-tier as its threading model runs it: a poller pool (``recv``: half the RPC overhead),
  for dispatch models a worker pool (``process``), for async models a response pool (``reply``:
  the other half, and ``finalize``), or for sync models the worker (or poller) holding its thread
  through the leaf calls and finalising on it;
- paths: recv -> process -> the leaves (``copies`` = shards) -> a fan-in that finalises;
- hops: a leaf call's hop is half of what the mid-tier waited beyond the slowest leaf's time, and
  the client's hops are what is left of the measured mean latency once the model's own (simulated
  at the profiled rate) is taken off. The zero-load mean is therefore fitted; the queueing at higher
  loads and the saturation point are predicted.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import psutil

from musku.errors import HostError, InputError, UnsupportedError
from musku.hostfs import HostFS, HostFSError, proc_pid
from musku.qsim.engine import simulate
from musku.qsim.model import load
from musku.qsim.overrides import with_overrides
from musku.services import runtime

# Services whose mid-tier sends every request to every leaf (the model's fan-out to all shards).
PROFILED = ("setalgebra", "hdsearch", "recommend")


@dataclass
class Tier:
    """One server process's figures over the measured window."""

    name: str
    requests: int
    cpu_per_request_us: float  # process CPU (user + sys) less the idle rate, per counted RPC
    idle_cpu_pct: float
    latency_mean_us: float
    phases: dict[str, dict[str, Any]]  # name -> count, mean_us, cpu_mean_us, buckets [[us, n]]
    switches_per_request: float = 0.0  # voluntary + involuntary context switches of its threads


@dataclass(frozen=True)
class RatePoint:
    """One measured window: its achieved rate and, per tier (mid-tier, then the leaves), the CPU
    and the context switches (wake-ups) per request; ``deep``: a closed loop (deep queues)."""

    qps: float
    cpu_us: tuple[float, ...]
    switches: tuple[float, ...]
    deep: bool = False


@dataclass
class Profile:
    service: str
    qps: float
    shards: int
    threading: str
    pollers: int
    workers: int
    responders: int
    cores: int
    client: dict[str, Any]  # mean_us, p50_us, p99_us, achieved_qps, buckets [[us, n]]
    midtier: Tier
    leaves: list[Tier]
    background_cpu_pct: float | None  # the server CPUs' busy time not ours (None: unknown)
    qps_high: float = 0.0  # the second, higher rate (amortised per-request CPU)
    cpu_per_request_high_us: float = 0.0  # all tiers, at qps_high
    high_tiers: list[float] = field(default_factory=list)  # per tier (mid-tier, leaves) at qps_high
    nice: int = 0  # the servers' threads' nice value while measured
    notes: list[str] = field(default_factory=list)
    # every measured window (low, high, deep); with switch counts the fit has a per-wake-up term
    points: list[RatePoint] = field(default_factory=list)


def _phases(stats: dict[str, Any]) -> dict[str, dict[str, Any]]:
    out = {}
    for p in stats.get("phases", []):
        out[p["name"]] = {
            "count": int(p["count"]),
            "mean_us": float(p["mean_us"]),
            "cpu_mean_us": float(p["cpu_mean_us"]),
            "buckets": [[int(b["upper_ns"]) / 1000.0, int(b["count"])] for b in p["buckets"]],
        }
    return out


def process_cpu_s(stats: dict[str, Any]) -> float:
    return float(stats["cpu_user_s"]) + float(stats["cpu_sys_s"])


def proc_cpu_s(fs: HostFS, pid: int) -> float:
    """A process's own CPU time (all its threads, user + system) from ``/proc/PID/stat``
    (utime and stime, fields 14 and 15, in clock ticks)."""
    text = fs.read_text(proc_pid(pid, "stat"))
    rest = text[text.rindex(")") + 2 :].split()  # the command name may hold spaces and ')'
    return (int(rest[11]) + int(rest[12])) / os.sysconf("SC_CLK_TCK")


def context_switches(fs: HostFS, pid: int) -> int:
    """Voluntary + involuntary context switches of all a process's threads (``/proc/PID/task/
    TID/status``; the process's own status counts its main thread only) that are alive now: an
    ended thread's switches leave with it (the servers' thread pools live as long as they do).
    A thread that ends meanwhile is skipped."""
    total = 0
    for tid in fs.listdir(proc_pid(pid, "task")):
        try:
            text = fs.read_text(proc_pid(pid, "task", tid, "status"))
        except HostFSError:
            continue
        for line in text.splitlines():
            key, _, value = line.partition(":")
            if key in ("voluntary_ctxt_switches", "nonvoluntary_ctxt_switches"):
                total += int(value)
    return total


@dataclass(frozen=True)
class CpuFit:
    """CPU per request of a tier at a rate: ``per_request + per_wakeup x wake-ups per request
    + per_second / rate`` (us; wake-ups = the tier's context switches per request)."""

    per_request_us: float
    per_wakeup_us: float
    per_second_us: float

    def at(self, qps: float, wakeups_per_request: float) -> float:
        return (
            self.per_request_us
            + self.per_wakeup_us * wakeups_per_request
            + self.per_second_us / max(1e-9, qps)
        )


def fit_cpu(
    qps: Sequence[float],
    cpu_us: Sequence[float],
    wakeups: Sequence[float] | None = None,
    *,
    floor_us: float = 0.0,
) -> CpuFit:
    """Fit c = a + w s + b / r to the measured windows (rate r, CPU c and wake-ups s per request)
    with a >= ``floor_us`` (the handlers' own CPU), w >= 0 and b >= 0: non-negative least squares
    (every subset of the three terms solved, the best feasible one kept). The per-wake-up term
    needs switch counts that differ between three or more windows; without it, two windows give
    c = a + b / r through both (a clamped to [floor, c at the lower rate]), as the profile did."""
    r = np.asarray(qps, dtype=float)
    c = np.asarray(cpu_us, dtype=float)
    s = np.zeros_like(r) if wakeups is None else np.asarray(wakeups, dtype=float)
    if len(r) == 0:
        return CpuFit(floor_us, 0.0, 0.0)
    lo = int(np.argmin(r))
    if float(np.ptp(r)) <= 0:
        return CpuFit(float(np.mean(c)), 0.0, 0.0)
    use_w = len(r) >= 3 and float(np.ptp(s)) > 0
    if not use_w and len(r) == 2:
        hi = 1 - lo
        r1, c1, r2, c2 = float(r[lo]), float(c[lo]), float(r[hi]), float(c[hi])
        a = min(c1, max(floor_us, (c2 * r2 - c1 * r1) / (r2 - r1)))
        return CpuFit(a, 0.0, max(0.0, (c1 - a) * r1))
    cols = [np.ones_like(r), s, 1.0 / np.maximum(r, 1e-9)]
    y = c - floor_us
    best: tuple[float, list[float]] | None = None
    for mask in range(1, 8):
        idx = [i for i in range(3) if mask >> i & 1]
        if 1 in idx and not use_w:
            continue
        x, *_ = np.linalg.lstsq(np.column_stack([cols[i] for i in idx]), y, rcond=None)
        if float(np.min(x)) < 0:
            continue
        coef = [0.0, 0.0, 0.0]
        for i, v in zip(idx, x, strict=True):
            coef[i] = float(v)
        resid = float(np.sum((y - sum(coef[i] * cols[i] for i in range(3))) ** 2))
        if best is None or resid < best[0] * (1 - 1e-9):
            best = (resid, coef)
    if best is None:  # no term fits with a non-negative coefficient: all at the floor
        return CpuFit(floor_us, 0.0, 0.0)
    a, w, b = best[1]
    return CpuFit(a + floor_us, w, b)


def _cpu_busy(cpus: Sequence[int]) -> float | None:
    """Busy seconds of these CPUs since boot (psutil's per-CPU times, as the host sampler in
    musku.metrics.host counts them: everything but idle and iowait), or None."""
    try:
        per_cpu = psutil.cpu_times(percpu=True)
    except OSError:
        return None
    busy = 0.0
    for c in cpus:
        if not 0 <= c < len(per_cpu):
            return None
        t = per_cpu[c]
        busy += t.user + t.nice + t.system + t.irq + t.softirq + getattr(t, "steal", 0.0)
    return busy


_SPIN = """
import os, sys, time
os.sched_setaffinity(0, {int(c) for c in sys.argv[1].split(",")})
os.setpriority(os.PRIO_PROCESS, 0, int(sys.argv[2]))
end = time.monotonic() + float(sys.argv[3])
c0, w0 = time.process_time(), time.monotonic()
while time.monotonic() < end:
    pass
print((time.process_time() - c0) / (time.monotonic() - w0))
"""


def cpu_share(cpus: Sequence[int], *, nice: int = 0, seconds: float = 0.5) -> float:
    """The share of one of ``cpus`` a busy thread gets now (a spinning probe pinned there at
    ``nice``): what the other processes on a shared machine leave to the servers."""
    cp = subprocess.run(
        [sys.executable, "-c", _SPIN, ",".join(map(str, cpus)), str(nice), str(seconds)],
        capture_output=True,
        text=True,
        timeout=60 + seconds * 10,
    )
    try:
        return min(1.0, max(0.01, float(cp.stdout.strip())))
    except ValueError:
        return 1.0


def with_share(doc: dict[str, Any], share: float, fixed: float) -> dict[str, Any]:
    """A profiled model's engine document on a core of which the servers get ``share`` (and spend
    ``fixed`` of a core on their per-second costs while loaded): its server services' stages
    (``dvfs_scale = 1``) slow by 1 / (share - fixed)."""
    out = dict(doc)
    ratio = 1.0 / max(1e-3, share - fixed)
    out["services"] = [
        dict(s, freq_ratio=ratio) if s["name"] != "client_delay" else s for s in doc["services"]
    ]
    return out


def _tier(
    name: str, before: dict[str, Any], after: dict[str, Any], idle_rate: float, switches: int = 0
) -> Tier:
    n = int(after["requests"])
    wall = float(after["window_s"])
    cpu = process_cpu_s(after) - process_cpu_s(before) - idle_rate * wall
    return Tier(
        name=name,
        requests=n,
        cpu_per_request_us=max(0.0, cpu) / n * 1e6 if n else 0.0,
        idle_cpu_pct=idle_rate * 100,
        latency_mean_us=float(after["latency"]["mean_us"]),
        phases=_phases(after),
        switches_per_request=switches / n if n else 0.0,
    )


def measure(
    service: str,
    *,
    workdir: Path,
    data_dir: Path,
    qps: float = 100.0,
    duration_s: float = 10.0,
    idle_s: float = 2.0,
    shards: int = 2,
    threading: str = "async-dispatch-block",
    pollers: int = 1,
    workers: int = 2,
    responders: int = 1,
    server_cpus: Sequence[int] | None = (0,),
    loadgen_cpus: Sequence[int] | None = None,
    data_opts: dict[str, Any] | None = None,
    leaf_transport: str = "unary",
    qps_high: float | None = None,
    nice: int = 0,
    deep_users: int = 32,
) -> Profile:
    """Deploy ``service``, measure it at ``qps``, ``qps_high`` and in a closed loop of
    ``deep_users`` (0: not) and return the figures."""
    if service not in PROFILED:
        raise UnsupportedError(
            f"musku qsim profile models services whose mid-tier calls every leaf "
            f"({', '.join(PROFILED)}), not {service!r}"
        )
    if threading.endswith("-poll"):
        raise UnsupportedError(
            f"{threading}: busy-polling threads are not modelled; profile a -block model"
        )
    if leaf_transport != "unary":
        raise UnsupportedError("the batch leaf transport is not modelled; profile unary")
    if not qps > 0:
        raise InputError(f"--qps must be positive, not {qps}")
    with runtime.deploy(
        service,
        workdir=workdir,
        data_dir=data_dir,
        shards=shards,
        threading=threading,
        pollers=pollers,
        workers=workers,
        responders=responders,
        server_cpus=server_cpus,
        data_opts=data_opts,
        leaf_transport=leaf_transport,
    ) as dep:
        return measure_deployment(
            dep,
            qps=qps,
            duration_s=duration_s,
            idle_s=idle_s,
            threading=threading,
            pools=(pollers, workers, responders),
            server_cpus=server_cpus,
            loadgen_cpus=loadgen_cpus,
            qps_high=qps_high,
            nice=nice,
            deep_users=deep_users,
        )


def renice(dep: Any, nice: int) -> None:
    """Set every thread of the deployment's servers to ``nice`` (a thread's nice value is its own:
    the threads already exist). Negative values need root; HostError if refused."""
    for proc in [dep.midtier, *dep.leaves]:
        for thread in psutil.Process(proc.pid).threads():
            try:
                os.setpriority(os.PRIO_PROCESS, thread.id, nice)
            except PermissionError as e:
                raise HostError(f"cannot set nice {nice} on {proc.name}: {e.strerror}") from None
            except ProcessLookupError:
                pass


def _window(
    dep: Any,
    qps: float,
    duration_s: float,
    cpus: Sequence[int] | None,
    loadgen_cpus: Sequence[int] | None,
    *,
    users: int = 0,
    fs: HostFS | None = None,
) -> tuple[list[dict[str, Any]], list[dict[str, Any]], dict[str, Any], float | None, list[int]]:
    """Stats (reset) before, the load (open loop at ``qps``, or a closed loop of ``users``), stats
    after; also the CPUs' busy seconds not ours and each server's context switches."""
    fs = fs or HostFS(read_only=True)
    tiers = [dep.midtier, *dep.leaves]
    before = [runtime.admin(p.address, "stats", "--reset") for p in tiers]
    sw0 = [context_switches(fs, p.pid) for p in tiers]
    busy0 = _cpu_busy(cpus) if cpus else None
    t0 = time.monotonic()
    if users:
        spec = runtime.LoadSpec(mode="closed", duration_s=duration_s, warmup_s=0.0,
                                concurrency=users)  # fmt: skip
    else:
        spec = runtime.LoadSpec(qps=qps, duration_s=duration_s, warmup_s=0.0)
    r = runtime.run_load(dep.midtier.address, dep.service, dep.load_data, spec, cpus=loadgen_cpus)
    after = [runtime.admin(p.address, "stats") for p in tiers]
    sw1 = [context_switches(fs, p.pid) for p in tiers]
    wall = time.monotonic() - t0
    busy1 = _cpu_busy(cpus) if cpus else None
    dep.check_alive()
    other = None
    if busy0 is not None and busy1 is not None and cpus:
        ours = sum(process_cpu_s(b) - process_cpu_s(a) for a, b in zip(before, after, strict=True))
        other = max(0.0, (busy1 - busy0 - ours) / wall / len(cpus) * 100)
    tot = r["total"]
    if int(tot.get("errors", 0)):
        what = f"{users} closed-loop users" if users else f"{qps:g} QPS"
        raise InputError(f"{dep.service} answered {tot['errors']} errors at {what}: {tot}")
    return before, after, tot, other, [b - a for a, b in zip(sw0, sw1, strict=True)]


def measure_deployment(
    dep: Any,
    *,
    qps: float,
    duration_s: float,
    threading: str,
    pools: tuple[int, int, int],
    server_cpus: Sequence[int] | None,
    loadgen_cpus: Sequence[int] | None,
    idle_s: float = 2.0,
    qps_high: float | None = None,
    nice: int = 0,
    deep_users: int = 32,
    fs: HostFS | None = None,
) -> Profile:
    """Measure a running deployment (``runtime.deploy``'s) at ``qps``: warm-up, idle CPU, load at
    ``qps``, at ``qps_high`` and (``deep_users`` > 0) a closed loop of that many users, where the
    queues are deep and a woken thread takes many requests: the three windows' CPU and context
    switches per request give the fit its per-wake-up cost (:func:`fit_cpu`)."""
    fs = fs or HostFS(read_only=True)
    service = dep.service
    pollers, workers, responders = pools
    dispatch = "-dispatch-" in threading
    tiers = [dep.midtier, *dep.leaves]
    if nice:
        renice(dep, nice)
    spec = runtime.LoadSpec(qps=qps, duration_s=1.0, warmup_s=0.5)
    runtime.run_load(dep.midtier.address, service, dep.load_data, spec, cpus=loadgen_cpus)
    idle0 = [runtime.admin(p.address, "stats", "--reset") for p in tiers]
    time.sleep(idle_s)
    idle1 = [runtime.admin(p.address, "stats", "--reset") for p in tiers]
    idle_rates = [
        max(0.0, (process_cpu_s(b) - process_cpu_s(a)) / max(1e-3, float(b["window_s"])))
        for a, b in zip(idle0, idle1, strict=True)
    ]

    def tiers_of(
        win: tuple[list[dict[str, Any]], list[dict[str, Any]], Any, Any, list[int]],
    ) -> list[Tier]:
        return [
            _tier(p.name, a, b, rate, sw)
            for p, a, b, rate, sw in zip(tiers, win[0], win[1], idle_rates, win[4], strict=True)
        ]

    def point(ts: list[Tier], rate: float, deep: bool = False) -> RatePoint:
        return RatePoint(rate, tuple(t.cpu_per_request_us for t in ts),
                         tuple(t.switches_per_request for t in ts), deep)  # fmt: skip

    low = _window(dep, qps, duration_s, server_cpus, loadgen_cpus, fs=fs)
    tot, background = low[2], low[3]
    measured = tiers_of(low)
    low_total = sum(t.cpu_per_request_us for t in measured)
    # the second rate: half a core at the low rate's cost per request (costs fall with load)
    q2 = qps_high if qps_high is not None else 0.5e6 / max(1.0, low_total)
    w2 = _window(dep, q2, max(2.0, duration_s / 2), server_cpus, loadgen_cpus, fs=fs)
    high = tiers_of(w2)
    points = [
        point(measured, float(tot["achieved_qps"]) or qps),
        point(high, float(w2[2]["achieved_qps"]) or q2),
    ]
    if deep_users > 0:
        w3 = _window(dep, 0.0, max(2.0, duration_s / 2), server_cpus, loadgen_cpus,
                     users=deep_users, fs=fs)  # fmt: skip
        points.append(point(tiers_of(w3), float(w3[2]["achieved_qps"]), deep=True))
    high_total = sum(t.cpu_per_request_us for t in high)
    lat = tot["latency_us"]
    mid = measured[0]
    notes: list[str] = []
    if "leaf_wait" not in mid.phases:
        raise UnsupportedError(
            f"{service}'s mid-tier reports no leaf_wait phase: rebuild the services "
            "(scripts/build-services) for the framework's phase statistics"
        )
    return Profile(
        service=service,
        qps=qps,
        shards=len(dep.leaves),
        threading=threading,
        pollers=pollers,
        workers=workers if dispatch else 0,
        responders=responders if threading.startswith("async") else 0,
        cores=len(server_cpus) if server_cpus else _ncpu(),
        client={
            "mean_us": float(lat["mean"]),
            "p50_us": float(lat["p50"]),
            "p99_us": float(lat["p99"]),
            "achieved_qps": float(tot["achieved_qps"]),
            "buckets": [[float(u), int(n)] for u, n in lat.get("buckets", [])],
        },
        midtier=mid,
        leaves=measured[1:],
        background_cpu_pct=background,
        qps_high=q2,
        cpu_per_request_high_us=high_total,
        high_tiers=[t.cpu_per_request_us for t in high],
        nice=nice,
        notes=notes,
        points=points,
    )


def _ncpu() -> int:
    return os.cpu_count() or 1


# ---- the model ---------------------------------------------------------------------------------


def _pooled(tiers: Sequence[Tier], phase: str) -> tuple[list[list[float]], float, float]:
    """Buckets, wall mean and CPU mean of ``phase`` pooled over ``tiers``."""
    merged: dict[float, int] = {}
    n = 0
    wall = cpu = 0.0
    for t in tiers:
        p = t.phases.get(phase)
        if not p:
            continue
        for ub, c in p["buckets"]:
            merged[ub] = merged.get(ub, 0) + c
        n += p["count"]
        wall += p["mean_us"] * p["count"]
        cpu += p["cpu_mean_us"] * p["count"]
    if n == 0:
        return [], 0.0, 0.0
    return [[ub, float(c)] for ub, c in sorted(merged.items())], wall / n, cpu / n


def _write_hist(path: Path, buckets: list[list[float]], what: str) -> None:
    lines = [f"# {what}: wall-time histogram (bucket upper bound us, count), Admin Stats phases"]
    lines += [f"{ub:.3f},{c:g}" for ub, c in buckets]
    path.write_text("\n".join(lines) + "\n")


def _time(mean_us: float, hist: Path | None) -> str:
    """A stage's ``time = ...``: the measured shape scaled to ``mean_us``, else a constant."""
    if hist is not None and mean_us > 0:
        return f'{{ dist = "empirical", file = "{hist.name}", mean_us = {mean_us:.3f} }}'
    return f'{{ dist = "const", mean_us = {max(0.0, mean_us):.3f} }}'


def _wake(us: float) -> str:
    """A wake stage's time: ``us`` for the whole batch (no cost per further job)."""
    return f'{{ dist = "const", mean_us = {us:.3f}, per_job_us = 0.0 }}'


@dataclass(frozen=True)
class Fit:
    """What went into the model (printed and kept in the model's header)."""

    leaf_rpc_us: float
    leaf_handle_us: float
    mid_recv_us: float
    mid_process_us: float
    mid_reply_us: float
    mid_finalize_us: float
    leaf_hop_us: float
    client_hop_us: float
    sim_zero_load_mean_us: float  # the model's mean at the profiled rate before the client hops
    fixed_cpu_share: float = 0.0  # CPU the servers spend per second while loaded (of a core)
    # the per-wake-up cost, paid once per batch by a "wake" stage (batch WAKE_BATCH) at the
    # head of each node: us per batch (mid-tier: the low rate's wake-up cost per request over
    # its mid_wake_batches nodes), the fitted us per context switch, and the low rate's
    # switches per request (a leaf: the mean of the leaves)
    mid_wakeup_us: float = 0.0
    leaf_wakeup_us: float = 0.0
    mid_per_switch_us: float = 0.0
    leaf_per_switch_us: float = 0.0
    mid_switches_per_request: float = 0.0
    leaf_switches_per_request: float = 0.0
    mid_wake_batches: int = 1


# A "wake" stage takes every request waiting at its node (up to this many) in one batch.
WAKE_BATCH = 1024


def _mid_wake_nodes(p: Profile) -> int:
    """The mid-tier's nodes that a thread takes from a queue (each a wake stage): recv (dispatch
    models), process, and the finalize of async models (sync ones finalise on the held thread)."""
    return (2 if p.workers > 0 else 1) + (1 if p.threading.startswith("async") else 0)


def _render(p: Profile, f: Fit, out: Path) -> str:
    stem = out.stem
    dispatch = p.workers > 0
    async_ = p.threading.startswith("async")
    bg = "unknown" if p.background_cpu_pct is None else f"{p.background_cpu_pct:.1f} %"
    lines = [
        f"# qsim model of {p.service}, written by `musku qsim profile {p.service}` "
        f"({time.strftime('%Y-%m-%d %H:%M')}).",
        f"# Measured at {p.qps:g} QPS open loop: client mean {p.client['mean_us']:.0f} us, "
        f"p50 {p.client['p50_us']:.0f} us, p99 {p.client['p99_us']:.0f} us.",
        f"# Mid-tier {p.threading} (pollers {p.pollers}, workers {p.workers}, responders "
        f"{p.responders}), {p.shards} leaves, servers on {p.cores} core(s); other processes "
        f"kept the servers' CPUs {bg} busy meanwhile.",
        f"# CPU per request: mid-tier {p.midtier.cpu_per_request_us:.1f} us, leaves "
        + ", ".join(f"{t.cpu_per_request_us:.1f}" for t in p.leaves)
        + " us (process CPU less the idle rate).",
        f"# At {p.qps_high:.0f} QPS: {p.cpu_per_request_high_us:.1f} us of CPU per request. Fit "
        f"a + b / rate per tier: the servers spend {f.fixed_cpu_share * 100:.1f} % of a core "
        "per second while loaded (b):",
        "# modelled as cores that much slower (freq_ghz, dvfs_scale = 1); stage times are a.",
        f"# Per wake-up (context switch; fit over {len(p.points) or 2} windows): mid-tier "
        f"{f.mid_per_switch_us:.1f} us x {f.mid_switches_per_request:.2f} switches per request "
        f"at {p.qps:g} QPS, leaf {f.leaf_per_switch_us:.1f} us x "
        f"{f.leaf_switches_per_request:.2f}: paid once per batch by each node's wake stage",
        f"# (mid-tier {f.mid_wakeup_us:.1f} us over {f.mid_wake_batches} nodes, leaf "
        f"{f.leaf_wakeup_us:.1f} us), so it falls per request as queues deepen.",
        f"# Hops fitted: leaf call {f.leaf_hop_us:.1f} us each way; the client's side "
        f"{2 * f.client_hop_us:.1f} us on average (model's own mean "
        f"{f.sim_zero_load_mean_us:.0f} us).",
        "[run]",
        "duration_s = 10.0",
        "warmup_s = 1.0",
        "seed = 1",
        "",
        "[network]",
        f"local_latency_us = {f.leaf_hop_us:.3f}",
        "latency_us = 0.0  # the client's side is the client_delay service",
        "",
        "[[machines]]",
        'name = "client"',
        "cores = 1",
        "",
        "[[machines]]",
        'name = "server"',
        f"cores = {p.cores}",
        "freq_base_ghz = 1.0",
        f"freq_ghz = {1 - f.fixed_cpu_share:.4f}",
        "",
    ]

    hl = out.with_name(f"{stem}.leaf_handle.csv")
    hp = out.with_name(f"{stem}.mid_process.csv")
    hf = out.with_name(f"{stem}.mid_finalize.csv")
    recv = ("recv", _time(f.mid_recv_us, None))
    process = ("process", _time(f.mid_process_us, hp if hp.exists() else None))
    fin = [
        ("reply", _time(f.mid_reply_us, None)),
        ("finalize", _time(f.mid_finalize_us, hf if hf.exists() else None)),
    ]
    mid_wake = [("wake", _wake(f.mid_wakeup_us))] if f.mid_wakeup_us > 0 else []
    leaf_wake = [("wake", _wake(f.leaf_wakeup_us))] if f.leaf_wakeup_us > 0 else []
    # name -> (threads, instances, stages): the leaves, then the mid-tier's thread pools
    pools: dict[str, tuple[int, int, list[tuple[str, str]]]] = {
        "leaf": (1, p.shards, [
            *leaf_wake,
            ("rpc", _time(f.leaf_rpc_us, None)),
            ("handle", _time(f.leaf_handle_us, hl if hl.exists() else None)),
        ]),
        "poller": (p.pollers, 1, [*mid_wake, recv] if dispatch else [*mid_wake, recv, process]),
    }  # fmt: skip
    if dispatch:
        pools["worker"] = (p.workers, 1, [*mid_wake, process])
    front = "worker" if dispatch else "poller"
    if async_ and p.responders > 0:
        fin_service = "responder"
        pools["responder"] = (p.responders, 1, [*mid_wake, *fin])
    else:  # async without response threads: the pollers finalise; sync: the calling thread
        fin_service = "poller" if async_ else front
        pools[fin_service][2].extend(fin)
    delay = out.with_name(f"{stem}.client_delay.csv")
    for name, (threads, instances, stages) in pools.items():
        lines.extend([
            "[[services]]",
            f'name = "{name}"',
            f"threads = {threads}",
            f"cores_per_instance = {min(threads, p.cores)}",
            f"instances = {instances}",
            'machines = ["server"]',
        ])  # fmt: skip
        for sname, t in stages:
            lines.extend(["", "  [[services.stages]]", f'  name = "{sname}"', f"  time = {t}",
                          "  dvfs_scale = 1.0"])  # fmt: skip
            if sname == "wake":
                lines.append(f"  batch = {WAKE_BATCH}")
        lines.append("")
    if delay.exists():
        lines.extend([
            "# The time outside the model (the client, its hops, scheduling on busy CPUs): the",
            "# measured end-to-end latencies at the low rate less the model's own mean, a pure",
            "# delay (every request its own thread).",
            "[[services]]",
            'name = "client_delay"',
            'execution = "simple"',
            "threads = 100000",
            'machines = ["client"]',
            "",
            "  [[services.stages]]",
            '  name = "delay"',
            f'  time = {{ dist = "empirical", file = "{delay.name}" }}',
            "",
        ])  # fmt: skip
    lines += ["[[paths]]", 'name = "query"', ""]
    if delay.exists():
        lines.extend([
            "  [[paths.nodes]]",
            '  name = "client"',
            '  service = "client_delay"',
            f'  children = ["{"recv" if dispatch else "process"}"]',
            "",
        ])  # fmt: skip

    def node(name: str, svc: str, stages: list[str], children: list[str], **kw: Any) -> None:
        lines.extend([
            "  [[paths.nodes]]",
            f'  name = "{name}"',
            f'  service = "{svc}"',
            "  stages = [" + ", ".join(f'"{s}"' for s in stages) + "]",
            "  children = [" + ", ".join(f'"{c}"' for c in children) + "]",
        ])  # fmt: skip
        for k, v in kw.items():
            lines.append(f"  {k} = {json.dumps(v)}")
        lines.append("")

    sync_hold = not async_
    mw = ["wake"] if mid_wake else []
    if dispatch:
        node("recv", "poller", [*mw, "recv"], ["process"])
        node("process", "worker", [*mw, "process"], ["leaf"], hold_thread=sync_hold)
    else:
        node("process", "poller", [*mw, "recv", "process"], ["leaf"], hold_thread=sync_hold)
    node("leaf", "leaf", ["wake", "rpc", "handle"] if leaf_wake else ["rpc", "handle"],
         ["finalize"], copies=p.shards)  # fmt: skip
    # a sync model finalises on the thread it holds (no queue, no wake-up)
    node("finalize", fin_service, [*(mw if async_ else []), "reply", "finalize"], [],
         gather=True, release_thread=sync_hold)  # fmt: skip
    lines += [
        "[client]",
        'kind = "open"',
        f"qps = {p.qps:g}",
        "connections = 64",
        "",
    ]
    return "\n".join(lines)


def write_model(p: Profile, out: Path, *, sim_seconds: float = 20.0) -> Fit:
    """Write the model (and its histogram files next to it); returns the fitted figures."""
    mid = p.midtier
    lb, _, lcpu = _pooled(p.leaves, "handler")
    mb, _, mcpu = _pooled([mid], "handler")
    fb, _, fcpu = _pooled([mid], "finalize")
    # Each tier's CPU per request, c = a + w s + b / rate over the measured windows (fit_cpu):
    # a per request, w per wake-up (s: the tier's context switches per request, which fall
    # with load as a woken thread takes more requests), b per second while loaded (timers,
    # cold caches). Without switch counts: c = a + b / rate through the two rates.
    lo = [mid.cpu_per_request_us] + [t.cpu_per_request_us for t in p.leaves]
    hi = p.high_tiers or lo
    pts = p.points or [
        RatePoint(p.qps, tuple(lo), tuple(0.0 for _ in lo)),
        RatePoint(p.qps_high, tuple(hi), tuple(0.0 for _ in hi)),
    ]
    low_pt = min(pts, key=lambda q: q.qps)
    per_req, per_s, per_wake = [], [], []
    fits: list[CpuFit] = []
    for t in range(len(lo)):
        floor = (mcpu + fcpu) if t == 0 else lcpu
        cf = fit_cpu([q.qps for q in pts], [q.cpu_us[t] for q in pts],
                     [q.switches[t] for q in pts], floor_us=floor)  # fmt: skip
        fits.append(cf)
        per_req.append(cf.per_request_us)
        per_s.append(cf.per_second_us)
        per_wake.append(cf.per_wakeup_us * low_pt.switches[t])  # us per request at the low rate
    mid_batches = _mid_wake_nodes(p)
    leaf_cpu = sum(per_req[1:]) / max(1, len(per_req) - 1)
    leaf_handle = min(lcpu, leaf_cpu)
    overhead = max(0.0, per_req[0] - mcpu - fcpu)
    fixed = min(0.9, sum(per_s) / 1e6 / p.cores)
    _, wait, _ = _pooled([mid], "leaf_wait")
    slowest_leaf = max(t.latency_mean_us for t in p.leaves)
    leaf_wake = sum(per_wake[1:]) / max(1, len(per_wake) - 1)
    leaf_hop = max(0.0, (wait - slowest_leaf - (leaf_cpu + leaf_wake - leaf_handle)) / 2)
    out.parent.mkdir(parents=True, exist_ok=True)
    stem = out.stem
    out.with_name(f"{stem}.client_delay.csv").unlink(missing_ok=True)  # fitted below
    for buckets, name, what in (
        (lb, "leaf_handle", "leaf handler"),
        (mb, "mid_process", "mid-tier Process"),
        (fb, "mid_finalize", "mid-tier Finalize"),
    ):
        f = out.with_name(f"{stem}.{name}.csv")
        if buckets:
            _write_hist(f, buckets, what)
        else:
            f.unlink(missing_ok=True)
    fit = Fit(
        leaf_rpc_us=leaf_cpu - leaf_handle,
        leaf_handle_us=leaf_handle,
        mid_recv_us=overhead / 2,
        mid_process_us=mcpu,
        mid_reply_us=overhead / 2,
        mid_finalize_us=fcpu,
        leaf_hop_us=leaf_hop,
        client_hop_us=0.0,
        sim_zero_load_mean_us=0.0,
        fixed_cpu_share=fixed,
        mid_wakeup_us=per_wake[0] / mid_batches,
        leaf_wakeup_us=leaf_wake,
        mid_per_switch_us=fits[0].per_wakeup_us,
        leaf_per_switch_us=sum(f.per_wakeup_us for f in fits[1:]) / max(1, len(fits) - 1),
        mid_switches_per_request=low_pt.switches[0],
        leaf_switches_per_request=sum(low_pt.switches[1:]) / max(1, len(fits) - 1),
        mid_wake_batches=mid_batches,
    )
    out.write_text(_render(p, fit, out))
    doc = with_overrides(load(out).engine, qps=p.qps, duration_s=sim_seconds)
    sim = simulate(doc)["latency"]["mean_us"]
    if p.client["mean_us"] < sim:
        p.notes.append(
            f"the model's own mean ({sim:.0f} us) is above the measured {p.client['mean_us']:.0f}"
            " us: no client delay"
        )
    rows = [(max(0.0, ub - sim), n) for ub, n in p.client.get("buckets", []) if n > 0]
    delay = out.with_name(f"{stem}.client_delay.csv")
    if rows and p.client["mean_us"] > sim:
        text = [f"# end-to-end latency at {p.qps:g} QPS less the model's own mean ({sim:.1f} us)"]
        delay.write_text("\n".join(text + [f"{d:.3f},{n:g}" for d, n in rows]) + "\n")
    else:
        delay.unlink(missing_ok=True)
    hop = sum(d * n for d, n in rows) / max(1, sum(n for _, n in rows)) / 2 if rows else 0.0
    fit = Fit(**{**fit.__dict__, "client_hop_us": hop, "sim_zero_load_mean_us": sim})
    out.write_text(_render(p, fit, out))
    load(out)
    return fit


def fitted_cpu_per_request_us(
    p: Profile, f: Fit, rate: float, switches: tuple[float, float] | None = None
) -> float:
    """The fit's CPU per request of all tiers at ``rate``: a + w s + b / rate, with ``switches``
    = (mid-tier, one leaf) context switches per request there (default: the low rate's)."""
    a = f.mid_recv_us + f.mid_process_us + f.mid_reply_us + f.mid_finalize_us
    a += p.shards * (f.leaf_rpc_us + f.leaf_handle_us)
    sm, sl = switches or (f.mid_switches_per_request, f.leaf_switches_per_request)
    a += f.mid_per_switch_us * sm + p.shards * f.leaf_per_switch_us * sl
    return a + f.fixed_cpu_share * 1e6 * p.cores / max(1e-9, rate)


def model_cpu_per_request_us(result: dict[str, Any]) -> float:
    """CPU per completed request in a simulation result (busy core-seconds / completions)."""
    busy = sum(c["util"] for c in result["cores"])
    return busy / max(1e-9, result["throughput_qps"]) * 1e6


def model_wakeups_per_visit(doc: dict[str, Any], result: dict[str, Any]) -> float:
    """Wake-ups (batches of a ``wake`` stage) per node visit that has one, in a simulation of a
    profiled model's engine document: 1 when every visit is a batch of one, falling as batches
    grow (the engine counts stage runs and jobs run; only wake stages batch more than one)."""
    nodes = doc["paths"][0]["nodes"]
    svcs = doc["services"]
    wake = sum(
        n["copies"]
        for n in nodes
        for i in n["stages"]
        if svcs[n["service"]]["stages"][i]["name"] == "wake"
    )
    total = sum(n["copies"] * len(n["stages"]) for n in nodes)
    if not wake or not result["jobs_run"]:
        return float("nan")
    wake_jobs = result["jobs_run"] * wake / total
    return 1 - (result["jobs_run"] - result["stage_runs"]) / wake_jobs


def profile_json(p: Profile, f: Fit) -> dict[str, Any]:
    def tier(t: Tier) -> dict[str, Any]:
        return {
            "name": t.name,
            "requests": t.requests,
            "cpu_per_request_us": t.cpu_per_request_us,
            "idle_cpu_pct": t.idle_cpu_pct,
            "latency_mean_us": t.latency_mean_us,
            "switches_per_request": t.switches_per_request,
            "phases": {
                k: {kk: vv for kk, vv in v.items() if kk != "buckets"} for k, v in t.phases.items()
            },  # fmt: skip
        }

    return {
        "service": p.service,
        "qps": p.qps,
        "shards": p.shards,
        "threading": p.threading,
        "pools": {"pollers": p.pollers, "workers": p.workers, "responders": p.responders},
        "cores": p.cores,
        "client": p.client,
        "midtier": tier(p.midtier),
        "leaves": [tier(t) for t in p.leaves],
        "background_cpu_pct": p.background_cpu_pct,
        "qps_high": p.qps_high,
        "cpu_per_request_high_us": p.cpu_per_request_high_us,
        "nice": p.nice,
        "points": [q.__dict__ for q in p.points],
        "fit": f.__dict__,
        "notes": p.notes,
    }
