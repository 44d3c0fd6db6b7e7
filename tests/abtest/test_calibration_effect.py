"""Issue 32 item 6: a run that uses a pair calibration says so once, and says what it did to
the test: how many comparisons it decided before the first swap, with how much wider intervals
from how many fewer samples than the ones decided after crossover (`musku sweep`'s summary,
`musku results NAME`, their --json)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from musku.abtest.calibration import (
    CalibrationEffect,
    PairCalibration,
    PairMemory,
    announce,
    decided_early,
)
from musku.domain import ComparisonResult, Configuration, Decision
from tests.fixtures.toy import EXPERIMENT, MODEL
from tests.timing import scaled

ROOT = Path(__file__).resolve().parents[2]
EARLY = "no crossover: estimate includes the host bias, assumed within ±0.60 %"


def _result(half: float, samples: int, reason: str = "interval excludes 0") -> ComparisonResult:
    return ComparisonResult(
        baseline=Configuration.of(thp="madvise"),
        candidate=Configuration.of(thp="always"),
        decision=Decision.BETTER,
        estimate=0.03,
        ci_low=0.03 - half,
        ci_high=0.03 + half,
        samples=samples,
        host_time_s=600.0,
        reason=reason,
    )


def _cal(**kw: object) -> PairCalibration:
    fields: dict[str, object] = dict(
        pair="sim-a+sim-b", hardware="hw", metric="mips", bias=0.0035, ci_low=0.001,
        ci_high=0.006, samples=8831, taken_at=datetime(2026, 11, 28, 5, 40, tzinfo=UTC), id=3,
    )  # fmt: skip
    fields.update(kw)
    return PairCalibration(**fields)  # type: ignore[arg-type]


def test_the_effect_compares_early_and_crossover_decisions() -> None:
    results = [
        _result(0.024, 300, f"interval ...; {EARLY}"),
        _result(0.020, 400, f"...; {EARLY}"),
        _result(0.026, 200, f"...; {EARLY}"),
        _result(0.008, 1000),
        _result(0.010, 800),
        _result(float("inf"), 5, "stopped"),  # no interval: left out
    ]
    e = CalibrationEffect.of(results)
    assert (e.early, e.total) == (3, 5)
    assert e.early_halfwidth == pytest.approx(0.024) and e.crossover_halfwidth == pytest.approx(
        0.009
    )
    assert (e.early_samples, e.crossover_samples) == (300, 900)
    assert e.text() == (
        "3 of 5 comparisons decided before the first swap (the calibration's early path): "
        "median interval ±2.40 % from 300 samples, against ±0.90 % from 900 for the ones "
        "decided after crossover: 2.7x wider, 3.0x fewer samples"
    )
    assert e.to_dict()["decided_early"] == 3
    # without an early decision there is nothing to say
    assert CalibrationEffect.of(results[3:]).text() == ""
    assert decided_early("one arm order only: estimate includes the arm bias")  # switchback


def test_announce_says_which_calibration_and_whether_it_is_used() -> None:
    cal = _cal()
    line = announce(cal, PairMemory(calibration=cal, hardware="hw", now=cal.taken_at))
    assert line.startswith(
        "using calibration 3 of pair sim-a+sim-b (bias +0.35 % [+0.10, +0.60] %, bound ±0.60 %, "
        "8,831 samples, measured 2026-11-28 05:40 UTC): comparisons may decide before the "
        "first swap, their intervals widened by its bound"
    )
    old = PairMemory(calibration=cal, hardware="hw", now=cal.taken_at + timedelta(days=8))
    assert announce(cal, old).startswith("not using calibration 3 of pair sim-a+sim-b")
    assert "h old" in announce(cal, old) and "early decisions off" in announce(cal, old)
    other = PairMemory(calibration=cal, hardware="other", now=cal.taken_at)
    assert "taken on other hardware" in announce(cal, other)


def _musku(*args: str, db: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "MUSKU_DEBUG"}
    env.update(MUSKU_DB=db, COLUMNS="200")
    return subprocess.run([sys.executable, "-m", "musku", *args], capture_output=True,
                          text=True, env=env, cwd=ROOT, timeout=scaled(300))  # fmt: skip


@pytest.mark.slow
def test_a_sweep_says_it_uses_the_calibration_once_and_what_it_did(tmp_path: Path) -> None:
    (tmp_path / "toy-model.toml").write_text(MODEL)
    exp = tmp_path / "toy.toml"
    exp.write_text(EXPERIMENT.format(name="toy", mode="independent"))
    db = f"sqlite:///{tmp_path / 'r.db'}"
    before = _musku("sweep", str(exp), db=db, cwd=tmp_path)
    assert before.returncode == 0, before.stderr
    assert "calibration" not in before.stdout + before.stderr  # nothing to say without one
    cal = _musku("pair", "calibrate", str(exp), "--precision", "0.005", db=db, cwd=tmp_path)
    assert cal.returncode == 0, cal.stderr
    after = _musku("sweep", str(exp), db=db, cwd=tmp_path)
    assert after.returncode == 0, after.stderr
    said = [ln for ln in after.stderr.splitlines() if "using calibration 1 of pair" in ln]
    assert len(said) == 1, after.stderr  # once, not per comparison
    effect = [ln for ln in after.stdout.splitlines() if "decided before the first swap" in ln]
    assert len(effect) == 1 and "x wider" in effect[0], after.stdout
    shown = _musku("results", "toy", db=db, cwd=tmp_path)
    assert shown.returncode == 0, shown.stderr
    assert "used calibration 1 of pair sim-a+sim-b (bias " in shown.stdout
    assert effect[0] in shown.stdout  # the same figures, from the stored comparisons
    report = _musku("report", "toy", "-o", str(tmp_path / "r.html"), db=db, cwd=tmp_path)
    assert report.returncode == 0, report.stderr
    html = (tmp_path / "r.html").read_text()
    assert "used calibration 1 of pair sim-a+sim-b (bias " in html
    assert effect[0].replace("'", "&#x27;") in html
    data = json.loads(_musku("results", "toy", "--json", db=db, cwd=tmp_path).stdout)
    assert data["calibration"]["decided_early"] >= 1
    assert [c["id"] for c in data["calibration"]["calibrations"]] == [1]
    first_id = re.search(r"experiment id (\d+)", before.stdout)
    assert first_id is not None, before.stdout
    first = json.loads(_musku("results", first_id[1], "--json", db=db, cwd=tmp_path).stdout)
    assert first["calibration"]["decided_early"] == 0 and first["calibration"]["calibrations"] == []
