"""Multi-arm crossover scans (issue 20, item 2) against today's pairwise sequence.

(a) A K-arm A/A scan (all arms the baseline) on a simulated group of K+1 hosts, ``--runs``
    seeded runs: the family-wise rate of any claimed difference (any confidence sequence of
    any pair excluding 0 at any look), with its Clopper-Pearson 95 % interval. Goal <= 5 %.
(b) One knob's scan (``--knob``, default prefetch; shp is the harder one) of the Web/Skylake
    experiment, ``--seeds`` seeds, in the same run on the same sim model:
    - multi-arm: the Williams rotation on a group of K+1 simulated hosts (musku.design);
    - pairwise: today's sequence on one SimPair (``open_pair``): ``run_comparison`` of every
      other setting against the baseline, then the runner's choice (the best significantly
      better one, a run-off against overlapping challengers, a confirming comparison).
    Host-clock time to the decision, total host-hours, and the setting chosen.

Usage: ``python bench/multiarm.py [--runs 300] [--seeds 10] [--jobs 2] [--knob shp]``.
Figures from a busy shared machine change only the wall time, not the host-clock figures
(the hosts are simulated on a virtual clock).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
EXPERIMENT = ROOT / "experiments" / "web-skylake.toml"


def _setup() -> tuple[Any, Any]:
    from musku.experiment import load_experiment
    from musku.sim.model import SimModel

    exp = load_experiment(EXPERIMENT)
    model = SimModel.load(exp.resolve(exp.hosts.options["model"]), space=exp.space)
    return exp, model


def aa_run(args: tuple[int, int]) -> tuple[bool, float, str]:
    """One A/A scan: (claimed a difference, host-clock hours, decision)."""
    seed, arms = args
    from musku.design.group import run_scan
    from musku.sim.group import SimGroup

    exp, model = _setup()
    base = exp.baseline_config
    g = SimGroup(model, arms, seed=10_000 + seed, initial=base)
    r = run_scan(g, [base] * arms, exp.stats)
    dec = r.outcome.decision.value if r.outcome.decision else "none"
    return r.outcome.claimed_difference, r.host_time_s / 3600.0, dec


def multiarm_run(args: tuple[int, str]) -> dict[str, Any]:
    seed, knob = args
    from musku.design.group import run_scan
    from musku.domain import format_value
    from musku.sim.group import SimGroup

    exp, model = _setup()
    base = exp.baseline_config
    values = [v for v in exp.space[knob] if v != base[knob]]
    arms = [base, *(base.with_(knob, v) for v in values)]
    g = SimGroup(model, len(arms), seed=seed, initial=base, reboot_knobs=exp.spec.reboot_knobs)
    r = run_scan(g, arms, exp.stats)
    return {
        "hours": r.host_time_s / 3600.0,
        "host_hours": r.host_hours,
        "hosts": r.hosts,
        "chosen": format_value(knob, r.best[knob]),
        "decision": r.outcome.decision.value if r.outcome.decision else "none",
    }


def pairwise_run(args: tuple[int, str]) -> dict[str, Any]:
    """Today's sequence on one pair (the runner's per-knob scan and choice, through the public
    ``run_comparison``; no database)."""
    seed, knob = args
    from musku.abtest import run_comparison
    from musku.domain import Decision, format_value
    from musku.sim.pair import open_pair

    exp, _ = _setup()
    base = exp.baseline_config
    pair = open_pair(exp, seed=seed)
    spec = exp.spec
    counter = 0

    def compare(a: Any, b: Any) -> Any:
        nonlocal counter
        counter += 1
        return run_comparison(pair, a, b, spec, seed=seed * 100_003 + counter)

    results = [compare(base, base.with_(knob, v)) for v in exp.space[knob] if v != base[knob]]
    better = sorted(
        (r for r in results if r.decision is Decision.BETTER), key=lambda r: -r.estimate
    )
    chosen = base
    if better:
        champion = better[0]
        for challenger in better[1:4]:
            if challenger.ci_high < champion.ci_low:
                break
            if compare(champion.candidate, challenger.candidate).decision is Decision.BETTER:
                champion = challenger
        if compare(base, champion.candidate).decision is Decision.BETTER:
            chosen = champion.candidate
    t = pair.now()
    return {
        "hours": t / 3600.0,
        "host_hours": 2 * t / 3600.0,
        "hosts": 2,
        "chosen": format_value(knob, chosen[knob]),
        "decision": f"{len(results)} comparisons + {counter - len(results)} more",
    }


def clopper_pearson(k: int, n: int, level: float = 0.95) -> tuple[float, float]:
    from scipy.stats import beta

    a = 1.0 - level
    lo = 0.0 if k == 0 else float(beta.ppf(a / 2, k, n - k + 1))
    hi = 1.0 if k == n else float(beta.ppf(1 - a / 2, k + 1, n - k))
    return lo, hi


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=300, help="A/A runs (0: skip)")
    ap.add_argument("--arms", type=int, default=5, help="A/A arms, baseline included (K+1)")
    ap.add_argument("--seeds", type=int, default=10, help="seeds of the knob scan (0: skip)")
    ap.add_argument("--knob", default="prefetch", help="knob of the Web/Skylake scan")
    ap.add_argument("--jobs", type=int, default=2, help="worker processes")
    a = ap.parse_args(argv)
    if a.runs < 0 or a.seeds < 0 or a.jobs < 1 or a.arms < 2:
        print("multiarm: --runs/--seeds >= 0, --jobs >= 1, --arms >= 2", file=sys.stderr)
        return 2
    exp, model = _setup()
    if a.knob not in exp.space:
        print(f"multiarm: the experiment has no knob {a.knob!r}", file=sys.stderr)
        return 3
    print(f"machine: 2 cores shared with other jobs (busy); --jobs {a.jobs}; host-clock "
          "figures are simulated time and do not depend on the load")  # fmt: skip
    with ProcessPoolExecutor(max_workers=a.jobs) as pool:
        if a.runs:
            t0 = time.monotonic()
            got = list(pool.map(aa_run, [(s, a.arms) for s in range(a.runs)], chunksize=4))
            hits = sum(1 for g in got if g[0])
            lo, hi = clopper_pearson(hits, a.runs)
            hours = [g[1] for g in got]
            decs = {d: sum(1 for g in got if g[2] == d) for d in sorted({g[2] for g in got})}
            print(f"\n(a) A/A scan, {a.arms} identical arms on {a.arms} simulated Web/Skylake "
                  f"hosts, {a.runs} runs ({time.monotonic() - t0:.0f} s wall)")  # fmt: skip
            print(f"  family-wise false positives: {hits}/{a.runs} = {hits / a.runs:.3f} "
                  f"(Clopper-Pearson 95 % [{lo:.3f}, {hi:.3f}]; goal <= 0.05)")  # fmt: skip
            print(f"  host-clock time per scan: median {statistics.median(hours):.2f} h, "
                  f"max {max(hours):.2f} h; decisions {decs}")  # fmt: skip
        if a.seeds:
            t0 = time.monotonic()
            jobs = [(s, a.knob) for s in range(a.seeds)]
            multi = list(pool.map(multiarm_run, jobs))
            pairw = list(pool.map(pairwise_run, jobs))
            from musku.domain import format_value

            truth = format_value(a.knob, model.best_setting(a.knob, exp.baseline_config))
            print(f"\n(b) {a.knob} scan of {EXPERIMENT.name} (baseline "
                  f"{format_value(a.knob, exp.baseline_config[a.knob])}, true best {truth}), "
                  f"{a.seeds} seeds ({time.monotonic() - t0:.0f} s wall)")  # fmt: skip
            rows = []
            for name, res in (("multi-arm", multi), ("pairwise", pairw)):
                h = [r["hours"] for r in res]
                hh = [r["host_hours"] for r in res]
                chosen: dict[str, int] = {}
                for r in res:
                    chosen[r["chosen"]] = chosen.get(r["chosen"], 0) + 1
                right = chosen.get(truth, 0)
                rows.append((statistics.mean(h), statistics.mean(hh)))
                print(f"  {name:9s} hosts {res[0]['hosts']:2d}: time to decision mean "
                      f"{statistics.mean(h):5.2f} h (median {statistics.median(h):.2f}, max "
                      f"{max(h):.2f}); host-hours mean {statistics.mean(hh):5.2f}; chose the "
                      f"true best {right}/{len(res)}; chosen {chosen}")  # fmt: skip
            print(f"  multi-arm / pairwise: time {rows[0][0] / rows[1][0]:.2f}x, host-hours "
                  f"{rows[0][1] / rows[1][1]:.2f}x")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
