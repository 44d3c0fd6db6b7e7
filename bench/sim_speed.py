"""Simulator speed: paired windows per second through window(), windows() and arrays().

    python bench/sim_speed.py [--model experiments/sim/web-skylake18.toml] [--count 1000]

Also times a sweep-sized workload: 60 comparisons of 3000 one-second windows each.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from musku.sim import SimModel, SimPair

ROOT = Path(__file__).resolve().parents[1]


def rate(fn: object, windows: int, repeat: int) -> tuple[float, float]:
    assert callable(fn)
    fn()  # warm
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return windows / best, best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=str(ROOT / "experiments" / "sim" / "web-skylake18.toml"))
    ap.add_argument("--count", type=int, default=1000)
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    model = SimModel.load(args.model)
    pair = SimPair(model, seed=0)
    n = args.count

    def single() -> None:
        for _ in range(n):
            pair.window(1.0)

    rows = [
        ("window() x N", *rate(single, n, args.repeat)),
        ("windows(1.0, N)", *rate(lambda: pair.windows(1.0, n), n, args.repeat)),
        ("arrays(1.0, N)", *rate(lambda: pair.arrays(1.0, n), n, args.repeat)),
        ("windows(10.0, N)", *rate(lambda: pair.windows(10.0, n), n, args.repeat)),
    ]
    print(f"model {model.name}, N = {n} paired windows")
    print(f"{'call':<18} {'windows/s':>12} {'ms per call':>12}")
    for name, per_s, secs in rows:
        print(f"{name:<18} {per_s:>12,.0f} {secs * 1000:>12.2f}")

    base = model.reference_config
    assert base is not None
    cdp = base.with_("cdp", "6:5")
    t0 = time.perf_counter()
    for _ in range(60):
        pair.apply((base, cdp))
        pair.windows(1.0, 3000)
        pair.apply((base, base))
    wall = time.perf_counter() - t0
    print(
        f"sweep-sized: 60 comparisons x 3000 windows via windows(): {wall:.2f} s wall, "
        f"{pair.now() / 3600:.0f} h of host time"
    )


if __name__ == "__main__":
    main()
