"""Issue 32: the same experiment file and seed give the same comparisons on every run in one
results DB (a run on simulated hosts used to learn warm-up transients from the DB's earlier
runs, so each later run measured other windows), and the report's rerun line reproduces a run,
with `--seed N` when the run was given one."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

from musku.experiment import load_experiment
from musku.storage import open_store
from musku.sweep import run_sweep
from tests.cli.test_exit_codes import musku


@pytest.fixture(scope="module")
def reruns(toy_db: tuple[str, Path], tmp_path_factory: pytest.TempPathFactory) -> str:
    """The toy DB (one sweep, seed 7 from the file) copied, then the same file again, and once
    more with seed 9."""
    url, exp = toy_db
    d = tmp_path_factory.mktemp("rerun")
    shutil.copy(url.removeprefix("sqlite:///"), d / "results.db")
    new = f"sqlite:///{d}/results.db"
    with open_store(new) as store:
        run_sweep(load_experiment(exp), store=store)
        run_sweep(load_experiment(exp), store=store, seed=9)
    return new


def _estimates(url: str, run: int) -> list[tuple[str, float]]:
    with open_store(url) as store:
        return [
            (c.purpose, c.result.estimate) for c in store.comparisons(run) if c.result is not None
        ]


def test_same_file_and_seed_give_the_same_comparisons(reruns: str) -> None:
    with open_store(reruns) as store:
        first, second, seeded = (i for i, _, _ in store.runs_named("toy"))
    a, b = _estimates(reruns, first), _estimates(reruns, second)
    assert a and a == b  # bit for bit, run after run in one DB
    assert _estimates(reruns, seeded) != a  # another seed: other windows


def test_rerun_line_gives_the_runs_seed(reruns: str, tmp_path: Path) -> None:
    with open_store(reruns) as store:
        first, _, seeded = (i for i, _, _ in store.runs_named("toy"))
    for run, flag in ((first, ""), (seeded, " --seed 9")):
        out = tmp_path / f"{run}.html"
        proc = musku("report", str(run), "--db", reruns, "-o", str(out))
        assert proc.returncode == 0, proc.stderr
        m = re.search(r"Rerun with <code>musku sweep (\S+?)( --seed \d+)?</code> \(seed (\d+)",
                      out.read_text(encoding="utf-8"))  # fmt: skip
        assert m is not None
        assert (m.group(2) or "") == flag and m.group(3) == ("9" if flag else "7")
