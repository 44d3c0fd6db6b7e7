"""A pool of hosts, paired: what one sweep runs its independent comparisons on at once.

``[hosts]`` names the pool: ``fleet = N`` simulated hosts (``backend = "sim"``,
:mod:`musku.sim.fleet`), or N agent hosts (``hosts = [...]``); two hosts are today's single
pair. Hosts are paired in the order given, ``(0, 1), (2, 3), ...``; an odd pool's last host
idles (the sweep says which). A host listed twice, or a pool of fewer than two, is refused
(:class:`~musku.errors.InputError`, exit 3). Each pair is an ordinary
:class:`~musku.hosts.base.HostPair`, so a comparison on it means what it means on one pair.

A pair that fails (:class:`~musku.errors.HostError`: its apply rolled back, an agent gone
silent past its bounded timeout) is marked failed and put back as far as it can be; the rest of
the pool goes on (docs/fleet.md).
"""

from __future__ import annotations

import hashlib
import logging
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from musku.domain import Configuration
from musku.errors import HostError, InputError, MuskuError
from musku.hosts.base import Host, HostPair
from musku.registry import BACKENDS
from musku.storage.protocols import TableStore

if TYPE_CHECKING:
    from musku.experiment import Experiment

log = logging.getLogger(__name__)


def derive_seed(seed: int, *parts: object) -> int:
    """A seed for one pair/comparison/task, from the run's seed and what names it: the same
    inputs give the same seed on every machine, whatever order threads run in."""
    text = repr((int(seed), *parts)).encode()
    return int.from_bytes(hashlib.blake2b(text, digest_size=8).digest(), "big") >> 33


def form_pairs(names: Sequence[str]) -> tuple[list[tuple[int, int]], int | None]:
    """Disjoint pairs of host indices ``(0, 1), (2, 3), ...`` and the idle host's index (an
    odd pool's last), or None. Refuses a host listed twice and a pool of fewer than two."""
    seen: dict[str, int] = {}
    for i, name in enumerate(names):
        if name in seen:
            raise InputError(
                f"[hosts] host {name!r} is listed twice (positions {seen[name]} and {i})"
            )
        seen[name] = i
    if len(names) < 2:
        raise InputError(
            f"[hosts] a pool of {len(names)} host(s) is too small: a comparison needs a pair"
        )
    pairs = [(i, i + 1) for i in range(0, len(names) - 1, 2)]
    return pairs, (len(names) - 1 if len(names) % 2 else None)


class HostPool:
    """Disjoint pairs of a pool's hosts. ``groups[p]`` are pair ``p``'s host indices in
    ``names`` (the order the experiment's hosts are recorded in)."""

    def __init__(
        self,
        pairs: Sequence[HostPair],
        groups: Sequence[tuple[int, int]],
        names: Sequence[str],
        *,
        biases: Sequence[float] | None = None,
        failed: Mapping[int, str] | None = None,
    ) -> None:
        if len(pairs) != len(groups) or not pairs:
            raise ValueError("a pool needs one host-index pair per HostPair")
        self.pairs = list(pairs)
        self.groups = list(groups)
        self.names = list(names)
        self.biases = list(biases) if biases is not None else None
        self.failed: dict[int, str] = dict(failed or {})
        used = {i for g in groups for i in g}
        self.idle = [self.names[i] for i in range(len(self.names)) if i not in used]
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self.pairs)

    def live(self) -> list[int]:
        """Indices of the pairs not marked failed, in order."""
        with self._lock:
            return [p for p in range(len(self.pairs)) if p not in self.failed]

    def host_names(self, p: int) -> tuple[str, str]:
        a, b = self.groups[p]
        return self.names[a], self.names[b]

    def fail(self, p: int, why: str) -> None:
        """Mark pair ``p`` failed: put its hosts back (as far as they answer) and leave it."""
        with self._lock:
            if p in self.failed:
                return
            self.failed[p] = why
        log.error("pair %s failed: %s", "+".join(self.host_names(p)), why)
        try:
            self.pairs[p].restore()
        except MuskuError as exc:
            log.error("pair %d: not restored: %s", p, exc.one_line())

    def describe(self) -> Mapping[str, Any]:
        """The hosts for the results DB, all of the pool, in pool order."""
        if len(self.pairs) == 1 and not self.idle and self.groups[0] == (0, 1):
            return self.pairs[0].describe()
        first = dict(self.pairs[0].describe())
        for key in ("hosts", "seed", "host_bias"):
            first.pop(key, None)
        hosts: list[dict[str, Any]] = [{"name": n} for n in self.names]
        for p, (pair, group) in enumerate(zip(self.pairs, self.groups, strict=True)):
            entries = pair.describe().get("hosts", [])
            for i, entry in zip(group, entries, strict=False):
                if isinstance(entry, Mapping):
                    hosts[i].update(entry)
                hosts[i]["pair"] = p
        if self.biases is not None:
            for i, b in enumerate(self.biases):
                hosts[i]["bias"] = b
        first["hosts"] = hosts
        first["pool"] = {"pairs": [list(self.host_names(p)) for p in range(len(self))]}
        if self.idle:
            first["pool"]["idle"] = list(self.idle)
        return first

    def use_store(self, store: TableStore) -> None:
        for pair in self.pairs:
            pair.use_store(store)

    def restore(self) -> None:
        """Put every live pair back at its baseline (a failed one was put back when it failed).
        Every pair is tried; the first error is raised after."""
        first: BaseException | None = None
        for p in self.live():
            try:
                self.pairs[p].restore()
            except MuskuError as exc:
                log.error("pair %d: not restored: %s", p, exc.one_line())
                first = first or exc
        if first is not None:
            raise first

    def close(self) -> None:
        for pair in self.pairs:
            try:
                pair.close()
            except MuskuError as exc:
                log.error("pair close: %s", exc.one_line())


class Locked:
    """Serialises the method calls of an object shared by the pool's threads (the results
    store: on SQLite its one connection; the live display)."""

    def __init__(self, target: Any) -> None:
        self._target = target
        self._lock = threading.RLock()

    def __getattr__(self, name: str) -> Any:
        value = getattr(self._target, name)
        if not callable(value):
            return value
        lock = self._lock

        def call(*args: Any, **kwargs: Any) -> Any:
            with lock:
                return value(*args, **kwargs)

        return call


def open_pool(
    experiment: Experiment,
    *,
    seed: int,
    open_pair: Callable[[Experiment, int], HostPair] | None = None,
) -> HostPool:
    """The experiment's pool, as its backend opens it
    (:meth:`musku.hosts.backend.Backend.open_pool`): a fleet of simulated hosts, an agent
    backend's N hosts as pairs, or any other backend's one pair. ``open_pair(experiment,
    seed)`` replaces the backend's own pair factory."""
    pool: HostPool = BACKENDS.get(experiment.hosts.backend).open_pool(
        experiment, seed=seed, open_pair=open_pair
    )
    return pool


class _Named(Host):
    def __init__(self, name: str) -> None:
        self.name = name

    def configuration(self) -> Configuration:
        return Configuration()


class Unreachable(HostPair):
    """A pair that could not be opened: marked failed in its pool, never driven."""

    def __init__(self, a: str, b: str) -> None:
        self.hosts = (_Named(a), _Named(b))

    def now(self) -> float:
        return 0.0

    def apply(self, configs: Any) -> float:
        raise HostError("pair unreachable")

    def window(self, seconds: float) -> Any:
        raise HostError("pair unreachable")
