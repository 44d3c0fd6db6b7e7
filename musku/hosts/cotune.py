"""The controller's side of co-tuning on agent hosts (:mod:`musku.tune.cotune`): offer the
results DB's table with each ``apply`` request, store the tables the agents trained, and give
requests a timeout that covers a training."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from musku.agent.cotune import AgentRequest
from musku.cotune_spec import CotuneSpec
from musku.domain import Configuration
from musku.errors import HostError, InputError, MuskuError
from musku.storage.protocols import TableStore

log = logging.getLogger("musku.tune")  # co-tuning logs under one name, on either side


class ControllerTables:
    """The controller's side of co-tuning on agent hosts: offers the results DB's table with
    each request and stores the tables the agents trained."""

    def __init__(self, spec: CotuneSpec, platform: str) -> None:
        self.spec = spec
        self.platform = platform
        self.store: TableStore | None = None

    def midtier(self, host: str, where: Mapping[str, str]) -> CotuneSpec:
        """The spec for a host whose mid-tier answers elsewhere than the experiment says
        (``where``: ``{"admin": "host:port"}`` or ``{"admin_port_file": path}``); InputError
        naming the host when that address is malformed."""
        if not where:
            return self.spec
        spec = replace(self.spec, admin=where.get("admin", ""),
                       admin_port_file=where.get("admin_port_file", ""))  # fmt: skip
        problem = spec.problem()
        if problem:
            raise InputError(f"[hosts] {host}: midtier_{problem}")
        return spec

    def request(
        self, host: str, config: Configuration, midtier: Mapping[str, str] | None = None
    ) -> dict[str, Any]:
        """The ``threading`` field of an ``apply`` request to the agent of ``host``
        (``midtier``: that host's own mid-tier address, see :meth:`midtier`)."""
        spec = self.midtier(host, midtier or {})
        table = None
        if self.store is not None:
            try:
                table = self.store.threading_table(
                    self.spec.service, host, self.platform, config.key()
                )
            except MuskuError as exc:
                log.warning("results DB not consulted for a threading table: %s", exc.one_line())
        return AgentRequest(spec, self.platform, table).to_json()

    def record(self, host: str, config: Configuration, reply: Mapping[str, Any]) -> str:
        """Store a table the agent trained; returns the threading it reports. HostError when
        the reply says nothing of threading (an agent that does not co-tune: the caller rolls
        the host back rather than compare without co-tuning)."""
        info = reply.get("threading") if isinstance(reply, Mapping) else None
        if not isinstance(info, Mapping) or not info.get("threading"):
            raise HostError(
                f"the agent on {host} did not co-tune the threading (a musku without "
                "co-tuning there?): upgrade it or set [threading] cotune = false"
            )
        trained = info.get("trained")
        if trained and self.store is not None:
            try:
                self.store.save_threading_table(
                    self.spec.service, host, self.platform, config.key(), trained
                )
            except MuskuError as exc:
                log.warning("threading table not stored in the results DB: %s", exc.one_line())
        for note in info.get("notes", []):
            log.warning("%s: %s", host, note)
        return str(info.get("threading", ""))


def timeout_for(spec: CotuneSpec, base: float = 120.0) -> float:
    """A request timeout that covers a training (and a retraining)."""
    return base + 2.5 * spec.training_s()
