"""The agent's API listeners: a root-only Unix socket, optionally an HMAC-authenticated TCP
port, optionally a Prometheus HTTP endpoint.

The Unix socket is created mode 0600 (owner: the agent's user, root in production) and every
connection's peer uid is checked with ``SO_PEERCRED``: uids outside ``allowed_uids`` get one
error reply and are disconnected, even if the file mode was loosened.

A bounded server (docs/agent.md "Server limits"): one asyncio event loop thread accepts and
reads every connection; requests run on a small pool of worker threads, one request at a time
per connection (reading pauses while it runs, so nothing piles up). Every connection has a
deadline in each state, every buffer a cap, and the connection counts are limited:

- a TCP connection is *pending* until its first line authenticates (HMAC); that line must fit
  in :data:`~musku.agent.protocol.PREAUTH_LINE` bytes and arrive within ``auth_deadline_s``.
  When ``max_pending`` pending connections exist the oldest is dropped for a new one, so a
  flood of idle or slow clients cannot lock a controller out;
- authenticated TCP connections and Unix connections are *clients*: at most ``max_clients``;
  one more gets an immediate one-line ``agent busy`` reply (type ``AgentBusy``, status 6) and
  is closed, so a client never waits on a connection that will not be served (the client
  library raises :class:`~musku.agent.protocol.AgentBusy`; the controller retries with
  back-off). A request line may be :data:`~musku.agent.protocol.MAX_LINE` bytes and must
  complete within ``line_deadline_s`` once started; a connection idle for ``idle_timeout_s``
  (short: clients reconnect on their next call) is closed, so idle or slow clients hold a slot
  for seconds, not minutes; a reply must drain within ``write_deadline_s``;
- out of file descriptors (EMFILE), the loop stops accepting for a second instead of spinning
  (musku accepts itself: Python 3.11's ``create_server`` retries ``accept`` ``backlog`` times
  per wake-up and schedules as many retries, thousands of failed accepts a second); the soft ``RLIMIT_NOFILE`` is raised towards ``nofile`` at start and the
  pending limit shrunk to fit what the process may open.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import math
import os
import resource
import socket
import stat
import struct
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import make_wsgi_app

from musku.agent.core_errors import error_reply
from musku.agent.protocol import (
    BUSY,
    MAX_LINE,
    PREAUTH_LINE,
    Verifier,
    decode_request,
    encode,
)
from musku.errors import HostError, InputError

if TYPE_CHECKING:
    from musku.agent.config import AgentConfig
    from musku.agent.core import Agent

log = logging.getLogger("musku.agent")
_UCRED = struct.Struct("3i")
_OUT_OF_RESOURCES = (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM)
ACCEPT_RETRY_S = 1.0  # how long accepting pauses when the process is out of descriptors


@dataclass(frozen=True)
class ServerLimits:
    """The server's bounds (documented in docs/agent.md "Server limits")."""

    max_clients: int = 64  # Unix + authenticated TCP connections at once
    max_pending: int = 2048  # TCP connections not yet authenticated (oldest dropped when full)
    auth_deadline_s: float = 10.0  # a TCP connection's first line must be in by then
    line_deadline_s: float = 10.0  # a started request line must be complete within this
    idle_timeout_s: float = 15.0  # a connection without a request this long is closed
    write_deadline_s: float = 60.0  # a reply must drain to the client within this
    preauth_line: int = PREAUTH_LINE
    max_line: int = MAX_LINE
    workers: int = 4  # threads running requests (most requests serialise on the agent lock)
    backlog: int = 1024  # listen(2) backlog (the kernel caps it at net.core.somaxconn)
    nofile: int = 8192  # the soft RLIMIT_NOFILE to raise to (up to the hard limit)
    fd_reserve: int = 256  # descriptors kept for the journal, spool, perf events, ...


DEFAULT_LIMITS = ServerLimits()


def limits_of(config: AgentConfig) -> ServerLimits:
    """The default limits with what the agent's configuration sets (``max_clients``,
    ``idle_timeout_s``, ``line_deadline_s``)."""
    return replace(
        DEFAULT_LIMITS,
        max_clients=config.max_clients,
        idle_timeout_s=config.idle_timeout_s,
        line_deadline_s=config.line_deadline_s,
    )


def peer_credentials(sock: Any) -> tuple[int, int, int]:
    """(pid, uid, gid) of the process at the other end of a Unix socket."""
    raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _UCRED.size)
    pid, uid, gid = _UCRED.unpack(raw)
    return pid, uid, gid


def _error(message: str, status: int = 3, kind: str = "InputError") -> dict[str, Any]:
    return {"ok": False, "error": {"type": kind, "status": status, "message": message}}


def _refusal(message: str) -> dict[str, Any]:
    """A limit or deadline: the agent is fine, the connection is over (HostError, status 6)."""
    return _error(message, 6, "HostError")


def _busy(limits: ServerLimits) -> dict[str, Any]:
    """Every client slot is taken: the request was not read (safe to send again later)."""
    return _error(
        f"agent busy: all {limits.max_clients} connection slots are taken; retry later",
        6,
        BUSY,
    )


def _fit_fd_limit(limits: ServerLimits) -> ServerLimits:
    """Raise the soft RLIMIT_NOFILE towards ``limits.nofile``; shrink ``max_pending`` so that
    every connection the limits allow has a descriptor."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = limits.nofile if hard == resource.RLIM_INFINITY else min(limits.nofile, hard)
    if soft != resource.RLIM_INFINITY and soft < want:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
            soft = want
    if soft == resource.RLIM_INFINITY:
        return limits
    # the clients, then the pending TCP connections
    room = soft - limits.fd_reserve - limits.max_clients
    if room >= limits.max_pending:
        return limits
    pending = max(8, room)
    log.warning(
        "RLIMIT_NOFILE is %d: at most %d unauthenticated TCP connections (max %d); raise "
        "LimitNOFILE",
        soft,
        pending,
        limits.max_pending,
    )
    return replace(limits, max_pending=pending)


class _Hub:
    """What the connections share: the agent, the limits, the worker pool, the counts."""

    def __init__(self, agent: Agent, limits: ServerLimits, verifier: Verifier | None) -> None:
        self.agent = agent
        self.limits = limits
        self.verifier = verifier
        self.allowed_uids: set[int] = set()
        self.loop: asyncio.AbstractEventLoop | None = None
        self.pool = ThreadPoolExecutor(limits.workers, thread_name_prefix="agent-request")
        self.clients: set[_Connection] = set()
        self.pending: dict[_Connection, None] = {}  # insertion order: oldest first
        self.connections: set[_Connection] = set()  # all of them (for the shutdown)
        self._last_fd_warning = 0.0
        self._last_auth_warning = -math.inf
        self._unlogged = 0

    def refused(self, why: str) -> None:
        self.agent.metrics.refused.labels(why=why).inc()

    def warn_refused(self, peer: str, why: str) -> None:
        """Log a refused TCP request: at most one line a second (a flood of bad requests must
        not flood the journal), saying how many were not logged."""
        now = time.monotonic()
        if now - self._last_auth_warning < 1.0:
            self._unlogged += 1
            return
        more = f" (and {self._unlogged} more since the last one logged)" if self._unlogged else ""
        log.warning("refused a TCP request from %s: %s%s", peer, why, more)
        self._last_auth_warning, self._unlogged = now, 0

    def on_loop_error(self, loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        """asyncio's error hook: out of descriptors is a warning (the acceptor then pauses
        for a second), at most every 10 s; anything else is logged as an error."""
        exc = context.get("exception")
        if isinstance(exc, OSError) and exc.errno in _OUT_OF_RESOURCES:
            self.refused("fd-limit")
            now = time.monotonic()
            if now - self._last_fd_warning > 10.0:
                self._last_fd_warning = now
                log.warning(
                    "out of file descriptors (%s): not accepting for 1 s (%d clients, %d pending)",
                    exc.strerror,
                    len(self.clients),
                    len(self.pending),
                )
            return
        log.error("agent server: %s", context.get("message"), exc_info=exc)


class _Connection(asyncio.Protocol):
    """One client connection: a line buffer with a cap, a deadline, one request at a time."""

    def __init__(self, hub: _Hub, kind: str) -> None:
        self.hub = hub
        self.kind = kind  # "unix" or "tcp"
        self.transport: asyncio.Transport | None = None
        self.buf = bytearray()
        self.scanned = 0  # bytes of buf known to hold no newline
        self.authenticated = False
        self.busy = False
        self.closed = False
        self.eof = False  # the peer half-closed: answer what it sent, then close
        self.write_paused = False
        self.timer: asyncio.TimerHandle | None = None
        self.line_timer_set = False
        self.peer = ""

    # ------------------------------------------------------------------ life cycle

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        hub = self.hub
        hub.connections.add(self)
        if self.kind == "unix":
            try:
                pid, uid, _ = peer_credentials(transport.get_extra_info("socket"))
            except OSError:  # the peer is gone already
                self.closed = True
                transport.abort()
                return
            self.peer = f"uid {uid} pid {pid}"
            if uid not in hub.allowed_uids:
                hub.refused("uid")
                log.warning("refused a connection from uid %d (pid %d): not allowed", uid, pid)
                self._finish(_error(f"permission denied: uid {uid} may not use this agent", 6))
                return
            self._become_client(self._next_line)
            return
        peer = transport.get_extra_info("peername")
        self.peer = f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else str(peer)
        while len(hub.pending) >= hub.limits.max_pending:
            oldest = next(iter(hub.pending))
            hub.refused("pending-limit")
            oldest._finish(_refusal("too many unauthenticated connections: dropped the oldest"))
            oldest._forget()
        hub.pending[self] = None
        self._arm(hub.limits.auth_deadline_s, "authentication")

    def _become_client(self, then: Callable[[], None]) -> None:
        """Take a client slot and go on with ``then``; with every slot taken, answer ``agent
        busy`` at once and close (nothing of the connection's request is read or run)."""
        hub = self.hub
        hub.pending.pop(self, None)
        self.authenticated = True
        if len(hub.clients) >= hub.limits.max_clients:
            hub.refused("client-limit")
            self.busy = False
            self._finish(_busy(hub.limits))
            return
        hub.clients.add(self)
        self._arm(hub.limits.idle_timeout_s, "idle")
        then()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self._forget()
        self.hub.connections.discard(self)

    def _forget(self) -> None:
        hub = self.hub
        hub.pending.pop(self, None)
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        hub.clients.discard(self)

    def _finish(self, reply: dict[str, Any] | bytes | None) -> None:
        """Send a last reply (best effort) and close; abort if it does not drain in time."""
        if self.transport is None or self.transport.is_closing():
            return
        self.closed = True
        self._forget()
        t = self.transport
        if reply is not None:
            if isinstance(reply, dict):
                reply = {**reply, "closed": True}  # a parting line: clients reconnect
            with contextlib.suppress(OSError, RuntimeError):
                t.write(reply if isinstance(reply, bytes) else encode(reply))
        t.close()
        if t.get_write_buffer_size():
            assert self.hub.loop is not None
            self.hub.loop.call_later(self.hub.limits.write_deadline_s, t.abort)

    # ------------------------------------------------------------------ deadlines

    def _arm(self, seconds: float, what: str) -> None:
        if self.timer is not None:
            self.timer.cancel()
        assert self.hub.loop is not None
        self.timer = self.hub.loop.call_later(seconds, self._expire, what, seconds)

    def _disarm(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None

    def _expire(self, what: str, seconds: float) -> None:
        self.timer = None
        if self.closed:
            return
        self.hub.refused(f"{what}-timeout")
        messages = {
            "authentication": f"no authenticated request within {seconds:g} s",
            "idle": f"idle for {seconds:g} s",
            "line": f"request line not complete within {seconds:g} s",
            "write": f"reply not read within {seconds:g} s",
        }
        log.debug("closing %s connection from %s: %s", self.kind, self.peer, messages[what])
        if what == "write":
            assert self.transport is not None
            self.closed = True
            self._forget()
            self.transport.abort()
            return
        self._finish(_refusal(f"connection closed: {messages[what]}"))

    # ------------------------------------------------------------------ reading

    @property
    def cap(self) -> int:
        lim = self.hub.limits
        return lim.max_line if self.authenticated else lim.preauth_line

    def data_received(self, data: bytes) -> None:
        if self.closed:
            return
        self.buf += data
        if self.busy:
            if len(self.buf) > self.cap:
                assert self.transport is not None
                self.transport.pause_reading()  # resumed once the request is answered
            return
        self._next_line()

    def eof_received(self) -> bool | None:
        """The peer half-closed: a last line without its newline still counts; the requests
        already sent are answered, then the connection is closed."""
        self.eof = True
        if self.buf and not self.buf.endswith(b"\n"):
            self.buf += b"\n"
        if not self.busy:
            self._next_line()
        return True  # keep the transport open to write the replies

    def _next_line(self) -> None:
        """Start the next complete request in the buffer, or set the right deadline."""
        while not self.closed and not self.busy:
            nl = self.buf.find(b"\n", self.scanned)
            if nl < 0:
                self.scanned = len(self.buf)
                if len(self.buf) > self.cap:
                    self._too_long()
                    return
                if self.buf and self.authenticated and not self.eof:
                    if not self.line_timer_set:
                        self.line_timer_set = True
                        self._arm(self.hub.limits.line_deadline_s, "line")
                    return
                break
            if nl > self.cap:
                self._too_long()
                return
            line = bytes(self.buf[:nl])
            del self.buf[: nl + 1]
            self.scanned = 0
            self.line_timer_set = False
            if not line.strip():
                continue
            self._start(line)
        if self.busy or self.closed:
            return
        if self.eof:
            self._finish(None)
        elif not self.buf and self.authenticated:
            self._arm(self.hub.limits.idle_timeout_s, "idle")

    def _too_long(self) -> None:
        self.hub.refused("size")
        if self.authenticated:
            msg = f"request longer than {self.cap} bytes"
        else:
            msg = (
                f"the first request of a TCP connection must authenticate within {self.cap} "
                "bytes (send a signed hello first)"
            )
        self._finish(_error(msg))

    # ------------------------------------------------------------------ requests

    def _start(self, line: bytes) -> None:
        hub = self.hub
        assert hub.loop is not None and self.transport is not None
        if self.kind == "tcp" and not self.authenticated:
            # the first line (at most PREAUTH_LINE bytes): checked here, on the loop
            try:
                req = self._verify(decode_request(line))
            except InputError as exc:
                hub.refused("auth")
                hub.warn_refused(self.peer, exc.message)
                self._finish(_error(f"permission denied: {exc.message}", 6))
                return

            def handle() -> tuple[bytes, bool]:
                return encode(hub.agent.handle(req)), False

            self.busy = True  # the next lines wait for this request, wherever it waits
            self._become_client(lambda: self._submit(handle))
            return

        def serve() -> tuple[bytes, bool]:
            return self._serve(line)

        self.busy = True
        self._submit(serve)

    def _submit(self, work: Callable[[], tuple[bytes, bool]]) -> None:
        hub = self.hub
        assert hub.loop is not None and self.transport is not None
        self.busy = True
        self._disarm()
        self.transport.pause_reading()
        fut = hub.loop.run_in_executor(hub.pool, work)
        fut.add_done_callback(self._done)

    def _verify(self, req: dict[str, Any]) -> dict[str, Any]:
        assert self.hub.verifier is not None
        return self.hub.verifier.check(req)

    def _serve(self, line: bytes) -> tuple[bytes, bool]:
        """(reply, close after it): runs on a worker thread."""
        try:
            req = decode_request(line)
        except InputError as exc:
            return encode(error_reply(exc)), False
        if self.kind == "tcp":
            try:
                req = self._verify(req)
            except InputError as exc:
                hub = self.hub
                hub.refused("auth")
                assert hub.loop is not None
                hub.loop.call_soon_threadsafe(hub.warn_refused, self.peer, exc.message)
                return encode(_error(f"permission denied: {exc.message}", 6)), True
        return encode(self.hub.agent.handle(req)), False

    def _done(self, fut: asyncio.Future[tuple[bytes, bool]]) -> None:
        self.busy = False
        if self.closed or self.transport is None:
            return
        try:
            data, close = fut.result()
        except asyncio.CancelledError:  # the pool is shutting down
            return
        except Exception as exc:  # noqa: BLE001 - a bug: answer it, keep the connection sane
            log.exception("agent server: request failed")
            data, close = encode(error_reply(exc)), False
        if close:
            self._finish(data)
            return
        self.transport.write(data)  # may call pause_writing()
        if self.write_paused:
            self._arm(self.hub.limits.write_deadline_s, "write")
        else:
            self._resume()

    def pause_writing(self) -> None:
        self.write_paused = True

    def resume_writing(self) -> None:
        self.write_paused = False
        if not self.busy and not self.closed:
            self._disarm()
            self._resume()

    def _resume(self) -> None:
        assert self.transport is not None
        self.transport.resume_reading()
        self._next_line()


async def _abort_all(hub: _Hub) -> None:
    """Abort every connection, letting queued callbacks run first and the transports close
    their sockets after."""
    for _ in range(5):
        await asyncio.sleep(0.01)
        for conn in list(hub.connections):
            conn.closed = True
            conn._forget()
            if conn.transport is not None:
                conn.transport.abort()


def _prepare_socket_path(path: Path) -> None:
    """Make room for the socket: refuse anything there but a socket; remove a stale socket
    (nobody listening); refuse if an agent answers on it."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o755)
    try:
        st = path.lstat()
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(st.st_mode):
        what = "a symbolic link" if stat.S_ISLNK(st.st_mode) else "not a socket"
        raise HostError(f"{path} exists and is {what}: refusing to replace it (remove it first)")
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.settimeout(2.0)
        probe.connect(str(path))
    except (ConnectionRefusedError, FileNotFoundError):
        path.unlink(missing_ok=True)  # stale socket of a dead agent
    except OSError as exc:
        if exc.errno != errno.EAGAIN:
            raise HostError(f"cannot check the socket {path}: {exc.strerror}") from None
        raise HostError(f"another agent is listening on {path} (busy)") from None
    else:
        raise HostError(f"another agent is listening on {path}")
    finally:
        probe.close()


def _unix_listener(path: Path, backlog: int) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old = os.umask(0o177)  # the socket file is born 0600: no window with looser modes
    try:
        sock.bind(str(path))
        os.chmod(path, 0o600)
        sock.listen(backlog)
    except OSError as exc:
        sock.close()
        raise HostError(f"cannot listen on {path}: {exc.strerror}") from None
    finally:
        os.umask(old)
    sock.setblocking(False)
    return sock


def _tcp_listener(address: str, backlog: int) -> socket.socket:
    host, _, port = address.rpartition(":")
    host = host.strip("[]")
    try:
        sock = socket.create_server(
            (host, int(port)),
            family=socket.AF_INET6 if ":" in host else socket.AF_INET,
            backlog=backlog,
        )
    except (OSError, ValueError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) else str(exc)
        raise HostError(f"cannot listen on {address}: {reason}") from None
    sock.setblocking(False)
    return sock


class _Acceptor:
    """Accepts on one listening socket in the event loop: up to ``burst`` connections per
    wake-up, each handed to ``loop.connect_accepted_socket``. Out of descriptors (or kernel
    memory) it stops watching the socket for :data:`ACCEPT_RETRY_S`, once, and tells the hub;
    the clients wait in the kernel's backlog meanwhile."""

    burst = 64

    def __init__(self, hub: _Hub, sock: socket.socket, kind: str) -> None:
        assert hub.loop is not None
        self.hub, self.sock, self.kind, self.loop = hub, sock, kind, hub.loop
        self.fd = sock.fileno()
        self.retry: asyncio.TimerHandle | None = None
        self.attaching: set[asyncio.Task[Any]] = set()
        self.closed = False

    def start(self) -> None:
        self.retry = None
        if not self.closed:
            self.loop.add_reader(self.fd, self._accept)

    def _accept(self) -> None:
        for _ in range(self.burst):
            try:
                conn, _ = self.sock.accept()
            except (BlockingIOError, InterruptedError, ConnectionAbortedError):
                return
            except OSError as exc:
                if exc.errno not in _OUT_OF_RESOURCES:
                    raise  # the loop's error hook logs it
                self.loop.remove_reader(self.fd)
                self.retry = self.loop.call_later(ACCEPT_RETRY_S, self.start)
                self.loop.call_exception_handler(
                    {"message": "accept() out of system resources", "exception": exc}
                )
                return
            conn.setblocking(False)
            task = self.loop.create_task(self._attach(conn))
            self.attaching.add(task)
            task.add_done_callback(self.attaching.discard)

    async def _attach(self, conn: socket.socket) -> None:
        try:
            await self.loop.connect_accepted_socket(lambda: _Connection(self.hub, self.kind), conn)
        except BaseException:
            conn.close()
            raise

    async def close(self) -> None:
        """Stop accepting, let accepts under way attach (their connections are then aborted
        with the rest), close the listening socket."""
        self.closed = True
        self.loop.remove_reader(self.fd)
        if self.retry is not None:
            self.retry.cancel()
        if self.attaching:
            await asyncio.wait(list(self.attaching), timeout=5)
        self.sock.close()


class Listeners:
    """Starts and stops the agent's listeners: one event-loop thread for the API sockets, a
    pool of ``limits.workers`` request threads, one thread for the Prometheus endpoint."""

    def __init__(self, agent: Agent, limits: ServerLimits | None = None) -> None:
        self.agent = agent
        self.limits = limits or limits_of(agent.config)
        self.hub: _Hub | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._acceptors: list[_Acceptor] = []
        self._socket_id: tuple[int, int] | None = None
        self._http: Any = None

    def start(self) -> None:
        cfg = self.agent.config
        limits = _fit_fd_limit(self.limits)
        verifier = None
        if cfg.tcp_listen:
            assert cfg.token_file is not None
            try:
                token = cfg.token_file.read_bytes().strip()
            except OSError as exc:
                raise HostError(
                    f"cannot read token_file {cfg.token_file}: {exc.strerror}"
                ) from None
            verifier = Verifier(token)
        hub = self.hub = _Hub(self.agent, limits, verifier)
        hub.allowed_uids = set(cfg.allowed_uids) | {os.geteuid()}
        socks: list[tuple[socket.socket, str]] = []
        try:
            _prepare_socket_path(cfg.socket)
            socks.append((_unix_listener(cfg.socket, limits.backlog), "unix"))
            st = cfg.socket.lstat()
            self._socket_id = (st.st_dev, st.st_ino)
            if cfg.tcp_listen:
                socks.append((_tcp_listener(cfg.tcp_listen, limits.backlog), "tcp"))
            self._start_loop(socks)
        except BaseException:
            for s, _ in socks:
                s.close()
            self._unlink_socket()
            hub.pool.shutdown(wait=False)
            raise
        log.info("listening on %s (mode 0600, uids %s)", cfg.socket, sorted(hub.allowed_uids))
        if cfg.tcp_listen:
            log.info("listening on tcp %s (HMAC-authenticated requests only)", cfg.tcp_listen)
        if cfg.prometheus_listen:
            self._start_http(cfg.prometheus_listen)

    def _start_loop(self, socks: list[tuple[socket.socket, str]]) -> None:
        assert self.hub is not None
        hub = self.hub
        loop = self._loop = asyncio.new_event_loop()
        hub.loop = loop
        loop.set_exception_handler(hub.on_loop_error)
        self._thread = threading.Thread(target=loop.run_forever, name="agent-server", daemon=True)
        self._thread.start()

        async def serve() -> None:
            for sock, kind in socks:
                acceptor = _Acceptor(hub, sock, kind)
                acceptor.start()
                self._acceptors.append(acceptor)

        asyncio.run_coroutine_threadsafe(serve(), loop).result(timeout=30)

    def _start_http(self, address: str) -> None:
        """The Prometheus endpoint: a single-threaded WSGI server (one scrape at a time, 5 s
        socket timeout), so it adds one thread however many clients connect."""

        class Quiet(WSGIRequestHandler):
            timeout = 5.0

            def log_message(self, format: str, *args: Any) -> None:
                pass

        class Server(WSGIServer):
            request_queue_size = 64

        host, _, port = address.rpartition(":")
        try:
            httpd = make_server(
                host,
                int(port),
                make_wsgi_app(self.agent.metrics.registry),
                server_class=Server,
                handler_class=Quiet,
            )
        except OSError as exc:
            raise HostError(f"cannot serve metrics on {address}: {exc.strerror}") from None
        t = threading.Thread(
            target=httpd.serve_forever,
            kwargs={"poll_interval": 0.5},
            name="agent-http",
            daemon=True,
        )
        t.start()
        self._http = (httpd, t)
        log.info("prometheus metrics on http://%s/metrics", address)

    def stop(self) -> None:
        loop, hub = self._loop, self.hub
        if loop is not None and hub is not None and self._thread is not None:

            async def shutdown() -> None:
                # stop accepting first and let accepts under way attach, then abort them all
                for acceptor in self._acceptors:
                    await acceptor.close()
                await _abort_all(hub)

            try:
                asyncio.run_coroutine_threadsafe(shutdown(), loop).result(timeout=10)
            except Exception as exc:  # noqa: BLE001 - stopping anyway
                log.warning("agent server shutdown: %s: %s", type(exc).__name__, exc)
            loop.call_soon_threadsafe(loop.stop)
            self._thread.join(timeout=10)
            hub.pool.shutdown(wait=True, cancel_futures=True)
            if not self._thread.is_alive():
                # callbacks still queued (a late accept's connection_made, a request's reply)
                # run now, on this thread; what they opened is aborted; then the loop closes
                loop.run_until_complete(_abort_all(hub))
                loop.close()
            self._loop = self._thread = None
            self._acceptors = []
        if self._http is not None:
            server, thread = self._http
            server.shutdown()
            server.server_close()
            thread.join(timeout=5)
            self._http = None
        self._unlink_socket()

    def _unlink_socket(self) -> None:
        """Remove our socket file (only ours: not a file someone put there since)."""
        path = self.agent.config.socket
        try:
            st = path.lstat()
        except OSError:
            return
        if self._socket_id == (st.st_dev, st.st_ino) and stat.S_ISSOCK(st.st_mode):
            with contextlib.suppress(OSError):
                path.unlink()
        self._socket_id = None


__all__ = ["DEFAULT_LIMITS", "Listeners", "ServerLimits", "limits_of", "peer_credentials"]
