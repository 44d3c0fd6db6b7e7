"""Sweep strategies: which comparisons to run, and what to conclude from them.

- ``independent``: each knob scaled on its own against the baseline; best settings composed.
- ``exhaustive``: every configuration of the cross product against the baseline.
- ``search``: coordinate descent starting from the independent result, to catch interactions.
- ``multiarm``: the independent sweep with each knob's scan as one multi-arm crossover on a
  group of the pool's hosts (:mod:`musku.sweep.multiarm`).

All of them prune settings that break a guardrail (Decision.GUARDRAIL). Each is a registered
object (:mod:`musku.sweep.modes`, registry :data:`musku.registry.STRATEGIES`) whose ``run``
calls the function here: ``strategy(runner) -> (best Configuration, list[KnobOutcome])``.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable

from musku.domain import ComparisonResult, Configuration, Decision, format_value
from musku.errors import InputError
from musku.knob_spec import spec_of
from musku.sweep.limits import EXHAUSTIVE_LIMIT  # the loader refuses the same
from musku.sweep.runner import Job, KnobOutcome, Runner
from musku.sweep.schedule import CostModel, exhaustive_candidates, independent_plan, scan_order


def _ordered(knob: str) -> bool:
    """True when the knob's settings are ordered (its spec says), so a scan can walk away
    from the baseline."""
    return spec_of(knob).is_ordered


def _losing(result: ComparisonResult) -> bool:
    return result.decision in (Decision.WORSE, Decision.GUARDRAIL, Decision.NOT_BETTER)


def _scan_knob(runner: Runner, purpose: str, base: Configuration, knob: str) -> KnobOutcome:
    """Compare ``base`` against ``base`` with other settings of ``knob``; pick the best.

    Under ``scan = "unimodal"`` an ordered knob is walked outward from the current setting in
    both directions, and a walk stops after two consecutive significant losses that get worse
    (the response is taken to be unimodal there); the settings beyond are recorded as skipped.
    On a pool's lane with idle pairs for two pools or more, the walk's next settings are
    measured side by side (:meth:`Runner.side_by_side`).
    """
    outcome = KnobOutcome(knob=knob, baseline_value=base[knob], best_value=base[knob])
    walks = scan_order(runner.experiment, knob, base[knob])
    with runner.live(_live(runner, knob)):
        for walk in walks:
            _walk(runner, purpose, base, outcome, walk, unimodal=len(walks) == 2)
        _choose(runner, purpose, base, outcome)
    return _confirm_reboot(runner, purpose, base, outcome)


def _live(runner: Runner, knob: str) -> frozenset[str]:
    """``{knob}`` when its scan uses the live mechanism ([sweep] reboot_knobs = "scan-live"
    and a reboot knob), else empty."""
    return frozenset({knob}) & runner.experiment.live_knobs


def _confirm_reboot(
    runner: Runner, purpose: str, base: Configuration, outcome: KnobOutcome
) -> KnobOutcome:
    """Under ``[sweep] reboot_knobs = "scan-live"``: a reboot knob's setting chosen with the
    live mechanism is confirmed once with the reboot mechanism against the baseline
    (two-sided, ``PURPOSE:reboot``). Not ``better`` there: the knob falls back to the
    baseline's setting (the live scan's ranking is then no evidence for what the reboot
    sets; a reboot scan would cost what the live one saved, docs/design.md). A knob whose
    live scan kept the baseline needs no confirmation."""
    if not _live(runner, outcome.knob) or outcome.best_value == outcome.baseline_value:
        return outcome
    chosen = base.with_(outcome.knob, outcome.best_value)
    value = chosen[outcome.knob]
    result = runner.compare(f"{purpose}:reboot", base, chosen)
    outcome.results.append(result)
    if result.decision is not Decision.BETTER:
        runner.progress.message(
            f"{outcome.knob}: {format_value(outcome.knob, value)} (chosen live) is "
            f"{result.decision.value} with the reboot: {outcome.knob} stays at the baseline"
        )
        outcome.best_value = outcome.baseline_value
    return outcome


def _walk(
    runner: Runner,
    purpose: str,
    base: Configuration,
    outcome: KnobOutcome,
    walk: list[object],
    *,
    unimodal: bool,
) -> KnobOutcome:
    """One walk of a knob's scan (see :func:`_scan_knob`), into ``outcome``.

    Only "is it better?" matters past the walk's first setting, so those comparisons ask
    just that (the tester's futility stop, :func:`futility_bar`): a setting shown below the
    bar ends ``not_better``. The first setting of a walk is two-sided (a unimodal walk's
    stop needs its ``worse``); a walk of one setting (a knob's single setting on a pool)
    asks for ``min_effect``. Under the unimodal stop a ``not_better`` after a ``better`` in
    the walk ends the walk (past its best: shown below the best's lower bound); before any
    ``better`` it counts as a loss for the two-losses stop."""
    previous: ComparisonResult | None = None
    best: ComparisonResult | None = None  # the walk's best ``better`` so far
    min_effect = runner.experiment.spec.stats.min_effect
    n = 0
    while n < len(walk):
        # on a pool's lane with pairs idle for it, the walk's next settings side by side
        # (each pooled over a share of them, Runner.side_by_side); else the next one
        cands = [base.with_(outcome.knob, v) for v in walk[n:]]
        bars = [
            None if n + j == 0 and len(walk) > 1 else futility_bar(best, min_effect)
            for j in range(len(cands))
        ]
        batch = (
            runner.side_by_side(purpose, base, cands, bars)
            if unimodal
            else [runner.compare(purpose, base, cands[0], futility=bars[0])]
        )
        for j, result in enumerate(batch):
            outcome.results.append(result)
            if result.decision is Decision.GUARDRAIL:
                outcome.pruned.append(walk[n + j])
            if unimodal and len(walk) > n + j + 1:
                past_best = best is not None and result.decision is Decision.NOT_BETTER
                two_losses = (
                    previous is not None
                    and _losing(previous)
                    and _losing(result)
                    and result.estimate < previous.estimate
                )
                if two_losses or past_best:
                    # settings measured at once beyond the stop are kept: they were measured
                    for k, later in enumerate(batch[j + 1 :], start=n + j + 1):
                        outcome.results.append(later)
                        if later.decision is Decision.GUARDRAIL:
                            outcome.pruned.append(walk[k])
                    outcome.skipped.extend(walk[n + len(batch) :])
                    return outcome
            previous = result
            if result.decision is Decision.BETTER and (
                best is None or result.estimate > best.estimate
            ):
                best = result
        n += len(batch)
    return outcome


def futility_bar(best: ComparisonResult | None, min_effect: float) -> float:
    """The futility bar of a walk's next setting: better than the walk's best ``better`` so
    far by its lower bound (a setting shown below it is clearly behind the best: the
    choice's run-off would not take it), and by ``min_effect`` at least."""
    if best is None or not math.isfinite(best.ci_low):
        return min_effect
    return min(max(min_effect, best.ci_low), 0.99)


def _choose(
    runner: Runner,
    purpose: str,
    base: Configuration,
    outcome: KnobOutcome,
    ahead: Callable[[Configuration], list[Job]] | None = None,
) -> KnobOutcome:
    outcome.best_value = runner.choose(purpose, base, outcome.results, ahead)[outcome.knob]
    return outcome


def independent(runner: Runner) -> tuple[Configuration, list[KnobOutcome]]:
    exp = runner.experiment
    base = exp.baseline_config
    knobs = list(exp.service.knobs)
    pool = runner.pool
    if pool is not None and len(pool.live()) > 1:
        outcomes = _scans_on_pool(runner, base, knobs)
    else:
        outcomes = [_scan_knob(runner, f"knob:{knob}", base, knob) for knob in knobs]
    best = base
    for o in outcomes:
        best = best.with_(o.knob, o.best_value)
    return best, outcomes


def _scans_on_pool(runner: Runner, base: Configuration, knobs: list[str]) -> list[KnobOutcome]:
    """The knobs' scans on a pool of pairs (:func:`musku.sweep.schedule.independent_plan`):
    every walk of a knob's scan is a task of its own (an ordered knob's two walks under
    ``scan = "unimodal"`` at once, each keeping its unimodal stop), and a walk without a stop
    is one task per setting; each knob's choice (run-off, confirmation) is a task that starts
    as soon as that knob's walks are done. The pairs take the ready task with the longest
    expected chain first. The same comparisons as :func:`_scan_knob` knob by knob, in less
    host-clock time."""
    pairs = len(runner.pool.live()) if runner.pool is not None else 1
    plan = independent_plan(runner.experiment, base, CostModel.of(runner.experiment), pairs)
    walks, n = plan.walks, len(plan.walks)
    parts: dict[int, KnobOutcome] = {}  # walk task -> what it found (filled as walks end)
    # knob -> (its choice, the host time the choice ended on the round's clock)
    decided: dict[str, tuple[object, float]] = {}
    lock = threading.Lock()

    def walk(r: Runner, i: int) -> KnobOutcome:
        knob, values, unimodal = walks[i]
        o = KnobOutcome(knob=knob, baseline_value=base[knob], best_value=base[knob])
        with r.live(_live(r, knob)):
            parts[i] = _walk(r, f"knob:{knob}", base, o, values, unimodal=unimodal)
        return parts[i]

    def choose(r: Runner, k: int) -> KnobOutcome:
        knob = knobs[k]
        merged = KnobOutcome(knob=knob, baseline_value=base[knob], best_value=base[knob])
        for i in plan.deps[n + k]:  # in walk order: the same whichever walk ended first
            merged.results += parts[i].results
            merged.pruned += parts[i].pruned
            merged.skipped += parts[i].skipped
        live = _live(r, knob)
        # a live choice is confirmed with the reboot before the validations may start
        ahead = None if live else _ahead(r, base, knob, decided, lock)
        with r.live(live):
            out = _choose(r, f"knob:{knob}", base, merged, ahead)
        out = _confirm_reboot(r, f"knob:{knob}", base, out)
        start = r.task_start()
        if start is not None:
            with lock:
                decided[knob] = (out.best_value, start + r.clock_s)
        return out

    items: list[tuple[str, int]] = [("walk", i) for i in range(n)]
    items += [("choose", k) for k in range(len(knobs))]
    done = runner.map(
        lambda r, item: walk(r, item[1]) if item[0] == "walk" else choose(r, item[1]),
        items,
        tag="independent-scans",
        cost=plan.costs,
        deps=plan.deps,
        cost_at=plan.cost_at,
        labels=[_walk_label(w) for w in walks] + [f"{k} choice" for k in knobs],
    )
    return done[n:]


def _ahead(
    r: Runner,
    base: Configuration,
    knob: str,
    decided: dict[str, tuple[object, float]],
    lock: threading.Lock,
) -> Callable[[Configuration], list[Job]] | None:
    """For the last knob's choice on a pool (every other knob's choice ended by the host
    time this one starts, so the soft SKU is known but for this knob): the validations of
    the composition its leader completes, to run with its confirmation (issue 31 item 3:
    the validations start as soon as the composed configuration is known, here as soon as
    it is known up to that confirmation). Decided on the host clock, so a seed gives the
    same sweep whatever the thread timing. None otherwise."""
    start = r.task_start()
    if start is None:
        return None
    with lock:
        others = {k: v for k, (v, end) in decided.items() if end <= start and k != knob}
    if len(others) != len(r.experiment.service.knobs) - 1:
        return None
    composed = base.merged(Configuration.of(others))

    def ahead(leader: Configuration) -> list[Job]:
        return r.validations(composed.with_(knob, leader[knob]))

    return ahead


def _walk_label(walk: tuple[str, list[object], bool]) -> str:
    """A walk task's name in the sweep's timeline: ``shp 300..600`` (a unimodal walk),
    ``cdp=6:5`` (one setting)."""
    knob, values, unimodal = walk
    if len(values) == 1 and not unimodal:
        return f"{knob}={values[0]}"
    return f"{knob} {values[0]}..{values[-1]}" if len(values) > 1 else f"{knob} {values[0]}"


def exhaustive(runner: Runner) -> tuple[Configuration, list[KnobOutcome]]:
    exp = runner.experiment
    base = exp.baseline_config
    knobs = list(exp.service.knobs)
    size = math.prod(len(exp.space[k]) for k in knobs)
    if size > EXHAUSTIVE_LIMIT:
        raise InputError(
            f"exhaustive sweep of {exp.name} would compare {size:,} configurations "
            f'(limit {EXHAUSTIVE_LIMIT}): narrow [platform.settings] or use mode = "search"',
            where=str(exp.path),
        )
    candidates = exhaustive_candidates(exp)
    # every comparison against the baseline is independent: on a pool they run at once
    model = CostModel.of(exp)
    results: list[ComparisonResult] = runner.map(
        lambda r, c: r.compare("exhaustive", base, c),
        candidates,
        tag="exhaustive",
        cost=[model.between(base, c) for c in candidates],
        cost_at=lambda i, k: model.comparison_s(base.diff(candidates[i]), k),
    )
    best = runner.choose("exhaustive", base, results)
    outcomes = []
    for k in knobs:
        mine = [r for r in results if set(r.baseline.diff(r.candidate)) == {k}]
        outcomes.append(
            KnobOutcome(
                knob=k,
                baseline_value=base[k],
                best_value=best[k],
                results=mine,
                pruned=[r.candidate[k] for r in mine if r.decision is Decision.GUARDRAIL],
            )
        )
    return best, outcomes


def search(runner: Runner) -> tuple[Configuration, list[KnobOutcome]]:
    """Coordinate descent from the independent result: each round re-scans every knob with
    the others held at the current best, and moves when a setting is significantly better."""
    best, outcomes = independent(runner)
    by_knob = {o.knob: o for o in outcomes}
    for rnd in range(1, runner.experiment.search_rounds + 1):
        moved = False
        for knob in runner.experiment.service.knobs:
            o = _scan_knob(runner, f"search:{rnd}:{knob}", best, knob)
            by_knob[knob].results.extend(o.results)
            by_knob[knob].pruned.extend(v for v in o.pruned if v not in by_knob[knob].pruned)
            if o.best_value != best[knob]:
                runner.progress.message(
                    f"search round {rnd}: {knob} {best[knob]} -> {o.best_value} (interaction)"
                )
                best = best.with_(knob, o.best_value)
                by_knob[knob].best_value = o.best_value
                moved = True
        if not moved:
            break
    return best, outcomes
