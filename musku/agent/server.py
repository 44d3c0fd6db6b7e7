"""The agent's API listeners: a root-only Unix socket, optionally an HMAC-authenticated TCP
port, optionally a Prometheus HTTP endpoint.

The Unix socket is created mode 0600 (owner: the agent's user, root in production) and every
connection's peer uid is checked with ``SO_PEERCRED``: uids outside ``allowed_uids`` get one
error reply and are disconnected, even if the file mode was loosened.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
import socketserver
import struct
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any

from musku.agent.protocol import MAX_LINE, Verifier, encode
from musku.errors import HostError, InputError

if TYPE_CHECKING:
    from musku.agent.core import Agent

log = logging.getLogger("musku.agent")
_UCRED = struct.Struct("3i")


def peer_credentials(sock: socket.socket) -> tuple[int, int, int]:
    """(pid, uid, gid) of the process at the other end of a Unix socket."""
    raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _UCRED.size)
    pid, uid, gid = _UCRED.unpack(raw)
    return pid, uid, gid


def _error(message: str, status: int = 3) -> dict[str, Any]:
    return {"ok": False, "error": {"type": "InputError", "status": status, "message": message}}


class _Handler(socketserver.StreamRequestHandler):
    server: _UnixServer | _TcpServer
    timeout = 600.0

    def handle(self) -> None:
        srv = self.server
        agent: Agent = srv.agent
        if isinstance(srv, _UnixServer):
            pid, uid, _ = peer_credentials(self.connection)
            if uid not in srv.allowed_uids:
                agent.metrics.refused.labels(why="uid").inc()
                log.warning("refused a connection from uid %d (pid %d): not allowed", uid, pid)
                self._send(_error(f"permission denied: uid {uid} may not use this agent", 6))
                return
        while True:
            try:
                line = self.rfile.readline(MAX_LINE + 1)
            except (OSError, TimeoutError):
                return
            if not line:
                return
            if len(line) > MAX_LINE:
                self._send(_error(f"request longer than {MAX_LINE} bytes"))
                return
            if not line.strip():
                continue
            try:
                req = json.loads(line)
            except ValueError as exc:
                self._send(_error(f"malformed JSON request: {exc}"))
                continue
            if isinstance(srv, _TcpServer):
                try:
                    if not isinstance(req, dict):
                        raise InputError("a request is a JSON object")
                    req = srv.verifier.check(req)
                except InputError as exc:
                    agent.metrics.refused.labels(why="auth").inc()
                    log.warning(
                        "refused a TCP request from %s: %s", self.client_address, exc.message
                    )
                    self._send(_error(f"permission denied: {exc.message}", 6))
                    return
            if not self._send(agent.handle(req)):
                return

    def _send(self, reply: dict[str, Any]) -> bool:
        try:
            self.wfile.write(encode(reply))
            self.wfile.flush()
            return True
        except OSError:
            return False


class _UnixServer(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True
    allow_reuse_address = False

    def __init__(self, path: Path, agent: Agent, allowed_uids: tuple[int, ...]) -> None:
        self.agent = agent
        self.allowed_uids = set(allowed_uids) | {os.geteuid()}
        super().__init__(str(path), _Handler, bind_and_activate=False)

    def server_bind(self) -> None:
        old = os.umask(0o177)  # the socket file is born 0600: no window with looser modes
        try:
            super().server_bind()
        finally:
            os.umask(old)
        os.chmod(self.server_address, 0o600)  # type: ignore[arg-type]


class _TcpServer(socketserver.ThreadingMixIn, socketserver.TCPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, address: tuple[str, int], agent: Agent, verifier: Verifier) -> None:
        self.agent = agent
        self.verifier = verifier
        super().__init__(address, _Handler)


def _prepare_socket_path(path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o755)
    if path.exists() or path.is_symlink():
        probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            probe.connect(str(path))
        except OSError:
            path.unlink()  # stale socket of a dead agent
        else:
            raise HostError(f"another agent is listening on {path}")
        finally:
            probe.close()


class Listeners:
    """Starts and stops the agent's listeners (each in its own thread)."""

    def __init__(self, agent: Agent) -> None:
        self.agent = agent
        self._servers: list[socketserver.BaseServer] = []
        self._threads: list[threading.Thread] = []
        self._http: Any = None

    def start(self) -> None:
        cfg = self.agent.config
        _prepare_socket_path(cfg.socket)
        unix = _UnixServer(cfg.socket, self.agent, cfg.allowed_uids)
        try:
            unix.server_bind()
            unix.server_activate()
        except OSError as exc:
            unix.server_close()
            raise HostError(f"cannot listen on {cfg.socket}: {exc.strerror}") from None
        self._serve(unix, "unix")
        log.info("listening on %s (mode 0600, uids %s)", cfg.socket, sorted(unix.allowed_uids))
        if cfg.tcp_listen:
            assert cfg.token_file is not None
            try:
                token = cfg.token_file.read_bytes().strip()
            except OSError as exc:
                raise HostError(
                    f"cannot read token_file {cfg.token_file}: {exc.strerror}"
                ) from None
            host, _, port = cfg.tcp_listen.rpartition(":")
            try:
                tcp = _TcpServer((host, int(port)), self.agent, Verifier(token))
            except OSError as exc:
                raise HostError(f"cannot listen on {cfg.tcp_listen}: {exc.strerror}") from None
            self._serve(tcp, "tcp")
            log.info("listening on tcp %s (HMAC-authenticated requests only)", cfg.tcp_listen)
        if cfg.prometheus_listen:
            from prometheus_client import start_http_server

            host, _, port = cfg.prometheus_listen.rpartition(":")
            try:
                self._http = start_http_server(
                    int(port), addr=host, registry=self.agent.metrics.registry
                )
            except OSError as exc:
                raise HostError(
                    f"cannot serve metrics on {cfg.prometheus_listen}: {exc.strerror}"
                ) from None
            log.info("prometheus metrics on http://%s/metrics", cfg.prometheus_listen)

    def _serve(self, server: socketserver.BaseServer, name: str) -> None:
        t = threading.Thread(
            target=server.serve_forever,
            kwargs={"poll_interval": 0.5},
            name=f"agent-{name}",
            daemon=True,
        )
        t.start()
        self._servers.append(server)
        self._threads.append(t)

    def stop(self) -> None:
        for s in self._servers:
            s.shutdown()
            s.server_close()
        for t in self._threads:
            t.join(timeout=5)
        if self._http is not None:
            server, thread = self._http
            server.shutdown()
            server.server_close()
            thread.join(timeout=5)
        with contextlib.suppress(OSError):
            self.agent.config.socket.unlink()
