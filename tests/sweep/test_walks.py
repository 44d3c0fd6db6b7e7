"""A knob's unimodal walk on a pool (issue 31 item 3): where pairs are idle for two pools
or more at its host time, it measures its next settings side by side, each pooled over a
share of them, instead of one after another."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from musku.domain import Decision
from musku.experiment import load_experiment
from musku.hosts.pool import open_pool
from musku.sweep.runner import KnobOutcome, Runner
from musku.sweep.strategies import _walk
from musku.sweep.sweep import open_pair
from tests.fixtures.toy import EXPERIMENT, MODEL

# shp's response peaks at 64 pages (+2 %), is flat at 128 and loses at 256
PEAKED = MODEL.replace('"64" = 1.01', '"64" = 1.02').replace('"128" = 1.02', '"128" = 1.0')
PEAKED = PEAKED.replace('"256" = 1.015', '"256" = 0.99')
# shp's response rising to 128 pages (+2 %), losing at 256: every setting is measured (the
# side-by-side tests; with PEAKED the futility stop ends the walk at 128, past its best)
RISING = MODEL.replace('"256" = 1.015', '"256" = 0.99')


def _experiment(tmp_path: Path, fleet: int, model: str = RISING) -> Any:
    tmp_path.mkdir(parents=True, exist_ok=True)
    (tmp_path / "toy-model.toml").write_text(model)
    text = EXPERIMENT.format(name="toy", mode="independent")
    path = tmp_path / "toy.toml"
    if fleet > 2:
        text = text.replace("[hosts]\n", f"[hosts]\nfleet = {fleet}\n")
    path.write_text(text)
    return load_experiment(path)


def _walk_on_pool(tmp_path: Path, hosts: int, model: str = RISING) -> tuple[KnobOutcome, Runner]:
    """One walk task (shp 64, 128, 256) on a pool, its expected cost making no pool pay
    at its start: every other pair is idle."""
    exp = _experiment(tmp_path, hosts, model)
    pool = open_pool(exp, seed=3, open_pair=lambda e, s: open_pair(e, seed=s))
    runner = Runner(exp, pool.pairs[pool.live()[0]], seed=3, pool=pool)
    base = exp.baseline_config

    def work(r: Runner, _: int) -> KnobOutcome:
        o = KnobOutcome(knob="shp", baseline_value=base["shp"], best_value=base["shp"])
        return _walk(r, "knob:shp", base, o, [64, 128, 256], unimodal=True)

    try:
        [out] = runner.map(work, [0], tag="w", cost=[1.0], cost_at=lambda i, k: 1.0)
    finally:
        pool.close()
    return out, runner


def test_a_walk_with_idle_pairs_for_two_pools_measures_settings_side_by_side(
    tmp_path: Path,
) -> None:
    """9 pairs, 8 idle: the walk takes them and measures 64 and 128 at once, pooled over 5
    and 4 pairs, then 256 (pooled over the pairs it holds): its clock is the longer of the
    first two plus the third, less than the three one after another."""
    out, runner = _walk_on_pool(tmp_path / "wide", 18)
    assert [r.candidate["shp"] for r in out.results] == [64, 128, 256]
    assert out.results[0].decision is Decision.BETTER and not out.skipped
    [span] = runner.timeline
    assert span.joins == ((0.0, 8),)  # every idle pair joined the walk at its start
    first, second, third = (r.host_time_s for r in out.results)
    assert runner.clock_s == max(first, second) + third < first + second + third
    assert "pooled over 5 pairs" in out.results[0].method
    assert "pooled over 4 pairs" in out.results[1].method


def test_with_idle_pairs_for_one_pool_only_the_walk_goes_one_at_a_time(tmp_path: Path) -> None:
    """5 pairs, 4 idle (one pool, not two): no side by side; the walk's comparisons one
    after another, the clock their sum."""
    out, runner = _walk_on_pool(tmp_path / "narrow", 10)
    assert [r.candidate["shp"] for r in out.results] == [64, 128, 256]
    assert runner.clock_s == sum(r.host_time_s for r in out.results)


def test_a_walk_past_its_best_ends_on_the_futility_stop(tmp_path: Path) -> None:
    """Issue 31's futility stop in the walk: after 64 pages' ``better`` (+2 %), 128 (no
    effect) is asked only "better than 64's lower bound?" and ends ``not_better`` (said with
    the bar and the bound), which ends the unimodal walk: 256 is skipped, not measured."""
    out, runner = _walk_on_pool(tmp_path / "peaked", 10, PEAKED)
    assert [r.candidate["shp"] for r in out.results] == [64, 128]
    first, second = out.results
    assert first.decision is Decision.BETTER, first.reason
    assert "futility" not in first.method  # the walk's first setting: two-sided
    assert second.decision is Decision.NOT_BETTER, second.reason
    bar = max(0.005, first.ci_low)
    assert second.reason.startswith(f"not better by {bar * 100:+.2f} %"), second.reason
    assert out.skipped == [256]
    assert runner.clock_s == first.host_time_s + second.host_time_s


def test_the_futility_bar_is_the_walk_best_lower_bound_or_min_effect() -> None:
    """A walk's next setting must beat the best ``better`` so far by its lower bound (what
    the choice's run-off calls clearly behind), and ``min_effect`` at least."""
    from musku.domain import Configuration
    from musku.sweep.strategies import futility_bar
    from musku.testing.storage import comparison_result

    base = Configuration.of({"shp": 0})
    assert futility_bar(None, 0.005) == 0.005
    strong = comparison_result(base, base.with_("shp", 64), Decision.BETTER, 0.031)
    assert futility_bar(strong, 0.005) == pytest.approx(0.019)  # its ci_low
    weak = comparison_result(base, base.with_("shp", 64), Decision.BETTER, 0.013)
    assert futility_bar(weak, 0.005) == 0.005  # ci_low +0.1 %: min_effect wins
