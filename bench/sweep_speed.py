#!/usr/bin/env python3
"""Full independent 7-knob sweep of Web/Skylake18 on simulated hosts: wall time, host time.

Goals (issue: μSKU core): wall time < 60 s on this machine; host time <= 1 h, against the
SoftSKU paper's 5-10 h per sweep. Also prints the composed soft SKU and its validated gains
against the paper's (Web/Skylake: +6.2 % over stock, +4.5 % over production), and the
results-DB share of the wall time (the same sweep with and without storage, in this run).

    python bench/sweep_speed.py [--experiment experiments/web-skylake.toml] [--seeds 3]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

PAPER = {
    "web-skylake": (0.062, 0.045),
    "web-broadwell": (0.072, 0.030),
    "ads1-skylake": (0.025, 0.025),
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--experiment", default=str(ROOT / "experiments" / "web-skylake.toml"))
    ap.add_argument("--seeds", type=int, default=3, help="sweeps to run (different seeds)")
    args = ap.parse_args()

    from musku.experiment import load_experiment
    from musku.storage import open_store
    from musku.sweep import run_sweep

    exp = load_experiment(args.experiment)
    walls, hosts, walls_nodb = [], [], []
    for seed in range(args.seeds):
        t0 = time.perf_counter()
        rep = run_sweep(exp, seed=seed)
        walls_nodb.append(time.perf_counter() - t0)
        with tempfile.TemporaryDirectory() as tmp:
            store = open_store(f"sqlite:///{tmp}/results.db")
            t0 = time.perf_counter()
            rep = run_sweep(exp, store=store, seed=seed)
            walls.append(time.perf_counter() - t0)
            store.close()
        hosts.append(rep.host_time_s)
        sku = rep.sku
        assert sku is not None and sku.vs_production is not None and sku.vs_stock is not None
        print(
            f"seed {seed}: {rep.comparisons} comparisons, wall {walls[-1]:.1f} s "
            f"(without DB {walls_nodb[-1]:.1f} s), host time {rep.host_time_s / 3600:.2f} h"
        )
        print(f"  soft SKU: {sku.configuration}")
        for label, r in (("stock", sku.vs_stock), ("production", sku.vs_production)):
            print(
                f"  vs {label:10}: {r.estimate * 100:+.2f} % "
                f"[{r.ci_low * 100:+.2f}, {r.ci_high * 100:+.2f}] ({r.decision.value})"
            )
    name = exp.name
    print()
    print(f"experiment            {name}")
    print(f"wall time (median)    {statistics.median(walls):.1f} s    goal < 60 s")
    print(f"wall time without DB  {statistics.median(walls_nodb):.1f} s")
    host_h = statistics.median(hosts) / 3600
    verdict = "met" if host_h <= 1.0 else "NOT met"
    print(
        f"host time (median)    {host_h:.2f} h   goal <= 1 h: {verdict} (the paper: 5-10 h a sweep)"
    )
    if name in PAPER:
        stock, prod = PAPER[name]
        print(
            f"paper gains           +{stock * 100:.1f} % over stock, +{prod * 100:.1f} % over production"
        )


if __name__ == "__main__":
    main()
