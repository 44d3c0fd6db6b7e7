"""The built-in workload: real memory work, musku-stats/1 output the service sampler reads, and
an arena rebuilt when the host's THP mode changes (fake host tree for the mode)."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest

from musku.errors import InputError
from musku.hostfs import HostFS
from musku.metrics import load_sampler
from musku.workload import Workload, WorkloadOptions
from tests.agent.helpers import THP, fake_host, fs_of
from tests.timing import wait_for


def test_workload_reports_and_follows_thp(tmp_path: Path) -> None:
    host = fake_host(tmp_path / "host")
    stats = tmp_path / "stats.json"
    w = Workload(
        WorkloadOptions(stats_file=stats, arena_mib=8, batch=4096, watch_interval_s=0.05),
        fs_of(host),
    )
    t = threading.Thread(target=w.run)
    t.start()
    try:
        wait_for(stats.exists, 10, what="the first stats file")
        s = load_sampler("service", HostFS(tmp_path), stats_file=str(stats))
        s.start()
        # the first reading that advanced (0.1 s apart idle; later when the machine is busy)
        m = wait_for(s.sample, 5, poll=0.3, what="the stats file to advance")
        assert isinstance(m, dict)
        assert m["ops"] > 1e5 and m["qps"] > 10  # real work: >100k random reads per second
        assert 0 < m["p50_ms"] <= m["p99_ms"] < 1000
        assert w.rebuilds == 1 and w.state[0] == "madvise"
        switched = time.time()
        fs_of(host).write_text(THP, "never")
        wait_for(lambda: w.rebuilds >= 2, 5, what="the arena rebuilt")
        assert w.rebuilds == 2 and w.state[0] == "never"

        # and it says so in its stats file (a switchback controller waits for this: a look
        # that began after its switch; the rebuild may come from a look that began just
        # before the write and read the new value, which is why the controller waits)
        def rebuilt() -> dict | None:
            arena = json.loads(stats.read_text())["arena"]
            return arena if arena["rebuilds"] >= 2 and arena["checked"] >= switched else None

        arena = wait_for(rebuilt, 5, what="the stats file to show the rebuild")
        assert isinstance(arena, dict) and arena["thp"] == "never" and arena["rebuilds"] == 2
    finally:
        w.stop = True
        t.join()
        w.close()


def test_workload_options_validated(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="arena_mib"):
        WorkloadOptions(stats_file=tmp_path / "s", arena_mib=1)
