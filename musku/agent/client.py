"""Talking to an agent: over its Unix socket, or its authenticated TCP port."""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Any

from musku.agent.protocol import MAX_LINE, encode, raise_for, sign
from musku.errors import HostError


def _connect_error(where: str, exc: OSError) -> HostError:
    return HostError(f"cannot reach the agent at {where}: {exc.strerror or exc}")


class AgentClient:
    """A connection to one agent (reconnects on demand). Not thread-safe: one per thread."""

    def __init__(
        self,
        socket_path: str | Path | None = None,
        *,
        tcp: str = "",
        token: bytes | None = None,
        timeout: float = 120.0,
    ) -> None:
        if not socket_path and not tcp:
            raise HostError("an agent client needs a socket path or a TCP address")
        self.socket_path = str(socket_path) if socket_path else ""
        self.tcp = tcp
        self.token = token
        self.timeout = timeout
        self._sock: socket.socket | None = None
        self._file: Any = None

    @property
    def where(self) -> str:
        return self.socket_path or self.tcp

    def _open(self) -> None:
        try:
            if self.socket_path:
                s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                try:
                    s.settimeout(self.timeout)
                    s.connect(self.socket_path)
                except OSError:
                    s.close()
                    raise
            else:
                host, _, port = self.tcp.rpartition(":")
                s = socket.create_connection((host, int(port)), timeout=self.timeout)
        except OSError as exc:
            raise _connect_error(self.where, exc) from None
        self._sock, self._file = s, s.makefile("rb")

    def request(self, req: dict[str, Any]) -> dict[str, Any]:
        """Send one request, return the raw reply (``{"ok": ...}``)."""
        import json

        if self.tcp and self.token is not None:
            req = sign(req, self.token)
        for attempt in (0, 1):
            if self._sock is None:
                self._open()
            assert self._sock is not None
            try:
                self._sock.sendall(encode(req))
                line = self._file.readline(MAX_LINE + 1)
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
                reply = json.loads(line)
            except ValueError:
                self.close()
                raise HostError(f"malformed reply from the agent at {self.where}") from None
            if not isinstance(reply, dict):
                raise HostError(f"malformed reply from the agent at {self.where}")
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
