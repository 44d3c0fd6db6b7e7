"""Reboot-mode knobs through the agent (docs/agent.md "Reboots").

A knob whose new value only takes effect at the next boot (``core_count`` in reboot mode: the
``isolcpus=`` word of ``GRUB_CMDLINE_LINUX`` in ``/etc/default/grub``) has been written by the
knob itself: atomically (temporary file + rename), with a backup, and the configured update
command (``update-grub``) run; its snapshot is journaled like any other step, so a rollback
restores the old file and regenerates the boot configuration.

The agent then:

1. journals, in the open experiment's transaction, ``reboot = {state: "pending", expect:
   CMDLINE, knobs: {...}, lease_s}`` (fsync'd: the reboot itself, or a crash, cannot lose it);
2. answers the apply with ``rebooting: true`` and the record (the controller then polls
   ``status``);
3. ``reboot_delay_s`` later (so that the reply reaches the controller before the host goes
   down), runs the configured hook (``[agent] reboot_hook``, an argv list, no shell). A hook
   that cannot start, exits non-zero or outlives ``reboot_hook_timeout_s`` rolls the
   experiment back (the GRUB backup is restored) and ``status`` reports ``reboot.state =
   "failed"`` with one line. Without a hook configured the apply is refused and rolled back.

At the next start, :func:`resume` finds the pending reboot: every word of the expected command
line must be in ``/proc/cmdline`` (under the host root) and every knob must read back its
value. Then the experiment goes on (its lease restarts) and ``status`` reports ``reboot.state
= "verified"``; otherwise the experiment is rolled back (GRUB restored and regenerated), the
hook is run once more when ``reboot_after_rollback`` is set (to boot the restored command
line), and ``status`` reports ``reboot.state = "failed"`` with one line that says why.
"""

from __future__ import annotations

import json
import logging
import os
import shlex
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from musku.agent.journal import TxKind
from musku.errors import HostError, MuskuError
from musku.hostfs import GRUB_DEFAULT, PROC_CMDLINE, HostFS
from musku.knobs.base import Knob
from musku.knobs.core_count import parse_grub_cmdline

if TYPE_CHECKING:
    from musku.agent.config import AgentConfig
    from musku.agent.journal import Journal
    from musku.domain import Value


class Agent(Protocol):
    """What a reboot needs of the agent (musku.agent.core.Agent, which calls this module)."""

    config: AgentConfig
    fs: HostFS
    journal: Journal
    lock: Any
    experiment: dict[str, Any]
    blocked: str
    lease_deadline: float | None
    lease_s: float
    reboot_pending: dict[str, Value]
    reboot_status: dict[str, Any]
    reboot_thread: threading.Thread | None
    _clock: Callable[[], float]

    def knob(self, name: str) -> Knob: ...

    def _undo(self, after: int = 0) -> int: ...

    def _rollback_experiment(self, reason: str) -> int: ...


log = logging.getLogger("musku.agent")

KEY = "reboot"  # the key of the open transaction's info that holds a pending reboot
PENDING, VERIFIED, FAILED = "pending", "verified", "failed"


def needs_reboot(knob: Knob) -> bool:
    """The knob's written value waits for a reboot (the boot configuration differs from what
    the kernel booted)."""
    pending = getattr(knob, "pending_reboot", None)
    if pending is None:
        return False
    try:
        return bool(pending())
    except MuskuError:
        return False


def expected_cmdline(agent: Agent) -> str:
    """The kernel command line the boot configuration now asks for (``GRUB_CMDLINE_LINUX``
    of the host root's ``/etc/default/grub``)."""
    _, _, value = parse_grub_cmdline(agent.fs.read_text(GRUB_DEFAULT))
    return value


def cmdline_matches(booted: str, expect: str) -> list[str]:
    """The words of ``expect`` missing from the booted command line (empty: it matches)."""
    have = set(booted.split())
    return [w for w in expect.split() if w not in have]


def run_hook(argv: list[str], timeout: float) -> None:
    """Run the reboot hook; HostError (one line) when it cannot start, fails or hangs."""
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        raise HostError(f"reboot hook {shlex.join(argv)} did not finish in {timeout:g}s") from None
    except OSError as exc:
        raise HostError(f"reboot hook {shlex.join(argv)} failed: {exc.strerror}") from None
    if proc.returncode != 0:
        last = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or [""]
        tail = f": {last[0][:200]}" if last[0] else ""
        raise HostError(f"reboot hook {shlex.join(argv)} exited {proc.returncode}{tail}")


def begin(agent: Agent, knobs: dict[str, Value], lease_s: float) -> dict[str, Any]:
    """Journal the pending reboot and schedule the hook (caller holds the lock, inside the
    open experiment). The hook runs in a thread ``reboot_delay_s`` later, so that the apply's
    reply reaches the controller before the host goes down; a hook that fails rolls the
    experiment back and records the failure (``status``)."""
    if not agent.config.reboot_hook:
        raise HostError("a knob needs a reboot but the agent has no [agent] reboot_hook")
    expect = expected_cmdline(agent)
    info = agent.journal.tx_info()
    record = {
        "state": PENDING,
        "expect": expect,
        "knobs": dict(knobs),
        "lease_s": lease_s,
        "experiment": info.get("experiment", ""),
        "at": time.time(),
    }
    info[KEY] = record
    agent.journal.set_tx_info(info)  # before the hook: the reboot cannot lose it
    save_status(agent, record)
    log.warning("pending reboot: expect cmdline %r (%s)", expect, ", ".join(sorted(knobs)))
    t = threading.Thread(target=_reboot_later, args=(agent, record), name="musku-reboot")
    t.daemon = True
    agent.reboot_thread = t
    t.start()
    return record


def _reboot_later(agent: Agent, record: dict[str, Any]) -> None:
    time.sleep(agent.config.reboot_delay_s)
    try:
        run_hook(list(agent.config.reboot_hook), agent.config.reboot_hook_timeout_s)
        return
    except HostError as exc:
        failure = exc.one_line()
    with agent.lock:
        p = pending(agent)
        if p is None or p.get("at") != record["at"]:
            return  # rolled back meanwhile (the controller gave up)
        agent.reboot_pending = {}
        try:
            n = agent._rollback_experiment("reboot")
            line = f"{failure}; rolled back {n} write(s)"
        except MuskuError as rb:
            line = f"{failure}; {rb.one_line()}"
        save_status(agent, {**record, "state": FAILED, "message": line})
        log.error("%s", line)


def pending(agent: Agent) -> dict[str, Any] | None:
    """The journaled reboot the open transaction waits for, if any."""
    r = agent.journal.tx_info().get(KEY)
    return r if isinstance(r, dict) and r.get("state") == PENDING else None


def resume(agent: Agent) -> tuple[str, dict[str, Value]]:
    """At start (caller holds the lock): settle a journaled pending reboot. Returns a line for
    the recovery log ("" when no reboot was pending) and, when the boot is verified, the
    values the experiment holds (the caller keeps the experiment instead of rolling it back)."""
    if agent.journal.open_tx() is not TxKind.EXPERIMENT:
        return "", {}
    info = agent.journal.tx_info()
    p = info.get(KEY)
    if not isinstance(p, dict) or p.get("state") != PENDING:
        return "", {}
    expect = str(p.get("expect", ""))
    knobs: dict[str, Value] = dict(p.get("knobs") or {})
    why = ""
    try:
        missing = cmdline_matches(agent.fs.read_text(PROC_CMDLINE), expect)
        if missing:
            why = f"booted without {' '.join(missing)} on the kernel command line"
        else:
            for name, value in knobs.items():
                if not agent.knob(name).verify(value):
                    why = f"{name} reads back {agent.knob(name).read()!r}, not {value!r}"
                    break
    except MuskuError as exc:
        why = exc.one_line()
    if not why:
        p = {**p, "state": VERIFIED, "verified_at": time.time()}
        info[KEY] = p
        agent.journal.set_tx_info(info)
        save_status(agent, p)
        # the whole experiment (its writes, and the knobs that only needed the boot)
        kept = {**{s.knob: s.value for s in agent.journal.steps()}, **knobs}
        agent.experiment = {"id": info.get("experiment", "")}
        agent.lease_s = float(p.get("lease_s") or agent.config.default_lease_s)
        agent.lease_deadline = agent._clock() + agent.lease_s
        msg = f"reboot verified: the kernel booted {expect!r}; {', '.join(sorted(knobs))} in place"
        log.info("%s", msg)
        return msg, kept
    # not what was asked for: roll the experiment back (the GRUB backup is restored)
    line = f"reboot not verified ({why}): rolled back"
    try:
        agent._rollback_experiment("reboot")
    except MuskuError as exc:
        line = f"reboot not verified ({why}); ROLLBACK FAILED: {exc.one_line()}"
    save_status(agent, {**p, "state": FAILED, "message": line})
    log.error("%s", line)
    if agent.config.reboot_after_rollback and not agent.blocked:
        try:
            run_hook(list(agent.config.reboot_hook), agent.config.reboot_hook_timeout_s)
        except HostError as exc:
            log.error("reboot after rollback: %s", exc.one_line())
    return line, {}


STATUS_FILE = "reboot-status.json"


def defer(agent: Agent, name: str, value: Value) -> bool:
    """Called when a written knob does not verify: True (and noted) when it waits for a
    reboot, False when it simply did not take."""
    if not needs_reboot(agent.knob(name)):
        return False
    agent.reboot_pending[name] = value
    return True


def due(agent: Agent, values: dict[str, Value]) -> bool:
    """Whether this apply needs a reboot: a knob written here waits for one (noted by
    :func:`defer`), or a knob already configured for ``values`` is not what the kernel booted
    (an earlier experiment's boot, its GRUB edit since rolled back)."""
    for name, value in values.items():
        if name in agent.reboot_pending or not needs_reboot(agent.knob(name)):
            continue
        if not agent.knob(name).verify(value):
            agent.reboot_pending[name] = value
    return bool(agent.reboot_pending)


def start(agent: Agent, mark: int, lease_s: float) -> dict[str, Any]:
    """Journal the pending reboot and schedule the hook; when that is refused (no hook
    configured, an unreadable boot configuration) roll back this request's writes (journal
    steps after ``mark``: the GRUB backup is restored) and raise HostError."""
    try:
        return begin(agent, dict(agent.reboot_pending), lease_s)
    except MuskuError as exc:
        undone = agent._undo(after=mark)
        agent.reboot_pending = {}
        raise HostError(f"{exc.one_line()}; rolled back {undone} write(s)") from None


def status_of(agent: Agent) -> dict[str, Any]:
    """The last reboot's record for ``status`` (caller holds the lock). A pending reboot whose
    experiment was rolled back meanwhile (the controller gave up waiting) says so."""
    st = dict(agent.reboot_status)
    if st.get("state") == PENDING:
        p = pending(agent)
        if p is None or p.get("at") != st.get("at"):
            st["state"] = FAILED
            st["message"] = "rolled back before the reboot"
    return st


def load_status(state_dir: Any) -> dict[str, Any]:
    """The last reboot's outcome, kept in the state directory across restarts."""
    path = Path(state_dir) / STATUS_FILE
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def save_status(agent: Agent, status: dict[str, Any]) -> None:
    """Record the reboot's state (atomically: temporary file + rename) and show it in
    ``status``."""
    agent.reboot_status = dict(status)
    path = agent.config.state_dir / STATUS_FILE
    tmp = path.with_name(path.name + ".tmp")
    try:
        with open(tmp, "w") as f:
            json.dump(status, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as exc:
        log.error("cannot record the reboot status in %s: %s", path, exc.strerror)
