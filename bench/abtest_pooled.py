#!/usr/bin/env python3
"""One comparison pooled over several pairs (musku.abtest.pooled), on the simulator.

Rows: 1, 2, 4 and 8 pairs of the shipped Web/Skylake model (the set-up of
``bench/abtest_stats.py``: prefetch l2hw_dcu -> all_on set to exactly +1.00 %, min_effect
0.5 %, warmup_s 60, 95 %, cap 30,000 per pair); 4 and 8 pairs with one pair 3x noisier;
4 and 8 pairs with the effect on half the pairs only (+1 % on even pairs, 0 on the others:
the estimand is the pool's average, +0.5 %); 4 and 8 pairs whose hosts differ by an
unchecked constant bias of 2-3 % each (sign and size drawn per pair: the model's own bias is
0.3 % and the same on every pair); 4 and 8 pairs whose A/A is a real change with no effect
(prefetch l2hw_dcu -> all_on set equal: the model's 5 %, 45-s warm-up after the change; the
other rows' A/A applies nothing), their +1 % runs the plain rows'. Per row: A/A false
positives with the Clopper-Pearson 95 % interval and the A/A coverage of 0; power at the effect (decided ``better``) with its
interval and the coverage of the pool's average effect; median host-clock to the decision
(the latest clock of the pairs it used; a comparison that ends without one: the longest
pair's) for the A/A and the effect, and its ratio to one pair's on the same seeds; how many
effect runs stopped inconclusive because the pairs' effects differ (more pairs, not more
samples, would decide); host-hours at the effect (pairs x 2 hosts x clock). The
effect-on-half rows' A/A runs are the plain rows' of the same size (the same comparisons:
not run twice).

    python bench/abtest_pooled.py                     # 100 A/A + 100 effect runs per row
    python bench/abtest_pooled.py --runs 300 --save runs.jsonl   # resumable; prints the table
    python bench/abtest_pooled.py --table runs.jsonl  # the table of a saved run only
    python bench/abtest_pooled.py --quick             # smoke: 4 runs of three rows

One process by default (``--jobs``): the machine is shared.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import statistics
import sys
import tomllib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
MODEL_FILE = ROOT / "experiments" / "sim" / "web-skylake18.toml"
FIRST_SEED = 7000


@dataclass(frozen=True)
class Row:
    name: str
    pairs: int
    noisy: bool = False  # pair 0 has 3x the noise
    half: bool = False  # the effect on even pairs only
    biased: bool = False  # each pair's hosts differ by 2-3 % (random sign)
    # the A/A is a real change with no effect (prefetch set equal, its 5 %, 45-s warm-up
    # kept): the candidate's transient is on one host only in the pre-period design
    change: bool = False


ROWS = [
    Row("1 pair", 1),
    Row("2 pairs", 2),
    Row("4 pairs", 4),
    Row("8 pairs", 8),
    Row("4 pairs, one 3x noisier", 4, noisy=True),
    Row("8 pairs, one 3x noisier", 8, noisy=True),
    Row("4 pairs, effect on half", 4, half=True),
    Row("8 pairs, effect on half", 8, half=True),
    Row("4 pairs, host bias 2-3 %", 4, biased=True),
    Row("8 pairs, host bias 2-3 %", 8, biased=True),
    Row("4 pairs, A/A a 0 % change", 4, change=True),
    Row("8 pairs, A/A a 0 % change", 8, change=True),
]

_MODELS: dict[float, Any] = {}


def _model(effect: float) -> Any:
    from musku.sim import SimModel

    if effect not in _MODELS:
        data = tomllib.loads(MODEL_FILE.read_text())
        data["knobs"]["prefetch"]["throughput"]["l2hw_dcu"] = 1.0 / (1.0 + effect)
        _MODELS[effect] = SimModel.from_dict(data, source=f"pooled bench {effect:+.2%}")
    return _MODELS[effect]


def _bias(seed: int, i: int) -> float:
    import numpy as np

    rng = np.random.default_rng([seed, i, 0xB1A5])
    return float(rng.choice([-1.0, 1.0]) * rng.uniform(0.02, 0.03))


def run_one(r_i: int, aa: bool, seed: int, design: str = "crossover") -> dict[str, Any]:
    """One comparison of row ``r_i`` (an A/A with ``aa``) on ``seed`` with the pooled
    ``design`` (one pair: always the one pair's test)."""
    from musku.abtest.pooled import run_pooled_comparison
    from musku.domain import ComparisonSpec, StatsSettings
    from musku.sim import SimPair

    row = ROWS[r_i]
    spec = ComparisonSpec(
        metric="mips",
        stats=StatsSettings(confidence=0.95, min_effect=0.005, warmup_s=60.0, sample_cap=30_000),
    )
    pairs = []
    for i in range(row.pairs):
        effect = 0.0 if aa or (row.half and i % 2) else 0.01  # a change row's A/A: 0 too
        model = _model(effect)
        base = model.reference_config.with_("prefetch", "l2hw_dcu")
        pairs.append(
            SimPair(
                model,
                seed=seed * 1000 + i,
                noise_scale=3.0 if row.noisy and i == 0 else 1.0,
                host_bias=_bias(seed, i) if row.biased else None,
                initial=(base, base),
                names=(f"p{i}a", f"p{i}b"),
            )
        )
    model = _model(0.01)
    base = model.reference_config.with_("prefetch", "l2hw_dcu")
    cand = base if aa and not row.change else base.with_("prefetch", "all_on")
    r = run_pooled_comparison(
        pairs, base, cand, spec, seed=seed, design=design if row.pairs > 1 else "crossover"
    )
    return {
        "row": row.name,
        "aa": aa,
        "seed": seed,
        "decision": r.decision.value,
        "estimate": r.estimate,
        "lo": r.ci_low,
        "hi": r.ci_high,
        "clock_s": r.host_time_s,
        "samples": r.samples,
        "heterogeneous": "differs between the pairs" in r.reason,
        "design": design,
        "fallback": "then the crossover" in r.reason,
    }


def _task(task: tuple[int, bool, int, str]) -> dict[str, Any]:
    return run_one(*task)


def clopper_pearson(k: int, n: int) -> tuple[float, float]:
    from scipy.stats import beta

    lo = float(beta.ppf(0.025, k, n - k + 1)) if k > 0 else 0.0
    hi = float(beta.ppf(0.975, k + 1, n - k)) if k < n else 1.0
    return lo, hi


def table(runs: Iterable[dict[str, Any]], rows: Sequence[Row] = ROWS) -> list[str]:
    """The bench's table (markdown) from saved runs; the ratio to one pair's clock uses the
    seeds both rows hold."""
    by: dict[tuple[str, bool], dict[int, dict[str, Any]]] = {}
    for o in runs:
        by.setdefault((o["row"], bool(o["aa"])), {})[int(o["seed"])] = o
    for row in rows:  # an effect-on-half row's A/A is the plain row's of its size
        if row.half:
            by[(row.name, True)] = by.get((f"{row.pairs} pairs", True), {})
        if row.change:  # a change row's +1 % runs are the plain row's
            by[(row.name, False)] = by.get((f"{row.pairs} pairs", False), {})
    one = {aa: by.get(("1 pair", aa), {}) for aa in (True, False)}
    # the pre-period design: how many runs its first stage handed over to the crossover
    pre = any(o.get("design") == "pre" for d in by.values() for o in d.values())
    out = [
        "| design | A/A runs | A/A false positives [95 % CI] | A/A coverage | +1 % runs "
        "| power [95 % CI] | coverage | A/A median clock h (x 1 pair) "
        "| +1 % median clock h (x 1 pair) | +1 % stopped: pairs differ | +1 % host-h |"
        + (" to the crossover A/A, +1 % |" if pre else ""),
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"
        + (" --- |" if pre else ""),
    ]
    for row in rows:
        null, eff = by.get((row.name, True), {}), by.get((row.name, False), {})
        if not null or not eff:
            continue
        n0, n1 = len(null), len(eff)
        fp = sum(o["decision"] in ("better", "worse") for o in null.values())
        lo0, hi0 = clopper_pearson(fp, n0)
        cov0 = sum(o["lo"] <= 0.0 <= o["hi"] for o in null.values()) / n0
        target = 0.005 if row.half else 0.01  # the pool's average effect
        good = sum(o["decision"] == "better" for o in eff.values())
        lo1, hi1 = clopper_pearson(good, n1)
        cov1 = sum(o["lo"] <= target <= o["hi"] for o in eff.values()) / n1
        het = sum(bool(o.get("heterogeneous")) for o in eff.values())

        def clock(d: dict[int, dict[str, Any]], aa: bool, k: int = row.pairs) -> str:
            c = statistics.median(o["clock_s"] for o in d.values()) / 3600
            common = sorted(set(d) & set(one[aa]))
            if not common or k == 1:
                return f"{c:.2f}"
            mine = statistics.median(d[s]["clock_s"] for s in common)
            theirs = statistics.median(one[aa][s]["clock_s"] for s in common)
            return f"{c:.2f} ({theirs / mine:.1f}x)"

        c1 = statistics.median(o["clock_s"] for o in eff.values()) / 3600
        out.append(
            f"| {row.name} | {n0} | {fp} ({fp / n0:.1%}) [{lo0:.1%}, {hi0:.1%}] | {cov0:.1%} "
            f"| {n1} | {good / n1:.1%} [{lo1:.1%}, {hi1:.1%}] | {cov1:.1%} "
            f"| {clock(null, True)} | {clock(eff, False)} | {het}/{n1} "
            f"| {c1 * 2 * row.pairs:.2f} |"
            + (
                f" {sum(bool(o.get('fallback')) for o in null.values())}, "
                f"{sum(bool(o.get('fallback')) for o in eff.values())} |"
                if pre
                else ""
            )
        )
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=(__doc__ or "").split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="\n\n".join((__doc__ or "").split("\n\n")[1:]),
    )
    ap.add_argument("--runs", type=int, default=100, help="A/A and effect runs per row")
    ap.add_argument("--quick", action="store_true", help="a smoke run: 4 runs of three rows")
    ap.add_argument("--jobs", type=int, default=1, help="worker processes (default 1)")
    ap.add_argument("--rows", help="comma-separated row numbers (0-based; default all)")
    ap.add_argument(
        "--save", type=Path, help="append each run to this JSON-lines file; skip runs it holds"
    )
    ap.add_argument("--table", type=Path, help="print the table of a saved file and exit")
    ap.add_argument(
        "--design",
        choices=("crossover", "pre"),
        default="crossover",
        help="the pooled design (run_pooled_comparison's design=; save each to its own file)",
    )
    args = ap.parse_args(argv)
    if args.table is not None:
        runs = [json.loads(x) for x in args.table.read_text().splitlines() if x.strip()]
        print("\n".join(table(runs)))
        return 0
    if args.runs < 1 or args.jobs < 1:
        ap.error("--runs and --jobs must be >= 1")
    rows = [0, 2, 3] if args.quick else list(range(len(ROWS)))
    if args.rows:
        rows = [int(x) for x in args.rows.split(",")]
    runs_n = 4 if args.quick else args.runs
    done: list[dict[str, Any]] = []
    if args.save is not None and args.save.exists():
        done = [json.loads(x) for x in args.save.read_text().splitlines() if x.strip()]
    have = {(o["row"], bool(o["aa"]), int(o["seed"])) for o in done}
    # seed-major: every row grows together, so a stopped run still has all rows
    tasks = [
        (r, aa, FIRST_SEED + s, args.design)
        for s in range(runs_n)
        for r in rows
        for aa in (True, False)
        if (ROWS[r].name, aa, FIRST_SEED + s) not in have
        and not (aa and ROWS[r].half)
        and not (not aa and ROWS[r].change)
    ]
    out = [o for o in done if o["row"] in {ROWS[r].name for r in rows}]
    sink = args.save.open("a") if args.save is not None else None
    try:
        if args.jobs == 1:
            results: Iterable[dict[str, Any]] = map(_task, tasks)
        else:
            pool = mp.get_context("fork").Pool(args.jobs)
            results = pool.imap(_task, tasks, chunksize=1)
        for o in results:
            out.append(o)
            if sink is not None:
                sink.write(json.dumps(o) + "\n")
                sink.flush()
    finally:
        if sink is not None:
            sink.close()
    print("\n".join(table(out, [ROWS[r] for r in rows])))
    return 0


if __name__ == "__main__":
    sys.exit(main())
