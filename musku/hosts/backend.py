"""A host backend is one registered object, as a knob is (docs/architecture.md "How to add a
backend").

A :class:`Backend` holds everything musku asks of a kind of host: its ``[hosts]`` options model
(the schema and ``musku check`` read it from the registry), the constructors of its
:class:`~musku.hosts.base.HostPair`, of a pool of pairs, of a multi-arm host group and of a
deployment :class:`Fleet`, what is known of its hosts before anything runs (:class:`Prior`,
for the dry-run planner and the scheduler), its ``--dry-run`` check, and its capabilities.
The rest of musku looks a backend up by name (:func:`backend_of`) and never branches on one.

The registry is :data:`musku.registry.BACKENDS` (below the model layer, so that the experiment
loader checks ``[hosts]`` through it): built-ins are aliases, an out-of-tree backend is
``[hosts] backend = "package.module:attr"``, a ``musku.backends`` entry point, or
``BACKENDS.register("package.module:attr")``; ``attr`` is the object, or a class or factory
called without arguments. A plug-in that lacks a method of :data:`REQUIRED`, registers a name
twice or fails its contract is refused when it is loaded (one line naming it, exit 3).
"""

from __future__ import annotations

import dataclasses
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, cast

from musku.domain import Configuration
from musku.errors import HostError, InputError
from musku.hosts.base import HostPair
from musku.hosts.pool import HostPool, Unreachable, derive_seed, form_pairs
from musku.registry import BACKENDS
from musku.schema.hosts import HostOptions

if TYPE_CHECKING:
    from musku.experiment import Experiment
    from musku.hosts.group import HostGroup

GroupOpener = Callable[[list[int], str, int], "HostGroup"]
"""``open(host indices, knob, scan) -> HostGroup`` on a pool's hosts (mode = "multiarm")."""


@dataclass(frozen=True)
class Prior:
    """What a backend knows of its hosts before anything runs: the spread of one window's
    log-ratio B vs A (``noise_sd``, and where it comes from) and, from a model of the hosts,
    the seconds an apply and a reboot take (None: not modelled)."""

    noise_sd: float
    noise_source: str
    apply_s: float | None = None
    reboot_s: float | None = None


class Fleet(ABC):
    """Every host of an experiment's ``[hosts]``, addressed by name (``musku sku deploy``)."""

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


class Backend(ABC):
    """One kind of host. Subclass it, set :attr:`name` and :attr:`options`, implement
    :meth:`open_pair`; override what the backend can do beyond one pair."""

    name: ClassVar[str] = ""
    options: ClassVar[type[HostOptions] | None] = None
    """The model of its ``[hosts]`` table (``musku schema hosts-NAME``); None: the backend
    checks its options itself when it opens the hosts."""

    reboots: ClassVar[bool] = False
    """Its hosts can apply reboot-mode knobs (a reboot is host time)."""
    pools: ClassVar[bool] = False
    """``[hosts]`` can name more than one pair (:meth:`pool_names`, :meth:`open_pool`)."""
    groups: ClassVar[bool] = False
    """Its pool's hosts form multi-arm groups (:meth:`open_group`, ``mode = "multiarm"``)."""
    deploys: ClassVar[bool] = False
    """Soft SKUs deploy on its hosts (:meth:`open_fleet`, ``musku sku deploy``)."""
    real_hosts: ClassVar[bool] = False
    """Its hosts run the real service: co-tuning needs the mid-tier's Admin address."""

    @abstractmethod
    def open_pair(self, experiment: Experiment, *, seed: int = 0) -> HostPair:
        """The experiment's pair, at its baseline. HostError: hosts unreachable."""

    def taking_over(self, experiment: Experiment) -> Experiment:
        """``experiment`` set to take its hosts over from another owner's lease (``musku sweep
        --take-over-agents``). A backend without leases has nothing to take over: unchanged."""
        return experiment

    def pool_names(self, experiment: Experiment) -> list[str] | None:
        """The pool's host names in pool order, when ``[hosts]`` names more than one pair
        (None: one pair)."""
        return None

    def pool_entry(self, experiment: Experiment, hosts: Sequence[int]) -> Experiment:
        """``experiment`` narrowed to the pool's hosts ``hosts`` (for one pair of a pool)."""
        raise InputError(f"[hosts] the {self.name} backend has no pool of hosts")

    def open_pool(
        self,
        experiment: Experiment,
        *,
        seed: int,
        open_pair: Callable[[Experiment, int], HostPair] | None = None,
    ) -> HostPool:
        """The pool: one pair, or (:meth:`pool_names`) pairs ``(0, 1), (2, 3), ...`` each
        opened on :meth:`pool_entry` with a seed derived from ``seed``; a pair that cannot be
        reached is marked failed and the others are used (all unreachable: the first error)."""
        opener = open_pair or (lambda e, s: self.open_pair(e, seed=s))
        names = self.pool_names(experiment)
        if names is None:
            pair = opener(experiment, seed)
            return HostPool([pair], [(0, 1)], [h.name for h in pair.hosts])
        groups, _idle = form_pairs(names)
        pairs: list[HostPair] = []
        failed: dict[int, str] = {}
        first_error: HostError | None = None
        try:
            for p, (i, j) in enumerate(groups):
                sub = self.pool_entry(experiment, (i, j))
                try:
                    pairs.append(opener(sub, derive_seed(seed, "pair", p)))
                except HostError as exc:
                    first_error = first_error or exc
                    failed[p] = exc.one_line()
                    pairs.append(Unreachable(names[i], names[j]))
        except BaseException:
            for pair in pairs:
                pair.close()
            raise
        if len(failed) == len(groups):
            for pair in pairs:
                pair.close()
            assert first_error is not None
            raise first_error
        return HostPool(pairs, groups, names, failed=failed)

    def open_group(
        self, experiment: Experiment, pool: HostPool, seed: int
    ) -> tuple[list[str], GroupOpener]:
        """The pool's usable hosts (names, pool order) and ``open(hosts, knob, scan)`` that
        gives a multi-arm group on those host indices."""
        raise InputError(
            f'[sweep] mode = "multiarm" needs hosts that form groups, not {self.name!r}',
            where=str(experiment.path),
        )

    def group_metric(self, experiment: Experiment) -> str:
        """The metric a multi-arm group's arms are compared on."""
        return experiment.spec.metric

    def open_fleet(
        self,
        experiment: Experiment,
        *,
        seed: int,
        state: Mapping[str, Configuration],
        code_version: str | None = None,
    ) -> Fleet:
        """Every host of ``[hosts]`` as a :class:`Fleet`, at the configurations ``state``
        says they run (``musku sku deploy``)."""
        raise InputError(
            f"[hosts] backend {self.name!r}: soft SKUs do not deploy on its hosts",
            where=str(experiment.path),
        )

    def check_files(self, experiment: Experiment) -> None:
        """What :meth:`open_pair` reads before it opens a host, read and checked the same way
        without opening one (``musku check``, ``sweep``, ``pair calibrate``)."""

    def prior(self, experiment: Experiment) -> Prior | None:
        """What is known of the hosts before anything runs (None: nothing)."""
        return None

    def window_s(self, experiment: Experiment, interval_s: float) -> float:
        """Host seconds one paired window of ``interval_s`` takes."""
        return interval_s

    def check(self, experiment: Experiment, configs: list[Configuration]) -> dict[str, Any]:
        """``musku sweep --dry-run``: probe the hosts and check every planned configuration
        without applying anything: ``{"backend", "ok", "hosts": [{"name", "ok", ...}]}``."""
        return {"backend": self.name, "ok": True, "hosts": [], "note": "no check for this backend"}


REQUIRED = BACKENDS.required
"""The methods every registered backend has (a :class:`Backend` subclass inherits the rest)."""


def backend_of(experiment_or_name: Experiment | str) -> Backend:
    """The registered backend an experiment's ``[hosts] backend`` names (or of that name)."""
    name = (
        experiment_or_name
        if isinstance(experiment_or_name, str)
        else experiment_or_name.hosts.backend
    )
    return cast(Backend, BACKENDS.get(name))


def narrowed(experiment: Experiment, **options: Any) -> Experiment:
    """``experiment`` with ``[hosts]`` options replaced (one pair of a pool, a fleet's pair)."""
    return dataclasses.replace(
        experiment,
        hosts=dataclasses.replace(
            experiment.hosts, options={**experiment.hosts.options, **options}
        ),
    )


__all__ = ["REQUIRED", "Backend", "Fleet", "GroupOpener", "Prior", "backend_of", "narrowed"]
