#!/usr/bin/env python3
"""HDSearch's mid-tier candidate lookup (LSH with multi-probe, and the candidates' grouping by
shard) against brute force over the same points, on one core of this machine.

Per data set and LSH setting it prints recall@10 of the candidate sets (exact distances over the
candidates, as the leaves compute them), the mean candidates, the lookup's time per query warm
(queries back to back) and cold (64 MB streamed through the cache before each query, as a
mid-tier sees between requests at low load), and brute force's time per query: the baseline,
measured in the same run. Drives the C++ ``hdsearch_lsh_bench`` (release build).

    python bench/hdsearch_lsh.py [--sets fmnist64,fmnist60k,synthetic] [--rounds 3] [--json]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from typing import Any

from musku.errors import InputError, MuskuError
from musku.services import runtime
from musku.services.datasets import hdsearch_data

SETS: dict[str, dict[str, Any]] = {
    # the services' default data set (musku services run|bench hdsearch)
    "fmnist64": {"source": "fashion-mnist", "n": 20000, "pca": 64},
    "fmnist60k": {"source": "fashion-mnist", "n": 60000, "pca": 64},
    "synthetic": {"source": "synthetic", "n": 100_000, "dim": 256},
}
SETTINGS = [  # (tables, hashes, probes)
    (10, 10, 16),  # the mid-tier's defaults
    (10, 12, 32),  # the defaults until session 6
    (10, 12, 16),
]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--sets", default=",".join(SETS), help="comma-separated: " + ", ".join(SETS))
    ap.add_argument("--rounds", type=int, default=3, help="passes over the queries per timing")
    ap.add_argument("--cpu", type=int, default=0, help="CPU to pin the benchmark to")
    ap.add_argument("--json", action="store_true", help="print the raw figures as JSON")
    args = ap.parse_args()
    try:
        names = [s for s in args.sets.split(",") if s]
        unknown = [s for s in names if s not in SETS]
        if unknown:
            raise InputError(f"unknown data set(s) {', '.join(unknown)}; one of {', '.join(SETS)}")
        exe = runtime.binary("hdsearch_lsh_bench")
        rows = []
        for name in names:
            data, queries = hdsearch_data(runtime.default_data_dir(), **SETS[name])
            for tables, hashes, probes in SETTINGS:
                argv = ["taskset", "-c", str(args.cpu), str(exe), "--data", str(data),
                        "--queries", str(queries), "--tables", str(tables), "--hashes",
                        str(hashes), "--probes", str(probes), "--rounds", str(args.rounds)]  # fmt: skip
                out = subprocess.run(argv, capture_output=True, text=True, check=False)
                if out.returncode != 0:
                    raise MuskuError(f"hdsearch_lsh_bench failed: {out.stderr.strip()}")
                rows.append({"set": name, **json.loads(out.stdout)})
    except MuskuError as e:
        print(f"error: {e}", file=sys.stderr)
        return int(e.status)
    if args.json:
        print(json.dumps(rows, indent=1))
        return 0
    print(f"HDSearch candidate lookup vs brute force, one core (CPU {args.cpu}), k = 10")
    print(f"{'data':<10} {'points':>7} {'dim':>4} {'L/K/T':>8} {'recall':>7} {'cands':>11} "
          f"{'warm us':>8} {'cold us':>8} {'brute us':>9} {'brute/warm':>10} {'brute/cold':>10}")  # fmt: skip
    for r in rows:
        frac = 100.0 * r["mean_candidates"] / r["points"]
        print(f"{r['set']:<10} {r['points']:>7} {r['dim']:>4} "
              f"{str(r['tables']) + '/' + str(r['hashes']) + '/' + str(r['probes']):>8} "
              f"{r['recall']:>7.3f} {r['mean_candidates']:>6.0f} {frac:>3.1f}% "
              f"{r['warm_mean_us']:>8.1f} {r['cold_mean_us']:>8.1f} {r['brute_force_us']:>9.1f} "
              f"{r['brute_force_us'] / r['warm_mean_us']:>9.1f}x "
              f"{r['brute_force_us'] / r['cold_mean_us']:>9.1f}x")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
