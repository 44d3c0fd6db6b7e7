"""Decision rules on synthetic evidence: registry, verdict logic, the paper's Welch test."""

from __future__ import annotations

import math

import numpy as np
import pytest

from musku.abtest.rules import (
    RULES,
    ConfidenceSequenceRule,
    DecisionRule,
    Evidence,
    NaivePairedRule,
    PaperWelchRule,
    RuleSetup,
    make_rule,
    pct,
    to_relative,
)
from musku.domain import Decision
from musku.errors import InputError

SETUP = RuleSetup(
    alpha=0.05, min_effect=0.005, sample_cap=30_000, batch_size=10, pilot_sd=0.02, pilot_rho=0.3
)


def evidence(batch_d: np.ndarray, sign: np.ndarray, direction: float = 1.0) -> Evidence:
    period = np.cumsum(np.r_[0, sign[1:] != sign[:-1]]).astype(np.int64)
    n = batch_d.size * 10
    return Evidence(
        batch_d=batch_d,
        batch_sign=sign.astype(np.int8),
        batch_period=period,
        log_a=np.zeros(n),
        log_b=np.zeros(n),
        direction=direction,
        samples=n,
        batch_size=10,
    )


def crossover_data(mu: float, delta: float, sd: float, n: int, seed: int) -> Evidence:
    rng = np.random.default_rng(seed)
    sign = np.repeat(np.tile([1, -1], n // 20 + 1), 10)[:n]
    return evidence(mu + delta * sign + sd * rng.standard_normal(n), sign)


def test_registry_names_resolve() -> None:
    assert set(RULES) >= {"cs", "naive-paired", "welch"}
    assert isinstance(make_rule("cs", seed=1), ConfidenceSequenceRule)
    assert isinstance(make_rule("naive-paired"), NaivePairedRule)
    assert isinstance(make_rule("welch"), PaperWelchRule)
    assert isinstance(make_rule("musku.abtest.rules:PaperWelchRule"), PaperWelchRule)
    rule = PaperWelchRule(check_every=20)
    assert make_rule(rule) is rule
    with pytest.raises(InputError, match="unknown decision rule"):
        make_rule("sprt")
    with pytest.raises(InputError, match="check_every"):
        make_rule("welch", check_every=1)


def test_seed_randomises_first_role_order_reproducibly() -> None:
    orders = [ConfidenceSequenceRule(seed=s).first_order() for s in range(40)]
    assert set(orders) == {1, -1}
    assert orders == [ConfidenceSequenceRule(seed=s).first_order() for s in range(40)]
    assert {PaperWelchRule(seed=s).first_order() for s in range(10)} == {1}


def test_cs_rule_decisions() -> None:
    rule = ConfidenceSequenceRule(seed=0)
    rule.start(SETUP)
    better = rule.look(crossover_data(0.03, 0.01, 0.01, 60, 1))
    assert better.decision is Decision.BETTER and better.ci_low > 0
    assert better.estimate == pytest.approx(math.expm1(0.03), abs=0.005)
    worse = rule.look(crossover_data(-0.03, 0.01, 0.01, 60, 1))
    assert worse.decision is Decision.WORSE and worse.ci_high < 0
    same = rule.look(crossover_data(0.0, 0.01, 0.002, 60, 1))
    assert same.decision is Decision.NO_DIFFERENCE
    assert -0.005 < same.ci_low < same.ci_high < 0.005
    unsure = rule.look(crossover_data(0.002, 0.01, 0.05, 60, 1))
    assert unsure.decision is None and unsure.ci_low < 0 < unsure.ci_high


def test_cs_rule_waits_for_both_role_orders_and_enough_batches() -> None:
    rule = ConfidenceSequenceRule(seed=0)
    rule.start(SETUP)
    one_order = evidence(np.full(30, 0.05), np.ones(30))
    v = rule.look(one_order)
    assert v.decision is None and v.ci_low == -math.inf and v.ci_high == math.inf
    few = crossover_data(0.05, 0.0, 0.001, 30, 2)
    few = evidence(few.batch_d[:12], np.r_[np.ones(10), -np.ones(2)])
    assert rule.look(few).decision is None  # only 2 batches of the second order


def test_cs_interval_wider_than_fixed_sample_interval() -> None:
    rule = ConfidenceSequenceRule(seed=0)
    rule.start(SETUP)
    ev = crossover_data(0.01, 0.0, 0.02, 200, 3)
    v = rule.look(ev)
    se = 0.02 / math.sqrt(200)
    assert (math.log1p(v.ci_high) - math.log1p(v.ci_low)) / 2 > 1.96 * se * 1.2


def test_naive_rule_is_fooled_by_bias() -> None:
    rule = NaivePairedRule(seed=0)
    rule.start(SETUP)
    ev = evidence(0.01 + 0.001 * np.random.default_rng(4).standard_normal(40), np.ones(40))
    v = rule.look(ev)
    assert v.decision is Decision.BETTER  # a pure host bias read as an effect


def test_welch_rule_matches_scipy() -> None:
    from scipy.stats import ttest_ind

    rng = np.random.default_rng(5)
    a = rng.normal(0.0, 0.05, 400)
    b = rng.normal(0.012, 0.08, 300)
    rule = PaperWelchRule()
    rule.start(SETUP)
    ev = Evidence(
        batch_d=np.zeros(0),
        batch_sign=np.zeros(0, dtype=np.int8),
        batch_period=np.zeros(0, dtype=np.int64),
        log_a=a,
        log_b=b,
        direction=1.0,
        samples=400,
        batch_size=50,
    )
    v = rule.look(ev)
    res = ttest_ind(b, a, equal_var=False)
    ci = res.confidence_interval(0.95)
    assert math.log1p(v.ci_low) == pytest.approx(ci.low, rel=1e-9)
    assert math.log1p(v.ci_high) == pytest.approx(ci.high, rel=1e-9)
    assert (v.decision is not None) == (res.pvalue < 0.05)


def test_relative_effect_conventions() -> None:
    assert to_relative(math.log(1.05), 1.0) == pytest.approx(0.05)
    # lower is better: B/A = 0.95 (5 % lower p99) is +5 %; x = -log(0.95)
    assert to_relative(-math.log(0.95), -1.0) == pytest.approx(0.05)
    assert to_relative(-math.inf, 1.0) == -1.0 and to_relative(math.inf, -1.0) == 1.0
    assert pct(0.039) == "+3.90 %" and pct(-0.0051) == "-0.51 %" and pct(math.nan) == "n/a"


def test_custom_rule_plugs_in() -> None:
    from musku.abtest import run_comparison
    from tests.abtest.fakes import A, B, FakePair, freq_level
    from tests.abtest.test_driver import SPEC

    class AlwaysBetter(DecisionRule):
        name = "always"

        def look(self, ev: Evidence):  # type: ignore[no-untyped-def]
            from musku.abtest.rules import Verdict

            return Verdict(Decision.BETTER, 0.1, 0.05, 0.15)

    r = run_comparison(FakePair(freq_level(0.0), seed=1), A, B, SPEC, rule=AlwaysBetter(seed=0))
    assert r.decision is Decision.BETTER and r.method == "always"
