"""Reboot-mode core_count through the agent (musku/agent/reboot.py), in process: the agent
writes GRUB, journals the pending reboot, runs a real hook; a new Agent on the same state
directory plays the rebooted host."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from musku.agent.config import parse_config
from musku.agent.core import Agent
from musku.agent.journal import TxKind
from musku.errors import InputError
from musku.hostfs import GRUB_DEFAULT, PROC_CMDLINE
from musku.testing.fakehost import FakeHost, vm_host
from tests.agent.helpers import THP, config, fs_of
from tests.agent.reboot_hook import hook_argv, reboots, write_hook

CMDLINE = "BOOT_IMAGE=/boot/vmlinuz root=/dev/vda ro console=ttyS0"


def _host(root: Path) -> FakeHost:
    return vm_host(root).grub("console=ttyS0").cmdline(CMDLINE)  # 2 cores: cpu0, cpu1


def _agent(tmp: Path, host: FakeHost, mode: str = "boot", **over: Any) -> Agent:
    hook = write_hook(tmp / "hook")
    over.setdefault("reboot_hook", tuple(hook_argv(hook, host.root, tmp / "marker", mode)))
    over.setdefault("reboot_delay_s", 0.0)
    agent = Agent(config(tmp, root=str(host.root), **over), fs=fs_of(host))
    agent.recover()
    return agent


def _reboot(tmp: Path, host: FakeHost, agent: Agent, mode: str = "boot", **over: Any) -> Agent:
    """The host goes down (the agent stops as systemd stops it) and a new agent starts."""
    agent.close()
    return _agent(tmp, host, mode, **over)


def _ok(reply: dict[str, Any]) -> Any:
    assert reply["ok"], reply
    return reply["result"]


def _hook_done(agent: Agent) -> None:
    """The hook runs in a thread after the apply's reply: wait for it."""
    assert agent.reboot_thread is not None
    agent.reboot_thread.join(timeout=60)
    assert not agent.reboot_thread.is_alive()


def test_apply_reboots_and_the_new_boot_is_verified(tmp_path: Path) -> None:
    host = _host(tmp_path / "host")
    grub_before = host.read(GRUB_DEFAULT)
    agent = _agent(tmp_path, host)
    res = _ok(agent.handle({"op": "apply", "config": {"core_count": 1, "thp": "never"}}))
    assert res["rebooting"] and res["reboot"]["expect"] == "console=ttyS0 isolcpus=1"
    assert 'GRUB_CMDLINE_LINUX="console=ttyS0 isolcpus=1"' in host.read(GRUB_DEFAULT)
    assert host.p(GRUB_DEFAULT + ".musku.bak").read_text() == grub_before
    _hook_done(agent)
    assert reboots(tmp_path / "marker") == 1
    # journaled before the hook ran, so the reboot cannot lose it
    assert agent.journal.tx_info()["reboot"]["state"] == "pending"
    st = _ok(agent.handle({"op": "status"}))
    assert st["reboot"]["state"] == "pending" and st["lease_remaining_s"] is None
    # nothing else is applied on top of a pending reboot
    late = agent.handle({"op": "apply", "config": {"thp": "always"}})
    assert not late["ok"] and "is rebooting into the last apply" in late["error"]["message"]
    assert "[never]" in host.read(THP)
    agent = _reboot(tmp_path, host, agent)  # stopping for a pending reboot keeps the experiment
    assert "isolcpus=1" in host.read(PROC_CMDLINE)
    st = _ok(agent.handle({"op": "status"}))
    assert st["reboot"]["state"] == "verified", st
    assert st["expected"] == {"core_count": 1, "thp": "never"}
    assert st["lease_remaining_s"] is not None and "[never]" in host.read(THP)
    assert agent.knob("core_count").read() == 1
    _ok(agent.handle({"op": "renew", "lease_s": 30}))
    # the experiment ends: GRUB (and thp) come back; the next boot returns to all cores
    _ok(agent.handle({"op": "rollback"}))
    assert host.read(GRUB_DEFAULT) == grub_before and "[never]" not in host.read(THP)
    # the kernel still runs isolcpus=1: asking for both cores again needs a reboot, although
    # GRUB already says so
    assert agent.knob("core_count").read() == 1
    res = _ok(agent.handle({"op": "apply", "config": {"core_count": 2}}))
    assert res["rebooting"] and res["changed"] == [] and res["reboot"]["expect"] == "console=ttyS0"
    _hook_done(agent)
    agent = _reboot(tmp_path, host, agent)
    st = _ok(agent.handle({"op": "status"}))
    assert st["reboot"]["state"] == "verified" and st["expected"] == {"core_count": 2}
    _ok(agent.handle({"op": "renew", "lease_s": 30}))  # the experiment goes on
    assert agent.knob("core_count").read() == 2 and "isolcpus" not in host.read(PROC_CMDLINE)
    assert reboots(tmp_path / "marker") == 2
    agent.close()


def test_failing_hook_rolls_back_everything(tmp_path: Path) -> None:
    host = _host(tmp_path / "host")
    grub, thp = host.read(GRUB_DEFAULT), host.read(THP)
    agent = _agent(tmp_path, host, "fail")
    assert _ok(agent.handle({"op": "apply", "config": {"core_count": 1, "thp": "never"}}))[
        "rebooting"
    ]
    _hook_done(agent)
    st = _ok(agent.handle({"op": "status"}))
    msg = st["reboot"]["message"]
    assert st["reboot"]["state"] == "failed" and st["experiment"] == ""
    assert "exited 1: Failed to reboot: access denied; rolled back 2 write(s)" in msg, msg
    assert "\n" not in msg
    assert host.read(GRUB_DEFAULT) == grub and host.read(THP) == thp
    assert agent.journal.open_tx() is None
    agent.close()


def test_no_hook_configured_is_refused_and_rolled_back(tmp_path: Path) -> None:
    host = _host(tmp_path / "host")
    grub = host.read(GRUB_DEFAULT)
    agent = _agent(tmp_path, host, reboot_hook=())
    reply = agent.handle({"op": "apply", "config": {"core_count": 1}})
    assert not reply["ok"] and "no [agent] reboot_hook" in reply["error"]["message"]
    assert host.read(GRUB_DEFAULT) == grub and agent.journal.open_tx() is None
    agent.close()


@pytest.mark.parametrize("again", [False, True])
def test_boot_without_the_new_cmdline_is_rolled_back(tmp_path: Path, again: bool) -> None:
    host = _host(tmp_path / "host")
    grub, thp = host.read(GRUB_DEFAULT), host.read(THP)
    agent = _agent(tmp_path, host, "stay", reboot_after_rollback=again)
    assert _ok(agent.handle({"op": "apply", "config": {"core_count": 1, "thp": "never"}}))[
        "rebooting"
    ]
    _hook_done(agent)
    # before the boot: core_count waits for it, which is not an outside change
    agent.sample_once()
    rows, _ = agent.spool.collect(0, 100)
    assert rows and rows[-1].valid and rows[-1].note == ""
    agent = _reboot(tmp_path, host, agent, "stay", reboot_after_rollback=again)
    st = _ok(agent.handle({"op": "status"}))
    assert st["reboot"]["state"] == "failed" and st["experiment"] == ""
    assert "booted without isolcpus=1 on the kernel command line" in st["reboot"]["message"]
    assert host.read(GRUB_DEFAULT) == grub and host.read(THP) == thp
    assert agent.journal.open_tx() is None
    # the restored command line is booted by another reboot only when configured
    assert reboots(tmp_path / "marker") == (2 if again else 1)
    agent.close()


def test_crash_before_reboot_keeps_the_pending_record(tmp_path: Path) -> None:
    """The agent dies (no close) after the hook: the new start still finds the record."""
    host = _host(tmp_path / "host")
    agent = _agent(tmp_path, host)
    _ok(agent.handle({"op": "apply", "config": {"core_count": 1}}))
    _hook_done(agent)
    agent.journal.close()  # a SIGKILL: nothing is cleaned up
    agent = _agent(tmp_path, host)
    assert agent.journal.open_tx() is TxKind.EXPERIMENT
    assert agent.reboot_status["state"] == "verified" and agent.expected == {"core_count": 1}
    agent.close()


@pytest.mark.parametrize(
    ("agent", "message"),
    [
        ({"reboot_hook": "systemctl reboot"}, "reboot_hook must be a command as a list of strings"),
        ({"reboot_hook": ["systemctl", ""]}, "reboot_hook must be a command as a list of strings"),
        ({"reboot_hook_timeout_s": 0}, "reboot_hook_timeout_s must be between 1 and 3600"),
        ({"reboot_after_rollback": "yes"}, "reboot_after_rollback must be true or false"),
    ],
)
def test_bad_reboot_settings_are_one_line(agent: dict[str, Any], message: str) -> None:
    with pytest.raises(InputError) as err:
        parse_config({"agent": agent})
    assert message in err.value.one_line() and "\n" not in err.value.one_line()
    assert err.value.status == 3


def test_reboot_settings_parse() -> None:
    cfg = parse_config({"agent": {"reboot_hook": ["systemctl", "reboot"], "reboot_delay_s": 0}})
    assert cfg.reboot_hook == ("systemctl", "reboot") and cfg.reboot_delay_s == 0.0
    assert not cfg.reboot_after_rollback and cfg.reboot_hook_timeout_s == 120.0


def test_rollback_while_waiting_for_the_reboot(tmp_path: Path) -> None:
    """The hook ran but the host never went down: the controller gives up and rolls back."""
    host = _host(tmp_path / "host")
    grub = host.read(GRUB_DEFAULT)
    agent = _agent(tmp_path, host, "stay")
    _ok(agent.handle({"op": "apply", "config": {"core_count": 1}}))
    _hook_done(agent)
    assert _ok(agent.handle({"op": "status"}))["reboot"]["state"] == "pending"
    assert _ok(agent.handle({"op": "rollback"}))["rolled_back"] == 1
    st = _ok(agent.handle({"op": "status"}))["reboot"]
    assert st["state"] == "failed" and st["message"] == "rolled back before the reboot"
    assert host.read(GRUB_DEFAULT) == grub
    agent.close()


@pytest.mark.parametrize("bad", [0, "15m", True, 1e9])
def test_bad_reboot_timeout_is_one_line(bad: object) -> None:
    from musku.schema.hosts import AgentOptions, parse_options

    opts = {"backend": "agent", "hosts": ["a", "b"], "reboot_timeout_s": bad}
    with pytest.raises(InputError) as err:
        parse_options(AgentOptions, opts)
    assert err.value.one_line() == "[hosts] reboot_timeout_s must be a number in [1, 86400]"
    assert err.value.status == 3
    assert parse_options(AgentOptions, {**opts, "reboot_timeout_s": 600}).reboot_timeout_s == 600


def test_offline_rollback_never_reboots(tmp_path: Path) -> None:
    """``musku agent rollback`` with the daemon stopped settles a pending reboot without
    running the hook, even with reboot_after_rollback."""
    import json

    from musku.agent.cli import _offline_rollback

    host = _host(tmp_path / "host")
    grub = host.read(GRUB_DEFAULT)
    agent = _agent(tmp_path, host, "stay", reboot_after_rollback=True)
    _ok(agent.handle({"op": "apply", "config": {"core_count": 1}}))
    _hook_done(agent)
    argv = list(agent.config.reboot_hook)
    agent.close()  # stopped for the reboot, which booted the old command line
    path = tmp_path / "agent.toml"
    path.write_text(
        "[agent]\n"
        f"root = {json.dumps(str(host.root))}\n"
        f"state_dir = {json.dumps(str(tmp_path / 'state'))}\n"
        f"socket = {json.dumps(str(tmp_path / 'agent.sock'))}\n"
        f"reboot_hook = {json.dumps(argv)}\n"
        "reboot_after_rollback = true\n"
    )
    result = _offline_rollback(path, False)
    assert any("reboot not verified" in line for line in result["recovered"]), result
    assert host.read(GRUB_DEFAULT) == grub
    assert reboots(tmp_path / "marker") == 1  # only the experiment's reboot
