#!/usr/bin/env python3
"""Threading models for Set Algebra on this host: p99 of every static model across a load
ramp, the auto-tuner trained on these measurements, and a flash crowd.

1. Saturation of the reference configuration (closed loop) sets the top of the ramp.
2. Ramp 20, 100, 500, 1000, 2000, ... up to ~85 % of saturation: p99 of each static model
   (default pools: 1 poller, 2 workers for dispatch, 1 response thread for async).
3. The decision table is built from (2) (`musku tune train` does the same measurements) and the
   mid-tier is switched to `auto`; the ramp is measured again.
4. Flash crowd: 100 QPS -> ~85 % of saturation for 1 s -> 100 QPS; p99 per phase, auto vs the
   static models.

Servers are pinned to --server-cpus, the load generator to --loadgen-cpus; placement is printed.

    python bench/threading_tuner.py [--duration 3] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

from musku.errors import MuskuError
from musku.services import runtime
from musku.tune import train as tr


def p99(res: dict) -> float:
    return float(res["latency_us"]["p99"]) / 1e3


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--duration", type=float, default=3.0)
    ap.add_argument("--warmup", type=float, default=0.5)
    ap.add_argument("--server-cpus", default="0")
    ap.add_argument("--loadgen-cpus", default="1")
    ap.add_argument("--data-dir", type=Path, default=None)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    ncpu = os.cpu_count() or 1
    server_cpus = [int(x) for x in a.server_cpus.split(",") if x] or None
    lg = [int(x) for x in a.loadgen_cpus.split(",") if x and int(x) < ncpu] or None
    statics = [tr.Candidate.of(m, 2) for m in runtime.THREADING_MODELS]
    out: dict = {"cpus": ncpu}
    work = Path(tempfile.mkdtemp(prefix="musku-bench-threading-"))
    try:
        with runtime.deploy(
            "setalgebra",
            workdir=work,
            data_dir=a.data_dir or runtime.default_data_dir(),
            shards=2,
            leaf_args=["--max-pollers", "1", "--max-workers", "1", "--max-responders", "1"],
            server_cpus=server_cpus,
        ) as dep:
            addr = dep.midtier.address
            out["placement"] = {**dep.placement(), "loadgen": lg or list(range(ncpu))}

            def load(spec: runtime.LoadSpec) -> dict:
                return runtime.run_load(addr, "setalgebra", dep.load_data, spec, cpus=lg)

            sat = load(runtime.LoadSpec(mode="closed", concurrency=32, duration_s=a.duration,
                                        warmup_s=a.warmup))["total"]["achieved_qps"]  # fmt: skip
            out["saturation_qps"] = sat
            top = 0.85 * sat
            ramp = [q for q in (20, 100, 500, 1000, 2000, 3000, 4000, 6000, 8000, 12000) if q < top]
            ramp.append(round(top))
            out["loads"] = ramp
            grid: dict[str, dict[float, dict]] = {}
            for c in statics:
                for q in ramp:
                    grid.setdefault(c.key(), {})[float(q)] = tr.measure(
                        dep, c, q, duration_s=a.duration, warmup_s=a.warmup, loadgen_cpus=lg
                    )
            table = tr.build_table("setalgebra", [float(q) for q in ramp], grid, statics)
            path = work / "table.json"
            tr.write_table(table, path)
            out["table"] = table["rows"]
            runtime.set_threading(addr, "auto", table=str(path))
            auto: dict[float, dict] = {}
            for q in ramp:
                r = load(runtime.LoadSpec(qps=q, duration_s=a.duration, warmup_s=a.warmup))
                auto[float(q)] = r["total"]
            out["auto"] = {f"{q:g}": v["latency_us"] for q, v in auto.items()}
            out["static"] = {
                k: {f"{q:g}": v["p99_us"] for q, v in pts.items()} for k, pts in grid.items()
            }
            # flash crowd
            sched = f"100:3,{round(top)}:1,100:3"
            flash = {}
            for name in ["auto", *[c.key() for c in statics]]:
                if name == "auto":
                    runtime.set_threading(addr, "auto", table=str(path))
                else:
                    c = next(x for x in statics if x.key() == name)
                    runtime.set_threading(addr, c.model, pollers=c.pollers, workers=c.workers,
                                          responders=c.responders)  # fmt: skip
                r = load(runtime.LoadSpec(schedule=sched, warmup_s=1.0))
                flash[name] = [p99(ph) for ph in r["phases"]] + [
                    sum(ph["errors"] for ph in r["phases"])
                ]
            out["flash_crowd"] = {"schedule": sched, "p99_ms_per_phase": flash}
            out["switches"] = runtime.admin(addr, "get")["switches"]
    except MuskuError as e:
        print(f"bench/threading_tuner: {e.one_line()}", file=sys.stderr)
        return int(e.status)

    # summary
    summary = []
    for q in out["loads"]:
        qf = float(q)
        best_key = min(grid, key=lambda k: grid[k][qf]["p99_us"])
        best = grid[best_key][qf]["p99_us"]
        au = auto[qf]["latency_us"]["p99"]
        summary.append({"qps": q, "best_static": best_key, "best_p99_us": best, "auto_p99_us": au,
                        "auto_vs_best": au / best if best else float("nan")})  # fmt: skip
    out["summary"] = summary
    low = float(out["loads"][0])
    db_key = tr.Candidate.of("sync-dispatch-block", 2).key()
    adb_key = tr.Candidate.of("async-dispatch-block", 2).key()
    out["dispatch_block_vs_auto_at_lowest"] = {
        k: grid[k][low]["p99_us"] / auto[low]["latency_us"]["p99"] for k in (db_key, adb_key)
    }
    if a.json:
        print(json.dumps(out, indent=2, default=str))
        return 0
    print(f"placement: {out['placement']}  (saturation {sat:.0f} QPS, closed loop)")
    keys = list(grid)
    print("p99 (ms) per static model and load; auto = trained table")
    print(f"{'model':<40}" + "".join(f"{q:>9}" for q in out["loads"]))
    for k in keys:
        print(
            f"{k:<40}" + "".join(f"{grid[k][float(q)]['p99_us'] / 1e3:>9.2f}" for q in out["loads"])
        )
    print(
        f"{'auto':<40}"
        + "".join(f"{auto[float(q)]['latency_us']['p99'] / 1e3:>9.2f}" for q in out["loads"])
    )
    print(f"{'auto / best static':<40}" + "".join(f"{s['auto_vs_best']:>9.2f}" for s in summary))
    print("goal: auto within 5 % of the best static model at each load (ratio <= 1.05)")
    for k, v in out["dispatch_block_vs_auto_at_lowest"].items():
        print(f"at {out['loads'][0]} QPS, static {k} p99 / auto p99 = {v:.2f}x (goal >= 1.3x)")
    print("decision table:")
    for r in out["table"]:
        bound = "inf" if r["max_qps"] >= 1e11 else f"{r['max_qps']:.0f}"
        print(
            f"  <= {bound:>6} QPS: {r['model']} "
            f"p={r['pollers']} w={r['workers']} r={r['responders']}"
        )
    print(f"flash crowd {sched} (QPS:seconds): p99 ms per phase, errors")
    for name, v in flash.items():
        print(f"  {name:<40} {v[0]:>8.2f} {v[1]:>8.2f} {v[2]:>8.2f}   errors {v[3]}")
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
