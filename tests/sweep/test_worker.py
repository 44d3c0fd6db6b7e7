"""Several processes on one sweep through the PostgreSQL comparison queue (issue 20 items 3,
4, 6), with the real CLI, real subprocesses and a real PostgreSQL:

- a controller SIGKILLed in the middle of a comparison: a ``musku worker`` beside it takes the
  sweep over and finishes it; in the DB the sweep completes once, every comparison it needs
  is finished exactly once, and the half-measured comparison of the dead controller is
  aborted and measured again once (its queue row claimed twice); the time to takeover is
  printed (the lead quotes it);
- ``musku abort`` stops a running controller at its next heartbeat (exit 130, one line), the
  experiment ends ``aborted`` with its claims released; abort's bad inputs are one line each
  with their exit codes; ``musku experiments`` lists the experiment, its claim and its queue;
- ``musku worker`` on SQLite: one line, exit 4.
"""

from __future__ import annotations

import functools
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import create_engine, text

from musku.cli import main
from musku.testing.postgres import fresh_pg_database, pg_server  # noqa: F401 - fixtures
from tests.timing import scaled, slowdown

ROOT = Path(__file__).resolve().parents[2]


@functools.cache
def _lease() -> str:
    """A short queue lease (beats every sixth), longer on a loaded machine; one per session."""
    return f"{3.0 * slowdown():.1f}"


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "MUSKU_DEBUG"}
    env["PYTHONPATH"] = str(ROOT)
    env["MUSKU_QUEUE_LEASE_S"] = _lease()
    return env


def _musku(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "musku", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
        env=_env(),
    )


def _engine(url: str) -> Any:
    return create_engine(url.replace("postgresql://", "postgresql+psycopg://", 1))


def _query(url: str, sql: str, **params: Any) -> list[Any]:
    engine = _engine(url)
    try:
        with engine.connect() as conn:
            return list(conn.execute(text(sql), params).all())
    except Exception:  # noqa: BLE001 - the schema is not created yet
        return []
    finally:
        engine.dispose()


def _half_measured(url: str, pid: int) -> tuple[int, int] | None:
    """(queue row, comparison) the controller ``pid`` is measuring, with samples stored."""
    rows = _query(
        url,
        "SELECT q.id, q.comparison_id FROM comparison_queue q JOIN comparisons c "
        "ON c.id = q.comparison_id WHERE q.state = 'claimed' AND c.status = 'running' "
        "AND q.claimed_by LIKE :me AND EXISTS (SELECT 1 FROM samples s "
        "WHERE s.comparison_id = q.comparison_id)",
        me=f"%:{pid}:%",
    )
    return (int(rows[0][0]), int(rows[0][1])) if rows else None


def _kill_mid_comparison(p: subprocess.Popen[str], url: str) -> tuple[int, int, float]:
    """SIGKILL the controller while it measures a comparison (checked while it is stopped):
    (queue row, half-measured comparison, time of the kill)."""
    deadline = time.monotonic() + scaled(180)
    while time.monotonic() < deadline:
        assert p.poll() is None, p.communicate()
        if _half_measured(url, p.pid) is not None:
            os.kill(p.pid, signal.SIGSTOP)
            seen = _half_measured(url, p.pid)
            if seen is not None:
                p.kill()
                killed = time.monotonic()
                p.communicate()
                return seen[0], seen[1], killed
            os.kill(p.pid, signal.SIGCONT)
        time.sleep(0.02)
    raise AssertionError("the controller never measured a comparison")


@pytest.mark.postgres
@pytest.mark.timeout(900)
def test_sigkilled_controller_is_finished_by_a_worker(
    toy: Any, request: pytest.FixtureRequest, capsys: pytest.CaptureFixture[str]
) -> None:
    exp = toy("independent", name="killed")
    url = fresh_pg_database(request.getfixturevalue("pg_server"))
    stale = f"{1.5 * float(_lease()):.1f}"
    controller = _musku("sweep", str(exp), "--db", url, "--json", "-q")
    worker: subprocess.Popen[str] | None = None
    try:
        deadline = time.monotonic() + scaled(120)
        while not _query(url, "SELECT id FROM experiments WHERE status = 'running'"):
            assert controller.poll() is None, controller.communicate()
            assert time.monotonic() < deadline, "the sweep never started"
            time.sleep(0.05)
        worker = _musku("worker", str(exp), "--db", url, "--json", "-q", "--claim-stale", stale)
        item, half, killed = _kill_mid_comparison(controller, url)
        # the takeover: the experiment claimed by the worker's process
        while not _query(
            url, "SELECT 1 FROM experiments WHERE claim_controller LIKE :w", w=f"%:{worker.pid}:%"
        ):
            if worker.poll() is not None:
                break
            assert time.monotonic() < killed + scaled(120), "no takeover"
            time.sleep(0.05)
        took_over = time.monotonic() - killed
        out, err = worker.communicate(timeout=scaled(600))
        finished = time.monotonic() - killed
        assert worker.returncode == 0, err
    finally:
        for p in (controller, worker):
            if p is not None and p.poll() is None:
                p.kill()
                p.communicate()
    report = json.loads(out)
    assert report["took_over"] and report["status"] == "done"
    sweep = report["sweep"]
    # in the DB: one experiment, done once, no claim left, one soft SKU
    assert _query(url, "SELECT status, claim_controller FROM experiments") == [("done", None)]
    assert _query(url, "SELECT count(*) FROM soft_skus") == [(1,)]
    # every comparison the sweep needed finished exactly once: none lost, none duplicated
    finished_per_key = _query(
        url,
        "SELECT purpose, baseline_id, candidate_id, count(*) FROM comparisons "
        "WHERE status = 'finished' GROUP BY 1, 2, 3",
    )
    assert finished_per_key and all(n == 1 for *_, n in finished_per_key)
    assert 0 < len(finished_per_key) <= sweep["comparisons"]  # (a result may answer twice)
    queue = _query(url, "SELECT state, count(*) FROM comparison_queue GROUP BY 1")
    assert queue == [("done", len(finished_per_key))]
    done_links = _query(
        url,
        "SELECT count(*) FROM comparison_queue q JOIN comparisons c ON c.id = q.comparison_id "
        "WHERE c.status = 'finished'",
    )
    assert done_links == [(len(finished_per_key),)]
    assert _query(url, "SELECT count(*) FROM decisions") == [(len(finished_per_key),)]
    # the half-measured comparison: aborted, and its row measured again once
    assert _query(url, "SELECT id FROM comparisons WHERE status <> 'finished'") == [(half,)]
    assert _query(url, "SELECT attempts FROM comparison_queue WHERE id = :i", i=item) == [(2,)]
    assert _query(url, "SELECT max(attempts) FROM comparison_queue") == [(2,)]
    with capsys.disabled():
        print(
            f"\n[queue] SIGKILL takeover (lease {_lease()} s, claim "
            f"stale {stale} s, busy machine): worker took the sweep over {took_over:.2f} s "
            f"after the kill, sweep done {finished:.2f} s after it; "
            f"{len(finished_per_key)} comparisons finished once, 1 rerun"
        )


def _main(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    """``musku ARGS`` in this process (the console script's main()): (exit code, out, err)."""
    capsys.readouterr()
    code = 0
    try:
        main(list(args))
    except SystemExit as exc:
        code = int(exc.code or 0)
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def _stop_unlocked(p: subprocess.Popen[str], url: str, exp_id: int) -> None:
    """SIGSTOP the controller at a moment it holds no lock on its experiment's rows."""
    for _ in range(200):
        os.kill(p.pid, signal.SIGSTOP)
        engine = _engine(url)
        try:
            with engine.begin() as conn:
                conn.execute(
                    text("SELECT id FROM experiments WHERE id = :i FOR UPDATE NOWAIT"),
                    {"i": exp_id},
                )
                conn.execute(
                    text(
                        "SELECT id FROM comparison_queue WHERE experiment_id = :i FOR UPDATE NOWAIT"
                    ),
                    {"i": exp_id},
                )
            return
        except Exception:  # noqa: BLE001 - a lock is held: let it go on a little
            os.kill(p.pid, signal.SIGCONT)
            time.sleep(0.01)
        finally:
            engine.dispose()
    raise AssertionError("the controller always held a lock")


@pytest.mark.postgres
@pytest.mark.timeout(600)
def test_abort_stops_a_running_controller(
    toy: Any, request: pytest.FixtureRequest, capsys: pytest.CaptureFixture[str]
) -> None:
    exp = toy("independent", name="aborted")
    url = fresh_pg_database(request.getfixturevalue("pg_server"))
    controller = _musku("sweep", str(exp), "--db", url, "--json", "-q")
    try:
        deadline = time.monotonic() + scaled(120)
        while not (rows := _query(url, "SELECT id FROM comparison_queue WHERE state = 'done'")):
            assert controller.poll() is None, controller.communicate()
            assert time.monotonic() < deadline, "the sweep never finished a comparison"
            time.sleep(0.05)
        exp_id = _query(url, "SELECT id FROM experiments")[0][0]
        _stop_unlocked(controller, url, exp_id)  # so the sweep does not end meanwhile
        code, out, err = _main(capsys, "experiments", "--db", url, "--json")
        assert code == 0, err
        (row,) = json.loads(out)
        assert row["id"] == exp_id and row["status"] == "running"
        assert row["hosts"] == ["sim-a", "sim-b"]
        assert f":{controller.pid}:" in row["controller"]["id"]
        assert row["controller"]["heartbeat_age_s"] < 60
        assert row["queue"]["done"] >= len(rows)
        code, out, err = _main(capsys, "abort", str(exp_id), "--db", url)
        assert code == 0, err
        assert f"experiment {exp_id} (aborted) aborted: its controller" in out
        os.kill(controller.pid, signal.SIGCONT)
        out, err = controller.communicate(timeout=scaled(120))
    finally:
        if controller.poll() is None:
            controller.kill()
            controller.communicate()
    assert controller.returncode == 130, err
    assert err.strip().splitlines() == [
        f"musku: error: experiment {exp_id} (aborted) was aborted (musku abort): stopped and "
        "rolled back"
    ]
    assert _query(url, "SELECT status, claim_controller FROM experiments") == [("aborted", None)]
    code, out, _ = _main(capsys, "experiments", "--db", url)
    # its name is "aborted" too: the status is the second "aborted" on its row in the table,
    # or the "status:" line where a narrow console (pytest-xdist's) lists it field by field
    row_text = out.split(str(exp_id), 1)[1]
    assert code == 0 and (
        re.search(r"status:\s+aborted\b", out) or len(re.findall(r"\baborted\b", row_text)) >= 2
    ), out
    code, out, _ = _main(capsys, "experiments", "--running", "--db", url, "--json")
    assert code == 0 and json.loads(out) == []
    assert _query(url, "SELECT count(*) FROM comparisons WHERE status = 'running'") == [(0,)]
    assert _query(url, "SELECT count(*) FROM comparison_queue WHERE state = 'claimed'") == [(0,)]
    # bad input: one line and its exit code each
    cases = [
        (["abort", "999", "--db", url], 3, "no experiment with id 999"),
        (["abort", str(exp_id), "--db", url], 3, f"experiment {exp_id} (aborted) is already"),
        (["abort", "aborted", "--db", url], 3, "give the experiment's id"),
        (["worker", "4242", "--db", url], 3, "no experiment with id 4242"),
    ]
    for args, status, words in cases:
        code, _, err = _main(capsys, *args)
        lines = err.strip().splitlines()
        assert code == status and len(lines) == 1 and words in lines[0], (args, lines)


def test_worker_on_sqlite_is_refused(toy: Any, tmp_path: Path) -> None:
    exp = toy("independent", name="lite")
    r = subprocess.run(
        [sys.executable, "-m", "musku", "worker", str(exp), "--db", f"sqlite:///{tmp_path}/r.db"],
        capture_output=True, text=True, cwd=ROOT, env=_env(), timeout=scaled(60),
    )  # fmt: skip
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 4 and len(lines) == 1, r.stderr
    assert "the comparison queue needs PostgreSQL" in lines[0]
