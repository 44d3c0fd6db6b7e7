#!/usr/bin/env python3
"""One comparison pooled over several pairs (musku.abtest.pooled), on the simulator.

Rows: 1, 2, 4 and 8 pairs of the shipped Web/Skylake model (the set-up of
``bench/abtest_stats.py``: prefetch l2hw_dcu -> all_on set to exactly +1.00 %, min_effect
0.5 %, warmup_s 60, 95 %, cap 30,000 per pair), plus 4 and 8 pairs with one pair 3x noisier
and with the effect on half the pairs only (+1 % on even pairs, 0 on the others: the
estimand is the pool's average, +0.5 %). Per row: A/A runs and false positives with the
Clopper-Pearson 95 % interval, coverage at the stop; power at the effect with the sign right;
median host-clock to the decision (the longest pair's) for the A/A and the effect, and its
ratio to one pair's in the same run; host-hours (pairs x 2 hosts x clock).

    python bench/abtest_pooled.py               # 100 A/A + 100 effect runs per row
    python bench/abtest_pooled.py --runs 30     # fewer
    python bench/abtest_pooled.py --quick       # smoke: 4 runs of three rows
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import statistics
import sys
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
MODEL_FILE = ROOT / "experiments" / "sim" / "web-skylake18.toml"


@dataclass(frozen=True)
class Row:
    name: str
    pairs: int
    noisy: bool = False  # pair 0 has 3x the noise
    half: bool = False  # the effect on even pairs only


ROWS = [
    Row("1 pair", 1),
    Row("2 pairs", 2),
    Row("4 pairs", 4),
    Row("8 pairs", 8),
    Row("4 pairs, one 3x noisier", 4, noisy=True),
    Row("8 pairs, one 3x noisier", 8, noisy=True),
    Row("4 pairs, effect on half", 4, half=True),
    Row("8 pairs, effect on half", 8, half=True),
]

_MODELS: dict[float, Any] = {}


def _model(effect: float) -> Any:
    from musku.sim import SimModel

    if effect not in _MODELS:
        data = tomllib.loads(MODEL_FILE.read_text())
        data["knobs"]["prefetch"]["throughput"]["l2hw_dcu"] = 1.0 / (1.0 + effect)
        _MODELS[effect] = SimModel.from_dict(data, source=f"pooled bench {effect:+.2%}")
    return _MODELS[effect]


def _run(task: tuple[int, bool, int]) -> tuple[int, bool, str, float, float, float, float]:
    from musku.abtest.pooled import run_pooled_comparison
    from musku.domain import ComparisonSpec, StatsSettings
    from musku.sim import SimPair

    r_i, aa, seed = task
    row = ROWS[r_i]
    spec = ComparisonSpec(
        metric="mips",
        stats=StatsSettings(confidence=0.95, min_effect=0.005, warmup_s=60.0, sample_cap=30_000),
    )
    pairs = []
    for i in range(row.pairs):
        effect = 0.0 if aa or (row.half and i % 2) else 0.01
        model = _model(effect)
        base = model.reference_config.with_("prefetch", "l2hw_dcu")
        noise = 3.0 if row.noisy and i == 0 else 1.0
        pairs.append(
            SimPair(
                model,
                seed=seed * 1000 + i,
                noise_scale=noise,
                initial=(base, base),
                names=(f"p{i}a", f"p{i}b"),
            )
        )
    model = _model(0.01)
    base = model.reference_config.with_("prefetch", "l2hw_dcu")
    cand = base if aa else base.with_("prefetch", "all_on")
    r = run_pooled_comparison(pairs, base, cand, spec, seed=seed)
    return r_i, aa, r.decision.value, r.estimate, r.ci_low, r.ci_high, r.host_time_s


def clopper_pearson(k: int, n: int) -> tuple[float, float]:
    from scipy.stats import beta

    lo = float(beta.ppf(0.025, k, n - k + 1)) if k > 0 else 0.0
    hi = float(beta.ppf(0.975, k + 1, n - k)) if k < n else 1.0
    return lo, hi


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=100, help="A/A and effect runs per row")
    ap.add_argument("--quick", action="store_true", help="a smoke run: 4 runs of three rows")
    ap.add_argument("--jobs", type=int, default=max(1, (mp.cpu_count() or 2)))
    args = ap.parse_args(argv)
    rows = [0, 2, 3] if args.quick else list(range(len(ROWS)))
    runs = 4 if args.quick else args.runs
    tasks = [(r, aa, 7000 + s) for r in rows for aa in (True, False) for s in range(runs)]
    with mp.get_context("fork").Pool(args.jobs) as pool:
        out = pool.map(_run, tasks, chunksize=1)
    one_clock: dict[bool, float] = {}
    print(
        f"{'design':<28} {'A/A FP':>18} {'cover':>6} {'power':>6} {'cover':>6} "
        f"{'A/A clock h':>12} {'+1% clock h':>12} {'vs 1 pair':>11} {'host-h +1%':>10}"
    )
    for r_i in rows:
        row = ROWS[r_i]
        null = [o for o in out if o[0] == r_i and o[1]]
        eff = [o for o in out if o[0] == r_i and not o[1]]
        fp = sum(o[2] in ("better", "worse") for o in null)
        lo, hi = clopper_pearson(fp, len(null))
        cov0 = sum(o[4] <= 0.0 <= o[5] for o in null) / len(null)
        target = 0.005 if row.half else 0.01  # the pool's average effect
        good = sum(o[2] == "better" for o in eff) / len(eff)
        cov1 = sum(o[4] <= target <= o[5] for o in eff) / len(eff)
        c0 = statistics.median(o[6] for o in null) / 3600
        c1 = statistics.median(o[6] for o in eff) / 3600
        if row.pairs == 1:
            one_clock = {True: c0, False: c1}
        ratio = f"{c0 / one_clock[True]:.2f}/{c1 / one_clock[False]:.2f}" if one_clock else "-"
        print(
            f"{row.name:<28} {fp:>3}/{len(null):<3} {fp / len(null):5.1%} "
            f"[{lo:.1%},{hi:.1%}] {cov0:6.1%} {good:6.1%} {cov1:6.1%} {c0:12.2f} {c1:12.2f} "
            f"{ratio:>11} {c1 * 2 * row.pairs:10.2f}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
