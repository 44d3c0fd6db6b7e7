"""Issue 30 item 2: the warm-up transient fitted jointly over all applies
(:mod:`musku.abtest.transient`), subtracted, its uncertainty in the interval; a drift is not
taken for a transient; the rule option ``transient = "discard"`` keeps the search per apply."""

from __future__ import annotations

import math
import tomllib
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from musku.abtest import run_comparison
from musku.abtest import transient as tr
from musku.abtest.calibration import PairMemory, pair_identity
from musku.abtest.rules import make_rule
from musku.domain import (
    ComparisonSpec,
    Configuration,
    Decision,
    PairCalibration,
    StatsSettings,
)
from musku.errors import InputError
from musku.sim import SimModel, SimPair

ROOT = Path(__file__).resolve().parents[2]
SIM_SPEC = ComparisonSpec(
    stats=StatsSettings(confidence=0.95, min_effect=0.005, warmup_s=60.0, sample_cap=30_000)
)

FIT = {"transient": "fit"}  # the rule option (the default is "discard")


def _slow_wander_plus_one_percent() -> tuple[SimModel, Configuration, Configuration]:
    """The shipped model with a per-host wander of 1 % over ~17 min and the prefetcher step
    set to exactly +1 %: the model, the baseline and the candidate."""
    data = tomllib.loads((ROOT / "experiments/sim/web-skylake18.toml").read_text())
    data["knobs"]["prefetch"]["throughput"]["l2hw_dcu"] = 1.0 / 1.01
    data.setdefault("noise", {}).update({"wander_sd": 0.01, "wander_tau_s": 1000.0})
    model = SimModel.from_dict(data, source="web-skylake18 + slow wander")
    assert model.reference_config is not None
    base = model.reference_config.with_("prefetch", "l2hw_dcu")
    return model, base, base.with_("prefetch", "all_on")


Batches = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]


def crossover(y: np.ndarray, sign: np.ndarray) -> float:
    """The tester's estimate: the mean of the two role orders' batch means."""
    return 0.5 * (float(y[sign > 0].mean()) + float(y[sign < 0].mean()))


def swaps(
    rng: np.random.Generator,
    *,
    effect: float = 0.002,
    bias: float = 0.004,
    period_s: int = 1800,
    periods: int = 8,
    batch: int = 20,
    sd: float = 0.05,
    transient: tuple[tuple[float, float], ...] = ((-0.06, 60.0), (-0.04, 400.0)),
    drift_sd: float = 0.0,
    drift_tau_s: float = 1000.0,
) -> tuple[Batches, np.ndarray]:
    """Batch means of 1-s windows of a crossover whose every period starts with an apply that
    changes both hosts (the swaps): ``effect + sign x bias + transient(age) + noise`` with
    the first 60 s after each apply discarded, and optionally a per-window OU drift of the
    log-ratio (sd ``drift_sd``, time constant ``drift_tau_s``) running across periods."""
    ys, sg, pr, a0, a1, cn = [], [], [], [], [], []
    sign = 1
    level = 0.0
    phi = math.exp(-1.0 / drift_tau_s)
    for p in range(periods):
        n = period_s // 2 if p == 0 else period_s
        ages = 60.0 + np.arange(1, n + 1, dtype=float)
        f = sum(a * np.exp(-ages / tau) for a, tau in transient)
        drift = np.empty(n)
        for i in range(n):
            level = phi * level + drift_sd * math.sqrt(1 - phi * phi) * rng.standard_normal()
            drift[i] = level
        w = effect + sign * bias + f + drift + rng.normal(0.0, sd, n)
        for k in range(n // batch):
            sl = slice(k * batch, (k + 1) * batch)
            ys.append(w[sl].mean())
            sg.append(sign)
            pr.append(p)
            a0.append(ages[sl][0])
            a1.append(ages[sl][-1])
            cn.append(batch)
        sign = -sign
    cols = tuple(np.asarray(x, dtype=float) for x in (ys, sg, pr, a0, a1, cn))
    return cols, np.ones((periods, 2), dtype=bool)  # type: ignore[return-value]


@settings(max_examples=60, deadline=None)
@given(
    age0=st.floats(0.0, 2000.0),
    count=st.integers(1, 300),
    step=st.floats(0.1, 5.0),
    tau=st.floats(1.0, 3000.0),
)
def test_batch_exp_is_the_mean_over_the_batch_windows(
    age0: float, count: int, step: float, tau: float
) -> None:
    ages = age0 + step * np.arange(count)
    want = float(np.mean(np.exp(-ages / tau)))
    got = tr.batch_exp(np.array([age0]), np.array([ages[-1]]), np.array([float(count)]), tau)[0]
    assert got == pytest.approx(want, rel=1e-9, abs=1e-300)


def test_joint_fit_recovers_a_two_exponential_transient_and_the_estimate_is_unbiased() -> None:
    """A -6 % (tau 60 s) plus -4 % (tau 400 s) transient after every swap, 8 periods of 30
    min, window noise sd 5 %: the uncorrected crossover estimate is off by more than 0.6 %;
    fitted over all applies (two exponentials where the data need them) and subtracted, it
    is unbiased (mean error within 3 standard errors over 40 pairs), the slow time constant
    is found, and the variance the fit adds covers its actual scatter. A fit whose
    time constant sits at the bound (open: the driver then decides nothing and lengthens
    the periods) is left out, at most a fifth of them."""
    rng = np.random.default_rng(2030)
    raw, corrected, slow, k2, fit_var, still_open = [], [], [], 0, [], 0
    for _ in range(40):
        (y, s, p, a0, a1, c), changed = swaps(rng)
        got = tr.fit(y, s, p, a0, a1, c, changed, tau_min=5.0)
        assert got is not None and got.k >= 1
        if got.open:  # a time constant at the bound: the driver decides nothing on it
            still_open += 1
            continue
        raw.append(crossover(y, s))
        corrected.append(crossover(y - got.correction, s))
        slow.append(max(got.taus))
        k2 += got.k == 2
        fit_var.append(got.var)
    assert still_open <= 8
    err = np.asarray(corrected) - 0.002
    assert float(np.mean(raw)) - 0.002 < -0.006
    assert abs(float(err.mean())) < 3 * float(err.std(ddof=1)) / math.sqrt(err.size)
    assert abs(float(err.mean())) < 0.001
    assert 250.0 < float(np.median(slow)) < 650.0
    assert k2 >= 10  # the second exponential is taken where the data need it
    # the estimate's scatter is the noise's plus the fit's: the fit's part is not nothing,
    # and on the conservative side (measured: its mean ~2x the whole scatter's, a few fits
    # with a poorly pinned time constant weigh most)
    assert 0.2 * float(err.var()) < float(np.mean(fit_var)) < 4.0 * float(err.var())


def test_a_pure_drift_is_not_taken_for_a_warmup() -> None:
    """No transient, a 1 % per-window drift with tau 1000 s running across 10-minute periods
    (the bench's extra slow wander): the joint fit finds no transient in most pairs, never
    a time constant beyond what the applies identify, and never leaves the comparison open
    for ever (the bound follows the longest age seen; at most a few pairs at a time)."""
    rng = np.random.default_rng(17)
    found = opened = 0
    shifts = []
    for _ in range(30):
        (y, s, p, a0, a1, c), changed = swaps(
            rng, period_s=600, periods=12, transient=(), drift_sd=0.01, sd=0.05
        )
        got = tr.fit(y, s, p, a0, a1, c, changed, tau_min=5.0)
        assert got is not None
        found += got.k > 0
        opened += got.open
        assert all(t <= got.tau_max * (1 + 1e-9) for t in got.taus)
        assert got.tau_max <= tr.TAU_SHARE * float(a1.max()) + 1e-9
        shifts.append(got.shift)
    assert found <= 6, found
    assert opened <= 6, opened
    assert abs(float(np.mean(shifts))) < 0.001


def test_rule_option_transient_is_checked_and_named_in_the_method() -> None:
    with pytest.raises(InputError, match="transient = 'nope' must be one of fit, discard"):
        make_rule("cs", seed=1, transient="nope")
    # the default stays the search per apply (the fit's false positives are not at target)
    assert "discarded to its end" in make_rule("cs", seed=1).method()
    assert "transient fitted jointly" in make_rule("cs", seed=1, transient="fit").method()


def slow_candidate_model(amp: float, tau_s: float, effect: float = 0.0) -> SimModel:
    """The shipped Web/Skylake model, prefetch all_on ``effect`` faster than l2hw_dcu and
    warming up ``amp`` slower with time constant ``tau_s`` (the bench's warm-up rows)."""
    data = tomllib.loads((ROOT / "experiments/sim/web-skylake18.toml").read_text())
    knobs = data["knobs"]["prefetch"]
    knobs["throughput"]["l2hw_dcu"] = 1.0 / (1.0 + effect)
    if amp > 0:
        knobs["warmup"] = {"all_on": {"amplitude": amp, "tau_s": tau_s}}
    return SimModel.from_dict(data, source="web-skylake18 + slow all_on warm-up")


@pytest.mark.parametrize("seed", [1000, 1001])
def test_a_long_candidate_warmup_is_fitted_not_discarded(seed: int) -> None:
    """The bench's row "candidate warm-up +10 % tau 300 s" at a true 0: the joint fit says
    what it did in the method, decides no difference (no false WORSE from the transient's
    residual) and covers 0, before the sample cap and without a warm-up cap. (In less host
    time than discarding took on these seeds, 5.5 and 5.1 h, while the first two applies
    were searched only to 0.2 x min_effect; searched as the discard mode does, so that a
    decision before the first fitted swap is as honest as discarding's, the searches hit
    their 1,200 s cap, the periods grow to ~5,000 s and it takes 5.0 and 6.7 h.)"""
    model = slow_candidate_model(0.10, 300.0)
    assert model.reference_config is not None
    base = model.reference_config.with_("prefetch", "l2hw_dcu")
    cand = base.with_("prefetch", "all_on")
    pair = SimPair(model, seed=seed, initial=(base, base))
    r = run_comparison(pair, base, cand, SIM_SPEC, seed=seed, rule_options=FIT)
    assert "transient fitted jointly over all applies" in r.method
    assert "tau" in r.method
    assert r.decision is Decision.NO_DIFFERENCE, r.reason
    assert r.ci_low <= 0.0 <= r.ci_high
    assert r.samples < SIM_SPEC.stats.sample_cap
    assert "did not end within" not in r.reason


def test_a_drifting_pair_never_ends_at_the_warmup_cap() -> None:
    """A per-host wander of 1 % over ~17 min and a true +1 %: the search per apply took the
    drift for a transient that never ends (INCONCLUSIVE at the 3,600 s warm-up cap); fitted
    jointly, the comparison decides, with the right sign."""
    model, base, cand = _slow_wander_plus_one_percent()
    pair = SimPair(model, seed=101000, initial=(base, base))
    r = run_comparison(pair, base, cand, SIM_SPEC, seed=101000, rule_options=FIT)
    assert "did not end within" not in r.reason
    assert r.decision is Decision.BETTER, r.reason


def test_quiet_only_where_no_transient_is_there() -> None:
    """``quiet`` (the driver then holds no decision for the fit): nothing fitted, nothing
    open, the best single exponential's likelihood ratio below the chi-square 0.95 level
    and no single exponential (tau up to 600 s) able to move the estimate by more than
    0.25 x min_effect (0.5 %) at 2 sd. Without a transient most pairs are quiet; with a
    -2 % / 200 s one after every swap (batch means' sd ~1.1 %) none is."""
    rng = np.random.default_rng(31)
    quiet_none = quiet_small = 0
    for _ in range(30):
        (y, s, p, a0, a1, c), changed = swaps(rng, transient=(), sd=0.05)
        got = tr.fit(y, s, p, a0, a1, c, changed, tau_min=5.0)
        assert got is not None
        if got.quiet(0.005, 600.0):
            quiet_none += 1
            assert got.k == 0 and not got.open
            assert got.bic[1] < tr.CHI2_95[len(got.pattern)]
            assert got.bound(600.0) <= tr.QUIET * 0.005
        (y, s, p, a0, a1, c), changed = swaps(rng, transient=((-0.02, 200.0),), sd=0.05)
        got = tr.fit(y, s, p, a0, a1, c, changed, tau_min=5.0)
        assert got is not None
        quiet_small += got.quiet(0.005, 600.0)
    assert quiet_none >= 15, quiet_none  # measured: 20 of 30
    assert quiet_small == 0, quiet_small


def test_a_transient_seen_over_a_few_noisy_batches_is_not_quiet() -> None:
    """The first bench of the relaxed gates (issue 30 item 2, round 2): a -5 % / 120 s
    transient after every swap, seen over a few hundred seconds of noisy batches, has a
    likelihood ratio of nothing (k = 0, below the chi-square 0.95 level in 17 of 30 such
    pairs), and deciding on it uncorrected gave 4 of 40 A/A WORSE. The bound on what one
    exponential could do to the estimate keeps every one of them from being quiet."""
    rng = np.random.default_rng(5)
    lr_only = quiet = 0
    for _ in range(30):
        (y, s, p, a0, a1, c), changed = swaps(
            rng, transient=((-0.05, 120.0),), sd=0.1, periods=3, period_s=400, batch=15
        )
        got = tr.fit(y, s, p, a0, a1, c, changed, tau_min=5.0)
        assert got is not None
        lr_only += got.k == 0 and not got.open and got.bic[1] < tr.CHI2_95[1]
        quiet += got.quiet(0.005, 400.0)
    assert lr_only >= 8, lr_only
    assert quiet == 0, quiet


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), amp=st.floats(-0.05, 0.05), tau=st.floats(20.0, 900.0))
def test_quiet_implies_nothing_fitted_and_nothing_open(seed: int, amp: float, tau: float) -> None:
    (y, s, p, a0, a1, c), changed = swaps(
        np.random.default_rng(seed), transient=((amp, tau),), periods=4, period_s=900
    )
    got = tr.fit(y, s, p, a0, a1, c, changed, tau_min=5.0)
    assert got is not None
    if got.quiet(0.005):
        assert got.k == 0 and not got.open and float(np.abs(got.correction).max()) == 0.0
        assert got.bound() <= tr.QUIET * 0.005


def test_the_wander_known_keeps_its_slopes_from_opening_the_fit() -> None:
    """Issue 30 item 2, the wander row's INCONCLUSIVE runs: a wander (sd 1 %, tau 1,000 s)
    across the first, hour-long periods puts a slope into each that the within-period trend
    test read as a transient longer than the bound (open: the periods doubled, the fit took
    the wander in them for a transient at the bound and the decision waited for the sample
    cap). With the pair's wander known, its slopes widen the test's error: no fit opens on
    it; a shared slope (a -10 % transient of tau 20,000 s after every swap, far beyond
    the bound) still opens it."""
    opened_blind = opened_known = 0
    for seed in range(40):
        (y, s, p, a0, a1, c), changed = swaps(
            np.random.default_rng(seed), period_s=3500, periods=3, batch=26, transient=(),
            drift_sd=0.01, drift_tau_s=1000.0, sd=0.02,
        )  # fmt: skip
        blind = tr.fit(y, s, p, a0, a1, c, changed, tau_min=5.0)
        known = tr.fit(y, s, p, a0, a1, c, changed, tau_min=5.0, wander=(0.01, 1000.0))
        assert blind is not None and known is not None
        opened_blind += blind.open
        opened_known += known.open
    assert opened_blind >= 4, opened_blind  # measured: 8 of 40
    assert opened_known <= 1, opened_known  # measured: 0
    shared = 0
    for seed in range(10):
        (y, s, p, a0, a1, c), changed = swaps(
            np.random.default_rng(100 + seed), period_s=3500, periods=3, batch=26,
            transient=((-0.1, 20_000.0),), sd=0.02,
        )  # fmt: skip
        got = tr.fit(y, s, p, a0, a1, c, changed, tau_min=5.0, wander=(0.01, 1000.0))
        assert got is not None
        shared += got.open
    assert shared >= 8, shared


@pytest.mark.parametrize("seed", [101001, 101003])
def test_no_transient_costs_the_fit_nothing_over_discarding(seed: int) -> None:
    """The shipped model at a true +1 % (no candidate transient): the fit used to hold the
    decision for two swaps' periods (2,974 samples on seed 101001 against discarding's
    886); where the fit sees no transient at all (quiet) it decides as discarding does."""
    model = slow_candidate_model(0.0, 0.0, effect=0.01)
    assert model.reference_config is not None
    base = model.reference_config.with_("prefetch", "l2hw_dcu")
    cand = base.with_("prefetch", "all_on")
    got = {}
    for mode in ("fit", "discard"):
        pair = SimPair(model, seed=seed, initial=(base, base))
        got[mode] = run_comparison(
            pair, base, cand, SIM_SPEC, seed=seed, rule_options={"transient": mode}
        )
        assert got[mode].decision is Decision.BETTER, got[mode].reason
    assert got["fit"].samples <= 1.25 * got["discard"].samples, (
        got["fit"].samples,
        got["discard"].samples,
    )


def test_a_wandering_pair_is_not_held_to_the_cap_by_the_fit() -> None:
    """The bench's "extra slow wander 1 % (17 min), wander calibrated, transient fit" row,
    +1 %, seed 101009 (with the calibration's measured wander, sd 1.50 %, tau 351 s): the
    wander's slope opened the fit, the periods doubled to 5,000 s, the fit took the wander
    in them for a transient at the bound (sd 3.7 %) and the comparison ended INCONCLUSIVE
    at the 30,000-sample cap. With the wander in the trend test it decides, right."""
    model, base, cand = _slow_wander_plus_one_percent()
    pair = SimPair(model, seed=101009, initial=(base, base))
    _, hw = pair_identity(pair.describe())
    cal = PairCalibration(
        pair="sim", hardware=hw, metric="mips", bias=0.0, ci_low=-0.01, ci_high=0.01,
        samples=5000, taken_at=datetime.now(UTC), id=1, wander_sd=0.015, wander_tau_s=351.0,
    )  # fmt: skip
    memory = PairMemory(calibration=cal, hardware=hw)
    r = run_comparison(
        pair, base, cand, SIM_SPEC, seed=101009, memory=memory,
        rule_options={"transient": "fit", "early": False},
    )  # fmt: skip
    assert r.decision is Decision.BETTER, r.reason
    assert r.samples < SIM_SPEC.stats.sample_cap
