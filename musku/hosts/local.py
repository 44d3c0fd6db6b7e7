"""The ``local`` backend: one real host, A and B alternated in randomized windows (switchback).

``apply((A, B))`` validates both configurations on the host (nothing written) and records them.
``window(s)`` runs one A sub-window and one B sub-window in random order: it applies the arm's
configuration through the agent (journaled, leased, only differing knobs change), waits until
the built-in workload has adapted to it (its stats file says when it last looked at the host;
on a busy host re-faulting the arena takes seconds), discards ``settle_s``, measures ``s``
seconds, and returns ``(sample_A, sample_B)``, so the A/B tester works unchanged. ``restore()`` rolls the host back to its baseline.

The host's agent is either the system agent (``socket = "/run/musku/agent.sock"``) or, by default,
a private agent process started for the run (state in ``state_dir``). The private agent dies
with the controller (``PR_SET_PDEATHSIG``) and rolls the experiment back as it stops; its
lease covers a controller that hangs.

The workload under test is a μSuite service already running (``workload = "none"`` plus its
``stats_file``) or, by default, the built-in memory workload (:mod:`musku.workload`).

``[hosts]`` options: ``backend = "local"``, ``settle_s`` (default 1.0), ``lease_s`` (30),
``socket``, ``state_dir``, ``workload`` ("builtin" | "none"), ``stats_file``, ``arena_mib``
(256), ``madvise`` (false), ``agent_sample_interval_s`` (0.1), ``lock_wait_s`` (20: how long
the private agent waits for another agent on this host, say a previous run's still rolling back,
to let it go).

With the experiment's ``[threading] cotune`` (a μSuite mid-tier running on this host), every
switch to an arm also puts the mid-tier on that arm's threading table (trained at the arm's
first switch, then found in the agent's cache): each arm is measured with its best threading.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import signal
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from platformdirs import user_state_dir

from musku.domain import Configuration, Sample
from musku.errors import HostError, InputError, MuskuError
from musku.hosts.agent import AgentHost, Link, SocketLink, cotune_tables
from musku.hosts.base import Host, HostPair
from musku.hosts.cotune import ControllerTables, timeout_for
from musku.metrics.service import read_stats
from musku.process import Child, spawn
from musku.schema.hosts import LocalOptions, parse_options
from musku.storage.protocols import TableStore

if TYPE_CHECKING:
    from musku.experiment import Experiment

log = logging.getLogger("musku.hosts")
PR_SET_PDEATHSIG = 1
NOISE_SD_GUESS = 0.15
"""sd of one window's log-ratio B vs A on this backend with the built-in workload's
``ops_cpu`` (0.13-0.16 measured on the 2-vCPU dev VM at load 5-12, 0.4-2 s windows; ``ops``
per wall second: 0.2-0.3): what ``musku check`` assumes before anything runs."""
SWITCH_OVERHEAD_S = 0.75
"""Host seconds a sub-window costs beyond its settle and measurement (the agent's apply round
trip, the workload re-mapping its arena, the wait for the agent's next sample), measured on
the busy dev VM: a 0.4 s window with settle 0.3 s takes about 2.9 s."""
LOCK_HELD = "another agent is running on host root"  # the daemon's words (agent/daemon.py)
SWITCH_TRIES = 3  # attempts at one arm's apply before the comparison fails (host restored)


def _die_with_parent() -> None:  # runs in the child between fork and exec
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)


class _Arm(Host):
    def __init__(self, name: str) -> None:
        self.name = name
        self.config = Configuration()
        self.threading = ""  # what the mid-tier ran in this arm's last sub-window

    def configuration(self) -> Configuration:
        return self.config


class ChildProcess(Child):
    """A process this backend started (agent or workload); stopped by its pid only."""

    @classmethod
    def start(cls, argv: list[str], log: Path, name: str) -> ChildProcess:
        # own session: a terminal's Ctrl-C reaches only the controller, which then restores
        # the host through the agent and stops it (PR_SET_PDEATHSIG covers a dead controller)
        popen = spawn(argv, log, append=True, preexec=_die_with_parent, new_session=True)
        return cls(name, popen, log)

    def tail(self) -> str:
        """The log's last line, for an error message."""
        return self.log_tail(1)[:300]

    def stop(self, timeout: float = 20.0) -> int:
        return super().stop(timeout)


class LocalSwitchbackPair(HostPair):
    backend = "local"

    def __init__(
        self,
        link: Link,
        *,
        seed: int = 0,
        settle_s: float = 1.0,
        lease_s: float = 30.0,
        name: str = "",
        children: list[ChildProcess] | None = None,
        cotune: ControllerTables | None = None,
        workload_stats: Path | None = None,
        ready_timeout_s: float = 120.0,
    ) -> None:
        self.arms = (_Arm("local/A"), _Arm("local/B"))
        self.hosts = self.arms
        self.agent = AgentHost("local", link)
        self.rng = np.random.default_rng(seed)
        self.settle_s = settle_s
        self.lease_s = lease_s
        self.experiment = name or f"musku-local-{int(time.time())}"
        self.children = children or []
        self.cotune = cotune
        self.switches = 0
        self.workload_stats = workload_stats  # the built-in workload's: it says when it adapted
        self.ready_timeout_s = ready_timeout_s
        self._t0 = time.monotonic()
        self.agent.hello()

    def now(self) -> float:
        return time.monotonic() - self._t0

    def apply(self, configs: tuple[Configuration, Configuration]) -> float:
        t0 = time.monotonic()
        for cfg in configs:
            self.agent.link.call("check", config=cfg.as_dict())
        for arm, cfg in zip(self.arms, configs, strict=True):
            arm.config = cfg
        return time.monotonic() - t0

    def _switch(self, arm: _Arm) -> None:
        """Apply one arm (and, co-tuning, its threading). A host-side failure (the agent
        already rolled that apply back, e.g. a verify that lost a race with an outside writer)
        is retried after a pause (twice: a huge page pool that the kernel grants short while
        the workload is still letting its pages go, or memory is being compacted, usually
        takes on the next try); a third failure restores the host and raises."""
        cfg = arm.config
        fields: dict[str, Any] = {}
        for attempt in range(SWITCH_TRIES):
            try:
                if self.cotune is not None:
                    fields["threading"] = self.cotune.request(self.agent.hostname, cfg)
                reply = self.agent.link.call(
                    "apply",
                    config=cfg.as_dict(),
                    lease_s=self.lease_s,
                    experiment=self.experiment,
                    **fields,
                )
                if self.cotune is not None:
                    arm.threading = self.cotune.record(self.agent.hostname, cfg, reply)
                self.switches += 1
                return
            except HostError as exc:
                if attempt < SWITCH_TRIES - 1 and "cannot reach" not in exc.message:
                    log.warning("switch to %s failed (%s); retrying", cfg, exc.one_line())
                    time.sleep(0.5 * (attempt + 1))
                    continue
                self.restore()
                raise HostError(f"{exc.one_line()} (host rolled back)") from None
            except MuskuError as exc:
                self.restore()
                raise type(exc)(f"{exc.one_line()} (host rolled back)") from None

    def _sub_window(self, arm: _Arm, seconds: float) -> Sample:
        for child in self.children:
            if not child.alive():
                raise HostError(f"the {child.name} process exited: {child.tail()}")
        self._switch(arm)
        self._wait_for_workload(time.time())
        time.sleep(self.settle_s)  # discarded: the switch's transient
        start = time.time()
        time.sleep(seconds)
        end = time.time()
        t0, t1 = start + self.agent.offset, end + self.agent.offset
        rows = self.agent.rows_between(t0, t1, wait_s=max(5.0, 10 * self.agent.sample_interval))
        return self.agent.sample(rows, t0, t1, arm.name, arm.config)

    def _wait_for_workload(self, switched: float) -> None:
        """Wait until the built-in workload has looked at the host after the switch (and
        re-mapped its arena if the switch changed THP or the huge page pool): a fixed settle
        alone is too short on a busy host, where re-faulting the arena takes seconds and a
        window that starts before it ends holds no data. A workload still not there after
        ``ready_timeout_s`` is measured anyway (its sample then says what it saw)."""
        if self.workload_stats is None:
            return
        deadline = time.monotonic() + self.ready_timeout_s
        while True:
            data = read_stats(self.workload_stats)
            arena = data.get("arena") if data else None
            checked = arena.get("checked") if isinstance(arena, dict) else None
            if isinstance(checked, int | float) and checked >= switched:
                return
            for child in self.children:
                if not child.alive():
                    raise HostError(f"the {child.name} process exited: {child.tail()}")
            if time.monotonic() >= deadline:
                log.warning(
                    "the workload had not adapted %.0f s after a switch; measuring anyway",
                    self.ready_timeout_s,
                )
                return
            time.sleep(0.02)

    def window(self, seconds: float) -> tuple[Sample, Sample]:
        if seconds <= 0:
            raise InputError("a window must be longer than 0 s")
        order = [0, 1] if self.rng.random() < 0.5 else [1, 0]
        out: dict[int, Sample] = {}
        for i in order:
            out[i] = self._sub_window(self.arms[i], seconds)
        return out[0], out[1]

    def threading(self) -> tuple[str, str]:
        return self.arms[0].threading, self.arms[1].threading

    def use_store(self, store: TableStore) -> None:
        if self.cotune is not None:
            self.cotune.store = store

    def restore(self) -> None:
        try:
            self.agent.link.call("rollback")  # knobs and the mid-tier's threading
        except MuskuError as exc:
            log.error("local rollback failed: %s", exc.one_line())
            raise
        for arm in self.arms:  # both arms are the host's baseline again
            arm.config = Configuration()
            arm.threading = ""

    def close(self) -> None:
        """Stops what this backend started. A private agent rolls its experiment back as it
        stops (nothing would honour the lease otherwise); the system agent is left alone and
        its lease lapses."""
        self.agent.flush_ack()
        self.agent.link.close()
        for child in reversed(self.children):
            child.stop()

    def describe(self) -> Mapping[str, Any]:
        return {
            "backend": self.backend,
            "hosts": [a.name for a in self.arms],
            "design": "switchback",
            "settle_s": self.settle_s,
            "agent": self.agent.info,
            "cotune": self.cotune.spec.to_json() if self.cotune is not None else None,
        }


def window_seconds(interval_s: float, options: Mapping[str, Any]) -> float:
    """Host seconds one window (an A and a B sub-window) takes on this backend."""
    settle = float(options.get("settle_s", 1.0))
    return 2.0 * (interval_s + settle + SWITCH_OVERHEAD_S)


def _wait_for_socket(
    path: Path, child: ChildProcess, timeout: float = 30.0, *, request_timeout: float = 120.0
) -> SocketLink:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not child.alive():
            raise HostError(f"the local agent exited at start: {child.tail()}")
        if path.exists():
            link = SocketLink(path, timeout=request_timeout)
            try:
                link.call("hello")
                return link
            except HostError:
                link.close()
        time.sleep(0.1)
    raise HostError(f"the local agent did not answer on {path} within {timeout:g}s")


def _start_agent(
    cfg: Path, sock: Path, children: list[ChildProcess], lock_wait_s: float, timeout: float
) -> SocketLink:
    """Start the private agent (appended to ``children``) and reach it. An agent that exits at
    start because another agent holds the host's lock is started again until ``lock_wait_s``
    pass: a previous run's agent may still be rolling back (its controller died and
    ``PR_SET_PDEATHSIG`` stopped it, or another process is closing its pair); an agent that
    keeps the host is then one clear error."""
    deadline = time.monotonic() + lock_wait_s
    while True:
        agent = ChildProcess.start(
            [sys.executable, "-m", "musku.agent", "run", "--config", str(cfg)],
            cfg.parent / "agent.log",
            "local agent",
        )
        children.append(agent)
        try:
            return _wait_for_socket(sock, agent, request_timeout=timeout)
        except HostError as exc:
            if LOCK_HELD not in exc.message:
                raise
            if time.monotonic() >= deadline:
                waited = f" (waited {lock_wait_s:g} s)" if lock_wait_s > 0 else ""
                raise HostError(exc.one_line() + waited) from None
        children.remove(agent)
        log.info("another agent holds the host; starting the local agent again")
        time.sleep(0.5)


def _default_state_dir() -> Path:
    return Path(user_state_dir("musku")) / "local"


def open_pair(
    experiment: Experiment, seed: int = 0, *, link: Link | None = None
) -> LocalSwitchbackPair:
    """The pair for ``experiment``: its workload started, its agent reached. ``link``: an agent
    the caller already reaches another way (an :class:`~musku.hosts.agent.SshLink` to this
    machine's agent through an sshd); then no private agent is started and ``socket`` is
    ignored. The pair closes the link."""
    opts = parse_options(LocalOptions, experiment.hosts.options, str(experiment.path))
    settle, lease, interval = opts.settle_s, opts.lease_s, opts.agent_sample_interval_s
    arena = int(opts.arena_mib)
    workload = opts.workload
    state = Path(opts.state_dir or _default_state_dir()).expanduser()
    state.mkdir(parents=True, exist_ok=True, mode=0o700)
    stats = Path(opts.stats_file or state / "workload.json")
    children: list[ChildProcess] = []
    try:
        if workload == "builtin":
            with contextlib.suppress(FileNotFoundError):
                stats.unlink()
            argv = [
                sys.executable,
                "-m",
                "musku.workload",
                "--stats",
                str(stats),
                "--arena-mib",
                str(arena),
                "--seed",
                str(seed),
            ]
            if opts.madvise:
                argv.append("--madvise")
            children.append(ChildProcess.start(argv, state / "workload.log", "workload"))
        if workload == "builtin":
            deadline = time.monotonic() + 30
            while not stats.exists():
                if time.monotonic() > deadline or not children[0].alive():
                    raise HostError(f"the workload did not start: {children[0].tail()}")
                time.sleep(0.1)
        tables = cotune_tables(experiment)
        timeout = 120.0 if tables is None else max(120.0, timeout_for(tables.spec))
        sock = opts.socket
        if link is not None:
            pass
        elif sock:
            link = SocketLink(str(sock), timeout=timeout)
        else:
            sock_path = state / "agent.sock"
            cfg = state / "agent.toml"
            cfg.write_text(
                "[agent]\n"
                f"state_dir = {str(state / 'agent')!r}\n"
                f"socket = {str(sock_path)!r}\n"
                f"sample_interval_s = {interval!r}\n"
                "default_lease_s = 30.0\n"
                "[samplers.perf]\n[samplers.psutil]\n"
                f"[samplers.service]\nstats_file = {str(stats)!r}\n"
            )
            os.chmod(cfg, 0o600)
            link = _start_agent(cfg, sock_path, children, opts.lock_wait_s, timeout)
        return LocalSwitchbackPair(
            link,
            seed=seed,
            settle_s=settle,
            lease_s=lease,
            name=experiment.name,
            children=children,
            cotune=tables,
            workload_stats=stats if workload == "builtin" else None,
        )
    except BaseException:
        for child in reversed(children):
            child.stop()
        raise
