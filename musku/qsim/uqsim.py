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
  machine's interrupt cores, and every hop through it becomes explicit path nodes.

Identical sibling leaves (same service model and code path, one instance each, the same
children) are folded into one service with one instance per leaf and a node with ``copies``.
"""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path
from typing import Any

from musku.errors import InputError

# μqSim's built-in rules (src/stage.cc), as data.
SOCKET_BYTES_PER_JOB = 7
SOCKET_TABLE_US = [(35, 0.8), (70, 1.6), (270, 3.0), (786, 5.4), (1836, 11.6), (2268, 26.0)]
NGX_PROC_SCALE = 0.65
EPOLL_MAX_CONNECTIONS = 512


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


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def _read(path: Path) -> Any:
    """A μqSim JSON file, read within the input limits (a regular file of at most 1 MiB,
    nesting, list and number limits of :mod:`musku.inputfiles`; no NaN or Infinity)."""
    from musku.inputfiles import check_shape, read_text

    text = read_text(path)
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


def _need(d: Any, key: str, where: Path) -> Any:
    if not isinstance(d, dict) or key not in d:
        raise InputError(f"missing {key!r}", where=str(where))
    return d[key]


def _tx(node: int, child: int | None) -> str:
    return f"tx{node}" if child is None else f"tx{node}_{child}"


def _q(s: str) -> str:
    return json.dumps(s)


def _time(tm: dict[str, Any], where: Path) -> str:
    kind = tm.get("type")
    lat = float(tm.get("latency", 0)) / 1000.0
    if kind == "expo":
        return f'{{ dist = "exp", mean_us = {lat:g} }}'
    if kind == "const":
        return f'{{ dist = "const", mean_us = {lat:g} }}'
    raise InputError(f"unknown time model type {kind!r} (expo, const)", where=str(where))


def convert(
    directory: Path,
    out: Path,
    *,
    qps: float | None = None,
    connections: int = 100,
    client_latency_us: float = 0.065,
) -> list[str]:
    """Write the model for a μqSim directory to ``out``; the notes on what was approximated."""
    d = directory / "json" if (directory / "json" / "graph.json").is_file() else directory
    if not (d / "graph.json").is_file():
        raise InputError("not a μqSim architecture directory (no graph.json)", where=str(directory))
    notes: list[str] = []
    machines = _read(d / "machines.json")
    graph = _read(d / "graph.json")
    paths = _read(d / "path.json")
    client = _read(d / "client.json")
    if not isinstance(machines, list) or not machines:
        raise InputError("expected a list of machines", where=str(d / "machines.json"))
    models: dict[str, Any] = {}

    def model(name: str) -> Any:
        if not isinstance(name, str) or not name or "/" in name or name.startswith("."):
            raise InputError(
                f"a microservice model name must be a plain file name, not {name!r}",
                where=str(d / "graph.json"),
            )
        if name not in models:
            models[name] = _read(d / "microservice" / f"{name}.json")
        return models[name]

    out_lines: list[str] = [
        f"# Imported from the μqSim architecture directory {directory} by musku qsim import-uqsim.",
        "# μqSim's built-in timing rules are explicit below (docs/qsim.md, 'Importing μqSim').",
        "",
    ]
    epochs_q = _need(client, "epoch_qps", d / "client.json")
    epochs_t = _need(client, "epoch_end_sec", d / "client.json")
    if len(epochs_q) != len(epochs_t) or not epochs_q:
        raise InputError(
            "epoch_qps and epoch_end_sec differ in length", where=str(d / "client.json")
        )
    duration = float(epochs_t[-1])
    out_lines += ["[run]", f"duration_s = {duration:g}", "warmup_s = 0.0", "", "[network]",
                  f"latency_us = {float(graph.get('net_latency', 65000)) / 1000.0:g}",
                  "# μqSim: the client's own hop is its command-line netLat (in ns)",
                  f"client_latency_us = {client_latency_us:g}", ""]  # fmt: skip

    mach_name: dict[int, str] = {}
    net_queues: dict[int, int] = {}
    for mi, m in enumerate(machines):
        where = d / "machines.json"
        mid = int(_need(m, "machine_id", where))
        name = str(m.get("name", f"machine_{mid}"))
        mach_name[mid] = name
        ns = _need(m, "net_stack_sched", where)
        irq = len(ns.get("cores", []))
        if sorted(ns.get("cores", [])) != list(range(irq)):
            notes.append(
                f"machine {name}: interrupt cores are not 0..{irq - 1}; placed there anyway"
            )
        net_queues[mid] = int(ns.get("num_queues", irq) or 1)
        out_lines += ["[[machines]]", f"name = {_q(name)}", f"cores = {int(_need(m, 'total_cores', where))}",
                      f"irq_cores = {irq}", "freq_base_ghz = 2.6", ""]  # fmt: skip
        del mi

    # instances by μqSim service name
    inst_of: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for s in _need(graph, "microservices", d / "graph.json"):
        inst_of[str(_need(s, "service_name", d / "graph.json"))].append(s)

    # path nodes, with identical sibling leaves folded
    if not isinstance(paths, list) or not paths:
        raise InputError("expected a list of paths", where=str(d / "path.json"))
    groups: dict[str, list[str]] = {}  # folded service name -> μqSim service names

    def fold_key(node: dict[str, Any]) -> tuple[Any, ...] | None:
        insts = inst_of.get(node["service_name"], [])
        if len(insts) != 1:
            return None
        return (insts[0]["model_name"], node["code_path"], node["start_stage"], node["end_stage"],
                tuple(node["childs"]), insts[0]["scheduler"]["num_threads"])  # fmt: skip

    path_nodes: list[list[dict[str, Any]]] = []
    for p in paths:
        nodes = {int(n["node_id"]): n for n in _need(p, "nodes", d / "path.json")}
        out_nodes: list[dict[str, Any]] = []
        folded_into: dict[int, int] = {}
        for nid, n in sorted(nodes.items()):
            if nid in folded_into:
                continue
            entry: dict[str, Any] = {
                "id": nid,
                "node": n,
                "copies": 1,
                "service": n["service_name"],
            }
            parent_children = [c for q in nodes.values() if nid in q["childs"] for c in q["childs"]]
            key = fold_key(n)
            if key is not None and n["service_name"] != "client":
                sibs = [
                    c
                    for c in dict.fromkeys(parent_children)
                    if c != nid and fold_key(nodes[c]) == key
                ]
                if sibs:
                    members = [nid, *sibs]
                    fname = str(key[0])
                    while fname in inst_of and fname not in groups:
                        fname += "_group"
                    groups[fname] = [nodes[c]["service_name"] for c in members]
                    entry.update(copies=len(members), service=fname)
                    for c in sibs:
                        folded_into[c] = nid
            out_nodes.append(entry)
        path_nodes.append(out_nodes)

    # services
    services_used: dict[str, dict[str, Any]] = {}
    for out_nodes in path_nodes:
        for e in out_nodes:
            if e["service"] == "client":
                continue
            names = groups.get(e["service"], [e["service"]])
            insts = [i for nm in names for i in inst_of.get(nm, [])]
            if not insts:
                raise InputError(
                    f"path node uses unknown service {e['service']!r}", where=str(d / "path.json")
                )
            services_used[e["service"]] = {"insts": insts}

    side_files: list[str] = []
    for sname, info in services_used.items():
        insts = info["insts"]
        first = insts[0]
        mdl = model(str(first["model_name"]))
        sched = first["scheduler"]
        if sched.get("type") not in ("CMT", "Simple", None):
            notes.append(f"{sname}: scheduler {sched.get('type')!r} imported as a thread pool")
        stages: dict[int, dict[str, Any]] = {}
        for cp in _need(mdl, "paths", d / "microservice" / f"{first['model_name']}.json"):
            for st in cp["stages"]:
                stages.setdefault(int(st["stage_id"]), st)
        info["stages"] = stages
        info["model"] = mdl
        # μqSim's CMT scheduler gives every thread its own queue and binds a connection to the
        # thread that first served it (bind_connection): one single-thread instance per thread,
        # a connection-bound load balancer
        # (a service with several μqSim instances, a fan-out's leaves, keeps a pool per instance
        # so that its instances stay one per machine)
        nthr = int(sched.get("num_threads", 1))
        bound = bool(mdl.get("bind_connection", True))
        split = len(insts) == 1
        info["split"] = split
        out_lines += ["[[services]]", f"name = {_q(sname)}", 'execution = "threads"',
                      f"threads = {1 if split else nthr}",
                      f"cores_per_instance = {1 if split else max(1, len(sched.get('cores', [])))}",
                      f"connections = {connections}",
                      f"lb = {_q('connection' if bound and split else 'round_robin')}",
                      f"instances = {len(insts) * (nthr if split else 1)}",
                      "machines = [" + ", ".join(_q(mach_name[int(i['machine_id'])]) for i in insts
                                                 for _ in range(nthr if split else 1)) + "]",
                      ""]  # fmt: skip
        where = d / "microservice" / f"{first['model_name']}.json"
        for sid in sorted(stages):
            st = stages[sid]
            out_lines += ["  [[services.stages]]", f"  name = {_q(st['stage_name'])}"]
            if st.get("epoll"):
                table = ", ".join(f"[{n}, {v:g}]" for n, v in _epoll_table())
                out_lines += ['  queue = "epoll"', "  batch = 1",
                              "  # μqSim: exp(round(0.38 (n - 7) + 3.8) us) for n ready connections",
                              f'  time = {{ dist = "exp", bytes_per_job = 1, bytes_table = [{table}] }}']  # fmt: skip
            elif st.get("socket"):
                table = ", ".join(f"[{b}, {v:g}]" for b, v in SOCKET_TABLE_US)
                out_lines += ['  queue = "socket"', "  batch = 1000000",
                              "  # μqSim: a read of 7 bytes per job, cost by size",
                              f'  time = {{ dist = "exp", bytes_per_job = {SOCKET_BYTES_PER_JOB}, '
                              f"bytes_table = [{table}] }}"]  # fmt: skip
            elif st.get("ngx_proc"):
                csv_name = f"{out.stem}.{sname}.{st['stage_name']}.csv"
                (out.parent / csv_name).write_text(
                    "# μqSim's nginx processing table (us), 100 equally likely values\n"
                    + "".join(f"{v:g}\n" for v in _ngx_table_us())
                )
                side_files.append(csv_name)
                out_lines += [
                    '  queue = "fifo"',
                    f'  time = {{ dist = "empirical", file = {_q(csv_name)} }}',
                ]
            elif st.get("batching"):
                out_lines += ['  queue = "fifo"', "  batch = 1000000",
                              "  # μqSim: a batching stage takes every queued job for one draw",
                              f"  time = {_time(st['recv_time_model'], where)}"]  # fmt: skip
            else:
                out_lines += ['  queue = "fifo"', f"  time = {_time(st['recv_time_model'], where)}"]
            if st.get("blocking"):
                notes.append(f"{sname}.{st['stage_name']}: blocking stage imported as non-blocking")
            if st.get("chunk") or st.get("critical_section"):
                notes.append(f"{sname}.{st['stage_name']}: chunk/critical-section flags ignored")
            out_lines += [f"  dvfs_scale = {float(st.get('scale_factor', 0)):g}", ""]

    # one network-stack service per service (on the interrupt cores of its instances' machines)
    net = model("net_stack")
    net_stages = {int(cp["code_path_id"]): cp["stages"][0] for cp in net["paths"]}
    nwhere = d / "microservice" / "net_stack.json"
    for k in range(4):
        if k not in net_stages:
            raise InputError(f"net_stack needs code paths 0..3 (no {k})", where=str(nwhere))
    for sname, info in services_used.items():
        insts = info["insts"]
        q = max(net_queues.get(int(i["machine_id"]), 1) for i in insts)
        # the network stack's queues, one per interrupt core, connections hashed onto them
        split = bool(info.get("split"))
        out_lines += ["[[services]]", f"name = {_q('net_' + sname)}", "irq = true",
                      f"threads = {1 if split else q}", f"connections = {connections}",
                      f"lb = {_q('connection' if split else 'round_robin')}",
                      f"instances = {len(insts) * (q if split else 1)}",
                      "machines = [" + ", ".join(_q(mach_name[int(i['machine_id'])]) for i in insts
                                                 for _ in range(q if split else 1)) + "]",
                      ""]  # fmt: skip
        for k in range(4):
            st = net_stages[k]
            out_lines += ["  [[services.stages]]", f"  name = {_q(st['stage_name'])}",
                          f"  time = {_time(st['recv_time_model'], nwhere)}", ""]  # fmt: skip
    names_net = [
        net_stages[k]["stage_name"] for k in range(4)
    ]  # send_local, send_remote, recv_local, recv_remote

    # paths
    for pi, (p, out_nodes) in enumerate(zip(paths, path_nodes, strict=True)):
        by_id = {e["id"]: e for e in out_nodes}
        rep: dict[int, int] = {}  # μqSim node id -> representative (folded) id
        for e in out_nodes:
            rep[e["id"]] = e["id"]
        for n in p["nodes"]:
            nid = int(n["node_id"])
            if nid not in rep:
                # folded: find its representative (same key, listed)
                for e in out_nodes:
                    if e["copies"] > 1 and n["service_name"] in groups.get(e["service"], []):
                        rep[nid] = e["id"]
        has_tx: dict[int, bool] = {}
        parents_of: dict[int, list[int]] = defaultdict(list)
        for e in out_nodes:
            if e["service"] == "client":
                continue
            cps_e = {
                int(c["code_path_id"]): c for c in services_used[e["service"]]["model"]["paths"]
            }
            st_e = cps_e.get(int(e["node"]["code_path"]), {"stages": []})["stages"]
            has_tx[e["id"]] = bool(st_e and st_e[-1].get("net"))
            for c in dict.fromkeys(rep[int(x)] for x in e["node"]["childs"]):
                parents_of[c].append(e["id"])
        out_lines += ["[[paths]]", f"name = {_q('path_' + str(p.get('micro_service_path_id', pi)))}",
                      f"weight = {float(p.get('probability', 100)):g}", ""]  # fmt: skip
        for e in out_nodes:
            n = e["node"]
            if e["service"] == "client":
                continue
            info = services_used[e["service"]]
            cp_id = int(n["code_path"])
            cps = {int(c["code_path_id"]): c for c in info["model"]["paths"]}
            if cp_id not in cps:
                raise InputError(f"node {e['id']}: service {e['service']!r} has no code path {cp_id}",
                                 where=str(d / "path.json"))  # fmt: skip
            sts = cps[cp_id]["stages"]
            start = int(n.get("start_stage", 0))
            end = int(n.get("end_stage", -1))
            sts = sts[start:] if end < 0 else sts[start : end + 1]
            kids = list(dict.fromkeys(rep[int(c)] for c in n["childs"]))
            real = [c for c in kids if by_id[c]["service"] != "client"]
            # μqSim sends one message per child through the sender's network stack: a fan-out's
            # copies start at the sender's tx node (and the receivers follow them), unless the
            # sender's last stage does not use the network
            copies = e["copies"] > 1 and not any(has_tx.get(q) for q in parents_of.get(e["id"], []))
            out_lines += ["  [[paths.nodes]]", f'  name = "rx{e["id"]}"', f"  service = {_q('net_' + e['service'])}",
                          f"  stages = [{_q(names_net[3])}]",
                          f'  children = ["n{e["id"]}"]'] + ([f"  copies = {e['copies']}"] if copies else [])  # fmt: skip
            if len(parents_of.get(e["id"], [])) > 1:
                out_lines.append("  gather = true")
            out_lines.append("")
            out_lines += ["  [[paths.nodes]]", f'  name = "n{e["id"]}"', f"  service = {_q(e['service'])}",
                          "  stages = [" + ", ".join(_q(s["stage_name"]) for s in sts) + "]"]  # fmt: skip
            if not has_tx[e["id"]]:
                if real:
                    out_lines += ["  children = [" + ", ".join(_q(f"rx{c}") for c in real) + "]"]
                out_lines.append("")
                continue
            targets: list[int | None] = [*real] if real else [None]
            out_lines += [
                "  children = [" + ", ".join(_q(_tx(e["id"], c)) for c in targets) + "]",
                "",
            ]
            for c in targets:
                out_lines += ["  [[paths.nodes]]", f"  name = {_q(_tx(e['id'], c))}",
                              f"  service = {_q('net_' + e['service'])}", f"  stages = [{_q(names_net[1])}]"]  # fmt: skip
                if c is not None:
                    out_lines.append(f'  children = ["rx{c}"]')
                    if by_id[c]["copies"] > 1:
                        out_lines.append(f"  copies = {by_id[c]['copies']}")
                out_lines.append("")
    qs = qps if qps is not None else None
    out_lines += ["[client]", 'kind = "open"', f"connections = {connections}"]
    if qs is not None:
        out_lines.append(f"qps = {qs:g}")
    else:
        eps = ", ".join(
            f"{{ until_s = {float(t):g}, qps = {float(q):g} }}"
            for q, t in zip(epochs_q, epochs_t, strict=True)
        )
        out_lines.append(f"epochs = [{eps}]")
    out_lines.append("")
    if notes:
        out_lines = [*out_lines[:2], *(f"# note: {n}" for n in notes), *out_lines[2:]]
    out.write_text("\n".join(out_lines))
    return notes


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
    send) or ``fanout`` (a dispatcher and ``leaves`` leaves of 200 us each, one machine each).
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
    else:
        raise InputError(f"unknown example {kind!r} (2tier, fanout)")
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
    (d / "client.json").write_text(
        json.dumps(
            {
                "monitor_interval_sec": duration_s * 100,
                "epoch_qps": [qps],
                "epoch_end_sec": [duration_s],
            }
        )
    )
    return d
