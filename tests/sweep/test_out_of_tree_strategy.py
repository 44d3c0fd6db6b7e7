"""A sweep strategy from outside the musku package, end to end: ``tests.sweep.toystrategy``
is accepted by ``musku check``, planned by ``musku sweep --dry-run`` and runs ``musku sweep``
on the simulator into a results DB, with zero edits to musku. A strategy that cannot be
loaded is one line naming it, exit 3, before anything runs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from musku.experiment import load_experiment
from musku.registry import STRATEGIES
from musku.storage import open_store
from tests.sweep.toystrategy import TARGET, FirstBetter

ROOT = Path(__file__).resolve().parents[2]
EXP = ROOT / "experiments" / "web-skylake.toml"


def write(tmp: Path, mode: str) -> Path:
    text = EXP.read_text()
    assert 'mode = "independent"' in text
    text = text.replace('mode = "independent"', f'mode = "{mode}"')
    text = text.replace('model = "sim/', f'model = "{ROOT}/experiments/sim/')
    path = tmp / "exp.toml"
    path.write_text(text)
    return path


def musku(*args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    env.pop("MUSKU_DEBUG", None)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    return subprocess.run(
        [sys.executable, "-m", "musku", *args],
        capture_output=True,
        text=True,
        timeout=900,
        env=env,
        cwd=ROOT,
    )


def test_loads_and_is_looked_up_by_its_name(tmp_path: Path) -> None:
    exp = load_experiment(write(tmp_path, TARGET))
    assert exp.mode == TARGET and exp.mode.value == TARGET
    assert isinstance(STRATEGIES.get(TARGET), FirstBetter)
    assert STRATEGIES.get("first-better") is STRATEGIES.get(TARGET)
    STRATEGIES.unregister("first-better")


def test_check_dry_run_and_sweep_end_to_end(tmp_path: Path) -> None:
    path = write(tmp_path, TARGET)
    db = f"sqlite:///{tmp_path / 'r.db'}"
    proc = musku("check", str(path))
    assert proc.returncode == 0, proc.stderr
    proc = musku("sweep", str(path), "--dry-run", "--json", "--db", db)
    assert proc.returncode == 0, proc.stderr
    plan = json.loads(proc.stdout)["plan"]
    assert plan["mode"] == TARGET and plan["note"].startswith("each knob's settings in order")
    proc = musku("sweep", str(path), "--seed", "1", "--json", "--quiet", "--db", db)
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert report["mode"] == TARGET
    store = open_store(db, create=False)
    try:
        rec = store.find_experiment(report["experiment"])
        assert rec is not None and rec.mode == TARGET
        assert store.comparisons(rec.id)
    finally:
        store.close()


@pytest.mark.parametrize(
    ("mode", "needle"),
    [
        ("tests.sweep.toystrategy:Unnamed", "has no name"),
        ("tests.sweep.toystrategy:Nope", "has no 'Nope'"),
        ("warp", "mode 'warp' is not one of independent, exhaustive, search, multiarm"),
    ],
)
def test_bad_strategies_are_one_line_exit_3(tmp_path: Path, mode: str, needle: str) -> None:
    path = write(tmp_path, mode)
    db = tmp_path / "r.db"
    proc = musku("sweep", str(path), "--db", f"sqlite:///{db}")
    assert proc.returncode == 3, proc.stderr
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert needle in lines[0] and str(path) in lines[0], lines[0]
    assert not db.exists()
