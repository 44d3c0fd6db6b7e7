"""A knob's unimodal walk (issue 31 item 3): it stops at a setting past its best (not a
significant gain, below an earlier one that was)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from musku.domain import Decision
from musku.experiment import load_experiment
from musku.hosts.pool import open_pool
from musku.sweep.runner import KnobOutcome, Runner
from musku.sweep.strategies import _past_best, _walk
from musku.sweep.sweep import open_pair
from tests.fixtures.toy import EXPERIMENT, MODEL

# shp's response peaks at 64 pages (+2 %) and is flat past it: 128 measures no difference,
# 256 loses (a walk past its best)
PEAKED = MODEL.replace('"64" = 1.01', '"64" = 1.02').replace('"128" = 1.02', '"128" = 1.0')
PEAKED = PEAKED.replace('"256" = 1.015', '"256" = 0.99')


def _experiment(tmp_path: Path, fleet: int | None = None) -> Any:
    tmp_path.mkdir(parents=True, exist_ok=True)
    (tmp_path / "toy-model.toml").write_text(PEAKED)
    text = EXPERIMENT.format(name="toy", mode="independent")
    if fleet is not None:
        text = text.replace("[hosts]\n", f"[hosts]\nfleet = {fleet}\n")
    path = tmp_path / "toy.toml"
    path.write_text(text)
    return load_experiment(path)


def _outcome(exp: Any) -> KnobOutcome:
    base = exp.baseline_config
    return KnobOutcome(knob="shp", baseline_value=base["shp"], best_value=base["shp"])


def test_a_walk_stops_at_the_first_setting_past_its_best(tmp_path: Path) -> None:
    """On one simulated pair: 64 is a gain, 128 no significant gain and below it, so the
    walk stops there and 256 is not measured (before, only two losses that get worse
    stopped a walk: 256 would have been measured too)."""
    exp = _experiment(tmp_path)
    runner = Runner(exp, open_pair(exp, seed=3), seed=3)
    base = exp.baseline_config
    out = _walk(runner, "knob:shp", base, _outcome(exp), [64, 128, 256], unimodal=True)
    got = [(r.candidate["shp"], r.decision) for r in out.results]
    assert got[0] == (64, Decision.BETTER), out.results
    assert [v for v, _ in got] == [64, 128] and got[1][1] is not Decision.BETTER
    assert out.skipped == [256]
    # without the unimodal stop the walk measures everything
    full = _walk(runner, "knob:shp", base, _outcome(exp), [64, 128, 256], unimodal=False)
    assert [r.candidate["shp"] for r in full.results] == [64, 128, 256] and not full.skipped


def test_past_best_needs_a_gain_before_and_a_lower_non_gain_now() -> None:
    from musku.domain import ComparisonResult, Configuration

    def res(decision: Decision, est: float) -> ComparisonResult:
        c = Configuration.of(shp=0)
        return ComparisonResult(
            baseline=c,
            candidate=c,
            decision=decision,
            estimate=est,
            ci_low=est - 0.01,
            ci_high=est + 0.01,
            samples=1,
            host_time_s=1.0,
            method="",
            reason="",
        )

    gain = res(Decision.BETTER, 0.02)
    assert _past_best(gain, res(Decision.NO_DIFFERENCE, 0.001))
    assert _past_best(gain, res(Decision.WORSE, -0.01))
    assert not _past_best(None, res(Decision.NO_DIFFERENCE, 0.001))  # nothing gained yet
    assert not _past_best(gain, res(Decision.BETTER, 0.01))  # still a gain: the run-off's
    assert not _past_best(gain, res(Decision.INCONCLUSIVE, 0.03))  # above the best


def test_a_walk_with_idle_pairs_for_two_pools_measures_settings_side_by_side(
    tmp_path: Path,
) -> None:
    """One walk task on a pool of 9 pairs (its expected cost makes no pool pay at its
    start, so 8 pairs idle): it takes them and measures 64 and 128 at once, each pooled
    over a share (5 and 4 pairs), so its clock is the longer of the two, not their sum;
    128 is past the best, so 256 is skipped. Fewer idle pairs than two pools: one at a
    time, as on one pair."""
    exp = _experiment(tmp_path / "pool", fleet=18)
    pool = open_pool(exp, seed=3, open_pair=lambda e, s: open_pair(e, seed=s))
    runner = Runner(exp, pool.pairs[pool.live()[0]], seed=3, pool=pool)
    base = exp.baseline_config

    def work(r: Runner, _: int) -> KnobOutcome:
        return _walk(r, "knob:shp", base, _outcome(exp), [64, 128, 256], unimodal=True)

    try:
        [out] = runner.map(work, [0], tag="w", cost=[1.0], cost_at=lambda i, k: 1.0)
    finally:
        pool.close()
    assert [r.candidate["shp"] for r in out.results] == [64, 128]
    assert out.results[0].decision is Decision.BETTER
    assert out.skipped == [256]
    [span] = runner.timeline
    assert span.joins == ((0.0, 8),)  # every idle pair joined the walk at its start
    took = [r.host_time_s for r in out.results]
    assert runner.clock_s == max(took) < sum(took)
    assert [
        "pooled over 5 pairs" in out.results[0].method,
        "pooled over 4 pairs" in out.results[1].method,
    ] == [True, True]
