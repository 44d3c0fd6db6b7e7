"""Sweeps on simulated hosts through the real A/B tester and the real results DB."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest

from musku.domain import Configuration, Decision, ExperimentStatus
from musku.errors import InputError, Interrupted
from musku.experiment import load_experiment
from musku.sim import SimModel
from musku.storage import open_store
from musku.sweep import run_sweep
from musku.sweep.runner import NullProgress


def test_independent_sweep_composes_each_knobs_best(toy: Any, tmp_path: Path) -> None:
    exp = load_experiment(toy("independent"))
    store = open_store(f"sqlite:///{tmp_path}/r.db")
    rep = run_sweep(exp, store=store)
    model = SimModel.load(exp.resolve("toy-model.toml"))
    # each knob's best setting, judged alone against production
    assert rep.best == Configuration.of(core_count=2, thp="always", shp=128)
    for knob in exp.service.knobs:
        assert rep.best[knob] == model.best_setting(knob, exp.production)
    # 1 core breaks the QoS guardrail: pruned
    cc = next(o for o in rep.knobs if o.knob == "core_count")
    assert cc.pruned == [1]
    assert rep.sku is not None and rep.sku.vs_production is not None
    truth = model.true_effect(exp.production, rep.best)
    r = rep.sku.vs_production
    assert r.decision is Decision.BETTER
    assert r.ci_low <= truth <= r.ci_high
    # everything landed in the DB
    [rec] = [e for e in store.experiments() if e.id == rep.experiment_id]
    assert ExperimentStatus(rec.status) is ExperimentStatus.DONE
    assert len(store.completed(rep.experiment_id)) == rep.comparisons
    assert store.softskus(service="toy")
    store.close()


def test_search_catches_an_interaction_that_independent_misses(toy: Any) -> None:
    exp = load_experiment(toy("search"))
    rep = run_sweep(exp)
    # THP always and SHP 256 help most together: coordinate descent from the independent
    # result (always, 128) moves SHP to 256
    assert rep.best == Configuration.of(core_count=2, thp="always", shp=256)
    assert rep.sku is not None and rep.sku.vs_production is not None
    assert rep.sku.vs_production.estimate > 0.05


def test_exhaustive_sweep_and_its_size_limit(toy: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    exp = load_experiment(toy("exhaustive"))
    rep = run_sweep(exp)
    assert rep.best == Configuration.of(core_count=2, thp="always", shp=256)
    from musku.sweep import strategies

    monkeypatch.setattr(strategies, "EXHAUSTIVE_LIMIT", 10)
    with pytest.raises(InputError, match="would compare 24 configurations"):
        run_sweep(exp)


class StopAfter(NullProgress):
    def __init__(self, n: int, stop: threading.Event) -> None:
        self.n, self.stop, self.seen = n, stop, 0

    def comparison_finished(self, purpose: str, result: Any, cached: bool) -> None:
        self.seen += 1
        if self.seen >= self.n:
            self.stop.set()


def test_interrupt_keeps_measurements_and_resume_continues(toy: Any, tmp_path: Path) -> None:
    exp = load_experiment(toy("independent", name="resumable"))
    url = f"sqlite:///{tmp_path}/r.db"
    full = run_sweep(exp)  # reference: uninterrupted, no DB

    store = open_store(url)
    stop = threading.Event()
    with pytest.raises(Interrupted):
        run_sweep(exp, store=store, progress=StopAfter(3, stop), stop=stop)
    [rec] = store.experiments()
    assert ExperimentStatus(rec.status) is ExperimentStatus.INTERRUPTED
    kept = store.completed(rec.id)
    assert len(kept) == 3
    store.close()

    store = open_store(url)
    resumed = run_sweep(exp, store=store, resume=True)
    assert resumed.experiment_id == rec.id  # same experiment continued, not a new one
    assert resumed.comparisons == full.comparisons
    assert resumed.measured == full.comparisons - 3  # the 3 kept ones were not re-measured
    assert resumed.best == full.best
    assert ExperimentStatus(store.find_experiment("resumable").status) is ExperimentStatus.DONE
    store.close()
