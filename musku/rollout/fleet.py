"""The hosts a deployment works on, through the existing host backends (docs/rollout.md).

A :class:`Fleet` is every host an experiment's ``[hosts]`` names, one by one: a simulated
``fleet = N`` (:mod:`musku.sim.fleet`: the same names and per-host biases as a sweep's pool)
or the agent hosts of ``hosts = [...]``. It opens a :class:`~musku.hosts.base.HostPair` of
any two of them (a production host and a canary) for the A/B tester, and deploys, reads back
and undeploys one host at a time.

- **Agent hosts.** The canary pair is an ordinary :class:`~musku.hosts.agent.AgentPair`
  whose lease the deployment owns (its owner name is ``deployment-<id>``): the tester applies
  through the agents' ``apply``. A kept soft SKU is then made permanent with the agent's own
  ``deploy`` (journaled, re-applied at every agent start: docs/agent.md), a wave host gets the
  same ``deploy``, the read-back is the agent's ``status`` (``deployed``), and an undeploy is
  ``rollback --undeploy`` (the host's pre-musku state).
- **Simulated hosts** have no state of their own between processes: a fleet is opened with
  the configurations the results DB says its hosts run (the live deployments' applied hosts),
  and its "code version" is the digest of the simulator model file (a changed model is a
  code push).
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from typing import Any

from musku.domain import Configuration
from musku.errors import InputError, MuskuError
from musku.experiment import Experiment
from musku.hosts.base import HostPair
from musku.hosts.pool import derive_seed
from musku.schema.hosts import AgentOptions, SimOptions, host_name, parse_options
from musku.sim.fleet import fleet_biases, host_names
from musku.sim.pair import SimPair, pair_setup

log = logging.getLogger(__name__)


class Fleet(ABC):
    """Every host of an experiment's ``[hosts]``, addressed by name."""

    backend: str
    names: list[str]

    @abstractmethod
    def code_version(self) -> str | None:
        """The service's code version the hosts run, when the backend can tell (else None)."""

    @abstractmethod
    def open_pair(self, production: str, canary: str, owner: str, seed: int) -> HostPair:
        """A pair ``(production, canary)`` for the A/B tester, each host at what it runs now;
        applies through it are owned by ``owner``."""

    @abstractmethod
    def settle(self, pair: HostPair, owner: str, canary: Configuration | None) -> None:
        """End a comparison on ``pair``: the production host back at what it ran before, the
        canary (``pair.hosts[1]``) deployed at ``canary`` for good, or back at what it ran
        before (None). Closes the pair."""

    @abstractmethod
    def deploy(self, name: str, config: Configuration, owner: str) -> None:
        """Deploy ``config`` on host ``name`` for good (HostError: the host is unchanged)."""

    @abstractmethod
    def deployed(self, name: str) -> Configuration:
        """What host ``name`` reports as deployed (the read-back)."""

    @abstractmethod
    def undeploy(self, name: str, owner: str) -> None:
        """Host ``name`` back at its baseline."""

    def close(self) -> None:
        """Release connections."""


class SimFleet(Fleet):
    """A simulated fleet (``[hosts] fleet = N``; without it the pair ``sim-a``, ``sim-b``)."""

    backend = "sim"

    def __init__(
        self, experiment: Experiment, seed: int, state: Mapping[str, Configuration]
    ) -> None:
        self.setup = pair_setup(experiment)
        opts = parse_options(SimOptions, experiment.hosts.options, str(experiment.path))
        self.model_path = experiment.resolve(opts.model)
        n = self.setup.options.fleet
        if n is None:
            self.names = ["sim-a", "sim-b"]
            self.biases = [0.0, self.setup.options.host_bias or self.setup.model.noise.host_bias]
        else:
            self.names = host_names(n)
            self.biases = fleet_biases(self.setup.model, n, seed, self.setup.options.bias_sd)
        self.seed = seed
        self.baseline = self.setup.baseline
        self._config = {name: self.baseline for name in self.names}
        for name, cfg in state.items():
            if name in self._config:
                self._config[name] = self.baseline.merged(cfg)

    def code_version(self) -> str:
        digest = hashlib.sha256(self.model_path.read_bytes()).hexdigest()[:12]
        return f"sim:{self.setup.model.name}@{digest}"

    def open_pair(self, production: str, canary: str, owner: str, seed: int) -> SimPair:
        i, j = self.names.index(production), self.names.index(canary)
        rel = (1.0 + self.biases[j]) / (1.0 + self.biases[i]) - 1.0
        s = self.setup
        return SimPair(
            s.model,
            seed=derive_seed(seed, owner, production, canary),
            host_bias=rel,
            noise_scale=s.options.noise_scale,
            initial=(self._config[production], self._config[canary]),
            reboot_knobs=s.reboot_knobs,
            names=(production, canary),
            cotune=s.cotune,
        )

    def settle(self, pair: HostPair, owner: str, canary: Configuration | None) -> None:
        try:
            if canary is not None:
                self.deploy(pair.hosts[1].name, canary, owner)
        finally:
            pair.close()

    def deploy(self, name: str, config: Configuration, owner: str) -> None:
        merged = self._config[name].merged(config)
        self.setup.model.check(merged)  # refuses before anything changes
        self._config[name] = merged

    def deployed(self, name: str) -> Configuration:
        return self._config[name]

    def undeploy(self, name: str, owner: str) -> None:
        self._config[name] = self.baseline


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
        from musku.hosts.agent import AgentHost, hosts_of, make_link  # lazy: paramiko

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
        from musku.hosts.agent import open_pair  # lazy: paramiko

        sub = dataclasses.replace(
            self.experiment,
            name=owner,  # the pair's lease is the deployment's
            hosts=dataclasses.replace(
                self.experiment.hosts,
                options={
                    **self.experiment.hosts.options,
                    "hosts": [self.entries[production], self.entries[canary]],
                },
            ),
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


def open_fleet(
    experiment: Experiment,
    *,
    seed: int,
    state: Mapping[str, Configuration],
    code_version: str | None = None,
) -> Fleet:
    """The experiment's hosts as a :class:`Fleet` (backends ``sim`` and ``agent``)."""
    backend = experiment.hosts.backend
    if backend == "sim":
        return SimFleet(experiment, seed, state)
    if backend == "agent":
        return AgentFleet(experiment, code_version)
    raise InputError(
        f"[hosts] backend {backend!r}: soft SKUs deploy on the 'sim' and 'agent' backends only",
        where=str(experiment.path),
    )


def check_hosts(fleet: Fleet, hosts: Sequence[str]) -> None:
    """Refuse a host the fleet does not have (one line, exit 3)."""
    for name in hosts:
        if name not in fleet.names:
            shown = ", ".join(fleet.names[:4]) + (", ..." if len(fleet.names) > 4 else "")
            raise InputError(f"host {name!r} is not one of the experiment's hosts ({shown})")


__all__ = ["AgentFleet", "Fleet", "SimFleet", "check_hosts", "open_fleet"]
