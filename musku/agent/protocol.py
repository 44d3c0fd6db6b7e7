"""Wire format: one JSON object per line, UTF-8, in both directions (max 4 MiB a line).

The TCP listener (optional) only serves requests carrying an HMAC-SHA256 of the request,
keyed with the shared token: ``"auth": {"ts": unix_seconds, "nonce": hex, "mac": hex}`` where
``mac = HMAC(token, f"{ts}:{nonce}:" + canonical_json(request without "auth"))``. Requests older
than :data:`AUTH_WINDOW_S` or replaying a nonce are refused.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import threading
import time
from typing import Any

from musku.errors import HostError, InputError, MuskuError, UnsupportedError

MAX_LINE = 4 * 2**20
AUTH_WINDOW_S = 30.0


def canonical(obj: object) -> bytes:
    return json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()


def encode(obj: object) -> bytes:
    return json.dumps(obj, separators=(",", ":")).encode() + b"\n"


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
            not isinstance(ts, float | int)
            or not isinstance(nonce, str)
            or not isinstance(mac, str)
        ):
            raise InputError("malformed authentication")
        now = time.time()
        if abs(now - float(ts)) > AUTH_WINDOW_S:
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


_ERRORS: dict[str, type[MuskuError]] = {
    "InputError": InputError,
    "InvalidSetting": InputError,
    "UnsupportedError": UnsupportedError,
}


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
