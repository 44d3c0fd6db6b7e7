"""The engine's run-time controller and the QoS-aware power manager (musku.qsim.power)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from musku.errors import MuskuError
from musku.qsim.model import load
from musku.qsim.power import PowerModel, QosPowerManager, run_controlled, run_managed
from tests.qsim.conftest import MM1

# conftest's M/M/1 server with a constant service time and a DVFS-scaled stage
ONE = (
    MM1.replace('dist = "exp"', 'dist = "const"')
    .replace("warmup_s = 0.05", "warmup_s = 0.1")
    .replace("seed = 3", "seed = 5")
    .replace("mean_us = 10 }}\n", "mean_us = 10 }}\n  dvfs_scale = 1.0\n")
)

TWO = """\
[run]
duration_s = {duration}
warmup_s = 0.1
seed = 2

[[machines]]
name = "a"
cores = 2

[[machines]]
name = "b"
cores = 2

[[services]]
name = "front"
threads = 2
machines = ["a"]

  [[services.stages]]
  name = "proc"
  time = {{ dist = "exp", mean_us = 20 }}
  dvfs_scale = 0.8

[[services]]
name = "cache"
threads = 2
machines = ["b"]

  [[services.stages]]
  name = "get"
  time = {{ dist = "exp", mean_us = 10 }}
  dvfs_scale = 0.5

[[paths]]
  [[paths.nodes]]
  name = "front"
  service = "front"
  children = ["cache"]

  [[paths.nodes]]
  name = "cache"
  service = "cache"

[client]
qps = {qps}
"""


def _doc(tmp_path: Path, text: str, **kw: Any) -> dict[str, Any]:
    p = tmp_path / "m.toml"
    p.write_text(text.format(**kw))
    return load(p).engine


def test_controller_sees_each_window_and_its_frequency_applies(engine: str, tmp_path: Path) -> None:
    # M/D/1 at 1000 req/s, 10 us: the controller halves the frequency after the 5th window
    doc = _doc(tmp_path, ONE, duration=2.0, qps=1000)
    reports: list[dict[str, Any]] = []

    def on_window(rep: dict[str, Any]) -> dict[str, Any]:
        reports.append(rep)
        return {"freq_ratio": [2.0]} if len(reports) == 5 else {}

    res = run_controlled(doc, 0.2, on_window)
    assert len(reports) == 10  # windows end at 0.2 .. 2.0 s
    assert [round(r["t_s"], 6) for r in reports] == [round(0.2 * (i + 1), 6) for i in range(10)]
    svc = [r["services"][0] for r in reports]
    # no queueing to speak of at rho = 1 %: the service's time is the stage's, 10 then 20 us
    for s in svc[1:5]:
        assert s["mean_us"] == pytest.approx(10.0, rel=0.02)
    for s in svc[6:]:
        assert s["mean_us"] == pytest.approx(20.0, rel=0.03)
        assert s["freq_ratio"] == 2.0
    # busy core-seconds: lambda * S * window (+- Poisson noise of ~200 arrivals)
    assert svc[2]["busy_core_s"] == pytest.approx(1000 * 10e-6 * 0.2, rel=0.25)
    assert svc[7]["busy_core_s"] == pytest.approx(1000 * 20e-6 * 0.2, rel=0.25)
    assert res["latency"]["count"] > 1500


def test_controller_can_stop_the_run_and_bad_answers_are_refused(
    engine: str, tmp_path: Path
) -> None:
    doc = _doc(tmp_path, ONE, duration=2.0, qps=1000)
    res = run_controlled(doc, 0.2, lambda rep: {"stop": True})
    assert res["stop_reason"] == "stopped by the controller"
    with pytest.raises(MuskuError, match="one ratio per service"):
        run_controlled(doc, 0.2, lambda rep: {"freq_ratio": [1.0, 2.0]})
    with pytest.raises(MuskuError, match="positive"):
        run_controlled(doc, 0.2, lambda rep: {"freq_ratio": [-1.0]})


def test_power_model_energy() -> None:
    pm = PowerModel(static_w=2.0, dynamic_w=6.0, f_max_ghz=2.6)
    # 4 cores for 1 s, 1.5 core-seconds busy at f_max: 8 J static + 9 J dynamic
    assert pm.energy_j(1.5, 4, 1.0, 2.6) == pytest.approx(17.0)
    # at half the frequency the dynamic part falls by 8 (the cube)
    assert pm.energy_j(1.5, 4, 1.0, 1.3) == pytest.approx(8.0 + 9.0 / 8)


def test_manager_slows_one_tier_at_a_time_and_speeds_up_on_violation() -> None:
    freqs = [1.2, 1.6, 2.0, 2.4]
    m = QosPowerManager(["a", "b"], 1000.0, freqs, observe=0, seed=3)
    top = len(freqs) - 1
    seen_down = 0
    for _ in range(4):  # QoS met with room to spare: each decision slows exactly one tier
        before = dict(m.level)
        m.decide(300.0, {"a": 100.0, "b": 100.0})
        drops = sum(before[t] - m.level[t] for t in m.tiers)
        assert drops <= 1
        seen_down += drops
    assert seen_down >= 1
    assert min(m.level.values()) < top
    before = dict(m.level)
    m.decide(1500.0, {"a": 900.0, "b": 900.0})  # a violation: nothing slows, something speeds up
    assert all(m.level[t] >= before[t] for t in m.tiers)
    assert sum(m.level.values()) > sum(before.values())


def test_managed_run_saves_energy_under_a_loose_target_and_not_under_a_tight_one(
    engine: str, tmp_path: Path
) -> None:
    doc = _doc(tmp_path, TWO, duration=3.0, qps=20000)
    base = run_managed(doc, qos_p99_us=1e6, decision_s=0.1, manage=False)
    loose = run_managed(doc, qos_p99_us=1e6, decision_s=0.1)
    assert base["violation_rate"] == 0 and loose["violation_rate"] == 0
    assert loose["energy_j"] < base["energy_j"]
    last = loose["windows"][-1]["freq_ghz"]
    assert min(last.values()) < 2.6  # the manager did slow a tier down
    # a target below what the fastest setting reaches: every window violates, nothing slows
    tight = run_managed(doc, qos_p99_us=1.0, decision_s=0.1)
    assert tight["violation_rate"] == 1.0
    assert all(f == 2.6 for w in tight["windows"] for f in w["freq_ghz"].values())
    assert tight["energy_j"] == pytest.approx(base["energy_j"], rel=0.05)
