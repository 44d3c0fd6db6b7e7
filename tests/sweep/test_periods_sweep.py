"""``[statistics] period`` in a sweep: the summary says which periods were used and why; a
bad value is one line and exit 3 before anything runs."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]


def musku(*args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    env.pop("MUSKU_DEBUG", None)
    env["PYTHONPATH"] = str(ROOT)
    return subprocess.run(
        [sys.executable, "-m", "musku", *args],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
        cwd=ROOT,
    )


def with_period(path: Path, value: str) -> Path:
    text = path.read_text().replace("seed = 7\n", f"seed = 7\nperiod = {value}\n")
    assert f"period = {value}" in text
    path.write_text(text)
    return path


@pytest.mark.parametrize(
    ("value", "needle"),
    [
        ('"often"', "[statistics] period must be 'swap' (3x the swap cost) or 'auto'"),
        ('"AUTO"', "not 'AUTO'"),
        ("300", "period"),
    ],
)
@pytest.mark.parametrize("command", ["check", "sweep"])
def test_a_bad_period_is_one_line_and_exit_3(
    toy: Any, tmp_path: Path, value: str, needle: str, command: str
) -> None:
    path = with_period(toy("independent"), value)
    db = tmp_path / "r.db"
    args = [command, str(path)] + (["--db", f"sqlite:///{db}"] if command == "sweep" else [])
    proc = musku(*args)
    assert proc.returncode == 3, proc.stderr
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert lines[0].startswith("musku: error: ") and needle in lines[0]
    assert str(path) in lines[0]
    assert not db.exists()


def test_the_sweep_summary_prints_the_chosen_period_and_why(toy: Any, tmp_path: Path) -> None:
    from musku.experiment import load_experiment
    from musku.sweep import run_sweep

    path = with_period(toy("independent"), '"auto"')
    assert load_experiment(path).stats.period == "auto"
    proc = musku("sweep", str(path), "--db", f"sqlite:///{tmp_path}/r.db")
    assert proc.returncode == 0, proc.stderr
    out = " ".join(proc.stdout.split())  # the summary is wrapped to the terminal
    assert "crossover periods (auto): median" in out, proc.stdout
    assert "chosen to minimise the expected host time to a decision" in out
    assert "(auto): expected" in out and "at the 3x-swap" in out
    # the default rule says so too
    rep = run_sweep(load_experiment(toy("independent", name="plain")))
    assert "crossover periods (swap)" in rep.periods and "3x the swap cost" in rep.periods
    assert rep.to_dict()["periods"] == rep.periods


def test_the_schedule_expects_the_auto_period(toy: Any) -> None:
    """The dry-run's and the scheduler's cost model uses the length the driver's search
    gives for the model's noise and the swap, not 3x the swap, under ``auto``."""
    from musku.abtest.rules import WANDER_TAU_S
    from musku.abtest.structure import derive
    from musku.experiment import load_experiment
    from musku.sweep.schedule import SWAP_OVERHEAD, CostModel, auto_period_s

    swap_m = CostModel.of(load_experiment(toy("independent", name="plain")))
    assert swap_m.auto_period is None
    exp = load_experiment(with_period(toy("independent"), '"auto"'))
    m = CostModel.of(exp)
    assert m.auto_period is not None and m.auto_period[0] == exp.stats
    swap = m.apply_s + m.warmup_s
    period = auto_period_s(exp.stats, m.auto_period[1], swap)
    s = derive(exp.stats)
    assert 4 <= period / m.interval_s <= s.period_max
    # never longer than the fixed rule's or 5 % of the wander prior's tau (the longer)
    limit = max(s.period_length(1, swap, SWAP_OVERHEAD) * m.interval_s, 0.05 * WANDER_TAU_S)
    assert period <= limit + m.interval_s
    # the comparison's expected time follows the period: a cheaper swap, a shorter one; a
    # dear one (half an hour: 1.5 h periods under the fixed rule), far shorter than 3x
    assert auto_period_s(exp.stats, m.auto_period[1], swap / 10) < period
    dear = auto_period_s(exp.stats, m.auto_period[1], 1800.0)
    assert period < dear < s.period_length(1, 1800.0, SWAP_OVERHEAD) * m.interval_s
