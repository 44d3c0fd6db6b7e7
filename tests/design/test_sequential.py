"""The multi-arm procedure on synthetic batches: host bias cancels, elimination picks the right
arms, the cap gives INCONCLUSIVE, and an A/A family stays within its error rate."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.stats import binom

from musku.design.sequential import MultiArmProcedure, contrast_estimate
from musku.design.williams import williams
from musku.domain import Decision
from musku.errors import InputError


def feed(
    effects: list[float],
    *,
    seed: int,
    bias_sd: float = 0.02,
    noise: float = 0.004,
    per_period: int = 4,
    cap: int = 400,
    min_effect: float = 0.005,
) -> tuple[MultiArmProcedure, object]:
    """Batches of a Williams rotation: arm a on host h in period p gives
    effect[a] + bias[h] + load(p, batch) + noise; stops when the procedure does."""
    n = len(effects)
    rng = np.random.default_rng(seed)
    d = williams(n)
    bias = rng.normal(0, bias_sd, n)
    proc = MultiArmProcedure(n, d.shape[0], min_effect=min_effect, cap_batches=cap)
    p = 0
    while True:
        row = d[p % d.shape[0]]
        for _ in range(per_period):
            load = rng.normal(0, 0.05)  # common to every host: cancels
            host_val = np.array([effects[a] for a in row]) + bias + load
            host_val += rng.normal(0, noise, n)
            arm_means = np.empty(n)
            arm_means[row] = host_val
            proc.add(arm_means, p % d.shape[0])
            out = proc.look()
            if out.stop:
                return proc, out
        p += 1


def test_contrast_estimate_removes_host_bias() -> None:
    """Hosts 3 % apart, no effect: the stratified mean is ~0 where the plain mean of the
    batch contrasts (unequal stratum counts) is not."""
    rng = np.random.default_rng(1)
    n = 3
    d = williams(n)
    bias = np.array([0.0, 0.03, -0.03])
    ds, strata = [], []
    for p in range(d.shape[0]):
        reps = 9 if p == 0 else 2  # unbalanced batch counts across strata
        host_of = np.argsort(d[p])
        for _ in range(reps):
            ds.append(bias[host_of[1]] - bias[host_of[0]] + rng.normal(0, 1e-4))
            strata.append(p)
    got = contrast_estimate(np.array(ds), np.array(strata), d.shape[0])
    assert got is not None
    mean, se, _, _ = got
    assert abs(mean) < 5e-4 and se < 1e-3
    assert abs(float(np.mean(ds))) > 5e-3  # what ignoring the strata would report
    assert contrast_estimate(np.array(ds[:3]), np.array(strata[:3]), d.shape[0]) is None


def test_elimination_finds_the_best_arm() -> None:
    proc, out = feed([0.0, -0.05, 0.03, 0.0, 0.01], seed=3)
    assert out.stop and out.decision is Decision.BETTER and out.best == 2
    assert out.eliminated[1] == "arm 0 is better" or out.eliminated[1].startswith("arm ")
    assert set(out.eliminated) == {0, 1, 3, 4}
    assert out.vs_baseline[1] is Decision.WORSE and out.vs_baseline[2] is Decision.BETTER


def test_all_worse_keeps_the_baseline() -> None:
    _, out = feed([0.0, -0.02, -0.03, -0.04], seed=4)
    assert out.stop and out.best == 0 and out.decision is Decision.NO_DIFFERENCE
    assert out.active == (0,)


def test_equivalent_arms_stop_within_min_effect() -> None:
    _, out = feed([0.0, 0.0005, -0.0005], seed=5, noise=0.001, bias_sd=0.0, min_effect=0.01)
    assert out.stop and out.best == 0
    assert out.decision is Decision.NO_DIFFERENCE


def test_sample_cap_is_inconclusive() -> None:
    _, out = feed([0.0, 0.004, 0.0045], seed=6, noise=0.05, cap=40)
    assert out.decision is Decision.INCONCLUSIVE and out.reason == "sample cap reached"
    assert out.best in out.active


def test_aa_family_wise_error() -> None:
    """4 identical arms on hosts 2 % apart, 40 seeded runs: the family-wise rate of any claimed
    difference is <= 5 % by design; fail only beyond the 99.9 % binomial quantile of 5 % (7 of
    40; ignoring the host bias or the multiplicity claims a difference in most runs)."""
    runs = 40
    hits = 0
    for seed in range(runs):
        _, out = feed([0.0] * 4, seed=100 + seed, noise=0.01, cap=80, min_effect=0.002)
        hits += out.claimed_difference
    assert hits <= int(binom.ppf(0.999, runs, 0.05)), hits


def test_bonferroni_level() -> None:
    proc = MultiArmProcedure(5, 10, alpha=0.05)
    assert len(proc.pairs) == 10 and math.isclose(proc.alpha_pair, 0.005)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"n_arms": 1, "n_strata": 2},
        {"n_arms": 3, "n_strata": 0},
        {"n_arms": 3, "n_strata": 3, "alpha": 0.7},
    ],
)
def test_bad_setup(kwargs: dict[str, float]) -> None:
    with pytest.raises(InputError):
        MultiArmProcedure(**kwargs)  # type: ignore[arg-type]


def test_bad_batch() -> None:
    proc = MultiArmProcedure(3, 3)
    with pytest.raises(InputError, match="one value per arm"):
        proc.add(np.zeros(2), 0)
    with pytest.raises(InputError, match="stratum"):
        proc.add(np.zeros(3), 3)
