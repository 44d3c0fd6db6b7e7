"""The qsim model file: typed (pydantic v2), validated with ``file:line`` errors, normalised.

A model is a TOML file (format in docs/qsim.md). :func:`load` reads it through the bounded
document layer every input file goes through (:mod:`musku.inputfiles`: a regular file of at
most 1 MiB, nesting, list and key limits; :class:`~musku.schema.document.Strict` models: no
coercion, ``seed = "7"`` is refused), checks what a schema cannot (unknown names, cycles,
fan-ins that can never complete, placement), and returns a :class:`Loaded` holding the typed
model and the *normalised* JSON document the C++ engine (services/qsim) runs: names resolved to
indices, nodes topologically sorted, join counts computed, cores placed, frequencies turned
into DVFS ratios, histogram files read (beneath the model's folder, capped, never echoed).

Every number the engine bounds is bounded here with the engine's own limit
(services/qsim/src/model.cc), so that ``qsim check`` accepts exactly what ``qsim run`` runs.
"""

from __future__ import annotations

import csv
import io
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal

from pydantic import BeforeValidator, Field, ValidationError, model_validator

from musku.errors import InputError
from musku.inputfiles import MAX_LABEL_CHARS, MAX_PATH_CHARS, parse_toml, read_text
from musku.qsim.overrides import MAX_COUNT, MAX_DURATION_S, MAX_QPS
from musku.qsim.overrides import with_overrides as with_overrides  # re-exported
from musku.schema.document import TYPE_NAMES, Document, Refusal, Strict
from musku.schema.tomlpos import Positions

# The engine's limits (services/qsim/src/model.cc, ``Int(..., hi)``): a model over one of them
# is refused by ``qsim check`` as by the engine.
MAX_CORES = 4096  # machines[].cores
MAX_THREADS = 1 << 20  # services[].threads
MAX_CONNECTIONS = 1 << 20  # services[].connections
MAX_BATCH = 1 << 30  # stages[].batch
MAX_COPIES = 1 << 20  # nodes[].copies
MAX_JOIN = 1 << 30  # a fan-in's arrivals (copies multiplied down to it)
MAX_POOL = 1 << 30  # nodes[].pool
MAX_CLIENT_CONNECTIONS = 1 << 24  # client.connections
MAX_USERS = 1 << 24  # client.users (closed loop)
# musku's own limits (the engine has none; the normalised document is built in memory)
MAX_INSTANCES = 10_000  # instances of one service
MAX_TOTAL_INSTANCES = 100_000  # instances of all services
MAX_TIME_US = 1e12  # any time or latency in microseconds (11.6 days)
MAX_GHZ = 100.0

TimeUs = Annotated[float, Field(ge=0, le=MAX_TIME_US, allow_inf_nan=False)]
Ghz = Annotated[float, Field(gt=0, le=MAX_GHZ, allow_inf_nan=False)]
Qps = Annotated[float, Field(gt=0, le=MAX_QPS, allow_inf_nan=False)]
Seconds = Annotated[float, Field(gt=0, le=MAX_DURATION_S, allow_inf_nan=False)]
PosInt = Annotated[int, Field(ge=1, le=MAX_COUNT)]
Name = Annotated[str, Field(min_length=1, max_length=MAX_LABEL_CHARS)]


def _bounded(hi: int, lo: int = 1) -> Any:
    return Field(ge=lo, le=hi)


class _Strict(Strict):
    """The shared strict base (no coercion, unknown keys refused), worded for qsim's
    ``services[0].stages[1].batch: ...`` locations."""

    UNKNOWN: ClassVar[str] = "{at}: unknown key '{key}' (allowed: {allowed})"
    NOT_TABLE: ClassVar[str] = "{at}: must be a table"


class Run(_Strict):
    duration_s: Seconds = 10.0
    warmup_s: Annotated[float, Field(ge=0, le=MAX_DURATION_S, allow_inf_nan=False)] = 1.0
    seed: Annotated[int, Field(ge=0, lt=2**63)] = 1
    max_requests: Annotated[int, Field(ge=0, le=MAX_COUNT)] = 0
    max_live_requests: PosInt = 100_000
    max_live_jobs: PosInt = 4_000_000

    @model_validator(mode="after")
    def _warmup_shorter(self) -> Run:
        if self.warmup_s >= self.duration_s:
            raise ValueError("warmup_s must be shorter than duration_s")
        return self


class Network(_Strict):
    latency_us: TimeUs = 0.0  # one hop between machines (and client <-> entry)
    local_latency_us: TimeUs = 0.0  # one hop inside a machine
    client_latency_us: TimeUs | None = None  # client -> entry (default: latency_us)
    reply_latency_us: TimeUs | None = None  # last service -> client (default: latency_us)


class Machine(_Strict):
    name: Name
    cores: Annotated[int, _bounded(MAX_CORES)]
    irq_cores: Annotated[int, _bounded(MAX_CORES, 0)] = 0  # the first N serve interrupts
    freq_base_ghz: Ghz = 2.6
    freq_ghz: Ghz | None = None  # current core frequency (default: base)

    @model_validator(mode="after")
    def _irq_fit(self) -> Machine:
        if self.irq_cores >= self.cores:
            raise ValueError(f"irq_cores ({self.irq_cores}) must leave cores for services")
        return self


def _row(v: Any) -> Any:
    """A TOML ``[a, b]`` row as the tuple the model holds (strict mode takes no list)."""
    return tuple(v) if isinstance(v, list) else v


class Time(_Strict):
    dist: Literal["exp", "const", "lognormal", "empirical"] = "exp"
    mean_us: TimeUs | None = None  # mean for a batch of one job (empirical: its own mean)
    per_job_us: TimeUs = 0.0  # added for each further job of a batch
    sigma: Annotated[float, Field(gt=0, le=100, allow_inf_nan=False)] | None = None  # lognormal
    file: Annotated[str, Field(min_length=1, max_length=MAX_PATH_CHARS)] | None = None
    bytes_per_job: Annotated[float, Field(ge=0, le=1e18, allow_inf_nan=False)] = 0.0
    # a step function: [bytes, mean_us] rows
    bytes_table: (
        list[
            Annotated[
                tuple[Annotated[float, Field(gt=0, le=1e18, allow_inf_nan=False)], TimeUs],
                BeforeValidator(_row),
            ]
        ]
        | None
    ) = None

    @model_validator(mode="after")
    def _complete(self) -> Time:
        if self.dist == "empirical":
            if self.file is None:
                raise ValueError("an empirical time needs file = 'histogram.csv'")
        elif self.mean_us is None and self.bytes_table is None:
            raise ValueError(f"a {self.dist!r} time needs mean_us")
        if self.dist == "lognormal" and self.sigma is None:
            raise ValueError("a lognormal time needs sigma")
        if self.bytes_table is not None:
            if self.bytes_per_job <= 0:
                raise ValueError("a bytes_table needs bytes_per_job > 0")
            steps = [b for b, _ in self.bytes_table]
            if not steps or steps != sorted(set(steps)):
                raise ValueError("bytes_table thresholds must increase")
        return self


class Stage(_Strict):
    name: Name
    queue: Literal["fifo", "epoll", "socket"] = "fifo"
    # fifo/socket: up to N jobs; epoll: up to N from each ready connection
    batch: Annotated[int, _bounded(MAX_BATCH)] = 1
    time: Time
    dvfs_scale: Annotated[float, Field(ge=0, le=1)] = 0.0  # t (1 - s + s f_base / f)
    # how a finished batch's jobs enter the next stage: in batch order, or as μqSim orders
    # them (replies first, requests reversed: docs/qsim.md "Queue kinds")
    handoff: Literal["in_order", "uqsim"] = "in_order"


class Service(_Strict):
    name: Name
    execution: Literal["simple", "threads", "pinned"] = "threads"
    threads: Annotated[int, _bounded(MAX_THREADS)] = 1
    cores_per_instance: Annotated[int, _bounded(MAX_CORES)] | None = None  # default: threads
    context_switch_us: TimeUs = 0.0
    connections: Annotated[int, _bounded(MAX_CONNECTIONS)] = 1
    lb: Literal["round_robin", "random", "least_loaded", "connection"] = "round_robin"
    instances: Annotated[int, _bounded(MAX_INSTANCES)] = 1
    machines: list[Name] | None = None  # placement: instance i on machines[i % len]
    irq: bool = False  # runs on its machines' interrupt cores (a network stack)
    freq_ghz: Ghz | None = None  # this service's cores' frequency (default: the machine's)
    stages: list[Stage] = Field(min_length=1)


class Node(_Strict):
    name: Name
    service: Name
    stages: list[Name] | None = None  # default: all of the service's stages, in order
    children: list[Name] = []
    branch: Literal["all", "one"] = "all"
    child_weights: list[Annotated[float, Field(ge=0, le=1e300, allow_inf_nan=False)]] | None = None
    copies: Annotated[int, _bounded(MAX_COPIES)] = 1  # fan-out: copies round-robin on instances
    gather: bool = False  # wait for every copy of the parent (a fan-in); else follow each copy
    hold_thread: bool = False  # blocking call: the thread waits for the reply
    release_thread: bool = False  # the reply, run on the thread held earlier
    # calls into this node share N blocking connections (http/1.1)
    pool: Annotated[int, _bounded(MAX_POOL)] | None = None


class Path_(_Strict):
    name: Name = "request"
    weight: Annotated[float, Field(gt=0, le=1e300, allow_inf_nan=False)] = 1.0
    nodes: list[Node] = Field(min_length=1)


class Epoch(_Strict):
    until_s: Seconds
    qps: Qps


class Client(_Strict):
    kind: Literal["open", "closed"] = "open"
    qps: Qps | None = None
    epochs: list[Epoch] | None = None
    users: Annotated[int, _bounded(MAX_USERS)] | None = None
    think_us: TimeUs = 0.0
    connections: Annotated[int, _bounded(MAX_CLIENT_CONNECTIONS)] = 1

    @model_validator(mode="after")
    def _load(self) -> Client:
        if self.kind == "open" and self.qps is None and not self.epochs:
            raise ValueError("an open-loop client needs qps or epochs")
        if self.kind == "closed" and self.users is None:
            raise ValueError("a closed-loop client needs users")
        return self


class QsimModel(_Strict):
    run: Run = Run()
    network: Network = Network()
    machines: list[Machine] = Field(min_length=1)
    services: list[Service] = Field(min_length=1)
    paths: list[Path_] = Field(min_length=1)
    client: Client


@dataclass(frozen=True)
class Loaded:
    path: Path
    model: QsimModel
    engine: dict[str, Any]  # the normalised document musku_qsim runs


# ---------------------------------------------------------------------------------------------


def _fmt_loc(loc: tuple[str | int, ...]) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def _shown(value: Any) -> str:
    """A wrong value as an error shows it: its repr, cut short (a file may hold 1 MiB)."""
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def read_model(path: Path) -> str:
    """The model file's text, read within the input limits (a regular file of at most 1 MiB)."""
    try:
        return read_text(path)
    except InputError as e:
        raise InputError(f"cannot read model: {e.message}", where=e.where) from None


def parse(text: str, path: Path) -> tuple[QsimModel, Positions]:
    """Parse (within the document limits) and schema-validate; errors carry ``file:line``."""
    doc = Document(path, text, parse_toml(text, str(path)))
    pos = doc.positions
    try:
        model = QsimModel.model_validate(doc.data)
    except ValidationError as e:
        errors = e.errors(include_url=False)
        err = errors[0]
        loc = tuple(p for p in err["loc"] if isinstance(p, str | int))
        at = _fmt_loc(loc) or "model"
        cause = (err.get("ctx") or {}).get("error")
        kind = err["type"]
        if isinstance(cause, Refusal):
            if cause.key is not None:
                loc = (*loc, cause.key)
            msg = cause.message.replace("{at}", at).replace("{table}", at)
        elif kind in TYPE_NAMES:  # the shared layer's wording: no coercion, say what was there
            msg = f"{at}: must be {TYPE_NAMES[kind]}, not {_shown(err['input'])}"
        elif kind in ("dict_type", "model_type", "model_attributes_type"):
            msg = f"{at}: must be a table"
        elif kind == "missing" and loc:
            loc, key = loc[:-1], loc[-1]
            msg = f"{_fmt_loc(loc) or 'model'}: needs '{key}'"
        else:
            # union/literal errors append the type tried: keep the part that is in the document
            msg = f"{at}: " + err["msg"].removeprefix("Value error, ")
        line = pos.line(loc)
        more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
        raise InputError(msg + more, where=f"{path}:{line}" if line else str(path)) from None
    return model, pos


MAX_HISTOGRAM_ROWS = 1_000_000
"""Most histogram rows in one model's engine document (all stages together)."""


def histogram_path(model_path: Path, name: str) -> Path:
    """Where an empirical time's ``file`` is: resolved (symlinks too) beneath the model's
    folder, never outside it (``../../etc/shadow`` is refused before anything is read)."""
    if "\0" in name:
        raise InputError("a histogram file name holds a NUL character", where=str(model_path))
    folder = Path(os.path.realpath(model_path.parent))
    f = Path(name)
    real = Path(os.path.realpath(f if f.is_absolute() else model_path.parent / f))
    if folder not in real.parents:
        raise InputError(
            f"histogram file {name!r} is not beneath the model's folder {str(folder)!r} "
            "(histograms are read from there only)",
            where=str(model_path),
        )
    return real


def read_histogram(file: Path) -> list[tuple[float, float]]:
    """An empirical histogram: ``value_us[,weight]`` per line (``#`` comments, blank lines),
    a regular file of at most 1 MiB. Errors say which line, never what it holds."""
    try:
        text = read_text(file)
    except InputError as e:
        raise InputError(f"cannot read histogram: {e.message}", where=e.where) from None
    rows: list[tuple[float, float]] = []
    for no, fields in enumerate(csv.reader(io.StringIO(text)), start=1):
        if not fields or not "".join(fields).strip() or fields[0].strip().startswith("#"):
            continue
        try:
            vals = [float(f) for f in fields]
        except ValueError:
            raise InputError(
                "expected 'value_us[,weight]' (one or two numbers)", where=f"{file}:{no}"
            ) from None
        if len(vals) not in (1, 2) or any(not math.isfinite(v) or v < 0 for v in vals):
            raise InputError(
                "expected 'value_us[,weight]' with finite values >= 0", where=f"{file}:{no}"
            )
        if vals[0] > MAX_TIME_US:
            raise InputError(f"a value over {MAX_TIME_US:g} us", where=f"{file}:{no}")
        rows.append((vals[0], vals[1] if len(vals) == 2 else 1.0))
    if not rows or sum(w for _, w in rows) <= 0:
        raise InputError("empty histogram (no values with a positive weight)", where=str(file))
    return rows


MAX_ENGINE_STATE = 1 << 24
"""Most threads, connection sub-queues and placed cores (together) a model may give the
engine: its memory grows with them before the first event (16 M items: a few hundred MiB)."""


def normalise(model: QsimModel, pos: Positions, path: Path) -> dict[str, Any]:
    """Resolve names and check the graph; the engine's JSON document."""

    def err(msg: str, loc: tuple[str | int, ...]) -> InputError:
        line = pos.line(loc)
        return InputError(msg, where=f"{path}:{line}" if line else str(path))

    machines = {m.name: i for i, m in enumerate(model.machines)}
    if len(machines) != len(model.machines):
        raise err("duplicate machine names", ("machines",))
    services = {s.name: i for i, s in enumerate(model.services)}
    if len(services) != len(model.services):
        raise err("duplicate service names", ("services",))

    n_instances = sum(s.instances for s in model.services)
    if n_instances > MAX_TOTAL_INSTANCES:
        raise err(
            f"{n_instances:,} service instances in all (the limit is {MAX_TOTAL_INSTANCES:,})",
            ("services",),
        )
    state = 0  # threads, connection sub-queues and placed cores the engine will hold
    for s in model.services:
        queues = sum(1 for st in s.stages if st.queue != "fifo") * s.connections
        placed = 0 if s.execution == "simple" else (s.cores_per_instance or s.threads)
        state += s.instances * (s.threads + queues + placed)
    if state > MAX_ENGINE_STATE:
        raise err(
            f"the services' instances hold {state:,} threads, connection queues and cores "
            f"(the limit is {MAX_ENGINE_STATE:,}: fewer instances, threads or connections)",
            ("services",),
        )
    histograms: dict[Path, list[tuple[float, float]]] = {}
    histogram_rows = 0

    # placement: cores per machine, non-interrupt cores handed out in order (then shared)
    next_core = {m.name: m.irq_cores for m in model.machines}
    next_irq = {m.name: 0 for m in model.machines}
    eng_services: list[dict[str, Any]] = []
    for si, s in enumerate(model.services):
        names = s.machines or [model.machines[0].name]
        for mn in names:
            if mn not in machines:
                raise err(
                    f"service {s.name!r}: unknown machine {mn!r}", ("services", si, "machines")
                )
        stage_names = [st.name for st in s.stages]
        if len(set(stage_names)) != len(stage_names):
            raise err(f"service {s.name!r}: duplicate stage names", ("services", si, "stages"))
        want = s.cores_per_instance or s.threads
        instances: list[dict[str, Any]] = []
        freq_ratio = 1.0
        for i in range(s.instances):
            m = model.machines[machines[names[i % len(names)]]]
            cur = s.freq_ghz or m.freq_ghz or m.freq_base_ghz
            freq_ratio = m.freq_base_ghz / cur
            inst: dict[str, Any] = {"machine": machines[m.name]}
            if s.execution != "simple":
                if s.irq:
                    if m.irq_cores == 0:
                        raise err(
                            f"service {s.name!r} runs on interrupt cores but machine {m.name!r} "
                            "has irq_cores = 0",
                            ("services", si, "irq"),
                        )
                    cores = []
                    for _ in range(min(want, m.irq_cores)):
                        cores.append(next_irq[m.name])
                        next_irq[m.name] = (next_irq[m.name] + 1) % m.irq_cores
                    inst["cores"] = sorted(set(cores))
                else:
                    avail = m.cores - m.irq_cores
                    if want > avail:
                        raise err(
                            f"service {s.name!r} wants {want} cores per instance but machine "
                            f"{m.name!r} has {avail} for services",
                            (
                                "services",
                                si,
                                "cores_per_instance" if s.cores_per_instance else "threads",
                            ),
                        )
                    cores = []
                    for _ in range(want):
                        c = next_core[m.name]
                        cores.append(c)
                        c += 1
                        next_core[m.name] = m.irq_cores if c >= m.cores else c
                    inst["cores"] = sorted(set(cores))
            instances.append(inst)
        stages = []
        for ki, st in enumerate(s.stages):
            t = st.time
            doc: dict[str, Any] = {
                "name": st.name,
                "queue": st.queue,
                "batch": st.batch,
                "dist": t.dist,
                "per_job_us": t.per_job_us,
                "dvfs_scale": st.dvfs_scale,
                "mean_us": t.mean_us if t.mean_us is not None else 0.0,
            }
            if st.handoff != "in_order":
                doc["handoff"] = st.handoff
            if t.sigma is not None:
                doc["sigma"] = t.sigma
            if t.bytes_table is not None:
                doc["bytes_per_job"] = t.bytes_per_job
                doc["bytes_table"] = [list(r) for r in t.bytes_table]
            if t.dist == "empirical":
                assert t.file is not None
                try:
                    f = histogram_path(path, t.file)
                    if f not in histograms:
                        histograms[f] = read_histogram(f)
                    rows = histograms[f]
                    histogram_rows += len(rows)
                    if histogram_rows > MAX_HISTOGRAM_ROWS:
                        raise InputError(
                            f"the histograms hold over {MAX_HISTOGRAM_ROWS:,} rows in all"
                        )
                except InputError as e:
                    line = pos.line(("services", si, "stages", ki, "time"))
                    raise InputError(
                        f"{e.one_line()} (histogram of stage {st.name!r} of {s.name!r})",
                        where=f"{path}:{line}" if line else str(path),
                    ) from None
                doc["empirical"] = [list(r) for r in rows]
                total = sum(w for _, w in rows)
                doc["mean_us"] = (
                    t.mean_us if t.mean_us is not None else sum(v * w for v, w in rows) / total
                )
            stages.append(doc)
        eng_services.append(
            {
                "name": s.name,
                "execution": s.execution,
                "threads": s.threads,
                "context_switch_us": s.context_switch_us,
                "freq_ratio": freq_ratio,
                "connections": s.connections,
                "lb": s.lb,
                "stages": stages,
                "instances": instances,
            }
        )

    eng_paths = [_normalise_path(model, pi, p, services, err) for pi, p in enumerate(model.paths)]

    cl = model.client
    client: dict[str, Any] = {"kind": cl.kind, "connections": cl.connections}
    if cl.kind == "closed":
        client.update(users=cl.users, think_us=cl.think_us)
    elif cl.epochs:
        last = 0.0
        for ei, ep in enumerate(cl.epochs):
            if ep.until_s <= last:
                raise err("epoch ends must increase", ("client", "epochs", ei))
            last = ep.until_s
        client["epochs"] = [{"end_s": ep.until_s, "qps": ep.qps} for ep in cl.epochs]
        if last < model.run.duration_s:  # the last rate holds to the end
            client["epochs"].append({"end_s": model.run.duration_s * 2, "qps": cl.epochs[-1].qps})
    else:
        client["epochs"] = [{"end_s": model.run.duration_s * 2, "qps": cl.qps}]
    r = model.run
    return {
        "seed": r.seed,
        "duration_s": r.duration_s,
        "warmup_s": r.warmup_s,
        "max_requests": r.max_requests,
        "max_live_requests": r.max_live_requests,
        "max_live_jobs": r.max_live_jobs,
        "net_latency_us": model.network.latency_us,
        "local_latency_us": model.network.local_latency_us,
        "client_latency_us": _or(model.network.client_latency_us, model.network.latency_us),
        "reply_latency_us": _or(model.network.reply_latency_us, model.network.latency_us),
        "machines": [{"name": m.name, "cores": m.cores} for m in model.machines],
        "services": eng_services,
        "paths": eng_paths,
        "client": client,
    }


def _or(x: float | None, default: float) -> float:
    return default if x is None else x


def _normalise_path(
    model: QsimModel, pi: int, p: Path_, services: dict[str, int], err: Any
) -> dict[str, Any]:
    names = {n.name: i for i, n in enumerate(p.nodes)}
    if len(names) != len(p.nodes):
        raise err(f"path {p.name!r}: duplicate node names", ("paths", pi, "nodes"))
    parents: dict[int, list[int]] = {i: [] for i in range(len(p.nodes))}
    for i, n in enumerate(p.nodes):
        loc = ("paths", pi, "nodes", i)
        if n.service not in services:
            raise err(f"node {n.name!r}: unknown service {n.service!r}", (*loc, "service"))
        svc = model.services[services[n.service]]
        known = [st.name for st in svc.stages]
        for st in n.stages or []:
            if st not in known:
                raise err(
                    f"node {n.name!r}: service {svc.name!r} has no stage {st!r} "
                    f"(it has {', '.join(known)})",
                    (*loc, "stages"),
                )
        if n.stages == []:
            raise err(f"node {n.name!r}: runs no stage", (*loc, "stages"))
        for ch in n.children:
            if ch not in names:
                raise err(f"node {n.name!r}: unknown child node {ch!r}", (*loc, "children"))
            parents[names[ch]].append(i)
        if n.branch == "one":
            if not n.children:
                raise err(f"node {n.name!r}: branch = 'one' without children", (*loc, "branch"))
            if n.child_weights is None or len(n.child_weights) != len(n.children):
                raise err(
                    f"node {n.name!r}: child_weights needs one weight per child", (*loc, "branch")
                )
            if sum(n.child_weights) <= 0:
                raise err(f"node {n.name!r}: child_weights sum to zero", (*loc, "child_weights"))
        elif n.child_weights is not None:
            raise err(
                f"node {n.name!r}: child_weights needs branch = 'one'", (*loc, "child_weights")
            )
    roots = [i for i in range(len(p.nodes)) if not parents[i]]
    if len(roots) != 1:
        if not roots:
            raise err(
                f"path {p.name!r}: no root node (every node has a parent: a cycle)", ("paths", pi)
            )
        raise err(
            f"path {p.name!r}: several root nodes ({', '.join(p.nodes[i].name for i in roots)}); "
            "a path is one tree",
            ("paths", pi, "nodes", roots[1], "name"),
        )
    # topological order from the root (Kahn); what is left is on a cycle
    indeg = {i: len(parents[i]) for i in parents}
    order: list[int] = []
    ready = [roots[0]]
    while ready:
        i = ready.pop(0)
        order.append(i)
        for ch in p.nodes[i].children:
            j = names[ch]
            indeg[j] -= 1
            if indeg[j] == 0:
                ready.append(j)
    if len(order) != len(p.nodes):
        bad = min(i for i in range(len(p.nodes)) if i not in order)
        raise err(
            f"path {p.name!r}: node {p.nodes[bad].name!r} is on a cycle (a path must be a tree "
            "with fan-ins, not a loop)",
            ("paths", pi, "nodes", bad, "name"),
        )
    # which exclusive branch choices each node needs in order to run
    cond: dict[int, frozenset[tuple[int, int]]] = {}
    mult: dict[int, int] = {}
    join: dict[int, int] = {}
    for i in order:
        n = p.nodes[i]
        need: set[tuple[int, int]] = set()
        feeds = []
        for par in parents[i]:
            c = set(cond[par])
            if p.nodes[par].branch == "one":
                c.add((par, i))
            feeds.append(frozenset(c))
            need |= c
        if len(set(feeds)) > 1:
            diff = next(f for f in feeds if f != feeds[0])
            choice = next(iter((diff ^ feeds[0]) or {(0, 0)}))
            raise err(
                f"path {p.name!r}: fan-in {n.name!r} can never complete: one parent runs only "
                f"when {p.nodes[choice[0]].name!r} picks {p.nodes[choice[1]].name!r}",
                ("paths", pi, "nodes", i, "name"),
            )
        picks: dict[int, int] = {}
        for b, chosen in need:
            if picks.setdefault(b, chosen) != chosen:
                raise err(
                    f"path {p.name!r}: fan-in {n.name!r} can never complete (its parents are "
                    f"exclusive branches of {p.nodes[b].name!r})",
                    ("paths", pi, "nodes", i, "name"),
                )
        cond[i] = frozenset(need)
        fan_in = len(parents[i]) > 1 or n.gather
        if fan_in and n.copies > 1:
            raise err(
                f"node {n.name!r}: a fan-in cannot have copies", ("paths", pi, "nodes", i, "name")
            )
        if n.gather and not parents[i]:
            raise err(f"node {n.name!r}: gather on the root", ("paths", pi, "nodes", i, "gather"))
        # how many times the node runs per request: copies multiply down to a fan-in
        mult[i] = n.copies if fan_in or not parents[i] else n.copies * mult[parents[i][0]]
        if mult[i] > MAX_JOIN:  # copies multiplied down a chain: the engine counts in int
            raise err(
                f"node {n.name!r} runs {mult[i]:,} times per request (copies multiply down to "
                f"a fan-in; the limit is {MAX_JOIN:,})",
                ("paths", pi, "nodes", i, "copies"),
            )
        if fan_in:
            mult[i] = 1
            join[i] = sum(mult[q] for q in parents[i])
            if join[i] > MAX_JOIN:
                raise err(
                    f"fan-in {n.name!r} waits for {join[i]:,} arrivals (the limit is {MAX_JOIN:,})",
                    ("paths", pi, "nodes", i, "name"),
                )
    index = {old: new for new, old in enumerate(order)}
    nodes = []
    for old in order:
        n = p.nodes[old]
        svc = model.services[services[n.service]]
        known = [st.name for st in svc.stages]
        doc: dict[str, Any] = {
            "service": services[n.service],
            "stages": [known.index(s) for s in (n.stages or known)],
            "children": [index[names[c]] for c in n.children],
            "branch": n.branch,
            "copies": n.copies,
            "join": join.get(old, 1),
            "hold_thread": n.hold_thread,
            "pool": n.pool or 0,
            "release_thread": n.release_thread,
        }
        if n.child_weights is not None:
            doc["child_weights"] = n.child_weights
        nodes.append(doc)
    return {"weight": p.weight, "root": 0, "nodes": nodes}


def load(path: Path | str) -> Loaded:
    """Read, validate and normalise a model file (InputError, exit status 3, on bad input)."""
    path = Path(path)
    model, pos = parse(read_model(path), path)
    return Loaded(path, model, normalise(model, pos, path))
