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

import psutil

from musku.errors import HostError, InputError, UnsupportedError
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


def _tier(name: str, before: dict[str, Any], after: dict[str, Any], idle_rate: float) -> Tier:
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
) -> Profile:
    """Deploy ``service``, measure it at ``qps`` (and ``qps_high``) and return the figures."""
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
) -> tuple[list[dict[str, Any]], list[dict[str, Any]], dict[str, Any], float | None]:
    """Stats (reset) before, the load, stats after; also the CPUs' busy seconds not ours."""
    tiers = [dep.midtier, *dep.leaves]
    before = [runtime.admin(p.address, "stats", "--reset") for p in tiers]
    busy0 = _cpu_busy(cpus) if cpus else None
    t0 = time.monotonic()
    spec = runtime.LoadSpec(qps=qps, duration_s=duration_s, warmup_s=0.0)
    r = runtime.run_load(dep.midtier.address, dep.service, dep.load_data, spec, cpus=loadgen_cpus)
    after = [runtime.admin(p.address, "stats") for p in tiers]
    wall = time.monotonic() - t0
    busy1 = _cpu_busy(cpus) if cpus else None
    dep.check_alive()
    other = None
    if busy0 is not None and busy1 is not None and cpus:
        ours = sum(process_cpu_s(b) - process_cpu_s(a) for a, b in zip(before, after, strict=True))
        other = max(0.0, (busy1 - busy0 - ours) / wall / len(cpus) * 100)
    tot = r["total"]
    if int(tot.get("errors", 0)):
        raise InputError(f"{dep.service} answered {tot['errors']} errors at {qps:g} QPS: {tot}")
    return before, after, tot, other


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
) -> Profile:
    """Measure a running deployment (``runtime.deploy``'s) at ``qps``: warm-up, idle CPU, load."""
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
    before, after, tot, background = _window(dep, qps, duration_s, server_cpus, loadgen_cpus)
    measured = [
        _tier(p.name, a, b, rate)
        for p, a, b, rate in zip(tiers, before, after, idle_rates, strict=True)
    ]
    low_total = sum(t.cpu_per_request_us for t in measured)
    # the second rate: half a core at the low rate's cost per request (costs fall with load)
    q2 = qps_high if qps_high is not None else 0.5e6 / max(1.0, low_total)
    b2, a2, _, _ = _window(dep, q2, max(2.0, duration_s / 2), server_cpus, loadgen_cpus)
    high = [
        _tier(p.name, a, b, rate) for p, a, b, rate in zip(tiers, b2, a2, idle_rates, strict=True)
    ]
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
    # name -> (threads, instances, stages): the leaves, then the mid-tier's thread pools
    pools: dict[str, tuple[int, int, list[tuple[str, str]]]] = {
        "leaf": (1, p.shards, [
            ("rpc", _time(f.leaf_rpc_us, None)),
            ("handle", _time(f.leaf_handle_us, hl if hl.exists() else None)),
        ]),
        "poller": (p.pollers, 1, [recv] if dispatch else [recv, process]),
    }  # fmt: skip
    if dispatch:
        pools["worker"] = (p.workers, 1, [process])
    front = "worker" if dispatch else "poller"
    if async_ and p.responders > 0:
        fin_service = "responder"
        pools["responder"] = (p.responders, 1, fin)
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
    if dispatch:
        node("recv", "poller", ["recv"], ["process"])
        node("process", "worker", ["process"], ["leaf"], hold_thread=sync_hold)
    else:
        node("process", "poller", ["recv", "process"], ["leaf"], hold_thread=sync_hold)
    node("leaf", "leaf", ["rpc", "handle"], ["finalize"], copies=p.shards)
    node("finalize", fin_service, ["reply", "finalize"], [], gather=True,
         release_thread=sync_hold)  # fmt: skip
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
    # Each tier's CPU per request, c(rate) = a + b / rate, from the two rates: a per request
    # (what saturation costs), b per second while loaded (wake-ups, timers, cold caches).
    lo = [mid.cpu_per_request_us] + [t.cpu_per_request_us for t in p.leaves]
    hi = p.high_tiers or lo
    r1, r2 = p.qps, p.qps_high
    per_req, per_s = [], []
    for t, (c1, c2) in enumerate(zip(lo, hi, strict=True)):
        floor = (mcpu + fcpu) if t == 0 else lcpu
        a = (c2 * r2 - c1 * r1) / (r2 - r1) if r2 > r1 else c1
        a = min(c1, max(floor, a))
        per_req.append(a)
        per_s.append(max(0.0, (c1 - a) * r1))
    leaf_cpu = sum(per_req[1:]) / max(1, len(per_req) - 1)
    leaf_handle = min(lcpu, leaf_cpu)
    overhead = max(0.0, per_req[0] - mcpu - fcpu)
    fixed = min(0.9, sum(per_s) / 1e6 / p.cores)
    _, wait, _ = _pooled([mid], "leaf_wait")
    slowest_leaf = max(t.latency_mean_us for t in p.leaves)
    leaf_hop = max(0.0, (wait - slowest_leaf - (leaf_cpu - leaf_handle)) / 2)
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


def fitted_cpu_per_request_us(p: Profile, f: Fit, rate: float) -> float:
    """The fit's CPU per request of all tiers at ``rate``: a + b / rate."""
    a = f.mid_recv_us + f.mid_process_us + f.mid_reply_us + f.mid_finalize_us
    a += p.shards * (f.leaf_rpc_us + f.leaf_handle_us)
    return a + f.fixed_cpu_share * 1e6 * p.cores / max(1e-9, rate)


def model_cpu_per_request_us(result: dict[str, Any]) -> float:
    """CPU per completed request in a simulation result (busy core-seconds / completions)."""
    busy = sum(c["util"] for c in result["cores"])
    return busy / max(1e-9, result["throughput_qps"]) * 1e6


def profile_json(p: Profile, f: Fit) -> dict[str, Any]:
    def tier(t: Tier) -> dict[str, Any]:
        return {
            "name": t.name,
            "requests": t.requests,
            "cpu_per_request_us": t.cpu_per_request_us,
            "idle_cpu_pct": t.idle_cpu_pct,
            "latency_mean_us": t.latency_mean_us,
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
        "fit": f.__dict__,
        "notes": p.notes,
    }
