#!/usr/bin/env python3
"""The tester's futility stop (rule option ``futility``, docs/abtest.md "The futility stop"):
how often it fires where it must not, and what it saves where it may.

The set-up is bench/abtest_stats.py's (the shipped model ``experiments/sim/web-skylake18.toml``,
the prefetcher step l2hw_dcu -> all_on set to an exact true effect, min_effect 0.5 %, 95 %,
warm-up 60 s, cap 30,000), one comparison per seed, the same seeds in every row. Rows:

- **true +1 %, bar +0.5 %** (the sweep's question for a knob's single setting): "effect >=
  +0.5 %" is true, so every ``not_better`` is an error; target <= alpha = 5 % (the rate with
  its Clopper-Pearson 95 % interval);
- **true +0.5 %, bar +0.5 %**: the bar itself, where the SPRT spends its whole alpha (the same
  target; most runs end ``better`` first);
- **A/A (true 0), no question** and **bar +0.5 %** and **bar +3 %** (a walk's best so far):
  the samples and host-clock to a decision (a true 0 ends ``no_difference`` or
  ``not_better``), seed for seed.

    python bench/futility.py [--runs 100] [--aa-runs 40] [--jobs 1] [--seed 1000]
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import statistics
import sys
import time
from collections import Counter
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import abtest_stats as ab  # noqa: E402  (the bench's set-up, shared)

ROWS: list[tuple[str, float, float | None, str]] = [
    # (name, true effect, futility bar or None, run kind)
    ("true +1 %, bar +0.5 %", 0.01, 0.005, "power"),
    ("true +0.5 %, bar +0.5 %", 0.005, 0.005, "power"),
    ("A/A, no question", 0.0, None, "null"),
    ("A/A, bar +0.5 %", 0.0, 0.005, "null"),
    ("A/A, bar +3 %", 0.0, 0.03, "null"),
]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=100, help="runs per row with a true effect")
    ap.add_argument("--aa-runs", type=int, default=40, help="runs per A/A row")
    ap.add_argument("--jobs", type=int, default=1)
    ap.add_argument("--seed", type=int, default=1000, help="first seed")
    args = ap.parse_args(argv)
    if args.runs < 1 or args.aa_runs < 0 or args.jobs < 1:
        ap.error("--runs and --jobs must be >= 1, --aa-runs >= 0")
    conds = [
        replace(
            ab.Cond(name, effect=effect if effect else 0.01),
            options=(("futility", bar),) if bar is not None else (),
        )
        for name, effect, bar, _ in ROWS
    ]
    tasks = []
    for i, (_, _, _, kind) in enumerate(ROWS):
        n = args.runs if kind == "power" else args.aa_runs
        off = 100_000 if kind == "power" else 0
        tasks += [ab.Task(i, kind, args.seed + off + j) for j in range(n)]
    print(f"{len(tasks)} comparisons on {args.jobs} worker(s)...", flush=True)
    t0 = time.perf_counter()
    if args.jobs == 1:
        ab._init(conds)
        outs = [ab._run(t) for t in tasks]
    else:
        with mp.get_context("fork").Pool(args.jobs, ab._init, (conds,)) as pool:
            outs = list(pool.imap(ab._run, tasks, chunksize=2))
    print("\n| row | runs | decisions | not_better [CP 95 %] | median samples | median host h |")
    print("|---|---|---|---|---|---|")
    for i, (name, _, _, _) in enumerate(ROWS):
        mine = [o for o in outs if o.task.cond == i]
        if not mine:
            continue
        k = sum(o.decision == "not_better" for o in mine)
        lo, hi = ab.clopper_pearson(k, len(mine))
        dec = ", ".join(f"{d} {c}" for d, c in Counter(o.decision for o in mine).most_common())
        print(
            f"| {name} | {len(mine)} | {dec} | {k / len(mine) * 100:.1f} % "
            f"[{lo * 100:.1f}, {hi * 100:.1f}] | {statistics.median(o.samples for o in mine):,.0f}"
            f" | {statistics.median(o.host_h for o in mine):.2f} |"
        )
    print(f"\nwall time {time.perf_counter() - t0:.0f} s on {args.jobs} worker(s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
