"""agents/musku-agent.service (issue 29, item 7): the unit verifies, its `systemd-analyze
security` exposure is at most 3.5, and the agent works under the same sandbox.

This machine may not run systemd as PID 1 (then `systemd-run -p ...` cannot start a unit), so
the sandbox is rebuilt from the unit's own lines with the kernel's tools: a private mount
namespace where / is read-only and only the agent's directories (its state, socket and host
root, standing for StateDirectory, RuntimeDirectory and the /sys, /proc knobs that
ProtectSystem=strict leaves writable) are writable (`ProtectSystem=strict` +
`ReadWritePaths=`); the unit's `CapabilityBoundingSet=` and `NoNewPrivileges=` (setpriv); and
its `SystemCallFilter=`, checked by tracing every system call the agent makes (strace) while
it starts, applies a knob, rolls it back and stops, against the allow-list systemd builds from
the same lines (`systemd-analyze syscall-filter`).
"""

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

from tests.agent.helpers import SHP, fake_host
from tests.timing import scaled

ROOT = Path(__file__).resolve().parents[2]
UNIT = ROOT / "agents" / "musku-agent.service"
MAX_EXPOSURE = 3.5

needs_systemd_analyze = pytest.mark.skipif(
    shutil.which("systemd-analyze") is None, reason="systemd-analyze not installed"
)


def unit_lines() -> dict[str, list[str]]:
    """The unit's ``Key=value`` lines (a key may repeat)."""
    out: dict[str, list[str]] = {}
    for line in UNIT.read_text().splitlines():
        if "=" in line and not line.lstrip().startswith(("#", ";", "[")):
            key, _, value = line.partition("=")
            out.setdefault(key.strip(), []).append(value.strip())
    return out


def exposure(unit: Path) -> float:
    p = subprocess.run(
        ["systemd-analyze", "security", "--offline=yes", "--no-pager", str(unit)],
        capture_output=True,
        text=True,
        timeout=scaled(120),
        check=False,
    )
    m = re.search(r"Overall exposure level for \S+: ([0-9.]+)", p.stdout)
    assert m, p.stdout[-2000:] + p.stderr[-2000:]
    return float(m.group(1))


@needs_systemd_analyze
def test_the_unit_verifies(tmp_path: Path) -> None:
    # ExecStart names the installed musku; point it at this checkout's interpreter
    text = UNIT.read_text().replace(
        "ExecStart=/usr/local/bin/musku", f"ExecStart={sys.executable} -m musku"
    )
    unit = tmp_path / "musku-agent.service"
    unit.write_text(text)
    p = subprocess.run(["systemd-analyze", "verify", str(unit)], capture_output=True, text=True,
                       timeout=scaled(120), check=False)  # fmt: skip
    own = [ln for ln in p.stderr.splitlines() if "musku-agent.service" in ln]
    assert p.returncode == 0 and not own, p.stderr


@needs_systemd_analyze
def test_exposure_is_at_most_3_5() -> None:
    assert exposure(UNIT) <= MAX_EXPOSURE


@needs_systemd_analyze
def test_the_unit_keeps_what_the_agent_needs() -> None:
    lines = unit_lines()
    caps = " ".join(lines["CapabilityBoundingSet"]).split()
    assert {"CAP_SYS_RAWIO", "CAP_SYS_ADMIN", "CAP_DAC_OVERRIDE"} <= set(caps)
    assert lines["ProtectKernelTunables"] == ["no"]  # it writes /sys and /proc/sys knobs
    assert lines["ProtectControlGroups"] == ["no"]  # core_count's live method: cpusets
    rw = " ".join(lines["ReadWritePaths"]).split()
    for path in ("/etc/default", "/boot/grub", "/proc/sys/vm", "/sys/devices/system/cpu"):
        assert f"-{path}" in rw, path  # core_count's isolcpus method: grub and update-grub
    assert lines["ProtectSystem"] == ["strict"]
    assert "perf_event_open" in " ".join(lines["SystemCallFilter"])


def _groups() -> dict[str, list[str]]:
    p = subprocess.run(["systemd-analyze", "syscall-filter", "--no-pager"], capture_output=True,
                       text=True, timeout=scaled(60), check=True)  # fmt: skip
    groups: dict[str, list[str]] = {}
    current: list[str] | None = None
    for line in p.stdout.splitlines():
        if line.startswith("@"):
            current = groups.setdefault(line.split()[0], [])
        elif current is not None and line.strip() and not line.strip().startswith("#"):
            current.append(line.split()[0])
    return groups


def _expand(names: list[str], groups: dict[str, list[str]]) -> set[str]:
    out: set[str] = set()
    stack = list(names)
    while stack:
        n = stack.pop()
        if n.startswith("@"):
            stack.extend(groups.get(n, []))
        else:
            out.add(n)
    return out


def allowed_syscalls() -> set[str]:
    """The allow-list systemd builds from the unit's SystemCallFilter= lines (in order: an
    allow line adds, a ``~`` line removes), plus what systemd itself always allows."""
    groups = _groups()
    allowed: set[str] = set()
    for value in unit_lines()["SystemCallFilter"]:
        if value.startswith("~"):
            allowed -= _expand(value[1:].split(), groups)
        else:
            allowed |= _expand(value.split(), groups)
    return allowed | _expand(["@default"], groups)


def _strace_calls(path: Path) -> set[str]:
    calls: set[str] = set()
    for line in path.read_text().splitlines():
        parts = line.split()
        if len(parts) >= 5 and parts[0][0].isdigit() and parts[-1] != "total":
            calls.add(parts[-1])
    return calls


@needs_systemd_analyze
@pytest.mark.skipif(os.geteuid() != 0, reason="needs root (mount namespace, capabilities)")
@pytest.mark.skipif(
    not all(shutil.which(t) for t in ("unshare", "setpriv", "strace", "mount")),
    reason="needs unshare, setpriv, strace and mount",
)
def test_the_agent_works_inside_the_sandbox(tmp_path: Path) -> None:
    import psutil

    from musku.agent.client import AgentClient

    lines = unit_lines()
    caps = " ".join(lines["CapabilityBoundingSet"]).split()
    bounding = ",".join(["-all"] + ["+" + c.removeprefix("CAP_").lower() for c in caps])
    host = fake_host(tmp_path / "host")
    (tmp_path / "run").mkdir()
    (tmp_path / "outside").write_text("before\n")
    cfg = tmp_path / "agent.toml"
    cfg.write_text(
        f'[agent]\nroot = "{tmp_path / "host"}"\nstate_dir = "{tmp_path / "state"}"\n'
        f'socket = "{tmp_path / "run" / "agent.sock"}"\nsample_interval_s = 0.05\n\n'
        '[samplers.perf]\nscope = "system"\n'
    )
    trace = tmp_path / "strace.txt"
    probe = Path("/etc/musku-sandbox-probe")
    script = (
        "set -e; mount --make-rprivate /; "
        f"mount --bind {tmp_path} {tmp_path}; mount -o remount,bind,ro /; "
        # ProtectSystem=strict: /etc is read-only in here
        f"if touch {probe} 2>/dev/null; then echo 'ETC WRITABLE'; exit 9; fi; "
        f"cd {ROOT}; exec setpriv --bounding-set={bounding} --no-new-privs "
        f"strace -f -qq -c -o {trace} {sys.executable} -m musku agent run --config {cfg}"
    )
    proc = subprocess.Popen(["unshare", "--mount", "sh", "-c", script],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)  # fmt: skip
    sock = tmp_path / "run" / "agent.sock"
    try:
        deadline = time.monotonic() + scaled(60)
        while not sock.exists():
            assert proc.poll() is None, proc.communicate()[0][-3000:]
            assert time.monotonic() < deadline, "the agent did not start in the sandbox"
            time.sleep(0.1)
        c = AgentClient(sock, timeout=scaled(20))
        try:
            assert c.call("hello")["protocol"] >= 1
            before = host.read(SHP)
            reply = c.call("apply", config={"shp": 64}, lease_s=60, experiment="sandbox")
            assert reply["changed"] == ["shp"] and host.read(SHP).strip() == "64"
            c.call("rollback")
            assert host.read(SHP) == before
        finally:
            c.close()
        agents = [p for p in psutil.Process(proc.pid).children(recursive=True)
                  if "agent" in p.cmdline() and "strace" not in p.name()]  # fmt: skip
        assert len(agents) == 1
        caps_line = Path(f"/proc/{agents[0].pid}/status").read_text()
        assert "NoNewPrivs:\t1" in caps_line
        agents[0].send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=scaled(60))
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, out[-3000:]
    assert not probe.exists()
    used = _strace_calls(trace)
    assert {"openat", "write", "epoll_wait"} <= used  # the trace is the agent's
    outside = used - allowed_syscalls()
    assert not outside, f"system calls outside the unit's SystemCallFilter: {sorted(outside)}"
