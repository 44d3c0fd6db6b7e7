"""`musku sweep` / `results` / `sku` end to end through the CLI, on simulated hosts and SQLite."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from tests.cli.test_exit_codes import musku, one_error_line


def test_sweep_then_read_commands(toy: Any, tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path}/r.db"
    exp = toy("independent", name="cli-toy")
    proc = musku("sweep", str(exp), "--db", db, "--json")
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert report["soft_sku"]["configuration"] == {"core_count": 2, "thp": "always", "shp": 128}
    assert report["soft_sku"]["vs_production"]["decision"] == "better"
    assert report["host_time_s"] > 0 and report["comparisons"] == report["measured"]

    exps = json.loads(musku("results", "--db", db, "--json").stdout)
    assert [e["name"] for e in exps] == ["cli-toy"]
    detail = json.loads(musku("results", "cli-toy", "--db", db, "--json").stdout)
    assert len(detail["comparisons"]) >= report["comparisons"]
    skus = json.loads(musku("sku", "show", "--db", db, "--json", "--service", "toy").stdout)
    assert len(skus) == 1
    sku_id = skus[0]["id"]
    one = json.loads(musku("sku", "show", str(sku_id), "--db", db, "--json").stdout)
    assert one["configuration"]["shp"] == 128

    # a second, different soft SKU (search mode finds the interaction), then diff them
    proc = musku("sweep", str(toy("search", name="cli-toy-search")), "--db", db, "--json", "-q")
    assert proc.returncode == 0, proc.stderr
    skus = json.loads(musku("sku", "show", "--db", db, "--json").stdout)
    assert len(skus) == 2
    diff = json.loads(
        musku("sku", "diff", str(skus[0]["id"]), str(skus[1]["id"]), "--db", db, "--json").stdout
    )
    changed = {row["knob"] for row in diff["knobs"] if not row["same"]}
    assert changed == {"shp"}
    # human output works too
    proc = musku("sku", "diff", str(skus[0]["id"]), str(skus[1]["id"]), "--db", db)
    assert proc.returncode == 0 and "differs" in proc.stdout

    proc = musku("sku", "show", "999", "--db", db)
    assert proc.returncode == 3 and "no soft SKU with id 999" in one_error_line(proc)


def test_unreachable_database_is_one_line_exit_5(toy: Any) -> None:
    proc = musku("sweep", str(toy()), "--db", "postgresql+psycopg://musku:secret@127.0.0.1:9/nodb")
    assert proc.returncode == 5, proc.stderr
    line = one_error_line(proc)
    assert "secret" not in line


def test_database_at_older_schema_is_refused_until_upgrade(toy: Any, tmp_path: Path) -> None:
    from sqlalchemy import create_engine

    from musku.storage import head_revision
    from musku.storage.migrate import script_directory, upgrade_engine

    db = f"sqlite:///{tmp_path}/old.db"
    first = script_directory().get_base()  # the oldest revision
    assert first != head_revision()
    engine = create_engine(db)
    upgrade_engine(engine, first)
    engine.dispose()
    proc = musku("sweep", str(toy()), "--db", db)
    assert proc.returncode == 5
    assert "musku db upgrade" in one_error_line(proc)
    proc = musku("db", "upgrade", "--db", db)
    assert proc.returncode == 0, proc.stderr
    status = json.loads(musku("db", "status", "--db", db, "--json").stdout)
    assert status["revision"] == head_revision() and status["up_to_date"]


def test_ctrl_c_keeps_data_and_resume_finishes(toy: Any, tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path}/r.db"
    exp = toy("search", name="interrupted")
    env = dict(os.environ)
    proc = subprocess.Popen(
        [sys.executable, "-m", "musku", "sweep", str(exp), "--db", db, "-q"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    # wait until some comparisons are stored, then Ctrl-C
    from musku.storage import open_store

    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        time.sleep(0.2)
        if (tmp_path / "r.db").exists():
            try:
                store = open_store(db, create=False)
                exps = store.experiments()
                n = len(store.completed(exps[0].id)) if exps else 0
                store.close()
            except Exception:
                n = 0
            if n >= 2:
                break
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    if proc.returncode == 0:  # finished before the signal landed: nothing to resume
        return
    assert proc.returncode == 130, err
    assert "--resume" in err and "Traceback" not in err
    done = musku("sweep", str(exp), "--db", db, "--resume", "--json", "-q")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["measured"] < report["comparisons"]  # the kept ones were not re-measured
    assert report["soft_sku"]["configuration"]["shp"] == 256


def test_abtest_runs_one_comparison_and_records_it(toy: Any, tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path}/r.db"
    proc = musku(
        "abtest", str(toy(name="one-ab")), "--set", "thp=always", "--db", db, "--json", "-q"
    )
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    assert result["changed"] == {"thp": ["madvise", "always"]}
    assert result["decision"] == "better" and result["ci_low"] > 0
    # a name means its latest finished sweep; this run is an abtest, so --kind says so
    alone = musku("results", "one-ab", "--db", db, "--json")
    assert alone.returncode == 3 and "--kind abtest" in alone.stderr, alone.stderr
    detail = json.loads(musku("results", "one-ab", "--kind", "abtest", "--db", db, "--json").stdout)
    assert detail["experiment"]["status"] == "done"
    assert [c["purpose"] for c in detail["comparisons"]] == ["abtest"]
