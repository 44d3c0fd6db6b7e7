#!/usr/bin/env python3
"""What a pair calibration does to a sweep: the same sweep (same file, same seed) before and
after ``musku pair calibrate``, comparison by comparison (issue 32 item 6).

With a usable calibration the sequential test may decide a comparison before the pair's first
role swap, its interval widened by the calibration's bound on the host bias; without one every
comparison crosses over. Prints, per run: comparisons, how many were decided early, the median
interval half-width and samples of each group, host time, the soft SKU against production;
then the same comparisons matched across the two runs: how much wider, how many fewer samples.
``-o FILE.png`` draws it (docs/abtest.md "What a calibration changes").

    python bench/calibration_effect.py [--experiment experiments/web-skylake.toml] [-o PNG]
    python bench/calibration_effect.py --db URL --runs 1 6 [-o PNG]   # two stored sweeps
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def _key(rec: Any) -> tuple[str, str, str]:
    return (rec.purpose, rec.baseline.key(), rec.candidate.key())


def _finished(store: Any, run: int) -> dict[tuple[str, str, str], Any]:
    """(purpose, baseline, candidate) -> result of a run's finished comparisons with an
    interval (the first of a repeated key)."""
    out: dict[tuple[str, str, str], Any] = {}
    for rec in store.comparisons(run):
        r = rec.result
        if r is None or not (abs(r.ci_low) < 1 and abs(r.ci_high) < 1):
            continue
        out.setdefault(_key(rec), r)
    return out


def _run_both(experiment_file: Path, url: str) -> tuple[int, int]:
    from musku.experiment import load_experiment
    from musku.storage import open_store
    from musku.sweep import calibrate_experiment, run_sweep

    exp = load_experiment(experiment_file)
    with open_store(url) as store:
        before = run_sweep(exp, store=store)
        cal, _ = calibrate_experiment(exp, store)
        if cal is None:
            raise SystemExit("the calibration measured no bias")
        after = run_sweep(exp, store=store)
    assert before.experiment_id is not None and after.experiment_id is not None
    return before.experiment_id, after.experiment_id


def _figure(without: dict[Any, Any], with_: dict[Any, Any], out: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FixedLocator, FuncFormatter, NullFormatter

    from musku.abtest.calibration import decided_early

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4.6), dpi=200)

    def plain_log(ax: Any, axis: Any, ticks: list[float]) -> None:
        """Log scale labelled 0.3, 1, 2... (matplotlib's 3x10^-1 labels overprint)."""
        axis.set_major_locator(FixedLocator(ticks))
        axis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
        axis.set_minor_formatter(NullFormatter())

    def hw(r: Any) -> float:
        return (r.ci_high - r.ci_low) / 2 * 100

    groups = [
        ("without a calibration (all cross over)", list(without.values()), "#7f7f7f", "o"),
        (
            "with it: decided after crossover",
            [r for r in with_.values() if not decided_early(r.reason)],
            "#1f77b4",
            "s",
        ),
        (
            "with it: decided before the first swap",
            [r for r in with_.values() if decided_early(r.reason)],
            "#d62728",
            "^",
        ),
    ]
    for label, rs, colour, marker in groups:
        ax1.scatter([r.samples for r in rs], [hw(r) for r in rs], s=22, c=colour,
                    marker=marker, label=f"{label} ({len(rs)})", alpha=0.85)  # fmt: skip
    ax1.set_xscale("log")
    ax1.set_yscale("log")
    hw_ticks = [0.2, 0.3, 0.5, 1, 2, 3, 5, 10]
    plain_log(ax1, ax1.xaxis, [100, 200, 500, 1000, 2000, 5000, 10000, 20000])
    plain_log(ax1, ax1.yaxis, hw_ticks)
    ax1.set_xlabel("samples per host at the decision")
    ax1.set_ylabel("interval half-width (%)")
    ax1.set_title("Each comparison of the two sweeps")
    ax1.legend(fontsize=8, frameon=True, loc="upper right")
    ax1.grid(True, which="both", alpha=0.25)

    both = [k for k in without if k in with_]
    for early, colour, marker, label in (
        (True, "#d62728", "^", "decided before the first swap with it"),
        (False, "#1f77b4", "s", "decided after crossover with it"),
    ):
        keys = [k for k in both if decided_early(with_[k].reason) == early]
        ax2.scatter([hw(without[k]) for k in keys], [hw(with_[k]) for k in keys], s=22,
                    c=colour, marker=marker, label=f"{label} ({len(keys)})")  # fmt: skip
    lim = [0.05, 10.0]
    if both:
        vals = [hw(without[k]) for k in both] + [hw(with_[k]) for k in both]
        lim = [min(vals) / 1.5, max(vals) * 1.5]
    for f, style in ((1, "-"), (3, ":")):
        ax2.plot(lim, [v * f for v in lim], style, c="black", lw=0.8,
                 label="as wide" if f == 1 else "3x wider")  # fmt: skip
    ax2.set_xscale("log")
    ax2.set_yscale("log")
    plain_log(ax2, ax2.xaxis, hw_ticks)
    plain_log(ax2, ax2.yaxis, hw_ticks)
    ax2.set_xlim(lim)
    ax2.set_ylim(lim)
    ax2.set_xlabel("half-width without a calibration (%)")
    ax2.set_ylabel("half-width with it (%)")
    ax2.set_title(f"The same comparison in both sweeps ({len(both)})")
    ax2.legend(fontsize=8, frameon=True, loc="lower right")
    ax2.grid(True, which="both", alpha=0.25)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(out)
    plt.close(fig)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--experiment", type=Path, default=ROOT / "experiments/web-skylake.toml")
    ap.add_argument("--db", help="a results DB holding the two runs (with --runs)")
    ap.add_argument("--runs", type=int, nargs=2, metavar=("WITHOUT", "WITH"))
    ap.add_argument("-o", "--out", type=Path, help="write the figure (PNG)")
    args = ap.parse_args()

    from musku.abtest.calibration import CalibrationEffect, decided_early
    from musku.storage import open_store

    with tempfile.TemporaryDirectory() as tmp:
        url = args.db or f"sqlite:///{tmp}/results.db"
        if args.runs:
            if not args.db:
                ap.error("--runs needs --db")
            before, after = args.runs
        else:
            before, after = _run_both(args.experiment, url)
        with open_store(url) as store:
            without, with_ = _finished(store, before), _finished(store, after)
            names = {before: store.experiment(before).name, after: store.experiment(after).name}
    for label, run, res in (("without", before, without), ("with", after, with_)):
        e = CalibrationEffect.of(list(res.values()))
        hours = sum(r.host_time_s for r in res.values()) / 3600
        print(f"run {run} ({names[run]}), {label} a calibration: {e.total} comparisons, "
              f"{e.early} decided before the first swap, host time {hours:.2f} h")  # fmt: skip
        if e.text():
            print(f"  {e.text()}")
        elif e.crossover_halfwidth is not None:
            print(f"  median interval ±{e.crossover_halfwidth * 100:.2f} % from "
                  f"{e.crossover_samples:,.0f} samples")  # fmt: skip
    both = [k for k in without if k in with_]
    early = [k for k in both if decided_early(with_[k].reason)]
    for label, keys in (("decided early with it", early), ("every matched one", both)):
        if not keys:
            continue
        wider = statistics.median(
            (with_[k].ci_high - with_[k].ci_low) / (without[k].ci_high - without[k].ci_low)
            for k in keys
        )
        fewer = statistics.median(without[k].samples / max(1, with_[k].samples) for k in keys)
        print(f"matched comparisons, {label} ({len(keys)}): intervals {wider:.1f}x as wide, "
              f"{fewer:.1f}x fewer samples (medians of the per-comparison ratios)")  # fmt: skip
    if args.out:
        _figure(without, with_, args.out,
                f"{names[after]}: the same sweep without (run {before}) and with (run {after}) "
                "a pair calibration")  # fmt: skip
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
