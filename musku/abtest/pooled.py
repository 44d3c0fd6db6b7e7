"""One A/B comparison on several pairs at once: each pair a stratum, judged together.

With ``k`` free pairs, one comparison runs its crossover on all of them side by side. Each
pair is a stratum: its own two-host crossover (:mod:`musku.abtest.driver`: warm-up, batches,
periods, the between-period wander component) removes *its* host bias, so pairs of unequal
hosts combine without their biases adding up. At every look the strata's crossover
estimates are combined by :func:`musku.abtest.stats.pool_strata`: a random-effects average
whose interval includes the between-pair heterogeneity of the effect (a knob that helps on
some hosts and not on others must not look more certain for it), with Satterthwaite degrees
of freedom. The pooled estimate gets the same always-valid boundary as one pair's
(:func:`musku.abtest.stats.cs_halfwidth`), at the summed intrinsic time, so looking after
every batch stays honest.

- **Lockstep.** The pairs measure at the same time (one thread each per step: real hosts
  measure in real time); each step advances every active pair to its next closed batch, then
  one look judges them all. A pair's data depend on that pair alone, so the result is the
  same for a seed whatever order the threads run in.
- **Maturity.** Only strata whose own structure allows a decision (enough batches per role
  order, two periods per order when periods are long against the wander's time scale:
  :meth:`~musku.abtest.rules.ConfidenceSequenceRule.mature`) enter the decision, and a
  decision needs :data:`MIN_STRATA` of them (every pair of a smaller pool): one pair's
  crossover cannot show that the effect differs between pairs.
- **Heterogeneity.** Where the pairs' effects demonstrably differ so much that no amount of
  data per pair could decide, the comparison ends inconclusive and says more pairs would.
- **Pairs that leave.** A pair that fails mid-comparison (a :class:`~musku.errors.HostError`)
  or reaches its own sample cap keeps its stratum as of its last look; the comparison goes on
  on the others and says so. Every pair failing raises the first failure.
- **Guardrails** are checked on every pair's candidate windows at every look: one breach ends
  the comparison (production safety first).
- The early (pre-crossover) path is off: a pool decides on crossovers only.

With one pair this is exactly :func:`musku.abtest.driver.run_comparison` (said once in the
result's method). ``design="pre"`` runs the pre-period design instead
(:mod:`musku.abtest.prepool`: each pair's bias from a concurrent baseline pre-period, one
apply per pair; not the default), with this crossover pool after it where needed."""

from __future__ import annotations

import math
from collections.abc import Callable, Generator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Any

import numpy as np

from musku.abtest import prepool, stats
from musku.abtest.calibration import PairMemory
from musku.abtest.driver import (
    Progress,
    WindowRow,
    _Comparison,
    _Stop,
    _Transient,
    _wander_gate,
    futility_reason,
    run_comparison,
    validate_spec,
)
from musku.abtest.rules import ConfidenceSequenceRule, make_rule, pct, to_relative
from musku.domain import (
    ComparisonResult,
    ComparisonSpec,
    Configuration,
    Decision,
    TimeBreakdown,
)
from musku.errors import HostError, InputError, UnsupportedError
from musku.hosts.base import HostPair

Outcome = tuple[Decision, str]
JOIN_THREADS = 16  # threads kept for pairs that may join a comparison (``join``)
# an interval held open by the pairs' differing effects ends inconclusive (_futile): more
# samples per pair cannot narrow it, more pairs would
MIN_STRATA = 3  # mature strata a pooled decision needs (all of a smaller pool)


@dataclass
class _Stratum:
    index: int
    cmp: _Comparison
    steps: Generator[str, Outcome | None, Outcome] | None = None
    kind: str = ""  # what the last step yielded: "look", "cap"; "" before the first
    done: bool = False
    outcome: Outcome | None = None
    failed: str = ""
    est: stats.CrossoverEstimate | None = None  # as of its last look
    n_opt: float = 0.0
    mature: bool = False
    result: ComparisonResult | None = field(default=None)
    offset: float = 0.0  # the common clock when the pair joined (0: from the start)

    @property
    def name(self) -> str:
        return "+".join(h.name for h in self.cmp.pair.hosts)

    @property
    def samples(self) -> int:
        return int(self.cmp.d.n - self.cmp.dropped)


@dataclass(frozen=True)
class PooledLook:
    """The pooled estimate at one look (relative effects, like a verdict)."""

    decision: Decision | None
    estimate: float
    ci_low: float
    ci_high: float
    pooled: stats.PooledEstimate | None
    strata: int  # strata in the decision (mature ones)
    clock: float = math.nan  # the host clock by which its data existed
    futile: str = ""  # why no decision can come from more samples per pair (heterogeneity)
    # the sprt equivalence bounds (relative) NO_DIFFERENCE is decided on; NaN: the interval
    eq_low: float = math.nan
    eq_high: float = math.nan
    fut_bound: float = math.nan  # the futility stop's bound (rule option ``futility``)


def run_pooled_comparison(
    pairs: Sequence[HostPair],
    baseline: Configuration,
    candidate: Configuration,
    spec: ComparisonSpec,
    *,
    on_window: Callable[[int, list[WindowRow]], None] | None = None,
    on_progress: Callable[[Progress], None] | None = None,
    should_stop: Callable[[], bool] | None = None,
    seed: int | None = None,
    rule: str = "cs",
    rule_options: Mapping[str, Any] | None = None,
    memories: Sequence[PairMemory] | None = None,
    on_warmup: Callable[[int, list[int]], None] | None = None,
    join: Callable[[float], Sequence[tuple[HostPair, PairMemory]]] | None = None,
    design: str = "crossover",
    pre_s: float | None = None,
) -> ComparisonResult:
    """Run one comparison of ``candidate`` (role B) against ``baseline`` (role A) on every
    pair of ``pairs`` at once and return the pooled result (module doc).

    ``on_window(i, rows)`` / ``on_warmup(i, seqs)`` receive pair ``i``'s windows and
    retro-trimmed warm-up windows, from that pair's thread (a store given them must be safe
    to share). ``samples`` in the result is the sum over the pairs, ``host_time_s`` the
    longest pair's (the clock the comparison took); the reason names each pair's stratum.
    Raises :class:`InputError` for an invalid spec, no pairs, or a rule that cannot pool.

    ``join(t)``, asked before every step with the comparison's host clock ``t``, returns pairs
    that join it there (numbered on after ``pairs``): each starts its own crossover (its own
    warm-up and both role orders) on the common clock from ``t`` and enters the decision
    once mature, like the others. With ``join``, even one pair runs as a pool (crossovers
    only), so pairs may join it.

    ``design="pre"`` (not the default: docs/abtest.md, issue 30's pooled goal) measures
    each pair's host bias in a concurrent pre-period of ``pre_s`` on the baseline
    (:mod:`musku.abtest.prepool`), applies the candidate to one host per pair and falls
    back to this crossover pool (with the rest of alpha) when it has not decided by its
    horizon; ``on_window``, ``on_warmup``, ``join`` and guardrails are not supported there
    yet (:class:`UnsupportedError`)."""
    validate_spec(spec)
    pairs = list(pairs)
    if not pairs:
        raise InputError("a pooled comparison needs at least one pair")
    if design not in ("crossover", "pre"):
        raise InputError(f"unknown pooled design {design!r}: 'crossover' or 'pre'")
    if design == "pre":
        if on_window is not None or on_warmup is not None or join is not None:
            raise UnsupportedError(
                "the pre-period pooled design does not store windows or take joining pairs "
                "yet: use design='crossover'"
            )

        def then(rest: ComparisonSpec) -> ComparisonResult:
            return run_pooled_comparison(
                pairs, baseline, candidate, rest, on_progress=on_progress,
                should_stop=should_stop, seed=seed, rule=rule, rule_options=rule_options,
                memories=memories,
            )  # fmt: skip

        return prepool.run_pre_pooled(
            pairs,
            baseline,
            candidate,
            spec,
            seed=int(spec.stats.seed if seed is None else seed),
            pre_s=prepool.PRE_S if pre_s is None else pre_s,
            should_stop=should_stop,
            then=then,
        )
    names = [tuple(h.name for h in p.hosts) for p in pairs]
    seen: set[str] = set()
    for hs in names:
        for h in hs:
            if h in seen:
                raise InputError(f"host {h!r} is in two pairs of one pooled comparison")
            seen.add(h)
    if memories is not None and len(memories) != len(pairs):
        raise InputError(f"{len(memories)} pair memories for {len(pairs)} pairs")
    base_seed = spec.stats.seed if seed is None else seed
    if len(pairs) == 1 and join is None:
        result = run_comparison(
            pairs[0],
            baseline,
            candidate,
            spec,
            on_window=(lambda rows: on_window(0, rows)) if on_window else None,
            on_progress=on_progress,
            should_stop=should_stop,
            seed=base_seed,
            rule=rule,
            rule_options=rule_options,
            memory=memories[0] if memories is not None else None,
            on_warmup=(lambda seqs: on_warmup(0, seqs)) if on_warmup else None,
        )
        return _with_method(result, f"{result.method}; pooled over 1 pair: one pair's test")

    def make(i: int, pair: HostPair, memory: PairMemory) -> _Stratum:
        seed_i = np.random.SeedSequence([int(base_seed or 0), 0x9001, i]).generate_state(1)
        r = make_rule(
            rule,
            seed=int(seeds[i]) if i < len(seeds) else int(seed_i[0]),
            **dict(rule_options or {}),
        )
        if isinstance(r, ConfidenceSequenceRule):
            r.early = False  # a pool decides on crossovers only
        _wander_gate(r, memory)  # each pair's calibrated wander, where it has one
        if not isinstance(r, ConfidenceSequenceRule) or not r.crossover:
            raise InputError(
                f"rule {rule!r} cannot pool pairs: a pooled comparison needs the crossover "
                "confidence-sequence rule ('cs')"
            )
        cmp = _Comparison(
            pair,
            baseline,
            candidate,
            spec,
            r,
            partial(on_window, i) if on_window else None,
            None,
            should_stop,
            memory,
            partial(on_warmup, i) if on_warmup else None,
        )
        cmp.sign = r.first_order()
        return _Stratum(i, cmp)

    seeds = np.random.SeedSequence([int(base_seed or 0), 0x9001]).generate_state(len(pairs))
    strata = [
        make(i, pair, memories[i] if memories is not None else PairMemory())
        for i, pair in enumerate(pairs)
    ]
    pool = _Pool(strata, spec, on_progress)
    if join is not None:
        pool.join, pool.make = join, make
    return pool.run(baseline, candidate)


class _Pool:
    def __init__(
        self,
        strata: list[_Stratum],
        spec: ComparisonSpec,
        on_progress: Callable[[Progress], None] | None,
    ) -> None:
        self.strata = strata
        self.spec = spec
        self.on_progress = on_progress
        self.alpha = 1.0 - spec.stats.confidence
        self.dir = strata[0].cmp.dir
        self.look = PooledLook(None, math.nan, -math.inf, math.inf, None, 0)
        self.t0 = [s.cmp.t0 for s in strata]
        self.clock_t: float | None = None  # the common host clock the pairs measure up to
        self.join: Callable[[float], Sequence[tuple[HostPair, PairMemory]]] | None = None
        self.make: Callable[[int, HostPair, PairMemory], _Stratum] | None = None

    # ------------------------------------------------------------------ one step

    def _advance(self, s: _Stratum, outcome: Outcome | None) -> None:
        """Move one stratum to its next look (its own thread); record how it left."""
        try:
            if s.steps is None:
                s.steps = s.cmp.steps()
                s.kind = next(s.steps)
            else:
                s.kind = s.steps.send(outcome)
        except StopIteration as end:
            s.done, s.outcome = True, end.value
        except _Transient as exc:
            s.done, s.outcome = True, (Decision.INCONCLUSIVE, str(exc))
        except HostError as exc:
            s.done, s.failed = True, str(exc)

    def _until(self, s: _Stratum, until: float) -> None:
        """Advance one stratum look by look while its pair's clock is before ``until``."""
        while not s.done and s.kind != "cap" and self._own_clock(s) < until:
            self._advance(s, None)

    def _own_clock(self, s: _Stratum) -> float:
        return s.cmp.pair.now() - s.cmp.t0 + s.offset

    def _joined(self) -> None:
        """Pairs that join now (``join``): new strata starting at the common clock."""
        if self.join is None or self.make is None or self.clock_t is None:
            return
        live = [s for s in self.strata if not s.done]
        if not live:
            return
        now = min(self._own_clock(s) for s in live)
        for pair, memory in self.join(now):
            s = self.make(len(self.strata), pair, memory)
            s.offset = now
            self.strata.append(s)
            self.t0.append(s.cmp.t0)

    def _step(self, ex: ThreadPoolExecutor, outcome: Outcome | None) -> None:
        """The pairs measure side by side: every active pair behind the common clock ``T``
        advances until it reaches ``T`` (a pair in a long warm-up or swap runs ahead and
        waits; the others go on looking meanwhile, as real pairs measuring in parallel do),
        then ``T`` moves on by the shortest batch of a pair (at least one window)."""
        active = [s for s in self.strata if not s.done]
        if self.clock_t is None:  # the first step: every pair to its first look
            futures = [ex.submit(self._advance, s, outcome) for s in active]
        else:
            behind = [
                s
                for s in active
                if s.steps is not None and s.kind != "cap" and self._own_clock(s) < self.clock_t
            ]
            if not behind:  # every pair ahead (long warm-ups): the clock jumps to the first
                self.clock_t = min(self._own_clock(s) for s in active) + self.quantum()
                behind = [
                    s
                    for s in active
                    if s.steps is not None and s.kind != "cap" and self._own_clock(s) < self.clock_t
                ]
            futures = [ex.submit(self._until, s, self.clock_t) for s in behind]
            # pairs that joined: to their first look (their warm-up runs them ahead)
            futures += [ex.submit(self._advance, s, None) for s in active if s.steps is None]
        for f in futures:
            f.result()  # _Stop (a stop request) and anything unexpected propagate
        live = [s for s in self.strata if not s.done]
        if live:
            now = min(self._own_clock(s) for s in live)
            self.clock_t = max(self.clock_t or 0.0, now) + self.quantum()

    def quantum(self) -> float:
        """Host seconds the common clock moves per pooled look: the shortest batch of the
        pairs still measuring (at least one window)."""
        spans = [(s.cmp.b or 1) * s.cmp.interval for s in self.strata if not s.done and s.cmp.b]
        return max(min(spans, default=0.0), self.strata[0].cmp.interval)

    def _judge_strata(self) -> None:
        for s in self.strata:
            if s.done or s.steps is None:
                continue
            rule = s.cmp.rule
            assert isinstance(rule, ConfidenceSequenceRule)
            ev = s.cmp._evidence()
            rule.last_estimate = None
            s.cmp.verdict = rule.look(ev)
            s.cmp._check_bias()
            if rule.last_estimate is not None:
                s.est = rule.last_estimate
                s.n_opt = rule.n_opt(ev.batch_size)
                s.mature = rule.mature(s.est, rule.long_periods(ev))

    def _pooled(self) -> PooledLook:
        have = [s for s in self.strata if s.est is not None]
        use = [s for s in have if s.mature]
        part = use or have
        if not part:
            return PooledLook(None, math.nan, -math.inf, math.inf, None, 0)
        pe = stats.pool_strata(
            [s.est.mean for s in part if s.est],
            [s.est.se for s in part if s.est],
            [float(s.est.df) for s in part if s.est],
        )
        if pe is None:
            return PooledLook(None, math.nan, -math.inf, math.inf, None, 0)
        rule = part[0].cmp.rule
        assert isinstance(rule, ConfidenceSequenceRule)
        n_eff = sum(s.est.n_eff for s in part if s.est)
        n_opt = sum(s.n_opt for s in part)
        alpha = rule.alpha_crossover()
        hw = stats.cs_halfwidth(pe.se, n_eff, alpha, n_opt, df=pe.df)
        est = to_relative(pe.mean, self.dir)
        lo, hi = to_relative(pe.mean - hw, self.dir), to_relative(pe.mean + hw, self.dir)
        decision: Decision | None = None
        # equivalence = "sprt" (the one pair's rule option): two one-sided SPRTs on the
        # pooled estimate, both at this look (strata join and leave between looks: no
        # memory of earlier ones); otherwise the two-sided interval inside +-min_effect
        m = self.spec.stats.min_effect
        eq_lo, eq_hi = math.nan, math.nan
        inside = -m < lo and hi < m
        if rule.equivalence == "sprt":
            b_lo, b_hi = stats.sprt_bounds(pe.mean, pe.se * pe.se, rule.alpha_equivalence(), pe.df)
            eq_lo, eq_hi = to_relative(b_lo, self.dir), to_relative(b_hi, self.dir)
            inside = rule.equivalent(b_lo, b_hi, eq_lo, eq_hi)  # its margin, as one pair's
        if len(use) >= self.min_strata():
            if lo > 0:
                decision = Decision.BETTER
            elif hi < 0:
                decision = Decision.WORSE
            elif inside:
                decision = Decision.NO_DIFFERENCE
        fut = math.nan
        if rule.futility is not None:  # the futility stop on the pooled estimate, this look
            f_log = stats.futility_bound(
                pe.mean, pe.se * pe.se, rule.futility_margin(), rule.alpha_equivalence(), pe.df
            )
            fut = to_relative(f_log, self.dir)
            if decision is None and len(use) >= self.min_strata() and rule.futile(f_log):
                decision = Decision.NOT_BETTER
        # the data of the strata judged existed by the latest of their clocks (a pair that
        # ran ahead into a swap without a look since is not in it)
        clock = max(self._own_clock(s) for s in part)
        futile = "" if decision is not None or not use else self._futile(pe, n_eff, n_opt, alpha)
        return PooledLook(
            decision, est, lo, hi, pe, len(use), clock=clock, futile=futile, eq_low=eq_lo,
            eq_high=eq_hi, fut_bound=fut,
        )  # fmt: skip

    def min_strata(self) -> int:
        """Mature strata a decision needs: MIN_STRATA, or every pair of a smaller pool
        (at least one). One or two pairs' crossovers cannot show that the effect differs
        between pairs: a decision on them would speak for those pairs only."""
        live = [s for s in self.strata if not s.failed and s.steps is not None]
        return max(1, min(MIN_STRATA, len(live)))

    def _futile(self, pe: stats.PooledEstimate, n_eff: float, n_opt: float, alpha: float) -> str:
        """Why more samples per pair cannot decide (or ""): every pair's stratum is in the
        estimate (at least MIN_STRATA) with two periods of each role order (its error
        measured, the wander's included), a one-sided 99 % lower bound on the between-pair
        sd of the effect (:func:`stats.tau_lower`) is above 0, and even with that sd the
        interval could never narrow to exclude 0 or to fit inside ±min_effect, however long
        each pair measured: its variance cannot fall below tau^2 / k (and the boundary's
        radius only grows with more samples)."""
        live = [s for s in self.strata if not s.failed and s.steps is not None]
        if pe.tau <= 0.0 or pe.k < max(MIN_STRATA, len(live)):
            return ""
        ests = [s.est for s in live]
        if any(
            e is None or e.period is None or min(e.period.periods_plus, e.period.periods_minus) < 2
            for e in ests
        ):
            return ""
        tau = stats.tau_lower([e.mean for e in ests if e], [e.se for e in ests if e], 0.99)
        if tau <= 0.0:
            return ""
        floor = stats.cs_halfwidth(tau / math.sqrt(pe.k), n_eff, alpha, n_opt, df=pe.k - 1)
        m = math.log1p(self.spec.stats.min_effect)
        if abs(pe.mean) >= floor or floor < m:
            return ""
        return (
            f"the effect differs between the pairs (between-pair sd {pe.tau * 100:.2f} %, at "
            f"least {tau * 100:.2f} % at 99 %; Cochran's Q {pe.q:.1f} on {pe.k - 1} df): with "
            f"{pe.k} pairs the interval cannot narrow below ±{math.expm1(floor) * 100:.2f} % "
            "however long they measure; more pairs would"
        )

    def _outcome(self, final: bool) -> Outcome | None:
        v = self.look
        n = sum(s.samples for s in self.strata)
        for s in self.strata:
            if s.failed or s.steps is None:
                continue
            broken = s.cmp._guardrails(final=final)
            if broken is not None and v.decision is not Decision.WORSE:
                g, mean, glo, ghi = broken
                return Decision.GUARDRAIL, (
                    f"guardrail {g} broken on pair {s.name}: candidate's {g.metric} = "
                    f"{mean:.4g} [{glo:.4g}, {ghi:.4g}] after {n:,} samples on "
                    f"{len(self.strata)} pairs"
                )
        interval = f"interval [{pct(v.ci_low)}, {pct(v.ci_high)}]"
        on = f"after {n:,} samples on {v.strata} of {len(self.strata)} pairs"
        if v.decision in (Decision.BETTER, Decision.WORSE):
            return v.decision, f"{interval} excludes 0 {on}"
        if v.decision is Decision.NO_DIFFERENCE:
            m = self.spec.stats.min_effect
            if math.isfinite(v.eq_low):
                return v.decision, (
                    f"equivalence bounds [{pct(v.eq_low)}, {pct(v.eq_high)}] (two one-sided "
                    f"SPRTs) lie inside ±{m * 100:.2f} % {on}; {interval}"
                )
            return v.decision, f"{interval} lies inside ±{m * 100:.2f} % {on}"
        if v.decision is Decision.NOT_BETTER:
            rule = self.strata[0].cmp.rule
            return v.decision, f"{futility_reason(rule, v.fut_bound, on)}; {interval}"
        if v.futile:
            return Decision.INCONCLUSIVE, f"{v.futile}: {interval} {on}"
        if final:
            if not math.isfinite(v.ci_low):
                return Decision.INCONCLUSIVE, f"no interval yet after {n:,} samples (sample cap)"
            return Decision.INCONCLUSIVE, (
                f"no significant difference: {interval} {on} (sample cap)"
            )
        return None

    def _progress(self, decision: Decision | None = None) -> None:
        if self.on_progress is None:
            return
        v = self.look
        self.on_progress(
            Progress(
                samples=sum(s.samples for s in self.strata),
                estimate=v.estimate,
                ci_low=v.ci_low,
                ci_high=v.ci_high,
                host_time_s=self._clock(),
                period=max(s.cmp.period for s in self.strata),
                batches=sum(len(s.cmp.batch_d) for s in self.strata),
                batch_size=max(s.cmp.b or 0 for s in self.strata),
                decision=decision,
                windows_needed=None,
            )
        )

    def _clock(self) -> float:
        return max(self._own_clock(s) for s in self.strata)

    # ------------------------------------------------------------------ the whole run

    def run(self, baseline: Configuration, candidate: Configuration) -> ComparisonResult:
        outcome: Outcome | None = None
        workers = len(self.strata) + (JOIN_THREADS if self.join is not None else 0)
        with ThreadPoolExecutor(workers, thread_name_prefix="musku-stratum") as ex:
            try:
                self._step(ex, None)
                while True:
                    if all(s.failed for s in self.strata):
                        first = self.strata[0].failed
                        raise HostError(f"every pair of the pooled comparison failed: {first}")
                    self._judge_strata()
                    self.look = self._pooled()
                    final = all(s.done or s.kind == "cap" for s in self.strata)
                    outcome = self._outcome(final)
                    self._progress()
                    if outcome is not None:
                        break
                    # strata at their cap end here (kept as of this look); the others go on
                    for s in self.strata:
                        if not s.done and s.kind == "cap":
                            self._advance(s, (Decision.INCONCLUSIVE, "this pair's sample cap"))
                    self._joined()
                    self._step(ex, None)
            except _Stop:
                outcome = self.strata[0].cmp.stopped()
                n = sum(s.samples for s in self.strata)
                outcome = (outcome[0], f"stopped on request after {n:,} samples")
            else:
                for s in self.strata:  # the decision ends every pair still measuring
                    if not s.done and s.steps is not None:
                        self._advance(s, outcome)
        assert outcome is not None
        self._progress(outcome[0])
        for s in self.strata:
            if s.steps is not None and not s.failed:
                s.result = s.cmp.finish(s.outcome or outcome)
        return self._result(baseline, candidate, outcome)

    def _result(
        self, baseline: Configuration, candidate: Configuration, outcome: Outcome
    ) -> ComparisonResult:
        decision, reason = outcome
        v = self.look
        per = []
        for s in self.strata:
            if s.failed:
                per.append(f"{s.name} failed ({s.failed}; kept to its last look)")
            elif s.est is not None:
                e = to_relative(s.est.mean, self.dir)
                per.append(f"{s.name} {pct(e)} ± {s.est.se * 100:.2f} % n={s.samples:,}")
            else:
                per.append(f"{s.name} no estimate n={s.samples:,}")
        pe = v.pooled
        het = (
            f"between-pair sd of the effect {pe.tau * 100:.3f} % (Q {pe.q:.2f} on {pe.k - 1} df)"
            if pe is not None and pe.k > 1
            else ""
        )
        detail = "; ".join(x for x in (het, "strata: " + ", ".join(per)) if x)
        guard: dict[str, float] = {}
        for s in self.strata:
            for k, val in s.cmp.guard_values.items():
                guard[k] = max(guard.get(k, -math.inf), val)
        first = next((s.result for s in self.strata if s.result is not None), None)
        method = (first.method if first else self.strata[0].cmp.rule.method()) + (
            f"; pooled over {len(self.strata)} pairs (random effects, DerSimonian-Laird "
            "between-pair variance, Satterthwaite df)"
        )
        parts = [s.result.time for s in self.strata if s.result is not None and s.result.time]
        time = (
            TimeBreakdown(*(sum(x) for x in zip(*(t.seconds() for t in parts), strict=True)))
            if parts
            else None
        )
        return ComparisonResult(
            baseline=baseline,
            candidate=candidate,
            decision=decision,
            estimate=v.estimate if math.isfinite(v.estimate) else 0.0,
            ci_low=v.ci_low,
            ci_high=v.ci_high,
            samples=sum(s.samples for s in self.strata),
            # a decision: when the data it used existed (a pair that ran ahead into its swap
            # in the simulation, without a look since, would have been stopped there); else
            # the longest pair's clock
            host_time_s=v.clock if decision.final and math.isfinite(v.clock) else self._clock(),
            reason=f"{reason}; {detail}" if decision.final else reason,
            guardrail_values=guard,
            threading=dict(first.threading) if first else {},
            method=method,
            time=time,  # summed over the pairs (each pair's adds up to its own host time)
        )


def _with_method(result: ComparisonResult, method: str) -> ComparisonResult:
    return replace(result, method=method)
