"""The Web/Skylake independent sweep on simulated fleets: pairwise pools against multi-arm scans.

Issue 20's Must-show, issue 31's goals. For each fleet size (default 2, 16, 32, 64 hosts) and ``--seeds`` seeds, in
the same run on the same sim model (experiments/web-skylake.toml):

- **pairwise**: ``musku sweep`` itself (``run_sweep``) with ``[hosts] fleet = N``: the knobs'
  scans run at once on the pool's N/2 pairs, comparisons pooled over several pairs where pairs
  are free (docs/fleet.md); 2 hosts is one pair's sweep, the baseline of the ratios below;
- **multi-arm**: ``musku sweep`` with ``[sweep] mode = "multiarm"`` (musku/sweep/multiarm.py):
  every knob's scan as Williams scans on a group of the pool, groups in waves of disjoint
  hosts, then the composition validated against production and stock on one pair (fewer than
  3 hosts cannot hold a group: n/a);
- **multi-arm list**: the same scans scheduled by :func:`musku.design.fleet.multiarm_sweep`
  (each knob starts as soon as enough hosts are free), for comparison with the mode's waves.

Printed per size and strategy: host-clock time to the soft SKU (median, max), total host-hours
(median; ratio to today's 2-host pairwise sweep), and in how many seeds the soft SKU is the
paper's: each knob's best setting over production in the sim model, which
tests/sim/test_case_studies.py checks against the paper's figures.
Goals (issue 31): <= 1 h to the soft SKU with 16 hosts, <= 30 min with 64; total host-hours
<= 16 at every size; the paper's soft SKU in >= 9 of 10 seeds. ``--aa-runs N`` adds bench/multiarm.py's K-arm A/A family-wise rate.

For pairwise it also prints the host-clock beside the schedule's own estimate
(:func:`musku.sweep.schedule.estimate_clock`, what ``musku sweep --dry-run`` says) and where the
host time went (measuring, warm-up, switching, reboots: host-hours and minutes per comparison).

Usage: ``python bench/fleet.py [--sizes 2,16,32,64] [--seeds 10] [--jobs 2] [--aa-runs 300]
[--strategies pairwise,multi-arm,ma-list] [--reboot-knobs reboot|scan-live]``
(``--reboot-knobs scan-live``: pairwise with ``[sweep] reboot_knobs = "scan-live"``).
The hosts are simulated on virtual clocks, so a busy machine changes only the wall time.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from functools import partial
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
EXPERIMENT = ROOT / "experiments" / "web-skylake.toml"


def paper_sku() -> dict[str, Any]:
    """The SoftSKU paper's Web/Skylake soft SKU (Sriraman et al., ISCA 2019): each knob's best
    setting over production in the sim model, which tests/sim/test_case_studies.py checks
    against the paper's figures."""
    from musku.experiment import load_experiment
    from musku.sim.model import SimModel

    exp = load_experiment(EXPERIMENT)
    model = SimModel.load(exp.resolve(exp.hosts.options["model"]), space=exp.space)
    return {k: model.best_setting(k, exp.production) for k in exp.space}


PAPER_SKU = paper_sku()


def _fleet_file(tmp: str, n: int, mode: str = "independent", reboot_knobs: str = "reboot") -> Path:
    """A copy of the experiment with ``fleet = n``, sweep ``mode``, ``[sweep] reboot_knobs``,
    the model path absolute."""
    text = EXPERIMENT.read_text().replace('mode = "independent"', f'mode = "{mode}"')
    if reboot_knobs != "reboot":
        text = text.replace("[sweep]\n", f'[sweep]\nreboot_knobs = "{reboot_knobs}"\n')
    model = (EXPERIMENT.parent / "sim" / "web-skylake18.toml").resolve()
    text = text.replace('model = "sim/web-skylake18.toml"', f'model = "{model}"')
    if n > 2:
        text = text.replace("[hosts]\n", f"[hosts]\nfleet = {n}\n")
    path = Path(tmp) / f"web-skylake-{n}-{mode}.toml"
    path.write_text(text)
    return path


def sweep(
    args: tuple[int, int], mode: str = "independent", reboot_knobs: str = "reboot"
) -> dict[str, Any]:
    """``musku sweep`` itself on a simulated fleet of ``n`` hosts, in ``mode``."""
    n, seed = args
    from musku.experiment import load_experiment
    from musku.sweep import run_sweep
    from musku.sweep.runner import critical_path

    with tempfile.TemporaryDirectory() as tmp:
        exp = load_experiment(_fleet_file(tmp, n, mode, reboot_knobs))
        t0 = time.process_time()
        rep = run_sweep(exp, seed=seed)
        cpu = time.process_time() - t0
    return {
        "clock_h": rep.clock_s / 3600.0,
        "host_hours": rep.host_hours,
        "paper": rep.best.as_dict() == PAPER_SKU,
        "cpu_s": cpu,
        "estimate_h": None if rep.estimate_clock_s is None else rep.estimate_clock_s / 3600.0,
        # host-hours (two hosts per pair comparison) per part, and per comparison (minutes)
        "time_h": [2 * x / 3600.0 for x in rep.time.seconds()],
        "per_cmp_min": [x / 60.0 / max(1, rep.comparisons) for x in rep.time.seconds()],
        # the chain that set the clock (task, hours, its comparisons' decisions), and the
        # share of the pool's pair-time no task held
        "chain": [
            (
                s.label,
                (s.end_s - s.start_s) / 3600.0,
                [f"{r.decision.value} {r.host_time_s / 60:.0f}m" for _, r in s.results],
            )
            for s, _ in critical_path(rep.timeline)
        ],
        "idle": (
            1.0 - sum(s.pair_seconds() for s in rep.timeline) / (rep.pairs * rep.clock_s)
            if rep.timeline and rep.clock_s > 0
            else None
        ),
    }


def multiarm_mode(args: tuple[int, int]) -> dict[str, Any]:
    return sweep(args, "multiarm")


def multiarm_list(args: tuple[int, int]) -> dict[str, Any]:
    n, seed = args
    from musku.design.fleet import multiarm_sweep
    from musku.experiment import load_experiment

    exp = load_experiment(EXPERIMENT)
    t0 = time.process_time()
    sw = multiarm_sweep(exp, n, seed)
    cpu = time.process_time() - t0
    return {
        "clock_h": sw.clock_s / 3600.0,
        "host_hours": sw.host_hours,
        "paper": sw.best.as_dict() == PAPER_SKU,
        "cpu_s": cpu,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="2,16,32,64", help="fleet sizes (hosts), comma-separated")
    ap.add_argument("--seeds", type=int, default=10)
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--aa-runs", type=int, default=0, help="K-arm A/A runs (bench/multiarm.py)")
    ap.add_argument(
        "--strategies",
        default=",".join(STRATEGIES),
        help=f"comma-separated, of {', '.join(STRATEGIES)} (pairwise is always run)",
    )
    ap.add_argument(
        "--reboot-knobs",
        choices=("reboot", "scan-live"),
        default="reboot",
        help="pairwise's [sweep] reboot_knobs (docs/experiment.md): 'scan-live' scans "
        "core_count with cpuset/hotplug and confirms the choice with a reboot",
    )
    a = ap.parse_args(argv)
    chosen = {"pairwise", *a.strategies.split(",")}
    if not chosen <= set(STRATEGIES):
        print(f"fleet: --strategies {a.strategies!r}: choose from {STRATEGIES}", file=sys.stderr)
        return 2
    try:
        sizes = sorted({int(s) for s in a.sizes.split(",")})
    except ValueError:
        print(f"fleet: --sizes {a.sizes!r}: comma-separated integers", file=sys.stderr)
        return 2
    if a.seeds < 1 or a.jobs < 1 or not sizes or min(sizes) < 2:
        print("fleet: --seeds >= 1, --jobs >= 1, sizes >= 2", file=sys.stderr)
        return 2
    if 2 not in sizes:
        sizes = [2, *sizes]  # today's sweep: the baseline of the ratios
    run: dict[str, Callable[[tuple[int, int]], dict[str, Any]]] = {
        "pairwise": partial(sweep, reboot_knobs=a.reboot_knobs),
        "multi-arm": multiarm_mode,
        "ma-list": multiarm_list,
    }
    jobs = [("pairwise", n, s) for n in sizes for s in range(a.seeds)]
    jobs += [
        (k, n, s)
        for k in STRATEGIES[1:]
        if k in chosen
        for n in sizes
        if n >= 3
        for s in range(a.seeds)
    ]
    t0 = time.perf_counter()
    with ProcessPoolExecutor(a.jobs) as ex:
        futs = [ex.submit(run[k], (n, s)) for k, n, s in jobs]
        out: dict[tuple[str, int], list[dict[str, Any]]] = {}
        for (k, n, _), f in zip(jobs, futs, strict=True):
            out.setdefault((k, n), []).append(f.result())
    wall = time.perf_counter() - t0
    today = statistics.median(r["host_hours"] for r in out[("pairwise", 2)])
    print(
        f"Web/Skylake independent sweep, {a.seeds} seeds per cell, reboot knobs: "
        f"{a.reboot_knobs} "
        f"(wall {wall:.0f} s, {a.jobs} jobs)"
    )
    print(
        f"{'strategy':<10} {'hosts':>5} {'clock h (med/max)':>18} {'host-h (med)':>13} "
        f"{'x today':>8} {'paper SKU':>10} {'CPU s/sweep':>12}"
    )
    for k in STRATEGIES:
        if k not in chosen:
            continue
        for n in sizes:
            rs = out.get((k, n))
            if rs is None:
                print(f"{k:<10} {n:>5} {'n/a (a group needs 3 hosts or more)':>38}")
                continue
            clocks = [r["clock_h"] for r in rs]
            hh = statistics.median(r["host_hours"] for r in rs)
            paper = sum(r["paper"] for r in rs)
            cpu = statistics.median(r["cpu_s"] for r in rs)
            print(
                f"{k:<10} {n:>5} {statistics.median(clocks):>9.2f} / {max(clocks):>6.2f} "
                f"{hh:>13.1f} {hh / today:>8.2f} {paper:>5}/{len(rs):<4} {cpu:>12.1f}"
            )
    print(
        "pairwise: host-clock measured against the schedule's estimate (median h), and where "
        "the host time went (median host-hours; minutes per comparison)"
    )
    parts = ("measuring", "warm-up", "switching", "reboots")
    for n in sizes:
        rs = out[("pairwise", n)]
        est = [r["estimate_h"] for r in rs if r.get("estimate_h") is not None]
        line = f"  {n:>3} hosts: measured {statistics.median(r['clock_h'] for r in rs):.2f} h"
        line += f", estimated {statistics.median(est):.2f} h" if est else ", no estimate"
        print(line)
        if all("time_h" in r for r in rs):
            hh = [statistics.median(r["time_h"][j] for r in rs) for j in range(4)]
            pc = [statistics.median(r["per_cmp_min"][j] for r in rs) for j in range(4)]
            idle = [r["idle"] for r in rs if r.get("idle") is not None]
            if idle:
                print(
                    f"      pairs idle over the clock (median): {100 * statistics.median(idle):.0f} %"
                )
            for seed, r in enumerate(rs):
                if r.get("chain"):
                    print(
                        f"      seed {seed} chain: "
                        + " -> ".join(
                            f"{lab} {h:.2f} h [{', '.join(d)}]" for lab, h, d in r["chain"]
                        )
                    )
            print(
                "      host-hours: "
                + ", ".join(f"{p} {h:.1f}" for p, h in zip(parts, hh, strict=True))
                + "; per comparison: "
                + ", ".join(f"{p} {m:.1f} min" for p, m in zip(parts, pc, strict=True))
            )
    print("goals:")
    for k in STRATEGIES:
        if k not in chosen:
            continue
        if 16 in sizes and (k, 16) in out:
            c = statistics.median(r["clock_h"] for r in out[(k, 16)])
            print(f"  {k}: <= 1 h to the soft SKU with 16 hosts: {c:.2f} h: {_ok(c <= 1.0)}")
        if 64 in sizes and (k, 64) in out:
            c = statistics.median(r["clock_h"] for r in out[(k, 64)])
            print(f"  {k}: <= 30 min to the soft SKU with 64 hosts: {c:.2f} h: {_ok(c <= 0.5)}")
        most = max(
            (
                statistics.median(r["host_hours"] for r in rs)
                for (kk, _), rs in out.items()
                if kk == k
            ),
            default=float("nan"),
        )
        print(f"  {k}: host-hours <= 16 at every size (worst): {most:.1f}: {_ok(most <= 16.0)}")
        best = min(
            (
                statistics.median(r["host_hours"] for r in rs)
                for (kk, _), rs in out.items()
                if kk == k
            ),
            default=float("nan"),
        )
        print(
            f"  {k}: host-hours <= 0.5x today's (best size): {best / today:.2f}x: {_ok(best <= 0.5 * today)}"
        )
        worst = min(
            (sum(r["paper"] for r in rs), len(rs)) for (kk, _), rs in out.items() if kk == k
        )
        print(
            f"  {k}: the paper's soft SKU in >= 9 of 10 seeds (worst size): "
            f"{worst[0]}/{worst[1]}: {_ok(worst[0] >= 0.9 * worst[1])}"
        )
    if a.aa_runs > 0:
        import multiarm as aa  # bench/multiarm.py

        with ProcessPoolExecutor(a.jobs) as ex:
            res = list(ex.map(aa.aa_run, [(s, 5) for s in range(a.aa_runs)]))
        fp = sum(r[0] for r in res)
        lo, hi = aa.clopper_pearson(fp, a.aa_runs)
        print(
            f"K-arm A/A (5 arms, {a.aa_runs} runs): family-wise false positives "
            f"{100 * fp / a.aa_runs:.1f} % [{100 * lo:.1f}, {100 * hi:.1f}]: {_ok(fp / a.aa_runs <= 0.05)}"
        )
    return 0


STRATEGIES = ("pairwise", "multi-arm", "ma-list")


def _ok(ok: bool) -> str:
    return "met" if ok else "NOT met"


if __name__ == "__main__":
    sys.exit(main())
