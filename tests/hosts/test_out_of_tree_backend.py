"""A host backend from outside the musku package, end to end: ``tests.hosts.toybackend``
passes the backend contract, is checked by ``musku check`` (its own options model), planned by
``musku sweep --dry-run`` and swept by ``musku sweep`` into a results DB, with zero edits to
musku. Plug-ins that register a name twice, lack a required method or fail their contract
are refused when loaded: one line naming the plug-in, exit 3, nothing written."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from musku.experiment import load_experiment
from musku.registry import BACKENDS
from musku.storage import open_store
from musku.testing.backend import BackendContract
from tests.hosts.toybackend import TARGET, ToyBackend

ROOT = Path(__file__).resolve().parents[2]

EXP = """
[experiment]
name = "toy-sweep"
[service]
name = "web"
knobs = ["thp"]
[platform]
catalog = "skylake18"
[platform.settings]
thp = ["always", "madvise", "never"]
[statistics]
sample_interval_s = 60
warmup_s = 60
min_effect = 0.03
[hosts]
backend = "{backend}"
speedup = 0.1
noise = 0.01
"""


def write(tmp: Path, backend: str = TARGET, extra: str = "") -> Path:
    path = tmp / "toy.toml"
    path.write_text(EXP.format(backend=backend) + extra)
    return path


def musku(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    env.pop("MUSKU_DEBUG", None)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    return subprocess.run(
        [sys.executable, "-m", "musku", *args],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
        cwd=cwd,
    )


def one_line(proc: subprocess.CompletedProcess[str]) -> str:
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    return lines[0]


@pytest.fixture
def toy_registered() -> Iterator[None]:
    yield
    if "toy" in BACKENDS.names():
        BACKENDS.unregister("toy")


class TestToyBackend(BackendContract):
    name = TARGET

    @pytest.fixture
    def experiment(self, tmp_path: Path, toy_registered: None) -> object:
        return load_experiment(write(tmp_path))


def test_its_short_name_works_once_registered(tmp_path: Path, toy_registered: None) -> None:
    assert isinstance(BACKENDS.register(TARGET), ToyBackend)
    assert BACKENDS.register(TARGET) is BACKENDS.get("toy")  # twice: harmless
    exp = load_experiment(write(tmp_path, backend="toy"))
    assert exp.hosts.backend == "toy"


def test_musku_check_dry_run_and_sweep_end_to_end(tmp_path: Path) -> None:
    path = write(tmp_path)
    db = f"sqlite:///{tmp_path / 'r.db'}"
    proc = musku("check", str(path), "--json")
    assert proc.returncode == 0, proc.stderr
    proc = musku("sweep", str(path), "--dry-run", "--json", "--db", db)
    assert proc.returncode == 0, proc.stderr
    plan = json.loads(proc.stdout)
    assert plan["hosts"]["backend"] == "toy" and plan["hosts"]["ok"] is True
    assert plan["host_time"]["per_comparison_s"] > 0  # from the toy's own prior
    assert not (tmp_path / "r.db").exists()
    proc = musku("sweep", str(path), "--seed", "4", "--json", "--quiet", "--db", db)
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert report["best"]["thp"] == "always"  # the formula's 10 % gain is found
    assert report["soft_sku"] is not None
    store = open_store(db, create=False)
    try:
        rec = store.find_experiment("toy-sweep")
        assert rec is not None
        comps = store.comparisons(rec.id)
        assert comps and all(c.result is not None for c in comps)
    finally:
        store.close()


def test_bad_options_are_refused_by_its_own_model(tmp_path: Path) -> None:
    path = write(tmp_path, extra="warp = 9\n")
    proc = musku("check", str(path))
    assert proc.returncode == 3
    assert "warp" in one_line(proc)


@pytest.mark.parametrize(
    ("target", "needle"),
    [
        ("tests.hosts.badbackends:Twice", "registers the name 'sim' twice"),
        ("tests.hosts.badbackends:NoCheck", "lacks required method(s): pool_names"),
        ("tests.hosts.badbackends:WrongOptions", "options must be a"),
        ("tests.hosts.badbackends:Broken", "its factory failed"),
        ("tests.hosts.nosuchmodule:X", "cannot import"),
    ],
)
@pytest.mark.parametrize("command", ["check", "sweep"])
def test_bad_plugins_are_one_line_exit_3_at_load(
    tmp_path: Path, target: str, needle: str, command: str
) -> None:
    path = write(tmp_path, backend=target)
    db = tmp_path / "r.db"
    args = [command, str(path)] + (["--db", f"sqlite:///{db}"] if command == "sweep" else [])
    proc = musku(*args)
    assert proc.returncode == 3, proc.stderr
    line = one_line(proc)
    assert needle in line and target in line, line
    assert not db.exists()  # refused before anything ran
