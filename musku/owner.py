"""Who this controller process is: the owner identity of agent leases and of experiment claims.

``controller_id()`` is ``user@host:pid:nonce`` (the nonce tells two processes apart when a pid
is reused, e.g. in containers). Every agent request that changes a host carries it (see
docs/agent.md "Ownership") and ``musku sweep`` records it in the experiment's claim (see
docs/cli.md "Several controllers").
"""

from __future__ import annotations

import getpass
import os
import socket
import uuid

_NONCE = uuid.uuid4().hex[:8]


def _user() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):  # no passwd entry (containers)
        return str(os.getuid())


def controller_id() -> str:
    """This process's controller identity (the pid is read now: a forked child differs)."""
    return f"{_user()}@{socket.gethostname()}:{os.getpid()}:{_NONCE}"
