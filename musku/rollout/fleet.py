"""The hosts a deployment works on, through the existing host backends (docs/rollout.md).

A :class:`Fleet` is every host an experiment's ``[hosts]`` names, one by one: a simulated
``fleet = N`` (:mod:`musku.sim.fleet`: the same names and per-host biases as a sweep's pool)
or the agent hosts of ``hosts = [...]``. It opens a :class:`~musku.hosts.base.HostPair` of
any two of them (a production host and a canary) for the A/B tester, and deploys, reads back
and undeploys one host at a time. Each backend opens its own (``Backend.open_fleet``:
:class:`musku.sim.backend.SimFleet`, :class:`musku.hosts.agent_backend.AgentFleet`).

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

from collections.abc import Mapping, Sequence

from musku.domain import Configuration
from musku.errors import InputError
from musku.experiment import Experiment
from musku.hosts.backend import Fleet, backend_of


def open_fleet(
    experiment: Experiment,
    *,
    seed: int,
    state: Mapping[str, Configuration],
    code_version: str | None = None,
) -> Fleet:
    """The experiment's hosts as a :class:`Fleet`, as its backend opens them
    (:meth:`musku.hosts.backend.Backend.open_fleet`; ``sim`` and ``agent`` among the built-ins)."""
    return backend_of(experiment).open_fleet(
        experiment, seed=seed, state=state, code_version=code_version
    )


def check_hosts(fleet: Fleet, hosts: Sequence[str]) -> None:
    """Refuse a host the fleet does not have (one line, exit 3)."""
    for name in hosts:
        if name not in fleet.names:
            shown = ", ".join(fleet.names[:4]) + (", ..." if len(fleet.names) > 4 else "")
            raise InputError(f"host {name!r} is not one of the experiment's hosts ({shown})")


__all__ = ["Fleet", "check_hosts", "open_fleet"]
