#!/usr/bin/env python3
"""Set Algebra on this machine, in the μSuite reference set-up, side by side with the ORIGINAL
μSuite's figures measured on this kind of machine.

Set-up: 2 document shards, 1 leaf thread each; mid-tier 1 network poller, 2 workers, 1 response
thread; the reference model async-dispatch-block and, with the same pools, async-dispatch-poll
(--models); synthetic 20K-word index over doc ids [0, 1e6), 10K queries of
2-5 words (Zipf-weighted). Servers pinned to CPU 0, the load generator to CPU 1 (taskset-style
affinity). Open loop at 500/1000/2000 QPS, closed loop for saturation, then the idle mid-tier's
CPU (psutil). Each mid-tier leaf transport (--leaf-transports) is its own deployment: unary
(one RPC per leaf call, as μSuite) and batch (one stream per leaf; calls queued while a message
is being written share the next one).

    python bench/setalgebra.py [--duration 10] [--warmup 2] [--leaf-transports unary,batch] [--json]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

from musku.errors import MuskuError
from musku.services import runtime

# The original μSuite Set Algebra on this kind of machine (p50, p99 in ms; saturation QPS).
ORIGINAL = {500: (0.49, 1.13), 1000: (0.52, 1.75), 2000: (None, 5.0)}
ORIGINAL_SATURATION = (5000, 5400)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--duration", type=float, default=10.0)
    ap.add_argument("--warmup", type=float, default=2.0)
    ap.add_argument("--concurrency", default="16,32,64", help="closed-loop outstanding requests")
    ap.add_argument("--models", default="async-dispatch-block,async-dispatch-poll",
                    help="mid-tier models, all with the set-up's pools (1 poller, 2 workers, "
                         "1 response thread); the first is the reference")  # fmt: skip
    ap.add_argument("--leaf-transports", default="unary,batch",
                    help="mid-tier leaf transports, each a deployment of its own")  # fmt: skip
    runtime.BenchPlacement.add_arguments(ap)
    a = ap.parse_args()
    try:
        pl = runtime.BenchPlacement.of(a)
    except MuskuError as e:
        print(f"bench/setalgebra: {e.one_line()}", file=sys.stderr)
        return int(e.status)
    ncpu = pl.ncpu
    models = [m.strip() for m in a.models.split(",") if m.strip()]
    bad = [m for m in models if m not in runtime.THREADING_MODELS]
    if not models or bad:
        print(f"bench/setalgebra: unknown threading model(s) {bad or a.models!r}", file=sys.stderr)
        return 3
    transports = [t.strip() for t in a.leaf_transports.split(",") if t.strip()]
    bad = [t for t in transports if t not in runtime.LEAF_TRANSPORTS]
    if not transports or bad:
        print(f"bench/setalgebra: unknown leaf transport(s) {bad or a.leaf_transports!r}",
              file=sys.stderr)  # fmt: skip
        return 3
    out: dict = {"cpus": ncpu, "models": {}}
    try:
        for transport in transports:
            run_transport(a, pl, transport, models, out)
    except MuskuError as e:
        print(f"bench/setalgebra: {e.one_line()}", file=sys.stderr)
        return int(e.status)
    report(a, out, models[0], ncpu)
    return 0


def run_transport(a: argparse.Namespace, pl: runtime.BenchPlacement, transport: str,
                  models: list[str], out: dict) -> None:  # fmt: skip
    """One deployment with this leaf transport: every model's open and closed loops (keys
    "MODEL/TRANSPORT" in out["models"]); the idle CPU with the first model (per transport)."""
    lg_cpus = pl.loadgen_cpus
    with runtime.deploy(
        "setalgebra",
        workdir=Path(tempfile.mkdtemp(prefix="musku-bench-sa-")),
        data_dir=pl.data_dir,
        shards=2,
        threading="async-dispatch-block",
        pollers=1,
        workers=2,
        responders=1,
        leaf_threading="sync-inline-block",
        leaf_args=["--max-pollers", "1", "--max-workers", "1", "--max-responders", "1"],
        server_cpus=pl.server_cpus,
        max_pools=(1, 2, 1),
        leaf_transport=transport,
    ) as dep:
        out["placement"] = {**dep.placement(), "loadgen": pl.loadgen_list()}
        procs = [dep.midtier, *dep.leaves]
        for model in models:
            runtime.set_threading(dep.midtier.address, model, pollers=1, workers=2,
                                  responders=1)  # fmt: skip
            res: dict = {"open_loop": {}, "closed_loop": [], "leaf_transport": transport}
            out["models"][f"{model}/{transport}"] = res
            for q in (500, 1000, 2000):
                r = runtime.run_load(dep.midtier.address, "setalgebra", dep.load_data,
                                     runtime.LoadSpec(qps=q, duration_s=a.duration,
                                                      warmup_s=a.warmup),
                                     cpus=lg_cpus)  # fmt: skip
                res["open_loop"][q] = r["total"]
            for c in [int(x) for x in a.concurrency.split(",")]:
                cpu0 = [runtime.cpu_seconds(p.pid) for p in procs]
                r = runtime.run_load(dep.midtier.address, "setalgebra", dep.load_data,
                                     runtime.LoadSpec(mode="closed", concurrency=c,
                                                      duration_s=a.duration,
                                                      warmup_s=a.warmup),
                                     cpus=lg_cpus)  # fmt: skip
                cpu = [runtime.cpu_seconds(p.pid) - t for p, t in zip(procs, cpu0, strict=True)]
                # the servers' CPU covers the warm-up too: divide by every answered request
                tot = r["total"]
                n = max(1, tot["ok"] + tot["errors"] + r.get("warmup_answered", 0))
                per_q = [1e6 * x / n for x in cpu]
                res["closed_loop"].append(
                    {"concurrency": c, "cpu_us_per_query": per_q, **r["total"]}
                )
            res["saturation_qps"] = max(r["achieved_qps"] for r in res["closed_loop"])
        runtime.set_threading(dep.midtier.address, models[0], pollers=1, workers=2,
                              responders=1)  # fmt: skip
        time.sleep(2.0)
        idle = out.setdefault("idle_cpu_percent", {})
        idle[transport] = runtime.idle_cpu_percent(dep.midtier.pid, 5.0)
        out.setdefault("idle_leaf_cpu_percent", {})[transport] = max(
            runtime.idle_cpu_percent(p.pid, 2.0) for p in dep.leaves
        )


def report(a: argparse.Namespace, out: dict, ref_model: str, ncpu: int) -> None:
    ref = next(k for k in out["models"] if k.startswith(ref_model + "/"))
    out["goals"] = {}
    for model, res in out["models"].items():
        out["goals"][model] = {
            "saturation_ratio": res["saturation_qps"] / ORIGINAL_SATURATION[0],
            "p99_at_1000_ratio": res["open_loop"][1000]["latency_us"]["p99"]
            / 1e3
            / ORIGINAL[1000][1],
        }
    out["idle_cpu_below_1pct"] = max(out["idle_cpu_percent"].values()) < 1.0
    best_sat = max(out["models"], key=lambda k: out["goals"][k]["saturation_ratio"])
    best_p99 = min(out["models"], key=lambda k: out["goals"][k]["p99_at_1000_ratio"])
    out["best"] = {"saturation": best_sat, "p99_at_1000": best_p99}
    if a.json:
        print(json.dumps(out, indent=2))
        return
    print(f"Set Algebra, μSuite reference set-up; placement {out['placement']}")
    for model, res in out["models"].items():
        print(f"mid-tier {model} (model/leaf transport; 1 poller, 2 workers, 1 response thread)"
              + (" [reference]" if model == ref else ""))  # fmt: skip
        print(f"{'load':>8} | {'musku p50':>10} {'p99':>8} {'p99.9':>8} {'achieved':>9} "
              f"{'err':>4} | {'μSuite p50':>10} {'p99':>6}")  # fmt: skip
        for q, r in res["open_loop"].items():
            lat = r["latency_us"]
            op50, op99 = ORIGINAL[q]
            print(f"{q:>8} | {lat['p50'] / 1e3:>10.3f} {lat['p99'] / 1e3:>8.3f} "
                  f"{lat['p999'] / 1e3:>8.3f} {r['achieved_qps']:>9.1f} {r['errors']:>4} | "
                  f"{op50 if op50 else '-':>10} {op99:>6}")  # fmt: skip
        for r in res["closed_loop"]:
            lat = r["latency_us"]
            print(
                f"closed loop, {r['concurrency']:>3} outstanding: {r['achieved_qps']:8.1f} QPS "
                f"(p50 {lat['p50'] / 1e3:.3f} ms, p99 {lat['p99'] / 1e3:.3f} ms, "
                f"errors {r['errors']}); "
                f"CPU/query mid {r['cpu_us_per_query'][0]:.0f} us, "
                f"leaves {sum(r['cpu_us_per_query'][1:]):.0f} us -> "
                f"{1e6 / sum(r['cpu_us_per_query']):.0f} QPS per dedicated core"
            )
        g = out["goals"][model]
        met = {True: "met", False: "NOT met"}
        print(
            f"  saturation: {res['saturation_qps']:.0f} QPS vs μSuite {ORIGINAL_SATURATION[0]}-"
            f"{ORIGINAL_SATURATION[1]} QPS -> {g['saturation_ratio']:.2f}x (goal >= 2x: "
            f"{met[g['saturation_ratio'] >= 2]})"
        )
        print(
            f"  p99 at 1000 QPS: {res['open_loop'][1000]['latency_us']['p99'] / 1e3:.3f} ms vs "
            f"μSuite {ORIGINAL[1000][1]} ms -> {g['p99_at_1000_ratio']:.2f}x (goal <= 0.5x: "
            f"{met[g['p99_at_1000_ratio'] <= 0.5]})"
        )
    for transport, pct in out["idle_cpu_percent"].items():
        print(
            f"idle mid-tier ({ref_model}/{transport}) CPU over 5 s: {pct:.2f} % (goal < 1 %); "
            f"idle leaf: {out['idle_leaf_cpu_percent'][transport]:.2f} %"
        )
    g = out["goals"]
    print(f"best saturation: {best_sat} {g[best_sat]['saturation_ratio']:.2f}x the original's; "
          f"best p99 at 1000 QPS: {best_p99} {g[best_p99]['p99_at_1000_ratio']:.2f}x")  # fmt: skip
    if ncpu < 4:
        print(
            f"note: {ncpu} CPUs: servers share CPU {a.server_cpus} (μSuite's figures were also "
            "taken with servers on one core); the load generator has its own core."
        )


if __name__ == "__main__":
    sys.exit(main())
