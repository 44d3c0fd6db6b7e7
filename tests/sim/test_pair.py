"""SimPair: the paired design, the noise model's parts, the clock, applies and reboots."""

from __future__ import annotations

import copy
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from scipy import stats
from statsmodels.tsa.stattools import acf

from musku.domain import Configuration, Sample
from musku.errors import InputError, UnsupportedError
from musku.experiment import load_experiment
from musku.hosts.base import HostPair
from musku.registry import BACKENDS
from musku.sim import SimModel, SimPair, open_pair
from musku.sim.backend import SimBackend

ROOT = Path(__file__).resolve().parents[2]
WEB_SKYLAKE = ROOT / "experiments" / "web-skylake.toml"

BASE: dict[str, Any] = {
    "model": {"name": "synthetic"},
    "reference": {"mips": 1000.0, "qps": 100.0, "p99_ms": 10.0, "power_w": 100.0},
    "knobs": {
        "cdp": {"throughput": {"off": 1.0, "6:5": 1.05, "2:9": 0.9}},
        "core_count": {
            "throughput": {"4": 0.3, "18": 1.0},
            "qos": {"4": 0.2},
            "p99": {"4": 3.0},
        },
    },
    "noise": {"load": {}, "warmup": {}},
}
A = Configuration.of(cdp="off", core_count=18)


def model(**noise: Any) -> SimModel:
    data = copy.deepcopy(BASE)
    for key, value in noise.items():
        if key in ("load", "warmup"):
            data["noise"][key].update(value)
        else:
            data["noise"][key] = value
    return SimModel.from_dict(data, source="synthetic")


QUIET_LOAD = {"diurnal_amplitude": 0.0, "jitter_sigma": 0.0, "burst_rate_per_h": 0.0}


def test_registered_backend_and_interface() -> None:
    backend = BACKENDS.get("sim")
    assert isinstance(backend, SimBackend) and backend.options is not None
    pair = open_pair(load_experiment(WEB_SKYLAKE), seed=0)
    base: object = pair
    assert isinstance(base, HostPair)
    exp = load_experiment(WEB_SKYLAKE)
    assert pair.hosts[0].configuration() == exp.production
    assert pair.reboot_knobs == exp.spec.reboot_knobs == frozenset({"core_count"})
    a, b = pair.window(1.0)
    assert isinstance(a, Sample) and a.host == "sim-a" and b.host == "sim-b"
    assert set(a.metrics) == {
        "mips",
        "qps",
        "p99_ms",
        "qos_violation_rate",
        "power_w",
        "offered_qps",
    }
    assert a.t == b.t == pair.now() == 1.0 and a.duration == 1.0 and a.valid
    assert pair.describe()["model"] == "web-skylake18"


def test_seeded_and_reproducible() -> None:
    m = model()
    runs = []
    for seed in (7, 7, 8):
        pair = SimPair(m, seed=seed, initial=(A, A))
        pair.windows(1.0, 50)
        pair.apply((A, A.with_("cdp", "6:5")))
        runs.append(pair.arrays(2.0, 100).mips)
    assert np.array_equal(runs[0], runs[1])
    assert not np.allclose(runs[0], runs[2])


@pytest.mark.parametrize("seconds", [1.0, 2.5])
def test_windows_equal_repeated_window(seconds: float) -> None:
    m = SimModel.load(ROOT / "experiments" / "sim" / "web-skylake18.toml")
    one, many = SimPair(m, seed=3), SimPair(m, seed=3)
    batched = many.windows(seconds, 300)
    single = [one.window(seconds) for _ in range(300)]
    assert one.now() == pytest.approx(many.now()) == pytest.approx(300 * seconds)
    for (a1, b1), (a2, b2) in zip(single, batched, strict=True):
        assert a1.t == pytest.approx(a2.t) and a1.host == a2.host
        for key in a1.metrics:
            assert a1.metrics[key] == pytest.approx(a2.metrics[key], rel=1e-9)
            assert b1.metrics[key] == pytest.approx(b2.metrics[key], rel=1e-9)
    # and in distribution against another seed (same law, different draws)
    other = SimPair(m, seed=4).arrays(seconds, 300).mips[:, 1] / np.array(
        [w[1].metrics["mips"] for w in single]
    )
    assert not np.allclose(other, 1.0)
    ks = stats.ks_2samp(
        np.log([w[1].metrics["mips"] / w[0].metrics["mips"] for w in single]),
        np.log(
            [
                w[1].metrics["mips"] / w[0].metrics["mips"]
                for w in SimPair(m, seed=4).windows(seconds, 300)
            ]
        ),
    )
    assert ks.pvalue > 0.001


def test_common_load_cancels_in_the_ratio() -> None:
    m = SimModel.load(ROOT / "experiments" / "sim" / "web-skylake18.toml")
    arr = SimPair(m, seed=1).arrays(5.0, 17_280)  # one day
    log_a = np.log(arr.mips[:, 0])
    log_ratio = np.log(arr.mips[:, 1] / arr.mips[:, 0])
    assert np.std(log_ratio) < 0.5 * np.std(log_a)
    # the diurnal swing is really there: +-15 % over the day
    assert np.percentile(log_a, 95) - np.percentile(log_a, 5) > 0.2


def test_host_bias_is_present_and_overridable() -> None:
    m = model(load=QUIET_LOAD, outlier_prob=0.0)
    biased = SimPair(m, seed=2, initial=(A, A)).arrays(1.0, 20_000)
    est = np.mean(np.log(biased.mips[:, 1] / biased.mips[:, 0]))
    assert est == pytest.approx(math.log(1.003), abs=0.0012)
    unbiased = SimPair(m, seed=2, initial=(A, A), host_bias=0.0).arrays(1.0, 20_000)
    assert abs(np.mean(np.log(unbiased.mips[:, 1] / unbiased.mips[:, 0]))) < 0.0012
    with pytest.raises(InputError):
        SimPair(m, host_bias=0.7)


@pytest.mark.parametrize("phi", [0.5, 0.7])
def test_ar1_autocorrelation_at_the_configured_phi(phi: float) -> None:
    m = model(load=QUIET_LOAD, outlier_prob=0.0, ar_phi=phi, ar_sigma=0.03)
    pair = SimPair(m, seed=5, initial=(A, A))
    pair.windows(1.0, 600)  # past the cold-start warm-up
    x = np.log(pair.arrays(1.0, 20_000).mips)
    for h in (0, 1):
        r = acf(x[:, h], nlags=3, fft=True)
        assert r[1] == pytest.approx(phi, abs=0.03)
        assert r[2] == pytest.approx(phi**2, abs=0.04)
        assert np.std(x[:, h]) == pytest.approx(0.03, rel=0.1)


def test_warmup_after_apply_only_on_the_changed_host() -> None:
    m = model(load=QUIET_LOAD, warmup={"amplitude": 0.05, "tau_s": 40.0})
    pair = SimPair(m, seed=0, noise_scale=0.0, initial=(A, A), host_bias=0.0)
    pair.windows(1.0, 1000)
    steady = pair.arrays(1.0, 1).mips[0]
    assert steady == pytest.approx([1000.0, 1000.0], rel=1e-6)
    used = pair.apply((A, A.with_("cdp", "6:5")))
    assert used == m.timing.apply_s
    arr = pair.arrays(1.0, 300)
    age = np.arange(300) + 0.5
    expected_b = 1050.0 * (1 - 0.05 * np.exp(-age / 40.0))
    assert np.allclose(arr.mips[:, 1], expected_b, rtol=1e-9)
    assert np.allclose(arr.mips[:, 0], 1000.0, rtol=1e-9)  # untouched host: no transient
    # re-applying the same configuration changes nothing: no cost, no new transient
    assert pair.apply((A, A.with_("cdp", "6:5"))) == 0.0
    assert pair.arrays(1.0, 1).mips[0, 1] == pytest.approx(1050.0, rel=1e-4)


def test_reboot_charged_only_when_a_reboot_knob_changes() -> None:
    m = model(load=QUIET_LOAD)
    pair = SimPair(
        m, seed=0, initial=(A, A), reboot_knobs=frozenset({"core_count"}), noise_scale=0.0
    )
    t0 = pair.now()
    assert pair.apply((A, A.with_("cdp", "6:5"))) == pytest.approx(m.timing.apply_s)
    assert pair.now() == pytest.approx(t0 + m.timing.apply_s)
    t1 = pair.now()
    cost = pair.apply((A, A.with_("core_count", 4)))
    assert cost == pytest.approx(m.timing.apply_s + m.timing.reboot_s)
    assert pair.now() == pytest.approx(t1 + cost) and pair.reboots == 1
    # measured after the reboot: the full cold-cache transient is still ahead
    first = pair.arrays(1.0, 1)
    assert first.mips[0, 1] / (1000 * 0.3 * 1.003) == pytest.approx(
        1 - m.noise.warmup_amplitude * math.exp(-0.5 / m.noise.warmup_tau_s), rel=1e-9
    )
    # too few cores: p99 and QoS violations blow up
    assert first.p99_ms[0, 1] > 2.5 * first.p99_ms[0, 0]
    assert first.qos_violation_rate[0, 1] > 0.1 > first.qos_violation_rate[0, 0]
    # the same knob without the reboot set: no reboot time
    plain = SimPair(m, seed=0, initial=(A, A))
    assert plain.apply((A.with_("core_count", 4), A)) == pytest.approx(m.timing.apply_s)


def test_unknown_value_is_refused_and_nothing_changes() -> None:
    m = model()
    pair = SimPair(m, seed=0, initial=(A, A))
    pair.windows(1.0, 5)
    before = (pair.hosts[0].configuration(), pair.hosts[1].configuration(), pair.now())
    with pytest.raises(UnsupportedError, match="cdp=4d:7c"):
        pair.apply((A.with_("cdp", "6:5"), A.with_("cdp", "4:7")))
    after = (pair.hosts[0].configuration(), pair.hosts[1].configuration(), pair.now())
    assert after == before
    with pytest.raises(InputError):
        pair.windows(0.0, 3)
    with pytest.raises(InputError):
        pair.windows(1.0, -1)


def test_outliers_are_rare_and_sized() -> None:
    m = model(load=QUIET_LOAD, ar_sigma=0.0, outlier_prob=0.002, outlier_scale=0.3)
    pair = SimPair(m, seed=9, initial=(A, A), host_bias=0.0)
    pair.windows(1.0, 1000)
    dev = np.abs(np.log(pair.arrays(1.0, 50_000).mips / 1000.0))
    hits = dev > 1e-9
    assert 140 <= hits.sum() <= 260  # 200 expected
    assert dev[hits].min() >= 0.15 - 1e-9 and dev[hits].max() <= 0.45 + 1e-9


def test_restore_returns_to_the_initial_configurations() -> None:
    pair = SimPair(model(), seed=0, initial=(A, A))
    pair.apply((A.with_("cdp", "2:9"), A.with_("cdp", "6:5")))
    pair.restore()
    assert pair.hosts[0].configuration() == A == pair.hosts[1].configuration()


def test_open_pair_rejects_bad_hosts_options(tmp_path: Path) -> None:
    text = WEB_SKYLAKE.read_text(encoding="utf-8")
    bad = tmp_path / "exp.toml"
    bad.write_text(text.replace('model = "sim/web-skylake18.toml"', "noise = 1"), "utf-8")
    with pytest.raises(InputError, match="needs model"):
        open_pair(load_experiment(bad))
    bad.write_text(text.replace("sim/web-skylake18.toml", "sim/absent.toml"), "utf-8")
    with pytest.raises(InputError, match="no such file"):
        open_pair(load_experiment(bad))


def test_arrays_match_windows_and_are_the_fast_path() -> None:

    m = SimModel.load(ROOT / "experiments" / "sim" / "web-skylake18.toml")
    arr = SimPair(m, seed=6).arrays(1.0, 500)
    win = SimPair(m, seed=6).windows(1.0, 500)
    assert np.allclose(arr.metric("p99_ms")[:, 1], [w[1].metrics["p99_ms"] for w in win])
    assert np.allclose(arr.t, [w[0].t for w in win])
    with pytest.raises(InputError):
        arr.metric("t")
    # (the speed of the vectorised path is measured by bench/sim_speed.py, not here)
