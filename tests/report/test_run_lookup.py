"""Which run a name means (musku.storage.lookup): `musku report NAME`, `musku results NAME` and
the exports take the latest finished sweep of the name, `--kind` another kind, an id one run;
each says which run it used. Reproduces issue 32: after a sweep and then an abtest of one file,
`musku report NAME` reported the abtest."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from musku.domain import RUN_KINDS, Configuration, ExperimentStatus, run_kind
from musku.experiment import load_experiment
from musku.registry import STRATEGIES
from musku.storage import open_store
from musku.storage.lookup import choose
from musku.sweep import run_abtest
from tests.cli.test_exit_codes import musku, one_error_line


@pytest.fixture(scope="module")
def sweep_then_abtest(toy_db: tuple[str, Path], tmp_path_factory: pytest.TempPathFactory) -> str:
    """The toy DB (one finished sweep) copied, then an abtest of the same file: the README's
    order."""
    url, exp = toy_db
    d = tmp_path_factory.mktemp("lookup")
    shutil.copy(url.removeprefix("sqlite:///"), d / "results.db")
    new = f"sqlite:///{d}/results.db"
    experiment = load_experiment(exp)
    base = experiment.baseline_config
    cand = Configuration.of({**base.as_dict(), "thp": "always"})
    with open_store(new) as store:
        run_abtest(experiment, base, cand, store=store)
    return new


def _runs(url: str) -> dict[str, int]:
    with open_store(url) as store:
        return {run_kind(m): i for i, m, _ in store.runs_named("toy")}


def test_report_of_a_name_takes_its_latest_finished_sweep(
    sweep_then_abtest: str, tmp_path: Path
) -> None:
    url = sweep_then_abtest
    ids = _runs(url)
    assert ids["abtest"] > ids["sweep"]  # the abtest is the latest run of the name
    out = tmp_path / "r.html"
    proc = musku("report", "toy", "--db", url, "-o", str(out))
    assert proc.returncode == 0, proc.stderr
    assert f"using sweep run {ids['sweep']} of 'toy' (done)" in proc.stderr
    text = out.read_text(encoding="utf-8")
    assert "not tested" not in text  # every knob of the sweep has its figure
    proc = musku("report", "toy", "--kind", "abtest", "--db", url, "-o", str(out))
    assert proc.returncode == 0, proc.stderr
    assert f"using abtest run {ids['abtest']} of 'toy'" in proc.stderr


def test_results_and_export_say_which_run(sweep_then_abtest: str, tmp_path: Path) -> None:
    url = sweep_then_abtest
    ids = _runs(url)
    proc = musku("results", "toy", "--json", "--db", url)
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert data["run"]["id"] == ids["sweep"] and data["run"]["kind"] == "sweep"
    assert data["experiment"]["kind"] == "sweep"
    assert len(data["comparisons"]) > 1
    proc = musku("results", "toy", "--kind", "abtest", "--json", "--db", url)
    assert json.loads(proc.stdout)["run"]["id"] == ids["abtest"]
    out = tmp_path / "c.csv"
    proc = musku("results", "toy", "--format", "csv", "-o", str(out), "--db", url)
    assert proc.returncode == 0, proc.stderr
    assert f"using sweep run {ids['sweep']}" in proc.stderr
    proc = musku("results", str(ids["abtest"]), "--json", "--db", url)  # an id: that run
    assert json.loads(proc.stdout)["run"]["kind"] == "abtest"


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["report", "toy", "--kind", "deploy"], "no deploy named 'toy'; its runs: sweep"),
        (["report", "toy", "--kind", "nope"], "--kind 'nope': choose one of sweep, abtest"),
        (["results", "nosuch"], "no run named 'nosuch'"),
        (["results", "toy", "--kind", "watch", "--format", "csv"], "no watch named 'toy'"),
    ],
)
def test_unknown_runs_are_one_line_exit_3(
    sweep_then_abtest: str, args: list[str], needle: str, tmp_path: Path
) -> None:
    root = str(Path(__file__).resolve().parents[2])
    proc = musku(*args, "--db", sweep_then_abtest, cwd=tmp_path, env={"PYTHONPATH": root})
    assert proc.returncode == 3, proc.stderr
    assert needle in one_error_line(proc)
    assert not list(tmp_path.iterdir())  # nothing written


def test_a_number_that_is_an_id_and_a_name_is_ambiguous(
    toy_db: tuple[str, Path], tmp_path: Path
) -> None:
    _, exp = toy_db
    url = f"sqlite:///{tmp_path}/r.db"
    text = exp.read_text().replace('name = "toy"', 'name = "1"', 1)
    (tmp_path / "one.toml").write_text(text)
    shutil.copy(exp.parent / "toy-model.toml", tmp_path / "toy-model.toml")
    with open_store(url) as store:
        store.create_experiment(load_experiment(tmp_path / "one.toml"))  # id 1
        store.create_experiment(load_experiment(tmp_path / "one.toml"))  # id 2, named "1"
    proc = musku("results", "1", "--db", url)
    assert proc.returncode == 3
    assert "'1' is both run 1's id and the name of run(s) 1, 2" in one_error_line(proc)


MODES = list(STRATEGIES.names()) + [k for k in RUN_KINDS if k != "sweep"]


@settings(deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(
        st.tuples(st.sampled_from(MODES), st.sampled_from(list(ExperimentStatus))), max_size=12
    ),
    st.sampled_from(RUN_KINDS),
)
def test_choose_takes_the_latest_done_run_of_the_kind(
    runs: list[tuple[str, ExperimentStatus]], kind: str
) -> None:
    rows = [(i + 1, m, s) for i, (m, s) in enumerate(runs)]
    got = choose(rows, kind)
    mine = [(i, s) for i, m, s in rows if run_kind(m) == kind]
    done = [r for r in mine if r[1] is ExperimentStatus.DONE]
    if done:
        assert got == done[-1]
    elif got is not None:
        assert got in mine and got[1] is not ExperimentStatus.FAILED
        assert all(s is ExperimentStatus.FAILED for i, s in mine if i > got[0])
    else:
        assert all(s is ExperimentStatus.FAILED for _, s in mine)


def test_resume_of_a_finished_sweep_is_refused(
    sweep_then_abtest: str, toy_db: tuple[str, Path]
) -> None:
    """`--resume` continues the latest sweep of the name (not its later abtest); a finished one
    is refused with the command that starts a new run, and nothing is written."""
    url = sweep_then_abtest
    _, exp = toy_db
    before = _runs(url)
    proc = musku("sweep", str(exp), "--resume", "--db", url, "-q")
    assert proc.returncode == 3, proc.stderr
    line = one_error_line(proc)
    assert f"the latest sweep of 'toy' (run {before['sweep']}) is done" in line
    assert f"`musku sweep {exp}` starts a new run" in line
    with open_store(url) as store:
        assert len(store.runs_named("toy")) == 2  # no run written


def test_a_file_path_given_as_db_is_bad_input(tmp_path: Path) -> None:
    path = tmp_path / "results.db"
    proc = musku("results", "--db", str(path))
    assert proc.returncode == 3  # a usage slip, not a database failure (5)
    assert f"for that SQLite file: sqlite:///{path}" in one_error_line(proc)
    assert not path.exists()


def test_experiments_on_sqlite_show_no_queue_counts(sweep_then_abtest: str) -> None:
    """SQLite has no comparison queue: `musku experiments` said 0/0/0 for every run."""
    from musku.display import _host_summary

    proc = musku("experiments", "--db", sweep_then_abtest, env={"COLUMNS": "200"})
    assert proc.returncode == 0, proc.stderr
    assert "0/0/0" not in proc.stdout and "sim-a, sim-b" in proc.stdout
    names = [f"sim-{i:03d}" for i in range(16)]
    assert _host_summary(names) == "sim-000 .. sim-015 (16)"
    assert _host_summary(names[:3]) == "sim-000, sim-001, sim-002"
