"""The tester's futility stop (rule option ``futility``, docs/abtest.md "The futility stop"):
a comparison that asks only "is the candidate better by at least the bar?" ends
``not_better`` once a one-sided SPRT rejects "effect >= bar"; BETTER is decided as before."""

from __future__ import annotations

import math
import tomllib
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from musku.abtest import run_comparison, stats
from musku.abtest.pooled import run_pooled_comparison
from musku.abtest.rules import make_rule
from musku.domain import ComparisonSpec, Configuration, Decision, StatsSettings
from musku.errors import InputError
from musku.sim import SimModel, SimPair

ROOT = Path(__file__).resolve().parents[2]
SPEC = ComparisonSpec(
    metric="mips",
    stats=StatsSettings(confidence=0.95, min_effect=0.005, warmup_s=60.0, sample_cap=30_000),
)
ALPHA = 0.05
M = math.log1p(0.005)


def _model(effect: float) -> tuple[SimModel, Configuration, Configuration]:
    """The shipped Web/Skylake model, the prefetcher step set to ``effect`` (the A/B
    tester bench's set-up)."""
    data = tomllib.loads((ROOT / "experiments/sim/web-skylake18.toml").read_text())
    data["knobs"]["prefetch"]["throughput"]["l2hw_dcu"] = 1.0 / (1.0 + effect)
    model = SimModel.from_dict(data, source="futility test")
    assert model.reference_config is not None
    base = model.reference_config.with_("prefetch", "l2hw_dcu")
    return model, base, base.with_("prefetch", "all_on")


# ---------------------------------------------------------------- the boundary


@settings(max_examples=300, deadline=None)
@given(
    theta=st.floats(-0.05, 0.05),
    var=st.floats(1e-8, 1e-3),
    df=st.one_of(st.just(math.inf), st.floats(3.0, 500.0)),
)
def test_a_bar_of_min_effect_is_the_equivalence_upper_side(
    theta: float, var: float, df: float
) -> None:
    """At a bar of ``min_effect`` the futility test rejects exactly when the equivalence's
    upper SPRT does ("effect >= +m" against the alternative 0): one machinery."""
    fut = stats.futility_bound(theta, var, M, ALPHA, df)
    upper = stats.sprt_bounds(theta, var, ALPHA, df)[1]
    assert (fut <= M) == (upper <= M) or math.isclose(fut, M, rel_tol=1e-9, abs_tol=1e-12)


@settings(max_examples=200, deadline=None)
@given(
    theta=st.floats(-0.05, 0.05),
    var=st.floats(1e-8, 1e-3),
    more=st.floats(1.0, 10.0),
    up=st.floats(0.0, 0.05),
)
def test_the_bound_grows_with_the_estimate_and_its_variance(
    theta: float, var: float, more: float, up: float
) -> None:
    """A noisier estimate, or a higher one, never rejects a bar the other rejected; the
    bound is always above the estimate (the stop says the effect is below it)."""
    b = stats.futility_bound(theta, var, M, ALPHA)
    assert b > theta
    assert stats.futility_bound(theta, var * more, M, ALPHA) >= b
    assert stats.futility_bound(theta + up, var, M, ALPHA) >= b


def test_no_estimate_no_bound() -> None:
    assert stats.futility_bound(math.nan, 1e-4, M, ALPHA) == math.inf
    assert stats.futility_bound(0.0, math.inf, M, ALPHA) == math.inf


@pytest.mark.parametrize("bad", [-0.01, 1.0, math.nan, True, "0.5 %"])
def test_a_bad_bar_is_refused(bad: object) -> None:
    with pytest.raises(InputError, match="futility"):
        make_rule("cs", futility=bad)


# ---------------------------------------------------------------- on the simulator


def test_an_aa_asked_against_a_high_bar_ends_not_better_long_before_no_difference() -> None:
    """A true 0 asked "better by >= 3 %?" (a walk's best so far) ends not_better, the
    reason saying what was shown with its bound, in a fraction of the samples the two-sided
    comparison needs for no_difference on the same seed."""
    model, base, _ = _model(0.01)
    for seed in (1000, 1001):
        plain = run_comparison(SimPair(model, seed=seed, initial=(base, base)), base, base, SPEC,
                               seed=seed)  # fmt: skip
        asked = run_comparison(
            SimPair(model, seed=seed, initial=(base, base)), base, base, SPEC, seed=seed,
            rule_options={"futility": 0.03},
        )  # fmt: skip
        assert plain.decision is Decision.NO_DIFFERENCE, plain.reason
        assert asked.decision is Decision.NOT_BETTER, asked.reason
        assert asked.reason.startswith("not better by +3.00 %: the effect is below +3.00 % at 95 %")
        assert "one-sided SPRT, futility bound +" in asked.reason
        assert "futility stop at +3.00 %" in asked.method
        assert asked.samples < 0.4 * plain.samples, (asked.samples, plain.samples)
        assert asked.ci_low <= 0.0 <= asked.ci_high


def test_better_is_decided_as_without_the_question() -> None:
    """BETTER comes first, from the same interval: a true +1 % asked "better by >=
    +0.5 %?" is the same run as without the question (samples, estimate, interval)."""
    model, base, cand = _model(0.01)
    for seed in (101000, 101001):
        runs = [
            run_comparison(
                SimPair(model, seed=seed, initial=(base, base)),
                base,
                cand,
                SPEC,
                seed=seed,
                rule_options=opts,
            )  # fmt: skip
            for opts in ({}, {"futility": 0.005})
        ]
        assert runs[0].decision is Decision.BETTER, runs[0].reason
        assert runs[1].decision is Decision.BETTER, runs[1].reason
        assert (runs[1].samples, runs[1].estimate, runs[1].ci_low, runs[1].ci_high) == (
            runs[0].samples, runs[0].estimate, runs[0].ci_low, runs[0].ci_high,
        )  # fmt: skip


def test_a_pooled_comparison_stops_on_the_pooled_estimate() -> None:
    """Four pairs of an A/A asked "better by >= 3 %?": not_better on the pooled estimate,
    said with the pool's strata."""
    model, base, _ = _model(0.01)
    pairs = [
        SimPair(model, seed=2100 + i, initial=(base, base), names=(f"p{i}a", f"p{i}b"))
        for i in range(4)
    ]
    r = run_pooled_comparison(pairs, base, base, SPEC, seed=21, rule_options={"futility": 0.03})
    assert r.decision is Decision.NOT_BETTER, r.reason
    assert "the effect is below +3.00 % at 95 %" in r.reason
    assert "of 4 pairs" in r.reason
