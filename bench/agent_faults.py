"""Crash safety of the agent: SIGKILL at random points of apply and sampling, then restart.

Each trial builds a fake host tree (musku/testing/fakehost.py: the kernel's rules for THP and the
huge page pool), optionally deploys a soft SKU, forks a real agent daemon on it, hammers it with
apply requests (random THP/SHP values) while it samples at 20 Hz, SIGKILLs it after a random
delay, restarts it (the real daemon start: recovery, then listening) and checks that the host is
byte for byte at its baseline: the deployed soft SKU if there is one, else the original state.

    python bench/agent_faults.py [--trials 100] [--seed 0]

Prints the counts (where the kill landed, what recovery did) and exits 1 on any violation.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from musku.agent.client import AgentClient  # noqa: E402
from musku.agent.core import Agent  # noqa: E402
from musku.agent.journal import Journal  # noqa: E402
from musku.errors import MuskuError  # noqa: E402
from tests.agent.helpers import SHP, THP, config, fake_host, fs_of, spawn_daemon  # noqa: E402


def knob_files(host) -> dict[str, bytes]:  # type: ignore[no-untyped-def]
    return {p: host.p(p).read_bytes() for p in (THP, SHP, THP.replace("enabled", "defrag"))}


def hammer(sock: Path, rng: random.Random, stop: threading.Event, counts: dict[str, int]) -> None:
    c = AgentClient(sock, timeout=5)
    try:
        while not stop.is_set():
            cfg = {
                "thp": rng.choice(["always", "madvise", "never"]),
                "shp": rng.choice([0, 64, 128]),
            }
            try:
                c.call("apply", config=cfg, lease_s=30)
                counts["applies_ok"] += 1
            except MuskuError:
                return  # the agent died under us
    finally:
        c.close()


def trial(i: int, rng: random.Random, stats: dict[str, int]) -> str | None:
    tmp = Path(tempfile.mkdtemp(prefix=f"musku-fault-{i}-"))
    try:
        host = fake_host(tmp / "host")
        stats_file = tmp / "svc.json"
        stats_file.write_text(
            json.dumps(
                {"format": "musku-stats/1", "pid": 1, "t": time.time(), "counters": {"requests": 1}}
            )
        )
        cfg = config(
            tmp, sample_interval_s=0.05, samplers={"service": {"stats_file": str(stats_file)}}
        )
        deployed = i % 3 == 0
        if deployed:  # a soft SKU in production before the experiment
            a = Agent(cfg, fs=fs_of(host))
            a.recover()
            r = a.handle(
                {"op": "deploy", "config": {"thp": rng.choice(["always", "never"]), "shp": 64}}
            )
            assert r["ok"], r
            a.close()
            stats["with_deployed_sku"] += 1
        baseline = knob_files(host)

        pid = spawn_daemon(cfg, host)
        stop = threading.Event()
        counts = {"applies_ok": 0}
        sampling_only = i % 4 == 1  # no requests: the kill lands in sampling / spool writes
        t = threading.Thread(target=hammer, args=(cfg.socket, rng, stop, counts))
        if sampling_only:
            stats["sampling_only"] += 1
        else:
            t.start()
        # sampling-only trials run longer: the spool is flushed once a second, so some kills
        # land after flushes (rows kept) and some mid-flush
        time.sleep(rng.uniform(0.0, 2.5 if sampling_only else 0.5))
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        stop.set()
        if not sampling_only:
            t.join()
        stats["applies_before_kill"] += counts["applies_ok"]

        j = Journal(cfg.state_dir / "journal.sqlite")
        tx, steps = j.open_tx(), j.steps()
        j.close()
        if tx is None:
            stats["killed_idle"] += 1
        elif any(not s.done for s in steps):
            stats["killed_mid_write"] += 1
        else:
            stats["killed_mid_experiment"] += 1
        if knob_files(host) != baseline:
            stats["host_off_baseline_at_kill"] += 1

        pid = spawn_daemon(cfg, host)  # restart: recovery runs before the socket answers
        try:
            c = AgentClient(cfg.socket, timeout=5)
            st = c.call("status")
            rows = c.call("collect", cursor=0)["rows"]
            stats["spool_rows_kept"] += len(rows)
            c.close()
            ids = [r["id"] for r in rows]
            if ids != sorted(ids):
                return f"trial {i}: spool ids out of order"
            if any("rolled back" in m for m in st["recovered"]):
                stats["recoveries_rolled_back"] += 1
            after = knob_files(host)
        finally:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
        if after != baseline:
            return f"trial {i}: host not at baseline after restart: {after} != {baseline}"
        stats["at_baseline_after_restart"] += 1
        return None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def main() -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--trials", type=int, default=100)
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args()
    rng = random.Random(a.seed)
    keys = [
        "trials",
        "with_deployed_sku",
        "sampling_only",
        "applies_before_kill",
        "killed_idle",
        "killed_mid_write",
        "killed_mid_experiment",
        "host_off_baseline_at_kill",
        "recoveries_rolled_back",
        "spool_rows_kept",
        "at_baseline_after_restart",
    ]
    stats = dict.fromkeys(keys, 0)
    failures = []
    t0 = time.monotonic()
    for i in range(a.trials):
        stats["trials"] += 1
        why = trial(i, rng, stats)
        if why:
            failures.append(why)
    for k in keys:
        print(f"{k:28s} {stats[k]}")
    print(f"{'violations':28s} {len(failures)}")
    print(f"{'seconds':28s} {time.monotonic() - t0:.1f}")
    for f in failures[:10]:
        print("VIOLATION:", f)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
