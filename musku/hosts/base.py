"""The host-backend interface. The sweep and the A/B tester see only this.

A :class:`HostPair` is two identical hosts under the same live load. The tester applies a
configuration to each (``apply``), then takes paired measurement windows (``window``): both
hosts are measured over the same interval of host time, so the live-load signal common to
both cancels in their ratio. Host time is virtual for simulated hosts (hours run in seconds)
and wall time for real ones; ``now()`` tells it either way.

Backends are registered objects (:mod:`musku.hosts.backend`, registry
:data:`musku.registry.BACKENDS`, chosen by the experiment's ``[hosts] backend``): ``sim``
(simulated pairs), ``qsim`` (the queueing simulator), ``agent`` (real hosts running ``musku
agent``), ``local`` (one real host, switchback), or an out-of-tree ``module:attr``.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from typing import Any

from musku.domain import Configuration, Sample
from musku.errors import HostError
from musku.storage.protocols import TableStore


class Host(ABC):
    """One host as the controller sees it."""

    name: str

    @abstractmethod
    def configuration(self) -> Configuration:
        """The configuration currently applied (as verified on the host)."""


class HostPair(ABC):
    """Two identical hosts, measured in the same windows."""

    hosts: tuple[Host, Host]
    persistent: bool = True
    """The hosts outlive the process, so what a run learns about them (each configuration's
    warm-up transient) is kept in the results DB for later runs. Simulated hosts are made anew
    by each run from its seed: what one run learned must not change the next one's windows
    (the same file and seed give the same results on every run)."""

    @abstractmethod
    def now(self) -> float:
        """Host-clock seconds since the pair was opened."""

    @abstractmethod
    def apply(self, configs: tuple[Configuration, Configuration]) -> float:
        """Apply ``configs[i]`` to ``hosts[i]`` (both at once; only knobs that differ from
        what is applied change). Returns the host seconds it took, including reboots.
        Raises :class:`musku.errors.HostError` (hosts rolled back) or
        :class:`musku.errors.UnsupportedError`; never leaves a host half-applied."""

    @abstractmethod
    def window(self, seconds: float) -> tuple[Sample, Sample]:
        """Measure both hosts over the next ``seconds`` of host time; one sample each,
        ``(hosts[0]'s, hosts[1]'s)``."""

    def windows(self, seconds: float, count: int) -> list[tuple[Sample, Sample]]:
        """``count`` consecutive paired windows. Backends that can produce them faster than
        one call at a time (the simulator: vectorised) override this."""
        return [self.window(seconds) for _ in range(count)]

    def recover(self) -> list[tuple[Sample, Sample]]:
        """After :class:`musku.errors.LinkDown` from :meth:`apply` or :meth:`window`: wait
        (bounded) for the link to come back, and return the windows measured since the last
        window returned (what the hosts kept while the link was down), none lost. Raises
        :class:`musku.errors.HostError` when the link stays down. Default: a backend without
        links never loses one."""
        raise HostError(f"{self.describe().get('backend', 'this')} pair cannot reconnect")

    def threading(self) -> tuple[str, str]:
        """Threading each host's service runs now ("" when not applicable): with co-tuning
        (the experiment's ``[threading] cotune``) ``auto:<table hash> MODEL pP wW rR @ N qps``,
        the table being the one trained for the configuration the host is at."""
        return ("", "")

    def use_store(self, store: TableStore) -> None:
        """The controller's results store, for backends that co-tune threading: they look
        threading tables up there (``TableStore.threading_table``) before training one, and save
        the ones they train. Default: not needed."""

    def restore(self) -> None:
        """Put both hosts back at their baseline (end of experiment or abort)."""

    def close(self) -> None:
        """Release connections/leases. Does not change the hosts' configuration."""

    def __enter__(self) -> HostPair:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def describe(self) -> Mapping[str, Any]:
        """Facts about the hosts for the results DB (names, backend, platform, kernel...)."""
        return {"hosts": [h.name for h in self.hosts]}
