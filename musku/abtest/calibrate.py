"""The A/A that calibrates a pair: measure its host bias through the driver and return the
:class:`~musku.abtest.calibration.PairCalibration` (which, with the pair's memory, lives below
the driver in :mod:`musku.abtest.calibration`)."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

from musku.abtest.calibration import PairCalibration, pair_identity
from musku.abtest.driver import run_comparison
from musku.abtest.rules import CalibrationRule


def calibrate_pair(
    pair: Any,
    config: Any,
    spec: Any,
    *,
    precision: float = 0.0025,
    seed: int | None = None,
    on_window: Callable[[list[dict[str, Any]]], None] | None = None,
    should_stop: Callable[[], bool] | None = None,
) -> tuple[PairCalibration | None, Any]:
    """An A/A on ``pair`` (``config`` on both hosts, roles swapped every period): measure the
    host bias until its confidence sequence is within ``precision`` (relative) of the estimate
    or the sample cap is reached; the pair's noise (the long-run variance of a window's
    log-ratio, :meth:`CalibrationRule.noise_measured`) and the slow wander of its host bias (OU sd
    and time constant, :meth:`CalibrationRule.wander_measured`) are measured by the same A/A;
    the bias's interval includes the wander's part with the larger of the measured wander and
    the rule's prior. Returns (calibration or None when it could not be measured,
    the comparison result)."""
    rule = CalibrationRule(seed=seed if seed is not None else spec.stats.seed, precision=precision)
    result = run_comparison(
        pair, config, config, spec, on_window=on_window, should_stop=should_stop, rule=rule
    )
    measured = rule.wander_measured()
    if measured is not None and rule.last_evidence is not None:
        # the bias interval with the wander this A/A measured (where larger than the prior)
        old = rule.last_detail
        rule.use_wander(measured.sd, measured.tau_s, "measured")
        rule.look(rule.last_evidence)
        if old and old in result.reason:
            result = replace(result, reason=result.reason.replace(old, rule.last_detail))
    got = rule.bias_interval(1.0 - spec.stats.confidence, wander=True)
    if got is None:
        return None, result
    bias, lo, hi = got
    key, hw = pair_identity(pair.describe())
    direction = 1.0 if spec.direction.value == "higher" else -1.0
    rel = [math.expm1(direction * v) for v in (bias, lo, hi)]
    lo_r, hi_r = sorted(rel[1:])
    cal = PairCalibration(
        pair=key,
        hardware=hw,
        metric=spec.metric,
        bias=rel[0],
        ci_low=lo_r,
        ci_high=hi_r,
        samples=result.samples,
        taken_at=datetime.now(UTC),
    )
    if measured is not None:
        cal = replace(cal, wander_sd=measured.sd, wander_tau_s=measured.tau_s)
    noise = rule.noise_measured()
    if noise is not None:
        lrv, df = noise
        cal = replace(cal, noise_lrv=lrv, noise_df=df, window_s=spec.stats.sample_interval_s)
    return cal, result
