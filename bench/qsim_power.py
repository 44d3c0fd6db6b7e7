"""μqSim's QoS-aware power manager on a qsim 2-tier model under a diurnal load (docs/qsim.md).

The 2-tier model (``experiments/qsim/2tier.toml``: an nginx-like front end calling a
memcached-like cache, DVFS per tier) runs one simulated "day" of a diurnal open-loop load (a
raised cosine from ``--low`` to ``--high`` QPS and back, in 0.25 s epochs) four times with the same
seed: every tier at the highest frequency (the baseline), then with the power manager
(``musku.qsim.power.QosPowerManager``) deciding every 0.1, 0.5 and 1 s. Printed in the form of
the μqSim paper's Table III: the QoS-violation rate (share of 100-ms windows whose end-to-end p99
is above the target), plus the energy (``PowerModel``: per core 2 W static, 6 W dynamic at
2.6 GHz scaled by (f / 2.6)^3 while busy) and what the manager saved against the baseline.

    PYTHONPATH=. python bench/qsim_power.py [--day 30] [--qos-us 500] [--quick]
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path
from typing import Any

from musku.qsim.model import load
from musku.qsim.power import PowerModel, run_managed

REPO = Path(__file__).resolve().parents[1]


def diurnal(doc: dict[str, Any], low: float, high: float, day_s: float) -> dict[str, Any]:
    step = 0.25
    n = max(1, round(day_s / step))
    epochs = []
    for i in range(n):
        mid = (i + 0.5) * step
        q = low + (high - low) * (1 - math.cos(2 * math.pi * mid / day_s)) / 2
        epochs.append({"end_s": (i + 1) * step, "qps": q})
    epochs[-1]["end_s"] = day_s * 2
    client = dict(doc["client"], epochs=epochs)
    return dict(doc, client=client, duration_s=day_s, warmup_s=min(0.5, day_s / 20))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", type=Path, default=REPO / "experiments/qsim/2tier.toml")
    ap.add_argument("--day", type=float, default=30.0, help="simulated seconds of one 'day'")
    ap.add_argument("--low", type=float, default=20000)
    ap.add_argument("--high", type=float, default=170000)
    ap.add_argument("--qos-us", type=float, default=500.0, help="end-to-end p99 target")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--quick", action="store_true", help="a 6-s day")
    a = ap.parse_args()
    day = 6.0 if a.quick else a.day
    doc = diurnal(dict(load(a.model).engine, seed=a.seed), a.low, a.high, day)
    pm = PowerModel()
    print(f"model {a.model.name}: tiers {', '.join(s['name'] for s in doc['services'])}; diurnal "
          f"load {a.low:.0f} -> {a.high:.0f} -> {a.low:.0f} QPS over {day:g} simulated s; QoS: "
          f"p99 <= {a.qos_us:g} us per 100-ms window; frequencies 1.2-2.6 GHz in 0.2 steps")  # fmt: skip
    t0 = time.process_time()
    base = run_managed(doc, qos_p99_us=a.qos_us, decision_s=0.1, manage=False, power=pm)
    rows = [("all tiers at 2.6 GHz", base)]
    for d in (0.1, 0.5, 1.0):
        rows.append((f"manager, decide every {d:g} s",
                     run_managed(doc, qos_p99_us=a.qos_us, decision_s=d, power=pm, seed=a.seed)))  # fmt: skip
    print(f"\n{'':<30} {'QoS violations':>15} {'p99 (day)':>10} {'mean GHz per tier':>24} "
          f"{'energy J':>9} {'saved':>7}")  # fmt: skip
    for name, r in rows:
        ws = [w for w in r["windows"] if w["count"] > 0]
        tiers = list(ws[0]["freq_ghz"]) if ws else []
        mean_f = " / ".join(f"{sum(w['freq_ghz'][t] for w in ws) / len(ws):.2f}" for t in tiers)
        saved = 1 - r["energy_j"] / base["energy_j"]
        print(f"{name:<30} {r['violation_rate'] * 100:>14.1f}% "
              f"{r['result']['latency']['p99_us']:>8.0f}us {mean_f:>24} {r['energy_j']:>9.1f} "
              f"{saved * 100:>6.1f}%")  # fmt: skip
    print(f"\n{len(base['windows'])} windows of 100 ms per run; {time.process_time() - t0:.1f} "
          "CPU-s here (the engine's CPU is in its own process)")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
