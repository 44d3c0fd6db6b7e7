"""``musku agent rpc``, importable without typer: what the controller runs over SSH.

One-shot (the default): reads one JSON request on stdin (optionally ``"agent_socket": PATH``),
relays it to the local agent's Unix socket, prints the JSON reply on stdout. It always prints
a reply: an unreachable agent or malformed input is an error reply (and a non-zero exit
status). Kept light (json and socket only) because every controller request pays its start-up
time.

``--stream``: one process for as long as the SSH channel lives (the controller starts one per
connection, docs/agent.md "Transport"): first the line :data:`BANNER` (so the controller knows
a stream relay answers, not an older one-shot one waiting for the end of its input), then
newline-delimited JSON requests on stdin, one reply line on stdout for each, flushed at once,
in order. A one-shot client (request, end of input) reads the banner and its reply as the last
line, as before; so a key restricted to ``command="musku agent rpc --stream"`` serves both. Under
a key restricted to plain ``command="musku agent rpc"`` the relay streams when the command the
client asked for (``SSH_ORIGINAL_COMMAND``) ends in ``--stream``. Every request gets the same checks as a
one-shot one (length, strict JSON, ``agent_socket`` a path); a bad line gets an error reply
and the stream goes on. The connection to the agent is kept between requests (the agent closes
it when idle; the next request opens a new one). Ends with status 0 at end of input.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import IO, Any

from musku.agent.client import AgentClient
from musku.agent.config import DEFAULT_CONFIG, DEFAULT_SOCKET, socket_of
from musku.agent.core_errors import error_reply
from musku.agent.protocol import MAX_LINE, decode_request
from musku.errors import InputError, MuskuError

# the first line of a stream relay: a reply-shaped object no agent sends
BANNER = {"ok": True, "result": {"relay": "musku agent rpc --stream", "version": 1}}


def _checked(text: str | bytes, where: str) -> tuple[dict[str, Any], str | None]:
    """The request of one input line and the agent socket it names (None: the default)."""
    if len(text) > MAX_LINE:
        raise InputError(f"request {where} longer than {MAX_LINE} bytes")
    try:
        req = decode_request(text)
    except InputError as exc:
        raise InputError(f"{exc.message} ({where})") from None
    sock = req.pop("agent_socket", None)
    if sock is not None and not isinstance(sock, str):
        raise InputError("agent_socket must be a path")
    return req, sock


def relay(text: str, default_socket: Path) -> tuple[dict[str, Any], int]:
    """Relay one request; (reply, exit status)."""
    try:
        req, sock = _checked(text, "on stdin")
        client = AgentClient(sock or default_socket)
        try:
            return client.request(req), 0
        finally:
            client.close()
    except MuskuError as exc:
        return error_reply(exc), int(exc.status)


class StreamRelay:
    """``--stream``: relays request lines to the agent, reply lines back, until end of input.
    Keeps one agent connection (the one of the last ``agent_socket`` named)."""

    def __init__(self, default_socket: Path) -> None:
        self.default_socket = default_socket
        self._client: AgentClient | None = None
        self.served = 0

    def _client_for(self, path: str) -> AgentClient:
        if self._client is None or self._client.socket_path != path:
            if self._client is not None:
                self._client.close()
            self._client = AgentClient(path)
        return self._client

    def one(self, line: bytes) -> dict[str, Any]:
        """The reply to one input line (never raises for the request's or the agent's faults)."""
        try:
            req, sock = _checked(line, "on the stream")
        except MuskuError as exc:
            return error_reply(exc)
        client = self._client_for(sock or str(self.default_socket))
        try:
            return client.request(req)
        except MuskuError as exc:
            client.close()  # the next request starts on a fresh connection
            return error_reply(exc)

    def run(self, stdin: IO[bytes], stdout: IO[bytes]) -> int:
        try:
            stdout.write(json.dumps(BANNER, separators=(",", ":")).encode() + b"\n")
            stdout.flush()
            while True:
                line = stdin.readline(MAX_LINE + 1)
                if not line:
                    return 0
                if len(line) > MAX_LINE and not line.endswith(b"\n"):
                    # over-long: refuse it and skip the rest of that line, the stream goes on
                    while (rest := stdin.readline(MAX_LINE + 1)) and not rest.endswith(b"\n"):
                        pass
                    reply = error_reply(
                        InputError(f"request on the stream longer than {MAX_LINE} bytes")
                    )
                elif not line.strip():
                    continue
                else:
                    reply = self.one(line)
                stdout.write(json.dumps(reply, separators=(",", ":")).encode() + b"\n")
                stdout.flush()
                self.served += 1
        except BrokenPipeError:  # the channel went away: nobody to answer
            return 0
        finally:
            if self._client is not None:
                self._client.close()


def default_socket(config: str | Path | None = None, socket: str | Path | None = None) -> Path:
    """``socket``, else the one the agent configuration names, else the default."""
    if socket:
        return Path(socket)
    if config is not None or Path(DEFAULT_CONFIG).exists():
        return socket_of(config or DEFAULT_CONFIG)
    return Path(DEFAULT_SOCKET)


def _asked_to_stream(original: str) -> bool:
    """Whether the client's own command (a key's forced command replaced it) asked for
    ``--stream``: the only word of it that is honoured."""
    return original.split()[-1:] == ["--stream"]


def main(argv: list[str] | None = None) -> int:
    """``[--config FILE] [--socket PATH] [--stream]``; the request(s) on stdin."""
    args = list(sys.argv[1:] if argv is None else argv)
    opts: dict[str, str] = {}
    stream = False
    try:
        while args:
            flag = args.pop(0)
            if flag in ("--config", "-c", "--socket") and args:
                opts["socket" if flag == "--socket" else "config"] = args.pop(0)
            elif flag == "--stream":
                stream = True
            else:
                raise InputError(f"musku agent rpc: unexpected argument {flag!r}")
        sock = default_socket(opts.get("config"), opts.get("socket"))
    except MuskuError as exc:
        print(json.dumps(error_reply(exc)), flush=True)
        return int(exc.status)
    if stream or _asked_to_stream(os.environ.get("SSH_ORIGINAL_COMMAND", "")):
        return StreamRelay(sock).run(sys.stdin.buffer, sys.stdout.buffer)
    reply, code = relay(sys.stdin.read(MAX_LINE + 1), sock)
    print(json.dumps(reply, separators=(",", ":")))
    return code


if __name__ == "__main__":
    sys.exit(main())
