"""The domain: frozen value types shared by the controller, the simulator, agents and storage.

Nothing here touches a database, a host or the clock. Storage converts these to and from
its own models explicitly (``musku.storage``).

Knob values are JSON-able primitives, one canonical form per knob:

=============  ==========  ============================================================
knob           type        examples
=============  ==========  ============================================================
core_freq      float GHz   2.2, 1.9  (the catalog may also list "turbo")
uncore_freq    float GHz   1.8
core_count     int         18 (active physical cores)
cdp            str         "off" (CDP disabled) or "D:C" = data ways : code ways, "6:5"
prefetch       str         a named prefetcher configuration from the platform catalog:
                           "all_on", "all_off", "dcu_dcuip", "dcu", "l2hw_dcu" (Intel)
thp            str         "always" | "madvise" | "never"
shp            int         number of static 2 MiB huge pages, 0 = none
=============  ==========  ============================================================
"""

from __future__ import annotations

import enum
import json
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime

from musku.knob_spec import BUILTIN, Value, resolve, sort_key, spec_of

KNOBS: tuple[str, ...] = tuple(BUILTIN)
"""The seven built-in knobs, in the order sweeps visit them. Out-of-tree knobs registered at
run time are not in it: :func:`musku.knob_spec.knob_names` lists every knob, and
:func:`musku.knob_spec.spec_of` describes one."""


def canonical_value(knob: str, value: object) -> Value:
    """Normalise a knob value to its canonical primitive (raises ValueError/TypeError, and
    KeyError for an unknown knob). The knob's spec decides (:mod:`musku.knob_spec`)."""
    return spec_of(knob).canonical(value)


def format_value(knob: str, value: Value) -> str:
    """Human form of a value: '2.2GHz', '6d:5c', 'always'."""
    try:
        spec = spec_of(knob)
    except KeyError:
        return str(value)
    return spec.format(value)


@dataclass(frozen=True, order=True)
class Configuration:
    """A full or partial assignment knob -> value. Hashable, ordered by knob order."""

    settings: tuple[tuple[str, Value], ...] = ()

    @classmethod
    def of(cls, mapping: Mapping[str, object] | None = None, **kw: object) -> Configuration:
        merged: dict[str, object] = dict(mapping or {})
        merged.update(kw)
        items = []
        for name, value in merged.items():
            knob = resolve(name)  # KeyError for an unknown knob; "module:Class" registers it
            items.append((knob, spec_of(knob).canonical(value)))
        items.sort(key=lambda kv: sort_key(kv[0]))
        return cls(tuple(items))

    def as_dict(self) -> dict[str, Value]:
        return dict(self.settings)

    def get(self, knob: str, default: Value | None = None) -> Value | None:
        return self.as_dict().get(knob, default)

    def __getitem__(self, knob: str) -> Value:
        return self.as_dict()[knob]

    def __contains__(self, knob: object) -> bool:
        return any(k == knob for k, _ in self.settings)

    def __iter__(self) -> Iterator[str]:
        return (k for k, _ in self.settings)

    def knobs(self) -> tuple[str, ...]:
        return tuple(k for k, _ in self.settings)

    def with_(self, knob: str, value: object) -> Configuration:
        d: dict[str, object] = dict(self.as_dict())
        d[knob] = value
        return Configuration.of(d)

    def merged(self, other: Configuration) -> Configuration:
        """This configuration overridden by ``other``'s settings."""
        d: dict[str, object] = dict(self.as_dict())
        d.update(other.as_dict())
        return Configuration.of(d)

    def diff(self, other: Configuration) -> dict[str, tuple[Value | None, Value | None]]:
        """Knobs whose values differ: knob -> (self's, other's)."""
        a, b = self.as_dict(), other.as_dict()
        knobs = sorted(set(a) | set(b), key=sort_key)
        return {k: (a.get(k), b.get(k)) for k in knobs if a.get(k) != b.get(k)}

    def key(self) -> str:
        """Canonical, stable text form; used as a DB key and in logs."""
        return json.dumps(self.as_dict(), sort_keys=False, separators=(",", ":"))

    @classmethod
    def from_key(cls, key: str) -> Configuration:
        return cls.of(json.loads(key))

    def __str__(self) -> str:
        return " ".join(f"{k}={format_value(k, v)}" for k, v in self.settings) or "(empty)"


class Direction(enum.Enum):
    HIGHER = "higher"  # throughput-like metrics: mips, qps
    LOWER = "lower"  # latency-like metrics: p99_ms, power_w


@dataclass(frozen=True)
class Guardrail:
    """A limit the candidate must respect, e.g. ``p99_ms <= 12`` or ``qos_violation_rate <= 0.01``."""

    metric: str
    op: str  # "<=" or ">="
    limit: float

    def holds(self, value: float) -> bool:
        return value <= self.limit if self.op == "<=" else value >= self.limit

    def __str__(self) -> str:
        return f"{self.metric} {self.op} {self.limit:g}"


@dataclass(frozen=True)
class StatsSettings:
    """Statistics settings of an experiment's ``[statistics]`` table."""

    confidence: float = 0.95
    min_effect: float = 0.005  # minimum effect of interest, relative (0.005 = 0.5 %)
    warmup_s: float = 60.0  # minimum warm-up discarded after every change (detection may extend it)
    sample_interval_s: float = 1.0  # one sample (window) per host every this many seconds
    sample_cap: int = 30_000  # samples per host before "inconclusive"
    seed: int = 0
    # crossover period length: "swap" (3x the swap cost) or "auto" (the length minimising
    # the expected host time to a decision, musku.abtest.periods)
    period: str = "swap"


@dataclass(frozen=True)
class Sample:
    """One measurement window of one host."""

    host: str
    t: float  # host-clock seconds at the window's end
    duration: float  # window length, seconds
    metrics: Mapping[str, float]  # "mips", "qps", "p99_ms", "qos_violation_rate", "power_w", ...
    valid: bool = True  # False when the knob state drifted during the window (outside change)
    note: str = ""


@dataclass(frozen=True)
class ComparisonSpec:
    """Everything an A/B comparison needs besides the hosts and the two configurations."""

    metric: str = "mips"
    direction: Direction = Direction.HIGHER
    guardrails: tuple[Guardrail, ...] = ()
    stats: StatsSettings = field(default_factory=StatsSettings)
    reboot_knobs: frozenset[str] = frozenset()  # knobs whose change needs a reboot here


class Decision(enum.Enum):
    """Outcome of one A/B comparison (B = candidate, A = baseline)."""

    BETTER = "better"  # interval excludes 0 on the good side
    WORSE = "worse"  # interval excludes 0 on the bad side
    NO_DIFFERENCE = "no_difference"  # interval inside +-min_effect: no meaningful difference
    INCONCLUSIVE = "inconclusive"  # sample cap reached first
    # a futility stop (opt-in per comparison, rule option ``futility``): "effect >= bar"
    # rejected at alpha by a one-sided SPRT; says nothing about worse or equivalent
    NOT_BETTER = "not_better"
    GUARDRAIL = "guardrail"  # candidate broke a guardrail: pruned
    ABORTED = "aborted"  # interrupted or a host failed; not a result

    @property
    def final(self) -> bool:
        return self is not Decision.ABORTED


@dataclass(frozen=True)
class TimeBreakdown:
    """Where a comparison's host time went (host seconds, issue 31 item 5): ``measuring``
    (windows the test used, and invalid ones), ``warmup`` (windows discarded as warm-up,
    including those dropped after the fact when a later swap measured a longer transient),
    ``switching`` (applies that need no reboot) and ``reboots`` (applies that rebooted a host:
    the whole apply counts, the reboot dominates it). They add up to the comparison's
    ``host_time_s``; host-hours are twice that (two hosts)."""

    measuring_s: float = 0.0
    warmup_s: float = 0.0
    switching_s: float = 0.0
    reboot_s: float = 0.0

    PARTS = ("measuring", "warmup", "switching", "reboots")

    @property
    def total_s(self) -> float:
        return self.measuring_s + self.warmup_s + self.switching_s + self.reboot_s

    def seconds(self) -> tuple[float, float, float, float]:
        """The four parts in :data:`PARTS` order."""
        return (self.measuring_s, self.warmup_s, self.switching_s, self.reboot_s)

    def as_dict(self) -> dict[str, float]:
        """``{"measuring_s": ..., "warmup_s": ..., "switching_s": ..., "reboot_s": ...}``."""
        return {
            "measuring_s": self.measuring_s,
            "warmup_s": self.warmup_s,
            "switching_s": self.switching_s,
            "reboot_s": self.reboot_s,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, object]) -> TimeBreakdown:
        """Inverse of :meth:`as_dict` (missing parts are 0)."""

        def num(key: str) -> float:
            value = data.get(key, 0.0)
            return float(value) if isinstance(value, int | float) else 0.0

        return cls(num("measuring_s"), num("warmup_s"), num("switching_s"), num("reboot_s"))

    def __add__(self, other: TimeBreakdown) -> TimeBreakdown:
        return TimeBreakdown(
            self.measuring_s + other.measuring_s,
            self.warmup_s + other.warmup_s,
            self.switching_s + other.switching_s,
            self.reboot_s + other.reboot_s,
        )

    def scaled(self, factor: float) -> TimeBreakdown:
        return TimeBreakdown(*(x * factor for x in self.seconds()))

    @classmethod
    def total(cls, results: Iterable[ComparisonResult]) -> tuple[TimeBreakdown, int]:
        """The sum of the results' breakdowns, and how many results had none recorded."""
        out, missing = cls(), 0
        for r in results:
            if r.time is None:
                missing += 1
            else:
                out = out + r.time
        return out, missing


@dataclass(frozen=True)
class ComparisonResult:
    """What one A/B comparison found. ``estimate`` and the interval are relative effects of
    B over A in the metric's good direction: +0.045 means B is 4.5 % better."""

    baseline: Configuration
    candidate: Configuration
    decision: Decision
    estimate: float
    ci_low: float
    ci_high: float
    samples: int  # samples (windows) used per host, after warm-up discard
    host_time_s: float  # host time the comparison took, including warm-up and reboots
    reason: str
    guardrail_values: Mapping[str, float] = field(default_factory=dict)
    threading: Mapping[str, str] = field(default_factory=dict)  # "A"/"B" -> threading used
    method: str = ""  # which decision rule produced it
    # where host_time_s went; None: not recorded (stored before revision 0009, multi-arm)
    time: TimeBreakdown | None = None
    # crossover period length (host seconds of steady windows; None: no crossover or not
    # recorded) and, under [statistics] period = "auto", why that length (not stored)
    period_s: float | None = None
    period_why: str = ""
    # host seconds to a decision the period cost model expected for the period used (not
    # stored; None: not estimated), musku.abtest.periods
    expected_s: float | None = None


class SweepMode(str):
    """A ``[sweep] mode``: the name of a registered sweep strategy
    (:data:`musku.registry.STRATEGIES`: ``independent``, ``exhaustive``, ``search``,
    ``multiarm``, or one a plug-in adds) or a ``module:attr``. A string; ``.value`` is the
    name, as it was when the modes were a closed enum."""

    __slots__ = ()

    @property
    def value(self) -> str:
        return str(self)


RUN_KINDS = ("sweep", "abtest", "deploy", "watch", "calibrate")
"""What a run (an ``experiments`` row) is: a sweep (any registered sweep strategy,
:data:`musku.registry.STRATEGIES`), one ``abtest``, a
``deploy``, a ``watch`` round or a pair ``calibrate``; ``experiments.mode`` holds the sweep's
mode or the other kinds' name."""


def run_kind(mode: str) -> str:
    """The kind of a run from its ``experiments.mode``: ``sweep`` for every sweep mode."""
    return mode if mode in RUN_KINDS[1:] else "sweep"


class ExperimentStatus(enum.Enum):
    """created -> running -> (interrupted -> running)* -> done | failed; ``musku abort``
    makes any unfinished run aborted (final)."""

    CREATED = "created"
    RUNNING = "running"
    INTERRUPTED = "interrupted"
    DONE = "done"
    FAILED = "failed"
    ABORTED = "aborted"  # stopped by an operator (`musku abort`)


class DeploymentStatus(enum.Enum):
    """A soft SKU's deployment (``musku sku deploy``, docs/rollout.md):
    ``canary -> rolling -> deployed``; ``rolled_back`` (the canary lost, broke a guardrail,
    a wave failed, or an operator rolled it back: every host of the deployment back at its
    baseline) or ``failed`` (the rollback itself did not complete) from ``canary``,
    ``rolling`` or ``deployed``; ``retired`` from ``deployed`` (``musku sku retire``: ended as
    planned, its hosts back at production and released)."""

    CANARY = "canary"
    ROLLING = "rolling"
    DEPLOYED = "deployed"
    ROLLED_BACK = "rolled_back"
    FAILED = "failed"
    RETIRED = "retired"

    @property
    def live(self) -> bool:
        """Its hosts (may) run the soft SKU: another deployment may not take them."""
        return self in (
            DeploymentStatus.CANARY,
            DeploymentStatus.ROLLING,
            DeploymentStatus.DEPLOYED,
        )


@dataclass(frozen=True)
class SoftSku:
    """The composed best configuration for a service on a platform, with its validations."""

    service: str
    platform: str
    configuration: Configuration
    vs_production: ComparisonResult | None = None
    vs_stock: ComparisonResult | None = None


DEFAULT_MAX_AGE_S = 7 * 86_400.0
"""A pair calibration older than this (one week) is not used for early decisions."""


@dataclass(frozen=True)
class PairCalibration:
    """A measured host bias: host 1 relative to host 0, in the metric's good direction
    (``musku pair calibrate``; :mod:`musku.abtest.calibration` uses it, the store keeps it)."""

    pair: str
    hardware: str
    metric: str
    bias: float  # relative: +0.01 = host 1 is 1 % better
    ci_low: float
    ci_high: float
    samples: int
    taken_at: datetime
    needs_recalibration: bool = False
    note: str = ""
    id: int | None = None
    # the pair's noise, measured by the same A/A (issue 30 item 4): the long-run variance of
    # one window's (CUPED-adjusted) log-ratio on ``noise_df`` degrees of freedom, for windows
    # of ``window_s`` seconds; NaN / 0: not measured (calibrations before revision 0011)
    noise_lrv: float = float("nan")
    noise_df: float = 0.0
    window_s: float = float("nan")
    # the slow wander of the pair's host bias the same A/A measured (issue 30 item 1): the
    # OU sd (relative, of the two hosts' log-ratio) and time constant; NaN: not measured
    # (calibrations before revision 0012). Comparisons use it where it is larger than the
    # rule's prior (:meth:`musku.abtest.rules.ConfidenceSequenceRule.use_wander`)
    wander_sd: float = float("nan")
    wander_tau_s: float = float("nan")

    def wander(self) -> tuple[float, float] | None:
        """(sd, tau_s) of the measured wander, or None when not measured."""
        if not (self.wander_sd >= 0 and self.wander_tau_s > 0):  # NaN compares false
            return None
        return self.wander_sd, self.wander_tau_s

    def noise_for(self, metric: str, window_s: float) -> tuple[float, float] | None:
        """(long-run variance per window of ``window_s`` seconds, degrees of freedom) of the
        pair's noise in ``metric``, or None when not measured or measured in another metric.
        The variance of a mean over a fixed time is the same whatever the windows, so it
        scales as ``self.window_s / window_s``."""
        ok = (
            metric == self.metric
            and self.noise_lrv > 0
            and self.noise_df >= 1
            and self.window_s > 0
            and window_s > 0
        )
        if not ok:  # NaN compares false: not measured
            return None
        return self.noise_lrv * self.window_s / window_s, self.noise_df

    @property
    def bound(self) -> float:
        """The calibrated bound on |bias|: the far end of its interval."""
        return max(abs(self.ci_low), abs(self.ci_high))

    def usable(
        self, hardware: str, *, now: datetime | None = None, max_age_s: float = DEFAULT_MAX_AGE_S
    ) -> tuple[bool, str]:
        """Whether early decisions may rely on it, and why not."""
        now = now or datetime.now(UTC)
        age = (now - self.taken_at).total_seconds()
        if self.needs_recalibration:
            return False, f"pair {self.pair} is marked for recalibration ({self.note})"
        if hardware != self.hardware:
            return False, f"calibration of pair {self.pair} was taken on other hardware"
        if age > max_age_s:
            return False, (
                f"calibration of pair {self.pair} is {age / 3600:.1f} h old "
                f"(max {max_age_s / 3600:.1f} h)"
            )
        return True, ""
