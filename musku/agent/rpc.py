"""``musku agent rpc``, importable without typer: what the controller runs over SSH.

Reads one JSON request on stdin (optionally ``"agent_socket": PATH``), relays it to the local
agent's Unix socket, prints the JSON reply on stdout. It always prints a reply: an unreachable
agent or malformed input is an error reply (and a non-zero exit status). Kept light (json and
socket only) because every controller request pays its start-up time.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from musku.agent.client import AgentClient
from musku.agent.core_errors import error_reply
from musku.agent.protocol import MAX_LINE, decode_request
from musku.errors import InputError, MuskuError


def relay(text: str, default_socket: Path) -> tuple[dict[str, Any], int]:
    """Relay one request; (reply, exit status)."""
    try:
        if len(text) > MAX_LINE:
            raise InputError(f"request on stdin longer than {MAX_LINE} bytes")
        try:
            req = decode_request(text)
        except InputError as exc:
            raise InputError(f"{exc.message} (on stdin)") from None
        sock = req.pop("agent_socket", None)
        if sock is not None and not isinstance(sock, str):
            raise InputError("agent_socket must be a path")
        client = AgentClient(sock or default_socket)
        try:
            return client.request(req), 0
        finally:
            client.close()
    except MuskuError as exc:
        return error_reply(exc), int(exc.status)


def default_socket(config: str | Path | None = None, socket: str | Path | None = None) -> Path:
    """``socket``, else the one the agent configuration names, else the default."""
    # lazy: only the socket is read from the configuration (its full schema is not needed)
    from musku.agent.config import DEFAULT_CONFIG, DEFAULT_SOCKET, socket_of

    if socket:
        return Path(socket)
    if config is not None or Path(DEFAULT_CONFIG).exists():
        return socket_of(config or DEFAULT_CONFIG)
    return Path(DEFAULT_SOCKET)


def main(argv: list[str] | None = None) -> int:
    """``[--config FILE] [--socket PATH]``; the request on stdin."""
    args = list(sys.argv[1:] if argv is None else argv)
    opts: dict[str, str] = {}
    try:
        while args:
            flag = args.pop(0)
            if flag in ("--config", "-c", "--socket") and args:
                opts["socket" if flag == "--socket" else "config"] = args.pop(0)
            else:
                raise InputError(f"musku agent rpc: unexpected argument {flag!r}")
        sock = default_socket(opts.get("config"), opts.get("socket"))
    except MuskuError as exc:
        print(json.dumps(error_reply(exc)))
        return int(exc.status)
    reply, code = relay(sys.stdin.read(MAX_LINE + 1), sock)
    print(json.dumps(reply, separators=(",", ":")))
    return code


if __name__ == "__main__":
    sys.exit(main())
