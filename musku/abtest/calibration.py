"""Pair calibration: the host bias of a pair measured by an A/A, and what the tester remembers
about a pair between comparisons (its calibration, each configuration's warm-up transient).

``musku pair calibrate EXPERIMENT_FILE`` runs :func:`musku.abtest.calibrate.calibrate_pair` (the
experiment's baseline on both roles, crossover periods, no early path; the workflow is
:func:`musku.sweep.calibrate_experiment`) and stores the :class:`PairCalibration` in the
results DB. This module is below the driver (which imports :class:`PairMemory`); the A/A, which
runs through the driver, is in :mod:`musku.abtest.calibrate`. :func:`musku.abtest.run_comparison` takes it (``memory=PairMemory(...)``):

- the early, pre-crossover decision is allowed only with a usable calibration, and only within
  its bound (the larger end of the bias interval, in absolute value);
- a calibration older than ``max_age_s`` or taken on other hardware is not usable: warned, the
  early path off;
- every comparison that crosses over checks its own bias estimate (a confidence sequence over
  the looks) against the bound in use; a breach marks the pair for recalibration
  (``on_breach``) and the early path stays off until a new calibration.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping, MutableMapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any

from musku.domain import DEFAULT_MAX_AGE_S, PairCalibration
from musku.errors import InputError
from musku.storage.protocols import CalibrationStore

UNCALIBRATED_BOUND = 0.01
"""Bias bound checked (never used for decisions) on a pair without a calibration."""


def pair_identity(describe: Mapping[str, Any]) -> tuple[str, str]:
    """(pair key, hardware identity) of a host pair from its ``describe()``: the hosts' names,
    and what a bias depends on besides them (backend, platform, CPU model, simulator model
    and its seed/bias), as canonical JSON."""
    hosts = describe.get("hosts") or []
    key = "+".join(str(h) for h in hosts) or "pair"
    hw_keys = ("backend", "platform", "cpu_model", "model", "model_source", "host_bias", "seed")
    hw = {k: describe[k] for k in hw_keys if k in describe and describe[k] not in (None, "")}
    if "hardware" in describe:
        hw["hardware"] = describe["hardware"]
    return key, json.dumps(hw, sort_keys=True, default=str)


@dataclass
class PairMemory:
    """What a comparison may know about its pair and gives back.

    ``transients`` maps a configuration key to the longest warm-up transient (seconds) measured
    for it on this pair; the driver discards at least that much after applying it and writes
    new measurements back (a storage-backed mapping persists them). ``on_breach(message)`` is
    called when a comparison's bias estimate lies beyond the bound in use."""

    calibration: PairCalibration | None = None
    hardware: str = ""
    max_age_s: float = DEFAULT_MAX_AGE_S
    now: datetime | None = None
    transients: MutableMapping[str, float] = field(default_factory=dict)
    on_breach: Callable[[str], None] | None = None

    def early_bound(self) -> tuple[float | None, str]:
        """(the calibrated bias bound when early decisions are allowed else None, a warning
        when a calibration exists but is not usable)."""
        cal = self.calibration
        if cal is None:
            return None, ""
        ok, why = cal.usable(self.hardware, now=self.now, max_age_s=self.max_age_s)
        if not ok:
            return None, f"{why}: early decisions off"
        return cal.bound, ""

    def breach(self, note: str) -> None:
        """A comparison's bias estimate breached the bound: no early decisions on this pair
        until it is calibrated again (and the store is told, through ``on_breach``)."""
        if self.calibration is not None and not self.calibration.needs_recalibration:
            self.calibration = replace(self.calibration, needs_recalibration=True, note=note)
        if self.on_breach is not None:
            self.on_breach(note)

    def check_bound(self) -> float:
        """The bias bound every crossover comparison is checked against."""
        cal = self.calibration
        return cal.bound if cal is not None else UNCALIBRATED_BOUND


def memory_for(
    pair: Any, store: CalibrationStore | None, *, max_age_s: float | None = None
) -> PairMemory:
    """The :class:`PairMemory` of ``pair``: its newest calibration and its per-configuration
    transients from ``store`` (a breach marks the calibration there), or an in-memory one
    shared by the comparisons of one run without a store. ``max_age_s`` defaults to
    ``$MUSKU_CALIBRATION_MAX_AGE_H`` hours, else :data:`DEFAULT_MAX_AGE_S`."""
    if max_age_s is None:
        env = os.environ.get("MUSKU_CALIBRATION_MAX_AGE_H", "")
        try:
            max_age_s = float(env) * 3600.0 if env else DEFAULT_MAX_AGE_S
        except ValueError:
            raise InputError(
                f"MUSKU_CALIBRATION_MAX_AGE_H = {env!r} must be a number of hours"
            ) from None
    key, hw = pair_identity(pair.describe())
    if store is None:
        return PairMemory(hardware=hw, max_age_s=max_age_s)

    def breach(note: str) -> None:
        store.mark_recalibration(key, note)

    return PairMemory(
        calibration=store.calibration(key),
        hardware=hw,
        max_age_s=max_age_s,
        # run-local on hosts made anew by each run (simulated): a later run of the same seed
        # must see the same windows (HostPair.persistent)
        transients=store.transients(key, hw) if getattr(pair, "persistent", True) else {},
        on_breach=breach,
    )


# --------------------------------------------------------------- what a calibration changes

EARLY_REASONS = (
    "no crossover: estimate includes the host bias",
    "one arm order only: estimate includes the arm bias",  # a switchback pair's wording
)
"""Words in a comparison's reason when it was decided before the first swap (the early path a
usable calibration allows: :meth:`musku.abtest.rules.CsRule._look_early`)."""


def decided_early(reason: str) -> bool:
    """Whether a comparison with this reason was decided before the first swap."""
    return any(words in reason for words in EARLY_REASONS)


def describe(cal: PairCalibration) -> str:
    """``calibration 3 of pair a+b (bias +0.35 % [+0.10, +0.60] %, 8,831 samples, measured
    2026-11-28 05:40 UTC)``."""
    lo, hi = cal.ci_low * 100, cal.ci_high * 100
    return (
        f"calibration {cal.id if cal.id is not None else '(unsaved)'} of pair {cal.pair} "
        f"(bias {cal.bias * 100:+.2f} % [{lo:+.2f}, {hi:+.2f}] %, bound ±{cal.bound * 100:.2f} "
        f"%, {cal.samples:,} samples, measured {cal.taken_at.astimezone(UTC):%Y-%m-%d %H:%M} UTC)"
    )


def announce(cal: PairCalibration, memory: PairMemory | None = None) -> str:
    """One line said once when a run uses ``cal``: what it is and what it does to the test.
    With ``memory``, whether it is usable (else why not: the early path stays off)."""
    what = describe(cal)
    if memory is not None:
        bound, why = memory.early_bound()
        if bound is None:
            return f"not using {what}: {why or 'early decisions off'}"
    return (
        f"using {what}: comparisons may decide before the first swap, their intervals widened "
        f"by its bound (wider intervals from fewer samples than the "
        "crossover's; `musku results NAME` says how much)"
    )


def _median(values: list[float]) -> float | None:
    if not values:
        return None
    s = sorted(values)
    mid = len(s) // 2
    return s[mid] if len(s) % 2 else (s[mid - 1] + s[mid]) / 2


@dataclass(frozen=True)
class CalibrationEffect:
    """How a run's comparisons decided before the first swap (the early path a calibration
    allows) compare with those decided after crossover: counts, median interval half-width
    (relative) and median samples per host of each group."""

    early: int
    total: int
    early_halfwidth: float | None
    crossover_halfwidth: float | None
    early_samples: float | None
    crossover_samples: float | None

    @classmethod
    def of(cls, results: Any) -> CalibrationEffect:
        """From :class:`musku.domain.ComparisonResult` objects (finished comparisons)."""
        early: list[Any] = []
        late: list[Any] = []
        for r in results:
            if not (abs(r.ci_low) < float("inf") and abs(r.ci_high) < float("inf")):
                continue  # no interval (stopped, failed): nothing to compare
            (early if decided_early(r.reason) else late).append(r)

        def hw(rs: list[Any]) -> float | None:
            return _median([(r.ci_high - r.ci_low) / 2 for r in rs])

        def n(rs: list[Any]) -> float | None:
            return _median([float(r.samples) for r in rs])

        return cls(len(early), len(early) + len(late), hw(early), hw(late), n(early), n(late))

    def to_dict(self) -> dict[str, Any]:
        return {
            "decided_early": self.early,
            "comparisons": self.total,
            "early_median_halfwidth": self.early_halfwidth,
            "crossover_median_halfwidth": self.crossover_halfwidth,
            "early_median_samples": self.early_samples,
            "crossover_median_samples": self.crossover_samples,
        }

    def text(self) -> str:
        """One line; "" when nothing was decided early."""
        if not self.early or self.early_halfwidth is None:
            return ""
        out = (
            f"{self.early} of {self.total} comparisons decided before the first swap "
            f"(the calibration's early path): median interval ±{self.early_halfwidth * 100:.2f} %"
            f" from {self.early_samples:,.0f} samples"
        )
        if self.crossover_halfwidth and self.crossover_samples:
            out += (
                f", against ±{self.crossover_halfwidth * 100:.2f} % from "
                f"{self.crossover_samples:,.0f} for the ones decided after crossover: "
                f"{self.early_halfwidth / self.crossover_halfwidth:.1f}x wider, "
                f"{self.crossover_samples / max(1.0, self.early_samples or 1.0):.1f}x fewer "
                "samples"
            )
        return out


def calibrations_used(store: CalibrationStore, run: Any, comparisons: Any) -> list[PairCalibration]:
    """The calibrations a stored run used: for each pair whose comparisons were decided
    before the first swap, the newest calibration taken before the run started (calibration
    rows are never rewritten but for their recalibration flag)."""
    when = run.started_at or run.created_at
    pairs = sorted(
        {
            "+".join(c.hosts)
            for c in comparisons
            if c.result is not None and c.hosts and decided_early(c.result.reason)
        }
    )
    found = [store.calibration_before(p, when) for p in pairs] if when is not None else []
    return [c for c in found if c is not None]
