"""The tester on the real simulator (musku.sim) with a paper-calibrated model file."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from musku.abtest import run_comparison
from musku.domain import ComparisonSpec, Decision, Direction, Guardrail, StatsSettings

sim = pytest.importorskip("musku.sim")

MODEL = Path(__file__).resolve().parents[2] / "experiments" / "sim" / "web-skylake18.toml"
SPEC = ComparisonSpec(stats=StatsSettings(warmup_s=60.0, min_effect=0.005))


@pytest.fixture(scope="module")
def model() -> Any:
    if not MODEL.exists():
        pytest.skip("simulator model file not present")
    return sim.SimModel.load(MODEL)


def test_cdp_gain_found_and_covered(model: Any) -> None:
    base = model.reference_config
    cand = base.with_("cdp", "6:5")
    truth = model.true_effect(base, cand, "mips")
    pair = sim.SimPair(model, seed=3, initial=(base, base))
    r = run_comparison(pair, base, cand, SPEC, seed=3)
    assert r.decision is Decision.BETTER
    assert r.ci_low <= truth <= r.ci_high
    assert r.host_time_s == pytest.approx(pair.now())


def test_too_few_cores_break_the_qos_guardrail(model: Any) -> None:
    base = model.reference_config
    cand = base.with_("core_count", 6)
    spec = ComparisonSpec(
        metric="power_w",
        direction=Direction.LOWER,
        guardrails=(Guardrail("qos_violation_rate", "<=", 0.01),),
        stats=SPEC.stats,
    )
    r = run_comparison(sim.SimPair(model, seed=4, initial=(base, base)), base, cand, spec, seed=4)
    assert r.decision is Decision.GUARDRAIL
    assert r.guardrail_values["qos_violation_rate"] > 0.01
