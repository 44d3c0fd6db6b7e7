"""The simulated group and the scan runner on the shipped Web/Skylake model."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from musku.design.group import run_scan
from musku.domain import Decision
from musku.errors import InputError
from musku.experiment import load_experiment
from musku.sim.group import SimGroup
from musku.sim.model import SimModel

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def web():  # type: ignore[no-untyped-def]
    exp = load_experiment(ROOT / "experiments" / "web-skylake.toml")
    model = SimModel.load(exp.resolve(exp.hosts.options["model"]), space=exp.space)
    return exp, model


def test_group_hosts_share_the_load_and_keep_their_bias(web) -> None:  # type: ignore[no-untyped-def]
    exp, model = web
    g = SimGroup(model, 4, seed=3, bias_sd=0.03, initial=exp.baseline_config)
    y = np.log(g.measure(4000))
    # the common load dominates each host's series; differences remove it (what is left:
    # each host's slope on the load, its routing share and slow wander, a few 0.1 %)
    assert np.corrcoef(y[:, 0], y[:, 1])[0, 1] > 0.5
    rel = (y - y[:, :1]).mean(axis=0)
    expected = np.log1p(g.bias) - np.log1p(g.bias[0])
    np.testing.assert_allclose(rel, expected, atol=0.01)
    assert np.ptp(expected) > 0.03
    assert g.t == pytest.approx(4000.0)


def test_apply_changes_throughput_and_costs_time(web) -> None:  # type: ignore[no-untyped-def]
    exp, model = web
    base = exp.baseline_config
    g = SimGroup(model, 2, seed=1, bias_sd=0.0, initial=base)
    cost = g.apply([base, base.with_("prefetch", "all_off")])
    assert cost == pytest.approx(model.timing.apply_s)
    g.measure(600)  # past the warm-up
    y = np.log(g.measure(3000))
    assert (y[:, 1] - y[:, 0]).mean() == pytest.approx(np.log(0.955), abs=0.004)
    assert g.apply([base, base.with_("prefetch", "all_off")]) == 0.0  # nothing changed


def test_scan_prefers_the_baseline_when_every_setting_loses(web) -> None:  # type: ignore[no-untyped-def]
    exp, model = web
    base = exp.baseline_config
    values = [v for v in exp.space["prefetch"] if v != base["prefetch"]]
    arms = [base, *(base.with_("prefetch", v) for v in values)]
    for seed in range(3):
        g = SimGroup(model, len(arms), seed=seed, initial=base)
        r = run_scan(g, arms, exp.stats)
        assert r.outcome.stop and r.best == base
        assert len(arms) - 1 in r.outcome.eliminated  # all_off, -4.5 %
        assert r.host_hours == pytest.approx(len(arms) * r.host_time_s / 3600)


def test_scan_finds_shp_300(web) -> None:  # type: ignore[no-untyped-def]
    exp, model = web
    base = exp.baseline_config
    values = [v for v in exp.space["shp"] if v != base["shp"]]
    arms = [base, *(base.with_("shp", v) for v in values)]
    g = SimGroup(model, len(arms), seed=7, initial=base)
    r = run_scan(g, arms, exp.stats)
    assert r.outcome.decision is Decision.BETTER and r.best["shp"] == 300


def test_bad_group(web) -> None:  # type: ignore[no-untyped-def]
    exp, model = web
    with pytest.raises(InputError, match=">= 2 hosts"):
        SimGroup(model, 1)
    g = SimGroup(model, 3, initial=exp.baseline_config)
    with pytest.raises(InputError, match="one configuration per host"):
        g.apply([exp.baseline_config])
    with pytest.raises(InputError, match="group of 2 hosts or a multiple of 2, not 3"):
        run_scan(g, [exp.baseline_config] * 2)


def test_two_squares_decide_after_one_cycle(web) -> None:  # type: ignore[no-untyped-def]
    """Two Williams squares side by side (14 hosts, 7 arms): every stratum has two observations
    after one cycle, so the scan can decide then; one square needs two cycles."""
    exp, model = web
    base = exp.baseline_config
    arms = [base, *(base.with_("shp", v) for v in exp.space["shp"] if v != base["shp"])]
    cycle = 2 * len(arms)  # odd: the square and its mirror
    got = {}
    for reps in (1, 2):
        g = SimGroup(model, reps * len(arms), seed=7, initial=base)
        r = run_scan(g, arms, exp.stats)
        assert r.replicas == reps and r.hosts == reps * len(arms)
        assert r.outcome.decision is Decision.BETTER and r.best["shp"] == 300
        got[reps] = r
    assert got[1].periods >= 2 * cycle
    assert got[2].periods == cycle  # decided at the first look it could take
    assert got[2].host_time_s < 0.6 * got[1].host_time_s
    assert "2 replicated squares" in got[2].method


def test_replicated_aa_claims_nothing(web) -> None:  # type: ignore[no-untyped-def]
    """Five identical arms on two squares (10 hosts): no seed claims a difference (the A/A
    family-wise rate, 0 of 40 seeds in docs/design.md's check)."""
    exp, model = web
    arms = [exp.baseline_config] * 5
    for seed in range(12):
        g = SimGroup(model, 10, seed=1000 + seed, initial=exp.baseline_config)
        r = run_scan(g, arms, exp.stats)
        assert not r.outcome.claimed_difference, (seed, r.outcome)
        assert r.outcome.best == 0 and r.outcome.decision is Decision.NO_DIFFERENCE


def test_a_group_that_is_not_whole_squares_is_refused(web) -> None:  # type: ignore[no-untyped-def]
    exp, model = web
    g = SimGroup(model, 4, initial=exp.baseline_config)
    with pytest.raises(InputError, match="3-arm scan needs a group of 3 hosts or a multiple"):
        run_scan(g, [exp.baseline_config] * 3)
