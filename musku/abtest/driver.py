"""The sequential paired A/B driver: applies, warms up, swaps, batches and asks the rule.

Design of one comparison (rule ``cs``)::

    period 0 (L/2)    period 1 (L)      period 2 (L)      period 3 (L)   ...
    host0: A  host1: B | host0: B host1: A | host0: A host1: B | host0: B ...
    [apply][min warm-up][probe: MSER-5 + tests][batch][batch]...[apply]...

- **Paired windows.** Both hosts are measured over the same windows; the statistic is the
  per-window log-ratio ``d = dir * (log m_B - log m_A)``, so the live load common to both
  hosts cancels, and ``dir = -1`` for lower-is-better metrics makes ``d > 0`` mean "B better".
- **Crossover.** Host roles alternate by period; a fixed host bias ``delta`` enters as
  ``+delta`` in one role order and ``-delta`` in the other and drops out of the crossover
  estimator. The first period is half as long as the others: the sequence of role orders is
  then A-B-B-A A-B-B-A in half-periods, which also cancels a linear drift of the bias (e.g. a
  host-specific sensitivity to the slowly varying live load) at every block boundary.
- **Period length.** A swap costs one re-apply (the apply's host seconds: reboots for
  ``spec.reboot_knobs``) plus the warm-up. Periods are three times that cost (<= 25 %
  overhead), at least four batches, at most a sixth of the sample cap; so swaps that need a
  reboot get longer periods. The swap cost is re-measured after the first swap.
- **Warm-up, per configuration.** After every apply at least ``spec.stats.warmup_s`` is
  discarded (or what was measured before for the configurations applied); everything since
  the apply is then searched for the end of the transient: MSER-5 and a fitted exponential
  (:func:`musku.abtest.stats.detect_warmup`, :func:`musku.abtest.stats.fit_transient`) on
  each host's own series per offered request and on the CUPED-adjusted log-ratio; the probe
  grows while the transient lasts, up to :data:`TRANSIENT_CAP_S` (then INCONCLUSIVE). Each
  configuration's transient is remembered; a later, longer measurement drops an earlier
  period's windows inside it after the fact. Windows with ``Sample.valid`` false (knob
  drift) are recorded but never used.
- **Batches.** The batch size comes from the AR(1) coefficient of the log-ratios (an upper
  bound, so neighbouring batch means correlate <= 0.05): from the pilot, then re-estimated from
  all steady windows at every period start (batches only grow; past ones are rebuilt). The
  rule looks after every batch.
- **Between periods.** Each period's time span (its batched windows' first start and last
  end) goes to the rule with the batch means: the crossover removes a constant host bias
  only, and the rule sizes the bias's change between periods from them
  (:func:`musku.abtest.stats.period_component`).
- **Early decision.** Before the first swap the rule may decide a large effect on its own
  (interval widened by the host-bias bound, see :mod:`musku.abtest.rules`); while that
  looks reachable, the first period is extended instead of swapping. The bound comes from
  ``rule_options["max_host_bias"]``, else the pair's ``describe()["max_host_bias"]``.
- **A/A.** A swap that changes no host (baseline == candidate) applies nothing and discards
  no warm-up.
- **Guardrails.** Judged on the B-role windows: the candidate is pruned as soon as the
  confidence sequence of a guardrail metric's mean lies wholly beyond its limit; at a final
  stop a point estimate beyond the limit also prunes (production safety first).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Generator, Mapping
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
from numpy.typing import NDArray

from musku.abtest import periods as periods_mod
from musku.abtest import stats
from musku.abtest import structure as structure_mod
from musku.abtest import transient as transient_mod
from musku.abtest.calibration import PairMemory
from musku.abtest.rules import (
    PERIOD_SHARE_OF_WANDER,
    WANDER_SD,
    WANDER_TAU_S,
    DecisionRule,
    Evidence,
    RuleSetup,
    Verdict,
    make_rule,
    pct,
)
from musku.domain import (
    ComparisonResult,
    ComparisonSpec,
    Configuration,
    Decision,
    Direction,
    Guardrail,
    Sample,
    TimeBreakdown,
)
from musku.errors import HostError, InputError, UnsupportedError
from musku.hosts.base import HostPair

FloatArray = NDArray[np.float64]
WindowRow = dict[str, Any]

TRANSIENT_CAP_S = 3600.0  # a transient still going after this long: INCONCLUSIVE
SEARCH_CAP_S = 1200.0  # fit mode: the search for a transient's end stops here (no INCONCLUSIVE)
SEARCH_APPLIES = 2  # fit mode: the first applies searched (and discarded) to the end as before
MIN_SWAPS_SEEN = 2  # fit mode: no decision before this many swaps' periods are complete
TRANSIENT_EPS = 0.1  # a transient has ended where it is below this x min_effect
TRANSIENT_T = 2.0  # a fitted transient counts beyond this many standard errors
SWAP_OVERHEAD = 3.0  # period length / swap cost (k: periods >= k x the measured transient)
BATCH_CORRELATION = 0.05  # target correlation of neighbouring batch means
MEASURE_PIECE_S = 60.0  # host seconds measured per pair.windows() call, at most
MAX_INVALID_FRACTION = 0.5  # of a period's windows, beyond which the hosts are not measurable


@dataclass(frozen=True)
class Progress:
    """Live state of a comparison, given to ``on_progress`` after every look."""

    samples: int  # steady windows used per host
    estimate: float  # relative effect of B over A, good direction positive
    ci_low: float
    ci_high: float
    host_time_s: float  # host seconds since the comparison started
    period: int
    batches: int
    batch_size: int
    decision: Decision | None = None  # set on the last call
    # no finite interval yet: about how many more steady windows until the rule's first
    # possible decision (musku.abtest.structure); None once there is an interval
    windows_needed: int | None = None


class _Stop(Exception):
    """Internal: should_stop() said stop."""


class _Transient(Exception):
    """Internal: a warm-up transient did not end within the cap."""


def validate_spec(spec: ComparisonSpec) -> None:
    """Reject specs the tester cannot honour, with one-line :class:`InputError` messages."""
    st = spec.stats
    if not isinstance(spec.metric, str) or not spec.metric:
        raise InputError("comparison metric must be a non-empty metric name")
    if not isinstance(spec.direction, Direction):
        raise InputError(
            f"comparison direction must be 'higher' or 'lower', not {spec.direction!r}"
        )
    checks: list[tuple[str, object, bool, str]] = [
        (
            "confidence",
            st.confidence,
            _num(st.confidence) and 0.5 < st.confidence < 1.0,
            "between 0.5 and 1 (exclusive)",
        ),
        (
            "min_effect",
            st.min_effect,
            _num(st.min_effect) and 0.0 < st.min_effect < 0.5,
            "a relative effect in (0, 0.5)",
        ),
        ("warmup_s", st.warmup_s, _num(st.warmup_s) and st.warmup_s >= 0.0, ">= 0 seconds"),
        (
            "sample_interval_s",
            st.sample_interval_s,
            _num(st.sample_interval_s) and st.sample_interval_s > 0.0,
            "> 0 seconds",
        ),
        (
            "sample_cap",
            st.sample_cap,
            isinstance(st.sample_cap, int)
            and not isinstance(st.sample_cap, bool)
            and st.sample_cap >= 10,
            "an integer >= 10",
        ),
    ]
    for key, value, ok, why in checks:
        if not ok:
            raise InputError(f"statistics {key} = {value!r} is invalid: must be {why}")
    periods_mod.check_mode(st.period)
    fit = structure_mod.feasibility(st)
    if not fit.ok:
        raise InputError(fit.reason)
    for g in spec.guardrails:
        if not isinstance(g, Guardrail) or g.op not in ("<=", ">=") or not _num(g.limit):
            raise InputError(
                f"guardrail {g!s} is invalid: give metric, '<=' or '>=', and a finite limit"
            )
        if not g.metric:
            raise InputError("guardrail metric must be a non-empty metric name")


def _num(x: object) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(float(x))


class _Buffer:
    """Growable float column."""

    def __init__(self, capacity: int = 1024) -> None:
        self.data = np.empty(capacity)
        self.n = 0

    def extend(self, values: FloatArray) -> None:
        need = self.n + values.size
        if need > self.data.size:
            grown = np.empty(max(need, 2 * self.data.size))
            grown[: self.n] = self.data[: self.n]
            self.data = grown
        self.data[self.n : need] = values
        self.n = need

    def view(self) -> FloatArray:
        return self.data[: self.n]


@dataclass
class _Chunk:
    """Windows as columns (all measured windows of a chunk, valid or not)."""

    m0: FloatArray  # primary metric, host 0
    m1: FloatArray
    valid: NDArray[np.bool_]
    guard0: dict[str, FloatArray]  # guardrail metric -> host 0 values
    guard1: dict[str, FloatArray]
    samples: list[tuple[Sample, Sample]]
    c0: FloatArray | None = None  # covariate (offered load), host 0; None: not reported
    c1: FloatArray | None = None
    seq: NDArray[np.int64] | None = None  # each window's ``seq`` once emitted

    def select(self, mask: NDArray[np.bool_]) -> _Chunk:
        idx = np.flatnonzero(mask)
        return _Chunk(
            self.m0[idx],
            self.m1[idx],
            self.valid[idx],
            {k: v[idx] for k, v in self.guard0.items()},
            {k: v[idx] for k, v in self.guard1.items()},
            [self.samples[i] for i in idx],
            None if self.c0 is None else self.c0[idx],
            None if self.c1 is None else self.c1[idx],
            None if self.seq is None else self.seq[idx],
        )


class _Comparison:
    def __init__(
        self,
        pair: HostPair,
        baseline: Configuration,
        candidate: Configuration,
        spec: ComparisonSpec,
        rule: DecisionRule,
        on_window: Callable[[list[WindowRow]], None] | None,
        on_progress: Callable[[Progress], None] | None,
        should_stop: Callable[[], bool] | None,
        memory: PairMemory | None = None,
        on_warmup: Callable[[list[int]], None] | None = None,
    ) -> None:
        self.pair = pair
        self.on_warmup = on_warmup
        self.memory = memory if memory is not None else PairMemory()
        self.cov_metric: str | None = getattr(rule, "covariate", None) if rule.crossover else None
        self.c = _Buffer()  # covariate log-ratio B vs A per steady window
        self.cov_seen = False
        self.d_used = _Buffer()  # the (adjusted) log-ratios batched, per closed window
        self.theta = 0.0
        # running sums per period of (n, d, c, d c, c c) over the first ``cuped_n`` windows
        self.cuped_sums: dict[int, NDArray[np.float64]] = {}
        self.cuped_n = 0
        self.transients: dict[str, float] = {}  # config key -> transient measured here (s)
        self.bias_note = ""
        self.notes: list[str] = []
        self.baseline = baseline
        self.candidate = candidate
        self.spec = spec
        self.rule = rule
        self.on_window = on_window
        self.on_progress = on_progress
        self.should_stop = should_stop
        st = spec.stats
        self.alpha = 1.0 - st.confidence
        self.interval = float(st.sample_interval_s)
        self.cap = int(rule.sample_cap if rule.sample_cap is not None else st.sample_cap)
        self.dir = 1.0 if spec.direction is Direction.HIGHER else -1.0
        # probe, batch, period and first-decision lengths from the window, the cap and the
        # rule's minimum batches (musku.abtest.structure)
        self.structure = structure_mod.derive(
            st,
            cap=self.cap,
            min_batches=int(getattr(rule, "min_batches", structure_mod.MIN_BATCHES)),
            min_per_order=int(getattr(rule, "min_per_order", structure_mod.MIN_PER_ORDER)),
        )
        self.warm_n = self.structure.warm_n
        self.settles_itself = _design(pair) == "switchback"
        # issue 30 item 2: the warm-up transient fitted jointly over all applies and
        # subtracted (rule option transient = "fit"), instead of each apply's discarded
        self.fit_mode = (
            rule.crossover
            and rule.detect_warmup
            and not self.settles_itself
            and getattr(rule, "transient", "discard") == "fit"
            # an A/A applies once (its swaps change nothing): no applies to fit jointly,
            # and one apply's transient cannot be told from a drift; searched as before
            and bool(baseline.diff(candidate))
        )
        # per period: (the candidate's host changed, the baseline's host changed) at its
        # apply (a period that applied nothing: the last apply's)
        self.period_changed: list[tuple[bool, bool]] = []
        self.batch_age: list[tuple[float, float, int]] = []  # first, last window's age, count
        self.tfit: transient_mod.TransientFit | None = None
        self.tfit_at = (-1, -1)  # (batches, period) at the last fit
        self.capped: set[int] = set()  # fit mode: periods whose search hit SEARCH_CAP_S
        self.fit_excluded = 0  # windows of batches left out where the fitted transient is large
        # windows per pair.windows() call: about a minute of host time, so should_stop is
        # polled at least once a minute on real hosts
        self.piece = max(1, int(MEASURE_PIECE_S / self.interval))
        self.guard_metrics = tuple(dict.fromkeys(g.metric for g in spec.guardrails))
        self.t0 = pair.now()
        self.seq = 0
        self.period = 0
        self.sign = 1
        # steady data
        self.log_a = _Buffer()
        self.log_b = _Buffer()
        self.d = _Buffer()
        self.win_period = _Buffer()  # period of each steady window
        self.win_age = _Buffer()  # seconds from its period's apply to each steady window's end
        self.win_seq = _Buffer()  # ``seq`` of each steady window (as given to on_window)
        self.win_t = _Buffer()  # host seconds since the start at each steady window's end
        self.apply_t = 0.0  # pair.now() after the current period's apply
        self.period_applied: list[bool] = []  # whether each period applied anything
        self.kept: NDArray[np.bool_] = np.ones(0, dtype=bool)  # steady windows still used
        self.dropped = 0  # steady windows dropped later as transient (retro-trimmed)
        self.guard_b = {m: _Buffer() for m in self.guard_metrics}
        self.batch_d: list[float] = []
        self.batch_sign: list[int] = []
        self.batch_period: list[int] = []
        self.period_t: dict[int, tuple[float, float]] = {}  # its batches' first start, last end
        self.batch_guard: dict[str, list[float]] = {m: [] for m in self.guard_metrics}
        self.batch_start = 0  # steady index where the open batch starts
        self.b: int | None = None
        self.period_len: int | None = None
        self.noise_lrv = math.nan  # the pilot's per-window long-run variance of the log-ratio
        self.period_choice: periods_mod.PeriodChoice | None = None  # period = "auto"'s
        self.apply_s: list[float] = []
        self.warm_s: list[float] = []
        # time accounting (TimeBreakdown): host-clock seconds of each apply, whether it
        # rebooted a host, and when an unfinished warm-up started
        self.apply_clock: list[float] = []
        self.apply_reboot: list[bool] = []
        self.warm_open: float | None = None
        self.swap_measured = False
        self.period_sign: list[int] = []
        self.verdict = Verdict.undecided()
        self.guard_values: dict[str, float] = {}

    # ------------------------------------------------------------------ plumbing

    def _check_stop(self) -> None:
        if self.should_stop is not None and self.should_stop():
            raise _Stop

    def _measure(self, n: int) -> _Chunk:
        """``n`` paired windows (in pieces, checking should_stop between them)."""
        parts: list[list[tuple[Sample, Sample]]] = []
        left = n
        while left > 0:
            try:
                self._check_stop()
            except _Stop:
                if parts:  # keep what was measured: recorded, not used
                    self._emit(self._columns([w for p in parts for w in p]), True)
                raise
            k = min(left, self.piece)
            got = self.pair.windows(self.interval, k)
            if len(got) != k:
                raise HostError(f"host pair returned {len(got)} windows instead of {k}")
            parts.append(got)
            left -= k
        samples = [w for p in parts for w in p]
        return self._columns(samples)

    def _columns(self, samples: list[tuple[Sample, Sample]]) -> _Chunk:
        n = len(samples)
        metric = self.spec.metric
        m0 = np.empty(n)
        m1 = np.empty(n)
        ok = np.empty(n, dtype=bool)
        g0 = {m: np.empty(n) for m in self.guard_metrics}
        g1 = {m: np.empty(n) for m in self.guard_metrics}
        cm = self.cov_metric
        c0 = c1 = None
        if cm is not None and n and cm in samples[0][0].metrics and cm in samples[0][1].metrics:
            c0 = np.array([s0.metrics.get(cm, math.nan) for s0, _ in samples], dtype=float)
            c1 = np.array([s1.metrics.get(cm, math.nan) for _, s1 in samples], dtype=float)
        for i, (s0, s1) in enumerate(samples):
            try:
                m0[i] = s0.metrics[metric]
                m1[i] = s1.metrics[metric]
                for m in self.guard_metrics:
                    g0[m][i] = s0.metrics[m]
                    g1[m][i] = s1.metrics[m]
            except KeyError as exc:
                have = ", ".join(sorted(s0.metrics)) or "none"
                raise InputError(
                    f"the hosts do not report metric {exc.args[0]!r} (they report: {have})"
                ) from None
            ok[i] = s0.valid and s1.valid
        with np.errstate(invalid="ignore"):
            ok &= np.isfinite(m0) & np.isfinite(m1) & (m0 > 0) & (m1 > 0)
            for m in self.guard_metrics:
                ok &= np.isfinite(g0[m]) & np.isfinite(g1[m])
            if c0 is not None and c1 is not None:
                good = np.isfinite(c0) & np.isfinite(c1) & (c0 > 0) & (c1 > 0)
                c0 = np.where(good, c0, 1.0)
                c1 = np.where(good, c1, 1.0)
        return _Chunk(m0, m1, ok, g0, g1, samples, c0, c1)

    def _emit(self, chunk: _Chunk, warmup: NDArray[np.bool_] | bool) -> None:
        chunk.seq = np.arange(self.seq, self.seq + len(chunk.samples), dtype=np.int64)
        if self.on_window is None:
            self.seq += len(chunk.samples)
            return
        warm = np.broadcast_to(np.asarray(warmup, dtype=bool), (len(chunk.samples),))
        roles = ("A", "B") if self.sign > 0 else ("B", "A")
        rows: list[WindowRow] = []
        for i, pair_samples in enumerate(chunk.samples):
            for host in (0, 1):
                s = pair_samples[host]
                rows.append(
                    {
                        "seq": self.seq,
                        "t": s.t,
                        "host": host,
                        "role": roles[host],
                        "period": self.period,
                        "warmup": bool(warm[i]),
                        "valid": bool(s.valid),
                        "metrics": dict(s.metrics),
                    }
                )
            self.seq += 1
        self.on_window(rows)

    def _log_ratio(self, chunk: _Chunk) -> FloatArray:
        """Sign-adjusted log-ratio B vs A of the valid windows of ``chunk``."""
        v = chunk.valid
        lr = np.log(chunk.m1[v]) - np.log(chunk.m0[v])  # host1 vs host0
        return self.dir * self.sign * lr

    # ------------------------------------------------------------------ phases

    def _apply(self) -> None:
        configs = (
            (self.baseline, self.candidate) if self.sign > 0 else (self.candidate, self.baseline)
        )
        self._check_stop()
        reboot = self._reboots(configs)
        changed = self._changes(configs)
        cand_host = 1 if self.sign > 0 else 0
        self.period_changed.append((changed[cand_host], changed[1 - cand_host]))
        t = self.pair.now()
        secs = float(self.pair.apply(configs))
        self.apply_s.append(secs)
        self.apply_clock.append(max(0.0, self.pair.now() - t))
        self.apply_reboot.append(reboot)

    def _changes(self, configs: tuple[Configuration, Configuration]) -> tuple[bool, bool]:
        """Whether applying ``configs`` changes each host (a host already there does not
        warm up). A swap changes both (when the arms differ); the first apply asks the
        hosts what they run, and assumes a change when they cannot say (a
        :class:`HostError` or :class:`UnsupportedError`, what the Host API raises; anything
        else is a bug and goes up)."""
        if self.period > 0:
            differ = bool(self.baseline.diff(self.candidate))
            return differ, differ
        out = [True, True]
        try:
            for h, (host, cfg) in enumerate(zip(self.pair.hosts, configs, strict=True)):
                now = host.configuration()
                out[h] = bool(now.diff(now.merged(cfg)))
        except (HostError, UnsupportedError):  # informational: assume a change
            return True, True
        return out[0], out[1]

    def _reboots(self, configs: tuple[Configuration, Configuration]) -> bool:
        """Whether applying ``configs`` changes a reboot knob on either host (from what the
        host has now): such an apply's time counts as reboot time."""
        if not self.spec.reboot_knobs:
            return False
        for host, cfg in zip(self.pair.hosts, configs, strict=True):
            now = host.configuration()
            if now.diff(now.merged(cfg)).keys() & self.spec.reboot_knobs:
                return True
        return False

    def time_breakdown(self) -> TimeBreakdown:
        """Where the comparison's host time went so far (see :class:`TimeBreakdown`): the
        applies (reboots apart), the warm-up discarded (blind minimum, probe windows before
        the transient's end, windows dropped after the fact), the rest measuring."""
        total = self.pair.now() - self.t0
        reboot = sum(
            (s for s, r in zip(self.apply_clock, self.apply_reboot, strict=True) if r), 0.0
        )
        switching = sum(self.apply_clock, 0.0) - reboot
        warm = sum(self.warm_s, 0.0) + self.dropped * self.interval
        if self.warm_open is not None:  # stopped inside a warm-up
            warm += self.pair.now() - self.warm_open
        measuring = max(0.0, total - reboot - switching - warm)
        return TimeBreakdown(measuring, warm, switching, reboot)

    def _roles(self) -> tuple[Configuration, Configuration]:
        """The configurations of host 0 and host 1 in the current period."""
        if self.sign > 0:
            return self.baseline, self.candidate
        return self.candidate, self.baseline

    def _known_transient(self, cfg: Configuration) -> float:
        """Longest transient (s) remembered for ``cfg``: this comparison's or the pair's
        (none in fit mode: there the transient is a regressor, not a discard, and no window
        is dropped after the fact; its searched applies use :meth:`_remembered_transient`)."""
        if self.fit_mode:
            return 0.0
        return self._remembered_transient(cfg)

    def _remembered_transient(self, cfg: Configuration) -> float:
        """Longest transient (s) measured for ``cfg`` by this comparison or remembered by
        the pair."""
        key = cfg.key()
        try:
            remembered = float(self.memory.transients.get(key, 0.0))
        except (TypeError, ValueError):
            remembered = 0.0
        return max(self.transients.get(key, 0.0), remembered)

    def _host_series(self, probe: _Chunk) -> list[FloatArray]:
        """Each host's own log series per offered request over the valid windows of
        ``probe`` when the hosts report the covariate (the live load divides out); none
        without it (a host's raw series follows the live load: its swings and bursts would
        pass for transients)."""
        v = probe.valid
        if probe.c0 is None or probe.c1 is None:
            return []
        return [
            np.log(probe.m0[v]) - np.log(probe.c0[v]),
            np.log(probe.m1[v]) - np.log(probe.c1[v]),
        ]

    def _adjusted_ratio(self, chunk: _Chunk) -> FloatArray:
        """The log-ratio of ``chunk``'s valid windows, CUPED-adjusted when the hosts report
        the covariate (the load's swings and bursts, which a host-specific slope on the load
        would turn into trends in the raw ratio, divided out), with the coefficient fitted
        on the chunk itself (a transient is unrelated to the offered load)."""
        d = self._log_ratio(chunk)
        if self.cov_metric is None or chunk.c0 is None or chunk.c1 is None or d.size < 20:
            return d
        v = chunk.valid
        c = self.sign * (np.log(chunk.c1[v]) - np.log(chunk.c0[v]))
        cc = c - c.mean()
        sxx = float(cc @ cc)
        if sxx <= 1e-12 * d.size:
            return d
        return d - (float(cc @ (d - d.mean())) / sxx) * c

    def _warmup(self) -> _Chunk:
        """Minimum warm-up (the spec's, or longer: what was measured before for the
        configurations now applied), then the data-driven end of the transient. The
        transient starts at the apply, so it is searched on everything measured since then
        (the blind minimum included, where it is strongest): MSER-5 with its tests on the
        log-ratio, and an exponential fitted to each host's own series per offered request
        (a transient both hosts share cancels in the ratio but not there; one host's slow
        tail is easier to see there, without the other host's noise). The probe doubles
        while the transient lasts, up to :data:`TRANSIENT_CAP_S`. Returns the valid steady
        windows measured while looking for it."""
        t_start = self.pair.now()
        self.warm_open = t_start
        cfgs = self._roles()
        known = max(self._known_transient(c) for c in cfgs)
        if self.fit_mode and self.period < SEARCH_APPLIES:
            # the searched applies are searched as the discard mode does: after the
            # transient measured for these configurations (this comparison's first apply,
            # or the pair's earlier comparisons), to the same level (TRANSIENT_EPS)
            known = max(self._remembered_transient(c) for c in cfgs)
        min_n = max(self.warm_n, int(math.ceil(known / self.interval - 1e-9)))
        head = self._measure(min_n) if min_n else self._columns([])
        self._emit(head, True)
        if not self.rule.detect_warmup:
            self.warm_s.append(self.pair.now() - t_start)
            self.warm_open = None
            return self._columns([])
        if self.fit_mode and self.period >= SEARCH_APPLIES:
            # the transient is fitted over the applies so far and subtracted
            # (_transient_fit): after the blind minimum everything is measured
            self.warm_s.append(self.pair.now() - t_start)
            self.warm_open = None
            return self._columns([])
        if self.settles_itself:
            # a switchback pair applies each arm inside its windows and discards each
            # sub-window's own transient (settle_s): nothing after apply() is a transient.
            # The first period's pilot is the structure's probe, all of it steady
            self.warm_s.append(self.pair.now() - t_start)
            self.warm_open = None
            if self.b is not None:
                return self._columns([])
            pilot = self._measure(self.structure.probe_n)
            self._emit(pilot, False)
            return pilot.select(pilot.valid)
        probe_min = self.structure.probe_n
        probe_n = max(probe_min, self.warm_n, 2 * (self.b or 0), min_n)
        chunks: list[_Chunk] = []
        discard = 0
        own = [0, 0]
        n_head = len(head.samples)
        while True:
            try:
                chunks.append(self._measure(probe_n))
            except _Stop:
                if chunks:
                    self._emit(_concat(chunks), True)
                raise
            probe = _concat(chunks)
            full = _concat([head, probe]) if n_head else probe
            hosts = self._host_series(full)
            # the ratio is fitted too once the covariate has divided the load out of it
            found = [self._transient_end(self._adjusted_ratio(full), fit=bool(hosts))]
            found += [self._transient_end(x, fit=True) for x in hosts]
            ends = [f[0] for f in found]
            own = ends[1:] or [ends[0], ends[0]]
            discard = max(ends)  # valid windows since the apply
            # go on while a transient may outlast the probe (a fit at its longest time
            # constant, MSER at its search limit, a trend left), or its end is not yet in
            # it with some steady data after it
            longer = any(f[1] for f in found) or discard > len(full.samples) - probe_min // 2
            if not longer:
                break
            if self.fit_mode and self.pair.now() - t_start >= SEARCH_CAP_S:
                # no end in sight: drift or a transient too long to see the end of on one
                # apply; the last probe's windows are kept (the pilot), the joint fit over
                # the swaps' applies decides which it was (it is bounded): no INCONCLUSIVE
                discard = max(0, int(np.count_nonzero(full.valid)) - probe_min)
                self.capped.add(self.period)
                break
            if self.pair.now() - t_start >= TRANSIENT_CAP_S:
                self._emit(probe, True)
                self.warm_s.append(self.pair.now() - t_start)
                self.warm_open = None
                raise _Transient(
                    f"the warm-up transient after applying {cfgs[0].key()} / {cfgs[1].key()} "
                    f"did not end within {TRANSIENT_CAP_S:.0f} s: no decision"
                )
            # double what was measured since the apply, within the cap
            left = int((TRANSIENT_CAP_S - (self.pair.now() - t_start)) / self.interval)
            probe_n = max(1, min(len(full.samples), left))
        probe = _concat(chunks)
        full = _concat([head, probe]) if n_head else probe
        # map the discard count (valid windows since the apply) to the probe's windows
        valid_idx = np.flatnonzero(full.valid)
        cut_full = int(valid_idx[discard]) if discard < valid_idx.size else len(full.samples)
        cut = max(0, cut_full - n_head)
        warm = np.zeros(len(probe.samples), dtype=bool)
        warm[:cut] = True
        self._emit(probe, warm)
        # remember each configuration's transient (s after the apply): its host's own
        # series when the load divides out (covariate), else what the ratio needed
        for h, cfg in enumerate(cfgs):
            k = own[h] if full.c0 is not None else discard
            if k > 0:
                got = self.interval * (int(valid_idx[k]) if k < valid_idx.size else cut_full)
            else:
                # nothing seen: the transient may be shorter than what was discarded blind;
                # remember half of it (at least the spec's warm-up), so a length that is no
                # longer seen fades instead of ratcheting up
                got = max(self.warm_n * self.interval, 0.5 * self._remembered_transient(cfg))
            key = cfg.key()
            self.transients[key] = max(self.transients.get(key, 0.0), got)
        self.warm_s.append(
            self.pair.now() - t_start - self.interval * float(np.count_nonzero(~warm & probe.valid))
        )
        self.warm_open = None
        return probe.select(~warm & probe.valid)

    def _transient_end(self, x: FloatArray, *, fit: bool) -> tuple[int, bool]:
        """(points of ``x`` still transient, whether to look further) from MSER-5 with its
        changepoint and trend tests and, with ``fit`` (a host's own series per offered
        request, where the live load divides out), from the fitted exponential transient: its
        end is where it falls below a tenth of the minimum effect. Not on the log-ratio,
        where a host-specific response to a slowly changing load looks like a transient."""
        v = stats.detect_warmup(x)
        if not fit:
            return v.discard, v.extend
        eps = TRANSIENT_EPS * math.log1p(self.spec.stats.min_effect)
        f = stats.fit_transient(x, eps=eps, threshold=TRANSIENT_T)
        # a fitted transient that ends inside the series explains the trend MSER sees
        return max(v.discard, f.end), f.at_limit or (v.extend and f.end == 0)

    def _pilot(self, steady: _Chunk) -> None:
        """Batch size, period length and the rule's tuning from the first steady windows
        (CUPED-adjusted with the pilot's own coefficient when the hosts report the covariate:
        the rule is tuned to the variance it will see)."""
        d = self._log_ratio(steady)
        if self.cov_metric is not None and steady.c0 is not None and steady.c1 is not None:
            v = steady.valid
            c = self.sign * (np.log(steady.c1[v]) - np.log(steady.c0[v]))
            cc = c - c.mean()
            sxx = float(cc @ cc)
            if d.size >= 20 and sxx > 1e-12 * d.size:
                d = d - (float(cc @ (d - d.mean())) / sxx) * c
        if self.rule.fixed_batch is not None:
            self.b = int(self.rule.fixed_batch)
            rho = stats.ar1_coefficient(d) if d.size >= 4 else 0.0
        else:
            # from the detrended pilot: a weak transient left in it (only the changed host
            # warms up in period 0) would pass for autocorrelation and inflate the batches;
            # later re-estimates (period starts, all steady windows) can still grow them
            dd = _detrend(d) if d.size >= 4 else d
            rho = stats.ar1_coefficient(dd) if d.size >= 4 else 0.5
            self.b = self._batch_size(dd)
        sd = float(d.std(ddof=1)) if d.size >= 4 else math.nan
        r = min(max(rho, 0.0), 0.95)
        self.noise_lrv = sd * sd * (1.0 + r) / (1.0 - r)
        self.rule.start(
            RuleSetup(
                alpha=self.alpha,
                min_effect=self.spec.stats.min_effect,
                sample_cap=self.cap,
                batch_size=self.b,
                pilot_sd=sd,
                pilot_rho=max(0.0, rho),
            )
        )
        self.period_len = self._period_length()

    def _batch_size(self, x: FloatArray) -> int:
        """Batch size for the window series ``x`` (:func:`musku.abtest.stats.batch_size_for`);
        at most the structure's (the rule's minimum batches fit twice in the cap)."""
        b, bw = stats.batch_size_for(x, target=BATCH_CORRELATION, maximum=self.structure.max_batch)
        self.window_bandwidth = bw
        return b

    def _retro_mask(self, n: int) -> NDArray[np.bool_]:
        """Which of the first ``n`` steady windows are still used: a window younger than
        the transient now known for its period's configurations (measured at a later swap,
        or remembered) is dropped after the fact. Only ever drops more."""
        per = self.win_period.view()[:n].astype(np.int64)
        age = self.win_age.view()[:n]
        req = np.zeros(len(self.period_applied))
        for p, applied in enumerate(self.period_applied):
            if applied:
                sign = self.period_sign[p]
                cfgs = (
                    (self.baseline, self.candidate) if sign > 0 else (self.candidate, self.baseline)
                )
                req[p] = max(self._known_transient(c) for c in cfgs)
        keep = age - self.interval >= req[per] - 1e-9
        if self.kept.size:
            keep[: self.kept.size] &= self.kept[: min(self.kept.size, n)]
        return keep

    def _rebatch(self) -> None:
        """Re-choose the batch size from all steady windows so far (their autocorrelation
        within periods) and drop, after the fact, windows that a transient measured since
        (a later swap's, longer than what was discarded then) still covered; when either
        changes, rebuild the batch means. Only at a period start (every batch closed)."""
        assert self.b is not None
        if self.rule.fixed_batch is not None or self.d_used.n < 8:
            return
        d_all = self.d_used.view()
        keep = self._retro_mask(d_all.size)
        trimmed = int(np.count_nonzero(~keep)) != self.dropped
        if trimmed:
            # the windows newly dropped after the fact are warm-up now: say so to whoever
            # stores them (their rows went out as steady), so the stored flags give the
            # tester's windows
            was = np.ones(keep.size, dtype=bool)
            was[: self.kept.size] = self.kept[: keep.size]
            self._mark_warmup(was & ~keep)
        self.kept = keep
        self.dropped = int(np.count_nonzero(~keep))
        idx = np.flatnonzero(keep)
        d = d_all[idx]
        per = self.win_period.view()[idx]
        resid = d.copy()
        starts = np.flatnonzero(np.r_[True, per[1:] != per[:-1]])[: d.size]
        ends = np.r_[starts[1:], d.size][: starts.size]
        for s, e in zip(starts, ends, strict=True):
            resid[s:e] -= d[s:e].mean()
        # too few windows left to re-estimate the batch size: keep it, but still rebuild the
        # batches when windows were dropped (their means must leave the estimate)
        b = self._batch_size(resid) if idx.size >= 8 else self.b
        if b == self.b and not trimmed:
            return
        self.b = b
        self.batch_d.clear()
        self.batch_sign.clear()
        self.batch_period.clear()
        self.period_t.clear()
        self.batch_age.clear()
        self.tfit_at = (-1, -1)  # refit on the new batches
        age = self.win_age.view()[idx]
        t_end = self.win_t.view()[idx]
        for m in self.guard_metrics:
            self.batch_guard[m].clear()
        guard = {m: self.guard_b[m].view()[idx] for m in self.guard_metrics}
        for s, e in zip(starts, ends, strict=True):
            p = int(per[s])
            sign = self.period_sign[p]
            for k in range((e - s) // b):
                sl = slice(s + k * b, s + (k + 1) * b)
                self.batch_d.append(float(d[sl].mean()))
                self.batch_sign.append(sign)
                self.batch_period.append(p)
                self._batch_time(p, float(t_end[sl.start]), float(t_end[sl.stop - 1]))
                self.batch_age.append((float(age[sl.start]), float(age[sl.stop - 1]), b))
                for m in self.guard_metrics:
                    self.batch_guard[m].append(float(guard[m][sl].mean()))
        self.batch_start = self.d.n
        self.period_len = self._period_length()

    def _mark_warmup(self, newly: NDArray[np.bool_]) -> None:
        """Tell ``on_warmup`` the ``seq`` of the steady windows in ``newly`` (now dropped)."""
        if self.on_warmup is None or not newly.any():
            return
        seqs = self.win_seq.view()[: newly.size][newly]
        self.on_warmup(sorted(int(q) for q in seqs if q >= 0))

    def _period_length(self) -> int:
        """Steady windows per (full) period: SWAP_OVERHEAD x the swap cost in windows."""
        assert self.b is not None
        b = self.b
        warm = self.warm_s
        got = self.tfit if self.fit_mode else None
        swap_cost_s = max(self.apply_s) + max(warm)
        if self.fit_mode:
            # an apply whose search hit its cap (a drift, or a transient too long for one
            # apply to show) is no length to size the periods on; the fitted transient's
            # part left out of the estimate is warm-up too
            warm = [w for p, w in enumerate(self.warm_s) if p not in self.capped]
            warm = warm or [self.warm_n * self.interval]
            if got is not None:
                eps = transient_mod.USE_BELOW * math.log1p(self.spec.stats.min_effect)
                warm.append(got.use_from(eps))
            swap_cost_s = max(self.apply_s) + max(warm)
        if not self.swap_measured and (
            self.baseline.diff(self.candidate).keys() & self.spec.reboot_knobs
        ):
            # first apply may not have rebooted (hosts already there): assume a reboot costs
            # at least as much as the warm-up until a swap has been measured
            swap_cost_s = max(swap_cost_s, 2 * max(warm))
        fixed = self.structure.period_length(b, swap_cost_s, SWAP_OVERHEAD)
        if got is not None:
            # a period lasts PERIOD_PER_TAU fitted time constants; a transient that may be
            # longer than seen so far (open): twice the longest age seen after an apply
            longest = transient_mod.PERIOD_PER_TAU * max(got.taus, default=0.0)
            if got.open:
                longest = max(longest, 2.0 * got.longest_age)
            fixed = max(fixed, self.structure.period_length(b, longest, 1.0))
        if not math.isfinite(self.noise_lrv):
            return fixed
        # the cost model runs under either rule: its expected host time is reported
        # an A/A comparison's swaps apply nothing and discard no warm-up (steps()): they cost
        # no host time, whatever the first apply's warm-up was
        aa = not self.baseline.diff(self.candidate)
        choice = self._auto_period(b, 0.0 if aa else swap_cost_s, fixed)
        return choice.windows if self.spec.stats.period == "auto" else fixed

    def _auto_period(self, b: int, swap_cost_s: float, fixed: int) -> periods_mod.PeriodChoice:
        """``period = "auto"``: the length that minimises the expected host time to a
        decision (:mod:`musku.abtest.periods`), from the pilot's noise, the swap cost and the
        rule's wander prior, between the structure's limits."""
        wander = getattr(self.rule, "wander", None)
        if not isinstance(wander, stats.Wander):
            wander = stats.Wander(WANDER_SD, WANDER_TAU_S)
        cost = periods_mod.PeriodCost(
            interval_s=self.interval,
            noise_lrv=self.noise_lrv,
            min_effect=self.spec.stats.min_effect,
            swap_s=swap_cost_s,
            wander_sd=wander.sd,
            wander_tau_s=wander.tau_s,
            long_share=PERIOD_SHARE_OF_WANDER,
        )
        self.period_choice = periods_mod.choose_in(self.structure, b, cost, fixed)
        return self.period_choice

    def _extend_first_period(self) -> bool:
        """Before the first swap: one more batch while the rule's early (pre-crossover)
        path looks able to decide within a full period's length; saves the swap, its
        warm-up (and reboots) and the second role order for effects far beyond any
        plausible host bias."""
        if self.period != 0 or not self.rule.crossover:
            return False
        promising = getattr(self.rule, "early_promising", None)
        if not callable(promising):
            return False
        assert self.period_len is not None and self.b is not None
        # up to a full period, or as many batches as the crossover path would need anyway
        most = max(
            self.period_len // self.b,
            int(getattr(self.rule, "early_min_batches", 0)),
            int(getattr(self.rule, "min_batches", 0)),
        )
        return bool(promising(self._evidence(), most))

    def _period_target(self) -> int:
        if not self.rule.crossover:
            return self.cap
        assert self.period_len is not None and self.b is not None
        if self.period == 0:
            return self.structure.first_period(self.b, self.period_len)
        return self.period_len

    # ------------------------------------------------------------------ steady state

    def _add_steady(self, chunk: _Chunk) -> None:
        v = chunk.valid
        m_a = chunk.m0[v] if self.sign > 0 else chunk.m1[v]
        m_b = chunk.m1[v] if self.sign > 0 else chunk.m0[v]
        la, lb = np.log(m_a), np.log(m_b)
        self.log_a.extend(la)
        self.log_b.extend(lb)
        self.d.extend(self.dir * (lb - la))
        if chunk.c0 is not None and chunk.c1 is not None:
            self.cov_seen = True
            c_a = chunk.c0[v] if self.sign > 0 else chunk.c1[v]
            c_b = chunk.c1[v] if self.sign > 0 else chunk.c0[v]
            self.c.extend(np.log(c_b) - np.log(c_a))
        else:
            self.c.extend(np.zeros(la.size))
        self.win_period.extend(np.full(la.size, float(self.period)))
        ends = np.fromiter((s0.t for s0, _ in chunk.samples), dtype=float, count=v.size)
        self.win_age.extend(ends[v] - self.apply_t)
        self.win_t.extend(ends[v] - self.t0)
        seq = chunk.seq if chunk.seq is not None else np.full(v.size, -1, dtype=np.int64)
        self.win_seq.extend(seq[v].astype(float))
        for m in self.guard_metrics:
            g = chunk.guard1[m][v] if self.sign > 0 else chunk.guard0[m][v]
            self.guard_b[m].extend(g)

    def _close_batches(self) -> int:
        """Turn complete batches of the open period into batch means; returns how many."""
        assert self.b is not None
        closed = 0
        d = self.d.view()
        c = self.c.view()
        while self.d.n - self.batch_start >= self.b:
            sl = slice(self.batch_start, self.batch_start + self.b)
            if self.cov_metric is not None:
                # CUPED: the coefficient from the windows before this batch only (predictable),
                # so the adjusted increments stay a martingale difference sequence
                self.theta = self._cuped_theta(self.batch_start)
            adj = d[sl] - self.theta * c[sl]
            self.d_used.extend(adj)
            self.batch_d.append(float(adj.mean()))
            self.batch_sign.append(self.sign)
            self.batch_period.append(self.period)
            t_end = self.win_t.view()
            self._batch_time(self.period, float(t_end[sl.start]), float(t_end[sl.stop - 1]))
            age = self.win_age.view()
            self.batch_age.append((float(age[sl.start]), float(age[sl.stop - 1]), self.b))
            for m in self.guard_metrics:
                self.batch_guard[m].append(float(self.guard_b[m].view()[sl].mean()))
            self.batch_start += self.b
            closed += 1
        return closed

    def _cuped_theta(self, upto: int) -> float:
        """Regression coefficient of the log-ratio on the covariate's log-ratio over the
        first ``upto`` steady windows, both centred within periods (role order and host
        differences drop out); 0 with too little data or no covariate variation."""
        if upto < 20:
            return 0.0
        # the windows are append-only and ``upto`` only grows: add the new ones to each
        # period's running sums, then the within-period centred moments from the sums
        if upto > self.cuped_n:
            sl = slice(self.cuped_n, upto)
            d, c = self.d.view()[sl], self.c.view()[sl]
            per = self.win_period.view()[sl].astype(np.int64)
            for p in np.unique(per):
                m = per == p
                dp, cp = d[m], c[m]
                add = np.array([dp.size, dp.sum(), cp.sum(), dp @ cp, cp @ cp], dtype=float)
                key = int(p)
                self.cuped_sums[key] = self.cuped_sums.get(key, np.zeros(5)) + add
            self.cuped_n = upto
        sums = np.array(list(self.cuped_sums.values()))
        n, sd, sc, sdc, scc = sums.T
        sxx = float((scc - sc * sc / n).sum())
        if sxx <= 1e-12 * upto:
            return 0.0
        return float((sdc - sd * sc / n).sum()) / sxx

    def _cuped_gain(self) -> float | None:
        """Share of the steady windows' log-ratio variance (within periods) the covariate
        adjustment removed, at the last coefficient; None without the adjustment."""
        if self.cov_metric is None or not self.cov_seen or self.theta == 0.0:
            return None
        n = self.cuped_n
        if n < 20:
            return None
        d, c = self.d.view()[:n], self.c.view()[:n]
        per = self.win_period.view()[:n].astype(np.int64)
        _, inv = np.unique(per, return_inverse=True)
        counts = np.bincount(inv).astype(float)

        def centred(x: FloatArray) -> FloatArray:
            return np.asarray(x - (np.bincount(inv, weights=x) / counts)[inv], dtype=float)

        raw = centred(d)
        v_raw = float(raw @ raw)
        if v_raw <= 0.0:
            return None
        adj = raw - self.theta * centred(c)
        return 1.0 - float(adj @ adj) / v_raw

    def _transient_open(self, got: transient_mod.TransientFit | None) -> bool:
        """No decision yet on this fit: it may be longer than seen (open), the shape is
        seen in fewer than two swaps, or it is known too roughly for its linearised
        uncertainty to be trusted (its part of the interval wider than
        :data:`transient.ROUGH` x min_effect). None of these while every apply so far was
        searched to its end (as the discard mode decides), nor once the fit says there is
        no transient at all (:attr:`transient.TransientFit.quiet`) on applies that show
        the ages where the searched one was: the fit then costs nothing over discarding."""
        searched_only = self.period < SEARCH_APPLIES and not self.capped
        if got is None:
            return not searched_only
        # nothing fitted and nothing open: while only searched applies are in, or once the
        # fit sees no transient at all over the ages the searched one lasted
        upto = self._searched_transient()
        seen = self._fitted_ages() >= upto and got.quiet(
            math.log1p(self.spec.stats.min_effect), upto
        )
        if got.k == 0 and not got.open and (searched_only or seen):
            return False
        rough = math.sqrt(got.var) > transient_mod.ROUGH * math.log1p(self.spec.stats.min_effect)
        return got.open or self.period < MIN_SWAPS_SEEN + 1 or rough

    def _wander(self) -> tuple[float, float] | None:
        """The largest host-bias wander (sd, tau s) the rule knows for this pair (its prior
        or the pair's calibration), for the transient fit's trend test."""
        get = getattr(self.rule, "wanders", None)
        if not callable(get):
            return None
        ws = [w for w in get() if isinstance(w, stats.Wander) and w.sd > 0 and w.tau_s > 0]
        if not ws:
            return None
        w = max(ws, key=lambda x: x.sd)
        return float(w.sd), float(w.tau_s)

    def _searched_transient(self) -> float:
        """Fit mode: the longest transient (s after the apply) the searches of the first
        :data:`SEARCH_APPLIES` applies measured; inf when one hit :data:`SEARCH_CAP_S` (no
        end seen)."""
        if self.capped:
            return math.inf
        return max(self.warm_s[:SEARCH_APPLIES], default=math.inf)

    def _fitted_ages(self) -> float:
        """Fit mode: the oldest age (s after its apply) of a batch in a period not searched
        (only the blind minimum discarded: where the joint fit sees a transient)."""
        ages = [a[1] for a, p in zip(self.batch_age, self.batch_period, strict=True)
                if p >= SEARCH_APPLIES]  # fmt: skip
        return max(ages, default=0.0)

    def _used(self) -> int:
        """Steady windows (after the blind minimum, not dropped after the fact). In fit
        mode this includes the windows of the transient's large part that the estimate
        leaves out (counted in ``fit_excluded`` and said in the method)."""
        return self.d.n - self.dropped

    def _transient_fit(self) -> transient_mod.TransientFit | None:
        """The transient fitted over all applies so far (:mod:`musku.abtest.transient`),
        evaluated on the current batches: refitted at a new period and whenever the batches
        grew by a quarter since the last fit, else the last fit's parameters."""
        n = len(self.batch_d)
        if not self.fit_mode or n == 0 or not self.period_changed:
            return None
        age = np.asarray(self.batch_age, dtype=float).reshape(-1, 3)
        sign = np.asarray(self.batch_sign, dtype=float)
        per = np.asarray(self.batch_period, dtype=np.int64)
        changed = np.asarray(self.period_changed, dtype=bool).reshape(-1, 2).copy()
        # the first apply (from whatever the hosts ran) is searched and discarded to its
        # end as before: its batches carry no transient to fit (the swaps' applies, all
        # alike, are what the joint fit is for)
        changed[0] = False
        last_n, last_p = self.tfit_at
        if self.tfit is None or last_p != self.period or n >= max(last_n + 4, 1.25 * last_n):
            tau_min = max(5.0, 2.0 * self.interval, 0.5 * (self.b or 1) * self.interval)
            self.tfit = transient_mod.fit(
                np.asarray(self.batch_d, dtype=float),
                sign,
                per,
                age[:, 0],
                age[:, 1],
                age[:, 2],
                changed,
                tau_min=tau_min,
                wander=self._wander(),
            )
            self.tfit_at = (n, self.period)
            return self.tfit
        return transient_mod.evaluate(
            self.tfit, sign, per, age[:, 0], age[:, 1], age[:, 2], changed
        )

    def _evidence(self) -> Evidence:
        got = self._transient_fit()
        batch_d = np.asarray(self.batch_d, dtype=float)
        sign = np.asarray(self.batch_sign, dtype=np.int8)
        per = np.asarray(self.batch_period, dtype=np.int64)
        if got is not None and got.correction.size == batch_d.size:
            # the fit uses every batch (the early ones show the shape best); the estimate
            # leaves out the batches where the fitted transient is still large (its
            # correction would cost more variance than the windows bring) and subtracts it
            # from the rest, its uncertainty added (transient.evaluate on those batches)
            eps = transient_mod.USE_BELOW * math.log1p(self.spec.stats.min_effect)
            keep = np.abs(got.correction) <= eps
            changed = np.asarray(self.period_changed, dtype=bool).reshape(-1, 2).copy()
            changed[0] = False
            if min(np.count_nonzero(keep & (sign > 0)), np.count_nonzero(keep & (sign < 0))) < 2:
                keep[:] = True  # too little left to estimate from: all, corrected
            age = np.asarray(self.batch_age, dtype=float).reshape(-1, 3)
            self.fit_excluded = int(age[~keep, 2].sum())
            if not keep.all():
                got = transient_mod.evaluate(
                    got,
                    sign[keep],
                    per[keep],
                    age[keep, 0],
                    age[keep, 1],
                    age[keep, 2],
                    changed,
                )
                batch_d, sign, per = batch_d[keep], sign[keep], per[keep]
            got = replace(got, excluded=self.fit_excluded)
            batch_d = batch_d - got.correction
        return Evidence(
            transient_var=got.var if got is not None else 0.0,
            transient_note=got.describe() if got is not None else "",
            # fit mode: nothing fitted yet is as open as it gets
            transient_open=self.fit_mode and self._transient_open(got),
            batch_d=batch_d,
            batch_sign=sign,
            batch_period=per,
            log_a=self.log_a.view(),
            log_b=self.log_b.view(),
            direction=self.dir,
            samples=self._used(),
            batch_size=self.b or 1,
            period_span=self._period_span(),
        )

    def _batch_time(self, p: int, first_end: float, last_end: float) -> None:
        """A batch of period ``p`` closed over windows ending ``first_end``..``last_end``."""
        t0, t1 = self.period_t.get(p, (math.inf, -math.inf))
        self.period_t[p] = (min(t0, first_end - self.interval), max(t1, last_end))

    def _period_span(self) -> FloatArray:
        """Per period index: host seconds of its first batched window's start and its last
        batched window's end (NaN for a period without batches)."""
        span = np.full((self.period + 1, 2), np.nan)
        for p, (t0, t1) in self.period_t.items():
            span[p] = t0, t1
        return span

    def _guardrails(self, final: bool) -> tuple[Guardrail, float, float, float] | None:
        """The first broken guardrail: (guardrail, mean, low, high) of its B-role mean."""
        for g in self.spec.guardrails:
            vals = np.asarray(self.batch_guard[g.metric], dtype=float)
            if vals.size == 0:
                continue
            mean = float(vals.mean())
            self.guard_values[g.metric] = mean
            if vals.size < 4:
                continue
            se = float(vals.std(ddof=1)) / math.sqrt(vals.size)
            n_opt_of = getattr(self.rule, "n_opt", None)
            n_opt = float(n_opt_of(self.b)) if callable(n_opt_of) else 32.0
            hw = stats.cs_halfwidth(se, float(vals.size), self.alpha, n_opt, df=vals.size - 1)
            lo, hi = mean - hw, mean + hw
            beyond = lo > g.limit if g.op == "<=" else hi < g.limit
            if beyond or (final and not g.holds(mean)):
                return g, mean, lo, hi
        return None

    def _progress(self, decision: Decision | None = None) -> None:
        if self.on_progress is None:
            return
        self.on_progress(
            Progress(
                samples=self._used(),
                estimate=self.verdict.estimate,  # NaN until there is an estimate
                ci_low=self.verdict.ci_low,
                ci_high=self.verdict.ci_high,
                host_time_s=self.pair.now() - self.t0,
                period=self.period,
                batches=len(self.batch_d),
                batch_size=self.b or 0,
                decision=decision,
                windows_needed=self._windows_needed(),
            )
        )

    def _windows_needed(self) -> int | None:
        """About how many more steady windows until the rule can first give an interval
        (None when it has one)."""
        v = self.verdict
        if math.isfinite(v.ci_low) and math.isfinite(v.ci_high):
            return None
        b = self.b or 1
        period = self.period_len or self.structure.period_length(b, 0.0, SWAP_OVERHEAD)
        n = self._used()
        return max(b, self.structure.windows_to_first_decision(n, b, period))

    def _check_bias(self) -> None:
        """The comparison's own host-bias estimate against the bound in use: a confidence
        sequence over the looks that lies wholly beyond it marks the pair for recalibration
        (once per comparison) and keeps the early path off."""
        if self.bias_note or not self.rule.crossover or not getattr(self.rule, "check_bias", 0):
            return
        interval = getattr(self.rule, "bias_interval", None)
        if not callable(interval):
            return
        got = interval(self.alpha)
        if got is None:
            return
        _, lo, hi = got
        bound = self.memory.check_bound()
        # relative host 1 vs host 0 bias in the metric itself
        rel = sorted(math.expm1(self.dir * x) for x in (lo, hi))
        if rel[0] > bound or rel[1] < -bound:
            self.bias_note = (
                f"host bias interval [{pct(rel[0])}, {pct(rel[1])}] lies beyond the "
                f"{'calibrated' if self.memory.calibration else 'default'} bound "
                f"±{bound * 100:.2f} %: pair marked for recalibration, early decisions off"
            )
            self.notes.append(self.bias_note)
            self.memory.breach(self.bias_note)

    def _look(self) -> tuple[Decision, str] | None:
        self.verdict = self.rule.look(self._evidence())
        self._check_bias()
        v = self.verdict
        n = self._used()  # steady windows used (retro-trimmed ones not)
        interval = f"interval [{pct(v.ci_low)}, {pct(v.ci_high)}]"
        capped = self.d.n >= self.cap
        final = v.decision is not None or capped
        broken = self._guardrails(final=final)
        if broken is not None and v.decision is not Decision.WORSE:
            g, mean, lo, hi = broken
            how = (
                f"its interval [{lo:.4g}, {hi:.4g}] lies beyond the limit"
                if (lo > g.limit if g.op == "<=" else hi < g.limit)
                else "its estimate is beyond the limit at the stop"
            )
            return Decision.GUARDRAIL, (
                f"guardrail {g} broken: candidate's {g.metric} = {mean:.4g}, {how} "
                f"after {n:,} samples"
            )
        if v.decision in (Decision.BETTER, Decision.WORSE) and v.early:
            beta = float(getattr(self.rule, "max_host_bias", 0.0))
            return v.decision, (
                f"decided before crossover: {interval} excludes 0 even allowing "
                f"±{beta * 100:.2f} % host bias, after {n:,} samples"
            )
        if v.decision in (Decision.BETTER, Decision.WORSE):
            return v.decision, f"{interval} excludes 0 after {n:,} samples"
        if v.decision is Decision.NO_DIFFERENCE:
            m = self.spec.stats.min_effect
            if math.isfinite(v.eq_low) and (v.eq_low, v.eq_high) != (v.ci_low, v.ci_high):
                return v.decision, (
                    f"equivalence bounds [{pct(v.eq_low)}, {pct(v.eq_high)}] (two one-sided "
                    f"tests) lie inside ±{m * 100:.2f} % after {n:,} samples; {interval}"
                )
            return v.decision, f"{interval} lies inside ±{m * 100:.2f} % after {n:,} samples"
        if v.decision is Decision.NOT_BETTER:
            return v.decision, (
                f"{futility_reason(self.rule, v.fut_bound, f'after {n:,} samples')}; {interval}"
            )
        if capped:
            need = self._windows_needed()
            if need is not None:
                return Decision.INCONCLUSIVE, (
                    f"no interval yet (needs about {need:,} more windows) after {n:,} "
                    "samples (sample cap)"
                )
            return Decision.INCONCLUSIVE, (
                f"no significant difference: {interval} after {n:,} samples (sample cap)"
            )
        return None

    # ------------------------------------------------------------------ main loop

    def run(self) -> ComparisonResult:
        self.sign = self.rule.first_order()
        try:
            outcome = self._loop()
        except _Stop:
            outcome = self.stopped()
        except _Transient as exc:
            outcome = (Decision.INCONCLUSIVE, str(exc))
        return self.finish(outcome)

    def stopped(self) -> tuple[Decision, str]:
        return (
            Decision.ABORTED,
            f"stopped on request after {self._used():,} samples",
        )

    def finish(self, outcome: tuple[Decision, str]) -> ComparisonResult:
        """The result of this pair's comparison ending with ``outcome``; what was measured
        about the pair goes back to its memory."""
        # what was measured about the pair goes back to its memory (the DB when stored:
        # there the median of the newest three counts, so one spurious detection fades)
        for key, secs in self.transients.items():
            self.memory.transients[key] = secs
        decision, reason = outcome
        need = self._windows_needed()
        if need is not None and "needs about" not in reason:
            # stopped (aborted, a guardrail, a transient) before any interval: say how far
            reason += f"; no interval yet (needs about {need:,} more windows)"
        if not self.cov_seen and hasattr(self.rule, "covariate"):
            self.rule.covariate = None  # the hosts did not report it: say so in the method
        gain = self._cuped_gain()
        if gain is not None:
            self.notes.append(
                f"CUPED on {self.cov_metric}: window variance {-gain * 100:+.0f} % "
                f"({1.0 / max(1e-9, 1.0 - gain):.1f}x fewer samples for the same interval)"
            )
        auto = self.spec.stats.period == "auto"
        if self.period_choice is not None and auto:
            self.notes.append(self.period_choice.why)
        self._progress(decision)
        th = self.pair.threading()
        roles = {"A": th[0], "B": th[1]} if self.sign > 0 else {"A": th[1], "B": th[0]}
        detail = f"; {self.verdict.detail}" if self.verdict.detail and decision.final else ""
        for note in self.notes:
            detail += f"; {note}"
        if _design(self.pair) == "switchback":
            reason, detail = _one_host_wording(reason), _one_host_wording(detail)
        return ComparisonResult(
            baseline=self.baseline,
            candidate=self.candidate,
            decision=decision,
            # nothing measured yet (an abort in the first warm-up): no estimate, an unbounded
            # interval; 0.0 rather than NaN, which SQL stores as NULL
            estimate=self.verdict.estimate if math.isfinite(self.verdict.estimate) else 0.0,
            ci_low=self.verdict.ci_low,
            ci_high=self.verdict.ci_high,
            samples=self._used(),
            host_time_s=self.pair.now() - self.t0,
            reason=reason + detail,
            guardrail_values=dict(self.guard_values),
            threading=roles,
            method=self.rule.method(),
            time=self.time_breakdown(),
            period_s=(
                self.period_len * self.interval
                if self.rule.crossover and self.period_len is not None
                else None
            ),
            period_why=self.period_choice.why if self.period_choice is not None and auto else "",
            expected_s=(
                None
                if self.period_choice is None
                else self.period_choice.host_s
                if auto
                else self.period_choice.fixed_host_s
            ),
        )

    def _loop(self) -> tuple[Decision, str]:
        """One pair on its own: :meth:`steps` judged by this pair's rule at every look."""
        steps = self.steps()
        try:
            kind = next(steps)
            while True:
                outcome = self._look()
                if kind == "cap" and outcome is None:
                    outcome = (Decision.INCONCLUSIVE, "sample cap reached")
                kind = steps.send(outcome)
        except StopIteration as done:
            result: tuple[Decision, str] = done.value
            return result

    def steps(self) -> Generator[str, tuple[Decision, str] | None, tuple[Decision, str]]:
        """The comparison's measurement as a generator: it yields ``"look"`` after every
        closed batch (and ``"cap"`` when the sample cap is reached) and is sent the outcome
        of that look: ``None`` measures on (never after ``"cap"``), an outcome ends it and is
        returned. A pooled comparison (:mod:`musku.abtest.pooled`) drives several pairs'
        generators and judges them together."""
        while True:
            self.period_sign.append(self.sign)
            if self.period > 0 and not self.baseline.diff(self.candidate):
                # A/A: swapping the roles changes neither host's configuration, so there is
                # nothing to apply and no transient to wait for
                self.period_applied.append(False)
                self.period_changed.append(
                    self.period_changed[-1] if self.period_changed else (False, False)
                )
                steady = self._columns([])
            else:
                self.period_applied.append(True)
                self._apply()
                self.apply_t = self.pair.now()
                if self.period == 1 and self.rule.crossover:
                    self.swap_measured = True
                steady = self._warmup()
            self._progress()  # the live view moves on through long warm-ups and reboots
            if self.b is None:
                self._pilot(steady)
            else:
                if self.period == 1 and self.rule.crossover:
                    self.period_len = self._period_length()  # with the first swap measured
                self._rebatch()
            assert self.b is not None
            target = self._period_target()
            in_period = 0
            measured = invalid = 0
            pending: _Chunk | None = steady
            while True:
                if pending is not None and len(pending.samples):
                    take = min(len(pending.samples), self.cap - self.d.n)
                    if take < len(pending.samples):
                        pending = pending.select(np.arange(len(pending.samples)) < take)
                    self._add_steady(pending)
                    in_period += int(np.count_nonzero(pending.valid))
                pending = None
                if self._close_batches():
                    self._check_stop()
                    outcome = yield "look"
                    self._progress()
                    if outcome is not None:
                        return outcome
                if self.d.n >= self.cap:
                    # cap reached inside an open batch: judge what there is
                    outcome = yield "cap"
                    assert outcome is not None, "a comparison at its cap must be given its end"
                    return outcome
                if in_period >= target and self.d.n == self.batch_start:
                    if not self._extend_first_period():
                        break
                    target += self.b
                need = min(self.b - (self.d.n - self.batch_start), self.cap - self.d.n)
                chunk = self._measure(need)
                measured += need
                bad = int(np.count_nonzero(~chunk.valid))
                invalid += bad
                if measured >= 200 and invalid > MAX_INVALID_FRACTION * measured:
                    raise HostError(
                        f"{invalid} of {measured} windows invalid in period {self.period}: "
                        "the hosts' knob state keeps drifting"
                    )
                self._emit(chunk, False)
                pending = chunk.select(chunk.valid)
            if not self.rule.crossover:
                continue
            self.period += 1
            self.sign = -self.sign


def _detrend(x: FloatArray) -> FloatArray:
    """Residuals of the least-squares line through ``x`` (over its index)."""
    t = np.arange(x.size, dtype=float)
    t -= t.mean()
    xc = x - x.mean()
    return xc - (float(t @ xc) / float(t @ t)) * t


def _concat(chunks: list[_Chunk]) -> _Chunk:
    """One chunk of ``chunks`` in order; the covariate only when every chunk has it."""
    chunks = [c for c in chunks if len(c.samples)] or chunks[:1]
    if len(chunks) == 1:
        return chunks[0]
    keys = chunks[0].guard0.keys()
    cov = all(c.c0 is not None and c.c1 is not None for c in chunks)
    return _Chunk(
        np.concatenate([c.m0 for c in chunks]),
        np.concatenate([c.m1 for c in chunks]),
        np.concatenate([c.valid for c in chunks]),
        {k: np.concatenate([c.guard0[k] for c in chunks]) for k in keys},
        {k: np.concatenate([c.guard1[k] for c in chunks]) for k in keys},
        [s for c in chunks for s in c.samples],
        np.concatenate([c.c0 for c in chunks if c.c0 is not None]) if cov else None,
        np.concatenate([c.c1 for c in chunks if c.c1 is not None]) if cov else None,
        np.concatenate([c.seq for c in chunks if c.seq is not None])
        if all(c.seq is not None for c in chunks)
        else None,
    )


_ONE_HOST_WORDS = (
    ("host 1 vs host 0 bias", "arm 1 vs arm 0 bias"),
    ("decided before crossover", "decided before the arms swapped roles"),
    (
        "no crossover: estimate includes the host bias",
        "one arm order only: estimate includes the arm bias",
    ),
    ("host bias", "arm bias"),
)
"""Reason wording on a switchback pair: its two "hosts" are two arms (alternating
sub-windows) of one host, so there is no host bias and no crossover between hosts."""


def _design(pair: HostPair) -> str | None:
    try:
        design = pair.describe().get("design")
    except Exception:  # describe() is informational; never fail a comparison over it
        return None
    return str(design) if design is not None else None


def _one_host_wording(text: str) -> str:
    for old, new in _ONE_HOST_WORDS:
        text = text.replace(old, new)
    return text


def _early_gate(pair: HostPair, rule: DecisionRule, memory: PairMemory) -> str:
    """Early (pre-crossover) decisions only within a usable calibrated bound: the larger of
    the calibration's bound and any bound given explicitly (rule options, or the pair's
    ``describe()["max_host_bias"]``); without a usable calibration the early path is off
    and the crossover sequence gets all of alpha. Returns a warning ("" when none)."""
    if not hasattr(rule, "max_host_bias") or not getattr(rule, "early", False):
        return ""
    given: float | None = (
        float(rule.max_host_bias) if getattr(rule, "max_host_bias_given", False) else None  # type: ignore[attr-defined]
    )
    if given is None:
        try:
            bound = pair.describe().get("max_host_bias")
        except Exception:  # describe() is informational; never fail a comparison over it
            bound = None
        if bound is not None:
            if not _num(bound) or not 0.0 <= float(bound) < 0.5:
                raise InputError(
                    f"the host pair's max_host_bias = {bound!r} is invalid: must be in [0, 0.5)"
                )
            given = float(bound)
    calibrated, warning = memory.early_bound()
    if calibrated is None:
        rule.early = False  # type: ignore[attr-defined]
        return warning
    rule.max_host_bias = max(calibrated, given or 0.0)  # type: ignore[attr-defined]
    return ""


def _noise_gate(rule: DecisionRule, memory: PairMemory, spec: ComparisonSpec) -> None:
    """Hand the rule the pair's noise its usable calibration measured (issue 30 item 4), in
    the comparison's metric and window, when the rule asks for it (``calibrated_noise``,
    off by default), unless it has its own (``noise_lrv`` in the rule options) or does not
    pool it. An unusable calibration (too old, other hardware,
    marked for recalibration) gives nothing, as for the early path."""
    cal = memory.calibration
    if cal is None or not getattr(rule, "pools_noise", False) or getattr(rule, "noise", None):
        return
    if not getattr(rule, "calibrated_noise", False):  # off by default (rules.CALIBRATED_NOISE)
        return
    ok, _ = cal.usable(memory.hardware, now=memory.now, max_age_s=memory.max_age_s)
    got = cal.noise_for(spec.metric, spec.stats.sample_interval_s) if ok else None
    if got is not None:
        name = f"calibration {cal.id}" if cal.id is not None else "the calibration"
        rule.use_noise(got[0], got[1], name)  # type: ignore[attr-defined]


def _wander_gate(rule: DecisionRule, memory: PairMemory) -> None:
    """Hand the rule the slow wander of the host bias its pair's usable calibration measured
    (issue 30 item 1): a prior of the between-period component where larger than the rule's
    own. An unusable calibration (too old, other hardware, marked for recalibration) or one
    from before revision 0012 gives nothing."""
    cal = memory.calibration
    if cal is None or not hasattr(rule, "use_wander"):
        return
    got = cal.wander()
    ok, _ = cal.usable(memory.hardware, now=memory.now, max_age_s=memory.max_age_s)
    if got is not None and ok:
        name = f"calibration {cal.id}" if cal.id is not None else "the calibration"
        rule.use_wander(got[0], got[1], name)  # type: ignore[attr-defined]


def futility_reason(rule: DecisionRule, bound: float, on: str) -> str:
    """The reason of a futility stop (:data:`Decision.NOT_BETTER`): what was shown, at which
    level, with the bound."""
    bar = float(getattr(rule, "futility", math.nan))
    alpha = rule.setup.alpha if rule.setup is not None else math.nan
    return (
        f"not better by {pct(bar)}: the effect is below {pct(bar)} at "
        f"{(1 - alpha) * 100:.0f} % (one-sided SPRT, futility bound {pct(bound)}) {on}"
    )


def run_comparison(
    pair: HostPair,
    baseline: Configuration,
    candidate: Configuration,
    spec: ComparisonSpec,
    *,
    on_window: Callable[[list[WindowRow]], None] | None = None,
    on_progress: Callable[[Progress], None] | None = None,
    should_stop: Callable[[], bool] | None = None,
    seed: int | None = None,
    rule: str | DecisionRule = "cs",
    rule_options: Mapping[str, Any] | None = None,
    memory: PairMemory | None = None,
    on_warmup: Callable[[list[int]], None] | None = None,
) -> ComparisonResult:
    """Run one sequential A/B comparison of ``candidate`` (role B) against ``baseline``
    (role A) on ``pair`` and return what it found.

    ``on_window(rows)`` receives every measured window (two rows, one per host, with keys
    ``seq, t, host, role, period, warmup, valid, metrics``); ``on_progress(progress)`` a
    :class:`Progress` after every look; ``on_warmup(seqs)`` the ``seq`` of windows that went
    out as steady and were dropped later as warm-up (a longer transient measured at a later
    swap): a store sets their ``warmup`` flag, so the stored steady windows are the ones the
    result used; ``should_stop()`` is polled between pieces of
    measurement and, when true, the comparison returns at once with ``Decision.ABORTED``.
    ``seed`` (default ``spec.stats.seed``) seeds the rule (the randomised role order).
    Raises :class:`InputError` for an invalid spec or a metric the hosts do not report, and
    lets :class:`HostError` / :class:`UnsupportedError` from the pair through."""
    validate_spec(spec)
    rule_obj = make_rule(
        rule, seed=spec.stats.seed if seed is None else seed, **dict(rule_options or {})
    )
    memory = memory if memory is not None else PairMemory()
    warning = _early_gate(pair, rule_obj, memory)
    _noise_gate(rule_obj, memory, spec)
    _wander_gate(rule_obj, memory)
    cmp = _Comparison(
        pair,
        baseline,
        candidate,
        spec,
        rule_obj,
        on_window,
        on_progress,
        should_stop,
        memory,
        on_warmup,
    )
    if warning:
        cmp.notes.append(warning)
    return cmp.run()
