"""Smoke test of ``bench/agent_fleet.py --quick``: 8 real agent daemons, each behind a real
sshd in a network namespace of its own, driven as a pool through apply / collect / rollback
with the links of 2 hosts cut mid-sweep; and a Ctrl-C in the middle of it, after which no
namespace, sshd or agent is left. Under a minute on an idle machine."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.fixtures.sshd import needs_sshd
from tests.timing import scaled

pytestmark = [
    *needs_sshd,
    pytest.mark.skipif(shutil.which("ip") is None, reason="no iproute2"),
    pytest.mark.slow,
]
BENCH = Path(__file__).resolve().parents[2] / "bench" / "agent_fleet.py"


def _left(prefix: str, tmp: str) -> tuple[list[str], list[int]]:
    """Namespaces named ``prefix*`` and processes of the run still there: its forked agents
    (they keep the bench's command line), its sshds (they name their config under ``tmp``) and
    their sessions and relays (``sshd: root@notty``, ``musku agent rpc --stream``: their
    SSH_CONNECTION names a host address of the run, 10.NET.I.2 port 22, NET from the bench's
    pid as bench/agent_fleet.py picks it)."""
    ns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    net = 150 + int(prefix.removeprefix("mkaf").rstrip("-")) % 50
    session = re.compile(rb"SSH_CONNECTION=\S+ \d+ 10\.%d\.\d+\.2 22\x00" % net)
    procs = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                cmd = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ")
                env = Path(f"/proc/{entry}/environ").read_bytes()
            except OSError:
                continue
            if str(BENCH).encode() in cmd or (tmp and tmp.encode() in cmd) or session.search(env):
                procs.append(int(entry))
    return [n for n in ns.split() if n.startswith(prefix)], procs


def _run_info(out: str) -> tuple[str, str]:
    prefix = re.search(r"namespaces (mkaf\d+-)N", out)
    assert prefix, out
    tmp = re.search(r"cleaned up: .*?, (/\S+)", out)
    return prefix.group(1), tmp.group(1) if tmp else ""


def test_quick_fleet() -> None:
    t0 = time.monotonic()
    run = subprocess.run(
        [sys.executable, str(BENCH), "--quick"],
        capture_output=True,
        text=True,
        timeout=scaled(120),
    )
    took = time.monotonic() - t0
    out = run.stdout
    assert run.returncode == 0, out + run.stderr
    assert "Traceback" not in run.stderr, run.stderr
    # the baseline: one relay process per request against one per host
    exec_line = next(ln for ln in out.splitlines() if "exec per request" in ln)
    stream_line = next(ln for ln in out.splitlines() if "stream channel" in ln)
    assert exec_line.endswith("relay processes per host 6"), exec_line
    assert stream_line.endswith("relay processes per host 1"), stream_line
    ratio = re.search(r"stream/exec: ([\d.]+)x req/s, .* host CPU ([\d.]+)x per request", out)
    assert ratio, out
    assert float(ratio.group(1)) > 1.0 and float(ratio.group(2)) < 1.0, ratio.group(0)
    # the cut: exactly the two cut pairs failed, one line each; everything back at baseline
    failed = out.split("pairs failed, one line each:\n", 1)[1].split("hosts back")[0]
    lines = [ln.strip() for ln in failed.splitlines() if ln.strip()]
    assert sorted(ln.split(":")[0] for ln in lines) == ["h004+h005", "h006+h007"], lines
    assert all("link did not come back" in ln for ln in lines), lines
    assert "hosts back at their baseline: 8/8" in out
    assert re.search(r"wave 2: apply [\d.]+ s, live pairs 2/4", out), out
    prefix, tmp = _run_info(out)
    assert _left(prefix, tmp) == ([], [])
    print(out, f"took {took:.0f} s", sep="\n")  # pytest -s: the figures
    assert took < scaled(60), took


def test_ctrl_c_cleans_up() -> None:
    proc = subprocess.Popen(
        [sys.executable, str(BENCH), "--quick"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    try:
        lines = []
        deadline = time.monotonic() + scaled(60)
        while time.monotonic() < deadline:  # the pool sweep's first wave has been applied
            line = proc.stdout.readline()
            lines.append(line)
            if line.startswith("wave 1") or not line:
                break
        assert lines[-1].startswith("wave 1"), lines
        proc.send_signal(signal.SIGINT)  # mid-sweep: hosts at an arm, windows measuring
        out, err = proc.communicate(timeout=scaled(60))
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    out = "".join(lines) + out
    assert proc.returncode == 130, out + err
    assert "interrupted; cleaning up" in err and "Traceback" not in err, err
    prefix, tmp = _run_info(out)
    assert tmp, out
    assert _left(prefix, tmp) == ([], [])
    assert not Path(tmp).exists()
