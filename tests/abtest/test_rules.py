"""Decision rules on synthetic evidence: registry, verdict logic, the paper's Welch test."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

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
    # one role order, effect within the 1 % host-bias bound: no early decision possible
    one_order = evidence(np.full(30, 0.008), np.ones(30))
    v = rule.look(one_order)
    assert v.decision is None and v.ci_low == -math.inf and v.ci_high == math.inf
    # without the early path a large one-order effect waits for the crossover too
    no_early = ConfidenceSequenceRule(seed=0, early=False)
    no_early.start(SETUP)
    v = no_early.look(evidence(np.full(30, 0.05), np.ones(30)))
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


# ----------------------------------------------------------------- early, pre-crossover path


def one_order(mu: float, sd: float, n: int, seed: int, sign: int = 1) -> Evidence:
    rng = np.random.default_rng(seed)
    return evidence(mu + sd * rng.standard_normal(n), np.full(n, sign))


@pytest.mark.parametrize(("mu", "decision"), [(0.08, Decision.BETTER), (-0.08, Decision.WORSE)])
def test_cs_early_path_decides_a_large_effect_before_crossover(
    mu: float, decision: Decision
) -> None:
    rule = ConfidenceSequenceRule(seed=0)
    rule.start(SETUP)
    ev = one_order(mu, 0.01, 8, 1, sign=-1)
    v = rule.look(ev)
    assert v.decision is decision and v.early
    assert "host bias" in v.detail
    got = rule.early_interval(ev)
    assert got is not None
    mean, hw, widen, _ = got
    assert widen == pytest.approx(math.log1p(0.01))
    # the reported interval is the confidence sequence widened by the bias bound
    assert v.ci_low == pytest.approx(math.expm1(mean - hw - widen))
    assert v.ci_high == pytest.approx(math.expm1(mean + hw + widen))
    assert v.ci_high - v.ci_low > 0.02


def test_cs_early_path_needs_min_batches_and_a_margin_over_the_bias_bound() -> None:
    rule = ConfidenceSequenceRule(seed=0)
    rule.start(SETUP)
    assert rule.look(one_order(0.08, 0.01, 5, 1)).decision is None  # < 6 batches
    assert rule.look(one_order(0.08, 0.01, 6, 1)).decision is Decision.BETTER
    # a larger bound (here from rule options) swallows the same effect
    wide = ConfidenceSequenceRule(seed=0, max_host_bias=0.1)
    wide.start(SETUP)
    assert wide.look(one_order(0.08, 0.01, 20, 1)).decision is None
    # an A/A whose host bias stays inside the bound is never decided early
    for seed in range(20):
        assert rule.look(one_order(0.003, 0.01, 30, seed)).decision is None


def test_cs_early_promising_only_for_effects_beyond_the_bound() -> None:
    rule = ConfidenceSequenceRule(seed=0)
    rule.start(SETUP)
    assert rule.early_promising(one_order(0.05, 0.01, 4, 1), 12)
    assert not rule.early_promising(one_order(0.002, 0.01, 4, 1), 12)
    assert not rule.early_promising(one_order(0.05, 0.01, 12, 1), 12)  # at the limit
    assert not NaivePairedRule(seed=0).early


@pytest.mark.parametrize("bad", [-0.01, 0.5, "1%", True])
def test_cs_max_host_bias_option_is_checked(bad: object) -> None:
    with pytest.raises(InputError, match="max_host_bias"):
        make_rule("cs", seed=0, max_host_bias=bad)


def test_cs_early_look_with_a_huge_boundary_does_not_overflow() -> None:
    """Three noisy batches: df = 2, the Student-t boundary is astronomically wide; the
    verdict stays undecided instead of overflowing exp()."""
    rule = ConfidenceSequenceRule(seed=0)
    rule.start(SETUP)
    v = rule.look(evidence(np.array([0.5, -0.4, 0.6]), np.ones(3)))
    assert v.decision is None
    assert to_relative(1e6, 1.0) == math.inf and to_relative(1e6, -1.0) == 1.0
    assert to_relative(-1e6, 1.0) == -1.0 and to_relative(-1e6, -1.0) == -math.inf


def test_cs_equivalence_decided_on_the_one_sided_bounds() -> None:
    """NO_DIFFERENCE once the two one-sided bounds (each at alpha) lie inside +-min_effect:
    on data where they do and the two-sided interval does not yet, ``tost`` decides and
    ``interval`` (the rule before) waits; the reported interval is the two-sided one."""
    setup = RuleSetup(
        alpha=0.05, min_effect=0.005, sample_cap=30_000, batch_size=10, pilot_sd=0.02,
        pilot_rho=0.0,
    )  # fmt: skip
    found = 0
    for seed in range(200):
        ev = crossover_data(0.0, 0.01, 0.014, 80, seed)
        tost, old = (
            ConfidenceSequenceRule(seed=0, equivalence="tost"),
            ConfidenceSequenceRule(seed=0, equivalence="interval"),
        )
        tost.start(setup)
        old.start(setup)
        v, w = tost.look(ev), old.look(ev)
        assert (v.ci_low, v.ci_high) == (w.ci_low, w.ci_high)
        assert v.ci_low < v.eq_low < v.eq_high < v.ci_high
        if w.decision is Decision.NO_DIFFERENCE:
            assert v.decision is Decision.NO_DIFFERENCE  # never later than before
        if v.decision is Decision.NO_DIFFERENCE and w.decision is None:
            found += 1
            assert v.eq_low > -0.005 and v.eq_high < 0.005
            assert v.ci_low <= -0.005 or v.ci_high >= 0.005
    assert found > 0
    with pytest.raises(InputError, match="equivalence"):
        ConfidenceSequenceRule(equivalence="loose")


@settings(max_examples=200, deadline=None, derandomize=True)
@given(
    sd=st.floats(0.001, 0.05),
    bias=st.floats(-0.02, 0.02),
    n=st.integers(24, 400),
    seed=st.integers(0, 2**32 - 1),
    direction=st.sampled_from([1.0, -1.0]),
)
def test_cs_a_two_percent_effect_never_stops_no_difference_at_one_percent(
    sd: float, bias: float, n: int, seed: int, direction: float
) -> None:
    """+2 % with min_effect 1 %: whatever the noise, host bias and sample size, the equivalence
    bounds never both fall inside +-1 % (NO_DIFFERENCE would need the upper bound below 1 %,
    half the effect away)."""
    setup = RuleSetup(
        alpha=0.05, min_effect=0.01, sample_cap=30_000, batch_size=10, pilot_sd=sd,
        pilot_rho=0.0,
    )  # fmt: skip
    rule = ConfidenceSequenceRule(seed=0)
    rule.start(setup)
    ev = crossover_data(math.log(1.02), bias, sd, n, seed)
    v = rule.look(evidence(ev.batch_d, ev.batch_sign, direction))
    assert v.decision is not Decision.NO_DIFFERENCE
    assert v.decision is not Decision.WORSE


@settings(max_examples=150, deadline=None, derandomize=True)
@given(
    mu=st.floats(-0.03, 0.03),
    sd=st.floats(0.002, 0.05),
    bias=st.floats(-0.02, 0.02),
    n=st.integers(24, 300),
    seed=st.integers(0, 2**32 - 1),
    direction=st.sampled_from([1.0, -1.0]),
)
def test_cs_sprt_changes_no_better_or_worse_decision(
    mu: float, sd: float, bias: float, n: int, seed: int, direction: float
) -> None:
    """``equivalence = "sprt"`` touches NO_DIFFERENCE only: on the same data its interval,
    estimate and every BETTER / WORSE are those of ``tost``; where it decides NO_DIFFERENCE
    the SPRT bounds lie inside +-min_effect."""
    sprt = ConfidenceSequenceRule(seed=0, equivalence="sprt")
    tost = ConfidenceSequenceRule(seed=0, equivalence="tost")
    sprt.start(SETUP)
    tost.start(SETUP)
    ev = crossover_data(mu, bias, sd, n, seed)
    ev = evidence(ev.batch_d, ev.batch_sign, direction)
    v, w = sprt.look(ev), tost.look(ev)
    assert (v.estimate, v.ci_low, v.ci_high) == (w.estimate, w.ci_low, w.ci_high)
    if w.decision in (Decision.BETTER, Decision.WORSE):
        assert v.decision is w.decision
    if v.decision in (Decision.BETTER, Decision.WORSE):
        assert w.decision is v.decision
    if v.decision is Decision.NO_DIFFERENCE:
        assert -0.005 < v.eq_low < v.estimate < v.eq_high < 0.005
        assert "SPRT" in sprt.method()


def test_cs_sprt_decides_a_true_zero_sooner_than_tost() -> None:
    """Growing A/A crossovers looked at batch by batch: ``sprt`` reaches NO_DIFFERENCE
    sooner than ``tost`` in most paths and in total. Not in every path: its bound, ``theta
    +- sqrt(theta^2 + 2 V log(1 / alpha))``, is narrower than the one-sided sequence's
    near ``theta = 0`` but grows faster with ``|theta|``."""
    sooner, total = 0, [0, 0]
    for seed in range(30):
        full = crossover_data(0.0, 0.003, 0.02, 600, seed)
        stops = []
        for eq in ("sprt", "tost"):
            rule = ConfidenceSequenceRule(seed=0, equivalence=eq)
            rule.start(SETUP)
            stop = 601
            for n in range(20, 601, 20):
                ev = evidence(full.batch_d[:n], full.batch_sign[:n])
                if rule.look(ev).decision is Decision.NO_DIFFERENCE:
                    stop = n
                    break
            stops.append(stop)
        sooner += stops[0] < stops[1]
        total = [total[0] + stops[0], total[1] + stops[1]]
    assert sooner >= 20 and total[0] < 0.9 * total[1], (sooner, total)


def test_cs_sprt_keeps_a_rejected_side_until_the_batches_are_rebuilt() -> None:
    """A side rejected at a mature look stays rejected while batches are only appended
    (the bounds reported are the tightest seen); a rebuild (other batch means, another
    batch size) forgets it."""
    rule = ConfidenceSequenceRule(seed=0, equivalence="sprt")
    rule.start(SETUP)
    base = crossover_data(0.0, 0.0, 0.01, 200, 3)
    first = rule.look(evidence(base.batch_d, base.batch_sign))
    assert first.eq_high < 0.005  # "effect >= +0.5 %" rejected here
    # 20 more batches pulling the estimate up: alone they would not reject that side
    more = np.r_[base.batch_d, np.full(20, 0.02)]
    sign = np.r_[base.batch_sign, np.tile([1, -1], 10)].astype(np.int8)
    fresh = ConfidenceSequenceRule(seed=0, equivalence="sprt")
    fresh.start(SETUP)
    alone = fresh.look(evidence(more, sign))
    kept = rule.look(evidence(more, sign))
    assert alone.eq_high > first.eq_high
    assert kept.eq_high == pytest.approx(first.eq_high)
    # the same values rebuilt (one batch mean changed): forgotten
    rebuilt = more.copy()
    rebuilt[0] += 1e-9
    again = rule.look(evidence(rebuilt, sign))
    assert again.eq_high == pytest.approx(alone.eq_high, rel=1e-6)
    with pytest.raises(InputError, match="sprt"):
        ConfidenceSequenceRule(equivalence="wald")
