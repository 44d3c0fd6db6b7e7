#!/usr/bin/env python3
"""Sample ingest throughput of the results DB: ``Store.add_samples`` (executemany on SQLite,
binary COPY on PostgreSQL) against a naive one-INSERT-statement-per-row baseline measured in
the same run, on a SQLite file and on a real PostgreSQL server started for the run with
``scripts/pg-test-server`` (fsync off unless ``--fsync``). Goal: >= 100k samples/s.

    python bench/db_ingest.py [--rows 200000] [--naive-rows 20000] [--repeat 3] [--json]

Throughput counts the whole call: converting the row dicts and writing them in one
transaction. Best and median of ``--repeat`` batches are printed (the machine may be shared),
and samples per CPU-second of this process ("cpu"): on SQLite that is all the work, so it is
the rate one uncontended core sustains; on PostgreSQL the server's own work is not in it.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
PG_SCRIPT = ROOT / "scripts" / "pg-test-server"
EXPERIMENT = ROOT / "musku" / "testing" / "storage-experiment.toml"


def make_rows(n: int, seq0: int) -> list[dict[str, Any]]:
    """``n`` sample rows as the A/B tester produces them (two hosts per window)."""
    rows: list[dict[str, Any]] = []
    for i in range(n):
        window = seq0 + i // 2
        host = i % 2
        rows.append(
            {
                "seq": window,
                "t": 60.0 + window,
                "host": host,
                "role": "AB"[host],
                "period": window // 600,
                "warmup": window < 60,
                "valid": True,
                "metrics": {
                    "mips": 1.0e4 + (i % 997),
                    "qps": 2.0e4 + (i % 13),
                    "p99_ms": 9.0 + (i % 7) * 0.1,
                    "qos_violation_rate": 0.0,
                    "power_w": 180.0 + (i % 5),
                },
            }
        )
    return rows


def bench_backend(url: str, rows: int, naive_rows: int, repeat: int) -> dict[str, Any]:
    from sqlalchemy import insert

    from musku.experiment import load_experiment
    from musku.storage import convert, open_store
    from musku.storage.models import SampleRow

    experiment = load_experiment(EXPERIMENT)
    store = open_store(url)
    try:
        exp = store.create_experiment(experiment)
        base = experiment.production
        bulk: list[float] = []
        bulk_cpu: list[float] = []
        for _ in range(repeat):
            cmp_id = store.start_comparison(exp, "bench", base, base.with_("cdp", "6:5"))
            batch = make_rows(rows, seq0=0)
            t0, c0 = time.perf_counter(), time.process_time()
            stored = store.add_samples(cmp_id, batch)
            bulk.append(stored / (time.perf_counter() - t0))
            bulk_cpu.append(stored / max(time.process_time() - c0, 1e-9))
            del batch

        naive: list[float] = []
        stmt = insert(SampleRow)
        for _ in range(repeat):
            cmp_id = store.start_comparison(exp, "bench-naive", base, base.with_("cdp", "6:5"))
            batch = make_rows(naive_rows, seq0=0)
            t0 = time.perf_counter()
            tuples = convert.sample_tuples(cmp_id, "mips", batch, {})
            with store.engine.begin() as conn:
                for t in tuples:  # one INSERT statement per row, one transaction
                    conn.execute(stmt, dict(zip(convert.SAMPLE_COLUMNS, t, strict=True)))
            naive.append(naive_rows / (time.perf_counter() - t0))
        return {
            "backend": store.dialect,
            "bulk_rows": rows,
            "bulk_best": max(bulk),
            "bulk_median": statistics.median(bulk),
            "bulk_per_client_cpu_s": statistics.median(bulk_cpu),
            "naive_rows": naive_rows,
            "naive_best": max(naive),
            "naive_median": statistics.median(naive),
            "speedup": statistics.median(bulk) / statistics.median(naive),
        }
    finally:
        store.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--naive-rows", type=int, default=20_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--fsync", action="store_true", help="durable PostgreSQL commits")
    parser.add_argument("--no-postgres", action="store_true")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()

    results = []
    with tempfile.TemporaryDirectory(prefix="musku-bench-") as tmp:
        results.append(
            bench_backend(f"sqlite:///{tmp}/bench.db", args.rows, args.naive_rows, args.repeat)
        )
    if not args.no_postgres:
        pg_dir = tempfile.mkdtemp(prefix="musku-bench-pg-")
        os.chmod(pg_dir, 0o755)
        env = dict(os.environ, MUSKU_PG_FSYNC="on" if args.fsync else "off")
        try:
            proc = subprocess.run(
                [str(PG_SCRIPT), "start", pg_dir], capture_output=True, text=True, env=env
            )
            if proc.returncode != 0:
                print(f"PostgreSQL not benchmarked: {proc.stderr.strip()}", file=sys.stderr)
            else:
                url = proc.stdout.strip().splitlines()[-1]
                results.append(bench_backend(url, args.rows, args.naive_rows, args.repeat))
        finally:
            subprocess.run([str(PG_SCRIPT), "stop", pg_dir], capture_output=True, env=env)

    if args.json:
        print(json.dumps(results, indent=2))
        return 0
    print(f"samples ingest, {args.rows} rows per bulk batch, best/median of {args.repeat}")
    for r in results:
        ok = "ok" if r["bulk_median"] >= 100_000 else "BELOW 100k/s GOAL"
        print(
            f"{r['backend']:>10}: bulk {r['bulk_best']:>10,.0f}/s best "
            f"{r['bulk_median']:>10,.0f}/s median {r['bulk_per_client_cpu_s']:>10,.0f}/cpu-s | "
            f"naive one-row INSERT "
            f"{r['naive_median']:>8,.0f}/s | x{r['speedup']:.1f} | {ok}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
