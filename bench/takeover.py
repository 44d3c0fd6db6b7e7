#!/usr/bin/env python3
"""A controller SIGKILLed in the middle of a sweep, finished by another process (issue 20).

On a real PostgreSQL started for the run (``musku.testing.postgres``), each round runs the
shipped ``experiments/web-broadwell.toml`` sweep (simulated hosts) with ``musku sweep``, starts
a ``musku worker`` beside it, SIGKILLs the controller while it measures a comparison (samples
stored, not decided), and times the worker's takeover (the experiment claimed by the worker)
and the end of the sweep. The baseline, measured in the same run: the same sweep undisturbed.
Each round is checked in the DB: the experiment done once, every comparison finished exactly
once, the half-measured one aborted and measured again once, one soft SKU.

    python bench/takeover.py [--rounds 3] [--lease 6] [--stale 9] [--json]

Takeover cannot come before the controller's claim is ``--stale`` seconds old (the worker's
``--claim-stale``); the figure to read is takeover / stale (>= 1; ~1 is the best possible)
and the killed sweep's wall time against the undisturbed one's.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from sqlalchemy import create_engine, text

ROOT = Path(__file__).resolve().parents[1]
EXPERIMENT = ROOT / "experiments" / "web-broadwell.toml"


def _env(lease: float) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "MUSKU_DEBUG"}
    env["PYTHONPATH"] = str(ROOT)
    env["MUSKU_QUEUE_LEASE_S"] = str(lease)
    return env


def _musku(lease: float, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "musku", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
        env=_env(lease),
    )


def _query(url: str, sql: str, **params: Any) -> list[Any]:
    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            return list(conn.execute(text(sql), params).all())
    except Exception:  # noqa: BLE001 - schema not there yet
        return []
    finally:
        engine.dispose()


def _half_measured(url: str, pid: int) -> tuple[int, int] | None:
    rows = _query(
        url,
        "SELECT q.id, q.comparison_id FROM comparison_queue q JOIN comparisons c "
        "ON c.id = q.comparison_id WHERE q.state = 'claimed' AND c.status = 'running' "
        "AND q.claimed_by LIKE :me AND EXISTS (SELECT 1 FROM samples s "
        "WHERE s.comparison_id = q.comparison_id)",
        me=f"%:{pid}:%",
    )
    return (int(rows[0][0]), int(rows[0][1])) if rows else None


def _fresh(server_url: str, name: str) -> str:
    engine = create_engine(server_url, isolation_level="AUTOCOMMIT")
    try:
        with engine.connect() as conn:
            conn.execute(text(f"CREATE DATABASE {name}"))
    finally:
        engine.dispose()
    return server_url.rsplit("/", 1)[0] + "/" + name


def undisturbed(url: str, lease: float) -> float:
    started = time.monotonic()
    p = _musku(lease, "sweep", str(EXPERIMENT), "--db", url, "--json", "-q")
    out, err = p.communicate()
    if p.returncode != 0:
        raise SystemExit(f"the undisturbed sweep failed: {err.strip()}")
    return time.monotonic() - started


def killed(url: str, lease: float, stale: float, skip: int) -> dict[str, Any]:
    """One round; ``skip``: comparisons to let finish before the kill (spreads the moment)."""
    started = time.monotonic()
    ctl = _musku(lease, "sweep", str(EXPERIMENT), "--db", url, "--json", "-q")
    while not _query(url, "SELECT id FROM experiments WHERE status = 'running'"):
        if ctl.poll() is not None:
            raise SystemExit(f"the sweep failed: {ctl.communicate()[1].strip()}")
        time.sleep(0.05)
    worker = _musku(lease, "worker", str(EXPERIMENT), "--db", url, "--json", "-q",
                    "--claim-stale", str(stale))  # fmt: skip
    seen = None
    while seen is None:
        if ctl.poll() is not None:
            raise SystemExit("the sweep ended before it could be killed: lower --skip")
        done = _query(url, "SELECT count(*) FROM comparison_queue WHERE state = 'done'")
        if done and done[0][0] >= skip and _half_measured(url, ctl.pid) is not None:
            os.kill(ctl.pid, signal.SIGSTOP)
            seen = _half_measured(url, ctl.pid)
            if seen is None:
                os.kill(ctl.pid, signal.SIGCONT)
        time.sleep(0.02)
    ctl.kill()
    at = time.monotonic()
    ctl.communicate()
    takeover = None
    while worker.poll() is None:
        if takeover is None and _query(
            url, "SELECT 1 FROM experiments WHERE claim_controller LIKE :w", w=f"%:{worker.pid}:%"
        ):
            takeover = time.monotonic() - at
        time.sleep(0.05)
    out, err = worker.communicate()
    end = time.monotonic()
    if worker.returncode != 0:
        raise SystemExit(f"the worker failed: {err.strip()}")
    report = json.loads(out)
    per_key = _query(
        url,
        "SELECT count(*) FROM comparisons WHERE status = 'finished' "
        "GROUP BY purpose, baseline_id, candidate_id",
    )
    checks = {
        "experiment done once": _query(url, "SELECT status FROM experiments") == [("done",)],
        "each comparison finished once": bool(per_key) and all(n == 1 for (n,) in per_key),
        "queue all done": _query(url, "SELECT DISTINCT state FROM comparison_queue") == [("done",)],
        "half-measured aborted, rerun once": _query(
            url, "SELECT id FROM comparisons WHERE status <> 'finished'"
        )
        == [(seen[1],)]
        and _query(url, "SELECT attempts FROM comparison_queue WHERE id = :i", i=seen[0]) == [(2,)],
        "one soft SKU": _query(url, "SELECT count(*) FROM soft_skus") == [(1,)],
    }
    return {
        "takeover_s": takeover,
        "after_kill_to_done_s": end - at,
        "wall_s": end - started,
        "comparisons": len(per_key),
        "took_over": report["took_over"],
        "checks": checks,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--lease", type=float, default=6.0, help="MUSKU_QUEUE_LEASE_S")
    ap.add_argument("--stale", type=float, default=9.0, help="the worker's --claim-stale")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    from musku.testing.postgres import PostgresServer, pg_bin

    bin_dir = pg_bin()
    if bin_dir is None:
        raise SystemExit("no PostgreSQL binaries (initdb, pg_ctl) found")
    with tempfile.TemporaryDirectory(prefix="musku-takeover-") as tmp:
        os.chmod(tmp, 0o755)  # as root, the server runs as the postgres user: it must reach it
        server = PostgresServer(Path(tmp) / "pg", bin_dir=bin_dir)
        url = server.start()
        try:
            base = [undisturbed(_fresh(url, f"base{i}"), args.lease) for i in range(args.rounds)]
            rounds = [
                killed(_fresh(url, f"kill{i}"), args.lease, args.stale, skip=2 + 3 * i)
                for i in range(args.rounds)
            ]
        finally:
            server.stop()
    takeovers = [r["takeover_s"] for r in rounds if r["takeover_s"] is not None]
    result = {
        "lease_s": args.lease,
        "claim_stale_s": args.stale,
        "undisturbed_wall_s": base,
        "rounds": rounds,
        "takeover_median_s": statistics.median(takeovers) if takeovers else None,
        "takeover_over_stale": statistics.median(takeovers) / args.stale if takeovers else None,
        "killed_over_undisturbed_wall": statistics.median(r["wall_s"] for r in rounds)
        / statistics.median(base),
        "all_checks": all(all(r["checks"].values()) for r in rounds),
    }
    if args.json:
        print(json.dumps(result, indent=2))
        return
    print(
        f"SIGKILL takeover, {args.rounds} rounds, lease {args.lease} s, claim stale {args.stale} s"
    )
    for i, r in enumerate(rounds):
        t = r["takeover_s"]
        print(
            f"  round {i}: takeover {'-' if t is None else f'{t:.2f} s'} after the kill, done "
            f"{r['after_kill_to_done_s']:.2f} s after it, wall {r['wall_s']:.1f} s, "
            f"{r['comparisons']} comparisons; checks "
            + ("ok" if all(r["checks"].values()) else f"FAILED {r['checks']}")
        )
    print(f"  undisturbed sweep wall (same run): {', '.join(f'{b:.1f}' for b in base)} s")
    if result["takeover_median_s"] is not None:
        print(
            f"  median takeover {result['takeover_median_s']:.2f} s = "
            f"{result['takeover_over_stale']:.2f} x claim stale; killed/undisturbed wall "
            f"{result['killed_over_undisturbed_wall']:.2f}"
        )
    if not result["all_checks"]:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
