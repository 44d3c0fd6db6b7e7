"""A multi-arm crossover scan on a group of hosts.

:func:`run_scan` runs a knob's scan (the baseline and K other settings) on a
:class:`musku.hosts.group.HostGroup` (simulated: :class:`musku.sim.group.SimGroup`): the
Williams rotation (:mod:`musku.design.williams`), an apply and a warm-up discard at every
switch, batches of steady windows fed to :class:`musku.design.sequential.MultiArmProcedure`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
from numpy.typing import NDArray

from musku.abtest import stats
from musku.abtest.rules import MAX_HOST_BIAS
from musku.design.sequential import MultiArmProcedure, ScanOutcome
from musku.design.williams import williams
from musku.domain import Configuration, Decision, Guardrail, StatsSettings
from musku.errors import InputError, Interrupted
from musku.hosts.group import FloatArray, HostGroup
from musku.sim.group import SimGroup


@dataclass
class ScanResult:
    """What a multi-arm scan found, and what it cost."""

    arms: list[Configuration]  # arm 0 = the baseline
    outcome: ScanOutcome
    host_time_s: float  # host-clock time from the first apply to the decision
    hosts: int
    periods: int
    batches: int
    batch_size: int
    samples: int  # steady windows per host
    estimates: dict[int, tuple[float, float, float]] = field(default_factory=dict)
    method: str = ""
    # arm -> why, for every arm a guardrail eliminated (its hosts then ran the baseline)
    guardrail: dict[int, str] = field(default_factory=dict)
    replicas: int = 1  # Williams squares run side by side, each on n hosts of the group
    # stopped after the probe (``restart_after_probe``): only the broken arms' verdicts count,
    # the arms left are to be scanned again without them
    restarted: bool = False

    @property
    def host_hours(self) -> float:
        return self.hosts * self.host_time_s / 3600.0

    @property
    def best(self) -> Configuration:
        return self.arms[self.outcome.best]


PROBE_WINDOWS = 60
"""Steady windows of the guarded probe that opens a scan (``run_scan(probe_windows=...)``): the
first part of the first period, checked before any arm runs longer on its host."""

PROBE_MAX_LOSS = 0.10
"""The primary metric's floor in the probe: a candidate whose interval of the ratio to the
baseline's host over the same windows (widened by the pair tester's host-bias bound,
:data:`musku.abtest.rules.MAX_HOST_BIAS`, on both sides) lies wholly below ``1 - PROBE_MAX_LOSS``
is stopped there."""

PeriodSink = Callable[[int, NDArray[np.int64], float, FloatArray], None]
"""``on_period(period, row, t, means)``: host ``h`` ran arm ``row[h]``; ``means[h]`` is the mean
primary metric of host ``h``'s steady windows of the period, which ended at clock ``t``;
``row[h] = -a`` when a guardrail had eliminated arm ``a``: host ``h`` ran the baseline."""


def run_scan(
    group: HostGroup,
    arms: Sequence[Configuration],
    settings: StatsSettings | None = None,
    *,
    pilot_windows: int = 240,
    min_period_windows: int = 120,
    n_opt: float | None = None,
    on_period: PeriodSink | None = None,
    should_stop: Callable[[], bool] | None = None,
    guardrails: Sequence[Guardrail] = (),
    probe_windows: int = PROBE_WINDOWS,
    max_loss: float = PROBE_MAX_LOSS,
    restart_after_probe: bool = False,
) -> ScanResult:
    """Run the ``len(arms)``-arm scan (``arms[0]`` the baseline) on ``group`` (one host per
    arm) with the Williams rotation until the procedure stops or the sample cap (per host,
    ``settings.sample_cap`` steady windows) is reached. Higher metric is better.

    Each period: every host applies its arm, ``settings.warmup_s`` is discarded, then the
    period's steady windows are averaged per host into one observation per arm, and the
    procedure looks after every period (so the first decision comes after two design cycles:
    two periods per stratum). ``should_stop`` is asked before every period (Ctrl-C, ``musku
    abort``): true raises :class:`~musku.errors.Interrupted`. Periods last at least four batches (the batch size from the first
    period, :func:`musku.abtest.stats.batch_size_for` on a cross-host contrast),
    ``min_period_windows`` and three times the switch cost.

    ``guardrails`` are checked on every candidate arm at every look, when the group reports
    the guardrail's metric per window (``group.guard``: :class:`SimGroup` does): the arm's
    steady windows so far, in batches, give a confidence sequence of its mean (as the pairwise
    test's, :meth:`musku.abtest.driver.Comparison._guardrails`); one wholly beyond the limit
    eliminates the arm at once (:meth:`MultiArmProcedure.remove`), the host running it goes
    back to the baseline there and then, and every later period runs the baseline in its
    place (``on_period`` hears ``-a`` for a host scheduled on a broken arm ``a``). The arm is in ``ScanResult.guardrail``.

    **The guarded probe** (issue 31 item 6): before any arm runs its first full period, the
    first ``min(probe_windows, pilot_windows)`` steady windows after the warm-up are checked on
    their own, every candidate against the same guardrails (same rule, same limits) and against
    the primary metric's floor: its log-ratio to the baseline's host over the same windows (the
    live load cancels), in batches (:func:`musku.abtest.stats.batch_size_for`), gives a
    confidence sequence at level ``1 - confidence``; widened by the pair tester's host-bias
    bound, wholly below ``log(1 - max_loss)`` stops the arm. A breach in the probe puts the
    arm's host back on the baseline at once (the rest of the first period then measures the
    baseline there), the arm is eliminated and never runs again in the scan (``on_period``
    hears ``-a`` from period 0). When every candidate breaks in the probe the scan ends there
    (decision ``guardrail``, the baseline kept). A scan where nothing breaks measures the same
    windows as without the probe (the first period is measured in two pieces)."""
    st = settings or StatsSettings()
    n = len(arms)
    if n < 2 or group.n % n:
        raise InputError(
            f"a {n}-arm scan needs a group of {n} hosts or a multiple of {n}, not {group.n}"
        )
    reps = group.n // n
    design = williams(n)
    cycle = design.shape[0]
    t0 = group.t
    if isinstance(group, SimGroup):
        ticks = max(1, round(st.sample_interval_s / group.tick_s))
        if ticks != 1:
            raise InputError("the simulated group measures one tick per window (sample_interval_s)")
    warm = max(0, math.ceil(st.warmup_s / group.tick_s))
    proc: MultiArmProcedure | None = None
    b = 0
    period_len = 0
    samples = 0
    p = 0
    outcome: ScanOutcome | None = None
    broken: dict[int, str] = {}  # arm -> why: a guardrail eliminated it
    guard_batches: dict[tuple[int, str], list[float]] = {}

    def run(a: int) -> int:
        """The arm a host scheduled on arm ``a`` runs: the baseline once ``a`` is broken."""
        return 0 if a in broken else a

    def by_arm(x: FloatArray, host_of: NDArray[np.intp]) -> FloatArray:
        """Windows by host -> (windows, replica, arm): log metric of the host running the arm."""
        return np.log(x).reshape(x.shape[0], reps, n)[:, :, host_of]

    while outcome is None:
        if should_stop is not None and should_stop():
            raise Interrupted(f"stopped during a multi-arm scan ({p} periods measured)")
        # every replica runs the same row of the square on its own n hosts
        row = np.tile(design[p % cycle], reps)
        cost = group.apply([arms[run(int(a))] for a in row])
        if warm:
            group.measure(warm)
        # host h of a replica runs arm row[h]: column a of `by_arm` is the host running arm a
        host_of = np.argsort(design[p % cycle])
        guard_now: dict[str, FloatArray] = {}
        if proc is None:
            probe = max(1, min(probe_windows, pilot_windows))
            raw = group.measure(probe)
            guard_now = dict(getattr(group, "guard", None) or {})
            newly = _probe(
                guard_now, guardrails, row, by_arm(raw, host_of), 1.0 - st.confidence, max_loss
            )
            for a, why in newly.items():
                broken[a] = why
            if newly:  # the hosts on a broken arm go back to the baseline at once
                group.apply([arms[run(int(a))] for a in row])
            if newly and restart_after_probe and len(broken) < n - 1:
                # the caller scans the arms left on a group of its own size
                return ScanResult(
                    arms=list(arms),
                    outcome=ScanOutcome(
                        stop=True,
                        decision=None,
                        best=0,
                        reason="stopped after the probe: the arms left are scanned without "
                        + ", ".join(f"arm {k}" for k in sorted(broken)),
                        active=tuple(k for k in range(n) if k not in broken),
                        eliminated=dict(broken),
                    ),
                    host_time_s=group.t - t0,
                    hosts=group.n,
                    periods=0,
                    batches=0,
                    batch_size=0,
                    samples=0,
                    guardrail=dict(broken),
                    replicas=reps,
                    restarted=True,
                )
            if len(broken) < n - 1 and pilot_windows > probe:
                more = group.measure(pilot_windows - probe)
                raw = np.vstack([raw, more])
                guard_more: dict[str, FloatArray] = getattr(group, "guard", None) or {}
                guard_now = {
                    k: np.vstack([v, guard_more[k]])
                    for k, v in guard_now.items()
                    if k in guard_more
                }
            steady = by_arm(raw, host_of)
            # the batch size from a contrast of two arms still running (any, when none is)
            live = [a for a in range(1, n) if a not in broken] or [1]
            b, _ = stats.batch_size_for(
                steady[:, 0, live[0]] - steady[:, 0, 0], maximum=max(1, steady.shape[0] // 4)
            )
            period_len = max(4 * b, min_period_windows, math.ceil(3 * (cost + warm)))
            period_len = b * math.ceil(period_len / b)
            cap_periods = max(1, math.ceil(st.sample_cap / period_len))
            proc = MultiArmProcedure(
                n,
                cycle,
                alpha=1.0 - st.confidence,
                min_effect=st.min_effect,
                n_opt=n_opt,
                cap_batches=cap_periods * reps,
                block=reps,
            )
        else:
            raw = group.measure(period_len)
            steady = by_arm(raw, host_of)
            guard_now = getattr(group, "guard", None) or {}
        # one observation per period and replica: the mean of its steady windows. The
        # period-to-period variation (slow per-host drift) is then in the residuals once every
        # stratum has two observations (two cycles; one with two replicas or more); with
        # batches inside one period it would hide in the stratum means.
        use = b * (steady.shape[0] // b)
        for r in range(reps):
            proc.add(steady[:use, r, :].mean(axis=0), p % cycle)
        # the arm each host ran: -a on a host scheduled on arm a that a guardrail eliminated
        # (it ran the baseline)
        ran = np.asarray([-int(a) if int(a) in broken else int(a) for a in row], dtype=np.int64)
        newly = _check_guardrails(
            guard_now, guardrails, row, ran, use, b, 1.0 - st.confidence, guard_batches
        )
        if on_period is not None:  # per host, on the metric's scale
            on_period(p, ran, group.t, np.asarray(raw[:use].mean(axis=0), dtype=float))
        samples += use
        for a, why in newly.items():
            broken[a] = why
            proc.remove(a, why)
        if newly:  # the hosts on a broken arm go back to the baseline at once
            group.apply([arms[run(int(a))] for a in row])
        for a, why in broken.items():
            proc.remove(a, why)  # (again for the probe's: the procedure exists from here)
        out = proc.look()
        if len(broken) == n - 1:  # every candidate broke a guardrail: nothing left to scan
            out = proc._outcome(True, Decision.GUARDRAIL, 0, "every candidate broke a guardrail")
        if out.stop:
            outcome = out
        p += 1
    assert proc is not None
    est: dict[int, tuple[float, float, float]] = {}
    for k in range(1, n):
        c = proc.contrast(0, k, alpha=proc.level(0, k))  # the level its decision was made at
        if c is not None:
            est[k] = c.relative()
    return ScanResult(
        arms=list(arms),
        outcome=outcome,
        host_time_s=group.t - t0,
        hosts=group.n,
        periods=p,
        batches=proc.batches,
        batch_size=b,
        samples=samples,
        estimates=est,
        method=proc.method() + (f", {reps} replicated squares" if reps > 1 else ""),
        guardrail=broken,
        replicas=reps,
    )


def _probe(
    guard: dict[str, FloatArray],
    guardrails: Sequence[Guardrail],
    row: NDArray[np.int64],
    steady: FloatArray,
    alpha: float,
    max_loss: float,
) -> dict[int, str]:
    """The guarded probe: the candidates (arm -> why) that break a guardrail or the primary
    metric's floor over the probe's windows (``steady``: log primary metric, shape (windows,
    replica, arm); ``guard``: the guardrail metrics by host)."""
    m = steady.shape[0]
    out: dict[int, str] = {}
    if m < 8:
        return out
    b, _ = stats.batch_size_for(steady[:, 0, 1] - steady[:, 0, 0], maximum=m // 4)
    if guardrails:
        ran = np.asarray(row, dtype=np.int64)
        for a, why in _check_guardrails(guard, guardrails, row, ran, m, b, alpha, {}).items():
            out[a] = f"{why} (in the probe)"
    widen = math.log1p(MAX_HOST_BIAS)
    floor = math.log1p(-max_loss) if 0.0 < max_loss < 1.0 else -math.inf
    for a in range(1, steady.shape[2]):
        if a in out:
            continue
        parts, count = [], 0
        for r in range(steady.shape[1]):  # each replica against its own baseline host
            d = steady[:, r, a] - steady[:, r, 0]
            d = d[np.isfinite(d)]
            count += d.size
            parts.append(d[: b * (d.size // b)].reshape(-1, b).mean(axis=1))
        means = np.concatenate(parts)
        if means.size < 4:
            continue
        mean = float(means.mean())
        se = float(means.std(ddof=1)) / math.sqrt(means.size)
        hw = stats.cs_halfwidth(se, float(means.size), alpha, 32.0, df=means.size - 1)
        if mean + hw + widen < floor:
            lo, hi = math.expm1(mean - hw - widen), math.expm1(mean + hw + widen)
            out[a] = (
                f"guardrail primary metric >= -{max_loss:.0%} of the baseline broken in the probe: "
                f"candidate {math.expm1(mean):+.1%} against the baseline's host over the same "
                f"windows, its interval [{lo:+.1%}, {hi:+.1%}] (host-bias bound "
                f"±{MAX_HOST_BIAS:.0%} included) lies below -{max_loss:.0%} after {count:,} samples"
            )
    return out


def _check_guardrails(
    guard: dict[str, FloatArray],
    guardrails: Sequence[Guardrail],
    row: NDArray[np.int64],
    ran: NDArray[np.int64],
    use: int,
    b: int,
    alpha: float,
    batches: dict[tuple[int, str], list[float]],
) -> dict[int, str]:
    """Add this period's guardrail windows (the last ``use`` of ``group.guard``) per arm, in
    batches of ``b``, and return the candidate arms (still running) whose guardrail's
    confidence sequence now lies wholly beyond its limit: arm -> why. ``guard``: the
    guardrail metrics of the windows measured, by host."""
    out: dict[int, str] = {}
    for h, a in enumerate(int(x) for x in row):
        if a == 0 or int(ran[h]) != a:
            continue  # the baseline, or an arm already broken (its host runs the baseline)
        for g in guardrails:
            values = guard.get(g.metric)
            if values is None or values.shape[0] < use or use < b:
                continue
            w = values[values.shape[0] - use :, h]
            vals = batches.setdefault((a, g.metric), [])
            for chunk in w[: b * (w.size // b)].reshape(-1, b):
                seen = chunk[np.isfinite(chunk)]  # an agent window may lack the metric
                if seen.size:
                    vals.append(float(seen.mean()))
            if len(vals) < 4 or a in out:
                continue
            arr = np.asarray(vals, dtype=float)
            mean = float(arr.mean())
            se = float(arr.std(ddof=1)) / math.sqrt(arr.size)
            hw = stats.cs_halfwidth(se, float(arr.size), alpha, 32.0, df=arr.size - 1)
            lo, hi = mean - hw, mean + hw
            if lo > g.limit if g.op == "<=" else hi < g.limit:
                out[a] = (
                    f"guardrail {g} broken: candidate's {g.metric} = {mean:.4g}, its interval "
                    f"[{lo:.4g}, {hi:.4g}] lies beyond the limit after {arr.size * b:,} samples"
                )
    return out


def scan_verdict(result: ScanResult) -> Decision | None:
    return result.outcome.decision
