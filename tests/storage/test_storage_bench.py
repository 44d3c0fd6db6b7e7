"""bench/db_ingest.py keeps working (tiny sizes: this checks it runs, not its speed)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench" / "db_ingest.py"


def test_ingest_bench_runs_on_sqlite() -> None:
    out = subprocess.run(
        [
            sys.executable,
            str(BENCH),
            "--rows",
            "2000",
            "--naive-rows",
            "200",
            "--repeat",
            "1",
            "--no-postgres",
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    (result,) = json.loads(out.stdout)
    assert result["backend"] == "sqlite" and result["bulk_rows"] == 2000
    assert result["bulk_best"] > 0 and result["naive_best"] > 0 and result["speedup"] > 0
