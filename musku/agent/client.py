"""Talking to an agent: over its Unix socket, or its authenticated TCP port.

Connecting retries with a deadline (``connect_timeout``) while the agent's backlog is full
(``EAGAIN`` on a Unix socket) or nothing listens yet (``ECONNREFUSED``: the agent is starting
or restarting); the socket is connected before ``timeout`` (for each read and write) is set,
so a timeout never turns a connect into a failing non-blocking one. Over TCP, a request
longer than :data:`~musku.agent.protocol.PREAUTH_LINE` on a new connection is preceded by a
signed ``hello`` (the agent reads only a short first line from an unauthenticated peer).

An agent with every client slot taken answers ``agent busy`` and closes: :meth:`AgentClient.call`
raises :class:`~musku.agent.protocol.AgentBusy` (a HostError, not
:class:`~musku.errors.LinkDown`: the agent is up and did not read the request). A connection
the agent closed while idle (its ``idle_timeout_s``) is noticed before the next request is
sent (readable at EOF, or holding the agent's parting line) and replaced by a new one.
"""

from __future__ import annotations

import errno
import json
import select
import socket
import time
from pathlib import Path
from typing import Any

from musku.agent.protocol import MAX_REPLY, PREAUTH_LINE, encode, is_busy, raise_for, sign
from musku.errors import HostError, LinkDown

_RETRY = (errno.EAGAIN, errno.ECONNREFUSED, errno.EINTR)


def _connect_error(where: str, exc: OSError) -> HostError:
    return LinkDown(f"cannot reach the agent at {where}: {exc.strerror or exc}")


class AgentClient:
    """A connection to one agent (reconnects on demand). Not thread-safe: one per thread."""

    def __init__(
        self,
        socket_path: str | Path | None = None,
        *,
        tcp: str = "",
        token: bytes | None = None,
        timeout: float = 120.0,
        connect_timeout: float = 10.0,
    ) -> None:
        if not socket_path and not tcp:
            raise HostError("an agent client needs a socket path or a TCP address")
        self.socket_path = str(socket_path) if socket_path else ""
        self.tcp = tcp
        self.token = token
        self.timeout = timeout
        self.connect_timeout = connect_timeout
        self._sock: socket.socket | None = None
        self._file: Any = None
        self._authenticated = False  # TCP: this connection has had a signed request answered

    @property
    def where(self) -> str:
        return self.socket_path or self.tcp

    def _connect_once(self, remaining: float) -> socket.socket:
        if self.socket_path:
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                # a Unix connect does not wait for a full backlog when non-blocking: it fails
                # with EAGAIN at once (retried by the caller)
                s.setblocking(False)
                s.connect(self.socket_path)
            except OSError:
                s.close()
                raise
            return s
        host, _, port = self.tcp.rpartition(":")
        try:
            return socket.create_connection((host.strip("[]"), int(port)), timeout=remaining)
        except ValueError:
            raise HostError(f"bad agent address {self.tcp!r} (host:port)") from None

    def _open(self) -> None:
        deadline = time.monotonic() + self.connect_timeout
        delay = 0.005
        while True:
            try:
                s = self._connect_once(max(0.001, deadline - time.monotonic()))
                break
            except OSError as exc:
                if exc.errno not in _RETRY or time.monotonic() + delay > deadline:
                    raise _connect_error(self.where, exc) from None
                time.sleep(delay)
                delay = min(delay * 2, 0.2)
        s.settimeout(self.timeout)
        self._sock, self._file = s, s.makefile("rb")
        self._authenticated = False

    def _stale(self) -> bool:
        """Whether the open connection has something to read before a request was sent: the
        agent closed it (EOF, maybe after a parting ``connection closed: idle`` line)."""
        assert self._sock is not None
        try:
            readable, _, _ = select.select([self._sock], [], [], 0)
        except (OSError, ValueError):
            return True
        return bool(readable)

    def _roundtrip(self, data: bytes) -> bytes:
        assert self._sock is not None
        try:
            self._sock.sendall(data)
        except (BrokenPipeError, ConnectionResetError):
            # the agent closed at once (busy), maybe before our request arrived: its parting
            # line is still ours to read
            try:
                parting: bytes = self._file.readline(MAX_REPLY + 1)
            except OSError:
                parting = b""
            if parting:
                return parting
            raise
        line: bytes = self._file.readline(MAX_REPLY + 1)
        return line

    def _signed(self, req: dict[str, Any]) -> bytes:
        assert self.token is not None
        return encode(sign(req, self.token))

    def request(self, req: dict[str, Any]) -> dict[str, Any]:
        """Send one request, return the raw reply (``{"ok": ...}``)."""
        signing = bool(self.tcp) and self.token is not None
        for attempt in (0, 1):
            if self._sock is not None and self._stale():
                self.close()
            if self._sock is None:
                self._open()
            try:
                data = self._signed(req) if signing else encode(req)
                if signing and not self._authenticated and len(data) > PREAUTH_LINE:
                    hello = self._roundtrip(self._signed({"op": "hello"}))
                    if hello:
                        first = _json(hello, self.where)
                        if is_busy(first):
                            self.close()
                            return first
                        raise_for(first, where=f"agent {self.where}: ")
                    data = self._signed(req)  # a fresh timestamp after the round trip
                line = self._roundtrip(data)
            except OSError as exc:
                self.close()
                if attempt:
                    raise _connect_error(self.where, exc) from None
                continue
            if not line:
                self.close()
                if attempt:
                    raise HostError(f"the agent at {self.where} closed the connection")
                continue
            try:
                reply = _json(line, self.where)
            except HostError:
                self.close()
                raise
            if is_busy(reply):  # the agent closed this connection: the next call reconnects
                self.close()
                return reply
            if reply.get("closed"):  # the agent's parting line: this connection is over
                self.close()
                if not attempt and _idle_close(reply):
                    continue  # it was closed idle just before our request: send it again
                return reply
            # answered: authenticated (a refused signature closes the connection instead)
            self._authenticated = True
            return reply
        raise HostError(f"cannot reach the agent at {self.where}")

    def call(self, op: str, **fields: Any) -> Any:
        """Send ``{"op": op, **fields}``; the result, or the agent's error raised."""
        return raise_for(self.request({"op": op, **fields}), where=f"agent {self.where}: ")

    def close(self) -> None:
        if self._sock is not None:
            try:
                self._file.close()
                self._sock.close()
            finally:
                self._sock = self._file = None


def _idle_close(reply: dict[str, Any]) -> bool:
    err = reply.get("error")
    return isinstance(err, dict) and str(err.get("message", "")).startswith(
        "connection closed: idle"
    )


def _json(line: bytes, where: str) -> dict[str, Any]:
    try:
        reply = json.loads(line)
    except ValueError:
        raise HostError(f"malformed reply from the agent at {where}") from None
    if not isinstance(reply, dict):
        raise HostError(f"malformed reply from the agent at {where}")
    return reply
