"""The controller's side of a reboot-mode apply (docs/agent.md "Reboots").

An agent answers an ``apply`` that needs a reboot with ``rebooting: true`` and the journaled
``reboot`` record (its ``at`` identifies this reboot). :func:`wait_for_reboot` then polls the
agent's ``status`` with back-off (0.2 s doubling to 5 s), through the agent going away and
coming back, until the agent reports this reboot ``verified`` (the host is re-greeted: clock
offset, collection cursor) or ``failed`` (HostError with the agent's line), or until
``timeout`` seconds have passed (HostError: the host did not come back in time). The caller
(:meth:`musku.hosts.agent.AgentPair.apply`) counts the wait in the apply's host seconds and
rolls every host back on an error, so nothing is left half-applied.
"""

from __future__ import annotations

import logging
import time
from typing import Any, Protocol

from musku.errors import HostError, MuskuError


class _Link(Protocol):
    def call(self, op: str, **fields: Any) -> Any: ...


class AgentHost(Protocol):
    """What the wait needs of a host (musku.hosts.agent.AgentHost, which calls it)."""

    name: str

    @property
    def link(self) -> _Link: ...

    def hello(self, probes: int = 3) -> dict[str, Any]: ...


log = logging.getLogger("musku.hosts")

DEFAULT_TIMEOUT_S = 900.0  # a server's firmware and kernel boot: minutes, not hours


def wait_for_reboot(
    host: AgentHost, reply: dict[str, Any], timeout: float, *, first_delay: float = 0.2
) -> float:
    """Wait until ``host``'s agent is back and has verified the reboot of ``reply``; returns
    the seconds waited. HostError (one line naming the host) otherwise."""
    record = _dict(reply.get("reboot"))
    at = record.get("at")
    sent = float(reply.get("time") or 0.0)
    t0 = time.monotonic()
    deadline = t0 + timeout
    delay = first_delay
    last = "no answer yet"
    log.info("%s: rebooting (expect cmdline %r)", host.name, record.get("expect", ""))
    while True:
        try:
            st = host.link.call("status")
        except MuskuError as exc:
            st, last = None, exc.one_line()
        if isinstance(st, dict):
            r = _dict(st.get("reboot"))
            if r.get("at") == at and r.get("state") == "verified":
                host.hello()  # a new boot: new clock offset, fresh collection cursor
                waited = time.monotonic() - t0
                log.info("%s: back after %.1fs, reboot verified", host.name, waited)
                return waited
            if r.get("at") == at and r.get("state") == "failed":
                raise HostError(f"{host.name}: {r.get('message') or 'reboot failed'}")
            if float(st.get("started") or 0.0) > sent and r.get("at") != at:
                raise HostError(f"{host.name}: agent restarted without the pending reboot")
            last = "agent up, reboot still pending"
        now = time.monotonic()
        if now >= deadline:
            raise HostError(
                f"{host.name}: did not come back from its reboot within {timeout:g}s ({last})"
            )
        time.sleep(min(delay, deadline - now))
        delay = min(delay * 2, 5.0)


def _dict(v: object) -> dict[str, Any]:
    return v if isinstance(v, dict) else {}
