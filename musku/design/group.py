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

    @property
    def host_hours(self) -> float:
        return self.hosts * self.host_time_s / 3600.0

    @property
    def best(self) -> Configuration:
        return self.arms[self.outcome.best]


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
    place (``on_period`` hears ``-a`` for a host scheduled on a broken arm ``a``). The arm is in ``ScanResult.guardrail``."""
    st = settings or StatsSettings()
    n = len(arms)
    if n != group.n:
        raise InputError(f"a {n}-arm scan needs a group of {n} hosts, not {group.n}")
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

    while outcome is None:
        if should_stop is not None and should_stop():
            raise Interrupted(f"stopped during a multi-arm scan ({p} periods measured)")
        row = design[p % cycle]
        cost = group.apply([arms[run(int(a))] for a in row])
        if warm:
            group.measure(warm)
        # host h runs arm row[h]: column a of `by_arm` is the host running arm a
        host_of = np.argsort(row)
        if proc is None:
            steady = np.log(group.measure(pilot_windows))[:, host_of]
            b, _ = stats.batch_size_for(steady[:, 1] - steady[:, 0], maximum=pilot_windows // 4)
            period_len = max(4 * b, min_period_windows, math.ceil(3 * (cost + warm)))
            period_len = b * math.ceil(period_len / b)
            cap_periods = max(1, math.ceil(st.sample_cap / period_len))
            proc = MultiArmProcedure(
                n,
                cycle,
                alpha=1.0 - st.confidence,
                min_effect=st.min_effect,
                n_opt=n_opt,
                cap_batches=cap_periods,
            )
        else:
            steady = np.log(group.measure(period_len))[:, host_of]
        # one observation per period: the mean of its steady windows. The period-to-period
        # variation (slow per-host drift) is then in the residuals once every stratum has two
        # periods; with batches inside one period it would hide in the stratum means.
        use = b * (steady.shape[0] // b)
        proc.add(steady[:use].mean(axis=0), p % cycle)
        # the arm each host ran: -a on a host scheduled on arm a that a guardrail eliminated
        # (it ran the baseline)
        ran = np.asarray([-int(a) if int(a) in broken else int(a) for a in row], dtype=np.int64)
        newly = _check_guardrails(
            group, guardrails, row, ran, use, b, 1.0 - st.confidence, guard_batches
        )
        if on_period is not None:  # per host (undo the by-arm order), on the metric's scale
            on_period(p, ran, group.t, np.exp(steady[:use].mean(axis=0))[row])
        samples += use
        for a, why in newly.items():
            broken[a] = why
            proc.remove(a, why)
        if newly:  # the hosts on a broken arm go back to the baseline at once
            group.apply([arms[run(int(a))] for a in row])
        out = proc.look()
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
        method=proc.method(),
        guardrail=broken,
    )


def _check_guardrails(
    group: HostGroup,
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
    confidence sequence now lies wholly beyond its limit: arm -> why."""
    guard: dict[str, FloatArray] = getattr(group, "guard", None) or {}
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
