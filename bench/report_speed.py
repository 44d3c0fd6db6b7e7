#!/usr/bin/env python3
"""`musku report` and `musku results --format parquet` at scale.

1. The HTML report of a full Web/Skylake18 sweep on simulated hosts (37 comparisons, every
   sample plotted): wall and CPU time of `musku report` as a user runs it (a fresh process,
   imports included), against the goal of < 10 s, and the same figures for writing the PNG
   figures alone.
2. Parquet export of 1,000,000 samples: peak RSS of `musku results ID --format parquet
   --table samples` in a fresh process, against the same export of 250,000 samples and
   against a process that only starts musku and opens the DB (all measured in this run): the
   export's memory does not grow with the number of samples.

    python bench/report_speed.py [--samples 1000000] [--keep DIR]
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

PER_COMPARISON = 50_000  # samples (rows) per comparison in the export test
STARTUP = (
    "from musku.storage import open_store; import musku.report.export, musku.cli; "
    "import pyarrow.parquet; s = open_store({url!r}); s.close()"
)


def child(cmd: list[str]) -> tuple[float, float, int]:
    """(wall s, CPU s, peak RSS bytes) of one child, from its own rusage (os.wait4)."""
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    t0 = time.perf_counter()
    pid = os.posix_spawn(
        cmd[0],
        cmd,
        env,
        file_actions=[(os.POSIX_SPAWN_OPEN, 1, "/dev/null", os.O_WRONLY, 0)],
    )
    _, status, ru = os.wait4(pid, 0)
    wall = time.perf_counter() - t0
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"{' '.join(cmd)} failed (exit {os.waitstatus_to_exitcode(status)})")
    return wall, ru.ru_utime + ru.ru_stime, ru.ru_maxrss * 1024


def fill(url: str, name: str, total: int) -> None:
    """An experiment holding ``total`` samples, bulk-inserted through the Store."""
    import numpy as np

    from musku.domain import ComparisonResult, Decision, ExperimentStatus
    from musku.experiment import load_experiment
    from musku.storage import open_store

    exp = load_experiment(ROOT / "experiments" / "web-skylake.toml")
    exp = dataclasses.replace(exp, name=name)
    rng = np.random.default_rng(7)
    with open_store(url) as store:
        exp_id = store.create_experiment(exp)
        store.set_status(exp_id, ExperimentStatus.RUNNING)
        store.add_hosts(exp_id, {"hosts": ["a", "b"]})
        left, k = total, 0
        while left > 0:
            n = min(PER_COMPARISON, left)
            cand = exp.production.with_("thp", "always")
            cmp_id = store.start_comparison(exp_id, "knob:thp", exp.production, cand)
            w = n // 2
            mips = 1000.0 + rng.normal(0, 10, (2, w))
            rows = [
                {
                    "seq": i,
                    "t": float(i),
                    "host": h,
                    "role": "AB"[h],
                    "period": i // 500,
                    "warmup": i < 30,
                    "valid": True,
                    "metrics": {"mips": float(mips[h, i]), "p99_ms": 9.5, "power_w": 150.0},
                }
                for i in range(w)
                for h in (0, 1)
            ]
            store.add_samples(cmp_id, rows)
            store.finish_comparison(
                cmp_id,
                ComparisonResult(
                    exp.production, cand, Decision.NO_DIFFERENCE, 0.0, -0.001, 0.001, w, w, "bench"
                ),
            )
            left -= len(rows)
            k += 1
        store.set_status(exp_id, ExperimentStatus.DONE)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--samples", type=int, default=1_000_000)
    ap.add_argument("--keep", help="keep the databases and outputs in this directory")
    args = ap.parse_args()

    from musku.experiment import load_experiment
    from musku.storage import open_store
    from musku.sweep import run_sweep

    tmp = Path(args.keep or tempfile.mkdtemp(prefix="musku-report-bench-"))
    tmp.mkdir(parents=True, exist_ok=True)
    py = sys.executable
    print(f"machine: {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}")

    # 1 -- the report of a 37-comparison sweep
    url = f"sqlite:///{tmp}/sweep.db"
    if not (tmp / "sweep.db").exists():
        with open_store(url) as store:
            rep = run_sweep(load_experiment(ROOT / "experiments" / "web-skylake.toml"), store=store)
        print(f"sweep: {rep.comparisons} comparisons, host time {rep.host_time_s / 3600:.2f} h")
    with open_store(url) as store:
        rec = store.find_experiment("web-skylake")
        assert rec is not None
        comps = store.comparisons(rec.id)
    n_samples = sum(c.sample_count for c in comps)
    print(f"report input: {len(comps)} comparisons, {n_samples:,} samples")
    base = child([py, "-c", STARTUP.format(url=url)])
    rep_t = child(
        [py, "-m", "musku", "report", "web-skylake", "--db", url, "-o", str(tmp / "r.html")]
    )
    png_t = child(
        [
            py,
            "-m",
            "musku",
            "report",
            "web-skylake",
            "--db",
            url,
            "--format",
            "png",
            "-o",
            str(tmp / "png"),
        ]
    )
    size = (tmp / "r.html").stat().st_size
    print(f"musku start-up only      wall {base[0]:5.1f} s  CPU {base[1]:5.1f} s")
    verdict = "met" if rep_t[0] < 10 else "NOT met"
    print(
        f"musku report (HTML)      wall {rep_t[0]:5.1f} s  CPU {rep_t[1]:5.1f} s   goal < 10 s: "
        f"{verdict} ({size / 1e6:.1f} MB)"
    )
    print(f"musku report --format png wall {png_t[0]:5.1f} s  CPU {png_t[1]:5.1f} s")

    # 2 -- Parquet export in bounded memory
    small = max(args.samples // 4, PER_COMPARISON)
    eurl = f"sqlite:///{tmp}/export.db"
    if not (tmp / "export.db").exists():
        t0 = time.perf_counter()
        fill(eurl, "big", args.samples)
        fill(eurl, "small", small)
        print(f"filled {args.samples + small:,} samples in {time.perf_counter() - t0:.1f} s")
    start = child([py, "-c", STARTUP.format(url=eurl)])
    rows = {}
    for name, n in (("small", small), ("big", args.samples)):
        out = tmp / f"{name}.parquet"
        rows[name] = (
            n,
            child(
                [
                    py,
                    "-m",
                    "musku",
                    "results",
                    name,
                    "--db",
                    eurl,
                    "--format",
                    "parquet",
                    "--table",
                    "samples",
                    "-o",
                    str(out),
                ]
            ),
            out.stat().st_size,
        )
    import pyarrow.parquet as pq

    for name, (n, (wall, cpu, rss), size) in rows.items():
        meta = pq.ParquetFile(tmp / f"{name}.parquet").metadata
        assert meta.num_rows == n, (name, meta.num_rows, n)
        print(
            f"parquet {n:>9,} samples  wall {wall:5.1f} s  CPU {cpu:5.1f} s  peak RSS "
            f"{rss / 2**20:6.1f} MiB  ({meta.num_row_groups} row groups, {size / 2**20:.1f} MiB file)"
        )
    s_rss, b_rss = rows["small"][1][2], rows["big"][1][2]
    print(
        f"start-up + open DB only                                peak RSS {start[2] / 2**20:6.1f} MiB"
    )
    print(
        f"peak RSS, {args.samples:,} against {small:,} samples: {b_rss / s_rss:.2f}x "
        f"(bounded when ~1); above start-up: {(b_rss - start[2]) / 2**20:.1f} MiB"
    )


if __name__ == "__main__":
    main()
