"""The simulator's ways of being wrong like real hosts (issue 19): per-configuration warm-ups,
warm/cold start, partly shared load, slow wander, heavy tails; bad parameters are one
``file:line`` error."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from musku.domain import Configuration
from musku.errors import InputError
from musku.sim import SimModel, SimPair
from tests.sim.test_model import GOOD, write

QUIET = {"ar_sigma": 0.0, "outlier_prob": 0.0}
FLAT_LOAD = {"diurnal_amplitude": 0.0, "burst_rate_per_h": 0.0}


def model(noise: dict[str, Any] | None = None, load: dict[str, Any] | None = None,
          extra: dict[str, Any] | None = None) -> SimModel:  # fmt: skip
    import tomllib

    data = tomllib.loads(GOOD)
    data["noise"] = {**data.get("noise", {}), **(noise or {})}
    data["noise"]["load"] = {**data["noise"].get("load", {}), **FLAT_LOAD, **(load or {})}
    for k, v in (extra or {}).items():
        data[k] = v
    return SimModel.from_dict(data, source="test")


BASE = Configuration.of(cdp="off", thp="always")


def test_per_knob_and_interaction_warmups() -> None:
    import tomllib

    data = tomllib.loads(GOOD)
    data["knobs"]["thp"]["warmup"] = {"madvise": {"amplitude": 0.1, "tau_s": 300.0}}
    data["interactions"][0]["warmup"] = {"amplitude": 0.02, "tau_s": 50.0}
    m = SimModel.from_dict(data, source="test")
    # default transient only
    assert [(w.amplitude, w.tau_s) for w in m.warmups(BASE, BASE.with_("cdp", "5:6"))] == [
        (0.05, 40.0),
        (0.02, 50.0),  # cdp on + thp always: the interaction starts to hold
    ]
    got = m.warmups(BASE, BASE.with_("thp", "madvise"))
    assert [(w.amplitude, w.tau_s) for w in got] == [(0.05, 40.0), (0.1, 300.0)]
    # going back to always: no extra transient for always
    assert len(m.warmups(BASE.with_("thp", "madvise"), BASE)) == 1


def test_candidate_warmup_shows_in_the_ratio_and_decays() -> None:
    import tomllib

    data = tomllib.loads(GOOD)
    data["knobs"]["thp"]["warmup"] = {"madvise": {"amplitude": 0.1, "tau_s": 300.0}}
    data["noise"] = {**QUIET, "load": FLAT_LOAD, "warmup": {"amplitude": 0.0, "start": "warm"}}
    m = SimModel.from_dict(data, source="test")
    pair = SimPair(m, seed=1, initial=(BASE, BASE))
    pair.apply((BASE, BASE.with_("thp", "madvise")))
    a = pair.arrays(1.0, 1800)
    r = np.log(a.mips[:, 1] / a.mips[:, 0]) - math.log(0.98 * 1.003)
    expected = np.log(1 - 0.1 * np.exp(-(np.arange(1800) + 0.5) / 300.0))
    assert np.allclose(r, expected, atol=1e-9)


@pytest.mark.parametrize("start", ["warm", "cold"])
def test_hosts_start_warm_or_cold(start: str) -> None:
    m = model({**QUIET, "warmup": {"start": start}})
    a = SimPair(m, seed=3).arrays(1.0, 5)
    first = a.mips[0, 0] / a.offered_qps[0, 0] * m.reference["qps"] / m.reference["mips"]
    assert (first < 0.97) == (start == "cold")


@pytest.mark.parametrize("corr", [0.0, 0.5, 0.9])
def test_host_load_correlation_is_the_documented_parameter(corr: float) -> None:
    m = model(QUIET, {"jitter_sigma": 0.1, "host_correlation": corr})
    a = SimPair(m, seed=4).arrays(1.0, 20_000)
    got = np.corrcoef(np.log(a.offered_qps[:, 0]), np.log(a.offered_qps[:, 1]))[0, 1]
    assert got == pytest.approx(corr, abs=0.03)
    # the hosts' throughput follows their own load: per offered request the jitter is gone
    per_req = np.log(a.mips) - np.log(a.offered_qps)
    assert np.std(per_req[:, 1] - per_req[:, 0]) < 0.01 * np.std(np.log(a.mips[:, 1]))


def test_fully_shared_load_is_the_old_model_bit_for_bit() -> None:
    a = SimPair(model(), seed=5).arrays(1.0, 500)
    b = SimPair(model(load={"host_correlation": 1.0}), seed=5).arrays(1.0, 500)
    assert np.array_equal(a.mips, b.mips)
    assert np.array_equal(a.offered_qps[:, 0], a.offered_qps[:, 1])


def test_wander_is_slow_with_the_given_sd() -> None:
    m = model({"ar_sigma": 0.0, "outlier_prob": 0.0, "wander_sd": 0.01, "wander_tau_s": 600.0,
               "warmup": {"start": "warm"}})  # fmt: skip
    a = SimPair(m, seed=6).arrays(10.0, 20_000)
    x = np.log(a.mips[:, 0] / a.offered_qps[:, 0])
    assert np.std(x) == pytest.approx(0.01, rel=0.2)
    lag1 = np.corrcoef(x[1:], x[:-1])[0, 1]
    assert lag1 == pytest.approx(math.exp(-10.0 / 600.0), abs=0.02)


def test_student_t_innovations_have_heavy_tails_and_the_same_sd() -> None:
    normal = SimPair(model({"outlier_prob": 0.0, "ar_phi": 0.0}), seed=7).arrays(1.0, 40_000)
    heavy = SimPair(model({"outlier_prob": 0.0, "ar_phi": 0.0, "innovation_df": 3.0}), seed=7)
    t3 = heavy.arrays(1.0, 40_000)

    def x(a: Any) -> np.ndarray:
        return np.log(a.mips[1000:, 0] / a.offered_qps[1000:, 0])

    from scipy.stats import kurtosis

    assert np.std(x(t3)) == pytest.approx(np.std(x(normal)), rel=0.1)
    assert kurtosis(x(t3)) > 3.0 > abs(kurtosis(x(normal))) + 2.5


def test_windows_and_window_agree_with_the_new_noise() -> None:
    m = model({"innovation_df": 4.0, "wander_sd": 0.005}, {"host_correlation": 0.7})
    p1, p2 = SimPair(m, seed=8), SimPair(m, seed=8)
    many = p1.windows(1.0, 20)
    one = [p2.window(1.0) for _ in range(20)]
    for (a0, a1), (b0, b1) in zip(many, one, strict=True):
        assert a0.metrics["mips"] == pytest.approx(b0.metrics["mips"], rel=1e-12)
        assert a1.metrics["offered_qps"] == pytest.approx(b1.metrics["offered_qps"], rel=1e-12)


@pytest.mark.parametrize(
    ("old", "new", "fragment", "line_has"),
    [
        (
            "[noise]\nar_phi = 0.6",
            "[noise]\nar_phi = 0.6\ninnovation_df = 1.5",
            "innovation_df",
            "innovation_df",
        ),
        (
            "[noise]\nar_phi = 0.6",
            "[noise]\nar_phi = 0.6\nwander_sd = 0.7",
            "wander_sd",
            "wander_sd",
        ),
        (
            "diurnal_amplitude = 0.1",
            "diurnal_amplitude = 0.1\nhost_correlation = 1.2",
            "host_correlation",
            "host_correlation",
        ),  # fmt: skip
        (
            "diurnal_amplitude = 0.1",
            "diurnal_amplitude = 0.1\nsensitivity_spread = -0.1",
            "sensitivity_spread",
            "sensitivity_spread",
        ),  # fmt: skip
        ("[timing]", '[noise.warmup]\nstart = "tepid"\n\n[timing]', "start", "start"),
        (
            "[knobs.thp.p99]",
            "[knobs.thp.warmup]\nmadvise = { amplitude = 1.5, tau_s = 10 }\n\n[knobs.thp.p99]",
            "amplitude",
            "madvise",
        ),  # fmt: skip
        (
            "[knobs.thp.p99]",
            "[knobs.thp.warmup]\nnever = { amplitude = 0.1, tau_s = 10 }\n\n[knobs.thp.p99]",
            "no throughput",
            "never",
        ),  # fmt: skip
        (
            'why = "overlap"',
            'why = "overlap"\nwarmup = { amplitude = 0.1 }',
            "tau_s",
            "[[interactions]]",
        ),
    ],
)
def test_out_of_range_parameters_are_one_file_line_error(
    tmp_path: Path, old: str, new: str, fragment: str, line_has: str
) -> None:
    assert old in GOOD
    text = GOOD.replace(old, new, 1)
    path = write(tmp_path, text)
    with pytest.raises(InputError) as err:
        SimModel.load(path)
    msg = str(err.value)
    assert fragment in msg and "\n" not in msg
    line = int(msg.split(":")[1])
    assert line_has in text.splitlines()[line - 1]
