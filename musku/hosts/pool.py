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

import dataclasses
import hashlib
import logging
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from musku.domain import Configuration
from musku.errors import HostError, InputError, MuskuError
from musku.hosts.base import BACKENDS, Host, HostPair
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


FLEETS: dict[str, str] = {"sim": "musku.sim.fleet:open_fleet"}
"""Backends that open a ``fleet = N`` of their own hosts: name -> ``module:factory``, called
as ``factory(experiment, seed) -> HostPool``."""


def agent_entries(experiment: Experiment) -> list[Any]:
    hosts = experiment.hosts.options.get("hosts")
    return list(hosts) if isinstance(hosts, list) else []


def entry_name(entry: Any) -> str:
    if isinstance(entry, Mapping):
        return str(entry.get("name") or entry.get("host") or entry.get("socket") or "")
    return str(entry)


def open_pool(
    experiment: Experiment,
    *,
    seed: int,
    open_pair: Callable[[Experiment, int], HostPair] | None = None,
) -> HostPool:
    """The experiment's pool: a sim ``fleet``, or an agent backend's N hosts as pairs, or
    (any other backend, two agent hosts) its one pair. Pair ``p`` of an agent pool is opened
    by the backend's own factory on ``hosts = [its two]`` with a seed derived from ``seed``
    and ``p``; a pair that cannot be reached is marked failed and the others are used (all
    unreachable: the first error is raised)."""
    from musku.registry import load

    backend = experiment.hosts.backend
    if experiment.hosts.options.get("fleet") is not None and backend in FLEETS:
        open_fleet: Callable[..., HostPool] = load(backend, FLEETS, kind="fleet backend")
        return open_fleet(experiment, seed)
    factory: Callable[..., HostPair] = load(backend, BACKENDS, kind="host backend")
    entries = agent_entries(experiment) if backend == "agent" else []
    if len(entries) <= 2:
        pair = factory(experiment, seed=seed) if open_pair is None else open_pair(experiment, seed)
        names = [h.name for h in pair.hosts]
        return HostPool([pair], [(0, 1)], names)
    names = [entry_name(e) for e in entries]
    groups, _idle = form_pairs(names)
    pairs: list[HostPair] = []
    failed: dict[int, str] = {}
    first_error: HostError | None = None
    try:
        for p, (i, j) in enumerate(groups):
            sub = dataclasses.replace(
                experiment,
                hosts=dataclasses.replace(
                    experiment.hosts,
                    options={**experiment.hosts.options, "hosts": [entries[i], entries[j]]},
                ),
            )
            s = derive_seed(seed, "pair", p)
            try:
                pairs.append(factory(sub, seed=s) if open_pair is None else open_pair(sub, s))
            except HostError as exc:
                first_error = first_error or exc
                failed[p] = exc.one_line()
                pairs.append(_Unreachable(names[i], names[j]))
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


class _Named(Host):
    def __init__(self, name: str) -> None:
        self.name = name

    def configuration(self) -> Configuration:
        return Configuration()


class _Unreachable(HostPair):
    """A pair that could not be opened: marked failed in its pool, never driven."""

    def __init__(self, a: str, b: str) -> None:
        self.hosts = (_Named(a), _Named(b))

    def now(self) -> float:
        return 0.0

    def apply(self, configs: Any) -> float:
        raise HostError("pair unreachable")

    def window(self, seconds: float) -> Any:
        raise HostError("pair unreachable")
