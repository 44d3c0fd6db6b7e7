#!/usr/bin/env python3
"""Threading models for Set Algebra on this host: p99 of every static model across a load
ramp, the auto-tuner trained on these measurements, head to head, and a flash crowd.

1. The top of the ramp: the reference configuration's (async-dispatch-block) open-loop
   capacity. Closed-loop saturation overstates it here (with 32 requests outstanding RPCs share
   wake-ups and writes; Poisson arrivals at the same rate get fewer of both), and a ramp point
   past it only measures how fast each model's queue grows, so the table's top row would be
   noise. The top is the highest of 0.85, 0.75, ..., 0.45 x closed-loop saturation that the
   reference serves in open loop (no errors, keeps up, p99 <= --top-p99-ms); the ramp is 20,
   100, 500, 1000, 2000, ... up to it.
2. Training, as `musku tune train` does it: p99 of each static model at each load (pools: 1
   poller, 2 workers for dispatch, 1 response thread for async), every point at least
   --min-samples requests (20 QPS: 15 s), the three closest contenders per load --rounds times
   (worst round).
3. The decision table is built from (2) and the mid-tier is switched to `auto`.
4. Head to head, per load: auto against the offline-best static model (the training's lowest
   p99 at that load) and the next --top - 1 (at the lowest load also both dispatch-block
   models), interleaved for --h2h-rounds short rounds. Printed: the median over rounds of
   auto's p99 over the offline-best's in the same round (paired: the host's drift, which is
   large on a shared VM, cancels), and the p99s of all rounds' requests pooled (the load
   generator's histograms) with a 95 % bootstrap interval for their ratio: with a few hundred
   requests a p99 rests on a handful of them, and two runs of one configuration differ by tens
   of per cent. Per load a verdict on "auto within 5 %" from the paired rounds' bootstrap
   interval (musku.services.rounds): met, NOT met, or "undecided at this noise" with about how
   many rounds would decide it. (Comparing auto with the least of
   several noisy p99s measured in the same rounds would flatter the statics: the minimum of
   noisy estimates is biased low; it is printed, marked, where it differs.)
5. Flash crowd: 100 QPS -> the ramp's top for 1 s -> 100 QPS; p99 per phase, auto vs the
   static models.

Servers are pinned to --server-cpus, the load generator to --loadgen-cpus; placement is printed.
The mid-tier calls its leaves over --leaf-transport (unary, or batch: a stream per leaf); the
table is trained, and holds, for that transport.

    python bench/threading_tuner.py [--duration 3] [--rounds 3] [--leaf-transport batch] [--json]
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from musku.errors import MuskuError
from musku.services import rounds as rounds_mod
from musku.services import runtime
from musku.services.latency import Latencies, quantile_ratio
from musku.tune import train as tr

RAMP = (20, 100, 500, 1000, 2000, 3000, 4000, 6000, 8000, 12000)
DISPATCH_BLOCK = ("sync-dispatch-block", "async-dispatch-block")


TOP_FRACTIONS = (0.85, 0.75, 0.65, 0.55, 0.45)


def open_loop_top(
    sat: float, load: Callable[[runtime.LoadSpec], dict[str, Any]], a: argparse.Namespace
) -> tuple[float, list[dict[str, Any]]]:
    """The highest of TOP_FRACTIONS x ``sat`` that the current model serves in open loop, and
    every probe's figures (the lowest fraction if none serves)."""
    probes = []
    for f in TOP_FRACTIONS:
        q = round(f * sat)
        t = load(runtime.LoadSpec(qps=q, duration_s=a.duration, warmup_s=a.warmup))["total"]
        point = {"qps": q, "achieved_qps": t["achieved_qps"], "errors": t["errors"]}
        p99_ms = t["latency_us"]["p99"] / 1e3
        serves = tr.acceptable(point) and p99_ms <= a.top_p99_ms
        probes.append({"qps": q, "p99_ms": p99_ms, "serves": serves})
        if serves:
            return float(q), probes
    return float(probes[-1]["qps"]), probes


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--duration", type=float, default=3.0, help="seconds per point (at least)")
    ap.add_argument("--min-samples", type=int, default=300, help="requests per point (at least)")
    ap.add_argument("--warmup", type=float, default=0.5)
    ap.add_argument("--rounds", type=int, default=3, help="training rounds of the contenders")
    ap.add_argument("--h2h-rounds", type=int, default=6, help="head-to-head rounds per load")
    ap.add_argument("--h2h-min-samples", type=int, default=150,
                    help="requests per head-to-head run (at least)")  # fmt: skip
    ap.add_argument("--top", type=int, default=2, help="best statics per load that meet auto")
    ap.add_argument(
        "--top-p99-ms",
        type=float,
        default=50.0,
        help="the ramp's top load: the reference model's open-loop p99 at most this",
    )
    ap.add_argument("--leaf-transport", default="unary", choices=runtime.LEAF_TRANSPORTS)
    runtime.BenchPlacement.add_arguments(ap)
    a = ap.parse_args()
    try:
        pl = runtime.BenchPlacement.of(a)
    except MuskuError as e:
        print(f"bench/threading_tuner: {e.one_line()}", file=sys.stderr)
        return int(e.status)
    ncpu, lg = pl.ncpu, pl.loadgen_cpus
    statics = [tr.Candidate.of(m, 2) for m in runtime.THREADING_MODELS]
    by_key = {c.key(): c for c in statics}
    out: dict[str, Any] = {"cpus": ncpu, "leaf_transport": a.leaf_transport}
    work = Path(tempfile.mkdtemp(prefix="musku-bench-threading-"))

    def seconds(q: float) -> float:
        return tr.point_seconds(q, a.duration, a.min_samples)

    try:
        with runtime.deploy(
            "setalgebra",
            workdir=work,
            data_dir=pl.data_dir,
            shards=2,
            leaf_args=["--max-pollers", "1", "--max-workers", "1", "--max-responders", "1"],
            server_cpus=pl.server_cpus,
            leaf_transport=a.leaf_transport,
        ) as dep:
            addr = dep.midtier.address
            out["placement"] = {**dep.placement(), "loadgen": pl.loadgen_list()}

            def load(spec: runtime.LoadSpec) -> dict[str, Any]:
                return runtime.run_load(addr, "setalgebra", dep.load_data, spec, cpus=lg)

            def use(name: str) -> None:
                if name == "auto":
                    runtime.set_threading(addr, "auto", table=str(path))
                else:
                    c = by_key[name]
                    runtime.set_threading(addr, c.model, pollers=c.pollers, workers=c.workers,
                                          responders=c.responders)  # fmt: skip

            use(tr.Candidate.of("async-dispatch-block", 2).key())
            sat = load(runtime.LoadSpec(mode="closed", concurrency=32, duration_s=a.duration,
                                        warmup_s=a.warmup))["total"]["achieved_qps"]  # fmt: skip
            out["saturation_qps"] = sat
            top, probes = open_loop_top(sat, load, a)
            out["open_loop_probes"] = probes
            # no ramp point within 10 % of the top one: two near-equal loads near saturation
            # would each get a row from noise alone (and auto would flip between them)
            ramp = [float(q) for q in RAMP if q < 0.9 * top] + [float(round(top))]
            out["loads"] = ramp
            # 2-3. training, as `musku tune train` does it, and the table
            table, grid = tr.train(dep, ramp, statics, duration_s=a.duration, warmup_s=a.warmup,
                                   loadgen_cpus=lg, min_samples=a.min_samples,
                                   rounds=a.rounds)  # fmt: skip
            path = work / "table.json"
            tr.write_table(table, path)
            out["table"] = table["rows"]
            # 4. head to head: auto, the offline-best static (the training's lowest p99 at this
            # load), the next --top - 1, interleaved for --h2h-rounds short rounds
            h2h: dict[float, dict[str, list[dict[str, Any]]]] = {}
            offline_best: dict[float, str] = {}
            for q in ramp:
                ranked = sorted(grid, key=lambda k: float(grid[k][q]["p99_us"]))
                offline_best[q] = ranked[0]
                names = ["auto", *ranked[: a.top]]
                if q == ramp[0]:
                    names += [tr.Candidate.of(m, 2).key() for m in DISPATCH_BLOCK]
                names = list(dict.fromkeys(names))
                h2h_s = tr.point_seconds(q, a.duration / 2, a.h2h_min_samples)
                for _ in range(a.h2h_rounds):
                    for name in names:
                        use(name)
                        r = load(runtime.LoadSpec(qps=q, duration_s=h2h_s, warmup_s=a.warmup))
                        h2h.setdefault(q, {}).setdefault(name, []).append(r["total"])
            # 5. flash crowd
            sched = f"100:3,{round(top)}:1,100:3"
            flash = {}
            for name in ["auto", *by_key]:
                use(name)
                before = int(runtime.admin(addr, "get")["switches"])
                r = load(runtime.LoadSpec(schedule=sched, warmup_s=1.0))
                if name == "auto":  # what moved auto in the crowd (the log keeps the last 32)
                    st = runtime.admin(addr, "get")
                    n = int(st["switches"]) - before
                    out["flash_crowd_switches"] = {
                        "count": n,
                        "events": [
                            {k: ev.get(k) for k in ("age_s", "reason", "measured_qps", "backlog", "to")}
                            for ev in st.get("recent_switches", [])[-n:]
                        ] if n > 0 else [],
                    }  # fmt: skip
                flash[name] = [ph["latency_us"]["p99"] / 1e3 for ph in r["phases"]] + [
                    sum(ph["errors"] for ph in r["phases"])
                ]
            out["flash_crowd"] = {"schedule": sched, "p99_ms_per_phase": flash}
            out["switches"] = runtime.admin(addr, "get")["switches"]
    except MuskuError as e:
        print(f"bench/threading_tuner: {e.one_line()}", file=sys.stderr)
        return int(e.status)

    def served(t: dict[str, Any], q: float) -> bool:
        return tr.acceptable({**t, "qps": q})

    def pooled(runs: list[dict[str, Any]], q: float) -> Latencies | None:
        """The rounds' requests together; None when a round did not serve the load."""
        return Latencies.of(*runs) if all(served(t, q) for t in runs) else None

    lat = {q: {k: pooled(v, q) for k, v in d.items()} for q, d in h2h.items()}

    def p99(x: Latencies | None) -> float:
        return x.quantile(0.99) if x is not None else float("inf")

    def pooled_ratio(x: Latencies | None, y: Latencies | None) -> dict[str, Any]:
        """x's pooled p99 over y's with its 95 % interval (inf, no interval: one failed)."""
        if x is None or y is None:
            return {"pooled_ratio": float("inf"), "ci95": None}
        r = quantile_ratio(x, y, 0.99)
        return {"pooled_ratio": r.value, "ci95": [r.low, r.high]}

    def run_p99(t: dict[str, Any], q: float) -> float:
        return float(t["latency_us"]["p99"]) if served(t, q) else float("inf")

    def paired(q: float, x: str, y: str) -> list[float]:
        """Per round, x's p99 over y's (run back to back: slow drift of the host cancels)."""
        return [
            run_p99(tx, q) / run_p99(ty, q) for tx, ty in zip(h2h[q][x], h2h[q][y], strict=True)
        ]

    summary = []
    for q in ramp:
        best = offline_best[q]
        rounds = paired(q, "auto", best)
        statics_here = {k: p99(v) for k, v in lat[q].items() if k != "auto"}
        auto_lat = lat[q]["auto"]
        summary.append({"qps": q, "offline_best": best, "best_p99_us": p99(lat[q][best]),
                        "auto_p99_us": p99(lat[q]["auto"]),
                        "requests": auto_lat.n if auto_lat is not None else 0,
                        "auto_vs_best": statistics.median(rounds), "paired_ratios": rounds,
                        **pooled_ratio(lat[q]["auto"], lat[q][best]),
                        "lowest_measured_static": min(statics_here, key=lambda k: statics_here[k]),
                        "auto_vs_lowest_measured": p99(lat[q]["auto"]) / min(statics_here.values())})  # fmt: skip
    for s in summary:  # a verdict only where the rounds' interval supports one
        finite = [x for x in s["paired_ratios"] if math.isfinite(x) and x > 0]
        if len(finite) == len(s["paired_ratios"]):
            rr = rounds_mod.median_ratio(finite)
            s["paired_interval"] = [rr.low, rr.high]
            s["verdict"] = rounds_mod.verdict(rr, "<=", 1.05)
            s["rounds_to_decide"] = rounds_mod.rounds_to_decide(rr, 1.05)
            s["verdict_line"] = rounds_mod.describe(rr, "<=", 1.05)
        else:
            s["verdict"] = "NOT met" if s["auto_vs_best"] > 1.05 else rounds_mod.UNDECIDED
            s["verdict_line"] = f"a round did not serve the load: {s['verdict']}"
    out["summary"] = summary
    low = ramp[0]
    lowest = {}
    for k in (tr.Candidate.of(m, 2).key() for m in DISPATCH_BLOCK):
        pr = paired(low, k, "auto")
        lowest[k] = {
            "ratio": statistics.median(pr),
            **pooled_ratio(lat[low][k], lat[low]["auto"]),
        }
        if all(math.isfinite(x) and x > 0 for x in pr):
            rr = rounds_mod.median_ratio(pr)
            lowest[k]["verdict"] = rounds_mod.verdict(rr, ">=", 1.3)
            lowest[k]["verdict_line"] = rounds_mod.describe(rr, ">=", 1.3)
        else:
            lowest[k]["verdict"] = rounds_mod.UNDECIDED
            lowest[k]["verdict_line"] = "a round did not serve the load: " + rounds_mod.UNDECIDED
    out["dispatch_block_vs_auto_at_lowest"] = lowest
    if a.json:
        print(json.dumps(out, indent=2, default=str))
        return 0
    print(f"placement: {out['placement']}  (saturation {sat:.0f} QPS, closed loop; "
          f"{a.leaf_transport} leaf transport)")  # fmt: skip
    print("top of the ramp, open loop, reference model: " + ", ".join(
        f"{p['qps']:.0f} QPS p99 {p['p99_ms']:.1f} ms{' (kept)' if p['serves'] else ''}"
        for p in out["open_loop_probes"]))  # fmt: skip
    print(f"training: p99 (ms) per static model and load (>= {a.min_samples} requests per point;"
          f" the 3 closest contenders: worst of {a.rounds})")  # fmt: skip
    print(f"{'model':<40}" + "".join(f"{q:>9g}" for q in ramp))
    for k in grid:
        print(f"{k:<40}" + "".join(f"{grid[k][q]['p99_us'] / 1e3:>9.2f}" for q in ramp))
    print("decision table:")
    for r in out["table"]:
        bound = "inf" if r["max_qps"] >= 1e11 else f"{r['max_qps']:.0f}"
        print(f"  <= {bound:>6} QPS: {r['model']} p={r['pollers']} w={r['workers']} "
              f"r={r['responders']}")  # fmt: skip
    print(f"head to head: {a.h2h_rounds} interleaved rounds per load; auto against the offline-best "
          "static (the training's pick for that load). paired: median over rounds of auto's p99 /"
          " the offline-best's in the same round (robust to the host's drift); pooled: p99 of all "
          "rounds' requests, [95 % bootstrap interval] (the sampling error)")  # fmt: skip
    print(f"{'load':>8} {'requests':>9} {'paired':>7}  {'pooled auto/best [95 %]':<24}"
          f" {'auto ms':>8} {'best ms':>8}  offline-best model")  # fmt: skip
    for s in summary:
        ci = (
            f"{s['pooled_ratio']:.2f} [{s['ci95'][0]:.2f}, {s['ci95'][1]:.2f}]"
            if s["ci95"]
            else "-"
        )
        print(f"{s['qps']:>8g} {s['requests']:>9} {s['auto_vs_best']:>7.2f}  {ci:<24} "
              f"{s['auto_p99_us'] / 1e3:>8.2f} {s['best_p99_us'] / 1e3:>8.2f}  "
              f"{s['offline_best']}")  # fmt: skip
    print("auto vs the offline-best static per load, paired rounds: median ratio [95 % "
          "bootstrap interval over rounds], goal <= 1.05x:")  # fmt: skip
    for s in summary:
        print(f"  {s['qps']:>8g} QPS: {s['verdict_line']}")
    worst = max(s["auto_vs_best"] for s in summary)
    within = sum(s["auto_vs_best"] <= 1.05 for s in summary)
    resolved = sum(bool(s["ci95"]) and s["ci95"][1] <= 1.05 for s in summary)
    verdicts = [s["verdict"] for s in summary]
    overall = ("NOT met" if "NOT met" in verdicts else "met" if all(v == "met" for v in verdicts)
               else rounds_mod.UNDECIDED)  # fmt: skip
    out["auto_within_5pct"] = overall
    print(f"goal: auto within 5 % of the best static model at every load: {overall} (from the "
          f"paired rounds' intervals above; medians within 5 % at {within}/{len(summary)} loads, "
          f"worst {worst:.2f}; pooled interval <= 1.05 at {resolved}/{len(summary)})")  # fmt: skip
    for s in summary:
        if s["lowest_measured_static"] != s["offline_best"]:
            print(f"  at {s['qps']:g} QPS the lowest pooled head-to-head static was "
                  f"{s['lowest_measured_static']} (auto/it {s['auto_vs_lowest_measured']:.2f}; "
                  "the least of several noisy p99s is biased low)")  # fmt: skip
    for k, v in out["dispatch_block_vs_auto_at_lowest"].items():
        ci = (
            f"; pooled {v['pooled_ratio']:.2f} [{v['ci95'][0]:.2f}, {v['ci95'][1]:.2f}]"
            if v["ci95"]
            else ""
        )
        print(f"at {low:g} QPS, static {k} p99 / auto p99 = {v['ratio']:.2f}x paired{ci}: "
              f"{v['verdict_line']}")  # fmt: skip
    print(f"flash crowd {sched} (QPS:seconds): p99 ms per phase, errors")
    for name, v in flash.items():
        print(f"  {name:<40} {v[0]:>8.2f} {v[1]:>8.2f} {v[2]:>8.2f}   errors {v[3]}")
    fc = out.get("flash_crowd_switches")
    if fc is not None:
        print(f"auto's switches in its flash crowd: {fc['count']}")
        for ev in fc["events"]:  # seconds before the crowd's run ended
            print(f"  {-ev['age_s']:+8.3f} s  {ev['reason']:<9} at {ev['measured_qps']:>7.0f} QPS, "
                  f"backlog {ev['backlog']:>3} -> {ev['to']}")  # fmt: skip
    print(f"threading switches made by the mid-tier: {out['switches']}")
    if ncpu < 4:
        print(
            f"note: this host has {ncpu} CPUs and the servers share CPU {a.server_cpus}: poll "
            "models spin on the core the leaves need and pools > 1 thread cannot run in "
            "parallel, so the multi-core regimes where dispatch/poll pay off (μTune's 20+ core "
            "hosts) cannot be reproduced here."
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
