#!/usr/bin/env python3
"""Set Algebra: musku against the ORIGINAL μSuite, in the same run, with one client for both.

    python bench/setalgebra.py [--original OUT_DIR] [--rounds 6] [--duration 4] [--warmup 1]
        [--loads 500,1000,2000] [--concurrency 16,32,64] [--leaf-transports unary,batch] [--json]

OUT_DIR holds the original's binaries (``intersection_server`` and ``mid_tier_server``, or its
source tree with them built in place), built by hand outside this repository (nothing of the
original is in musku). Without ``--original``, or when OUT_DIR holds no built original, it
measures musku alone and says that no same-run comparison was made.

Set-up, the same for both systems:
- data: synthetic, generated once (cached under --data-dir) in μSuite's text format: 20K words
  over doc ids [0, 1e6) (word of rank r in 0.1e6 / r^0.8 documents), 10K queries of 2-5 words
  (Zipf); the original's two leaves read their shard's text file (doc % 2), musku's leaves the
  exact MSAIDX01 conversion of the same text; both mid-tiers get the same queries file
  (``musku.services.datasets.setalgebra_musuite_data``);
- topology: 2 shards, 1 leaf thread each; mid-tier 1 network poller, 2 workers, 1 response
  thread (musku: async-dispatch-block, or --models; the original: ``mid_tier_server 2 IPS ADDR
  1 2 1``, leaves ``intersection_server ADDR SHARD_FILE 1 K 2``), all on loopback;
- servers pinned to --server-cpus (0), musku's load generator to --loadgen-cpus (1).

First, both mid-tiers answer --check-queries queries spread over the file; their result sets
must be equal (the original's union is neither sorted nor deduplicated: compared as sets), or
the bench refuses (exit 3) naming the first query that differs. Then --rounds rounds; in each,
every measurement point runs every system in turn (A, B, A, B: the host's drift hits both):
- open loop at each of --loads QPS (exponential gaps, latency from the intended send time,
  --warmup seconds sent and discarded): p50/p99, and the servers' CPU per query (mid-tier +
  leaves, psutil, divided by every answered request including the warm-up's);
- closed loop at each --concurrency: saturation = the round's best achieved QPS.
After the rounds, each mid-tier's idle CPU over 5 s. Ratios are musku / original per round,
then their median over rounds with a bootstrap interval (resampled rounds); for the p99 also
the ratio of all rounds' requests pooled, with a bootstrap interval over requests. A goal is
"met" when the whole interval meets it, "NOT met" when none of it does, otherwise (or with
fewer than 6 rounds) "undecided at this noise", with about how many rounds would decide it
(musku.services.rounds). --save PATH also writes everything as JSON.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import socket
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from musku.errors import HostError, InputError, MuskuError, UnsupportedError
from musku.process import spawn
from musku.services import datasets, rounds, runtime
from musku.services.latency import Latencies, quantile_ratio

ORIGINAL = "original"
LEAVES = 2
GOALS = {  # figure -> (direction, bound) on musku / original
    "cpu_us_per_query@1000": ("<=", 0.5),
    "saturation_qps": (">=", 2.0),
    "p99_ms@1000": ("<=", 0.5),
}


# ---- the original μSuite ------------------------------------------------------------------


def find_original(out_dir: Path) -> tuple[Path, Path] | str:
    """(intersection_server, mid_tier_server) in ``out_dir`` (flat, or the source tree built in
    place), or why not."""
    leaf_c = [out_dir / "intersection_server",
              out_dir / "intersection_service/service/intersection_server"]  # fmt: skip
    mid_c = [out_dir / "mid_tier_server", out_dir / "union_service/service/mid_tier_server"]
    leaf = next((p for p in leaf_c if p.is_file() and os.access(p, os.X_OK)), None)
    mid = next((p for p in mid_c if p.is_file() and os.access(p, os.X_OK)), None)
    if not out_dir.is_dir():
        return f"{out_dir} does not exist"
    if leaf is None or mid is None:
        missing = [n for n, p in (("intersection_server", leaf), ("mid_tier_server", mid)) if not p]
        return f"{out_dir} holds no built {' or '.join(missing)}"
    return leaf, mid


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _start_plain(name: str, argv: list[str], port: int, workdir: Path, cpus: list[int] | None,
                 timeout: float) -> runtime.Proc:  # fmt: skip
    """Start one of the original's servers (listening on loopback ``port``) and wait until it
    prints that it listens (it loads its data first) and accepts a connection."""
    log = workdir / f"{name}.log"
    popen = spawn(argv, log, cpus=cpus, cwd=workdir)
    proc = runtime.Proc(name, popen, log, port)
    deadline = time.monotonic() + timeout
    try:
        while True:
            if popen.poll() is not None:
                raise HostError(f"original {name} exited with status {popen.returncode}: "
                                f"{proc.log_tail(3)}")  # fmt: skip
            if b"Server listening" in log.read_bytes():
                with (
                    contextlib.suppress(OSError),
                    socket.create_connection(("127.0.0.1", port), timeout=1),
                ):
                    return proc
            if time.monotonic() > deadline:
                raise HostError(f"original {name} did not start within {timeout:.0f} s ({log})")
            time.sleep(0.1)
    except BaseException:
        proc.stop(2)
        raise


@dataclass
class Original:
    midtier: runtime.Proc
    leaves: list[runtime.Proc]

    def check_alive(self) -> None:
        for p in [self.midtier, *self.leaves]:
            rc = p.popen.poll()
            if rc is not None:
                raise HostError(f"the original's {p.name} exited ({rc}): {p.log_tail(3)}")


@contextlib.contextmanager
def deploy_original(bins: tuple[Path, Path], files: datasets.SetAlgebraFiles, workdir: Path,
                    cpus: list[int] | None) -> Iterator[Original]:  # fmt: skip
    leaf_bin, mid_bin = bins
    workdir.mkdir(parents=True, exist_ok=True)
    procs: list[runtime.Proc] = []
    try:
        for k, shard in enumerate(files.shards):
            port = _free_port()
            # address, shard file, 1 thread, shard number, shard count
            argv = [str(leaf_bin), f"127.0.0.1:{port}", str(shard), "1", str(k),
                    str(len(files.shards))]  # fmt: skip
            procs.append(_start_plain(f"leaf{k}", argv, port, workdir, cpus, timeout=600))
        ips = workdir / "intersection_server_ips.txt"
        ips.write_text("".join(p.address + "\n" for p in procs))
        port = _free_port()
        # 2 leaves, their addresses, listen address, 1 poller (network threads), 2 workers
        # (dispatch threads), 1 response thread
        argv = [str(mid_bin), str(len(procs)), str(ips), f"127.0.0.1:{port}", "1", "2", "1"]
        mid = _start_plain("midtier", argv, port, workdir, cpus, timeout=60)
        procs.insert(0, mid)
        yield Original(mid, procs[1:])
    finally:
        for p in procs:
            p.stop(5)


# ---- correctness --------------------------------------------------------------------------


def answer_sets(address: str, method: str, queries: list[tuple[int, list[str]]],
                timeout: float = 30.0) -> list[set[int]]:  # fmt: skip
    try:
        import grpc
    except ImportError as e:
        raise UnsupportedError("the grpcio package is not installed (pip install grpcio)") from e
    out = []
    with grpc.insecure_channel(address) as ch:
        call = ch.unary_unary(method)
        for i, q in queries:
            try:
                if method == datasets.MUSUITE_UNION_METHOD:
                    got = datasets.union_response_docs(
                        call(datasets.union_request_bytes(q, i), timeout=timeout)
                    )
                else:
                    got = datasets.query_reply_docs(
                        call(datasets.query_request_bytes(q, i), timeout=timeout)
                    )
            except grpc.RpcError as e:
                raise HostError(f"{address} failed query {i + 1} ({' '.join(q)}): "
                                f"{e.code().name}") from None  # fmt: skip
            out.append(set(got))
    return out


def check_same_answers(systems: dict[str, Any], files: datasets.SetAlgebraFiles, n: int) -> dict:
    """Every system's answers to n queries spread over the file; InputError naming the first
    query two systems answer differently."""
    qs = datasets.read_queries_text(files.queries)
    step = max(1, len(qs) // max(1, n))
    sample = [(i, qs[i]) for i in range(0, len(qs), step)][:n]
    answers = {name: answer_sets(s["address"], s["method"], sample) for name, s in systems.items()}
    names = list(answers)
    for j, (i, q) in enumerate(sample):
        for other in names[1:]:
            a, b = answers[names[0]][j], answers[other][j]
            if a != b:
                raise InputError(
                    f"{names[0]} and {other} answer query {i + 1} ('{' '.join(q)}') differently "
                    f"({len(a)} vs {len(b)} docs, {len(a ^ b)} not in both): not measuring "
                    "systems that do different work",
                    where=str(files.queries),
                )
    nonempty = sum(bool(x) for x in answers[names[0]])
    return {"queries": len(sample), "nonempty": nonempty,
            "docs": sum(len(x) for x in answers[names[0]])}  # fmt: skip


# ---- measurement --------------------------------------------------------------------------


def server_pids(s: dict[str, Any]) -> list[int]:
    return [s["midtier"].pid, *(p.pid for p in s["leaves"])]


def measure_point(s: dict[str, Any], spec: runtime.LoadSpec, cpus: list[int] | None) -> dict:
    pids = server_pids(s)
    cpu0 = [runtime.cpu_seconds(p) for p in pids]
    # musku: the load generator's setalgebra plug-in reads the queries; the original: the same
    # queries encoded as its UnionRequests, sent through the generic --method path
    r = runtime.run_load(s["address"], "setalgebra", s["load_data"], spec, cpus=cpus,
                         method=s["loadgen_method"])  # fmt: skip
    cpu = [runtime.cpu_seconds(p) - c for p, c in zip(pids, cpu0, strict=True)]
    s["check_alive"]()
    tot = r["total"]
    n = max(1, tot["ok"] + tot["errors"] + r.get("warmup_answered", 0))
    return {**tot, "cpu_us_per_query": 1e6 * sum(cpu) / n, "midtier_cpu_us_per_query":
            1e6 * cpu[0] / n}  # fmt: skip


def figures(round_: dict[str, Any], loads: list[int]) -> dict[str, float]:
    f: dict[str, float] = {"saturation_qps": max(r["achieved_qps"] for r in round_["closed"])}
    for q in loads:
        r = round_["open"][q]
        f[f"p50_ms@{q}"] = r["latency_us"]["p50"] / 1e3
        f[f"p99_ms@{q}"] = r["latency_us"]["p99"] / 1e3
        f[f"cpu_us_per_query@{q}"] = r["cpu_us_per_query"]
        f[f"midtier_cpu_us_per_query@{q}"] = r["midtier_cpu_us_per_query"]
        f[f"achieved_qps@{q}"] = r["achieved_qps"]
        f[f"errors@{q}"] = r["errors"]
    return f


def compare(out: dict[str, Any], loads: list[int]) -> None:
    """Per musku system: per-round ratios to the original, median, interval, goals."""
    orig = out["systems"][ORIGINAL]["rounds"]
    out["comparison"] = {}
    for name, sysres in out["systems"].items():
        if name == ORIGINAL:
            continue
        cmp: dict[str, Any] = {}
        fa = [figures(r, loads) for r in sysres["rounds"]]
        fb = [figures(r, loads) for r in orig]
        for key in fa[0]:
            if key.startswith(("errors@", "achieved_qps@")):
                continue
            ratios = [a[key] / b[key] for a, b in zip(fa, fb, strict=True) if b[key] > 0]
            if not ratios:
                continue
            rr = rounds.median_ratio(ratios)
            cmp[key] = {"musku": [a[key] for a in fa], "original": [b[key] for b in fb],
                        "ratios": ratios, "median_ratio": rr.median,
                        "interval": [rr.low, rr.high]}  # fmt: skip
            if key in GOALS:
                direction, bound = GOALS[key]
                cmp[key]["goal"] = f"{direction} {bound}x"
                cmp[key]["verdict"] = rounds.verdict(rr, direction, bound)
                cmp[key]["summary"] = rounds.describe(rr, direction, bound)
        for q in loads:
            a = Latencies.of(*(r["open"][q] for r in sysres["rounds"]))
            b = Latencies.of(*(r["open"][q] for r in orig))
            pr = quantile_ratio(a, b, 0.99)
            cmp[f"pooled_p99_ratio@{q}"] = {"value": pr.value, "interval": [pr.low, pr.high]}
        out["comparison"][name] = cmp


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--original", type=Path, default=None,
                    help="directory holding the original μSuite's built binaries")  # fmt: skip
    ap.add_argument("--rounds", type=int, default=6,
                    help="alternating rounds (a verdict needs >= 6)")  # fmt: skip
    ap.add_argument("--duration", type=float, default=4.0)
    ap.add_argument("--warmup", type=float, default=1.0)
    ap.add_argument("--loads", default="500,1000,2000", help="open-loop QPS")
    ap.add_argument("--concurrency", default="16,32,64", help="closed-loop outstanding requests")
    ap.add_argument("--models", default="async-dispatch-block",
                    help="musku mid-tier models (each with 1 poller, 2 workers, 1 response "
                         "thread)")  # fmt: skip
    ap.add_argument("--leaf-transports", default="unary,batch",
                    help="musku mid-tier leaf transports, each a deployment of its own")  # fmt: skip
    ap.add_argument("--check-queries", type=int, default=200,
                    help="queries both systems must answer identically before measuring")  # fmt: skip
    ap.add_argument("--docs", type=int, default=1_000_000)
    ap.add_argument("--terms", type=int, default=20_000)
    ap.add_argument("--queries", type=int, default=10_000)
    ap.add_argument("--save", type=Path, default=None, help="also write the JSON here")
    runtime.BenchPlacement.add_arguments(ap)
    a = ap.parse_args()
    try:
        return run(a)
    except MuskuError as e:
        print(f"bench/setalgebra: {e.one_line()}", file=sys.stderr)
        return int(e.status)
    except KeyboardInterrupt:
        return 130


def _csv_ints(text: str, what: str) -> list[int]:
    try:
        vals = [int(x) for x in text.split(",") if x.strip()]
    except ValueError as e:
        raise InputError(f"{what} is a comma-separated list of integers, not {text!r}") from e
    if not vals or min(vals) <= 0:
        raise InputError(f"{what} needs positive integers, not {text!r}")
    return vals


def run(a: argparse.Namespace) -> int:
    pl = runtime.BenchPlacement.of(a)
    loads = _csv_ints(a.loads, "--loads")
    conc = _csv_ints(a.concurrency, "--concurrency")
    if a.rounds < 1 or a.duration <= 0 or a.warmup < 0:
        raise InputError("--rounds >= 1, --duration > 0, --warmup >= 0")
    models = [m.strip() for m in a.models.split(",") if m.strip()]
    bad = [m for m in models if m not in runtime.THREADING_MODELS]
    transports = [t.strip() for t in a.leaf_transports.split(",") if t.strip()]
    bad += [t for t in transports if t not in runtime.LEAF_TRANSPORTS]
    if not models or not transports or bad:
        raise InputError(f"unknown threading model(s) or leaf transport(s): {bad}")
    bins: tuple[Path, Path] | None = None
    why_alone = "--original OUT_DIR not given"
    if a.original is not None:
        found = find_original(a.original)
        if isinstance(found, str):
            why_alone = f"the original μSuite is not available: {found}"
            print(f"bench/setalgebra: {why_alone}; measuring musku alone", file=sys.stderr)
        else:
            bins = found
    for b in ("setalgebra_leaf", "setalgebra_midtier", "musku_loadgen", "musku_admin"):
        runtime.binary(b)
    files = datasets.setalgebra_musuite_data(pl.data_dir, docs=a.docs, terms=a.terms,
                                             queries=a.queries, seed=1, shards=LEAVES)  # fmt: skip
    lg = pl.loadgen_cpus
    work = Path(tempfile.mkdtemp(prefix="musku-bench-sa-"))
    out: dict[str, Any] = {"cpus": pl.ncpu, "loads": loads, "concurrency": conc,
                           "rounds": a.rounds, "duration_s": a.duration, "warmup_s": a.warmup,
                           "data": {k: str(v) for k, v in vars(files).items()},
                           "systems": {}, "placement": {}}  # fmt: skip
    with contextlib.ExitStack() as stack:
        systems: dict[str, dict[str, Any]] = {}
        for transport in transports:
            dep = stack.enter_context(runtime.deploy(
                "setalgebra", workdir=work / f"musku-{transport}", data_dir=pl.data_dir,
                shards=LEAVES, threading=models[0], pollers=1, workers=2, responders=1,
                leaf_threading="sync-inline-block",
                leaf_args=["--max-pollers", "1", "--max-workers", "1", "--max-responders", "1"],
                server_cpus=pl.server_cpus, max_pools=(1, 2, 1), leaf_transport=transport,
                data_opts={"index": files.index, "query_file": files.queries},
            ))  # fmt: skip
            for model in models:
                systems[f"musku {model}/{transport}"] = {
                    "address": dep.midtier.address, "method": datasets.MUSKU_QUERY_METHOD,
                    "load_data": files.queries, "loadgen_method": None,
                    "midtier": dep.midtier, "leaves": dep.leaves,
                    "check_alive": dep.check_alive, "model": model,
                }  # fmt: skip
            out["placement"][f"musku/{transport}"] = dep.placement()
        if bins is not None:
            orig = stack.enter_context(deploy_original(bins, files, work / ORIGINAL,
                                                       pl.server_cpus))  # fmt: skip
            systems[ORIGINAL] = {
                "address": orig.midtier.address, "method": datasets.MUSUITE_UNION_METHOD,
                "load_data": files.union_requests,
                "loadgen_method": datasets.MUSUITE_UNION_METHOD, "midtier": orig.midtier,
                "leaves": orig.leaves, "check_alive": orig.check_alive, "model": None,
            }  # fmt: skip
            out["placement"][ORIGINAL] = {
                p.name: sorted(os.sched_getaffinity(p.pid)) for p in [orig.midtier, *orig.leaves]
            }
        out["placement"]["loadgen"] = pl.loadgen_list()
        out["check"] = check_same_answers(systems, files, a.check_queries)
        if not a.json:
            c = out["check"]
            print(f"correctness: {len(systems)} system(s) gave the same result sets on "
                  f"{c['queries']} queries ({c['nonempty']} non-empty, {c['docs']} docs)"
                  + ("" if bins else "; the original was not checked (not deployed)"),
                  flush=True)  # fmt: skip
        for name in systems:
            out["systems"][name] = {"rounds": []}
        for rnd in range(a.rounds):
            this: dict[str, dict[str, Any]] = {n: {"open": {}, "closed": []} for n in systems}
            points: list[runtime.LoadSpec] = [
                runtime.LoadSpec(qps=q, duration_s=a.duration, warmup_s=a.warmup) for q in loads
            ] + [runtime.LoadSpec(mode="closed", concurrency=c, duration_s=a.duration,
                                  warmup_s=a.warmup) for c in conc]  # fmt: skip
            for spec in points:
                for name, s in systems.items():  # A, B, A, B: each point, every system in turn
                    if s["model"] is not None:
                        runtime.set_threading(s["address"], s["model"], pollers=1, workers=2,
                                              responders=1)  # fmt: skip
                    r = measure_point(s, spec, lg)
                    if spec.mode == "open":
                        this[name]["open"][int(spec.qps)] = r
                    else:
                        this[name]["closed"].append({"concurrency": spec.concurrency, **r})
            for name in systems:
                out["systems"][name]["rounds"].append(this[name])
            if not a.json:
                print(f"round {rnd + 1}/{a.rounds} done", flush=True)
        time.sleep(2.0)
        for name, s in systems.items():
            out["systems"][name]["idle_midtier_cpu_percent"] = runtime.idle_cpu_percent(
                s["midtier"].pid, 5.0
            )
            out["systems"][name]["idle_leaf_cpu_percent"] = max(
                runtime.idle_cpu_percent(p.pid, 2.0) for p in s["leaves"]
            )
    for res in out["systems"].values():
        res["figures"] = [figures(r, loads) for r in res["rounds"]]
    out["same_run_comparison"] = bins is not None
    if bins is not None:
        compare(out, loads)
    else:
        out["no_comparison_reason"] = why_alone
    if a.save is not None:
        a.save.write_text(json.dumps(out, indent=2, default=str))
    if a.json:
        print(json.dumps(out, indent=2, default=str))
    else:
        report(out, loads, pl)
    return 0


def _fmt_rounds(xs: list[float], digits: int = 2) -> str:
    return " ".join(f"{x:.{digits}f}" for x in xs)


def report(out: dict[str, Any], loads: list[int], pl: runtime.BenchPlacement) -> None:
    print(f"\nSet Algebra, μSuite set-up (2 shards x 1 leaf thread; mid-tier 1 poller, 2 workers, "
          f"1 response thread); {out['rounds']} alternating rounds of {out['duration_s']:g} s "
          f"(+{out['warmup_s']:g} s warm-up discarded) per point; placement {out['placement']}")  # fmt: skip
    for name, res in out["systems"].items():
        fs = res["figures"]
        med = {k: statistics.median(f[k] for f in fs) for k in fs[0]}
        print(f"\n{name}: median over rounds (per round in brackets)")
        for q in loads:
            print(f"  {q:>5} QPS: p50 {med[f'p50_ms@{q}']:.3f} ms, p99 {med[f'p99_ms@{q}']:.3f} ms "
                  f"[{_fmt_rounds([f[f'p99_ms@{q}'] for f in fs])}], server CPU/query "
                  f"{med[f'cpu_us_per_query@{q}']:.0f} us (mid-tier "
                  f"{med[f'midtier_cpu_us_per_query@{q}']:.0f}); achieved "
                  f"{med[f'achieved_qps@{q}']:.0f} QPS, errors "
                  f"{sum(int(f[f'errors@{q}']) for f in fs)}")  # fmt: skip
        sat = [f["saturation_qps"] for f in fs]
        print(f"  saturation (closed loop, best of {out['concurrency']} outstanding): "
              f"{med['saturation_qps']:.0f} QPS [{_fmt_rounds(sat, 0)}]")  # fmt: skip
        print(f"  idle mid-tier CPU {res['idle_midtier_cpu_percent']:.2f} %, idle leaf "
              f"{res['idle_leaf_cpu_percent']:.2f} %")  # fmt: skip
    if not out["same_run_comparison"]:
        print(f"\nNo same-run comparison with the original μSuite was made "
              f"({out['no_comparison_reason']}); the figures above are musku's alone.")  # fmt: skip
    else:
        for name, cmp in out["comparison"].items():
            print(f"\n{name} / original: median of per-round ratios [95 % bootstrap interval "
                  "over rounds] (per-round ratios)")  # fmt: skip
            keys = [f"cpu_us_per_query@{q}" for q in loads] + [f"p99_ms@{q}" for q in loads] + [
                f"p50_ms@{q}" for q in loads] + ["saturation_qps"]  # fmt: skip
            for k in keys:
                c = cmp.get(k)
                if c is None:
                    continue
                goal = f"  -> {c['summary']}" if "goal" in c else ""
                print(f"  {k:<24} {c['median_ratio']:.2f}x [{c['interval'][0]:.2f}, "
                      f"{c['interval'][1]:.2f}] ({_fmt_rounds(c['ratios'])}){goal}")  # fmt: skip
            for q in loads:
                p = cmp[f"pooled_p99_ratio@{q}"]
                print(
                    f"  p99 of all rounds pooled @{q}: {p['value']:.2f}x "
                    f"[{p['interval'][0]:.2f}, {p['interval'][1]:.2f}] (requests resampled)"
                )
        print(f"\nWith {out['rounds']} rounds the interval over rounds is at best their range; "
              "more rounds narrow it.")  # fmt: skip
    if pl.ncpu < 4:
        print(f"note: {pl.ncpu} CPUs: every server shares CPU(s) {pl.server_cpus}; the load "
              "generator has its own; other work on this host shows up as noise.")  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())
