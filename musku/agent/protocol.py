"""Wire format: one JSON object per line, UTF-8, in both directions.

Requests are strict JSON (:func:`decode_request`): no ``NaN``/``Infinity``, integers within
64 bits, floats finite, nesting at most :data:`MAX_DEPTH` deep, strings valid Unicode, a line at
most :data:`MAX_LINE` bytes (the first line of a TCP connection: :data:`PREAUTH_LINE`). Anything
else is a bad-request reply (status 3); the connection stays usable.

The TCP listener (optional) only serves requests carrying an HMAC-SHA256 of the request,
keyed with the shared token: ``"auth": {"ts": unix_seconds, "nonce": hex, "mac": hex}`` where
``mac = HMAC(token, f"{ts}:{nonce}:" + canonical_json(request without "auth"))``. Requests older
than :data:`AUTH_WINDOW_S` or replaying a nonce are refused. The first line of a connection
must authenticate within :data:`PREAUTH_LINE` bytes (the client sends a signed ``hello`` first
when its request is longer), so nothing large is buffered for an unauthenticated peer.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import math
import os
import threading
import time
from typing import Any

from musku.errors import HostError, InputError, MuskuError, UnsupportedError

MAX_LINE = 4 * 2**20  # a request line (Unix socket; TCP once the connection authenticated)
PREAUTH_LINE = 16 * 2**10  # the first line of a TCP connection: it must authenticate
MAX_REPLY = 256 * 2**20  # what a client reads for one reply (a collect of 100,000 rows)
MAX_DEPTH = 32  # JSON nesting (a request is at most ~5 levels deep)
MAX_INT = 2**63 - 1  # integers in requests: signed 64-bit
AUTH_WINDOW_S = 30.0
MAX_TS = 1e11  # an auth timestamp is unix seconds (year 5138): larger is malformed


def canonical(obj: object) -> bytes:
    return json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()


def encode(obj: object) -> bytes:
    return json.dumps(obj, separators=(",", ":")).encode() + b"\n"


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def _int(text: str) -> int:
    if len(text.lstrip("-")) > 19:
        raise ValueError(f"integer {text[:24]}... outside 64 bits")
    v = int(text)
    if not -MAX_INT - 1 <= v <= MAX_INT:
        raise ValueError(f"integer {text} outside 64 bits")
    return v


def _float(text: str) -> float:
    v = float(text)
    if not math.isfinite(v):
        raise ValueError(f"number {text[:24]} overflows a double")
    return v


def _check_tree(obj: object) -> None:
    """Nesting depth and string validity of a decoded document (iterative: no recursion)."""
    stack: list[tuple[object, int]] = [(obj, 1)]
    while stack:
        node, depth = stack.pop()
        if isinstance(node, dict | list):
            if depth > MAX_DEPTH:
                raise InputError(f"request nested deeper than {MAX_DEPTH} levels")
            items = list(node.items()) if isinstance(node, dict) else [(None, v) for v in node]
            for k, v in items:
                if k is not None:
                    _check_str(k)
                stack.append((v, depth + 1))
        elif isinstance(node, str):
            _check_str(node)


def _check_str(s: str) -> None:
    if not s.isascii():
        try:
            s.encode("utf-8")
        except UnicodeEncodeError:
            raise InputError("request has a string that is not valid Unicode") from None


def decode_request(line: bytes | str) -> dict[str, Any]:
    """One request line as a JSON object, or :class:`InputError` (a bad-request reply)."""
    try:
        obj = json.loads(line, parse_constant=_no_constant, parse_int=_int, parse_float=_float)
    except RecursionError:
        raise InputError(f"request nested deeper than {MAX_DEPTH} levels") from None
    except ValueError as exc:  # includes UnicodeDecodeError
        raise InputError(f"malformed JSON request: {str(exc)[:200]}") from None
    _check_tree(obj)
    if not isinstance(obj, dict):
        raise InputError('a request is a JSON object {"op": ...}')
    return obj


def sign(request: dict[str, Any], token: bytes, *, ts: float | None = None) -> dict[str, Any]:
    body = {k: v for k, v in request.items() if k != "auth"}
    ts = time.time() if ts is None else ts
    nonce = os.urandom(12).hex()
    mac = hmac.new(token, f"{ts!r}:{nonce}:".encode() + canonical(body), hashlib.sha256).hexdigest()
    return {**body, "auth": {"ts": ts, "nonce": nonce, "mac": mac}}


class Verifier:
    """Checks HMAC'd requests; remembers nonces inside the time window (no replays)."""

    def __init__(self, token: bytes) -> None:
        if len(token) < 16:
            raise InputError("the agent token must be at least 16 bytes")
        self.token = token
        self._seen: dict[str, float] = {}
        self._lock = threading.Lock()

    def check(self, request: dict[str, Any]) -> dict[str, Any]:
        auth = request.get("auth")
        if not isinstance(auth, dict):
            raise InputError("authentication required")
        ts, nonce, mac = auth.get("ts"), auth.get("nonce"), auth.get("mac")
        if (
            isinstance(ts, bool)
            or not isinstance(ts, float | int)
            or not -MAX_TS <= ts <= MAX_TS  # NaN fails this too; a 400-digit int is refused
            or not isinstance(nonce, str)
            or not 8 <= len(nonce) <= 64
            or not isinstance(mac, str)
            or len(mac) != 64
            or not mac.isascii()
        ):
            raise InputError("malformed authentication")
        now = time.time()
        if not abs(now - float(ts)) <= AUTH_WINDOW_S:  # written so that NaN is not fresh
            raise InputError("authentication expired (clock skew or replay)")
        body = {k: v for k, v in request.items() if k != "auth"}
        want = hmac.new(
            self.token, f"{ts!r}:{nonce}:".encode() + canonical(body), hashlib.sha256
        ).hexdigest()
        if not hmac.compare_digest(want, mac):
            raise InputError("authentication failed")
        with self._lock:
            for n, t in list(self._seen.items()):
                if now - t > 2 * AUTH_WINDOW_S:
                    del self._seen[n]
            if nonce in self._seen:
                raise InputError("authentication replayed")
            self._seen[nonce] = now
        return body


class AgentBusy(HostError):
    """The agent answered ``agent busy``: every client slot was taken, so the request was not
    read (nothing ran; sending it again later is safe). Not a lost link: the agent is up."""


BUSY = "AgentBusy"  # the error type of a busy reply

_ERRORS: dict[str, type[MuskuError]] = {
    "InputError": InputError,
    "InvalidSetting": InputError,
    "UnsupportedError": UnsupportedError,
    BUSY: AgentBusy,
}


def is_busy(reply: object) -> bool:
    """Whether ``reply`` is the agent's ``agent busy`` refusal."""
    if not isinstance(reply, dict) or reply.get("ok") is not False:
        return False
    err = reply.get("error")
    return isinstance(err, dict) and err.get("type") == BUSY


def raise_for(reply: object, *, where: str = "") -> Any:
    """The result of a reply, or the reply's error raised as the matching MuskuError."""
    if not isinstance(reply, dict) or "ok" not in reply:
        raise HostError(f"{where}malformed reply from the agent: {str(reply)[:200]}")
    if reply["ok"]:
        return reply.get("result")
    err = reply.get("error") or {}
    cls = _ERRORS.get(str(err.get("type")), HostError)
    if int(err.get("status", 6)) == 4:
        cls = UnsupportedError
    raise cls(f"{where}{err.get('message', 'agent error')}")
