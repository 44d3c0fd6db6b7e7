"""Issue 19: pair calibration, remembered transients, the transient cap, CUPED, the method
string (final batch size and bandwidth)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from musku.abtest import run_comparison
from musku.abtest.calibrate import calibrate_pair
from musku.abtest.calibration import PairMemory
from musku.domain import ComparisonSpec, Decision, StatsSettings
from musku.sim import SimModel, SimPair
from tests.abtest.fakes import A, B, FakePair, freq_level

ROOT = Path(__file__).resolve().parents[2]
SPEC = ComparisonSpec(stats=StatsSettings(warmup_s=10.0, min_effect=0.005, sample_cap=30_000))


def test_calibration_measures_the_host_bias() -> None:
    pair = FakePair(seed=33, bias=0.02)
    spec99 = ComparisonSpec(stats=StatsSettings(warmup_s=10.0, min_effect=0.005, confidence=0.99))
    cal, result = calibrate_pair(pair, A, spec99, precision=0.005, seed=33)
    assert cal is not None
    assert result.decision is Decision.NO_DIFFERENCE
    assert cal.ci_low <= 0.02 <= cal.ci_high
    assert cal.bias == pytest.approx(0.02, abs=0.004)
    # stopped once the noise's part is within the precision; the interval also holds the
    # default wander prior's part (0.3 %, 1 h: a short calibration cannot average it away)
    m = re.search(r"adds ±([0-9.]+) % to the noise's ±([0-9.]+) %", result.reason)
    assert m is not None, result.reason
    wander, noise = float(m[1]) / 100, float(m[2]) / 100
    assert noise <= 0.0051 and wander > 0.003
    assert cal.ci_high - cal.ci_low <= 2 * (noise + wander) + 0.001
    assert "recalibration" not in result.reason
    assert cal.bound >= 0.02
    assert cal.pair == "fake0+fake1"
    # the calibrated bound lets the early path decide a large effect, and nothing is breached
    breaches: list[str] = []
    mem = PairMemory(calibration=cal, hardware=cal.hardware, on_breach=breaches.append)
    pair2 = FakePair(freq_level(0.15), seed=32, bias=0.02)
    r = run_comparison(pair2, A, B, SPEC, seed=32, memory=mem)
    assert r.decision is Decision.BETTER and "before crossover" in r.reason
    assert not breaches


def test_breach_disables_the_early_path_until_recalibrated() -> None:
    pair = FakePair(seed=33, bias=0.0)
    cal, _ = calibrate_pair(pair, A, SPEC, precision=0.004, seed=33)
    assert cal is not None
    # the hosts drift apart by 3 % after the calibration; a comparison that crosses over
    # (here one with its early path off; a large effect's early decision would still trust
    # the stale calibration: the documented residual risk until the next crossover)
    breaches: list[str] = []
    mem = PairMemory(calibration=cal, hardware=cal.hardware, on_breach=breaches.append)
    r = run_comparison(
        FakePair(seed=34, bias=0.03), A, A, SPEC, seed=34, memory=mem,
        rule_options={"early": False},
    )  # fmt: skip
    assert r.decision is Decision.NO_DIFFERENCE  # the crossover still removes it
    assert len(breaches) == 1 and "calibrated bound" in breaches[0]
    assert mem.calibration is not None and mem.calibration.needs_recalibration
    r2 = run_comparison(FakePair(freq_level(0.15), seed=35), A, B, SPEC, seed=35, memory=mem)
    assert "before crossover" not in r2.reason and "recalibration" in r2.reason


def test_a_transient_beyond_the_cap_is_inconclusive() -> None:
    m = shared_model(0.99, warmup=(0.3, 3000.0))
    assert m.reference_config is not None
    base = m.reference_config.with_("prefetch", "l2hw_dcu")
    pair = SimPair(m, seed=36, initial=(base, base))
    r = run_comparison(pair, base, base.with_("prefetch", "all_on"), SPEC, seed=36)
    assert r.decision is Decision.INCONCLUSIVE
    assert "did not end within 3600 s" in r.reason


def test_transients_are_remembered_per_configuration() -> None:
    mem = PairMemory()
    pair = FakePair(freq_level(0.02), seed=37, warm_amp=0.1, warm_tau_s=60.0)
    run_comparison(pair, A, B, SPEC, seed=37, memory=mem)
    assert set(mem.transients) == {A.key(), B.key()}
    assert all(v >= SPEC.stats.warmup_s for v in mem.transients.values())
    # a later comparison discards at least what was measured
    mem.transients[B.key()] = 600.0
    rows: list[dict[str, object]] = []
    run_comparison(
        FakePair(freq_level(0.02), seed=38), A, B, SPEC, seed=38, memory=mem, on_window=rows.extend
    )
    first = [x for x in rows if x["period"] == 0 and x["host"] == 0]
    assert sum(bool(x["warmup"]) for x in first) >= 600


def test_method_records_the_final_batch_size_and_bandwidth() -> None:
    r = run_comparison(FakePair(freq_level(0.01), seed=39, phi=0.9), A, B, SPEC, seed=39)
    m = re.search(r"b=(\d+) \(final\), Bartlett HAC bandwidth ([0-9.]+)", r.method)
    assert m is not None
    assert int(m.group(1)) >= 5 and float(m.group(2)) >= 1.0
    assert "no early path" in r.method


def shared_model(corr: float, warmup: tuple[float, float] | None = None) -> SimModel:
    import tomllib

    data = tomllib.loads((ROOT / "experiments/sim/web-skylake18.toml").read_text())
    if warmup is not None:
        amp, tau = warmup
        data["knobs"]["prefetch"]["warmup"] = {"all_on": {"amplitude": amp, "tau_s": tau}}
    data["noise"]["load"]["host_correlation"] = corr
    data["knobs"]["prefetch"]["throughput"]["l2hw_dcu"] = 1.0 / 1.01
    return SimModel.from_dict(data, source="test")


def test_cuped_on_the_offered_load_saves_samples_with_partly_shared_load() -> None:
    m = shared_model(0.5)
    assert m.reference_config is not None
    base = m.reference_config.with_("prefetch", "l2hw_dcu")
    cand = base.with_("prefetch", "all_on")
    spec = ComparisonSpec(stats=StatsSettings(warmup_s=60.0, min_effect=0.005))
    with_cov, without = [], []
    for seed in (1, 2, 3):
        for opts, out in (({}, with_cov), ({"covariate": None}, without)):
            pair = SimPair(m, seed=seed, initial=(base, base))
            r = run_comparison(pair, base, cand, spec, seed=seed, rule_options=opts)
            assert r.decision is Decision.BETTER
            out.append(r.samples)
            # the reason says what the adjustment did (and nothing without it)
            got = re.search(
                r"CUPED on offered_qps: window variance -(\d+) % \(([0-9.]+)x", r.reason
            )
            assert (got is not None) == (opts == {}), r.reason
            if got is not None:
                assert int(got[1]) >= 50 and float(got[2]) >= 2.0  # 1 / (1 - share)
    assert sum(without) > 3 * sum(with_cov)


def test_pair_calibrate_cli_stores_the_calibration(tmp_path: Path) -> None:
    from musku.cli import main
    from musku.storage import open_store

    db = f"sqlite:///{tmp_path / 'r.db'}"
    exp = ROOT / "experiments" / "web-skylake.toml"
    with pytest.raises(SystemExit) as done:
        main(["pair", "calibrate", str(exp), "--db", db, "--precision", "0.005", "--json"])
    assert done.value.code in (0, None)
    store = open_store(db)
    try:
        cal = store.calibration("sim-a+sim-b")
    finally:
        store.close()
    assert cal is not None and cal.ci_low <= 0.003 <= cal.ci_high  # the model's host bias
    assert json.loads(cal.hardware)["backend"] == "sim"


def test_pair_calibrate_cli_bad_input(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from musku.cli import main

    with pytest.raises(SystemExit) as done:
        main(["pair", "calibrate", str(tmp_path / "none.toml"), "--db", "sqlite://"])
    assert done.value.code == 3
    assert "no such file" in capsys.readouterr().err


def test_pair_calibrate_says_how_much_of_its_interval_is_the_wander(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The interval includes the host bias's slow wander (its average over the calibration
    moves with it), and the command says how much of the interval that is."""
    from musku.cli import main

    db = f"sqlite:///{tmp_path / 'r.db'}"
    exp = ROOT / "experiments" / "web-skylake.toml"
    with pytest.raises(SystemExit) as done:
        main(["pair", "calibrate", str(exp), "--db", db, "--precision", "0.005"])
    assert done.value.code in (0, None)
    out = " ".join(capsys.readouterr().out.split())  # rich wraps at the console's width
    m = re.search(r"interval ±([0-9.]+) % of which the host bias's wander \((?:prior: |measured )"
                  r"sd ([0-9.]+) %, tau ([0-9.]+) h\) adds ±([0-9.]+) % to the noise's "
                  r"±([0-9.]+) %", out)  # fmt: skip
    assert m is not None, out
    total, sd, _, wander, noise = (float(x) for x in m.groups())
    assert sd >= 0.30  # the larger of the prior (0.3 %) and the measured wander
    assert re.search(r"wander: the host bias moves with sd [0-9.]+ % over tau [0-9]+ min", out)
    assert wander > 0 and total == pytest.approx(wander + noise, abs=0.011)
