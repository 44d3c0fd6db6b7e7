"""Error replies of the agent protocol (light: no agent state imported)."""

from __future__ import annotations

from typing import Any

from musku.errors import MuskuError


def error_reply(exc: BaseException) -> dict[str, Any]:
    if isinstance(exc, MuskuError):
        return {
            "ok": False,
            "error": {
                "type": type(exc).__name__,
                "status": int(exc.status),
                "message": exc.one_line(),
            },
        }
    return {
        "ok": False,
        "error": {"type": "InternalError", "status": 1, "message": f"{type(exc).__name__}: {exc}"},
    }
