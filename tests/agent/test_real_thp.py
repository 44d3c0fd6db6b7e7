"""The agent on this machine's REAL transparent huge pages (restored afterwards)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from musku.agent.config import AgentConfig
from musku.agent.core import Agent
from musku.hostfs import THP_DIR, HostFS

ENABLED, DEFRAG = THP_DIR + "/enabled", THP_DIR + "/defrag"
pytestmark = [
    pytest.mark.root("thp"),
    pytest.mark.skipif(os.geteuid() != 0, reason="needs root"),
    pytest.mark.skipif(not HostFS("/").exists(ENABLED), reason="no THP on this kernel"),
]


@pytest.fixture
def real() -> Iterator[HostFS]:
    from tests.agent.helpers import wait_for_real_host

    lock = wait_for_real_host()
    fs = HostFS("/")
    before = (fs.read_bytes(ENABLED), fs.read_bytes(DEFRAG))
    yield fs
    for path, data in zip((ENABLED, DEFRAG), before, strict=True):
        if fs.read_bytes(path) != data:
            fs.write_text(path, data.decode().split("[")[1].split("]")[0])
    lock.release()


def test_apply_verify_drift_rollback_on_real_thp(tmp_path: Path, real: HostFS) -> None:
    before = (real.read_bytes(ENABLED), real.read_bytes(DEFRAG))
    current = before[0].decode().split("[")[1].split("]")[0]
    target = "never" if current != "never" else "always"
    agent = Agent(AgentConfig(state_dir=tmp_path / "state", socket=tmp_path / "s", samplers={}))
    try:
        agent.recover()
        r = agent.handle({"op": "apply", "config": {"thp": target}, "lease_s": 60})
        assert r["ok"], r
        assert f"[{target}]".encode() in real.read_bytes(ENABLED)
        agent.sample_once()
        real.write_text(ENABLED, current)  # an outside change
        agent.sample_once()
        rows = agent.handle({"op": "collect", "cursor": 0})["result"]["rows"]
        assert [row["valid"] for row in rows] == [True, False]
        assert agent.handle({"op": "rollback"})["ok"]
        assert (real.read_bytes(ENABLED), real.read_bytes(DEFRAG)) == before
    finally:
        agent.close()
