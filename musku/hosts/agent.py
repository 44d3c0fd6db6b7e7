"""The ``agent`` backend: two real hosts, each running ``musku agent``.

Each host is reached either over SSH (fabric/paramiko: the fixed command ``musku agent rpc`` with
the JSON request on stdin, the JSON reply on stdout) or, for hosts on this machine, directly on
the agent's Unix socket. The pair applies a configuration to each host under a lease that a
background thread renews; ``window(s)`` waits for the window's wall time, then collects both
agents' spooled samples for that interval (each translated to its host's clock) and aggregates
them into one :class:`~musku.domain.Sample` per host.

``[hosts]`` options (experiment file)::

    backend = "agent"
    hosts = ["host-a", "host-b"]        # or tables: {name, host, port, user, socket}
    ssh_user = "root"                   # default for every host
    ssh_port = 22
    identity_file = "~/.ssh/musku"      # optional; else the SSH agent / default keys
    known_hosts = "~/.ssh/known_hosts"  # host keys are checked (unknown hosts refused)
    remote_command = ["musku", "agent", "rpc"]
    lease_s = 30                        # the agents revert if not renewed within this
    reboot_timeout_s = 900              # reboot-mode knobs: how long a host may take to return
    connect_timeout_s = 10
    rpc_timeout_s = 30                  # any request but apply/deploy/rollback: a silent link
    reconnect_timeout_s = 600           # a lost link: wait this long for it, then the pair fails

A host table with ``socket`` and no ``host`` is reached on that Unix socket directly; with both,
``socket`` is passed to the remote ``musku agent rpc`` in the request (``agent_socket``).

With the experiment's ``[threading] cotune``, every ``apply`` request carries a ``threading``
field (:class:`musku.agent.cotune.AgentRequest`: how to reach and train the host's mid-tier, and
the results DB's table for that host and configuration if there is one); the agent co-tunes
the mid-tier once the knobs are applied and replies with what it runs, which
:meth:`AgentPair.threading` reports. Tables an agent trained are stored in the results DB.
"""

from __future__ import annotations

import bisect
import json
import logging
import math
import shlex
import threading
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from musku.agent.client import AgentClient
from musku.agent.protocol import MAX_REPLY, AgentBusy, raise_for
from musku.agent.spool import Row
from musku.cotune_spec import MIDTIER_KEYS
from musku.domain import Configuration, Sample
from musku.errors import HostError, InputError, LinkDown, MuskuError
from musku.hosts.base import Host, HostPair
from musku.hosts.cotune import ControllerTables, timeout_for
from musku.hosts.reboot import DEFAULT_TIMEOUT_S, wait_for_reboot
from musku.owner import controller_id
from musku.schema.hosts import AgentOptions, host_name, parse_options
from musku.storage.protocols import TableStore

if TYPE_CHECKING:
    from musku.experiment import Experiment

log = logging.getLogger("musku.hosts")


class Link(Protocol):
    def call(self, op: str, **fields: Any) -> Any: ...

    def close(self) -> None: ...


BUSY_FIRST_DELAY_S = 0.05
BUSY_MAX_DELAY_S = 2.0


def retry_busy(call: Any, where: str, budget: float) -> Any:
    """``call()``, sent again with exponential back-off (50 ms doubling to 2 s) while the agent
    answers ``agent busy`` (every connection slot taken; the request was not read, so sending
    it again is safe), for at most ``budget`` seconds; then one HostError line."""
    deadline = time.monotonic() + budget
    delay = BUSY_FIRST_DELAY_S
    tries = 0
    while True:
        tries += 1
        try:
            return call()
        except AgentBusy:
            left = deadline - time.monotonic()
            if left <= 0:
                raise HostError(
                    f"{where}: agent busy (every connection slot taken) for {budget:g} s, "
                    f"{tries} tries; see its clients, or raise its max_clients"
                ) from None
            time.sleep(min(delay, left))
            delay = min(delay * 2, BUSY_MAX_DELAY_S)


class SocketLink:
    """An agent on this machine, through its Unix socket (thread-safe). An ``agent busy``
    answer is retried for up to ``rpc_timeout`` (:func:`retry_busy`)."""

    def __init__(
        self,
        path: str | Path,
        *,
        timeout: float = 120.0,
        connect_timeout: float = 10.0,
        rpc_timeout: float = 30.0,
    ) -> None:
        self.where = str(path)
        self.rpc_timeout = rpc_timeout
        self._client = AgentClient(path, timeout=timeout, connect_timeout=connect_timeout)
        self._lock = threading.Lock()

    def call(self, op: str, **fields: Any) -> Any:
        with self._lock:
            return retry_busy(
                lambda: self._client.call(op, **fields), f"agent {self.where}", self.rpc_timeout
            )

    def close(self) -> None:
        with self._lock:
            self._client.close()


# requests that may take long on the host (knob changes, co-tuning's training): they get the
# link's ``timeout``; every other request gets ``rpc_timeout``, so a silent link is noticed in
# seconds, not minutes
LONG_OPS = frozenset({"apply", "deploy", "rollback"})
DEFAULT_RECONNECT_S = 600.0  # a lost link: how long a comparison waits for it to come back


class SshLink:
    """An agent on another host, over SSH (thread-safe: one request at a time per link).

    By default one long-lived channel per SSH connection runs the fixed command
    ``remote_command --stream`` (``musku agent rpc --stream``): newline-delimited JSON requests
    in, one reply line out for each, so a request costs a round trip, not a process start on
    the host. A channel found dead before a request (its relay exited) is replaced quietly; one
    that dies during a request (end of output, a dropped transport) is replaced and the request
    sent once more, then :class:`~musku.errors.LinkDown` (or, when the relay keeps exiting
    without a reply, a HostError naming its exit status). A request with no reply within its
    deadline (``timeout`` for :data:`LONG_OPS`, else ``rpc_timeout``) drops the connection and
    raises LinkDown at once: the agent may be fine behind a cut link, and resending a request it
    may still be running is not safe. A reply line that is not a JSON object is one HostError
    line (the channel is dropped: its framing cannot be trusted). A host whose relay refuses
    ``--stream`` (a musku older than it) is served one exec per request from then on.

    ``stream=False``: one SSH exec of ``remote_command`` per request (the older transport; the
    request on stdin, the reply on stdout; the request is sent once more on any SSH failure).
    """

    def __init__(
        self,
        host: str,
        *,
        user: str = "root",
        port: int = 22,
        identity_file: str | None = None,
        known_hosts: str | None = None,
        remote_command: Sequence[str] = ("musku", "agent", "rpc"),
        agent_socket: str | None = None,
        connect_timeout: float = 10.0,
        timeout: float = 300.0,
        rpc_timeout: float = 30.0,
        stream: bool = True,
    ) -> None:
        self.where = f"{user}@{host}:{port}"
        self.command = shlex.join(list(remote_command))  # fixed: never built from request data
        self.stream_command = shlex.join([*remote_command, "--stream"])
        self.stream = stream
        self.agent_socket = agent_socket
        self.timeout = timeout
        self.rpc_timeout = min(rpc_timeout, timeout)
        self._lock = threading.Lock()
        self._host, self._user, self._port = host, user, port
        self._identity, self._known_hosts = identity_file, known_hosts
        self._connect_timeout = connect_timeout
        self._conn: Any = None
        # what a broken link raises: paramiko's errors join once _connection has imported it
        self._ssh_errors: tuple[type[BaseException], ...] = (OSError, EOFError)
        self._chan: Any = None  # the stream channel
        self._buf = bytearray()  # stream output read past the last reply line
        self._err = bytearray()  # the tail of the stream relay's stderr
        self.channels = 0  # stream channels opened (execs, in one-shot mode), for the figures
        self.requests = 0  # requests sent (a resent one counts once)

    def _connection(self) -> Any:
        if self._conn is not None and self._conn.is_connected:
            return self._conn
        # lazy: fabric/paramiko load the cryptography stack (~0.3 s), only SSH hosts need them
        import paramiko
        from fabric import Connection

        self._ssh_errors = (paramiko.SSHException, OSError, EOFError)
        kwargs: dict[str, Any] = {"allow_agent": True, "look_for_keys": self._identity is None}
        if self._identity:
            kwargs["key_filename"] = [str(Path(self._identity).expanduser())]
        conn = Connection(
            self._host,
            user=self._user,
            port=self._port,
            connect_timeout=self._connect_timeout,
            connect_kwargs=kwargs,
        )
        # host keys are checked: an unknown or changed host key is refused, never auto-added
        conn.client.set_missing_host_key_policy(paramiko.RejectPolicy())
        if self._known_hosts:
            try:
                conn.client.load_host_keys(str(Path(self._known_hosts).expanduser()))
            except OSError as exc:
                raise HostError(f"{self.where}: cannot read known_hosts: {exc.strerror}") from None
        try:
            conn.open()
        except (paramiko.SSHException, OSError) as exc:
            raise LinkDown(f"cannot connect to {self.where}: {exc}") from None
        self._conn = conn
        return conn

    def request(self, req: dict[str, Any]) -> dict[str, Any]:
        if self.agent_socket:
            req = {**req, "agent_socket": self.agent_socket}
        timeout = self.timeout if req.get("op") in LONG_OPS else self.rpc_timeout
        data = json.dumps(req, separators=(",", ":")).encode() + b"\n"
        with self._lock:
            self.requests += 1
            if self.stream:
                reply = self._stream_request(data, timeout)
                if reply is not None:
                    return reply
            return self._exec_request(data, timeout)

    # ---- one long-lived channel

    def _stream_channel(self, timeout: float) -> Any:
        """The live stream channel, or a new one once its relay's banner came (within
        ``timeout``); None when the host's relay cannot stream (an older musku)."""
        chan = self._chan
        if chan is not None and not (
            chan.closed or chan.eof_received or chan.exit_status_ready() or chan.recv_ready()
        ):
            return chan  # alive, and nothing unasked waiting on it
        self._drop_channel()  # its relay exited (or wrote out of turn): start a fresh one
        conn = self._connection()
        chan = conn.client.get_transport().open_session(timeout=self._connect_timeout)
        chan.exec_command(self.stream_command)
        self._chan = chan
        self.channels += 1
        try:
            first = self._read_line(chan, timeout)
        except TimeoutError:
            # no banner: an older one-shot relay (a key's forced command) waiting for the end
            # of its input? End it; such a relay answers the empty request with an error
            chan.shutdown_write()
            try:
                rest = self._read_line(chan, self._connect_timeout)
            except TimeoutError:
                rest = None
            self._drop()
            if rest is None or _is_banner(rest):
                raise LinkDown(f"{self.where}: SSH failed: no answer in {timeout:g}s") from None
            return None
        if first is None:  # it exited at once
            raise _RelayExited(self._exited(timeout))
        if _is_banner(first):
            return chan
        try:
            doc = json.loads(first)
        except ValueError:
            doc = None
        self._drop_channel()
        if isinstance(doc, dict) and _no_stream(doc):
            return None
        shown = " ".join(first.decode(errors="replace").split())[:120]
        raise HostError(f"{self.where}: '{self.stream_command}' is not a stream relay: {shown!r}")

    def _read_line(self, chan: Any, timeout: float) -> bytes | None:
        """The next output line (without its newline); None at end of output; TimeoutError
        when none came within ``timeout``."""
        deadline = time.monotonic() + timeout
        scanned = 0
        while True:
            i = self._buf.find(b"\n", scanned)
            if i >= 0:
                line = bytes(self._buf[:i])
                del self._buf[: i + 1]
                return line
            scanned = len(self._buf)
            if scanned > MAX_REPLY:
                self._drop_channel()
                raise HostError(f"{self.where}: reply longer than {MAX_REPLY} bytes")
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError
            chan.settimeout(left)
            chunk = chan.recv(1 << 20)
            while chan.recv_stderr_ready():  # keep its tail for error messages
                self._err = (self._err + chan.recv_stderr(4096))[-1000:]
            if not chunk:
                return None
            self._buf += chunk

    def _stream_request(self, data: bytes, timeout: float) -> dict[str, Any] | None:
        """The reply over the stream channel; None when the host's relay has no ``--stream``
        (this link then uses one exec per request)."""
        for attempt in (0, 1):
            try:
                chan = self._stream_channel(timeout)
                if chan is None:
                    why = "the host's musku has no 'rpc --stream': one exec per request"
                    log.warning("%s: %s", self.where, why)
                    self.stream = False
                    return None
                chan.settimeout(timeout)
                chan.sendall(data)
                line = self._read_line(chan, timeout)
            except TimeoutError:
                self._drop()
                raise LinkDown(f"{self.where}: SSH failed: no answer in {timeout:g}s") from None
            except _RelayExited as exc:
                if attempt:
                    raise HostError(str(exc)) from None
                continue
            except self._ssh_errors as exc:
                self._drop()
                if attempt:
                    raise LinkDown(f"{self.where}: SSH failed: {exc}") from None
                continue
            if line is None:  # the relay ended during the request: once more on a new one
                why = self._exited(timeout)
                if attempt:
                    raise HostError(why)
                continue
            if self._buf:  # more than one line for one request: the framing is off
                log.warning("%s: the relay wrote more than one reply line", self.where)
                self._drop_channel()
            return self._parse(line)
        raise AssertionError("unreachable")

    def _exited(self, timeout: float) -> str:
        """The stream channel's relay ended: drop the channel; what to say about it."""
        chan = self._chan
        chan.status_event.wait(min(2.0, timeout))  # the exit status follows the end of output
        status = chan.exit_status if chan.exit_status_ready() else -1
        err = " ".join(self._err.decode(errors="replace").split())[-300:]
        self._drop_channel()
        return f"{self.where}: '{self.stream_command}' exited {status} without a reply" + (
            f": {err}" if err else ""
        )

    def _parse(self, line: bytes) -> dict[str, Any]:
        try:
            reply = json.loads(line)
        except ValueError:
            self._drop_channel()
            shown = " ".join(line.decode(errors="replace").split())[:120]
            raise HostError(f"{self.where}: malformed reply from the relay: {shown!r}") from None
        if not isinstance(reply, dict):
            self._drop_channel()
            raise HostError(f"{self.where}: malformed reply from the relay (not an object)")
        return reply

    def _drop_channel(self) -> None:
        chan, self._chan = self._chan, None
        self._buf.clear()
        self._err.clear()
        if chan is not None:
            try:
                chan.close()  # the relay sees the end of its input and exits
            except Exception as exc:  # noqa: BLE001 - closing a channel of a dead transport
                log.debug("%s: closing the channel: %s", self.where, exc)

    # ---- one exec per request

    def _exec_request(self, data: bytes, timeout: float) -> dict[str, Any]:
        for attempt in (0, 1):
            try:
                conn = self._connection()
                chan = conn.client.get_transport().open_session(timeout=self._connect_timeout)
                self.channels += 1
                chan.settimeout(timeout)
                chan.exec_command(self.command)
                chan.sendall(data)
                chan.shutdown_write()
                out = bytearray()
                while chunk := chan.recv(65536):
                    out += chunk
                err = chan.recv_stderr(4096)
                status = chan.recv_exit_status()
                chan.close()
                break
            except self._ssh_errors as exc:
                self._drop()
                if attempt:
                    why = f"no answer in {timeout:g}s" if isinstance(exc, TimeoutError) else exc
                    raise LinkDown(f"{self.where}: SSH failed: {why}") from None
        lines = [ln for ln in bytes(out).decode(errors="replace").splitlines() if ln.strip()]
        try:
            reply = json.loads(lines[-1])
        except (IndexError, ValueError):
            msg = err.decode(errors="replace").strip()[:300]
            raise HostError(
                f"{self.where}: '{self.command}' exited {status} without a reply"
                + (f": {msg}" if msg else "")
            ) from None
        if not isinstance(reply, dict):
            raise HostError(f"{self.where}: malformed reply")
        return reply

    def call(self, op: str, **fields: Any) -> Any:
        """The result; an ``agent busy`` answer (relayed by ``musku agent rpc``) is sent again
        with back-off for up to ``rpc_timeout`` (:func:`retry_busy`)."""
        return retry_busy(
            lambda: raise_for(self.request({"op": op, **fields}), where=f"{self.where}: "),
            self.where,
            self.rpc_timeout,
        )

    def _drop(self) -> None:
        self._drop_channel()
        if self._conn is not None:
            try:
                self._conn.close()
            finally:
                self._conn = None

    def close(self) -> None:
        with self._lock:
            self._drop()


class _RelayExited(Exception):
    """The stream relay ended before its banner (the message says how)."""


def _is_banner(line: bytes) -> bool:
    """Whether ``line`` is a stream relay's first line (``musku.agent.rpc.BANNER``)."""
    try:
        doc = json.loads(line)
    except ValueError:
        return False
    result = doc.get("result") if isinstance(doc, dict) else None
    return isinstance(result, dict) and result.get("relay") == "musku agent rpc --stream"


def _no_stream(reply: dict[str, Any]) -> bool:
    """Whether ``reply`` is an older ``musku agent rpc`` refusing ``--stream``."""
    err = reply.get("error") if reply.get("ok") is False else None
    return isinstance(err, dict) and "unexpected argument '--stream'" in str(err.get("message"))


# --------------------------------------------------------------------------- aggregation


BATCH_MIN_ROWS = 4  # AgentPair.windows batches windows at least this many agent samples long
BATCH_POLL_S = 0.25  # how often a batched wait looks at the lease keeper's last renewal


def _edges(t0: float, seconds: float, count: int) -> list[float]:
    """``count`` contiguous windows of ``seconds`` from ``t0``: their ``count + 1`` edges, each
    window at least ``seconds`` long in floating point (at 1.8e9 s one step is 2.4e-7 s)."""
    edges = [t0]
    for _ in range(count):
        e = edges[-1] + seconds
        while e - edges[-1] < seconds:
            e = math.nextafter(e, math.inf)
        edges.append(e)
    return edges


def _busy(r: Row) -> bool:
    """Whether the agent took row ``r`` while a request held its lock (no configuration)."""
    return r.note == "busy" and not r.config


def aggregate(
    rows: Sequence[Row],
    *,
    host: str,
    t0: float,
    t1: float,
    arm: Configuration | None = None,
    expect: set[str] | frozenset[str] = frozenset(),
) -> Sample:
    """One Sample from the spool rows whose midpoint lies in ``[t0, t1]`` (host clock).

    Metrics are duration-weighted means over the rows that carry them (latency percentiles:
    the weighted mean of per-row percentiles). The sample is invalid when a row saw an outside
    change, a row was taken at another configuration than ``arm``, or no row fell inside.
    Metrics in ``expect`` (seen before from this host) but absent from every row are NaN and
    the sample is invalid, so consumers always find the same keys.
    """
    # a row the agent took while a request held its state ("busy": an apply, a lease
    # renewal, a status) carries no configuration to check: it is skipped, not counted as
    # taken at another configuration (every renewal cost a window; tests/e2e)
    inside = [r for r in rows if t0 <= r.t - r.duration / 2 <= t1 and not _busy(r)]
    notes: list[str] = []
    valid = bool(inside)
    if not inside:
        notes.append("no samples in the window")
    sums: dict[str, float] = {}
    weights: dict[str, float] = {}
    for r in inside:
        if not r.valid:
            valid = False
            if r.note and r.note not in notes:
                notes.append(r.note)
        if arm is not None and arm.settings:
            try:
                at = Configuration.from_key(r.config).as_dict() if r.config else {}
            except (KeyError, TypeError, ValueError):
                at = {}
            if any(at.get(k) != v for k, v in arm.settings):
                valid = False
                if "host not at the arm's configuration" not in notes:
                    notes.append("host not at the arm's configuration")
        for k, v in r.metrics.items():
            sums[k] = sums.get(k, 0.0) + v * r.duration
            weights[k] = weights.get(k, 0.0) + r.duration
    metrics = {k: sums[k] / weights[k] for k in sums if weights[k] > 0}
    missing = sorted(set(expect) - set(metrics))
    if missing:  # a source went quiet in this window: keep the keys, mark it unusable
        valid = False
        notes.append("no data for " + ", ".join(missing))
        metrics.update(dict.fromkeys(missing, float("nan")))
    return Sample(
        host=host, t=t1, duration=t1 - t0, metrics=metrics, valid=valid, note="; ".join(notes)
    )


# --------------------------------------------------------------------------- hosts


class AgentHost(Host):
    """One host's agent, with its clock offset and its collection cursor."""

    def __init__(self, name: str, link: Link, midtier: Mapping[str, str] | None = None) -> None:
        self.name = name
        self.link = link
        self.midtier = dict(midtier or {})  # co-tuning: this host's own mid-tier address
        self.offset = 0.0  # host clock - controller clock
        self.offset_rtt = float("inf")  # the round trip it was estimated from: error <= rtt / 2
        self.sample_interval = 0.1
        self.info: dict[str, Any] = {}
        self.applied = Configuration()
        self._cursor = 0
        self._pending_ack = 0
        self._rows: list[Row] = []
        self.metric_names: set[str] = set()
        self.threading = ""  # what its mid-tier runs (co-tuning), from the last apply's reply

    def owner_fields(self, experiment: str, *, override: bool = False) -> dict[str, Any]:
        """Who asks (docs/agent.md "Ownership"); nothing for an agent older than ownership
        (it would refuse the unknown fields)."""
        if not self.info.get("ownership"):
            return {}
        fields: dict[str, Any] = {"experiment": experiment, "controller": controller_id()}
        if override:
            fields["override"] = True
        return fields

    @property
    def hostname(self) -> str:
        """The name threading tables are stored under: the agent's own host name."""
        return str(self.info.get("hostname") or self.name)

    def note_time(self, sent: float, host_time: float, got: float, *, force: bool = False) -> None:
        """A round trip sent..got whose reply carried the host's clock: keep the offset from
        the tightest one (``force``: start over from this one)."""
        rtt = max(0.0, got - sent)
        if force or rtt <= self.offset_rtt:
            self.offset, self.offset_rtt = host_time - (sent + got) / 2, rtt

    def sample(
        self, rows: Sequence[Row], t0: float, t1: float, name: str, arm: Configuration
    ) -> Sample:
        """Aggregate rows into a Sample, keeping the metric keys stable across windows."""
        for r in rows:
            self.metric_names.update(r.metrics)
        return aggregate(rows, host=name, t0=t0, t1=t1, arm=arm, expect=self.metric_names)

    def hello(self, probes: int = 3) -> dict[str, Any]:
        """Open the session: the agent's info, its clock offset, the collection cursor.

        The offset is host time minus the midpoint of a round trip, wrong by at most half that
        round trip: it comes from the tightest of the first call and ``probes`` more (the first
        one over a new SSH connection can take seconds; later ones take milliseconds)."""
        sent = time.time()
        info = self.link.call("hello")
        self.note_time(sent, float(info["time"]), time.time(), force=True)
        for _ in range(probes):
            sent = time.time()
            t = float(self.link.call("hello")["time"])
            self.note_time(sent, t, time.time())
        self.sample_interval = float(info.get("sample_interval_s", 0.1))
        self.info = dict(info)
        # start collecting from now: rows spooled before this session are not ours
        st = self.link.call("status")
        self._cursor = int(st.get("spool_head", 0))
        self._learn_metrics()
        return self.info

    def _learn_metrics(self, wait_s: float = 5.0) -> None:
        """The metric names this host reports (from its recent rows; waits for a few rows of a
        freshly started agent), so that every Sample carries the same keys."""
        deadline = time.monotonic() + wait_s
        start = max(0, self._cursor - 20)
        while True:
            rows = self.link.call("collect", cursor=start, limit=200)["rows"]
            names = {k for r in rows for k in r["metrics"]}
            if len(rows) >= 5 or time.monotonic() >= deadline:
                self.metric_names.update(names)
                return
            time.sleep(min(self.sample_interval, 0.2))

    def configuration(self) -> Configuration:
        return self.applied

    def rows_between(self, t0: float, t1: float, *, wait_s: float = 10.0) -> list[Row]:
        """Spooled rows up to host time ``t1`` (waiting until one at or past it exists);
        rows from before ``t0`` are dropped and acknowledged."""
        self.fetch(t1, wait_s=wait_s)
        return self.take(t0, t1)

    def fetch(self, t1: float, *, wait_s: float = 10.0) -> None:
        """Collect spooled rows into this host's buffer until one at or past host time ``t1``
        is there (or ``wait_s`` passed). Nothing is consumed: a failure leaves every row
        collected so far in the buffer (a lost link loses no sample)."""
        deadline = time.monotonic() + wait_s
        while True:
            fields: dict[str, Any] = {"cursor": self._cursor}
            if self._pending_ack:
                fields["ack"] = self._pending_ack  # piggybacked: one round trip per window
            res = self.link.call("collect", **fields)
            self._pending_ack = 0
            self._rows.extend(Row.from_json(r) for r in res["rows"])
            self._cursor = int(res["cursor"])
            if (self._rows and self._rows[-1].t >= t1) or time.monotonic() >= deadline:
                break
            if not res["rows"]:
                time.sleep(min(self.sample_interval, 0.2))

    def take(self, t0: float, t1: float) -> list[Row]:
        """Consume the buffered rows up to host time ``t1``: those from ``t0`` on are
        returned, the earlier ones dropped; all are acknowledged with the next collect."""
        taken = [r for r in self._rows if r.t - r.duration / 2 <= t1]
        self._rows = [r for r in self._rows if r.t - r.duration / 2 > t1]
        if taken:
            self._pending_ack = max(r.id for r in taken)
        return [r for r in taken if r.t - r.duration / 2 >= t0]

    def flush_ack(self) -> None:
        """Acknowledge rows already consumed (the agent may prune them); best effort."""
        if self._pending_ack:
            try:
                self.link.call("ack", cursor=self._pending_ack)
                self._pending_ack = 0
            except MuskuError as exc:
                log.warning("%s: ack failed: %s", self.name, exc.one_line())

    def skip_to_now(self) -> None:
        """Forget rows so far (after a switch): the next window starts fresh."""
        res = self.link.call("collect", cursor=self._cursor, limit=100_000)
        self._cursor = int(res["cursor"])
        self._rows = []
        self._pending_ack = self._cursor


def rollback(hosts: Sequence[AgentHost], experiment: str) -> None:
    """Roll every host's experiment back, best effort per host (a failure is logged)."""
    for h in hosts:
        try:
            h.link.call("rollback", **h.owner_fields(experiment))
        except MuskuError as exc:
            log.error("%s: rollback failed: %s", h.name, exc.one_line())


class LeaseKeeper:
    """Renews the experiment lease on each host every third of the lease, each host from a
    thread of its own: a host whose link hangs does not let the others' leases lapse."""

    def __init__(self, hosts: Sequence[AgentHost], lease_s: float) -> None:
        self.hosts = list(hosts)
        self.lease_s = lease_s
        self.error: str = ""
        self.link_down = False  # the last failed renewal found no link (LinkDown)
        self.experiment = ""  # the owner the renewals speak for (AgentPair sets it)
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []

    def start(self) -> None:
        if not any(t.is_alive() for t in self._threads):
            self._stop.clear()
            self._threads = [
                threading.Thread(target=self._run, args=(h,), name="musku-lease", daemon=True)
                for h in self.hosts
            ]
            for t in self._threads:
                t.start()

    def _run(self, h: AgentHost) -> None:
        while not self._stop.wait(self.lease_s / 3):
            try:
                sent = time.time()
                res = h.link.call("renew", lease_s=self.lease_s, **h.owner_fields(self.experiment))
                got = time.time()
                # Clocks drift: a tight round trip (under 1 s, and within 2x the one the
                # current estimate rests on) re-estimates.
                rtt = got - sent
                if "time" in res and rtt < 1.0 and rtt <= max(2 * h.offset_rtt, 0.05):
                    h.note_time(sent, float(res["time"]), got, force=True)
            except MuskuError as exc:
                self.error = f"{h.name}: lease renewal failed: {exc.one_line()}"
                self.link_down = isinstance(exc, LinkDown)
                log.error("%s", self.error)

    def stop(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(timeout=30)
        self._threads = []


class AgentPair(HostPair):
    backend = "agent"
    hosts: tuple[AgentHost, AgentHost]

    def __init__(
        self,
        hosts: tuple[AgentHost, AgentHost],
        *,
        lease_s: float = 30.0,
        name: str = "",
        cotune: ControllerTables | None = None,
        reboot_timeout_s: float = DEFAULT_TIMEOUT_S,
        reconnect_timeout_s: float = DEFAULT_RECONNECT_S,
        take_over: bool = False,
    ) -> None:
        self.hosts = hosts
        self.lease_s = lease_s
        self.reboot_timeout_s = reboot_timeout_s  # a reboot-mode apply: wait this long at most
        self.reconnect_timeout_s = reconnect_timeout_s  # a lost link: wait this long at most
        self._collected_to = time.time()  # controller clock: where the next window starts
        self._window_s = 1.0  # the last window's length
        self._held: list[tuple[Sample, Sample]] = []  # measured, not returned (see windows)
        self.cotune = cotune
        self.experiment = name or f"musku-{int(time.time())}"
        self.override = (
            take_over  # [hosts] take_over (--take-over-agents): the first apply takes over
        )
        self._t0 = time.monotonic()
        self._keeper = LeaseKeeper(hosts, lease_s)
        self._keeper.experiment = self.experiment
        with ThreadPoolExecutor(2) as pool:
            list(pool.map(lambda h: h.hello(), hosts))

    def now(self) -> float:
        return time.monotonic() - self._t0

    def apply(self, configs: tuple[Configuration, Configuration]) -> float:
        t0 = time.monotonic()

        def one(i: int) -> Any:
            fields: dict[str, Any] = {}
            if self.cotune is not None:
                h = self.hosts[i]
                fields["threading"] = self.cotune.request(h.hostname, configs[i], h.midtier)
            reply = self.hosts[i].link.call(
                "apply",
                config=configs[i].as_dict(),
                lease_s=self.lease_s,
                **fields,
                **{
                    "experiment": self.experiment,
                    **self.hosts[i].owner_fields(self.experiment, override=self.override),
                },
            )
            if isinstance(reply, dict) and reply.get("rebooting"):  # counted in host time
                wait_for_reboot(self.hosts[i], reply, self.reboot_timeout_s)
            return reply

        self._keeper.start()  # renews the other host's lease while one reboots
        with ThreadPoolExecutor(2) as pool:
            futures = [pool.submit(one, i) for i in (0, 1)]
            errors = []
            replies: list[Any] = []
            for f in futures:
                exc = f.exception()
                if exc is not None:
                    errors.append(exc)
                else:
                    replies.append(f.result())
        if errors:
            self._rollback_all()
            self._forget_applied()  # the rollback took both hosts back to their baseline
            first = errors[0]
            if isinstance(first, MuskuError):
                raise type(first)(f"{first.one_line()} (both hosts rolled back)")
            raise HostError(f"apply failed: {first} (both hosts rolled back)")
        self.override = False  # taken over: from now on the lease is ours
        self._keeper.error = ""
        self._keeper.start()  # first: the lease runs from the apply on
        if self.cotune is not None:
            try:
                threading = [
                    self.cotune.record(h.hostname, configs[i], replies[i])
                    for i, h in enumerate(self.hosts)
                ]
            except MuskuError as exc:
                self._rollback_all()
                self._forget_applied()
                raise type(exc)(f"{exc.one_line()} (both hosts rolled back)") from None
            for h, th in zip(self.hosts, threading, strict=True):
                h.threading = th
        for i, h in enumerate(self.hosts):
            h.applied = configs[i]
            h.skip_to_now()
        self._collected_to = time.time()
        self._held = []
        return time.monotonic() - t0

    def threading(self) -> tuple[str, str]:
        return self.hosts[0].threading, self.hosts[1].threading

    def use_store(self, store: TableStore) -> None:
        if self.cotune is not None:
            self.cotune.store = store

    def _rollback_all(self) -> None:
        self._keeper.stop()
        rollback(self.hosts, self.experiment)

    def window(self, seconds: float) -> tuple[Sample, Sample]:
        if seconds <= 0:
            raise InputError("a window must be longer than 0 s")
        if self._keeper.error:
            raise (LinkDown if self._keeper.link_down else HostError)(self._keeper.error)
        start = time.time()
        time.sleep(seconds)
        end = time.time()
        self._window_s = seconds

        def fetch(h: AgentHost) -> None:
            h.fetch(end + h.offset, wait_s=max(5.0, 10 * h.sample_interval))

        with ThreadPoolExecutor(2) as pool:  # both hosts at once: SSH round trips overlap
            list(pool.map(fetch, self.hosts))  # a failure consumes nothing (see recover)
        a, b = (
            h.sample(h.take(start + h.offset, end + h.offset), start + h.offset, end + h.offset,
                     h.name, h.applied)
            for h in self.hosts
        )  # fmt: skip
        self._collected_to = end
        return a, b

    def windows(self, seconds: float, count: int) -> list[tuple[Sample, Sample]]:
        """``count`` contiguous windows of ``seconds``: one wait of ``count * seconds``, then
        one collection per host cut into windows (the agents spool every sample). Window by
        window, each window's round trips to the agents came on top of it: with 50 ms
        windows and 0.3 s round trips (SSH, a busy controller) a comparison took 7x its
        measured time (tests/e2e/test_scenario.py). Windows shorter than ``BATCH_MIN_ROWS``
        of the agents' sample intervals are still measured one by one."""
        if count <= 1 or seconds < BATCH_MIN_ROWS * max(h.sample_interval for h in self.hosts):
            # windows of a few agent samples: one by one, each starts just after a row (cut
            # back to back, a 10 ms window over 10 ms rows is often empty: no row's midpoint)
            return [self.window(seconds) for _ in range(count)]
        if seconds <= 0:
            raise InputError("a window must be longer than 0 s")
        if self._keeper.error:
            raise (LinkDown if self._keeper.link_down else HostError)(self._keeper.error)
        start = time.time()
        # the wait watches the lease keeper, whose renewals reach the agents every lease/3:
        # a link that goes silent mid-batch is noticed in seconds, not at the batch's end
        while (left := start + count * seconds - time.time()) > 0:
            time.sleep(min(left, BATCH_POLL_S))
            if self._keeper.error:
                raise (LinkDown if self._keeper.link_down else HostError)(self._keeper.error)
        ends = {h.name: _edges(start + h.offset, seconds, count) for h in self.hosts}
        self._window_s = seconds
        # a LinkDown here consumes nothing: recover() cuts what the agents spooled since the
        # last window collected into windows, these included

        def fetch(h: AgentHost) -> None:
            h.fetch(ends[h.name][-1], wait_s=max(5.0, 10 * h.sample_interval))

        with ThreadPoolExecutor(2) as pool:  # both hosts at once: SSH round trips overlap
            list(pool.map(fetch, self.hosts))
        per_host: list[list[Sample]] = []
        for h in self.hosts:
            edges = ends[h.name]
            bins: list[list[Row]] = [[] for _ in range(count)]
            for r in h.take(edges[0], edges[-1]):  # rows whose midpoint is in the span
                k = bisect.bisect_right(edges, r.t - r.duration / 2) - 1
                bins[min(count - 1, max(0, k))].append(r)
            per_host.append(
                [
                    h.sample(rows, t0, t1, h.name, h.applied)
                    for rows, t0, t1 in zip(bins, edges, edges[1:], strict=False)
                ]
            )
        self._collected_to = start + count * seconds
        return list(zip(per_host[0], per_host[1], strict=True))

    def recover(self) -> list[tuple[Sample, Sample]]:
        """After a :class:`~musku.errors.LinkDown`: wait until both agents answer again (at
        most ``reconnect_timeout_s``, polling with back-off), then collect everything they
        spooled since the last window collected, as windows of the last window's length up to
        now (a window in which a host was not at its arm's configuration, e.g. after its
        lease lapsed and it reverted, is invalid). The comparison in flight is over: its
        caller records these windows and starts it again. HostError when a host stays away."""
        self._keeper.stop()
        deadline = time.monotonic() + self.reconnect_timeout_s
        for h in self.hosts:
            delay, last = 0.2, "no answer"
            while True:
                try:
                    h.link.call("status")
                    break
                except LinkDown as exc:
                    last = exc.one_line()
                now = time.monotonic()
                if now >= deadline:
                    raise HostError(
                        f"{h.name}: link did not come back within "
                        f"{self.reconnect_timeout_s:g}s ({last})"
                    )
                time.sleep(min(delay, deadline - now))
                delay = min(delay * 2, 5.0)
        self._keeper.error, self._keeper.link_down = "", False
        start, end, step = self._collected_to, time.time(), self._window_s
        edges = [start + k * step for k in range(max(0, math.floor((end - start) / step)) + 1)]
        per_host: list[list[Sample]] = []
        for h in self.hosts:
            h.fetch(edges[-1] + h.offset, wait_s=max(5.0, 10 * h.sample_interval))
            rows = h.take(start + h.offset, edges[-1] + h.offset)
            per_host.append(
                [
                    h.sample(rows, t0 + h.offset, t1 + h.offset, h.name, h.applied)
                    for t0, t1 in zip(edges, edges[1:], strict=False)
                ]
            )
        self._collected_to = edges[-1]
        held, self._held = self._held, []
        return held + list(zip(per_host[0], per_host[1], strict=True))

    def restore(self) -> None:
        self._rollback_all()  # the agents also put their mid-tiers' threading back
        self._forget_applied()

    def _forget_applied(self) -> None:
        """After a rollback each host is at its baseline again: say so."""
        for h in self.hosts:
            h.applied = Configuration()
            h.threading = ""

    def close(self) -> None:
        self._keeper.stop()
        for h in self.hosts:
            h.flush_ack()
            h.link.close()

    def describe(self) -> Mapping[str, Any]:
        return {
            "backend": self.backend,
            "hosts": [h.name for h in self.hosts],
            "agents": {
                h.name: {
                    **h.info,
                    "clock_offset_s": h.offset,
                    "clock_offset_rtt_s": h.offset_rtt if math.isfinite(h.offset_rtt) else None,
                }
                for h in self.hosts
            },
            "lease_s": self.lease_s,
            "cotune": self.cotune.spec.to_json() if self.cotune is not None else None,
        }


class AgentGroup:
    """``n`` agent hosts driven as one multi-arm group (the
    :class:`musku.hosts.group.HostGroup` interface; ``[sweep] mode = "multiarm"``).

    ``apply`` sends every host its configuration at once (each under the experiment's lease,
    renewed by a :class:`LeaseKeeper`); when any host refuses or fails, every host of the group
    is rolled back and :class:`~musku.errors.HostError` raised: nothing is left half-applied.
    ``measure(count)`` waits ``count`` windows of ``tick_s`` seconds and returns, per host and
    window, the mean of the primary ``metric`` over the spool rows that fell in the window (the
    previous window's value where a window caught none; a host with no rows at all, or whose
    rows were taken at another configuration or saw an outside change, is a HostError), and
    keeps the ``guard_metrics`` of the same windows in ``guard`` (NaN where none). The
    hosts' links belong to their pairs: :meth:`close` stops the lease and acknowledges rows,
    it does not close the links."""

    def __init__(
        self,
        hosts: Sequence[AgentHost],
        *,
        metric: str,
        lease_s: float = 30.0,
        name: str = "",
        tick_s: float | None = None,
        guard_metrics: Sequence[str] = (),
    ) -> None:
        if len(hosts) < 2:
            raise InputError(f"a group needs >= 2 hosts, not {len(hosts)}")
        # the guardrail metrics per host and window of the last measure (NaN where a window
        # caught none): run_scan checks every arm against the experiment's guardrails
        self.guard_metrics = tuple(m for m in guard_metrics if m != metric)
        self.guard: dict[str, Any] = {}
        self.hosts = list(hosts)
        self.n = len(self.hosts)
        self.names = [h.name for h in self.hosts]
        self.metric = metric
        self.lease_s = lease_s
        self.experiment = name or f"musku-{int(time.time())}"
        self._tick = float(tick_s) if tick_s else max(h.sample_interval for h in self.hosts)
        self._keeper = LeaseKeeper(self.hosts, lease_s)
        self._keeper.experiment = self.experiment
        self._t0 = time.monotonic()
        self._last = np.full(self.n, np.nan)

    @property
    def t(self) -> float:
        return time.monotonic() - self._t0

    @property
    def tick_s(self) -> float:
        return self._tick

    def apply(self, configs: Sequence[Configuration]) -> float:
        if len(configs) != self.n:
            raise InputError(f"apply takes one configuration per host ({self.n})")
        t0 = time.monotonic()

        def one(i: int) -> Any:
            h = self.hosts[i]
            reply = h.link.call(
                "apply",
                config=configs[i].as_dict(),
                lease_s=self.lease_s,
                **{"experiment": self.experiment, **h.owner_fields(self.experiment)},
            )
            if isinstance(reply, dict) and reply.get("rebooting"):
                wait_for_reboot(h, reply, DEFAULT_TIMEOUT_S)
            return reply

        self._keeper.start()
        with ThreadPoolExecutor(self.n) as pool:
            futures = [pool.submit(one, i) for i in range(self.n)]
            errors = [exc for f in futures if (exc := f.exception()) is not None]
        if errors:
            self.restore()
            first = errors[0]
            why = first.one_line() if isinstance(first, MuskuError) else str(first)
            raise HostError(f"group apply failed: {why} (every host of the group rolled back)")
        self._keeper.error = ""
        for h, cfg in zip(self.hosts, configs, strict=True):
            h.applied = cfg
            h.skip_to_now()
        return time.monotonic() - t0

    def measure(self, count: int) -> Any:
        if self._keeper.error:
            raise HostError(self._keeper.error)
        start = time.time()
        time.sleep(count * self._tick)
        end = time.time()
        edges = np.linspace(0.0, end - start, count + 1)

        def collect(h: AgentHost) -> list[Row]:
            return h.rows_between(
                start + h.offset, end + h.offset, wait_s=max(5.0, 10 * h.sample_interval)
            )

        with ThreadPoolExecutor(self.n) as pool:
            per_host = list(pool.map(collect, self.hosts))
        out = np.full((count, self.n), np.nan)
        guard = {m: np.full((count, self.n), np.nan) for m in self.guard_metrics}
        for j, (h, rows) in enumerate(zip(self.hosts, per_host, strict=True)):
            whole = h.sample(rows, start + h.offset, end + h.offset, h.name, h.applied)
            if not whole.valid or self.metric not in whole.metrics:
                raise HostError(f"{h.name}: no usable {self.metric} samples: {whole.note}")
            for w in range(count):
                lo, hi = start + h.offset + edges[w], start + h.offset + edges[w + 1]
                s = aggregate(rows, host=h.name, t0=lo, t1=hi)
                v = s.metrics.get(self.metric, math.nan)
                for m, arr in guard.items():
                    arr[w, j] = s.metrics.get(m, math.nan)
                out[w, j] = v if math.isfinite(v) and v > 0 else self._last[j]
                self._last[j] = out[w, j]
            first = whole.metrics[self.metric]
            out[:, j] = np.where(np.isfinite(out[:, j]), out[:, j], first)
        self.guard = guard
        return out

    def restore(self) -> None:
        """Every host back at its baseline (best effort per host; the lease stops)."""
        self._keeper.stop()
        rollback(self.hosts, self.experiment)
        for h in self.hosts:
            h.applied = Configuration()

    def close(self) -> None:
        self._keeper.stop()
        for h in self.hosts:
            h.flush_ack()


# --------------------------------------------------------------------------- factory


@dataclass(frozen=True)
class HostOpt:
    """One host of ``[hosts]`` (see :func:`hosts_of`)."""

    name: str
    host: str
    port: int
    user: str
    socket: str
    # co-tuning: where this host's mid-tier answers the Admin RPC, when it is not where the
    # experiment's [threading] admin / admin_port_file says ({"admin": ...} or
    # {"admin_port_file": ...}; empty: the experiment's)
    midtier: Mapping[str, str] = field(default_factory=dict)


def host_options(opts: Mapping[str, Any]) -> list[HostOpt]:
    """The two hosts of ``[hosts]``, validated by
    :class:`~musku.schema.hosts.AgentOptions` (as ``musku check`` does)."""
    return hosts_of(parse_options(AgentOptions, opts))


def hosts_of(o: AgentOptions) -> list[HostOpt]:
    """The hosts of validated ``[hosts]`` options, in order (a name alone: that SSH host at
    the default port and user; a table: its host, port, user, socket and co-tuning admin)."""
    out = []
    for entry in o.hosts:
        if isinstance(entry, str):
            out.append(HostOpt(entry, entry, o.ssh_port, o.ssh_user, ""))
            continue
        midtier = {
            spec_key: getattr(entry, key)
            for key, spec_key in MIDTIER_KEYS.items()
            if getattr(entry, key)
        }
        port = o.ssh_port if entry.port is None else entry.port
        user = entry.user or o.ssh_user
        out.append(HostOpt(host_name(entry), entry.host, port, user, entry.socket, midtier))
    return out


def make_link(h: HostOpt, opts: Mapping[str, Any], *, timeout: float = 300.0) -> Link:
    """``timeout``: the longest request (an apply that trains a threading table is long)."""
    o = parse_options(AgentOptions, opts)
    if not h.host:
        return SocketLink(h.socket, timeout=max(120.0, timeout), rpc_timeout=o.rpc_timeout_s)
    return SshLink(
        h.host,
        user=h.user,
        port=h.port,
        identity_file=o.identity_file or None,
        known_hosts=o.known_hosts or None,
        remote_command=list(o.remote_command),
        agent_socket=h.socket or None,
        connect_timeout=o.connect_timeout_s,
        timeout=timeout,
        rpc_timeout=o.rpc_timeout_s,
    )


def cotune_tables(experiment: Experiment) -> ControllerTables | None:
    """The controller's side of co-tuning for agent hosts (None when the experiment's
    ``[threading] cotune`` is off)."""
    spec = experiment.cotune
    return None if spec is None else ControllerTables(spec, experiment.platform.name)


def open_pair(experiment: Experiment, seed: int = 0) -> AgentPair:
    opts = experiment.hosts.options
    options = parse_options(AgentOptions, opts, str(experiment.path))
    lease = options.lease_s
    hosts = hosts_of(options)
    tables = cotune_tables(experiment)
    for h in (h for h in hosts if h.midtier):
        if tables is None:
            raise InputError(
                f"[hosts] {h.name}: midtier_admin / midtier_admin_port_file are for co-tuning: "
                "set [threading] cotune = true or remove them"
            )
        tables.midtier(h.name, h.midtier)  # checked now, not at the first apply
    timeout = 300.0 if tables is None else max(300.0, timeout_for(tables.spec))
    links = [make_link(h, opts, timeout=timeout) for h in hosts]
    try:
        return AgentPair(
            (
                AgentHost(hosts[0].name, links[0], hosts[0].midtier),
                AgentHost(hosts[1].name, links[1], hosts[1].midtier),
            ),  # fmt: skip
            lease_s=float(lease),
            name=experiment.name,
            cotune=tables,
            reboot_timeout_s=float(options.reboot_timeout_s),
            reconnect_timeout_s=float(options.reconnect_timeout_s),
            take_over=options.take_over,
        )
    except BaseException:
        for link in links:
            link.close()
        raise
