"""The ``agent`` host backend (``[hosts] backend = "agent"``): real hosts running ``musku
agent`` (:mod:`musku.hosts.agent`), two a pair and more a pool of pairs, multi-arm groups of
the pool's agents (:class:`~musku.hosts.agent.AgentGroup`) and a deployment fleet of them
(:class:`AgentFleet`). docs/agent.md, docs/fleet.md."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping, Sequence
from typing import Any

from musku.domain import Configuration
from musku.errors import InputError, MuskuError
from musku.experiment import Experiment
from musku.hosts.agent import (
    AgentGroup,
    AgentHost,
    AgentPair,
    host_options,
    hosts_of,
    make_link,
    open_pair,
)
from musku.hosts.backend import Backend, Fleet, GroupOpener, narrowed
from musku.hosts.base import HostPair
from musku.hosts.group import HostGroup
from musku.hosts.pool import HostPool
from musku.schema.hosts import AgentOptions, host_name, parse_options

log = logging.getLogger(__name__)


def entries(experiment: Experiment) -> list[Any]:
    """``[hosts] hosts`` as written (names or tables)."""
    hosts = experiment.hosts.options.get("hosts")
    return list(hosts) if isinstance(hosts, list) else []


def entry_name(entry: Any) -> str:
    """The name a host of ``[hosts] hosts`` goes by, as written."""
    if isinstance(entry, Mapping):
        return str(entry.get("name") or entry.get("host") or entry.get("socket") or "")
    return str(entry)


class AgentBackend(Backend):
    """Real hosts, each running ``musku agent``, reached over SSH or a Unix socket."""

    name = "agent"
    options = AgentOptions
    reboots = True
    pools = True
    groups = True
    deploys = True
    real_hosts = True

    def open_pair(self, experiment: Experiment, *, seed: int = 0) -> AgentPair:
        return open_pair(experiment, seed=seed)

    def taking_over(self, experiment: Experiment) -> Experiment:
        return narrowed(experiment, take_over=True)

    def pool_names(self, experiment: Experiment) -> list[str] | None:
        listed = entries(experiment)
        return [entry_name(e) for e in listed] if len(listed) > 2 else None

    def pool_entry(self, experiment: Experiment, hosts: Sequence[int]) -> Experiment:
        listed = entries(experiment)
        return narrowed(experiment, hosts=[listed[i] for i in hosts])

    def open_group(
        self, experiment: Experiment, pool: HostPool, seed: int
    ) -> tuple[list[str], GroupOpener]:
        exp = experiment
        live = [p for p in pool.live() if isinstance(pool.pairs[p], AgentPair)]
        if not live:
            raise InputError(
                '[sweep] mode = "multiarm": no agent pair of the pool answers',
                where=str(exp.path),
            )
        agents: list[Any] = [h for p in live for h in pool.pairs[p].hosts]
        lease = float(getattr(pool.pairs[live[0]], "lease_s", 30.0))

        def agent(hosts: list[int], knob: str, scan: int) -> HostGroup:
            return AgentGroup(
                [agents[h] for h in hosts],
                metric=exp.spec.metric,
                lease_s=lease,
                name=exp.name,
                tick_s=exp.stats.sample_interval_s,
                guard_metrics=[g.metric for g in exp.spec.guardrails],
            )

        return [h.name for h in agents], agent

    def open_fleet(
        self,
        experiment: Experiment,
        *,
        seed: int,
        state: Mapping[str, Configuration],
        code_version: str | None = None,
    ) -> Fleet:
        return AgentFleet(experiment, code_version)

    def check(self, experiment: Experiment, configs: list[Configuration]) -> dict[str, Any]:
        """Each agent answers ``hello`` and its ``check`` operation (validate a configuration,
        list the writes, write nothing) for every planned configuration."""
        opts = experiment.hosts.options
        out: dict[str, Any] = {"backend": self.name, "ok": True, "hosts": []}
        try:
            hosts = host_options(opts)
        except MuskuError as exc:
            return {**out, "ok": False, "error": exc.one_line()}
        for h in hosts:
            row: dict[str, Any] = {"name": h.name, "ok": True}
            link = None
            try:
                link = make_link(h, opts, timeout=60.0)
                hello = link.call("hello")
                row["agent"] = {
                    k: hello.get(k) for k in ("version", "protocol", "hostname") if k in hello
                }
                writes = 0
                for cfg in configs:
                    got = link.call("check", config=dict(cfg.as_dict()))
                    writes += sum(len(w) for w in dict(got.get("writes", {})).values())
                row["check"] = (
                    f"{len(configs)} configurations accepted ({writes} planned writes, none made)"
                )
            except MuskuError as exc:
                row.update(ok=False, error=exc.one_line())
            except Exception as exc:  # a host that cannot be reached: its line, not a traceback
                row.update(ok=False, error=f"{type(exc).__name__}: {exc}")
            finally:
                if link is not None:
                    link.close()
            out["ok"] = out["ok"] and row["ok"]
            out["hosts"].append(row)
        return out


class AgentFleet(Fleet):
    """The agent hosts of ``[hosts] hosts = [...]``, each reached over its own link."""

    backend = "agent"

    def __init__(self, experiment: Experiment, code_version: str | None = None) -> None:
        self.experiment = experiment
        options = parse_options(AgentOptions, experiment.hosts.options, str(experiment.path))
        raw = list(experiment.hosts.options.get("hosts") or [])  # as written: sub-options
        self.entries: dict[str, Any] = {
            host_name(e): r for e, r in zip(options.hosts, raw, strict=True)
        }
        self.names = list(self.entries)
        self._code_version = code_version
        self._hosts: dict[str, Any] = {}

    def code_version(self) -> str | None:
        return self._code_version

    def _host(self, name: str) -> Any:
        if name not in self._hosts:
            opts = parse_options(
                AgentOptions, self.experiment.hosts.options, str(self.experiment.path)
            )
            opt = next(o for o in hosts_of(opts) if o.name == name)
            host = AgentHost(opt.name, make_link(opt, self.experiment.hosts.options))
            host.info = dict(host.link.call("hello"))
            self._hosts[name] = host
        return self._hosts[name]

    def open_pair(self, production: str, canary: str, owner: str, seed: int) -> HostPair:
        sub = dataclasses.replace(
            narrowed(self.experiment, hosts=[self.entries[production], self.entries[canary]]),
            name=owner,  # the pair's lease is the deployment's
        )
        return open_pair(sub, seed=seed)

    def settle(self, pair: HostPair, owner: str, canary: Configuration | None) -> None:
        try:
            if canary is not None:
                # the agent's deploy ends the pair's transaction on the canary and keeps the
                # soft SKU across restarts; the production host's rollback ends its own
                self.deploy(pair.hosts[1].name, canary, owner, host=pair.hosts[1])
                host = pair.hosts[0]
                host.link.call("rollback", **host.owner_fields(owner))  # type: ignore[attr-defined]
            else:
                pair.restore()
        finally:
            pair.close()

    def deploy(
        self, name: str, config: Configuration, owner: str, *, host: Any | None = None
    ) -> None:
        host = host if host is not None else self._host(name)
        host.link.call("deploy", config=config.as_dict(), **host.owner_fields(owner))

    def deployed(self, name: str) -> Configuration:
        host = self._host(name)
        return Configuration.of(dict(host.link.call("status").get("deployed") or {}))

    def undeploy(self, name: str, owner: str) -> None:
        host = self._host(name)
        host.link.call("rollback", undeploy=True, **host.owner_fields(owner))

    def close(self) -> None:
        for host in self._hosts.values():
            try:
                host.link.close()
            except MuskuError as exc:
                log.warning("%s: close: %s", host.name, exc.one_line())
        self._hosts.clear()
