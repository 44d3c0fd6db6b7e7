"""A knob from outside the musku package, end to end: ``tests.knobs.toyknob:ReadaheadKnob``
works on a fake host tree (a real file under the fake root), is validated in a platform
catalog and an experiment file, is swept by ``musku sweep`` on the simulator, and is stored
in and read back from the results database (its own rows, and a column of the regenerated
``configurations`` view). musku's code names it nowhere."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import text

from musku.domain import Configuration, canonical_value, format_value
from musku.errors import InputError
from musku.experiment import load_experiment
from musku.knob_spec import is_knob, knob_names, spec_of, unregister_knob
from musku.knobs import load_knob
from musku.storage import open_store
from musku.sweep.strategies import _ordered
from musku.testing.fakehost import FakeHost
from tests.knobs.toyknob import TARGET

ROOT = Path(__file__).resolve().parents[2]

CATALOG = f"""
[platform]
name = "toyvm"
description = "a VM with one block device whose read-ahead musku may tune"
vendor = "other"
cores = 2
llc_ways = 0

[knobs.thp]
settings = ["always", "madvise", "never"]

[knobs."{TARGET}"]
description = "read-ahead of vda, KiB (an out-of-tree knob)"
settings = [128, 512, 2048, 8192]

[stock]
thp = "madvise"
readahead = 128
"""

MODEL = """
[model]
name = "toyio"
platform = "toyvm"

[reference]
mips = 1000.0
qps = 100.0
p99_ms = 10.0
power_w = 100.0
qos_violation_rate = 0.001

[reference.config]
readahead = 128

[knobs.readahead.throughput]
"128" = 1.0
"512" = 1.06
"2048" = 1.02
"8192" = 0.97

[noise]
host_bias = 0.002
ar_phi = 0.5
ar_sigma = 0.01

[timing]
apply_s = 1.0
reboot_s = 60.0
"""

EXPERIMENT = """
[experiment]
name = "readahead"

[service]
name = "toyio"
knobs = ["readahead"]

[platform]
catalog = "toyvm"

[production]
readahead = {production}

[sweep]
mode = "independent"

[metric]
primary = "mips"

[statistics]
confidence = 0.95
min_effect = 0.01
warmup_s = 10
sample_interval_s = 1
sample_cap = 20000
seed = 3

[hosts]
backend = "sim"
model = "toyio.toml"
"""


@pytest.fixture
def toy_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A catalog dir (on $MUSKU_KNOBS_PATH), a simulator model and an experiment file; the
    knob is unregistered afterwards so no other test sees it."""
    catalogs = tmp_path / "catalogs"
    catalogs.mkdir()
    (catalogs / "toyvm.toml").write_text(CATALOG)
    (tmp_path / "toyio.toml").write_text(MODEL)
    (tmp_path / "exp.toml").write_text(EXPERIMENT.format(production=128))
    monkeypatch.setenv("MUSKU_KNOBS_PATH", str(catalogs))
    yield tmp_path
    unregister_knob("readahead")


def test_the_knob_on_a_fake_host_tree(tmp_path: Path) -> None:
    path = "/sys/block/vda/queue/read_ahead_kb"
    host = FakeHost(tmp_path).file(path, "128\n")
    try:
        knob = load_knob(TARGET, host.fs())
        assert knob.probe().supported and knob.read() == 128
        snap = knob.snapshot()
        assert knob.apply(512, dry_run=True) and host.read(path) == "128\n"
        assert knob.apply(512) and host.read(path) == "512\n"
        assert knob.verify(512) and knob.apply(512) == []
        with pytest.raises(InputError, match="readahead"):
            knob.apply(-1)
        assert host.read(path) == "512\n"
        knob.rollback(snap)
        assert host.read(path) == "128\n"
        assert not load_knob(TARGET, FakeHost(tmp_path / "bare").fs()).probe().supported
    finally:
        unregister_knob("readahead")


def test_registered_by_name_and_described_by_its_spec() -> None:
    assert not is_knob("readahead")
    with pytest.raises(KeyError):
        Configuration.of(readahead=512)
    try:
        cfg = Configuration.of({TARGET: 512.0, "thp": "never", "core_freq": 2.2})
        assert cfg.key() == '{"core_freq":2.2,"thp":"never","readahead":512}'  # sweep order
        assert Configuration.from_key(cfg.key()) == cfg
        assert is_knob("readahead") and knob_names()[-1] == "readahead"
        assert canonical_value("readahead", 64.0) == 64 and format_value("readahead", 64) == "64"
        assert _ordered("readahead") and spec_of("readahead").view_columns[0].type == "int"
    finally:
        unregister_knob("readahead")
    assert not is_knob("readahead")


def test_validated_in_an_experiment_file(toy_files: Path) -> None:
    exp = load_experiment(toy_files / "exp.toml")
    assert exp.service.knobs == ("readahead",)
    assert exp.space["readahead"] == (128, 512, 2048, 8192)
    assert exp.platform.stock["readahead"] == 128
    # a setting outside the catalog, in the experiment file: one line, file:line
    bad = toy_files / "bad.toml"
    bad.write_text(EXPERIMENT.format(production=300))
    with pytest.raises(InputError) as info:
        load_experiment(bad)
    message = info.value.one_line()
    assert "bad.toml:" in message and "readahead" in message and "catalog" in message
    # a value its spec refuses, in the catalog
    (toy_files / "catalogs" / "toyvm.toml").write_text(CATALOG.replace("8192]", '"fast"]'))
    with pytest.raises(InputError, match=r"toyvm.toml.*readahead takes an integer"):
        load_experiment(toy_files / "exp.toml")


def test_swept_on_the_simulator_and_stored(toy_files: Path) -> None:
    db = f"sqlite:///{toy_files / 'results.db'}"
    env = dict(os.environ)
    env.pop("MUSKU_DEBUG", None)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    proc = subprocess.run(
        [sys.executable, "-m", "musku", "sweep", str(toy_files / "exp.toml"), "--db", db],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
        cwd=toy_files,
    )
    assert proc.returncode == 0, proc.stderr
    load_experiment(toy_files / "exp.toml")  # registers the knob in this process too
    with open_store(db) as store:
        (rec,) = store.experiments()
        done = store.completed(rec.id)
        purposes = {p for p, _ in done}
        assert "knob:readahead" in purposes
        tried = {r.candidate["readahead"] for p, r in done if p == "knob:readahead"}
        assert tried <= {512, 2048, 8192} and 512 in tried
        best = [r for p, r in done if p == "knob:readahead" and r.candidate["readahead"] == 512]
        assert best[0].decision.value == "better"  # the model's +6 %
        with store.engine.connect() as conn:
            rows = conn.execute(
                text("SELECT readahead, key FROM configurations ORDER BY readahead")
            ).all()
            settings = conn.execute(
                text(
                    "SELECT value, number FROM configuration_settings "
                    "WHERE knob = 'readahead' ORDER BY number"
                )
            ).all()
            recorded = conn.execute(text("SELECT name, target, kind FROM knobs")).all()
    assert [tuple(r) for r in recorded] == [("readahead", TARGET, "count")]  # for other readers
    assert [r[0] for r in rows] == sorted({128} | tried)
    assert all(json.loads(k)["readahead"] == v for v, k in rows)
    assert [tuple(s) for s in settings] == [(str(v), float(v)) for v in sorted({128} | tried)]
    # another process reads it back too: it loads the knob from the knobs table
    out = subprocess.run(
        [sys.executable, "-m", "musku", "results", str(rec.id), "--db", db, "--json"],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        cwd=toy_files,
    )
    assert out.returncode == 0 and "readahead" in out.stdout, out.stderr
