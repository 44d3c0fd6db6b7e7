"""Train a threading decision table on this host.

Over a grid of offered loads, measure the p99 latency of every candidate (model, pool sizes)
on ONE running deployment (the mid-tier switches configuration at run time over the Admin RPC),
keep the best candidate per load and turn that into rows ``max_qps -> configuration``: the file
the mid-tier reads with ``--threading auto --threading-table PATH``.
"""

from __future__ import annotations

import math
import os
import socket
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from musku import storage  # its open_store loads SQLAlchemy on first use, not here
from musku.cotune_spec import Candidate as Candidate  # re-exported: tr.Candidate
from musku.errors import InputError
from musku.services import runtime
from musku.services.latency import Latencies
from musku.tune.table import TABLE_FORMAT
from musku.tune.table import check_table as check_table  # re-exported: tr.check_table, ...
from musku.tune.table import service_name as service_name
from musku.tune.table import validate_table as validate_table
from musku.tune.table import write_table as write_table


@dataclass(frozen=True)
class Target:
    """A mid-tier already running somewhere (not started by us): what training needs of it.
    :func:`train` takes this or a :class:`runtime.Deployment`."""

    address: str  # its service + Admin address, "host:port"
    service: str
    load_data: Path  # what the load generator's plug-in reads (Set Algebra: the queries file)


def _target(dep: runtime.Deployment | Target) -> Target:
    if isinstance(dep, Target):
        return dep
    return Target(dep.midtier.address, dep.service, dep.load_data)


def default_candidates(cpus: int | None = None) -> list[Candidate]:
    """Every model; dispatch models with 1 and 2 workers (more cannot help on small hosts)."""
    n = cpus or os.cpu_count() or 1
    out = []
    for m in runtime.THREADING_MODELS:
        if "-dispatch-" in m:
            for w in sorted({1, min(2, max(1, n))}):
                out.append(Candidate.of(m, w))
        else:
            out.append(Candidate.of(m))
    return out


def parse_models(text: str) -> list[Candidate]:
    """``'all'`` (:func:`default_candidates`) or comma-separated model names."""
    if text == "all":
        return default_candidates()
    return [Candidate.of(m.strip()) for m in text.split(",") if m.strip()]


def parse_loads(text: str) -> list[float]:
    try:
        loads = sorted({float(x) for x in text.split(",") if x.strip()})
    except ValueError as e:
        raise InputError(f"loads are comma-separated QPS values, not {text!r}") from e
    if not loads or loads[0] <= 0:
        raise InputError("loads must be positive QPS values")
    return loads


def measure(
    dep: runtime.Deployment | Target,
    cand: Candidate,
    qps: float,
    *,
    duration_s: float,
    warmup_s: float,
    loadgen_cpus: Sequence[int] | None = None,
) -> dict[str, Any]:
    """Switch the running mid-tier to ``cand`` and measure one open-loop point."""
    t = _target(dep)
    runtime.set_threading(t.address, cand.model, pollers=cand.pollers,
                          workers=cand.workers, responders=cand.responders)  # fmt: skip
    res = runtime.run_load(
        t.address,
        t.service,
        t.load_data,
        runtime.LoadSpec(qps=qps, duration_s=duration_s, warmup_s=warmup_s),
        cpus=loadgen_cpus,
    )
    t = res["total"]
    point = {
        "qps": qps,
        "achieved_qps": t["achieved_qps"],
        "p50_us": t["latency_us"]["p50"],
        "p99_us": t["latency_us"]["p99"],
        "errors": t["errors"],
        "ok": t["ok"],
    }
    if t["latency_us"].get("buckets") and t["ok"] > 0:
        point["p99_ci_us"] = list(Latencies.of(t).quantile_interval(0.99))
    return point


def point_seconds(qps: float, duration_s: float, min_samples: int) -> float:
    """How long to measure one point: at least ``duration_s`` and ``min_samples`` requests."""
    return max(duration_s, min_samples / qps)


def acceptable(point: dict[str, Any]) -> bool:
    """A configuration serves a load if nothing failed and it kept up with the offered rate."""
    return point["errors"] == 0 and point["achieved_qps"] >= 0.9 * point["qps"]


CONTENDERS = 3
"""How many of a load's best candidates :func:`train` measures again (``rounds`` > 1)."""


def planned_points(
    loads: Sequence[float],
    candidates: Sequence[Candidate],
    *,
    duration_s: float,
    warmup_s: float,
    min_samples: int,
    rounds: int,
    contenders: int,
) -> list[float]:
    """The seconds each point of a training is planned to take, in :func:`train`'s order:
    every candidate at a load, then ``rounds - 1`` re-measurements of its ``contenders``
    best, load after load (measured seconds plus the warm-up; start-up costs come on top,
    which :class:`TrainingEta` learns from the points done)."""
    out: list[float] = []
    for q in loads:
        each = point_seconds(q, duration_s, min_samples) + warmup_s
        out += [each] * len(candidates)
        out += [each] * ((rounds - 1) * min(contenders, len(candidates)))
    return out


@dataclass(frozen=True)
class TrainingStep:
    """One measured point of a training, and how far the training is: ``done`` of ``total``
    points after ``elapsed_s`` seconds, ``eta_s`` seconds to go (:class:`TrainingEta`)."""

    key: str
    qps: float
    point: dict[str, Any]
    done: int
    total: int
    elapsed_s: float
    eta_s: float


class TrainingEta:
    """Time left in a training: the planned seconds of the points to go, scaled by how much
    longer than planned the points done took (switching models, starting the load generator,
    a busy host). Before the first point, the plan itself."""

    def __init__(self, planned: Sequence[float], clock: Callable[[], float] = time.monotonic):
        self.planned = list(planned)
        self.clock = clock
        self.start = clock()
        self.done = 0

    @property
    def total(self) -> int:
        return len(self.planned)

    def point_done(self) -> tuple[float, float]:
        """Count one point done: ``(elapsed_s, eta_s)``."""
        self.done = min(self.done + 1, self.total)
        elapsed = self.clock() - self.start
        return elapsed, self.eta_s(elapsed)

    def eta_s(self, elapsed: float) -> float:
        planned_done = sum(self.planned[: self.done])
        left = sum(self.planned[self.done :])
        ratio = max(1.0, elapsed / planned_done) if planned_done > 0 else 1.0
        return left * ratio


def format_duration(seconds: float) -> str:
    """``75`` -> ``1 min 15 s``; ``4000`` -> ``1 h 07 min``; ``9`` -> ``9 s``."""
    s = max(0, round(seconds))
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min {s % 60:02d} s"
    return f"{s // 3600} h {s % 3600 // 60:02d} min"


def _ci(point: dict[str, Any]) -> tuple[float, float]:
    """A point's p99 interval; a point without one (measured without buckets) is exact."""
    lo, hi = point.get("p99_ci_us") or (point["p99_us"], point["p99_us"])
    return float(lo), float(hi)


def build_table(
    service: str,
    loads: Sequence[float],
    grid: dict[str, dict[float, dict[str, Any]]],
    candidates: Sequence[Candidate],
    *,
    host: str | None = None,
    cpus: int | None = None,
    tolerance: float = 0.05,
    leaf_transport: str = "unary",
) -> dict[str, Any]:
    """Best candidate per load -> rows with ``max_qps`` bounds (geometric midpoints).
    ``cpus``: the CPU count of the host the table is for (default: this one's).
    ``leaf_transport``: how the measured mid-tier called its leaves (the table holds only for
    that transport; the mid-tier refuses a table trained over the other).

    Per load, the candidates that cannot be told from the best are its ties: p99 within
    ``tolerance`` of the best's, or the two p99s' 95 % intervals (``p99_ci_us``, from the
    points' requests) overlap. Among the ties the table takes the one that is cheapest to be
    wrong with: it keeps up with the most loads above this one (a load can rise faster than
    the mid-tier's detector reacts; a model that collapses a step up turns a flash crowd into
    a queue), then the previous load's choice (each row boundary is a switch at run time:
    noise must not make the table flip between models), then the lowest p99."""
    by_key = {c.key(): c for c in candidates}

    def reach(key: str, i: int) -> int:
        """How many loads from ``loads[i]`` up the candidate serves without a break."""
        n = 0
        for q in loads[i:]:
            if q not in grid[key] or not acceptable(grid[key][q]):
                break
            n += 1
        return n

    best: list[tuple[float, Candidate, float]] = []
    for i, q in enumerate(loads):
        scored = [
            (grid[k][q]["p99_us"], by_key[k])
            for k in grid
            if q in grid[k] and acceptable(grid[k][q])
        ]
        if not scored:  # nothing kept up: the least bad p99
            scored = [(grid[k][q]["p99_us"], by_key[k]) for k in grid if q in grid[k]]
        if not scored:
            raise InputError(f"no measurement at {q:g} QPS")
        top_p99, top = min(scored, key=lambda x: (x[0], x[1]))
        top_hi = _ci(grid[top.key()][q])[1]
        ties = [
            x for x in scored
            if x[0] <= top_p99 * (1 + tolerance) or _ci(grid[x[1].key()][q])[0] <= top_hi
        ]  # fmt: skip
        reaches = [reach(x[1].key(), i) for x in ties]
        ties = [x for x, r in zip(ties, reaches, strict=True) if r == max(reaches)]
        prev = best[-1][1] if best else None
        p99, cand = min(ties, key=lambda x: (x[1] != prev, x[0], x[1]))
        best.append((q, cand, p99))
    rows: list[dict[str, Any]] = []
    for i, (q, cand, p99) in enumerate(best):
        bound = math.sqrt(q * best[i + 1][0]) if i + 1 < len(best) else 1e12
        if (
            rows
            and rows[-1]["model"] == cand.model
            and all(rows[-1][k] == v for k, v in cand.row().items())
        ):
            rows[-1]["max_qps"] = bound
            rows[-1]["loads"].append(q)
            rows[-1]["p99_us"] = max(rows[-1]["p99_us"], p99)  # the row's worst trained tail
            continue
        rows.append({"max_qps": bound, **cand.row(), "loads": [q], "p99_us": p99})
    return {
        "format": TABLE_FORMAT,
        "service": service,
        "host": host or socket.gethostname(),
        "cpus": cpus if cpus is not None else os.cpu_count(),
        "leaf_transport": leaf_transport,
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "loads": list(loads),
        "rows": rows,
        "grid": {k: {f"{q:g}": v for q, v in pts.items()} for k, pts in grid.items()},
    }


def train(
    dep: runtime.Deployment | Target,
    loads: Sequence[float],
    candidates: Sequence[Candidate],
    *,
    duration_s: float = 3.0,
    warmup_s: float = 0.5,
    loadgen_cpus: Sequence[int] | None = None,
    progress: Callable[[str, float, dict[str, Any]], None] | None = None,
    min_samples: int = 0,
    rounds: int = 1,
    contenders: int = CONTENDERS,
    on_step: Callable[[TrainingStep], None] | None = None,
) -> tuple[dict[str, Any], dict[str, dict[float, dict[str, Any]]]]:
    """Measure every candidate at every load, then decide. A p99 is only as good as its sample:
    each point runs at least ``min_samples`` requests (low loads run longer), and with
    ``rounds`` > 1 the ``contenders`` best candidates of a load are measured ``rounds - 1``
    more times, interleaved (drift hits them alike), and judged by their worst p99: near
    saturation a configuration can be bistable on a shared core (fine in one round, collapsed
    in the next), and a tail-latency table must not pick it for its lucky round.
    ``on_step`` is called after every point with how far the training is and its ETA."""
    if rounds < 1 or contenders < 1 or min_samples < 0:
        raise InputError("rounds and contenders must be >= 1, min_samples >= 0")
    grid: dict[str, dict[float, dict[str, Any]]] = {}
    eta = TrainingEta(planned_points(loads, candidates, duration_s=duration_s, warmup_s=warmup_s,
                                     min_samples=min_samples, rounds=rounds,
                                     contenders=contenders))  # fmt: skip

    def point(c: Candidate, q: float) -> dict[str, Any]:
        p = measure(dep, c, q, duration_s=point_seconds(q, duration_s, min_samples), warmup_s=warmup_s,
                    loadgen_cpus=loadgen_cpus)  # fmt: skip
        elapsed, left = eta.point_done()
        if progress:
            progress(c.key(), q, p)
        if on_step:
            on_step(TrainingStep(c.key(), q, p, eta.done, eta.total, elapsed, left))
        return p

    for q in loads:
        for c in candidates:
            grid.setdefault(c.key(), {})[q] = point(c, q)
        if rounds == 1:
            continue
        ranked = sorted(candidates, key=lambda c: (not acceptable(grid[c.key()][q]),
                                                   grid[c.key()][q]["p99_us"]))  # fmt: skip
        top = ranked[:contenders]
        for _ in range(rounds - 1):
            for c in top:
                p, first = point(c, q), grid[c.key()][q]
                first.setdefault("p99_rounds_us", [first["p99_us"]]).append(p["p99_us"])
                first["errors"] += p["errors"]
                first["achieved_qps"] = min(first["achieved_qps"], p["achieved_qps"])
                if p["p99_us"] > first["p99_us"]:  # judged by the worst round: its interval
                    first["p99_us"] = p["p99_us"]
                    if "p99_ci_us" in p:
                        first["p99_ci_us"] = p["p99_ci_us"]
    t = _target(dep)
    transport = str(runtime.admin(t.address, "get").get("leaf_transport") or "unary")
    return build_table(t.service, loads, grid, candidates, leaf_transport=transport), grid


@dataclass(frozen=True)
class ServiceTraining:
    """``musku tune train SERVICE``: deploy SERVICE on this host and train its table."""

    service: str
    loads: Sequence[float]
    candidates: Sequence[Candidate]
    duration_s: float = 3.0
    warmup_s: float = 0.5
    min_samples: int = 300
    rounds: int = 3
    out: Path | None = None  # default DATA_DIR/tables/SERVICE-HOST.json
    platform: str = "local"  # stored with the table
    config_key: str = "{}"  # the soft-SKU configuration in force ('{}' = stock)
    server_cpus: Sequence[int] | None = None
    loadgen_cpus: Sequence[int] | None = None
    leaf_transport: str = "unary"
    shards: int = 2
    data_opts: Mapping[str, Any] = field(default_factory=dict)  # the dataset's size options
    data_dir: Path | None = None


@dataclass(frozen=True)
class TrainedTable:
    table: dict[str, Any]
    path: Path  # where it was written
    db_id: int | None  # its id in the results DB (None: not stored)


def train_service(
    run: ServiceTraining,
    *,
    store: bool = True,
    db: str | None = None,
    progress: Callable[[str, float, dict[str, Any]], None] | None = None,
    on_step: Callable[[TrainingStep], None] | None = None,
) -> TrainedTable:
    """Deploy ``run.service`` here, train its table over the grid, write it (atomically) and,
    with ``store``, save it in the results DB at ``db`` (opened once the table is written)."""
    runtime.check_service(run.service)
    ddir = run.data_dir or runtime.default_data_dir()
    path = run.out or ddir / "tables" / f"{run.service}-{socket.gethostname()}.json"
    workdir = Path(tempfile.mkdtemp(prefix=f"musku-tune-{run.service}-"))
    with runtime.deploy(
        run.service,
        workdir=workdir,
        data_dir=ddir,
        shards=run.shards,
        server_cpus=run.server_cpus,
        data_opts=dict(run.data_opts),
        leaf_transport=run.leaf_transport,
    ) as dep:
        table, _grid = train(dep, run.loads, run.candidates, duration_s=run.duration_s,
                             warmup_s=run.warmup_s, loadgen_cpus=run.loadgen_cpus,
                             progress=progress, min_samples=run.min_samples,
                             rounds=run.rounds, on_step=on_step)  # fmt: skip
    table["platform"] = run.platform
    table["config_key"] = run.config_key
    write_table(table, path)
    stored = None
    if store:
        with storage.open_store(db) as st:
            stored = st.save_threading_table(
                run.service, table["host"], run.platform, run.config_key, table
            )
    return TrainedTable(table, path, stored)
