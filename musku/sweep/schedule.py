"""How long a sweep's tasks are expected to take, and the order a pool's pairs take them in.

One model serves the scheduler (:meth:`musku.sweep.runner.Runner.map`: longest expected task
first, the first free pair takes the next) and the dry-run's estimate
(:mod:`musku.sweep.plan`: the same tasks list-scheduled on the pool's pairs), so the
estimate printed beside the measured host-clock after a sweep is the one the pairs were
scheduled by (issue 31 item 2).

A comparison is expected to take :meth:`CostModel.comparison_s` host seconds: the steady
windows for the confidence sequence to clear zero for an effect of twice ``min_effect``
(radius about three standard errors of the per-window log-ratio, whose spread comes from the
simulator model's noise when the hosts are simulated, else a default), plus one swap per
crossover period (an apply, the warm-up discarded: at least the driver's transient probe, and a
reboot when a reboot knob changes), periods being :data:`~musku.abtest.driver.SWAP_OVERHEAD`
times the swap cost as the driver makes them (under ``[statistics] period = "auto"`` the
length :func:`musku.abtest.periods.choose_in` gives for the same noise and swap), at least two, and the measuring at least both
role orders (a half and a full period), so a comparison that reboots costs more. It reads nothing measured (no earlier run, no calibration), so a
sweep's schedule, like its results, is a function of the experiment file and the seed.
A walk of an ordered knob under ``scan = "unimodal"`` is expected to stop after
:data:`UNIMODAL_EXPECTED` comparisons (two losses that get worse stop it), a knob's choice to
take one comparison (its confirmation; run-offs only on close calls), a validation one
comparison that changes every knob the soft SKU changes.
"""

from __future__ import annotations

import functools
import itertools
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from musku.abtest import stats, structure
from musku.abtest.driver import SWAP_OVERHEAD
from musku.abtest.periods import PeriodCost, choose_in
from musku.abtest.rules import PERIOD_SHARE_OF_WANDER, WANDER_SD, WANDER_TAU_S
from musku.domain import Configuration, StatsSettings
from musku.hosts.backend import Prior, backend_of
from musku.knob_spec import spec_of

UNIMODAL_EXPECTED = 3
"""Comparisons a walk of an ordered knob is expected to take under ``scan = "unimodal"``."""
MIN_PERIODS = 2  # a crossover needs both role orders
DEFAULT_SD = 0.03  # per-window log-ratio spread when nothing better is known


@functools.lru_cache(maxsize=64)
def pool_penalty(pairs: int) -> float:
    """How many more windows a comparison pooled over ``pairs`` pairs needs than one pair's
    test for the same precision: where heterogeneity of the effect is seen, the pooled
    interval is a Student-t one on ``pairs - 1`` degrees of freedom (Knapp-Hartung,
    docs/abtest.md), so a 2- or 3-pair pool is slower than one pair for small effects, and
    it pays from about four pairs. 1 for one pair."""
    if pairs <= 1:
        return 1.0
    z = stats.t_quantile(0.975, math.inf)
    return (stats.t_quantile(0.975, pairs - 1) / z) ** 2


@functools.lru_cache(maxsize=256)
def auto_period_s(st: StatsSettings, noise_sd: float, swap_s: float) -> float:
    """The period ``[statistics] period = "auto"`` is expected to choose (host seconds):
    :func:`musku.abtest.periods.choose_in` for batches of one window, the per-window noise
    ``noise_sd``, a swap of ``swap_s`` and the cs rule's default wander prior."""
    s = structure.derive(st)
    fixed = s.period_length(1, swap_s, SWAP_OVERHEAD)
    cost = PeriodCost(
        interval_s=float(st.sample_interval_s),
        noise_lrv=noise_sd**2,
        min_effect=float(st.min_effect),
        swap_s=swap_s,
        wander_sd=WANDER_SD,
        wander_tau_s=WANDER_TAU_S,
        long_share=PERIOD_SHARE_OF_WANDER,
    )
    return choose_in(s, 1, cost, fixed).windows * float(st.sample_interval_s)


@dataclass(frozen=True)
class CostModel:
    """Expected host seconds of the comparisons of one experiment (see the module).
    On ``k`` pairs (:meth:`comparison_s`), the steady windows are shared among the pairs and
    widened by :func:`pool_penalty` (the pooled interval's few degrees of freedom)."""

    windows: int  # steady windows an effect of twice min_effect needs
    interval_s: float
    warmup_s: float
    apply_s: float
    reboot_s: float
    reboot_knobs: frozenset[str]
    source: str
    # [statistics] period = "auto": the statistics settings and the per-window noise the
    # period cost model chooses the period from (musku.abtest.periods); None: 3x the swap
    auto_period: tuple[StatsSettings, float] | None = None

    @classmethod
    def of(cls, experiment: Any) -> CostModel:
        """The model for ``experiment``: its statistics settings, and the simulator model's
        noise and timing when its hosts are simulated."""
        st = experiment.stats
        sd, apply_s, reboot_s = DEFAULT_SD, 2.0, 180.0
        source = "the statistics settings and default noise and timing"
        model = _modelled(experiment)
        if model is not None:
            assert model.apply_s is not None and model.reboot_s is not None  # _modelled
            sd, apply_s, reboot_s = model.noise_sd, model.apply_s, model.reboot_s
            source = (
                "the statistics settings and the simulator model's noise and timing, for "
                "effects of twice min_effect"
            )
        windows = min(int(st.sample_cap), math.ceil((3.0 * sd / st.min_effect) ** 2))
        # after each apply the driver discards at least warmup_s and probes for the end of
        # the transient: expect the probe's length discarded
        probe = structure.derive(st, cap=int(st.sample_cap)).probe_n * float(st.sample_interval_s)
        return cls(
            windows=windows,
            interval_s=float(st.sample_interval_s),
            warmup_s=max(float(st.warmup_s), probe),
            apply_s=apply_s,
            reboot_s=reboot_s,
            reboot_knobs=frozenset(experiment.spec.reboot_knobs),
            source=source,
            auto_period=(st, sd) if st.period == "auto" else None,
        )

    def comparison_s(self, changed: Iterable[str], pairs: int = 1) -> float:
        """Expected host seconds of one comparison that changes the knobs ``changed``, on
        ``pairs`` pairs at once (pooled, :mod:`musku.abtest.pooled`: the steady windows
        shared among the pairs, each pair still measuring both role orders after its own
        warm-ups)."""
        reboot = bool(set(changed) & self.reboot_knobs)
        swap = self.apply_s + self.warmup_s + (self.reboot_s if reboot else 0.0)
        period = max(SWAP_OVERHEAD * swap, self.interval_s)
        if self.auto_period is not None:
            period = auto_period_s(*self.auto_period, swap)
        # both role orders: the half first period and a full one at least
        windows = self.windows * (pool_penalty(pairs) / max(1, pairs))
        measuring = max(windows * self.interval_s, 1.5 * period)
        periods = max(MIN_PERIODS, math.ceil(measuring / period + 0.5))
        return measuring + periods * swap

    def between(self, baseline: Configuration, candidate: Configuration) -> float:
        return self.comparison_s(baseline.diff(candidate))

    def walk_s(self, knob: str, walk: Sequence[object], unimodal: bool) -> float:
        """A walk of ``knob``'s scan: its comparisons, fewer under a unimodal stop."""
        n = min(len(walk), UNIMODAL_EXPECTED) if unimodal else len(walk)
        return n * self.comparison_s((knob,))

    def choose_s(self, knob: str) -> float:
        """A knob's choice after its scan: the confirmation."""
        return self.comparison_s((knob,))

    def scan_s(self, walks: Sequence[Sequence[object]], knob: str) -> float:
        """A knob's whole scan (its walks one after the other, then its choice)."""
        unimodal = len(walks) == 2
        return sum(self.walk_s(knob, w, unimodal) for w in walks) + self.choose_s(knob)


def chains(costs: Sequence[float], deps: Mapping[int, Sequence[int]]) -> dict[int, float]:
    """Each task's priority: its expected host seconds plus the longest expected chain of
    tasks waiting on it (a knob's walks carry its choice), so the pairs start first what the
    sweep's end waits on longest. Tasks depend on earlier tasks only."""
    after: dict[int, list[int]] = {}
    for i, ds in deps.items():
        for d in ds:
            after.setdefault(d, []).append(i)
    chain: dict[int, float] = {}
    for i in reversed(range(len(costs))):
        chain[i] = costs[i] + max((chain[j] for j in after.get(i, ())), default=0.0)
    return chain


POOL_GAIN = 0.95
"""A free pair joins a comparison when the cost model expects it to cut that comparison's
time by 5 % or more (:func:`allocate`)."""
MAX_WIDTH = 8
"""At most this many pairs on one comparison: the pooled interval covers as it should from
about eight pairs (docs/abtest.md), and a comparison at its structural floor gains little."""


def allocate(
    free: int,
    ready: Sequence[int],
    priority: Mapping[int, float],
    cost_at: Callable[[int, int], float] | None,
) -> dict[int, int]:
    """How many of ``free`` pairs, free at the same host time, each ready task gets.

    The ready tasks with the longest expected chains (``priority``) get one pair each, as
    many as there are pairs (ties: the lower task). Pairs left over go, one at a time, to the
    task whose chain is then the longest (its own time on the pairs it has, ``cost_at(task,
    k)``, plus what waits on it), while one more pair cuts that task's expected time by at
    least ``1 - POOL_GAIN`` (the fewest more pairs that do: a pool pays from about four
    pairs, :func:`pool_penalty`), up to :data:`MAX_WIDTH`; a pair nothing gains from stays
    free for the next task released. Without ``cost_at`` every task gets one pair (the
    list schedule of whole comparisons on single pairs)."""
    order = sorted(ready, key=lambda j: (-priority[j], j))[: max(0, free)]
    width = dict.fromkeys(order, 1)
    extra = free - len(order)
    if cost_at is None:
        return width
    while extra > 0:
        best: tuple[float, int, int] | None = None
        for j in order:
            k = width[j]
            now = cost_at(j, k)
            # the fewest more pairs that pay (a 2-pair pool may not, a 4-pair one may)
            more = next(
                (
                    m
                    for m in range(k + 1, min(MAX_WIDTH, k + extra) + 1)
                    if cost_at(j, m) <= POOL_GAIN * now
                ),
                None,
            )
            if more is None:
                continue
            length = priority[j] - cost_at(j, 1) + now
            if best is None or length > best[0]:
                best = (length, j, more)
        if best is None:
            break
        extra -= best[2] - width[best[1]]
        width[best[1]] = best[2]
    return width


def list_schedule(
    costs: Sequence[float],
    pairs: int,
    deps: Mapping[int, Sequence[int]] | None = None,
    durations: Sequence[float] | None = None,
    cost_at: Callable[[int, int], float] | None = None,
    finish: dict[int, tuple[float, float]] | None = None,
) -> tuple[float, list[int]]:
    """Host-clock of ``costs`` on ``pairs`` pairs as :meth:`Runner.map` schedules them: the
    first free pair (the earliest, then the lowest) takes the ready task with the longest
    expected chain, waiting for one to be released when none is, with as many of the pairs
    free by then as :func:`allocate` gives it (one without ``cost_at``); each task takes its
    expected time on its pairs (``cost_at(task, k)``, else ``costs``), or its ``durations``
    entry (what it took: the schedule a sweep ran). Returns the makespan and the (first)
    pair each task went to; ``finish`` (when given) gets each task's (start, end)."""
    if pairs < 1:
        raise ValueError("list_schedule needs at least one pair")
    deps = deps or {}
    chain = chains(costs, deps)
    done = [0.0] * pairs
    ends: dict[int, float] = {}
    where = [0] * len(costs)
    todo = set(range(len(costs)))
    while todo:
        ready = {
            i: max((ends[d] for d in deps.get(i, ())), default=0.0)
            for i in todo
            if all(d in ends for d in deps.get(i, ()))
        }
        p = min(range(pairs), key=lambda q: (done[q], q))
        start = max(done[p], min(ready.values()))
        now = [j for j, r in ready.items() if r <= start]
        i = min(now, key=lambda j: (-chain[j], j))
        free = sorted((q for q in range(pairs) if done[q] <= start), key=lambda q: (done[q], q))
        k = allocate(len(free), now, chain, cost_at)[i]
        todo.discard(i)
        where[i] = p
        took = (
            durations[i]
            if durations is not None
            else (cost_at(i, k) if cost_at is not None else costs[i])
        )
        ends[i] = start + took
        if finish is not None:
            finish[i] = (start, ends[i])
        for q in free[:k]:
            done[q] = ends[i]
    return max(done), where


@dataclass(frozen=True)
class Plan:
    """The tasks a sweep's first phase gives a pool (:func:`independent_plan`)."""

    walks: list[tuple[str, list[object], bool]]  # (knob, settings, unimodal stop)
    knobs: list[str]  # one choice task per knob, after the walks
    costs: list[float]  # walks' then choices' expected host seconds
    deps: dict[int, list[int]]  # choice task -> its knob's walk tasks
    model: CostModel | None = None

    def cost_at(self, i: int, pairs: int) -> float:
        """Task ``i``'s expected host seconds on ``pairs`` pairs (its comparisons pooled)."""
        if self.model is None:
            return self.costs[i]
        n = len(self.walks)
        if i >= n:
            return self.model.comparison_s((self.knobs[i - n],), pairs)
        knob, walk, unimodal = self.walks[i]
        count = min(len(walk), UNIMODAL_EXPECTED) if unimodal else len(walk)
        return count * self.model.comparison_s((knob,), pairs)


def independent_plan(
    experiment: Any, base: Configuration, model: CostModel, pairs: int = 1
) -> Plan:
    """The independent sweep's tasks on a pool of ``pairs`` pairs: every walk of a knob's
    scan (a walk without a unimodal stop split into single comparisons), then each knob's
    choice, which waits for that knob's walks only (:func:`musku.sweep.strategies.independent`).

    Side by side (issue 31 item 3): an ordered knob walked under ``scan = "unimodal"`` has
    its settings scanned as one comparison each instead, at once on pairs of their own, when
    the cost model expects the sweep to end sooner that way on ``pairs`` pairs (its chain of
    walk comparisons is then one comparison long, at the price of the settings past the
    walk's stop); knobs are tried longest walk first, each kept only if it helps. On one
    pair nothing changes."""
    knobs = list(experiment.service.knobs)
    scans = {k: scan_order(experiment, k, base[k]) for k in knobs}
    walked = {k for k in knobs if len(scans[k]) == 2}  # unimodal: walks with a stop

    def build(side: set[str]) -> Plan:
        walks: list[tuple[str, list[object], bool]] = []
        for knob in knobs:
            unimodal = knob in walked and knob not in side
            for w in scans[knob]:
                if w:
                    walks += (
                        [(knob, list(w), True)] if unimodal else [(knob, [v], False) for v in w]
                    )
        n = len(walks)
        plan = Plan(walks, knobs, [], {}, model)
        costs = [plan.cost_at(i, 1) for i in range(n + len(knobs))]
        deps = {n + k: [i for i, t in enumerate(walks) if t[0] == kn] for k, kn in enumerate(knobs)}
        return Plan(walks, knobs, costs, deps, model)

    plan = build(set())
    if pairs <= 1 or not walked:
        return plan
    side: set[str] = set()
    best = list_schedule(plan.costs, pairs, plan.deps, cost_at=plan.cost_at)[0]
    for knob in sorted(walked, key=lambda k: (-sum(len(w) for w in scans[k]), knobs.index(k))):
        trial = build(side | {knob})
        clock = list_schedule(trial.costs, pairs, trial.deps, cost_at=trial.cost_at)[0]
        if clock < best:
            side, best, plan = side | {knob}, clock, trial
    return plan


def estimate_clock(experiment: Any, pairs: int) -> float | None:
    """Expected host-clock to the soft SKU on ``pairs`` pairs (the model above): the first
    phase's tasks list-scheduled as the sweep schedules them, then the validations (at once
    on a pool). None for modes whose later phases depend on results (search, multiarm)."""
    model = CostModel.of(experiment)
    base = experiment.baseline_config
    mode = experiment.mode
    validations = 1 if experiment.stock == experiment.production else 2
    validate = model.comparison_s(()) * validations
    if pairs > 1:  # at once, pooled over the pairs (Runner.generate_softsku)
        validate = list_schedule(
            [model.comparison_s(())] * validations,
            pairs,
            cost_at=lambda _, k: model.comparison_s((), k),
        )[0]
    if mode == "independent":
        if pairs <= 1:  # knob by knob on the one pair
            knobs = experiment.service.knobs
            return (
                sum(model.scan_s(scan_order(experiment, k, base[k]), k) for k in knobs) + validate
            )
        plan = independent_plan(experiment, base, model, pairs)
        spans: dict[int, tuple[float, float]] = {}
        clock = list_schedule(plan.costs, pairs, plan.deps, cost_at=plan.cost_at, finish=spans)[0]
        return clock + validate_after(plan, spans, model, pairs, validations)
    if mode == "exhaustive":
        candidates = exhaustive_candidates(experiment)
        costs = [model.between(base, c) for c in candidates]
        return (
            list_schedule(
                costs,
                max(1, pairs),
                cost_at=lambda i, k: (
                    costs[i] if k == 1 else model.comparison_s(base.diff(candidates[i]), k)
                ),
            )[0]
            + validate
            + model.comparison_s(())
        )
    return None


AHEAD_POOL = 4
"""Pairs each validation started with the last knob's confirmation is pooled over (the
runner's ``MIN_POOL``: a smaller pool is slower than one pair, :func:`pool_penalty`)."""


def validate_after(
    plan: Plan,
    spans: Mapping[int, tuple[float, float]],
    model: CostModel,
    pairs: int,
    validations: int,
) -> float:
    """Host-clock the validations add after the scans' schedule ``spans``: on a pool with
    the pairs for it (each validation on :data:`AHEAD_POOL` pairs, the last choice's
    confirmation too where the pool has the pairs, else on one), they start with the last knob's confirmation
    (:meth:`musku.sweep.runner.Runner.choose` with ``ahead``), so only what they take past
    that confirmation's end is added; otherwise all of them, after the scans, at once."""
    after = list_schedule(
        [model.comparison_s(())] * validations,
        pairs,
        cost_at=lambda _, k: model.comparison_s((), k),
    )[0]
    n = len(plan.walks)
    last = max(range(n, n + len(plan.knobs)), key=lambda i: (spans[i][1], i), default=None)
    if last is None or pairs < 1 + AHEAD_POOL * validations:
        return after
    start, end = spans[last]
    width = AHEAD_POOL if pairs >= AHEAD_POOL * (1 + validations) else 1
    confirm = model.comparison_s((plan.knobs[last - n],), width)
    ahead = model.comparison_s((), AHEAD_POOL)
    return max(0.0, start + max(confirm, ahead) - end)


def scan_order(experiment: Any, knob: str, current: object) -> list[list[object]]:
    """Settings to try, as walks: for an ordered knob under ``scan = "unimodal"``, two walks
    outward from the current setting (nearest first); otherwise one walk over everything.
    ``[sweep] order_by = "prediction"`` orders them by predicted gain
    (:func:`musku.sweep.predicted.ordered`)."""
    walks = _scan_walks(experiment, knob, current)
    if getattr(experiment, "order_by", "none") == "prediction":
        from musku.sweep.predicted import ordered  # lazy: the engine's runner only when asked

        return ordered(experiment, knob, walks)
    return walks


def _scan_walks(experiment: Any, knob: str, current: object) -> list[list[object]]:
    space = list(experiment.space[knob])
    others: list[object] = [v for v in space if v != current]
    if experiment.scan != "unimodal" or not spec_of(knob).is_ordered or current not in space:
        return [others]
    ordered = sorted(space, key=lambda v: float(v) if not isinstance(v, str) else float("inf"))
    i = ordered.index(current)
    down: list[object] = list(reversed(ordered[:i]))
    up: list[object] = list(ordered[i + 1 :])
    return [down, up]


def exhaustive_candidates(experiment: Any) -> list[Configuration]:
    """Every configuration of the cross product but the baseline, in product order."""
    base = experiment.baseline_config
    knobs = list(experiment.service.knobs)
    out: list[Configuration] = []
    for values in itertools.product(*(experiment.space[k] for k in knobs)):
        candidate = base.merged(Configuration.of(dict(zip(knobs, values, strict=True))))
        if candidate != base:
            out.append(candidate)
    return out


def _modelled(experiment: Any) -> Prior | None:
    """What the experiment's backend models of its hosts' noise and timing (a
    :class:`musku.hosts.backend.Prior` with both; None: not modelled, or unreadable)."""
    prior = backend_of(experiment).prior(experiment)
    if prior is None or prior.apply_s is None or prior.reboot_s is None:
        return None
    return prior
