"""Two controllers on one experiment, through the real CLI (issue 20 item 3), on SQLite and a
real PostgreSQL: ``musku sweep --resume`` while the first controller is alive is refused with
one line naming it (exit 5) and changes nothing, the first finishes with the rows of one sweep;
a stale claim (its controller SIGKILLed, the heartbeat forced old) is taken over and finished."""

from __future__ import annotations

import json
import os
import re
import signal
import sqlite3
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import create_engine, text, update

from musku.storage import convert
from musku.storage.models import ExperimentRow
from musku.testing.postgres import fresh_pg_database, pg_server  # noqa: F401 - fixtures
from tests.timing import scaled

ROOT = Path(__file__).resolve().parents[2]
BACKENDS = ["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)]


def _url(backend: str, tmp_path: Path, request: pytest.FixtureRequest) -> str:
    if backend == "sqlite":
        return f"sqlite:///{tmp_path}/results.db"
    return fresh_pg_database(request.getfixturevalue("pg_server"))


def _engine(url: str) -> Any:
    return create_engine(url.replace("postgresql://", "postgresql+psycopg://", 1))


def _sweep(exp: Path, url: str, *extra: str) -> subprocess.Popen[str]:
    env = {k: v for k, v in os.environ.items() if k != "MUSKU_DEBUG"}
    env["PYTHONPATH"] = str(ROOT)
    return subprocess.Popen(
        [sys.executable, "-m", "musku", "sweep", str(exp), "--db", url, "--json", "-q", *extra],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
        env=env,
    )


def _claimed(url: str) -> int | None:
    engine = _engine(url)
    try:
        with engine.connect() as conn:
            row = conn.execute(
                text(
                    "SELECT id FROM experiments WHERE status = 'running' "
                    "AND claim_controller IS NOT NULL"
                )
            ).first()
    except Exception:  # noqa: BLE001 - not created yet
        return None
    finally:
        engine.dispose()
    return None if row is None else int(row[0])


def _unlocked(url: str, exp_id: int) -> bool:
    """The stopped controller holds no lock a claim needs (it may be stopped mid-write)."""
    if url.startswith("sqlite"):
        conn = sqlite3.connect(url.removeprefix("sqlite:///"), timeout=0.2)
        try:
            conn.execute("BEGIN IMMEDIATE")
            conn.execute("ROLLBACK")
            return True
        except sqlite3.OperationalError:
            return False
        finally:
            conn.close()
    engine = _engine(url)
    try:
        with engine.begin() as conn:
            conn.execute(
                text("SELECT id FROM experiments WHERE id = :i FOR UPDATE NOWAIT"), {"i": exp_id}
            )
        return True
    except Exception:  # noqa: BLE001 - lock not available
        return False
    finally:
        engine.dispose()


def _stop_while_claimed(p: subprocess.Popen[str], url: str) -> int:
    """Wait until the first controller holds its running experiment, then SIGSTOP it at a
    moment it holds no database lock; returns the experiment id."""
    deadline = time.monotonic() + scaled(120)
    while (exp_id := _claimed(url)) is None:
        assert p.poll() is None, p.communicate()
        assert time.monotonic() < deadline, "the first sweep never claimed its experiment"
        time.sleep(0.02)
    for _ in range(200):
        os.kill(p.pid, signal.SIGSTOP)
        if _unlocked(url, exp_id):
            return exp_id
        os.kill(p.pid, signal.SIGCONT)
        time.sleep(0.01)
    raise AssertionError("the first sweep always held a lock")


def _counts(url: str) -> dict[str, Any]:
    engine = _engine(url)
    try:
        with engine.connect() as conn:
            q = lambda sql: conn.execute(text(sql)).all()  # noqa: E731
            return {
                "experiments": q("SELECT status, claim_controller FROM experiments"),
                "comparisons": dict(q("SELECT status, count(*) FROM comparisons GROUP BY 1")),
                "decisions": q("SELECT count(*) FROM decisions")[0][0],
            }
    finally:
        engine.dispose()


@pytest.mark.timeout(600)
@pytest.mark.parametrize("backend", BACKENDS)
def test_resume_refused_while_the_first_controller_lives(
    backend: str, toy: Any, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    exp = toy("independent", name="held")
    url = _url(backend, tmp_path, request)
    first = _sweep(exp, url)
    try:
        exp_id = _stop_while_claimed(first, url)
        before = _counts(url)
        second = _sweep(exp, url, "--resume")
        out, err = second.communicate(timeout=scaled(120))
        assert second.returncode == 5, (out, err)
        lines = err.strip().splitlines()
        assert len(lines) == 1, err
        assert re.search(
            rf"experiment {exp_id} is held by controller \S+ on host \S+ "
            rf"\(pid {first.pid}\), heartbeat \d+s ago",
            lines[0],
        ), lines[0]
        assert _counts(url) == before  # the refusal changed nothing
    finally:
        os.kill(first.pid, signal.SIGCONT)
    out, err = first.communicate(timeout=scaled(300))
    assert first.returncode == 0, err
    report = json.loads(out)
    after = _counts(url)
    # the rows of one sweep: one experiment, done, claim released; every comparison it reports
    # finished once (none aborted by the refused resume), one decision each
    assert after["experiments"] == [("done", None)]
    assert after["comparisons"] == {"finished": report["comparisons"]}
    assert after["decisions"] == report["comparisons"]


@pytest.mark.timeout(600)
@pytest.mark.parametrize("backend", BACKENDS)
def test_stale_claim_is_taken_over(
    backend: str, toy: Any, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    exp = toy("independent", name="stale")
    url = _url(backend, tmp_path, request)
    first = _sweep(exp, url)
    try:
        exp_id = _stop_while_claimed(first, url)
        # a crash: its connections close (an open transaction of a stopped process would hold
        # its locks), the claim it last heartbeated stays in the row
        first.kill()  # SIGKILL (a stopped process dies of it too)
        first.communicate()
        engine = _engine(url)
        with engine.begin() as conn:  # as if the first controller had died a while ago
            conn.execute(
                update(ExperimentRow)
                .where(ExperimentRow.id == exp_id)
                .values(claim_heartbeat=convert.now() - timedelta(seconds=120))
            )
        engine.dispose()
        second = _sweep(exp, url, "--resume", "--claim-stale", "60")
        out, err = second.communicate(timeout=scaled(300))
        assert second.returncode == 0, err
        report = json.loads(out)
        assert report["experiment_id"] == exp_id
    finally:
        if first.poll() is None:
            first.kill()
            first.communicate()
    after = _counts(url)
    assert after["experiments"] == [("done", None)]
    assert after["comparisons"].get("running", 0) == 0
