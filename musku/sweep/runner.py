"""The sweep runner: runs comparisons for a strategy, records them, resumes, composes the soft SKU.

The runner knows nothing of the host backend: it drives a :class:`~musku.hosts.base.HostPair`
through :func:`musku.abtest.run_comparison`. Every finished comparison is stored as it ends, so
an interrupted sweep keeps what it measured; on ``--resume`` a comparison already finished
(same purpose, baseline and candidate) is answered from the database instead of re-measured,
and since strategies are deterministic functions of those answers, the sweep continues where
it stopped.

With a pool of pairs (:class:`~musku.hosts.pool.HostPool`, docs/fleet.md), :meth:`Runner.map`
runs a strategy's independent tasks (a knob's scan, one exhaustive comparison) at once, one
thread per pair: task ``i`` goes to live pair ``i mod P`` and waits for it, each task runs on a
*lane* (a runner bound to its pair, seeded from the run's seed and ``i``), and the lanes'
results join the run's in task order. So a sim sweep gives the same answers on every run of a
seed, whatever order the threads run in, and a task's comparisons are those it would run on one
pair. A pair that fails (HostError) is marked failed and its unfinished tasks go to the live
pairs in a next round (what they had finished is answered from the store, as on resume).
"""

from __future__ import annotations

import copy
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

from musku.abtest import run_comparison
from musku.abtest.calibration import memory_for
from musku.domain import (
    ComparisonResult,
    Configuration,
    Decision,
    SoftSku,
    TimeBreakdown,
)
from musku.errors import HostError, Interrupted, LinkDown
from musku.experiment import Experiment
from musku.hosts.base import HostPair
from musku.hosts.pool import HostPool, derive_seed
from musku.sweep.report import result_dict, sku_dict
from musku.text import change_text


class Progress(Protocol):
    """What the runner reports to: the observer the CLI implements with its live display
    (:class:`musku.display.LiveProgress`); :class:`NullProgress` reports nowhere."""

    def comparison_started(
        self, purpose: str, baseline: Configuration, candidate: Configuration
    ) -> None: ...

    def comparison_progress(self, info: Any) -> None: ...

    def comparison_finished(self, purpose: str, result: ComparisonResult, cached: bool) -> None: ...

    def message(self, text: str) -> None: ...


class NullProgress:
    def comparison_started(
        self, purpose: str, baseline: Configuration, candidate: Configuration
    ) -> None:
        pass

    def comparison_progress(self, info: Any) -> None:
        pass

    def comparison_finished(self, purpose: str, result: ComparisonResult, cached: bool) -> None:
        pass

    def message(self, text: str) -> None:
        pass


@dataclass
class KnobOutcome:
    """What a sweep concluded about one knob."""

    knob: str
    baseline_value: object
    best_value: object
    results: list[ComparisonResult] = field(default_factory=list)
    pruned: list[object] = field(default_factory=list)  # settings that broke a guardrail
    skipped: list[object] = field(default_factory=list)  # not measured: past a unimodal scan's stop


@dataclass
class SweepReport:
    experiment: str
    mode: str
    baseline: Configuration
    best: Configuration
    knobs: list[KnobOutcome]
    sku: SoftSku | None
    comparisons: int
    measured: int  # comparisons actually measured in this run (not answered from a resume)
    host_time_s: float  # host time of all comparisons (incl. resumed ones)
    experiment_id: int | None = None
    # host-clock time to the soft SKU: pairs run at once, so the longest pair's clock per
    # concurrent phase, summed over phases (equals host_time_s on one pair)
    clock_s: float = 0.0
    pairs: int = 1
    # host time summed over every host that ran it: 2 per pair comparison, a multi-arm
    # scan's group size times its time
    host_hours: float = 0.0
    # where host_time_s went, summed over the comparisons that recorded it; how many did not
    time: TimeBreakdown = field(default_factory=TimeBreakdown)
    time_missing: int = 0

    def to_dict(self) -> dict[str, Any]:
        """The plain (JSON-able) form: ``musku sweep --json`` and the stored report."""
        return {
            "experiment": self.experiment,
            "experiment_id": self.experiment_id,
            "mode": self.mode,
            "baseline": self.baseline.as_dict(),
            "best": self.best.as_dict(),
            "knobs": [
                {
                    "knob": o.knob,
                    "baseline": o.baseline_value,
                    "best": o.best_value,
                    "pruned": o.pruned,
                    "skipped": o.skipped,
                    "comparisons": [result_dict(r) for r in o.results],
                }
                for o in self.knobs
            ],
            "soft_sku": sku_dict(self.sku) if self.sku else None,
            "comparisons": self.comparisons,
            "measured": self.measured,
            "host_time_s": self.host_time_s,
            "clock_s": self.clock_s,
            "pairs": self.pairs,
            "host_hours": self.host_hours,
            "time": {**self.time.as_dict(), "missing": self.time_missing},
        }


T = TypeVar("T")
R = TypeVar("R")
MAX_INTERRUPTIONS = 3  # a comparison whose link is lost more often counts its pair as failed


@dataclass
class _Round:
    """What the pairs' threads of one :meth:`Runner.map` round report."""

    errors: dict[int, BaseException] = field(default_factory=dict)
    retry: list[int] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)


class Runner:
    """Runs comparisons on one pair (or a pool of pairs) for one experiment, with storage
    and resume."""

    def __init__(
        self,
        experiment: Experiment,
        pair: HostPair,
        *,
        store: Any | None = None,
        experiment_id: int | None = None,
        progress: Progress | None = None,
        stop: threading.Event | None = None,
        seed: int | None = None,
        pool: HostPool | None = None,
    ) -> None:
        self.experiment = experiment
        self.pair = pair
        self.pool = pool
        self.store = store
        self.experiment_id = experiment_id
        self.progress = progress or NullProgress()
        self.stop = stop or threading.Event()
        self.seed = experiment.stats.seed if seed is None else seed
        self._cache: dict[tuple[str, str, str], ComparisonResult] = {}
        self.results: list[tuple[str, ComparisonResult]] = []
        self.measured = 0
        self._counter = 0
        self.clock_s = 0.0  # host-clock time: see SweepReport.clock_s
        self.host_seconds = 0.0  # time x hosts: see SweepReport.host_hours
        self._hosts: tuple[int, int] | None = None  # the pair's host indices in the pool
        self._host_names: tuple[str, str] | None = None
        # the pair's calibration and remembered warm-up transients (issue 19)
        self.memory = memory_for(pair, store if experiment_id is not None else None)
        self._memories: dict[int, Any] = {}
        if pool is not None and len(pool) > 1:
            p = next(i for i, q in enumerate(pool.pairs) if q is pair)
            self._hosts = pool.groups[p]
            self._host_names = pool.host_names(p)
            self._memories[p] = self.memory
        if store is not None and experiment_id is not None:
            for purpose, result in store.completed(experiment_id):
                key = (purpose, result.baseline.key(), result.candidate.key())
                self._cache[key] = result

    # ------------------------------------------------------------------ comparisons
    def compare(
        self, purpose: str, baseline: Configuration, candidate: Configuration
    ) -> ComparisonResult:
        """One A/B comparison (or its stored answer on resume). Raises Interrupted on Ctrl-C."""
        if self.stop.is_set():
            raise Interrupted("stopped before finishing")
        self._counter += 1
        key = (purpose, baseline.key(), candidate.key())
        cached = self.answered(purpose, key)
        if cached is not None:
            return cached
        label = purpose
        if self.pool is not None and self._hosts is not None:  # pairs at once: say which
            a, b = self._hosts
            label = f"{purpose} on {self.pool.names[a]}+{self.pool.names[b]}"
        self.progress.comparison_started(label, baseline, candidate)
        for attempt in range(1, MAX_INTERRUPTIONS + 2):
            cmp_id = None
            on_window: Callable[[list[dict[str, Any]]], None] | None = None
            on_warmup: Callable[[list[int]], None] | None = None
            if self.store is not None and self.experiment_id is not None:
                cmp_id = self.store.start_comparison(
                    self.experiment_id, purpose, baseline, candidate, hosts=self.host_names()
                )
                on_window, on_warmup = self.sinks(cmp_id)
            last: list[dict[str, Any]] = []  # the last window stored (seq, roles, period)

            def stored(
                rows: list[dict[str, Any]], sink: Any = on_window, last: list[Any] = last
            ) -> None:
                last[:] = rows[-2:]
                sink(rows)

            try:
                result = run_comparison(
                    self.pair,
                    baseline,
                    candidate,
                    self.experiment.spec,
                    on_window=stored if on_window is not None else None,
                    on_warmup=on_warmup,
                    on_progress=self.progress.comparison_progress,
                    should_stop=self.stop.is_set,
                    seed=self.seed * 100_003 + self._counter,
                    memory=self.memory,
                )
                break
            except LinkDown as exc:
                # interrupted: wait for the link, keep what the hosts spooled, start again
                self._recover(purpose, cmp_id, exc, last, on_window)
                if attempt > MAX_INTERRUPTIONS:
                    raise HostError(
                        f"{purpose}: link lost {attempt} times ({exc.one_line()})"
                    ) from None
            except HostError:
                if self.pool is not None and cmp_id is not None and self.experiment_id is not None:
                    # the pair failed: its comparison is aborted, the pool runs it again elsewhere
                    assert self.store is not None
                    self.store.abort_running(self.experiment_id, only=cmp_id)
                raise
        if self.store is not None and cmp_id is not None:
            self.store.finish_comparison(cmp_id, result)
        if result.decision is Decision.ABORTED:
            raise Interrupted(f"stopped during {purpose} ({result.samples} samples kept)")
        self.measured += 1
        self.clock_s += result.host_time_s
        self.host_seconds += 2 * result.host_time_s
        self.results.append((purpose, result))
        self._cache[key] = result
        self.progress.comparison_finished(purpose, result, False)
        return result

    def _recover(
        self,
        purpose: str,
        cmp_id: int | None,
        exc: LinkDown,
        last: list[dict[str, Any]],
        on_window: Callable[[list[dict[str, Any]]], None] | None,
    ) -> None:
        """A comparison lost its link (:class:`LinkDown`): wait for the pair to come back
        (:meth:`HostPair.recover`, bounded), store the windows the hosts spooled meanwhile
        under the interrupted comparison (numbered on from its last window, same roles and
        period; a window where a host had reverted, its lease lapsed, is invalid), and mark
        it aborted. The caller starts the comparison again: a fresh warm-up and test."""
        self.progress.message(f"{purpose}: interrupted: {exc.one_line()}; waiting for the link")
        try:
            gap = self.pair.recover()
            if on_window is not None and gap:
                seq = int(last[-1]["seq"]) + 1 if last else 0
                roles = {int(r["host"]): r["role"] for r in last} or {0: "A", 1: "B"}
                period = int(last[-1]["period"]) if last else 0
                rows = [
                    {
                        "seq": seq + k,
                        "t": s.t,
                        "host": host,
                        "role": roles.get(host, "AB"[host]),
                        "period": period,
                        "warmup": False,
                        "valid": bool(s.valid),
                        "metrics": dict(s.metrics),
                    }
                    for k, pair_samples in enumerate(gap)
                    for host, s in enumerate(pair_samples)
                ]
                on_window(rows)
        finally:
            if cmp_id is not None and self.experiment_id is not None:
                assert self.store is not None
                self.store.abort_running(self.experiment_id, only=cmp_id)
        self.progress.message(
            f"{purpose}: link back; {len(gap)} window(s) the hosts kept meanwhile stored "
            "with the interrupted comparison; starting it again"
        )

    def answered(self, purpose: str, key: tuple[str, str, str]) -> ComparisonResult | None:
        """The comparison's answer when this run already has it (measured, or stored by an
        earlier run on ``--resume``), recorded as this run's; None when it must be measured."""
        cached = self._cache.get(key)
        if cached is not None:
            self.results.append((purpose, cached))
            self.clock_s += cached.host_time_s
            self.host_seconds += 2 * cached.host_time_s
            self.progress.comparison_finished(purpose, cached, True)
        return cached

    # ------------------------------------------------------------------ choosing
    def choose(
        self,
        purpose: str,
        incumbent: Configuration,
        results: Sequence[ComparisonResult],
    ) -> Configuration:
        """The best configuration among ``incumbent`` and the candidates compared against it.

        Only candidates significantly better than the incumbent qualify. When several do
        and their intervals overlap, the leader meets the closest challengers head to head
        (a short tournament), so noise in the point estimates does not pick a neighbour of
        the true best. The winner is then confirmed by a fresh A/B against the incumbent:
        a sweep runs dozens of comparisons, so one of them passing at 95 % by chance is
        likely; requiring a second, independent pass makes adopting a setting that does
        nothing a 1-in-1600 event instead of 1-in-40 per comparison.
        """
        better = [r for r in results if r.decision is Decision.BETTER]
        if not better:
            return incumbent
        better.sort(key=lambda r: r.estimate, reverse=True)
        champion = better[0]
        for challenger in better[1:4]:
            if challenger.ci_high < champion.ci_low:
                break  # clearly behind: so is everyone after it
            duel = self.compare(f"{purpose}:runoff", champion.candidate, challenger.candidate)
            if duel.decision is Decision.BETTER:
                champion = challenger
        confirm = self.compare(f"{purpose}:confirm", incumbent, champion.candidate)
        if confirm.decision is not Decision.BETTER:
            self.progress.message(
                f"{purpose}: {change_text(incumbent, champion.candidate)} not confirmed "
                f"({confirm.decision.value}): kept as it was"
            )
            return incumbent
        return champion.candidate

    def host_names(self) -> tuple[str, str]:
        """The names of the two hosts this runner's pair runs on (``host_a`` first)."""
        return self._host_names or (self.pair.hosts[0].name, self.pair.hosts[1].name)

    def sinks(
        self, cmp_id: int
    ) -> tuple[Callable[[list[dict[str, Any]]], None], Callable[[list[int]], None]]:
        """Where comparison ``cmp_id``'s sample windows and warm-up flags go: the store, each
        sample filed under its host's index in the pool."""
        store, idx = self.store, self._hosts
        assert store is not None

        def on_window(rows: list[dict[str, Any]]) -> None:
            if idx is not None:  # the pair's host 0/1 -> the host's index in the pool
                rows = [
                    {**r, "host": idx[r["host"]]} if isinstance(r["host"], int) else r for r in rows
                ]
            store.add_samples(cmp_id, rows)

        def on_warmup(seqs: list[int]) -> None:
            store.mark_warmup(cmp_id, seqs)

        return on_window, on_warmup

    def host_time(self) -> float:
        return sum(r.host_time_s for _, r in self.results)

    # ------------------------------------------------------------------ a pool at once
    def map(self, fn: Callable[[Runner, T], R], items: Sequence[T], tag: str = "") -> list[R]:
        """``[fn(runner, item) for item in items]``, at once on the pool's live pairs.

        On one pair (or no pool) it is exactly that loop on this runner. Otherwise task ``i``
        runs on a lane bound to live pair ``i mod P`` (each pair's tasks in order, pairs in
        parallel threads), seeded from this runner's seed, ``tag`` and ``i``. Results, the
        comparisons' record and the host-clock (the longest pair's) join this runner's in task
        order. Ctrl-C / an error stops the other lanes at their next window and is re-raised; a
        HostError marks its pair failed and the task runs again on a live pair."""
        pool = self.pool
        if pool is None or len(pool.live()) <= 1 or len(items) <= 1:
            return [fn(self, item) for item in items]
        out: dict[int, R] = {}
        lanes: dict[int, Runner] = {}
        todo = list(range(len(items)))
        phase_clock = 0.0
        while todo:
            live = pool.live()
            if not live:
                raise HostError(
                    "every pair of the pool failed: "
                    + "; ".join(
                        f"{'+'.join(pool.host_names(p))}: {w}" for p, w in pool.failed.items()
                    )
                )
            plan: dict[int, list[int]] = {}
            for n, i in enumerate(todo):
                plan.setdefault(live[n % len(live)], []).append(i)
            rnd = _Round()
            threads = [
                threading.Thread(
                    target=self._work,
                    args=(rnd, p, tasks, fn, items, tag, out, lanes),
                    name=f"musku-pair-{p}",
                    daemon=True,
                )
                for p, tasks in plan.items()
            ]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            per_pair: dict[int, float] = {}
            for p, tasks in plan.items():
                per_pair[p] = sum(lanes[i].clock_s for i in tasks if i in lanes)
            phase_clock += max(per_pair.values(), default=0.0)
            for i in sorted(lanes):
                if i in rnd.retry:
                    continue  # runs again (its finished comparisons answered from the cache)
                lane = lanes[i]
                self.results.extend(lane.results)
                self.measured += lane.measured
                self.host_seconds += lane.host_seconds
            lanes.clear()
            if rnd.errors:
                raise rnd.errors[min(rnd.errors)]
            todo = sorted(rnd.retry)
        self.clock_s += phase_clock
        return [out[i] for i in range(len(items))]

    def _work(
        self,
        rnd: _Round,
        p: int,
        tasks: list[int],
        fn: Callable[[Runner, T], R],
        items: Sequence[T],
        tag: str,
        out: dict[int, R],
        lanes: dict[int, Runner],
    ) -> None:
        """One pair's thread in a :meth:`map` round: its tasks in order."""
        assert self.pool is not None
        for i in tasks:
            if p in self.pool.failed:
                with rnd.lock:
                    rnd.retry.append(i)
                continue
            lane = self._lane(p, f"{tag}#{i}")
            lanes[i] = lane
            try:
                out[i] = fn(lane, items[i])
            except HostError as exc:
                self.pool.fail(p, exc.one_line())
                with rnd.lock:
                    rnd.retry.append(i)
            except BaseException as exc:  # re-raised by map
                with rnd.lock:
                    rnd.errors[i] = exc
                self.stop.set()
                return

    def _lane(self, p: int, name: str) -> Runner:
        """A runner bound to pool pair ``p``, sharing this one's store, cache and stop flag."""
        assert self.pool is not None
        lane = copy.copy(self)
        lane.pair = self.pool.pairs[p]
        lane.seed = derive_seed(self.seed, name)
        lane.results = []
        lane.measured = 0
        lane._counter = 0
        lane.clock_s = 0.0
        lane.host_seconds = 0.0
        lane._hosts = self.pool.groups[p]
        lane._host_names = self.pool.host_names(p)
        if p not in self._memories:
            self._memories[p] = memory_for(
                lane.pair, self.store if self.experiment_id is not None else None
            )
        lane.memory = self._memories[p]
        return lane

    # ------------------------------------------------------------------ soft SKU
    def generate_softsku(self, sku_config: Configuration) -> SoftSku:
        """Validate the composed configuration by A/B against production and against stock."""
        exp = self.experiment
        against = [("production", exp.production)]
        if exp.stock != exp.production:
            against.append(("stock", exp.stock))
        # independent of each other: on a pool, on two pairs at once
        results = self.map(
            lambda r, b: r.compare(f"validate:{b[0]}", b[1], sku_config), against, tag="validate"
        )
        vs_prod, vs_stock = results[0], results[-1]
        return SoftSku(
            service=exp.service.name,
            platform=exp.platform.name,
            configuration=sku_config,
            vs_production=vs_prod,
            vs_stock=vs_stock,
        )
