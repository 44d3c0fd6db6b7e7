"""``musku qsim import-uqsim``: a μqSim architecture directory as a qsim model (docs/qsim.md).

μqSim (Zhang, Gan, Delimitrou) describes a deployment with ``machines.json``, ``graph.json``
(service instances, their thread schedulers and machines), ``path.json`` (request paths),
``client.json`` (load epochs) and one JSON per service model under ``microservice/``. Some of its
timing rules are formulas in its C++ source rather than data; the importer writes them out as
data in our format:

- an ``epoll`` stage costs exp(round(0.38 (n - 7) + 3.8) us) for n ready connections: a
  ``bytes_table`` indexed by n (``bytes_per_job = 1``);
- a ``socket`` read of n jobs reads 7 n bytes, its cost an exp with the mean of the first
  threshold at or above that size in {35: 0.8, 70: 1.6, 270: 3.0, 786: 5.4, 1836: 11.6,
  2268: 26.0} us, repeated bytes/2268 times beyond it: a ``bytes_table``;
- nginx's request processing (``ngx_proc``) draws from a fixed 100-entry table scaled by 0.65:
  an empirical histogram file written next to the model;
- the network stack of each machine (send/receive, local/remote) becomes a service on the
  machine's interrupt cores, and every hop through it becomes explicit path nodes (a local send
  and no receive between two services of one machine; nothing after a stage that is not a
  ``net`` stage);
- a chunked stage's time (the sum of a random number of draws) becomes one distribution: an
  exponential, a constant or a histogram file;
- a blocking stage waiting for its sync node becomes ``hold_thread``/``release_thread``; a
  critical section a node of its own behind a pool of ``thread_limit`` connections; a random
  code-path choice a ``branch = "one"`` on the receive node, the rest of the path copied below
  each choice; the Simplified scheduler a pool of one thread per core; ``cur_freq`` the
  service's ``freq_ghz``.

What the model cannot express is refused with one line naming the feature and the file
(:class:`UnsupportedError`, exit status 4); a malformed file is :class:`InputError` (status 3).
Identical sibling leaves (same service model and code path, one instance each, the same
children) are folded into one service with one instance per leaf and a node with ``copies``.
"""

from __future__ import annotations

import json
import math
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from statistics import NormalDist
from typing import Any

from musku.errors import InputError, UnsupportedError
from musku.inputfiles import check_shape, read_text
from musku.qsim.model import MAX_GHZ

# μqSim's built-in rules (src/stage.cc), as data.
SOCKET_BYTES_PER_JOB = 7
SOCKET_TABLE_US = [(35, 0.8), (70, 1.6), (270, 3.0), (786, 5.4), (1836, 11.6), (2268, 26.0)]
NGX_PROC_SCALE = 0.65
EPOLL_MAX_CONNECTIONS = 512
NGX_PROC_DVFS_SCALE = 0.4  # μqSim: an nginx request's time x (0.6 + 0.4 f_base / f)
BASE_GHZ = 2.6  # the machines' base frequency (μqSim's examples: 2600 MHz)


def _ngx_table_us() -> list[float]:
    """μqSim's nginx processing-time table (100 equally likely entries), in us."""
    t = [0.0] * 100
    for i in range(0, 5):
        t[i] = i * 1000 + 17000
    runs = [(5, 7, 22000), (8, 10, 23000), (11, 13, 24000), (14, 18, 25000), (19, 24, 26000),
            (25, 31, 27000), (32, 39, 28000), (40, 48, 29000), (49, 56, 30000), (57, 64, 31000),
            (65, 71, 32000), (72, 78, 33000), (79, 83, 34000), (84, 87, 35000), (88, 90, 36000),
            (91, 92, 37000), (93, 94, 38000)]  # fmt: skip
    for lo, hi, v in runs:
        for i in range(lo, hi + 1):
            t[i] = v
    for i, v in ((95, 39000), (96, 40000), (97, 43000), (98, 48000), (99, 100000)):
        t[i] = v
    return [int(v * NGX_PROC_SCALE) / 1000.0 for v in t]


def _epoll_table() -> list[tuple[int, float]]:
    return [
        (n, float(max(0, round(0.38 * (n - 7) + 3.8)))) for n in range(1, EPOLL_MAX_CONNECTIONS + 1)
    ]


MAX_UQSIM_FILE_BYTES = 64 << 20
"""μqSim's own files may be larger than other inputs: its 1,000-leaf fan-out's machines.json
is 2.3 MB (a core-affinity list per machine). Still bounded, and still checked for shape."""

CHUNK_QUANTILES = 1000
"""Rows of the histogram written for a stage whose time is a sum of a fixed number of draws."""


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def _read(path: Path) -> Any:
    """A μqSim JSON file, read within the input limits (a regular file of at most 64 MiB,
    nesting, list and number limits of :mod:`musku.inputfiles`; no NaN or Infinity)."""
    text = read_text(path, limit=MAX_UQSIM_FILE_BYTES)
    try:
        data = json.loads(text, parse_constant=_no_constant)
    except json.JSONDecodeError as e:
        raise InputError(f"not JSON: {e.msg}", where=f"{path}:{e.lineno}") from None
    except RecursionError:
        raise InputError("nested too deeply", where=str(path)) from None
    except ValueError as e:
        raise InputError(f"not JSON: {e}", where=str(path)) from None
    check_shape(data, str(path))
    return data


_KINDS: dict[type, str] = {dict: "an object", list: "a list", str: "a string", bool: "true/false"}


def _get(d: Any, key: str, where: Path, kind: type | tuple[type, ...], default: Any = ...) -> Any:
    """``d[key]`` of the expected JSON type, or one line naming the file and the key."""
    if not isinstance(d, dict):
        raise InputError(f"expected an object holding {key!r}", where=str(where))
    if key not in d:
        if default is not ...:
            return default
        raise InputError(f"missing {key!r}", where=str(where))
    v = d[key]
    kinds = kind if isinstance(kind, tuple) else (kind,)
    ok = isinstance(v, kinds) and not (isinstance(v, bool) and bool not in kinds)
    if not ok:
        want = " or ".join(_KINDS.get(k, "a number") for k in kinds)
        raise InputError(f"{key!r} must be {want}, not {json.dumps(v)[:40]}", where=str(where))
    if isinstance(v, str) and any(0xD800 <= ord(c) <= 0xDFFF for c in v):
        raise InputError(f"{key!r} holds a lone surrogate (not Unicode text)", where=str(where))
    return v


def _num(d: Any, key: str, where: Path, default: Any = ..., lo: float = 0.0) -> float:
    v = float(_get(d, key, where, (int, float), default))
    if not math.isfinite(v) or v < lo:
        raise InputError(f"{key!r} must be a number >= {lo:g}, not {v:g}", where=str(where))
    return v


def _int(d: Any, key: str, where: Path, default: Any = ..., lo: int = 0) -> int:
    v = _get(d, key, where, int, default)
    if v < lo:
        raise InputError(f"{key!r} must be an integer >= {lo}, not {v}", where=str(where))
    return int(v)


def _numbers(d: Any, key: str, where: Path) -> list[float]:
    v = _get(d, key, where, list)
    if not all(isinstance(x, int | float) and not isinstance(x, bool) for x in v):
        raise InputError(f"{key!r} must be a list of numbers", where=str(where))
    return [float(x) for x in v]


def _ints(d: Any, key: str, where: Path, default: Any = ...) -> list[int]:
    v = _get(d, key, where, list, default)
    if not all(isinstance(x, int) and not isinstance(x, bool) for x in v):
        raise InputError(f"{key!r} must be a list of integers", where=str(where))
    return [int(x) for x in v]


def _flag(d: Any, key: str, where: Path) -> bool:
    return bool(_get(d, key, where, bool, False))


def _tx(node: str, child: str | None) -> str:
    return f"tx{node}" if child is None else f"tx{node}_{child}"


def _comment(s: str) -> str:
    """Text for a TOML comment: no control characters (a name may hold any)."""
    return "".join(c if c == "\t" or (ord(c) >= 0x20 and c != "\x7f") else "?" for c in s)


def _q(s: str) -> str:
    """A TOML basic string: JSON's escapes without ensure_ascii (TOML has no surrogate-pair
    escapes), plus DEL, which TOML wants escaped too."""
    return json.dumps(s, ensure_ascii=False).replace("\x7f", "\\u007f")


def _erlang_quantiles(n: int, rows: int) -> list[float]:
    """Quantiles (at (i + 1/2) / rows) of the sum of n exponentials of mean 1."""

    def cdf(x: float) -> float:
        term, acc = 1.0, 1.0
        for k in range(1, n):
            term *= x / k
            acc += term
        return 1.0 - math.exp(-x) * acc

    out = []
    for i in range(rows):
        u = (i + 0.5) / rows
        if n > 16:  # Wilson-Hilferty: within 0.1 % of the quantile from 16 draws on
            z = NormalDist().inv_cdf(u)
            out.append(n * (1 - 1 / (9 * n) + z / (3 * math.sqrt(n))) ** 3)
            continue
        lo, hi = 0.0, n + 40.0 * math.sqrt(n) + 40.0
        for _ in range(50):
            mid = (lo + hi) / 2
            lo, hi = (mid, hi) if cdf(mid) < u else (lo, mid)
        out.append((lo + hi) / 2)
    return out


@dataclass
class _Inst:
    name: str
    model: str
    machine: int
    sched: str  # CMT | Simplified
    threads: int  # CMT: threads; Simplified: queues
    cores: list[int]


@dataclass
class _Svc:
    """One qsim service: a μqSim service (its instances) or identical leaves folded."""

    insts: list[_Inst]
    model: dict[str, Any]
    where: Path  # its model file
    cps: dict[int, list[dict[str, Any]]] = field(default_factory=dict)  # code path -> stages
    cp_weights: list[tuple[int, float]] = field(default_factory=list)  # code_path = -1 choice
    names: dict[int, str] = field(default_factory=dict)  # stage_id -> unique stage name
    split: bool = False
    net: str = ""  # its network stack service

    @property
    def machine(self) -> int | None:
        ms = {i.machine for i in self.insts}
        return next(iter(ms)) if len(ms) == 1 else None


class _Importer:
    def __init__(self, directory: Path, out: Path, notes: list[str]) -> None:
        self.dir = directory
        self.out = out
        self.notes = notes
        self.models: dict[str, tuple[dict[str, Any], Path]] = {}
        self.lines: list[str] = []
        self.side_files: list[str] = []
        self.mach: dict[int, dict[str, Any]] = {}

    def model(self, name: str, where: Path) -> tuple[dict[str, Any], Path]:
        d = self.dir
        if not name or "/" in name or name.startswith(".") or "\0" in name:
            raise InputError(
                f"a microservice model name must be a plain file name, not {name!r}",
                where=str(where),
            )
        if name not in self.models:
            single = d / "microservice.json"
            if single.is_file():  # μqSim's other layout: one file listing every model
                for i, m in enumerate(_get({"m": _read(single)}, "m", single, list)):
                    n = _get(m, "service_name", single, str)
                    self.models.setdefault(n, (m, single))
                    del i
                if name not in self.models:
                    raise InputError(f"no microservice model {name!r}", where=str(single))
            else:
                f = d / "microservice" / f"{name}.json"
                m = _read(f)
                if not isinstance(m, dict):
                    raise InputError("expected a microservice model (an object)", where=str(f))
                self.models[name] = (m, f)
        return self.models[name]


def _scale(st: dict[str, Any], where: Path, name: str) -> float:
    """A stage's DVFS ``scale_factor`` (0..1)."""
    scale = _num(st, "scale_factor", where, 0)
    if scale > 1:
        raise InputError(f"stage {name!r}: scale_factor {scale:g} above 1", where=str(where))
    return scale


def _freq_ratio(mdl: dict[str, Any], where: Path) -> float:
    """base_freq / cur_freq of a μqSim model (units as written: MHz or GHz)."""
    base = _num(mdl, "base_freq", where, 2600, lo=0)
    cur = _num(mdl, "cur_freq", where, base, lo=0)
    if base <= 0 or cur <= 0:
        raise InputError("base_freq and cur_freq must be > 0", where=str(where))
    if BASE_GHZ * cur / base > MAX_GHZ:
        raise InputError(
            f"cur_freq {cur:g} is over {MAX_GHZ / BASE_GHZ:.3g}x base_freq {base:g} "
            f"(over {MAX_GHZ:g} GHz)",
            where=str(where),
        )
    return base / cur


def uqsim_choice(weights: list[float]) -> list[float]:
    """The shares μqSim actually gives to choices written as percentages: it draws
    ``rand() % 100`` (0..99) and takes the first choice whose cumulative sum is at or above it
    (cluster.cc ``enqueue``, micro_service.cc ``decidePath``), so the first gets one point more
    and the last one point less than written (86/12/2 runs as 87/12/1). Weights that are not
    whole percentages summing to 100 are returned as written."""
    if any(w != int(w) for w in weights) or sum(weights) != 100:
        return list(weights)
    cum, acc = [], 0.0
    for w in weights:
        acc += w
        cum.append(acc)
    out = [0.0] * len(weights)
    for draw in range(100):
        out[next(i for i, c in enumerate(cum) if c >= draw)] += 1
    return out


def _client_epochs(
    d: Path, qps: float | None, duration_s: float | None
) -> tuple[list[float], list[float], list[str]]:
    """(rates, epoch ends in s, notes) from client.json (``epoch_end_sec`` or, in μqSim's later
    layout, ``epoch_end_us``); without client.json, ``--qps`` for ``duration_s`` (10 s)."""
    fc = d / "client.json"
    if not fc.is_file():
        if qps is None:
            raise InputError(
                "no client.json (μqSim cannot run this directory either): give --qps to import "
                "it without one",
                where=str(fc),
            )
        dur = duration_s if duration_s is not None else 10.0
        return [qps], [dur], [f"no client.json: {qps:g} req/s for {dur:g} s"]
    client = _read(fc)
    qs = _numbers(client, "epoch_qps", fc)
    if isinstance(client, dict) and "epoch_end_sec" in client:
        ends = _numbers(client, "epoch_end_sec", fc)
    elif isinstance(client, dict) and "epoch_end_us" in client:
        ends = [x / 1e6 for x in _numbers(client, "epoch_end_us", fc)]
    else:
        raise InputError("missing 'epoch_end_sec' (or 'epoch_end_us')", where=str(fc))
    if len(qs) != len(ends) or not qs:
        raise InputError("epoch_qps and the epoch ends differ in length", where=str(fc))
    if any(not math.isfinite(q) or q < 0 for q in qs) or any(not math.isfinite(t) for t in ends):
        raise InputError("epoch rates must be numbers >= 0 and ends finite", where=str(fc))
    if any(b <= a for a, b in zip([0.0, *ends], ends, strict=False)):
        raise InputError("epoch ends must increase from 0", where=str(fc))
    notes = []
    if qps is None and any(q <= 0 for q in qs):
        notes.append("epochs at 0 req/s run at 0.001 req/s (qsim needs a rate > 0)")
        qs = [q if q > 0 else 0.001 for q in qs]
    return qs, ends, notes


def convert(
    directory: Path,
    out: Path,
    *,
    qps: float | None = None,
    connections: int = 100,
    client_latency_us: float = 0.065,
    duration_s: float | None = None,
    as_uqsim_draws: bool = False,
) -> list[str]:
    """Write the model for a μqSim directory to ``out``; the notes on what was approximated.

    A feature qsim cannot express raises :class:`UnsupportedError` (exit status 4) naming it
    and its file; a malformed file raises :class:`InputError` (status 3). With
    ``as_uqsim_draws`` the path and code-path weights are the shares μqSim's draw gives them
    (:func:`uqsim_choice`), for comparing the two engines like for like."""
    d = directory / "json" if (directory / "json" / "graph.json").is_file() else directory
    if not (d / "graph.json").is_file():
        raise InputError("not a μqSim architecture directory (no graph.json)", where=str(directory))
    notes: list[str] = []
    imp = _Importer(d, out, notes)
    fm, fg, fp = d / "machines.json", d / "graph.json", d / "path.json"
    machines = _get({"machines": _read(fm)}, "machines", fm, list)
    graph = _read(fg)
    paths = _get({"paths": _read(fp)}, "paths", fp, list)
    if not machines:
        raise InputError("expected a list of machines", where=str(fm))
    if not paths:
        raise InputError("expected a list of paths", where=str(fp))
    epochs_q, epochs_t, cnotes = _client_epochs(d, qps, duration_s)
    notes += cnotes
    net_lat_us = _num(graph, "net_latency", fg, 65000) / 1000.0

    # machines and their network stacks
    mach: dict[int, dict[str, Any]] = {}
    used_names: set[str] = set()
    for m in machines:
        mid = _int(m, "machine_id", fm)
        if mid in mach:
            raise InputError(f"duplicate machine_id {mid}", where=str(fm))
        name = _get(m, "name", fm, str, f"machine_{mid}")[:80] or f"machine_{mid}"
        if name in used_names:
            name = f"{name}_{mid}"
        used_names.add(name)
        cores = _int(m, "total_cores", fm, lo=1)
        ns = _get(m, "net_stack_sched", fm, dict)
        typ = _get(ns, "type", fm, str)
        if typ in ("LinuxNetStack", "Simplified"):
            q = _int(ns, "num_queues", fm, lo=1)
        elif typ == "CMT":
            q = _int(ns, "num_threads", fm, lo=1)
        else:
            raise UnsupportedError(
                f"machine {name!r}: network stack scheduler {typ!r} is not one of μqSim's "
                "(LinuxNetStack, Simplified, CMT)",
                where=str(fm),
            )
        ncores = sorted(set(_ints(ns, "cores", fm)))
        if not ncores or ncores[-1] >= cores or ncores[0] < 0:
            raise InputError(
                f"machine {name!r}: network stack cores must be 0..{cores - 1} and not empty",
                where=str(fm),
            )
        irq = len(ncores)
        if irq >= cores:
            raise UnsupportedError(
                f"machine {name!r}: every core serves the network stack (qsim keeps interrupt "
                "cores apart from the services' cores)",
                where=str(fm),
            )
        if ncores != list(range(irq)):
            notes.append(f"machine {name}: network cores are not 0..{irq - 1}; placed there")
        mach[mid] = {"name": name, "cores": cores, "irq": irq, "queues": q}
    imp.mach = mach

    # service instances by μqSim service name
    inst_of: dict[str, list[_Inst]] = defaultdict(list)
    for s in _get(graph, "microservices", fg, list):
        sname = _get(s, "service_name", fg, str)
        if not sname or len(sname) > 80:
            raise InputError(f"service name {sname!r} must be 1..80 characters", where=str(fg))
        model_name = _get(s, "model_name", fg, str, sname)  # older layouts: the service's name
        mid = _int(s, "machine_id", fg)
        if mid not in mach:
            raise InputError(f"service {sname!r}: unknown machine_id {mid}", where=str(fg))
        sch = _get(s, "scheduler", fg, dict)
        typ = _get(sch, "type", fg, str)
        if typ == "CMT":
            width = _int(sch, "num_threads", fg, lo=1)
        elif typ == "Simplified":
            width = _int(sch, "num_queues", fg, lo=1)
        else:
            raise UnsupportedError(
                f"service {sname!r}: scheduler {typ!r} (μqSim's services have CMT or Simplified)",
                where=str(fg),
            )
        icores = _ints(sch, "cores", fg)
        if not icores or max(icores) >= mach[mid]["cores"] or min(icores) < 0:
            raise InputError(
                f"service {sname!r}: cores must be within machine {mach[mid]['name']!r}'s "
                f"0..{mach[mid]['cores'] - 1} and not empty",
                where=str(fg),
            )
        if "core_affinity" in sch:
            notes.append(f"{sname}: core_affinity not imported (threads use the service's cores)")
        inst_of[sname].append(_Inst(sname, model_name, mid, typ, width, icores))

    # path nodes, identical sibling leaves folded
    groups: dict[str, list[str]] = {}  # folded service name -> μqSim service names
    parsed: list[dict[str, Any]] = []
    for pi, p in enumerate(paths):
        nl = _get(p, "nodes", fp, list)
        nodes: dict[int, dict[str, Any]] = {}
        for n in nl:
            nid = _int(n, "node_id", fp)
            if nid in nodes:
                raise InputError(f"path {pi}: duplicate node_id {nid}", where=str(fp))
            sync = _flag(n, "sync", fp)
            nodes[nid] = {
                "service_name": _get(n, "service_name", fp, str),
                "code_path": _get(n, "code_path", fp, int, 0),
                "start_stage": _int(n, "start_stage", fp, 0),
                "end_stage": _get(n, "end_stage", fp, int, -1),
                "childs": _ints(n, "childs", fp, []),
                "sync": _get(n, "sync_node_id", fp, int) if sync else None,
            }
        for nid, n in nodes.items():
            for c in [*n["childs"], *([n["sync"]] if n["sync"] is not None else [])]:
                if c not in nodes:
                    raise InputError(f"path {pi}: node {nid} names unknown node {c}", where=str(fp))
            if n["service_name"] != "client" and n["service_name"] not in inst_of:
                raise InputError(
                    f"path {pi}: node {nid} uses service {n['service_name']!r}, not in graph.json",
                    where=str(fp),
                )
        orig_parents: dict[int, list[int]] = defaultdict(list)
        for nid, n in nodes.items():
            for c in dict.fromkeys(n["childs"]):
                orig_parents[c].append(nid)
        roots = [nid for nid in nodes if not orig_parents[nid]]
        entry = _get(p, "entry", fp, int, roots[0] if roots else 0)
        if entry not in nodes or orig_parents[entry] or nodes[entry]["service_name"] == "client":
            raise InputError(f"path {pi}: entry {entry} is not a root service node", where=str(fp))
        weight = _num(p, "probability", fp, 100)

        def fold_key(n: dict[str, Any]) -> tuple[Any, ...] | None:
            insts = inst_of.get(n["service_name"], [])
            if len(insts) != 1 or n["sync"] is not None:
                return None
            i = insts[0]
            return (i.model, n["code_path"], n["start_stage"], n["end_stage"],
                    tuple(n["childs"]), i.threads, i.sched)  # fmt: skip

        entries: dict[int, dict[str, Any]] = {}
        rep: dict[int, int] = {}
        for nid, n in sorted(nodes.items()):
            if nid in rep:
                continue
            rep[nid] = nid
            e = {"id": nid, "node": n, "copies": 1, "service": n["service_name"]}
            key = fold_key(n)
            if key is not None and n["service_name"] != "client":
                sibs = []
                for q in orig_parents[nid][:1]:
                    sibs = [c for c in dict.fromkeys(nodes[q]["childs"])
                            if c != nid and c not in rep and fold_key(nodes[c]) == key]  # fmt: skip
                if sibs:
                    members = [nid, *sibs]
                    fname = key[0]
                    while fname in inst_of and fname not in groups:
                        fname += "_group"
                    if fname in groups and groups[fname] != [
                        nodes[c]["service_name"] for c in members
                    ]:
                        fname = f"{fname}_{pi}_{nid}"
                    groups[fname] = [nodes[c]["service_name"] for c in members]
                    e.update(copies=len(members), service=fname)
                    for c in sibs:
                        rep[c] = nid
            entries[nid] = e
        if weight <= 0:
            notes.append(f"path {pi}: probability {weight:g}, never taken: not imported")
            continue
        parsed.append({"index": pi, "p": p, "nodes": nodes, "entries": entries, "rep": rep,
                       "orig_parents": orig_parents, "entry": entry, "weight": weight})  # fmt: skip
    if not parsed:
        raise InputError("no path has a probability > 0", where=str(fp))
    if as_uqsim_draws:
        for pp, w in zip(parsed, uqsim_choice([pp["weight"] for pp in parsed]), strict=True):
            pp["weight"] = w
        parsed = [pp for pp in parsed if pp["weight"] > 0]

    # services used by the paths
    svcs: dict[str, _Svc] = {}
    for pp in parsed:
        for e in pp["entries"].values():
            if e["service"] == "client" or e["service"] in svcs:
                continue
            insts = [i for nm in groups.get(e["service"], [e["service"]]) for i in inst_of[nm]]
            mdl, where = imp.model(insts[0].model, fg)
            svcs[e["service"]] = _Svc(insts, mdl, where)
    for sname, svc in svcs.items():
        _read_code_paths(sname, svc, notes)
        if as_uqsim_draws and svc.cp_weights:
            ws = uqsim_choice([w for _, w in svc.cp_weights])
            svc.cp_weights = [(c, w) for (c, _), w in zip(svc.cp_weights, ws, strict=True) if w > 0]
        if len({(i.sched, i.threads, len(i.cores)) for i in svc.insts}) > 1:
            notes.append(f"{sname}: instances differ in scheduler or threads; the first's used")

    out_lines: list[str] = [
        f"# Imported from the μqSim architecture directory {_comment(str(directory))} by musku qsim "
        "import-uqsim.",
        "# μqSim's built-in timing rules are explicit below (docs/qsim.md, 'Importing μqSim').",
        "",
    ]
    out_lines += ["[run]", f"duration_s = {epochs_t[-1]:g}", "warmup_s = 0.0", "", "[network]",
                  f"latency_us = {net_lat_us:g}",
                  "# μqSim: the client's own hop is its command-line netLat (in ns)",
                  f"client_latency_us = {client_latency_us:g}", ""]  # fmt: skip
    for m in mach.values():
        out_lines += ["[[machines]]", f"name = {_q(m['name'])}", f"cores = {m['cores']}",
                      f"irq_cores = {m['irq']}", f"freq_base_ghz = {BASE_GHZ:g}", ""]  # fmt: skip

    names_taken = set(svcs)
    for sname, svc in svcs.items():
        out_lines += _service_lines(imp, sname, svc, connections, qps)

    # one network stack per machine (services spread over several machines, a fan-out's
    # folded leaves: one over those machines, an instance per machine as μqSim's stacks)
    net, nwhere = imp.model("net_stack", fg)
    net_cps: dict[int, dict[str, Any]] = {}
    for cp in _get(net, "paths", nwhere, list):
        sts = _get(cp, "stages", nwhere, list)
        if sts:
            net_cps[_int(cp, "code_path_id", nwhere)] = sts[0]
    for k in range(4):
        if k not in net_cps:
            raise InputError(f"net_stack needs code paths 0..3 (no {k})", where=str(nwhere))
    # an empty name gets one, as a service's stage does (qsim names every stage)
    net_names = [_get(net_cps[k], "stage_name", nwhere, str) or f"net{k}" for k in range(4)]
    if len(set(net_names)) != 4:
        net_names = [f"{n}_{k}" for k, n in enumerate(net_names)]
    net_ratio = _freq_ratio(net, nwhere)
    net_of_key: dict[Any, str] = {}
    for sname, svc in svcs.items():
        m = svc.machine
        nkey: Any = m if m is not None else ("svc", sname)
        if nkey not in net_of_key:
            nm = "net_" + (mach[m]["name"] if m is not None else sname)
            while nm in names_taken:
                nm += "_net"
            names_taken.add(nm)
            net_of_key[nkey] = nm
            if m is not None:
                q = mach[m]["queues"]
                out_lines += ["[[services]]", f"name = {_q(nm)}", "irq = true", "threads = 1",
                              f"connections = {connections}", 'lb = "connection"', f"instances = {q}",
                              "machines = [" + ", ".join([_q(mach[m]["name"])] * q) + "]"]  # fmt: skip
            else:
                q = max(mach[i.machine]["queues"] for i in svc.insts)
                out_lines += ["[[services]]", f"name = {_q(nm)}", "irq = true", f"threads = {q}",
                              f"connections = {connections}", 'lb = "round_robin"',
                              f"instances = {len(svc.insts)}",
                              "machines = [" + ", ".join(_q(mach[i.machine]["name"]) for i in svc.insts) + "]"]  # fmt: skip
            if net_ratio != 1:
                out_lines.append(f"freq_ghz = {BASE_GHZ / net_ratio:.6g}")
            out_lines.append("")
            for k in range(4):
                st = net_cps[k]
                out_lines += ["  [[services.stages]]", f"  name = {_q(net_names[k])}",
                              f"  time = {_time(imp, st, nwhere, 'net_stack', net_names[k], qps)}",
                              f"  dvfs_scale = {_scale(st, nwhere, net_names[k]):g}", ""]  # fmt: skip
        svc.net = net_of_key[nkey]

    crit: dict[tuple[str, int], str] = {}
    for pp in parsed:
        pp["fp"] = str(fp)
        pp["crit"] = crit
        out_lines += _PathWriter(pp, svcs, net_names, notes).lines()

    out_lines += ["[client]", 'kind = "open"', f"connections = {connections}"]
    if qps is not None:
        out_lines.append(f"qps = {qps:g}")
    else:
        eps = ", ".join(
            f"{{ until_s = {t:g}, qps = {q:g} }}" for q, t in zip(epochs_q, epochs_t, strict=True)
        )
        out_lines.append(f"epochs = [{eps}]")
    out_lines.append("")
    notes = list(dict.fromkeys(notes))
    if notes:
        out_lines = [*out_lines[:2], *(f"# note: {_comment(n)}" for n in notes), *out_lines[2:]]
    out.write_text("\n".join(out_lines))
    return notes


def _read_code_paths(sname: str, svc: _Svc, notes: list[str]) -> None:
    """The model's code paths, their choice weights and unique stage names; one line for what
    qsim cannot express (a critical section, a stage order other than μqSim's default)."""
    where = svc.where
    weights: list[tuple[int, float]] = []
    for cp in _get(svc.model, "paths", where, list):
        cid = _int(cp, "code_path_id", where)
        sts = _get(cp, "stages", where, list)
        if not sts:
            raise InputError(f"code path {cid} of {sname!r} has no stages", where=str(where))
        for st in sts:
            if not isinstance(st, dict):
                raise InputError(f"code path {cid}: a stage must be an object", where=str(where))
            if _flag(st, "critical_section", where):
                _int(st, "thread_limit", where, lo=1)
            if "resp_time_model" in st:
                notes.append(f"{sname}: resp_time_model ignored (μqSim does not use it either)")
        if "priority" in cp:
            prio = _get(cp, "priority", where, list)
            default = list(range(len(sts) - 1, -1, -1))
            if prio != default:
                raise UnsupportedError(
                    f"code path {cid} of {sname!r}: stage priority {prio} (qsim serves the "
                    f"latest stage with work first, μqSim's default {default})",
                    where=str(where),
                )
        if "probability" in cp:
            weights.append((cid, _num(cp, "probability", where)))
        svc.cps[cid] = sts
    if weights and len(weights) == len(svc.cps) and sum(w for _, w in weights) > 0:
        svc.cp_weights = [(c, w) for c, w in weights if w > 0]
    seen: dict[str, int] = {}
    for sts in svc.cps.values():
        for st in sts:
            sid = _int(st, "stage_id", where)
            name = _get(st, "stage_name", where, str) or f"stage{sid}"
            if sid in svc.names:
                continue
            if name in seen and seen[name] != sid:
                name = f"{name}_{sid}"
            seen[name] = sid
            svc.names[sid] = name[:100]


# Every job of a μqSim batch finishes at one instant, and its Thread::enqueue then puts the
# batch's requests into the next stage in reverse order (docs/qsim.md, "Near saturation").
HANDOFF = '  handoff = "uqsim"'


def _stage_lines(imp: _Importer, sname: str, svc: _Svc, qps: float | None) -> list[str]:
    where = svc.where
    simplified = svc.insts[0].sched == "Simplified"
    by_id: dict[int, dict[str, Any]] = {}
    for sts in svc.cps.values():
        for st in sts:
            by_id.setdefault(_int(st, "stage_id", where), st)
    lines: list[str] = []
    for sid in sorted(by_id):
        st = by_id[sid]
        name = svc.names[sid]
        scale = _scale(st, where, name)
        lines += ["  [[services.stages]]", f"  name = {_q(name)}"]
        if simplified:
            # μqSim's Simplified scheduler runs a job's whole code path on a free core, each
            # stage one draw of its time model (no epoll, socket or batching rules)
            lines += ['  queue = "fifo"', f"  time = {_time(imp, st, where, sname, name, qps)}"]
        elif _flag(st, "epoll", where):
            table = ", ".join(f"[{n}, {v:g}]" for n, v in _epoll_table())
            lines += ['  queue = "epoll"', "  batch = 1", HANDOFF,
                      "  # μqSim: exp(round(0.38 (n - 7) + 3.8) us) for n ready connections",
                      f'  time = {{ dist = "exp", bytes_per_job = 1, bytes_table = [{table}] }}']  # fmt: skip
        elif _flag(st, "socket", where):
            table = ", ".join(f"[{b}, {v:g}]" for b, v in SOCKET_TABLE_US)
            lines += ['  queue = "socket"', "  batch = 1000000", HANDOFF,
                      "  # μqSim: a read of 7 bytes per job, cost by size",
                      f'  time = {{ dist = "exp", bytes_per_job = {SOCKET_BYTES_PER_JOB}, '
                      f"bytes_table = [{table}] }}"]  # fmt: skip
        elif _flag(st, "ngx_proc", where):
            csv_name = f"{imp.out.stem}.{sname}.{name}.csv"
            (imp.out.parent / csv_name).write_text(
                "# μqSim's nginx processing table (us), 100 equally likely values\n"
                + "".join(f"{v:g}\n" for v in _ngx_table_us())
            )
            imp.side_files.append(csv_name)
            lines += [
                '  queue = "fifo"',
                f'  time = {{ dist = "empirical", file = {_q(csv_name)} }}',
            ]
            # μqSim's own rule for this stage: 0.6 + 0.4 f_base / f (not the file's scale_factor)
            scale = NGX_PROC_DVFS_SCALE
        elif _flag(st, "batching", where):
            lines += ['  queue = "fifo"', "  batch = 1000000", HANDOFF,
                      "  # μqSim: a batching stage takes every queued job for one draw",
                      f"  time = {_time(imp, st, where, sname, name, qps)}"]  # fmt: skip
        else:
            lines += ['  queue = "fifo"', f"  time = {_time(imp, st, where, sname, name, qps)}"]
        lines += [f"  dvfs_scale = {scale:g}", ""]
    return lines


def _service_lines(
    imp: _Importer, sname: str, svc: _Svc, connections: int, qps: float | None
) -> list[str]:
    insts = svc.insts
    first = insts[0]
    ratio = _freq_ratio(svc.model, svc.where)
    if first.sched == "Simplified":
        # queues served by any free core of the service: a pool of one thread per core
        ncores = len(set(first.cores))
        lines = ["[[services]]", f"name = {_q(sname)}", 'execution = "threads"',
                 f"threads = {ncores}", f"cores_per_instance = {ncores}",
                 f"connections = {connections}", 'lb = "round_robin"', f"instances = {len(insts)}",
                 "machines = [" + ", ".join(_q(imp.mach[i.machine]["name"]) for i in insts) + "]"]  # fmt: skip
    else:
        # μqSim's CMT scheduler gives every thread its own queue and binds a connection to the
        # thread that first served it (bind_connection): one single-thread instance per
        # thread, a connection-bound load balancer (a service with several μqSim instances, a
        # fan-out's leaves, keeps a pool per instance so that its instances stay one per machine)
        nthr = first.threads
        bound = _get(svc.model, "bind_connection", svc.where, bool, True)
        svc.split = len(insts) == 1
        split = svc.split
        lines = ["[[services]]", f"name = {_q(sname)}", 'execution = "threads"',
                 f"threads = {1 if split else nthr}",
                 f"cores_per_instance = {1 if split else max(1, len(set(first.cores)))}",
                 f"connections = {connections}",
                 f"lb = {_q('connection' if bound and split else 'round_robin')}",
                 f"instances = {len(insts) * (nthr if split else 1)}",
                 "machines = [" + ", ".join(_q(imp.mach[i.machine]["name"]) for i in insts
                                            for _ in range(nthr if split else 1)) + "]"]  # fmt: skip
    if ratio != 1:
        # μqSim's cur_freq: this service's cores run at base x cur_freq / base_freq
        lines.append(f"freq_ghz = {BASE_GHZ / ratio:.6g}")
    return [*lines, "", *_stage_lines(imp, sname, svc, qps)]


def _time(imp: _Importer, st: dict[str, Any], where: Path, sname: str, stage: str,
          qps: float | None) -> str:  # fmt: skip
    """A stage's time: its ``recv_time_model``, times its chunk model's number of draws."""
    tm = _get(st, "recv_time_model", where, dict)
    kind = _get(tm, "type", where, str)
    lat = _num(tm, "latency", where) / 1000.0
    if kind not in ("expo", "const"):
        raise InputError(f"stage {stage!r}: unknown time model type {kind!r} (expo, const)",
                         where=str(where))  # fmt: skip
    if sname == "mongodb" and stage == "proc_cache_hit":
        # a formula in μqSim's parser (cluster_parser.cc): latency x 5000 / (1000 + kqps x 1000),
        # kqps its command-line rate (0 when client.json's epochs are used)
        f = 5000.0 / (1000.0 + (qps or 0.0))
        imp.notes.append(f"{sname}.{stage}: μqSim's load rule x{f:.4g} applied (its parser's)")
        lat *= f
    if lat > 1e12:
        raise InputError(f"stage {stage!r}: latency over 10^12 us", where=str(where))
    if not _flag(st, "chunk", where):
        return f'{{ dist = "{"exp" if kind == "expo" else "const"}", mean_us = {lat:g} }}'
    # μqSim (stage.cc): a chunked stage's time is the sum of N draws of its time model, N from
    # the chunk model: "const" N, or "expo" ceil(Exp(mean number)) (geometric, p = 1 - e^-1/m)
    cm = _get(st, "chunk_model", where, dict)
    ctype = _get(cm, "type", where, str)
    num = _int(cm, "number", where, lo=1)
    if ctype not in ("expo", "const"):
        raise InputError(f"stage {stage!r}: unknown chunk model type {ctype!r} (expo, const)",
                         where=str(where))  # fmt: skip
    if ctype == "const" and kind == "const":
        return f'{{ dist = "const", mean_us = {lat * num:g} }}'
    if ctype == "const" and num == 1:
        return f'{{ dist = "exp", mean_us = {lat:g} }}'
    if ctype == "expo" and kind == "expo":
        # a geometric number of exponentials is exponential: mean lat / p
        p = -math.expm1(-1.0 / num)
        return f'{{ dist = "exp", mean_us = {lat / p:.6g} }}'
    csv_name = f"{imp.out.stem}.{sname}.{stage}.csv"
    if ctype == "const":  # Erlang(num, lat): its quantiles
        rows = [(lat * x, 1.0) for x in _erlang_quantiles(num, CHUNK_QUANTILES)]
        mean, what = lat * num, f"sum of {num} exp({lat:g} us) draws (Erlang quantiles)"
    else:  # const lat x geometric count
        p = -math.expm1(-1.0 / num)
        rows, k = [], 1
        while k <= 100_000:
            w = p * (1 - p) ** (k - 1)
            if w < 1e-12:
                break
            rows.append((lat * k, w))
            k += 1
        mean, what = lat / p, f"{lat:g} us x ceil(Exp({num})) chunks"
    (imp.out.parent / csv_name).write_text(
        f"# μqSim chunked stage {sname}.{stage}: {what}\n"
        + "".join(f"{v:.6g},{w:.6g}\n" for v, w in rows)
    )
    imp.side_files.append(csv_name)
    return f'{{ dist = "empirical", file = {_q(csv_name)}, mean_us = {mean:.6g} }}'


class _PathWriter:
    """One μqSim path as qsim nodes. Every μqSim node ``N`` becomes ``nN`` (its stages);
    a message over the network is a send node on the sender's network stack (``txN_C``:
    ``send_local`` when both ends are on one machine, else ``send_remote``) and, from another
    machine, a receive node on the receiver's (``rxC``); a node whose last stage is not a
    ``net`` stage hands the job straight on (μqSim's disk I/O). A node choosing its code path
    at random (``code_path = -1``) becomes one node per code path after its receive node
    (``branch = "one"``, the model's probabilities), the rest of the path copied below each."""

    def __init__(self, pp: dict[str, Any], svcs: dict[str, _Svc], net_names: list[str],
                 notes: list[str]) -> None:  # fmt: skip
        self.pp = pp
        self.svcs = svcs
        self.net = net_names  # send_local, send_remote, recv_local, recv_remote
        self.notes = notes
        self.entries: dict[int, dict[str, Any]] = pp["entries"]
        self.rep: dict[int, int] = pp["rep"]
        self.out: list[dict[str, Any]] = []
        self.done: dict[int, list[tuple[str, float | None]]] = {}
        self.parents: dict[int, list[int]] = defaultdict(list)
        for e in self.entries.values():
            for c in dict.fromkeys(self.rep[x] for x in e["node"]["childs"]):
                self.parents[c].append(e["id"])
        self.where = str(pp["fp"])
        self.crit: dict[tuple[str, int], str] = pp["crit"]  # critical stage -> its node
        # sync (blocking) pairs: the holder's id -> its sync node's id
        self.release: set[tuple[int, str]] = set()

    def critical(self, svc: _Svc, sname: str, st: dict[str, Any]) -> int:
        """A critical section's thread limit (0: none). μqSim's Simplified scheduler has no
        locks (it is given none), so there it is a plain stage."""
        if not bool(st.get("critical_section")) or svc.insts[0].sched == "Simplified":
            return 0
        if len(svc.insts) > 1:
            raise UnsupportedError(
                f"stage {st.get('stage_name')!r} of {sname!r} is a critical section of a service "
                f"with {len(svc.insts)} instances (a lock each): qsim's pool would be shared",
                where=str(svc.where),
            )
        return _int(st, "thread_limit", svc.where, lo=1)

    def client(self, eid: int) -> bool:
        return bool(self.entries[eid]["service"] == "client")

    def stages(self, eid: int, cp: int) -> list[dict[str, Any]]:
        e = self.entries[eid]
        svc = self.svcs[e["service"]]
        if cp not in svc.cps:
            raise InputError(f"node {eid}: service {e['service']!r} has no code path {cp}",
                             where=str(svc.where))  # fmt: skip
        n = e["node"]
        sts = svc.cps[cp]
        end = n["end_stage"]
        sts = sts[n["start_stage"] :] if end < 0 else sts[n["start_stage"] : end + 1]
        if not sts:
            raise InputError(f"node {eid}: stages {n['start_stage']}..{end} of code path {cp} "
                             f"of {e['service']!r} are empty", where=str(svc.where))  # fmt: skip
        return sts

    def hop(self, pid: int, pcp: int, cid: int) -> str:
        """How a job goes from node pid (run on code path pcp) to node cid."""
        if self.client(cid):
            return "remote"  # μqSim sends every reply through the network
        pe, ce = self.entries[pid], self.entries[cid]
        pm, cm = self.svcs[pe["service"]].machine, self.svcs[ce["service"]].machine
        if not bool(self.stages(pid, pcp)[-1].get("net")):
            if pm is None or pm != cm:
                self.notes.append(f"node {pid} -> {cid}: handed on without the network between "
                                  "machines: qsim charges the network latency, μqSim none")  # fmt: skip
            return "direct"
        if pm is not None and pm == cm and pe["copies"] == 1 and ce["copies"] == 1:
            return "local"
        return "remote"

    def add(self, node: dict[str, Any]) -> str:
        self.out.append(node)
        return str(node["name"])

    def emit(self, eid: int, sfx: str) -> list[tuple[str, float | None]]:
        """Emit node eid (and what follows); its first nodes with their choice weights."""
        multi = len(self.parents[eid]) > 1
        if multi and eid in self.done:
            return self.done[eid]
        if multi and sfx:
            raise UnsupportedError(
                f"path {self.pp['index']}: node {eid} joins branches below a random code-path "
                "choice (qsim would need the choice to end at a fan-in)",
                where=self.where,
            )
        e = self.entries[eid]
        svc = self.svcs[e["service"]]
        n = e["node"]
        cp = int(n["code_path"])
        if cp == -1:
            if not svc.cp_weights:
                raise InputError(f"node {eid}: code_path -1 but {e['service']!r} gives its code "
                                 "paths no probability", where=str(svc.where))  # fmt: skip
            alts: list[tuple[int, float | None]] = [(c, w) for c, w in svc.cp_weights]
        else:
            alts = [(cp, None)]
        if len(alts) > 1 and e["copies"] > 1:
            raise UnsupportedError(f"path {self.pp['index']}: copies of node {eid} choose a code "
                                   "path at random", where=self.where)  # fmt: skip
        firsts: list[tuple[str, float | None]] = []
        orig_parents = len(self.pp["orig_parents"][e["id"]])
        for c, w in alts:
            asfx = sfx if len(alts) == 1 else f"{sfx}_cp{c}"
            name = f"n{eid}{asfx}"
            sts = self.stages(eid, c)
            # a critical section runs in a node of its own reached through a pool of
            # thread_limit connections (at most that many jobs in it at once)
            segs: list[list[dict[str, Any]]] = [[]]
            for st in sts:
                cs = self.critical(svc, e["service"], st)
                if cs:
                    segs += [[st], []]
                else:
                    segs[-1].append(st)
            segs = [g for g in segs if g]
            nodes: list[dict[str, Any]] = []
            for gi, g in enumerate(segs):
                nd: dict[str, Any] = {
                    "name": name if gi == 0 else f"{name}_{gi}",
                    "service": e["service"],
                    "stages": [svc.names[int(x["stage_id"])] for x in g],
                    "children": [],
                }
                limit = self.critical(svc, e["service"], g[0])
                if limit:
                    nd["pool"] = limit
                    key = (e["service"], int(g[0]["stage_id"]))
                    if self.crit.setdefault(key, nd["name"]) != nd["name"]:
                        raise UnsupportedError(
                            f"stage {svc.names[key[1]]!r} of {e['service']!r} is a critical "
                            f"section run by several path nodes ({self.crit[key]}, {nd['name']}):"
                            " qsim's pools are per node, μqSim's lock per service",
                            where=str(svc.where),
                        )
                if nodes:
                    nodes[-1]["children"] = [nd["name"]]
                nodes.append(nd)
            if orig_parents > 1 and len(self.parents[eid]) == 1:
                nodes[0]["gather"] = True  # folded leaves' copies join here
            if n["sync"] is not None and bool(sts[-1].get("blocking")):
                # μqSim: a blocking last stage keeps the thread until the sync node runs on it
                nodes[-1]["hold_thread"] = True
                self.release.add((n["sync"], asfx))
            if (eid, sfx) in self.release:
                nodes[0]["release_thread"] = True
            for nd in nodes:
                self.add(nd)
            node = nodes[-1]
            firsts.append((name, w))
            kids = list(dict.fromkeys(self.rep[x] for x in n["childs"]))
            for k in kids:
                if self.client(k):
                    reply = {"name": _tx(f"{eid}{asfx}", None), "service": svc.net,
                             "stages": [self.net[1]], "children": []}  # fmt: skip
                    node["children"].append(self.add(reply))
                    continue
                kind = self.hop(eid, c, k)
                node["children"].append(self.edge(f"{eid}{asfx}", svc, kind, k, asfx))
        if multi:
            self.done[eid] = firsts
        return firsts

    def edge(self, src: str, svc: _Svc, kind: str, cid: int, sfx: str) -> str:
        """The hop from node ``src`` to node cid: its first node (the send, or cid itself)."""
        ce = self.entries[cid]
        copies = ce["copies"]
        multi = len(self.parents[cid]) > 1
        if kind == "direct":
            firsts = self.emit(cid, sfx)
            if len(firsts) > 1:
                raise UnsupportedError(f"path {self.pp['index']}: node {cid} chooses its code "
                                       "path at random after a hop that is not over the network",
                                       where=self.where)  # fmt: skip
            if copies > 1:
                self._set(firsts[0][0], copies=copies)
            return firsts[0][0]
        tx: dict[str, Any] = {"name": _tx(src, str(cid)), "service": svc.net,
                              "stages": [self.net[0] if kind == "local" else self.net[1]],
                              "children": []}  # fmt: skip
        if copies > 1:
            tx["copies"] = copies
        self.add(tx)
        if kind == "local":
            firsts = self.emit(cid, sfx)
            if len(firsts) > 1:
                raise UnsupportedError(f"path {self.pp['index']}: node {cid} chooses its code "
                                       "path at random after a local hop", where=self.where)  # fmt: skip
            tx["children"] = [firsts[0][0]]
        else:
            rx = f"rx{cid}{sfx}" if not multi else f"rx{src}_{cid}"
            node: dict[str, Any] = {"name": rx, "service": self.svcs[ce["service"]].net,
                                    "stages": [self.net[3]], "children": []}  # fmt: skip
            self.add(node)
            firsts = self.emit(cid, sfx)
            node["children"] = [f for f, _ in firsts]
            if len(firsts) > 1:
                node["branch"] = "one"
                node["child_weights"] = [w for _, w in firsts]
            tx["children"] = [rx]
        return str(tx["name"])

    def _set(self, name: str, **kv: Any) -> None:
        for nd in self.out:
            if nd["name"] == name:
                nd.update(kv)

    def lines(self) -> list[str]:
        pp = self.pp
        root = pp["entry"]
        firsts = self.emit(root, "")
        svc = self.svcs[self.entries[root]["service"]]
        node: dict[str, Any] = {"name": f"rx{root}", "service": svc.net, "stages": [self.net[3]],
                                "children": [f for f, _ in firsts]}  # fmt: skip
        if len(firsts) > 1:
            node["branch"] = "one"
            node["child_weights"] = [w for _, w in firsts]
        nodes = [node, *self.out]
        holders = {(nd["name"]) for nd in nodes if nd.get("hold_thread")}
        released = any(nd.get("release_thread") for nd in nodes)
        if holders and not released:
            raise InputError(f"path {pp['index']}: a blocking node's sync node is not below it",
                             where=self.where)  # fmt: skip
        p = pp["p"]
        out = ["[[paths]]", f"name = {_q('path_' + str(p.get('micro_service_path_id', pp['index'])))}",
               f"weight = {pp['weight']:g}", ""]  # fmt: skip
        for nd in nodes:
            out += ["  [[paths.nodes]]", f"  name = {_q(nd['name'])}",
                    f"  service = {_q(nd['service'])}",
                    "  stages = [" + ", ".join(_q(s) for s in nd["stages"]) + "]"]  # fmt: skip
            if nd["children"]:
                out.append("  children = [" + ", ".join(_q(c) for c in nd["children"]) + "]")
            if nd.get("branch"):
                out += ['  branch = "one"',
                        "  child_weights = [" + ", ".join(f"{w:g}" for w in nd["child_weights"]) + "]"]  # fmt: skip
            if nd.get("copies", 1) > 1:
                out.append(f"  copies = {nd['copies']}")
            if nd.get("pool"):
                out.append(f"  pool = {nd['pool']}")
            for k in ("gather", "hold_thread", "release_thread"):
                if nd.get(k):
                    out.append(f"  {k} = true")
            out.append("")
        return out


# ---------------------------------------------------------------------------------------------
# μqSim-format inputs written from our own parameters (for tests and side-by-side benchmarks;
# no file of μqSim's repository is used).


def _stage(sid: int, cp: int, pos: int, name: str, lat_ns: int, kind: str = "expo",
           scale: float = 0.0, **flags: bool) -> dict[str, Any]:  # fmt: skip
    st: dict[str, Any] = {
        "stage_id": sid, "code_path_id": cp, "path_stage_id": pos, "stage_name": name,
        "scale_factor": scale, "recv_time_model": {"type": kind, "latency": lat_ns},
    }  # fmt: skip
    for f in (
        "socket",
        "epoll",
        "chunk",
        "blocking",
        "ngx_proc",
        "critical_section",
        "batching",
        "net",
    ):
        st[f] = bool(flags.get(f, False))
    return st


def _service(name: str, code_paths: list[list[dict[str, Any]]]) -> dict[str, Any]:
    return {
        "service_name": name, "type": "micro_service", "bind_connection": True,
        "base_freq": 2600, "cur_freq": 2600,
        "paths": [{"code_path_id": i, "num_stages": len(s), "stages": s} for i, s in enumerate(code_paths)],
    }  # fmt: skip


def _machine(mid: int, cores: int, irq: int) -> dict[str, Any]:
    return {
        "machine_id": mid, "name": f"host{mid}", "total_cores": cores,
        "net_stack_sched": {"type": "LinuxNetStack", "num_queues": irq, "cores": list(range(irq)),
                            "core_affinity": [{"queue": q, "cores": [q]} for q in range(irq)]},
    }  # fmt: skip


def _instance(name: str, model: str, mid: int, threads: int, first_core: int) -> dict[str, Any]:
    return {
        "service_name": name, "service_domain": "", "instance_name": name, "model_name": model,
        "machine_id": mid,
        "scheduler": {"type": "CMT", "num_threads": threads,
                      "cores": list(range(first_core, first_core + threads))},
    }  # fmt: skip


def _node(nid: int, service: str, childs: list[int], code_path: int = 0) -> dict[str, Any]:
    return {
        "node_id": nid, "service_name": service, "service_domain": "", "code_path": code_path,
        "start_stage": 0, "end_stage": -1, "sync": False, "childs": childs,
    }  # fmt: skip


def write_example(
    directory: Path, kind: str, *, qps: float, duration_s: float, leaves: int = 5
) -> Path:
    """Write a μqSim architecture directory: ``2tier`` (a web front end with an epoll loop and
    a request stage, in front of a cache with a batching poll, a socket read, a lookup and a
    send), ``fanout`` (a dispatcher and ``leaves`` leaves of 200 us each, one machine each) or
    ``features`` (a random code path, a local hop, a blocking stage and its sync node, the
    Simplified scheduler, a chunked stage, ``cur_freq`` and the ``epoch_end_us`` client).
    Our own parameters; the same shapes as μqSim's own examples."""
    d = directory
    (d / "microservice").mkdir(parents=True, exist_ok=True)
    net = _service("net_stack", [
        [_stage(0, 0, 0, "tx_local", 1200, net=True)], [_stage(1, 1, 0, "tx_remote", 900, net=True)],
        [_stage(2, 2, 0, "rx_local", 1200, net=True)], [_stage(3, 3, 0, "rx_remote", 3500, net=True)],
    ])  # fmt: skip
    models: dict[str, Any] = {"net_stack": net}
    if kind == "2tier":
        models["web"] = _service("web", [[
            _stage(0, 0, 0, "poll", 1500, scale=0.5, epoll=True, batching=True),
            _stage(1, 0, 1, "handle", 12000, scale=0.7, net=True),
        ]])  # fmt: skip
        models["cache"] = _service("cache", [[
            _stage(0, 0, 0, "poll", 1200, scale=0.5, batching=True),
            _stage(1, 0, 1, "read", 1200, scale=0.3, socket=True, batching=True),
            _stage(2, 0, 2, "lookup", 900, scale=0.4),
            _stage(3, 0, 3, "reply", 6000, scale=0.3, net=True),
        ]])  # fmt: skip
        machines = [_machine(0, 24, 12), _machine(1, 24, 12)]
        insts = [_instance("web", "web", 0, 6, 12), _instance("cache", "cache", 1, 4, 12)]
        edges = [{"source": "web", "target": "cache", "biDirectional": True}]
        nodes = [
            _node(0, "web", [1]),
            _node(1, "cache", [2]),
            _node(2, "web", [3]),
            _node(3, "client", []),
        ]
    elif kind == "fanout":
        models["dispatch"] = _service(
            "dispatch", [[_stage(0, 0, 0, "split", 2000, "const", net=True)]]
        )
        models["leaf"] = _service("leaf", [[_stage(0, 0, 0, "work", 200000, net=True)]])
        machines = [_machine(m, 4, 2) for m in range(leaves + 1)]
        insts = [_instance("dispatch", "dispatch", 0, 2, 2)] + [
            _instance(f"leaf_{i}", "leaf", i + 1, 1, 2) for i in range(leaves)
        ]
        edges = [
            {"source": "dispatch", "target": f"leaf_{i}", "biDirectional": True}
            for i in range(leaves)
        ]
        nodes = [_node(0, "dispatch", list(range(1, leaves + 1)))] + [
            _node(i + 1, f"leaf_{i}", [leaves + 1]) for i in range(leaves)
        ] + [_node(leaves + 1, "client", [])]  # fmt: skip
    elif kind == "features":
        # the features μqSim's 3tier, 4tier and thrift_app examples use, on a small graph:
        # front (m0) -> cache (m1, code path chosen at random 70/30) -> db (m1: a local hop;
        # 1.3 GHz of 2.6; a blocking stage waiting for) -> disk (m1, Simplified scheduler, a
        # chunked stage: 3 draws; handed on without the network) -> db again -> client
        models["front"] = _service("front", [[
            _stage(0, 0, 0, "recv", 10000), _stage(1, 0, 1, "reply", 5000, net=True),
        ]])  # fmt: skip
        models["cache"] = _service("cache", [
            [_stage(0, 0, 0, "hit", 2000, net=True)], [_stage(1, 1, 0, "miss", 4000, net=True)],
        ])  # fmt: skip
        models["cache"]["paths"][0]["probability"] = 70
        models["cache"]["paths"][1]["probability"] = 30
        models["db"] = _service("db", [[
            _stage(0, 0, 0, "parse", 3000, scale=0.5),
            _stage(1, 0, 1, "wait", 1000, scale=0.5, blocking=True),
            _stage(2, 0, 2, "finish", 2000, scale=0.5, net=True),
        ]])  # fmt: skip
        models["db"]["cur_freq"] = 1300
        models["disk"] = _service("disk", [[_stage(0, 0, 0, "io", 100000, chunk=True)]])
        models["disk"]["paths"][0]["stages"][0]["chunk_model"] = {"type": "const", "number": 3}
        machines = [_machine(0, 8, 2), _machine(1, 8, 2)]
        disk = _instance("disk", "disk", 1, 1, 6)
        disk["scheduler"] = {"type": "Simplified", "num_queues": 1, "cores": [6]}
        insts = [_instance("front", "front", 0, 2, 2), _instance("cache", "cache", 1, 2, 2),
                 _instance("db", "db", 1, 2, 4), disk]  # fmt: skip
        edges = []
        nodes = [
            _node(0, "front", [1]),
            _node(1, "cache", [2], code_path=-1),
            {**_node(2, "db", [3]), "end_stage": 1, "sync": True, "sync_node_id": 4},
            _node(3, "disk", [4]),
            {**_node(4, "db", [5]), "start_stage": 2},
            _node(5, "client", []),
        ]
    else:
        raise InputError(f"unknown example {kind!r} (2tier, fanout, features)")
    for name, m in models.items():
        (d / "microservice" / f"{name}.json").write_text(json.dumps(m, indent=1))
    (d / "machines.json").write_text(json.dumps(machines, indent=1))
    (d / "graph.json").write_text(
        json.dumps({"microservices": insts, "edges": edges, "net_latency": 50000}, indent=1)
    )
    (d / "path.json").write_text(
        json.dumps(
            [{"micro_service_path_id": 0, "entry": 0, "probability": 100, "nodes": nodes}], indent=1
        )
    )
    client: dict[str, Any] = {"monitor_interval_sec": duration_s * 100, "epoch_qps": [qps],
                              "epoch_end_sec": [duration_s]}  # fmt: skip
    if kind == "features":  # μqSim's later layout
        client = {"monitor_interval_us": duration_s * 1e8, "epoch_qps": [qps],
                  "epoch_end_us": [duration_s * 1e6]}  # fmt: skip
    (d / "client.json").write_text(json.dumps(client))
    return d
