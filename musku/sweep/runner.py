"""The sweep runner: runs comparisons for a strategy, records them, resumes, composes the soft SKU.

The runner knows nothing of the host backend: it drives a :class:`~musku.hosts.base.HostPair`
through :func:`musku.abtest.run_comparison`. Every finished comparison is stored as it ends, so
an interrupted sweep keeps what it measured; on ``--resume`` a comparison already finished
(same purpose, baseline and candidate) is answered from the database instead of re-measured,
and since strategies are deterministic functions of those answers, the sweep continues where
it stopped.

With a pool of pairs (:class:`~musku.hosts.pool.HostPool`, docs/fleet.md), :meth:`Runner.map`
runs a strategy's independent tasks (a knob's scan, one exhaustive comparison) at once, one
thread per pair, list-scheduled (:class:`_Schedule`): the tasks are taken longest expected
first (:mod:`musku.sweep.schedule`), and the first free pair on the host clock takes the next,
so no pair idles while a task waits. Each task runs on a *lane* (a runner bound to its pair,
seeded from the run's seed and the task's index), and the lanes' results join the run's in task
order. "First free" is decided on the pairs' host clocks, not on thread timing: a pair free at
host time ``T`` takes a task only once every busy pair's clock has passed ``T`` (ties: the
lower pair first), so a sim sweep gives the same answers on every run of a seed, whatever order
the threads run in, and a task's comparisons are those it would run on one pair. A pair that
fails (HostError) is marked failed and its unfinished tasks go to the live pairs in a next
round (what they had finished is answered from the store, as on resume).
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

from musku.abtest import run_comparison
from musku.abtest.calibration import announce, memory_for
from musku.abtest.pooled import run_pooled_comparison
from musku.domain import (
    ComparisonResult,
    ComparisonSpec,
    Configuration,
    Decision,
    SoftSku,
    TimeBreakdown,
)
from musku.errors import HostError, Interrupted, LinkDown, MuskuError
from musku.experiment import Experiment
from musku.hosts.base import HostPair
from musku.hosts.pool import HostPool, derive_seed
from musku.storage.protocols import ResultStore
from musku.sweep.jsonforms import result_dict, sku_dict
from musku.sweep.schedule import MAX_WIDTH, POOL_GAIN, CostModel, allocate, chains
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
    # the host-clock the schedule's model expected at the start (musku.sweep.schedule, the
    # dry-run's estimate); None for modes whose later phases depend on results
    estimate_clock_s: float | None = None
    # the crossover periods' rule and lengths, one line (musku.abtest.periods.summary)
    periods: str = ""
    # the pool's tasks as they ran (Runner.timeline; empty on one pair)
    timeline: list[Span] = field(default_factory=list)

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
            "estimate_clock_s": self.estimate_clock_s,
            "periods": self.periods,
            "timeline": [s.as_dict() for s in self.timeline],
        }


@dataclass(frozen=True)
class Span:
    """One task of a pooled :meth:`Runner.map` as it ran (host-clock seconds from the start
    of the run): the phase (``tag``), its label, when it was released (every task it depends
    on done), started and ended, the pairs it started on, the pairs that joined it later
    (``(at, how many)``), and the tasks it waited on. A sweep's :attr:`SweepReport.timeline`;
    :func:`critical_path` reads it."""

    tag: str
    task: int
    label: str
    released_s: float
    start_s: float
    end_s: float
    pairs: int
    joins: tuple[tuple[float, int], ...] = ()
    deps: tuple[int, ...] = ()
    results: tuple[tuple[str, ComparisonResult], ...] = ()  # the comparisons it ran

    def pair_seconds(self, until: float | None = None) -> float:
        """Pair-seconds the task held (its pairs from its start, joiners from their join)."""
        end = self.end_s if until is None else min(self.end_s, until)
        held = self.pairs * max(0.0, end - self.start_s)
        return held + sum(n * max(0.0, end - at) for at, n in self.joins)

    def as_dict(self) -> dict[str, Any]:
        return {
            "tag": self.tag,
            "task": self.task,
            "label": self.label,
            "released_s": self.released_s,
            "start_s": self.start_s,
            "end_s": self.end_s,
            "pairs": self.pairs,
            "joins": [list(j) for j in self.joins],
            "deps": list(self.deps),
            "comparisons": [
                {
                    "purpose": purpose,
                    "decision": r.decision.value,
                    "estimate": r.estimate,
                    "host_time_s": r.host_time_s,
                    "time": r.time.as_dict() if r.time is not None else None,
                }
                for purpose, r in self.results
            ],
        }


def critical_path(timeline: Sequence[Span]) -> list[tuple[Span, str]]:
    """The chain that set a run's host-clock, first task first: from the task that ended
    last, back through what it waited for: the task it depended on that was released last
    (``"dependency"``), or, when it started after its release, the task whose end freed
    its pair (``"pair"``); a later phase waits on the earlier phase's end (``"phase"``).
    Each entry is a span and why the next one waited on it."""
    if not timeline:
        return []
    by = {(s.tag, s.task): s for s in timeline}
    cur: Span | None = max(timeline, key=lambda s: (s.end_s, s.start_s))
    chain: list[tuple[Span, str]] = []
    why = "end"
    eps = 1e-6
    while cur is not None:
        chain.append((cur, why))
        nxt: Span | None = None
        if cur.start_s > cur.released_s + eps:  # waited for a pair
            before = [s for s in timeline if s is not cur and abs(s.end_s - cur.start_s) <= eps]
            if before:
                nxt, why = max(before, key=lambda s: s.pairs), "pair"
        if nxt is None and cur.deps:
            deps = [by[(cur.tag, d)] for d in cur.deps if (cur.tag, d) in by]
            if deps:
                nxt, why = max(deps, key=lambda s: s.end_s), "dependency"
        if nxt is None:  # the first task of a phase: the earlier phase's last task
            earlier = [s for s in timeline if s.end_s <= cur.start_s + eps and s.tag != cur.tag]
            if earlier and cur.start_s > eps:
                nxt, why = max(earlier, key=lambda s: s.end_s), "phase"
        cur = nxt
    chain.reverse()
    return chain


T = TypeVar("T")
R = TypeVar("R")
Job = tuple[str, Configuration, Configuration]  # (purpose, baseline, candidate)


def _question(futility: float | None) -> dict[str, Any] | None:
    """The tester's rule options for a comparison's question: the futility stop's bar
    (docs/abtest.md "The futility stop"), or None for the two-sided test."""
    return None if futility is None else {"futility": futility}


MAX_INTERRUPTIONS = 3  # a comparison whose link is lost more often counts its pair as failed
SCHEDULE_POLL_S = 0.005  # how often a free pair looks at the busy pairs' host clocks


class _Schedule:
    """The tasks of one :meth:`Runner.map` round on the live pairs, list-scheduled on the
    pairs' host clocks: whenever a pair is free, it takes the longest expected task that is
    ready (every task it depends on has finished); a pair with nothing ready waits, on its
    clock, until a running task releases one.

    Decided in host time, not thread time: pair ``p`` free at ``done[p]`` is the first free
    pair (the earliest, then the lowest index); it starts at ``S``, the later of ``done[p]``
    and the earliest time a ready task was released, and takes the longest expected task
    released by ``S``, once every busy pair's clock (its task's start plus its lane's
    progress, :meth:`Runner.progress_s`, which only grows) is past ``S`` (or at it, with a
    higher index): then no running task can free a pair or release a task before ``S``. On
    simulated hosts the assignment is a function of the seed; on real hosts, whose clocks run
    with the wall clock, a free pair waits at most for the others' clocks to catch up."""

    def __init__(
        self,
        pool: HostPool,
        pairs: Sequence[int],
        tasks: Sequence[int],
        priority: Mapping[int, float],
        deps: Mapping[int, Sequence[int]],
        stop: threading.Event,
        cost_at: Callable[[int, int], float] | None = None,
    ) -> None:
        self.pool, self.stop, self.cost_at = pool, stop, cost_at
        self.todo = set(tasks)  # not taken yet
        self.priority = priority
        self.deps = {i: [d for d in deps.get(i, ()) if d in self.todo] for i in tasks}
        self.finish: dict[int, float] = {}  # task -> host time it finished at
        self.done: dict[int, float] = {p: 0.0 for p in pairs}  # when each pair is free
        self.start: dict[int, float] = {}  # busy pair -> its task's start
        self.group: dict[int, list[int]] = {}  # a leading pair -> the pairs of its task
        self.lane: dict[int, Runner | None] = {p: None for p in pairs}
        self.gone: set[int] = set()  # pairs out of the round (nothing left for them, failed)
        self.ran: dict[int, list[int]] = {p: [] for p in pairs}
        # what ran when (host seconds from the round's start): task -> [start, end, pairs
        # at its start, release], and pairs that joined it later: (task, at, how many)
        self.spans: dict[int, list[float]] = {}
        self.joins: list[tuple[int, float, int]] = []
        self.task_of: dict[int, int] = {}  # a leading pair -> its task
        self.cond = threading.Condition()

    def _released(self, i: int) -> float | None:
        """When task ``i`` is ready (None: a task it depends on has not finished)."""
        at = 0.0
        for d in self.deps[i]:
            if d not in self.finish:
                return None
            at = max(at, self.finish[d])
        return at

    def _next(self) -> tuple[int, int, float, list[int]] | None:
        """(pair, task, start, the task's pairs) of the next assignment when it is decided
        now, else None. The pairs free by ``start`` are shared among the ready tasks by
        :func:`musku.sweep.schedule.allocate`: the task gets the first pair and as many
        more of them (the earliest free first) as it is given."""
        free = [p for p, lane in self.lane.items() if lane is None and p not in self.gone]
        free = [p for p in free if p not in self.pool.failed]
        if not free:
            return None
        p = min(free, key=lambda q: (self.done[q], q))
        ready = {i: r for i in self.todo if (r := self._released(i)) is not None}
        if not ready:
            return None  # everything left waits for a running task
        start = max(self.done[p], min(ready.values()))
        for q, lane in self.lane.items():
            if lane is None or q in self.gone or q in self.pool.failed:
                continue
            now = self.start[q] + lane.progress_s()
            if now < start or (now == start and q < p):
                return None
        now_ready = [j for j, r in ready.items() if r <= start]
        i = min(now_ready, key=lambda j: (-self.priority[j], j))
        free_by = sorted(
            (q for q in free if self.done[q] <= start), key=lambda q: (self.done[q], q)
        )
        k = allocate(len(free_by), now_ready, self.priority, self.cost_at)[i]
        return p, i, start, free_by[:k]

    def _stuck(self) -> bool:
        """No pair is running a task and none left is ready (they depend on a task that
        failed with its pair and runs again in the next round)."""
        busy = any(
            lane is not None and q not in self.gone and q not in self.pool.failed
            for q, lane in self.lane.items()
        )
        return not busy and all(self._released(i) is None for i in self.todo)

    def take(self, p: int, make: Callable[[int, list[int]], Runner]) -> tuple[int, Runner] | None:
        """Pair ``p``'s next task and its lane (``make(i, pairs)``) once the schedule gives
        ``p`` one to lead (the other pairs of the task wait in here meanwhile, busy with it);
        None when no task is left, the sweep is stopping, or ``p`` failed."""
        with self.cond:
            self.cond.notify_all()
            while True:
                if not self.todo or self.stop.is_set() or p in self.pool.failed:
                    self.gone.add(p)
                    self.cond.notify_all()
                    return None
                got = self._next()
                if got is None and self._stuck():
                    self.gone.add(p)  # what is left depends on a task to run again: next round
                    self.cond.notify_all()
                    return None
                if got is not None and got[0] == p:
                    _, i, start, group = got
                    self.todo.discard(i)
                    lane = make(i, group)
                    for q in group:
                        self.lane[q] = lane
                        self.start[q] = start
                    self.group[p] = group
                    self.ran[p].append(i)
                    released = self._released(i)
                    self.spans[i] = [start, start, float(len(group)), released or 0.0]
                    self.task_of[p] = i
                    return i, lane
                self.cond.wait(SCHEDULE_POLL_S)

    def join(self, p: int, lane: Runner, t: float, cost_k: Callable[[int], float]) -> list[int]:
        """Pairs that join lane ``lane``'s comparison (led by pair ``p``), ``t`` host
        seconds into it: once it has run past its expected time on the pairs it has
        (``cost_k(k)``: a long, noise-bound comparison the sweep's chain waits on), the pairs
        idle at its host time join it, up to :data:`MAX_WIDTH` and only where the pool then
        has :data:`MIN_POOL` pairs or more (a smaller pool pays no faster, :func:`~musku.
        sweep.schedule.pool_penalty`). Decided on the host clocks as :meth:`grow`."""
        with self.cond:
            k = len([q for q in self.group.get(p, [p]) if q not in self.pool.failed])
        if t < cost_k(k) or k >= MAX_WIDTH:
            return []  # not yet a long comparison (no need to wait for the other clocks)
        return self._add_idle(p, lane, lambda k, idle: _join_width(t, k, idle, cost_k))

    def grow(self, p: int, lane: Runner, cost_k: Callable[[int], float]) -> None:
        """Lane ``lane`` (led by pair ``p``) is about to start a comparison expected to take
        ``cost_k(k)`` on ``k`` pairs: pairs idle at its host time ``T`` (free by ``T`` with
        no task ready for them by then, or out of tasks altogether) join it when enough of
        them cut that comparison's expected time (:func:`musku.sweep.schedule.allocate`'s
        rule), instead of idling while the sweep's chain waits on it. Decided, like
        :meth:`_next`, once every other busy pair's clock has passed ``T`` (ties: the lower
        pair first), so the result is a function of the seed."""
        self._add_idle(p, lane, lambda k, idle: _grow_width(k, idle, cost_k))

    def take_some(self, p: int, lane: Runner, want: int, least: int) -> list[int]:
        """Pairs idle at lane ``lane``'s host time (led by pair ``p``) added to it, as many
        as there are up to ``want`` in all, when it then holds ``least`` or more (none
        otherwise): for a walk's settings side by side (:meth:`Runner.side_by_side`).
        Decided on the host clocks as :meth:`grow`."""
        return self._add_idle(
            p, lane, lambda k, idle: min(want, k + idle) if k + idle >= least else None
        )

    def take_idle(self, p: int, lane: Runner, want: int) -> list[int]:
        """Pairs idle at lane ``lane``'s host time (led by pair ``p``) added to it until it
        holds ``want`` (or all of them): for comparisons it runs at once (the last knob's
        run-offs, confirmation and the validations); none when that many are not idle.
        Decided on the host clocks as :meth:`grow`."""
        return self._add_idle(p, lane, lambda k, idle: want if k + idle >= want else None)

    def _add_idle(self, p: int, lane: Runner, width: Callable[[int, int], int | None]) -> list[int]:
        """Pairs idle at ``lane``'s host time added to its group (``width(k, idle)``: how
        many pairs it should have, None: as it is); see :meth:`grow`."""
        with self.cond:
            at = self.start[p] + lane.progress_s()
            while not self.stop.is_set():
                behind = False
                for q, other in self.lane.items():
                    if other is None or other is lane or q in self.pool.failed:
                        continue
                    now = self.start[q] + other.progress_s()
                    # ties: the lane led by the lower pair first (its leader, not any of its
                    # pairs: two lanes at one host time must not wait for each other)
                    lead = other._sched[1] if other._sched is not None else q
                    if now < at or (now == at and lead < p):
                        behind = True
                        break
                # a free pair that takes a task at or before ``at`` decides first (ties:
                # _next gives it only when it is lower than this lane's pairs): whether the
                # idle pairs here include it must not depend on which thread runs first
                got = None if behind else self._next()
                if got is not None and got[2] <= at:
                    behind = True
                if not behind:
                    break
                self.cond.wait(SCHEDULE_POLL_S)
            if self.stop.is_set():
                return []
            if any((r := self._released(i)) is not None and r <= at for i in self.todo):
                return []  # free pairs have tasks of their own
            idle = sorted(
                (
                    q
                    for q, other in self.lane.items()
                    if other is None and q not in self.pool.failed and self.done[q] <= at
                ),
                key=lambda q: (self.done[q], q),
            )
            group = self.group.setdefault(p, [p])
            k = len([q for q in group if q not in self.pool.failed])
            more = width(k, len(idle))
            if more is None or more <= k:
                return []
            added = idle[: more - k]
            for q in added:
                self.lane[q] = lane
                self.start[q] = self.start[p]
                group.append(q)
            task = self.task_of.get(p)
            if task is not None and added:
                self.joins.append((task, at, len(added)))
            lane._group = tuple(group)
            self.cond.notify_all()
            return added

    def finished(self, p: int, i: int, lane: Runner, ok: bool) -> None:
        """Pair ``p``'s lane ended task ``i``: the pair is free at the task's end. A task that
        did not finish (``ok`` false: its pair failed, it runs again in the next round)
        releases nothing."""
        with self.cond:
            end = self.start[p] + lane.clock_s
            if ok:
                self.finish[i] = end
            if i in self.spans:
                self.spans[i][1] = end
            self.task_of.pop(p, None)
            for q in self.group.pop(p, [p]):  # every pair of the task is free at its end
                self.start.pop(q, None)
                self.done[q] = end
                self.lane[q] = None
            self.cond.notify_all()


MIN_POOL = 4  # pairs joining a running comparison make a pool of at least this many


def _grow_width(k: int, idle: int, cost_k: Callable[[int], float]) -> int | None:
    """Before a comparison: the fewest pairs, from ``k`` and ``idle`` idle ones, that cut its
    expected time by ``1 - POOL_GAIN`` (None: none do)."""
    now = cost_k(k)
    return next(
        (m for m in range(k + 1, min(MAX_WIDTH, k + idle) + 1) if cost_k(m) <= POOL_GAIN * now),
        None,
    )


def _join_width(t: float, k: int, idle: int, cost_k: Callable[[int], float]) -> int | None:
    """During a comparison ``t`` seconds in: every idle pair (up to MAX_WIDTH) once it has
    run past its expected time on ``k`` pairs, when the pool then has MIN_POOL or more."""
    if t < cost_k(k):
        return None
    m = min(MAX_WIDTH, k + idle)
    return m if m >= MIN_POOL else None


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
        store: ResultStore | None = None,
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
        # comparisons measured ahead of the task that asks for them (a validation started
        # with the last knob's confirmation): their time is counted where they ran, so the
        # task that asks gets the answer without counting it again (shared by the lanes)
        self._ahead: set[tuple[str, str, str]] = set()
        self.results: list[tuple[str, ComparisonResult]] = []
        self.measured = 0
        self._counter = 0
        self.clock_s = 0.0  # host-clock time: see SweepReport.clock_s
        # (clock_s, pair.now() when the comparison now measuring started, or None, the
        # common clock a pooled comparison of a map's lane has reached, or None):
        # progress_s() for the pool's scheduler, replaced whole (read from other threads)
        self._live: tuple[float, float | None, float | None] = (0.0, None, None)
        self._pair_t0: float | None = None  # a lane's pair.now() when its task started
        self.host_seconds = 0.0  # time x hosts: see SweepReport.host_hours
        self.timeline: list[Span] = []  # pooled map tasks as they ran (map)
        self._hosts: tuple[int, int] | None = None  # the pair's host indices in the pool
        self._group: tuple[int, ...] | None = None  # a pooled lane's pool pairs (map)
        # a lane's schedule and its leading pair, when idle pairs may join its comparisons
        self._sched: tuple[_Schedule, int] | None = None
        self._model: CostModel | None = None
        self._host_names: tuple[str, str] | None = None
        # reboot knobs this runner's comparisons set live (a scan-live walk, Runner.live):
        # the spec the tester gets has them as no-reboot knobs, and sim pairs set them live
        self.live_knobs: frozenset[str] = frozenset()
        # the pair's calibration and remembered warm-up transients (issue 19)
        self.memory = memory_for(pair, store if experiment_id is not None else None)
        self._announced: set[int] = set()
        self._announce(self.memory)
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
        self,
        purpose: str,
        baseline: Configuration,
        candidate: Configuration,
        *,
        futility: float | None = None,
    ) -> ComparisonResult:
        """One A/B comparison (or its stored answer on resume). Raises Interrupted on Ctrl-C.
        A lane holding several pairs (:meth:`map`) pools it over those still live; idle
        pairs of the pool may join a lane before a comparison (:meth:`_Schedule.grow`).

        ``futility``: the comparison only asks "is the candidate better by at least this
        much (relative)?" (the tester's futility stop, rule option ``futility``): it may
        end ``not_better`` once "effect >= futility" is rejected; None: two-sided."""
        self._join_idle(purpose, baseline, candidate)
        if self._sched is not None or self._group is not None:
            # a lane of a pooled map (pairs may join it meanwhile), or a share of one
            left = self.pairs_left()
            if not left:
                raise HostError(f"{purpose}: every pair of its task failed")
            if self._sched is not None or len(left) > 1:
                return self._pooled(purpose, baseline, candidate, left, futility)
        key, cached = self._begin(purpose, baseline, candidate)
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
                self._live = (self.clock_s, self.pair.now(), None)
                self._mechanism([self.pair])
                result = run_comparison(
                    self.pair,
                    baseline,
                    candidate,
                    self._spec(),
                    on_window=stored if on_window is not None else None,
                    on_warmup=on_warmup,
                    on_progress=self.progress.comparison_progress,
                    should_stop=self.stop.is_set,
                    seed=self.seed * 100_003 + self._counter,
                    memory=self.memory,
                    rule_options=_question(futility),
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
        return self._finish(purpose, key, cmp_id, result, hosts=2)

    @contextlib.contextmanager
    def live(self, knobs: frozenset[str]) -> Iterator[None]:
        """Within: this runner's comparisons set ``knobs`` (reboot knobs) with their live
        mechanism ([sweep] reboot_knobs = "scan-live", strategies._scan_knob)."""
        before = self.live_knobs
        self.live_knobs = frozenset(knobs)
        try:
            yield
        finally:
            self.live_knobs = before

    def _spec(self) -> ComparisonSpec:
        """The tester's spec: knobs set live are no reboot knobs for it (periods, costs)."""
        spec = self.experiment.spec
        if not self.live_knobs & spec.reboot_knobs:
            return spec
        return dataclasses.replace(spec, reboot_knobs=spec.reboot_knobs - self.live_knobs)

    def _mechanism(self, pairs: Sequence[HostPair]) -> None:
        """Tell the pairs which reboot knobs this comparison sets live (sim pairs model
        both mechanisms; the experiment's check refuses scan-live on other backends)."""
        for pair in pairs:
            if hasattr(pair, "live_knobs"):
                pair.live_knobs = self.live_knobs

    def compare_pooled(
        self, purpose: str, baseline: Configuration, candidate: Configuration
    ) -> ComparisonResult:
        """One comparison on every live pair of the pool at once, each pair a stratum
        (:mod:`musku.abtest.pooled`); on one pair (or no pool) exactly :meth:`compare`. The
        samples are stored under each host's index in the pool. Raises Interrupted on
        Ctrl-C; a pair that fails is marked failed in the pool and its stratum kept."""
        pool = self.pool
        if self._sched is not None or self._group is not None:
            return self.compare(purpose, baseline, candidate)  # a lane: its own pairs
        live = pool.live() if pool is not None else []
        if pool is None or len(live) <= 1:
            return self.compare(purpose, baseline, candidate)
        return self._pooled(purpose, baseline, candidate, live)

    def _pooled(
        self,
        purpose: str,
        baseline: Configuration,
        candidate: Configuration,
        live: list[int],
        futility: float | None = None,
    ) -> ComparisonResult:
        """:meth:`compare_pooled` on the pool's pairs ``live``; on a lane of a pooled
        :meth:`map`, idle pairs may join it while it runs (:meth:`_Schedule.join`)."""
        pool = self.pool
        assert pool is not None
        live = list(live)
        key, cached = self._begin(purpose, baseline, candidate)
        if cached is not None:
            return cached
        on = ", ".join("+".join(pool.host_names(q)) for q in live)
        label = (
            f"{purpose} on {on}"
            if len(live) == 1
            else (f"{purpose} pooled over {len(live)} pairs on {on}")
        )
        self.progress.comparison_started(label, baseline, candidate)
        cmp_id = None
        on_window: Callable[[int, list[dict[str, Any]]], None] | None = None
        on_warmup: Callable[[int, list[int]], None] | None = None
        if self.store is not None and self.experiment_id is not None:
            store = self.store
            cmp_id = store.start_comparison(
                self.experiment_id,
                purpose,
                baseline,
                candidate,
                hosts=self.host_names() if len(live) == 1 and self._sched is not None else None,
            )
        groups = [pool.groups[p] for p in live]
        if cmp_id is not None:
            # each pair's windows under its hosts' indices in the pool (seq numbers are per
            # pair; a sample's key is comparison, seq and host)
            def on_window(i: int, rows: list[dict[str, Any]]) -> None:
                g = groups[i]
                store.add_samples(
                    cmp_id,
                    [
                        {**r, "host": g[r["host"]]} if isinstance(r["host"], int) else r
                        for r in rows
                    ],
                )

            def on_warmup(i: int, seqs: list[int]) -> None:
                store.mark_warmup(cmp_id, seqs, hosts=groups[i])

        memories = []
        for p in live:
            if p not in self._memories:
                self._memories[p] = memory_for(
                    pool.pairs[p], self.store if self.experiment_id is not None else None
                )
            memories.append(self._memories[p])
        joined: list[float] = []  # the comparison's clock when each joining pair joined
        join: Callable[[float], list[tuple[HostPair, Any]]] | None = None
        if self._sched is not None:
            sched, lead = self._sched
            if self._model is None:
                self._model = CostModel.of(self.experiment)
            model, changed = self._model, baseline.diff(candidate)

            def join(t: float) -> list[tuple[HostPair, Any]]:
                # the comparison's common clock: where this lane decides next (its pairs'
                # own clocks may run ahead of it in a warm-up), read by the other lanes
                self._live = (self._live[0], None, max(t, self._live[2] or 0.0))
                out: list[tuple[HostPair, Any]] = []
                if futility is not None:
                    # a futility question is not joined: it ends soon by design where the
                    # effect is far from the bar, and pairs joining past its expected time
                    # make it wait for three mature strata, each joiner's own warm-ups,
                    # reboots and both role orders (docs/design.md "The futility stop in
                    # the sweep": core_count=14 177 min joined, 94-102 min not)
                    return out
                for q in sched.join(lead, self, t, lambda k: model.comparison_s(changed, k)):
                    if q not in self._memories:
                        self._memories[q] = memory_for(
                            pool.pairs[q], self.store if self.experiment_id is not None else None
                        )
                    groups.append(pool.groups[q])
                    live.append(q)
                    joined.append(t)
                    self._mechanism([pool.pairs[q]])
                    out.append((pool.pairs[q], self._memories[q]))
                if out:
                    self.progress.message(
                        f"{purpose}: {len(out)} idle pair(s) joined at {t / 60:.0f} min "
                        f"(now on {len(live)})"
                    )
                return out

        # on a map's lane the comparison's progress is its common clock (join), from 0
        self._live = (
            (self.clock_s, None, 0.0) if join is not None else (self.clock_s, self.pair.now(), None)
        )
        self._mechanism([pool.pairs[p] for p in live])
        try:
            result = run_pooled_comparison(
                [pool.pairs[p] for p in live],
                baseline,
                candidate,
                self._spec(),
                on_window=on_window,
                on_warmup=on_warmup,
                on_progress=self.progress.comparison_progress,
                should_stop=self.stop.is_set,
                seed=self.seed * 100_003 + self._counter,
                memories=memories,
                join=join,
                rule_options=_question(futility),
            )
        except HostError:
            if self.store is not None and cmp_id is not None and self.experiment_id is not None:
                self.store.abort_running(self.experiment_id, only=cmp_id)
            raise
        finally:
            self._live = (self.clock_s, None, None)
        for p in live:  # pairs whose stratum ended on a failure leave the pool
            name = "+".join(pool.host_names(p))
            if f"{name} failed (" in result.reason:
                pool.fail(p, f"failed during {purpose}")
        start = len(live) - len(joined)
        held = 2 * (start * result.host_time_s + sum(result.host_time_s - t for t in joined))
        return self._finish(
            purpose, key, cmp_id, result, hosts=2 * len(live), host_seconds=max(0.0, held)
        )

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

    def _begin(
        self, purpose: str, baseline: Configuration, candidate: Configuration
    ) -> tuple[tuple[str, str, str], ComparisonResult | None]:
        """A comparison's key and, when this run already has it, its answer."""
        if self.stop.is_set():
            raise Interrupted("stopped before finishing")
        self._counter += 1
        key = (purpose, baseline.key(), candidate.key())
        return key, self.answered(purpose, key)

    def _finish(
        self,
        purpose: str,
        key: tuple[str, str, str],
        cmp_id: int | None,
        result: ComparisonResult,
        *,
        hosts: int,
        host_seconds: float | None = None,
    ) -> ComparisonResult:
        """A measured comparison stored and recorded as this run's (``hosts`` measured it for
        its host time); Interrupted when it was stopped."""
        if self.store is not None and cmp_id is not None:
            self.store.finish_comparison(cmp_id, result)
        if result.decision is Decision.ABORTED:
            raise Interrupted(f"stopped during {purpose} ({result.samples} samples kept)")
        self.measured += 1
        self.clock_s += result.host_time_s
        self._live = (self.clock_s, None, None)
        self.host_seconds += hosts * result.host_time_s if host_seconds is None else host_seconds
        self.results.append((purpose, result))
        self._cache[key] = result
        self.progress.comparison_finished(purpose, result, False)
        return result

    def answered(self, purpose: str, key: tuple[str, str, str]) -> ComparisonResult | None:
        """The comparison's answer when this run already has it (measured, or stored by an
        earlier run on ``--resume``), recorded as this run's; None when it must be measured."""
        cached = self._cache.get(key)
        if cached is not None and key in self._ahead:
            self._ahead.discard(key)  # measured ahead, counted where it ran
            self.progress.comparison_finished(purpose, cached, True)
            return cached
        if cached is not None:
            self.results.append((purpose, cached))
            self.clock_s += cached.host_time_s
            self._live = (self.clock_s, None, None)
            self.host_seconds += 2 * cached.host_time_s
            self.progress.comparison_finished(purpose, cached, True)
        return cached

    # ------------------------------------------------------------------ choosing
    def choose(
        self,
        purpose: str,
        incumbent: Configuration,
        results: Sequence[ComparisonResult],
        ahead: Callable[[Configuration], list[Job]] | None = None,
    ) -> Configuration:
        """The best configuration among ``incumbent`` and the candidates compared against it.

        Only candidates significantly better than the incumbent qualify. When several do
        and their intervals overlap, the leader meets the closest challengers head to head
        (a short tournament), so noise in the point estimates does not pick a neighbour of
        the true best. The winner is then confirmed by a fresh A/B against the incumbent:
        a sweep runs dozens of comparisons, so one of them passing at 95 % by chance is
        likely; requiring a second, independent pass makes adopting a setting that does
        nothing a 1-in-1600 event instead of 1-in-40 per comparison.

        ``ahead(champion)``: comparisons that will be wanted if the leader is chosen (the
        validations of the composition it completes, :meth:`validations`), run at once with
        the run-offs and the confirmation where this lane holds the pairs
        (:meth:`_runoff_and_confirm`); when the leader is not the choice after all, they
        are measured again later with what was chosen.
        """
        better = [r for r in results if r.decision is Decision.BETTER]
        if not better:
            return incumbent
        better.sort(key=lambda r: r.estimate, reverse=True)
        champion = better[0]
        merged = self._runoff_and_confirm(purpose, incumbent, better, ahead)
        if merged is not None:
            return merged
        for challenger in better[1:4]:
            if challenger.ci_high < champion.ci_low:
                break  # clearly behind: so is everyone after it
            duel = self.compare(f"{purpose}:runoff", champion.candidate, challenger.candidate)
            if duel.decision is Decision.BETTER:
                champion = challenger
        confirm = self._again(
            purpose, self.compare(f"{purpose}:confirm", incumbent, champion.candidate)
        )
        if confirm.decision is not Decision.BETTER:
            self.progress.message(
                f"{purpose}: {change_text(incumbent, champion.candidate)} not confirmed "
                f"({confirm.decision.value}): kept as it was"
            )
            return incumbent
        return champion.candidate

    def _again(self, purpose: str, confirm: ComparisonResult) -> ComparisonResult:
        """A confirmation that measured nothing (``inconclusive`` with no sample: a warm-up
        transient that did not end within the tester's cap) is no evidence either way: it is
        measured once more (``PURPOSE:confirm:again``). Seen on the Web/Skylake one-pair
        sweep of seed 1 once the futility stop had moved its timeline: shp=300 (+1.4 %,
        better twice) was dropped on such a confirmation (docs/design.md)."""
        if confirm.decision is not Decision.INCONCLUSIVE or confirm.samples > 0:
            return confirm
        self.progress.message(
            f"{purpose}: the confirmation measured nothing ({confirm.reason.split(';')[0]}): "
            "measuring it again"
        )
        return self.compare(f"{purpose}:confirm:again", confirm.baseline, confirm.candidate)

    def side_by_side(
        self,
        purpose: str,
        baseline: Configuration,
        candidates: Sequence[Configuration],
        futility: Sequence[float | None] | None = None,
    ) -> list[ComparisonResult]:
        """The first of ``candidates`` compared against ``baseline`` (:meth:`compare`), or,
        on a lane of a pooled map where pairs are idle at its host time for two pools or
        more (:data:`MIN_POOL` pairs each, a smaller pool is slower than one pair), the
        first ``m`` of them at once, each pooled over a share of the lane's pairs
        (:meth:`_at_once`). For a unimodal walk's next settings (issue 31 item 3: a knob's
        settings side by side when pairs are idle): the walk's chain is one comparison long
        instead of ``m``, at the price of settings past the walk's stop. Otherwise (one
        pair, too few idle) exactly :meth:`compare` of the first. ``futility[j]``: candidate
        ``j``'s futility bar (:meth:`compare`), None for none."""
        bars = list(futility) if futility is not None else [None] * len(candidates)
        todo = [c for c in candidates if (purpose, baseline.key(), c.key()) not in self._cache]
        if self._sched is not None and len(todo) >= 2 and not self.stop.is_set():
            sched, lead = self._sched
            want = min(len(candidates) * MIN_POOL, len(candidates) * MAX_WIDTH)
            if sched.take_some(lead, self, want, 2 * MIN_POOL):
                left = self.pairs_left()
                m = min(len(candidates), len(left) // MIN_POOL)
                if m >= 2:
                    jobs = [(purpose, baseline, c) for c in candidates[:m]]
                    return self._at_once(jobs, left, [MIN_POOL] * m, bars[:m])
        return [self.compare(purpose, baseline, candidates[0], futility=bars[0])]

    def _runoff_and_confirm(
        self,
        purpose: str,
        incumbent: Configuration,
        better: list[ComparisonResult],
        ahead: Callable[[Configuration], list[Job]] | None = None,
    ) -> Configuration | None:
        """:meth:`choose`'s run-off and confirmation merged, on a lane of a pooled map that
        holds several pairs (after idle pairs joined it): the leader's duels with its close
        challengers and its confirmation against the incumbent run at once, each pooled over
        its share of the lane's pairs. When no challenger beats the leader (the usual case)
        the confirmation is already there: one round instead of a chain of them; otherwise
        the best challenger that beat it is confirmed next. None where this does not apply
        (one pair, no challenger within reach and nothing ``ahead``): :meth:`choose` goes
        on as on one pair.

        With ``ahead`` (the last knob's choice, issue 31 item 3), the comparisons it gives
        for the leader (the composition's validations) join the round, on pairs idle at
        this lane's host time taken for them (:meth:`_Schedule.take_idle`); where the pairs
        do not stretch to them, they are left out (measured after the choice, as before)."""
        if self._sched is None:
            return None
        champion = better[0]
        close = [c for c in better[1:4] if c.ci_high >= champion.ci_low]
        extra = ahead(champion.candidate) if ahead is not None else []
        extra = [j for j in extra if (j[0], j[1].key(), j[2].key()) not in self._cache]
        if not close and not extra:
            return None
        jobs = [(f"{purpose}:runoff", champion.candidate, c.candidate) for c in close]
        jobs.append((f"{purpose}:confirm", incumbent, champion.candidate))
        self._join_idle(*jobs[0])
        # each validation on a pool that pays (MIN_POOL pairs), and the confirmation too
        # where the idle pairs stretch to it (else on one pair)
        duels = len(jobs) - 1
        full, least = duels + MIN_POOL * (1 + len(extra)), duels + 1 + MIN_POOL * len(extra)
        if extra:
            sched, lead = self._sched
            if not sched.take_idle(lead, self, full):
                sched.take_idle(lead, self, least)
        left = self.pairs_left()
        floor = [1] * len(jobs)
        if extra and len(left) >= least:
            if len(left) >= full:
                floor[-1] = MIN_POOL
            jobs += extra
            floor += [MIN_POOL] * len(extra)
        else:
            extra = []
            if not close or len(left) < len(jobs):
                return None
        if extra:
            self.progress.message(
                f"{purpose}: the composed configuration's validations started with "
                f"{change_text(incumbent, champion.candidate)}'s confirmation "
                f"({len(left)} pairs)"
            )
        done = self._at_once(jobs, left, floor)
        for (p_, b_, c_), r_ in zip(jobs, done, strict=True):
            if (p_, b_, c_) in extra and r_.decision is not Decision.ABORTED:
                self._ahead.add((p_, b_.key(), c_.key()))
        done = done[: len(jobs) - len(extra)]
        beat = [c for c, d in zip(close, done, strict=False) if d.decision is Decision.BETTER]
        confirm = done[-1]
        if beat:
            champion = max(beat, key=lambda r: r.estimate)
            confirm = self.compare(f"{purpose}:confirm", incumbent, champion.candidate)
        confirm = self._again(purpose, confirm)
        if confirm.decision is not Decision.BETTER:
            self.progress.message(
                f"{purpose}: {change_text(incumbent, champion.candidate)} not confirmed "
                f"({confirm.decision.value}): kept as it was"
            )
            return incumbent
        return champion.candidate

    def _at_once(
        self,
        jobs: list[Job],
        pairs: list[int],
        floor: Sequence[int] | None = None,
        futility: Sequence[float | None] | None = None,
    ) -> list[ComparisonResult]:
        """The comparisons ``jobs`` at the same time on shares of this lane's ``pairs`` (the
        first jobs get the extra pairs; ``floor[j]``: at least that many for job ``j``, one
        by default), each share a sub-lane pooling its pairs; results, host time and the
        clock (the longest share's) join this lane's in job order. ``futility[j]``: job
        ``j``'s futility bar (:meth:`compare`)."""
        bars = list(futility) if futility is not None else [None] * len(jobs)
        assert self.pool is not None
        pool, n = self.pool, len(jobs)
        # one pair each (or the floor); the spare pairs to the first jobs (the close duels)
        # in pools that pay (MIN_POOL or more: a 2- or 3-pair pool is slower than one pair)
        sizes = list(floor) if floor is not None else [1] * n
        extra = len(pairs) - sum(sizes)
        if extra < 0:
            raise ValueError("_at_once: fewer pairs than the jobs' floors")
        for j in range(n):
            if extra >= max(1, MIN_POOL - sizes[j]) and sizes[j] < MAX_WIDTH:
                more = min(extra, MAX_WIDTH - sizes[j])
                sizes[j] += more
                extra -= more
        at = [sum(sizes[:j]) for j in range(n)]
        shares = [pairs[at[j] : at[j] + sizes[j]] for j in range(n)]
        subs: list[Runner] = []
        for j, share in enumerate(shares):
            sub = copy.copy(self)
            sub._sched, sub._group = None, tuple(share) if len(share) > 1 else None
            sub.pair = pool.pairs[share[0]]
            sub._hosts, sub._host_names = pool.groups[share[0]], pool.host_names(share[0])
            sub.memory = self._memories.get(share[0]) or memory_for(
                sub.pair, self.store if self.experiment_id is not None else None
            )
            sub.seed = derive_seed(self.seed, f"{jobs[j][0]}#{self._counter}#{j}")
            sub.results, sub.measured, sub._counter = [], 0, 0
            sub.clock_s, sub.host_seconds, sub._live = 0.0, 0.0, (0.0, None, None)
            subs.append(sub)
        out: dict[int, ComparisonResult] = {}
        errors: dict[int, BaseException] = {}

        def run(j: int) -> None:
            try:
                out[j] = subs[j].compare(*jobs[j], futility=bars[j])
            except BaseException as exc:  # re-raised below, the first in job order
                errors[j] = exc
                if not isinstance(exc, HostError):  # Ctrl-C, a crash: the others stop too
                    self.stop.set()

        threads = [
            threading.Thread(target=run, args=(j,), name=f"musku-share-{j}") for j in range(n)
        ]
        self._counter += n
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        for sub in subs:
            self.results.extend(sub.results)
            self.measured += sub.measured
            self.host_seconds += sub.host_seconds
        self.clock_s += max(sub.clock_s for sub in subs)
        self._live = (self.clock_s, None, None)
        if errors:
            raise errors[min(errors)]
        return [out[j] for j in range(n)]

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

    def progress_s(self) -> float:
        """Host-clock time this runner has taken so far, the comparison it is measuring
        included, and for a lane at least its pair's clock since its task started (it only
        grows; read by the pool's scheduler from other threads). During a pooled comparison
        of a map's lane it is the comparison's common clock (the earliest host time idle
        pairs may join it), not a pair's own clock: a pair in a long warm-up runs ahead of
        that clock, and a lane that reported its lead pair's clock would let the other
        lanes decide, at later host times, before its own joins (thread timing deciding
        the schedule)."""
        base, started, common = self._live
        if common is not None:
            return base + common
        now = self.pair.now()
        if started is not None:
            base += max(0.0, now - started)
        # the pair's own clock since the task started: real pairs' clocks run with the wall
        # clock, so a task that waits outside a comparison still moves on
        since = now - self._pair_t0 if self._pair_t0 is not None else 0.0
        return max(base, self.clock_s, since)

    # ------------------------------------------------------------------ a pool at once
    def map(
        self,
        fn: Callable[[Runner, T], R],
        items: Sequence[T],
        tag: str = "",
        cost: Sequence[float] | None = None,
        deps: Mapping[int, Sequence[int]] | None = None,
        cost_at: Callable[[int, int], float] | None = None,
        labels: Sequence[str] | None = None,
    ) -> list[R]:
        """``[fn(runner, item) for item in items]``, at once on the pool's live pairs.

        On one pair (or no pool) it is exactly that loop on this runner (``deps`` must then
        point to earlier tasks). Otherwise the tasks are list-scheduled (:class:`_Schedule`):
        the first free pair on the host clock takes the ready task with the longest expected
        chain (``cost[i]``: task ``i``'s expected host seconds, :mod:`musku.sweep.schedule`,
        plus the longest chain of tasks waiting on it; without costs, task order;
        ``deps[i]``: the tasks that must finish before task ``i`` starts). Task ``i`` runs on a lane bound
        to its pair (pairs in parallel threads), seeded from this runner's seed, ``tag`` and
        ``i``. Results, the comparisons' record and the host-clock (the longest pair's) join
        this runner's in task order. Ctrl-C / an error stops the other lanes at their next
        window and is re-raised; a HostError marks its pair failed and the task runs again on
        a live pair.

        With ``cost_at(i, k)`` (task ``i``'s expected host seconds on ``k`` pairs), pairs free
        at the same host time that outnumber the ready tasks are shared among them
        (:func:`musku.sweep.schedule.allocate`): a task given ``k`` pairs runs on a lane
        holding all of them, whose comparisons are pooled over them
        (:meth:`compare_pooled`, each pair a stratum); its pairs are free again when it
        ends. Where a free pair finds a ready task of its own, every task gets one pair, as
        without ``cost_at``.

        Each task's span (released, started, ended, its pairs: ``labels[i]`` or ``tag#i``)
        goes to :attr:`timeline`, in host-clock seconds from the run's start."""
        pool = self.pool
        if deps and any(d >= i for i, ds in deps.items() for d in ds):
            raise ValueError("map: a task depends on earlier tasks only")
        pooled = cost_at is not None and self.poolable()
        if pool is None or len(pool.live()) <= 1 or len(items) < (1 if pooled else 2):
            return [fn(self, item) for item in items]
        if cost is not None and len(cost) != len(items):
            raise ValueError("map: one expected cost per item")
        costs = list(cost) if cost is not None else [0.0] * len(items)
        chain = chains(costs, deps or {})
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
            sched = _Schedule(
                pool,
                live,
                todo,
                chain,
                deps or {},
                self.stop,
                cost_at if self.poolable() else None,
            )
            rnd = _Round()
            threads = [
                threading.Thread(
                    target=self._work,
                    args=(rnd, sched, p, fn, items, tag, out, lanes),
                    name=f"musku-pair-{p}",
                    daemon=True,
                )
                for p in live
            ]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            at0 = self.clock_s + phase_clock
            for i, (st, en, k, rel) in sorted(sched.spans.items()):
                self.timeline.append(
                    Span(
                        tag=tag,
                        task=i,
                        label=labels[i] if labels is not None else f"{tag}#{i}",
                        released_s=at0 + rel,
                        start_s=at0 + st,
                        end_s=at0 + en,
                        pairs=int(k),
                        joins=tuple((at0 + a, n) for t, a, n in sched.joins if t == i),
                        deps=tuple((deps or {}).get(i, ())),
                        results=tuple(lanes[i].results) if i in lanes else (),
                    )
                )
            phase_clock += max(sched.done.values(), default=0.0)
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
            if sched.todo and self.stop.is_set():
                raise self._stopped("stopped before finishing")
            todo = sorted(set(rnd.retry) | sched.todo)  # a failed pair's task, any not taken
        self.clock_s += phase_clock
        self._live = (self.clock_s, None, None)
        return [out[i] for i in range(len(items))]

    def _join_idle(self, purpose: str, baseline: Configuration, candidate: Configuration) -> None:
        """Before a lane's comparison that is to be measured: let idle pairs join it."""
        if self._sched is None or self.stop.is_set():
            return
        if (purpose, baseline.key(), candidate.key()) in self._cache:
            return
        if self._model is None:
            self._model = CostModel.of(self.experiment)
        sched, p = self._sched
        changed, model = baseline.diff(candidate), self._model
        sched.grow(p, self, lambda k: model.comparison_s(changed, k))

    def poolable(self) -> bool:
        """Whether this runner's comparisons may be pooled over several pairs (a runner
        whose comparisons go through the DB queue measures each on one pair)."""
        return True

    def pairs_left(self) -> list[int]:
        """A lane's pool pairs still live (pooled lanes: its group; else its own pair;
        [] without a pool). A pooled lane left with one live pair moves onto it, so its
        next comparisons are that pair's own tests."""
        pool = self.pool
        if pool is None or self._hosts is None:
            return []
        if self._group is None:
            p = pool.groups.index(self._hosts)
            return [] if p in pool.failed else [p]
        live = [q for q in self._group if q not in pool.failed]
        if len(live) == 1 and pool.pairs[live[0]] is not self.pair:
            q = live[0]
            progress = self.progress_s()
            self.pair = pool.pairs[q]
            self._hosts = pool.groups[q]
            self._host_names = pool.host_names(q)
            self.memory = self._memories.get(q) or memory_for(
                self.pair, self.store if self.experiment_id is not None else None
            )
            self._pair_t0 = self.pair.now() - progress
        return live

    def _stopped(self, text: str) -> MuskuError:
        """The error a stop raises (a shared runner's says whether it was ``musku abort``)."""
        return Interrupted(text)

    def _work(
        self,
        rnd: _Round,
        sched: _Schedule,
        p: int,
        fn: Callable[[Runner, T], R],
        items: Sequence[T],
        tag: str,
        out: dict[int, R],
        lanes: dict[int, Runner],
    ) -> None:
        """One pair's thread in a :meth:`map` round: the tasks the schedule gives it."""
        assert self.pool is not None

        def make(i: int, group: list[int]) -> Runner:
            lane = self._lane(p, f"{tag}#{i}", group)
            if sched.cost_at is not None:
                lane._sched = (sched, p)
            lanes[i] = lane
            return lane

        while (got := sched.take(p, make)) is not None:
            i, lane = got
            ok = False
            try:
                out[i] = fn(lane, items[i])
                ok = True
            except HostError as exc:
                for q in lane.pairs_left() or [p]:  # the task's pairs still live: all failed
                    self.pool.fail(q, exc.one_line())
                with rnd.lock:
                    rnd.retry.append(i)
            except BaseException as exc:  # re-raised by map
                with rnd.lock:
                    rnd.errors[i] = exc
                self.stop.set()
            finally:
                sched.finished(p, i, lane, ok)

    def _lane(self, p: int, name: str, group: Sequence[int] = ()) -> Runner:
        """A runner bound to pool pair ``p`` (and with ``group``, to those pairs: its
        comparisons pooled over them), sharing this one's store, cache and stop flag."""
        assert self.pool is not None
        lane = copy.copy(self)
        lane._group = tuple(group) if len(group) > 1 else None
        lane._sched = None
        lane.pair = self.pool.pairs[p]
        lane.seed = derive_seed(self.seed, name)
        lane.results = []
        lane.measured = 0
        lane._counter = 0
        lane.clock_s = 0.0
        lane._live = (0.0, None, None)
        lane._pair_t0 = lane.pair.now()
        lane.host_seconds = 0.0
        lane.timeline = []
        lane._hosts = self.pool.groups[p]
        lane._host_names = self.pool.host_names(p)
        if p not in self._memories:
            self._memories[p] = memory_for(
                lane.pair, self.store if self.experiment_id is not None else None
            )
            self._announce(self._memories[p])
        lane.memory = self._memories[p]
        return lane

    def _announce(self, memory: Any) -> None:
        """Say once per calibration that this run uses it, and what it does (issue 32)."""
        cal = memory.calibration
        if cal is None or cal.id in self._announced:
            return
        self._announced.add(cal.id)
        self.progress.message(announce(cal, memory))

    # ------------------------------------------------------------------ soft SKU
    def validations(self, sku_config: Configuration) -> list[Job]:
        """The comparisons that validate ``sku_config``: against production, and against
        stock when it differs (:meth:`generate_softsku`)."""
        exp = self.experiment
        jobs: list[Job] = [("validate:production", exp.production, sku_config)]
        if exp.stock != exp.production:
            jobs.append(("validate:stock", exp.stock, sku_config))
        return jobs

    def task_start(self) -> float | None:
        """A lane's task's start on its round's host clock (None: not a scheduled lane)."""
        if self._sched is None:
            return None
        sched, lead = self._sched
        with sched.cond:
            return sched.start.get(lead)

    def generate_softsku(self, sku_config: Configuration) -> SoftSku:
        """Validate the composed configuration by A/B against production and against stock."""
        exp = self.experiment
        against = [(p[len("validate:") :], b) for p, b, _ in self.validations(sku_config)]
        # independent of each other: on a pool, at once, each pooled over its share of the
        # pairs (as soon as the composed configuration is known: the strategy's last task)
        model = CostModel.of(exp)
        results = self.map(
            lambda r, b: r.compare(f"validate:{b[0]}", b[1], sku_config),
            against,
            tag="validate",
            cost=[model.between(b, sku_config) for _, b in against],
            cost_at=lambda i, k: model.comparison_s(against[i][1].diff(sku_config), k),
            labels=[f"validate:{name}" for name, _ in against],
        )
        vs_prod, vs_stock = results[0], results[-1]
        return SoftSku(
            service=exp.service.name,
            platform=exp.platform.name,
            configuration=sku_config,
            vs_production=vs_prod,
            vs_stock=vs_stock,
        )
