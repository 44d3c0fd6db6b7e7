"""The ``qsim`` host backend: knobs act on the queueing model, the metrics come from it."""

from __future__ import annotations

from pathlib import Path

import pytest

from musku.domain import Configuration
from musku.errors import InputError
from musku.experiment import load_experiment
from musku.qsim.backend import QsimBackend
from musku.qsim.hosts import open_pair
from musku.registry import BACKENDS

ROOT = Path(__file__).resolve().parents[2]
EXP = ROOT / "experiments" / "qsim" / "2tier-freq.toml"
pytestmark = pytest.mark.services


def test_registered() -> None:
    assert isinstance(BACKENDS.get("qsim"), QsimBackend)


def test_knobs_move_the_model(engine: str) -> None:
    e = load_experiment(EXP)
    pair = open_pair(e, seed=3)
    base = e.baseline_config
    ref = pair.figures(base)
    slow = pair.figures(base.merged(Configuration.of(core_freq=1.6)))
    few = pair.figures(base.merged(Configuration.of(core_count=2)))
    # lower core frequency: every stage slower by its dvfs_scale -> higher latency
    assert slow["mean_ms"] > ref["mean_ms"] * 1.02
    # 2 cores for 8 + 4 threads: the tiers queue for cores
    assert few["p99_ms"] > ref["p99_ms"] * 1.05
    assert abs(ref["qps"] - 60000) < 2000  # [hosts] qps
    pair.apply((base, base.merged(Configuration.of(core_freq=1.6))))
    a, b = pair.window(2.0)
    assert pair.now() == 2.0 and a.duration == 2.0
    assert set(a.metrics) == {"qps", "mean_ms", "p50_ms", "p99_ms", "qos_violation_rate"}
    # host noise is documented: 2 % lognormal per metric and window
    assert abs(a.metrics["mean_ms"] / ref["mean_ms"] - 1) < 0.1
    assert abs(b.metrics["mean_ms"] / slow["mean_ms"] - 1) < 0.1
    again = open_pair(e, seed=3)
    again.apply((base, base.merged(Configuration.of(core_freq=1.6))))
    assert again.window(2.0) == (a, b)  # seeded: reproducible


def test_unmodelled_knobs_refused(tmp_path: Path) -> None:
    text = EXP.read_text().replace(
        'knobs = ["core_freq", "uncore_freq", "core_count"]', 'knobs = ["core_freq", "thp"]'
    )
    text = text.replace('model = "2tier.toml"', f'model = "{ROOT / "experiments/qsim/2tier.toml"}"')
    f = tmp_path / "e.toml"
    f.write_text(text)
    with pytest.raises(InputError, match="also sweeps thp"):
        open_pair(load_experiment(f))
    f.write_text(text.replace("qos_ms = 0.5", "qos_ms = 0.5\ncolour = 1").replace(', "thp"', ""))
    with pytest.raises(InputError, match="unknown qsim option"):
        open_pair(load_experiment(f))
