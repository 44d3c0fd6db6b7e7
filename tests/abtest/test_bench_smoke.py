"""bench/abtest_stats.py --quick: the robustness table's smoke test (a few runs of three rows)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_bench_quick_mode_prints_the_table(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    spec = importlib.util.spec_from_file_location("abtest_stats", ROOT / "bench/abtest_stats.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules["abtest_stats"] = mod
    spec.loader.exec_module(mod)
    saved = tmp_path / "runs.jsonl"
    mod.main(["--quick", "--jobs", "1", "--only", "shipped model (web", "--save", str(saved)])
    out = capsys.readouterr().out
    row = next(line for line in out.splitlines() if line.startswith("| shipped model"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[1] == "6" and cells[3] == "3"  # null runs, +1 % runs
    assert cells[4].split(" [")[0].endswith("%") and cells[5].split(" (")[0].endswith("%")
    # the saved runs give the same row back, and a second --save run has nothing left to do
    assert len(saved.read_text().splitlines()) == 9
    mod.main(["--load", str(saved)])
    again = capsys.readouterr().out
    assert row in again.splitlines()
    mod.main(["--quick", "--jobs", "1", "--only", "shipped model (web", "--save", str(saved)])
    assert "0 comparisons" in capsys.readouterr().out
    assert len(saved.read_text().splitlines()) == 9
    # --skip leaves out what --only let in: nothing to run, nothing written
    fresh = tmp_path / "none.jsonl"
    mod.main(
        ["--quick", "--jobs", "1", "--only", "shipped", "--skip", "shipped", "--save", str(fresh)]
    )
    assert "0 comparisons" in capsys.readouterr().out and not fresh.exists()
    lo, hi = mod.clopper_pearson(0, 6)
    assert lo == 0.0 and 0.4 < hi < 0.5
