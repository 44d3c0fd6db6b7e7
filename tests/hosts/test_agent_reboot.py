"""Reboot-mode core_count end to end: a controller (AgentPair) and two real agent daemons on
fake roots, each with a real reboot hook (tests/agent/reboot_hook.py). The test is the power
switch: when a hook has run, it stops that agent process (SIGTERM as systemd does on a
reboot, or SIGKILL as a power cut) and starts a new one on the same state, as the booted host
would; the controller waits for it, checks the verified boot and goes on."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from musku.domain import Configuration
from musku.errors import HostError
from musku.hostfs import GRUB_DEFAULT, PROC_CMDLINE
from musku.hosts.agent import AgentHost, AgentPair, SocketLink
from musku.testing.fakehost import FakeHost, vm_host
from tests.agent.helpers import THP, config, spawn_daemon
from tests.agent.reboot_hook import hook_argv, reboots, write_hook

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root")

CONNECT_S = 2.0
CMDLINE = "BOOT_IMAGE=/boot/vmlinuz root=/dev/vda ro console=ttyS0"


class Fleet:
    """Two fake hosts, their agent daemons, and the power switch."""

    def __init__(self, tmp: Path, modes: tuple[str, str], *, come_back: tuple[bool, bool]) -> None:
        hook = write_hook(tmp / "hook")
        self.hosts: list[FakeHost] = []
        self.cfgs: list[Any] = []
        self.pids: list[int] = []
        self.markers: list[Path] = []
        self.come_back = come_back
        for i, name in enumerate("ab"):
            host = vm_host(tmp / name / "host").grub("console=ttyS0").cmdline(CMDLINE)
            marker = tmp / name / "marker"
            cfg = config(
                tmp / name,
                reboot_hook=tuple(hook_argv(hook, host.root, marker, modes[i])),
            )
            self.hosts.append(host)
            self.cfgs.append(cfg)
            self.markers.append(marker)
            self.pids.append(spawn_daemon(cfg, host))
        self.before = [self.state(i) for i in (0, 1)]

    def state(self, i: int) -> tuple[str, str, str]:
        h = self.hosts[i]
        return h.read(GRUB_DEFAULT), h.read(THP), h.read(PROC_CMDLINE)

    def pair(self, reboot_timeout_s: float = 60.0) -> AgentPair:
        # a host that is down answers nothing: each call gives up after connect_timeout
        hosts = (
            AgentHost("a", SocketLink(self.cfgs[0].socket, connect_timeout=CONNECT_S)),
            AgentHost("b", SocketLink(self.cfgs[1].socket, connect_timeout=CONNECT_S)),
        )
        return AgentPair(hosts, lease_s=5.0, name="t", reboot_timeout_s=reboot_timeout_s)

    def stop(self, i: int, sig: int = signal.SIGTERM) -> None:
        try:
            os.kill(self.pids[i], sig)
            os.waitpid(self.pids[i], 0)
        except (ChildProcessError, ProcessLookupError):
            pass

    def restart(self, i: int) -> None:
        self.pids[i] = spawn_daemon(self.cfgs[i], self.hosts[i])

    def power_switch(self, work: Any, timeout: float = 120.0) -> Any:
        """Run ``work()`` in a thread; each time a host's hook has run, stop its agent and (if
        it comes back) start it again. Returns what ``work`` returned or raises what it
        raised."""
        out: dict[str, Any] = {}

        def run() -> None:
            try:
                out["result"] = work()
            except BaseException as exc:  # noqa: BLE001 - handed to the test thread
                out["error"] = exc

        t = threading.Thread(target=run)
        seen = [reboots(m) for m in self.markers]
        t.start()
        deadline = time.monotonic() + timeout
        while t.is_alive() and time.monotonic() < deadline:
            for i in (0, 1):
                n = reboots(self.markers[i])
                if n > seen[i]:
                    seen[i] = n
                    self.stop(i, signal.SIGTERM if i == 0 else signal.SIGKILL)
                    if self.come_back[i]:
                        self.restart(i)
            t.join(0.05)
        t.join(timeout=1)
        assert not t.is_alive(), "the controller did not finish"
        if "error" in out:
            raise out["error"]
        return out.get("result")

    def close(self) -> None:
        for i in (0, 1):
            self.stop(i)


def test_two_hosts_reboot_come_back_and_the_comparison_goes_on(tmp_path: Path) -> None:
    fleet = Fleet(tmp_path, ("boot", "boot"), come_back=(True, True))
    pair = fleet.pair()
    try:
        a = Configuration.of({"core_count": 1, "thp": "never"})
        b = Configuration.of({"core_count": 1, "thp": "always"})
        seconds = fleet.power_switch(lambda: pair.apply((a, b)))
        assert [reboots(m) for m in fleet.markers] == [1, 1]
        for h in fleet.hosts:
            assert "isolcpus=1" in h.read(PROC_CMDLINE)
            assert h.read("/sys/devices/system/cpu/isolated").strip() == "1"
        assert "[never]" in fleet.hosts[0].read(THP) and "[always]" in fleet.hosts[1].read(THP)
        # the reboot is host time: the apply's seconds include the wait for both hosts
        status = [h.link.call("status") for h in pair.hosts]
        assert all(s["reboot"]["state"] == "verified" for s in status)
        assert seconds >= max(s["reboot"]["verified_at"] - s["reboot"]["at"] for s in status)
        assert [s["expected"] for s in status] == [a.as_dict(), b.as_dict()]
        # what an SRE sees on the host
        out = subprocess.run(
            [
                sys.executable,
                "-m",
                "musku",
                "agent",
                "status",
                "--socket",
                str(fleet.cfgs[0].socket),
            ],
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        ).stdout
        assert "reboot:      verified: expect cmdline 'console=ttyS0 isolcpus=1'" in out, out
        assert "recovered:   reboot verified: the kernel booted 'console=ttyS0 isolcpus=1'" in out
        # the comparison goes on: windows on the new boot, then the arms swap (no reboot)
        for _ in range(2):
            sa, sb = pair.window(0.3)
            assert sa.valid and sb.valid, (sa.note, sb.note)
        time.sleep(pair.lease_s / 3 + 0.5)  # the lease keeper renews on the rebooted agents
        pair.apply((b, a))
        assert "[never]" in fleet.hosts[1].read(THP) and "[always]" in fleet.hosts[0].read(THP)
        sa, sb = pair.window(0.3)
        assert sa.valid and sb.valid, (sa.note, sb.note)
        pair.restore()
        # GRUB and thp restored; the command line is what the hosts booted until they reboot
        for i in (0, 1):
            grub, thp, _ = fleet.state(i)
            assert (grub, thp) == fleet.before[i][:2]
    finally:
        pair.close()
        fleet.close()


def test_failing_hook_fails_the_host_and_restores_both(tmp_path: Path) -> None:
    fleet = Fleet(tmp_path, ("boot", "fail"), come_back=(True, True))
    pair = fleet.pair()
    try:
        cfg = Configuration.of({"core_count": 1, "thp": "never"})
        with pytest.raises(HostError) as err:
            fleet.power_switch(lambda: pair.apply((cfg, cfg)))
        msg = err.value.one_line()
        assert "exited 1: Failed to reboot: access denied" in msg, msg
        assert "both hosts rolled back" in msg and err.value.status == 6
        assert fleet.state(1) == fleet.before[1]  # host b: GRUB and thp restored
        # host a rebooted into isolcpus=1 and was then rolled back: GRUB and thp restored
        assert fleet.state(0)[:2] == fleet.before[0][:2]
    finally:
        pair.close()
        fleet.close()


def test_host_that_does_not_come_back_in_time(tmp_path: Path) -> None:
    fleet = Fleet(tmp_path, ("boot", "stay"), come_back=(True, False))
    pair = fleet.pair(reboot_timeout_s=3.0)
    try:
        cfg = Configuration.of({"core_count": 1, "thp": "never"})
        t0 = time.monotonic()
        with pytest.raises(HostError) as err:
            fleet.power_switch(lambda: pair.apply((cfg, cfg)))
        msg = err.value.one_line()
        assert "b: did not come back from its reboot within 3s" in msg, msg
        assert err.value.status == 6  # docs/cli.md: host/agent
        # bounded: the timeout, plus at most one connection attempt, plus the rollbacks
        assert "both hosts rolled back" in msg and time.monotonic() - t0 < 3.0 + 4 * CONNECT_S + 20
        assert fleet.state(0)[:2] == fleet.before[0][:2]  # the host that came back: restored
        # host b comes back later, on the old command line: its agent rolls GRUB back at start
        fleet.restart(1)
        assert fleet.state(1) == fleet.before[1]
        st = pair.hosts[1].link.call("status")
        assert (
            st["reboot"]["state"] == "failed"
            and "booted without isolcpus=1" in (st["reboot"]["message"])
        )
    finally:
        pair.close()
        fleet.close()


def test_boot_without_the_new_cmdline_is_rolled_back(tmp_path: Path) -> None:
    fleet = Fleet(tmp_path, ("stay", "boot"), come_back=(True, True))
    pair = fleet.pair()
    try:
        cfg = Configuration.of({"core_count": 1})
        with pytest.raises(HostError) as err:
            fleet.power_switch(lambda: pair.apply((cfg, cfg)))
        msg = err.value.one_line()
        assert "a: reboot not verified (booted without isolcpus=1" in msg, msg
        assert fleet.state(0) == fleet.before[0]
        assert fleet.state(1)[:2] == fleet.before[1][:2]
    finally:
        pair.close()
        fleet.close()
