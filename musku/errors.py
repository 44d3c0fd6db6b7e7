"""Exit statuses and the exception hierarchy: the one place mapping errors to exit codes.

Every error a user can cause derives from :class:`MuskuError` and carries an
:class:`ExitStatus`. The CLI prints ``musku: error: <message>`` on one line and exits
with that status; it never shows a traceback for these.
"""

from __future__ import annotations

import enum
import os
import sys
from collections.abc import Callable

TYPE_CHECKING = False  # not typing's: the qsim quick path never imports typing
if TYPE_CHECKING:
    from typing import NoReturn


class ExitStatus(enum.IntEnum):
    """Documented exit codes (docs/cli.md)."""

    OK = 0
    ERROR = 1  # unexpected internal error (a bug: reported with a short message)
    USAGE = 2  # bad command line (typer/click's own usage errors use 2 as well)
    BAD_INPUT = 3  # experiment file / catalog / sim model / request malformed or invalid
    UNSUPPORTED = 4  # the host cannot do what was asked (knob unsupported, missing device)
    DATABASE = 5  # DB unreachable, or at an older/newer schema than this musku
    HOST = 6  # a host/agent failed: unreachable, apply/verify failed, rolled back
    ADVANTAGE_GONE = 7  # `musku sku watch`: a deployed soft SKU is no longer better
    ROLLED_BACK = 8  # `musku sku deploy`: the canary lost or broke a guardrail, rolled back
    INTERRUPTED = 130  # Ctrl-C: stopped cleanly, what was measured is kept


class MuskuError(Exception):
    """Base of all user-facing errors."""

    status: ExitStatus = ExitStatus.ERROR

    def __init__(self, message: str, *, where: str | None = None) -> None:
        self.message = message
        self.where = where  # "file:line" (or "file") where the problem is, when known
        super().__init__(self.one_line())

    def one_line(self) -> str:
        text = " ".join(self.message.split())
        return f"{self.where}: {text}" if self.where else text


class UsageError(MuskuError):
    """A bad command-line argument that click cannot see (an unknown ``musku schema`` KIND)."""

    status = ExitStatus.USAGE


class InputError(MuskuError):
    """Malformed or invalid input: TOML, unknown knob/platform, value outside a catalog."""

    status = ExitStatus.BAD_INPUT


class UnsupportedError(MuskuError):
    """The host (or platform) cannot do this. A typed answer, not a crash."""

    status = ExitStatus.UNSUPPORTED


class DatabaseError(MuskuError):
    status = ExitStatus.DATABASE


class BadDatabaseURL(DatabaseError):
    """``--db`` / ``MUSKU_DB`` is not a database URL at all (a bare file path, a typo): bad
    input (exit 3), not a database failure."""

    status = ExitStatus.BAD_INPUT


class SchemaOutOfDate(DatabaseError):
    """The database is at another schema revision; ``musku db upgrade`` fixes it."""


class HostError(MuskuError):
    status = ExitStatus.HOST


class LinkDown(HostError):
    """The controller lost its link to an agent (no answer in time, connection refused or
    reset): the agent may still be running and spooling; the link may come back."""


class RolledBack(MuskuError):
    """``musku sku deploy``: the canary comparison said no; every host is back at baseline."""

    status = ExitStatus.ROLLED_BACK


class AdvantageGone(MuskuError):
    """``musku sku watch``: a deployed soft SKU is no longer significantly better."""

    status = ExitStatus.ADVANTAGE_GONE


class Interrupted(MuskuError):
    status = ExitStatus.INTERRUPTED


def _err(text: str) -> None:
    sys.stderr.write(f"musku: error: {' '.join(str(text).split())}\n")


def guarded(fn: Callable[[], int | None]) -> NoReturn:
    """Run ``fn`` and exit with its status (0 for None), mapping errors to exit codes."""
    try:
        code = fn()
    except MuskuError as exc:
        _err(exc.one_line())
        sys.exit(int(exc.status))
    except KeyboardInterrupt:
        _err("interrupted")
        sys.exit(int(ExitStatus.INTERRUPTED))
    except BrokenPipeError:
        sys.exit(int(ExitStatus.OK))
    except Exception as exc:  # a bug: one line, and how to get the traceback
        if os.environ.get("MUSKU_DEBUG"):
            raise
        _err(f"internal error: {type(exc).__name__}: {exc} (set MUSKU_DEBUG=1 for a traceback)")
        sys.exit(int(ExitStatus.ERROR))
    sys.exit(int(code or 0))
