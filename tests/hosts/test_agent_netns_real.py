"""The real THP comparison through the path a fleet uses (issue 35, item 5): a real
``musku agent`` on this machine's real root (it owns THP; it holds the real-host lock), reached
by the controller over a real sshd listening inside a network namespace behind a veth pair,
one SSH exec of ``musku agent rpc`` per request. ``bench/agent_local_ab.py --via ssh-netns``
builds all of it; this test runs the bench once (THP madvise -> always, the experiment file's
settings with the default-run test's cap and min_effect) and checks the decision, the
transport and that the host is restored byte for byte.

Skipped with the reason where THP is not writable, or there is no root, iproute2 or sshd, or a
network namespace cannot be created (the bench exits 4 with the reason)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from musku.hostfs import HUGEPAGES_DIR, THP_DIR, HostFS

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "bench" / "agent_local_ab.py"
ENABLED = THP_DIR + "/enabled"
CAP = 120  # as tests/hosts/test_local.py: room for a busy machine's noise
LOCK_WAIT_S = 900  # other real-host tests (and A/A benches) may hold the host for minutes


def _why_not() -> str:
    sys.path.insert(0, str(ROOT / "bench"))
    try:
        from agent_local_ab import SshNetnsAgent
    finally:
        sys.path.pop(0)
    if not os.access(ENABLED, os.W_OK):
        return "THP is not writable here (read-only sysfs, no THP or no root)"
    return SshNetnsAgent.unavailable() or ""


pytestmark = [
    # the restore check reads nr_hugepages; the A/B measures a workload running on this
    # machine's CPUs: a CPU taken offline (hotplug, a cpuset) during it moves the measurement
    pytest.mark.root("thp", "hugepages", "cpus"),
    pytest.mark.slow,
    pytest.mark.skipif(bool(_why_not()), reason=_why_not() or "can run"),
    pytest.mark.timeout(LOCK_WAIT_S + 1500),
]


def _host_bytes() -> dict[str, bytes]:
    fs = HostFS("/")
    paths = [ENABLED, THP_DIR + "/defrag", HUGEPAGES_DIR + "/hugepages-2048kB/nr_hugepages"]
    return {p: fs.read_bytes(p) for p in paths if fs.exists(p)}


def test_thp_comparison_through_the_agent_over_sshd_in_a_netns(tmp_path: Path) -> None:
    out = tmp_path / "runs.jsonl"
    argv = [
        sys.executable,
        str(BENCH),
        "--via",
        "ssh-netns",
        "--knob",
        "thp",
        "--cap",
        str(CAP),
        "--min-effect",
        "0.05",
        "--seed",
        "3",
        "--state-dir",
        str(tmp_path / "state"),
        "--lock-timeout",
        str(LOCK_WAIT_S),
        "--jsonl",
        str(out),
    ]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    r = subprocess.run(argv, capture_output=True, text=True, env=env, cwd=tmp_path)
    if r.returncode == 4:
        pytest.skip(r.stderr.strip())
    # "restored" is the bench's own byte comparison, both reads made while its agent holds
    # the real-host lock (a comparison here, outside the lock, could see another test's THP)
    assert r.returncode == 0, r.stderr[-2000:]
    print(r.stdout)  # the run's line and summary (pytest -rP shows them): figures for the docs
    (row,) = [json.loads(ln) for ln in out.read_text().splitlines()]
    assert row["via"] == "musku agent over sshd in a netns"
    assert (row["A"], row["B"]) == ("thp=madvise", "thp=always")
    assert row["decision"] == "better", row
    assert 0.0 < row["ci_low"] < row["estimate"] < row["ci_high"]
    assert row["windows"] <= CAP and row["switches"] >= 2 * row["windows"]
    assert row["restored"] is True
    assert "restored" in r.stdout and "NOT RESTORED" not in r.stdout
    # the requests crossed the veth into the namespace: an SSH link to its address
    t = row["transport"]
    assert t["link"] == "SshLink" and t["address"].startswith("10.") and t["port"] == 2222
    # nothing of the transport is left: the namespace, the agent
    netns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert t["netns"] not in netns.split()
    with pytest.raises(ProcessLookupError):
        os.kill(t["agent_pid"], 0)
