"""Co-tuning on simulated hosts: it changes a verdict, every comparison row records each side's
threading, tables are trained once and then found in the results DB, and a failed training
leaves both hosts as they were."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from musku.cotune_spec import CotuneSpec
from musku.domain import Configuration, Decision
from musku.errors import HostError
from musku.experiment import load_experiment
from musku.sim import SimModel
from musku.sim.midtier import SimTrainer
from musku.sim.pair import SimPair
from musku.storage import open_store
from musku.sweep import open_pair, run_abtest, run_sweep

ROOT = Path(__file__).resolve().parents[2]
ON = ROOT / "experiments" / "sim" / "cotune-setalgebra.toml"
OFF = ROOT / "experiments" / "sim" / "cotune-setalgebra-off.toml"


def test_cotuning_changes_the_verdict_on_core_count() -> None:
    """14 cores gain 2 % with their best threading (blocking) and lose on the stock poll
    threading: judged without co-tuning the knob loses, co-tuned it wins."""
    results = {}
    for path in (ON, OFF):
        exp = load_experiment(path)
        base = exp.baseline_config
        results[path.name] = run_abtest(exp, base, base.with_("core_count", 14))
    on, off = results[ON.name], results[OFF.name]
    assert on.decision is Decision.BETTER and on.ci_low > 0
    assert off.decision is Decision.WORSE and off.ci_high < 0
    # each side judged with its own best threading, and the record says which
    assert on.threading["A"].startswith("auto:") and " async-dispatch-poll " in on.threading["A"]
    assert on.threading["B"].startswith("auto:") and " async-dispatch-block " in on.threading["B"]
    assert off.threading == {
        "A": "async-dispatch-poll p1 w2 r1",
        "B": "async-dispatch-poll p1 w2 r1",
    }


def test_sweep_records_threading_per_comparison_and_reuses_tables(tmp_path: Path) -> None:
    db = tmp_path / "results.db"
    exp = load_experiment(ON)
    with open_store(f"sqlite:///{db}") as store:
        first = run_sweep(exp, store=store)
        before = {
            (t.host, t.config_key): t.id for t in store.threading_tables(service="setalgebra")
        }
        second = run_sweep(exp, store=store)
        after = {(t.host, t.config_key): t.id for t in store.threading_tables(service="setalgebra")}
        # none retrained: every (host, configuration) the first sweep tuned keeps its table; the
        # second sweep's own noise may take a walk one setting further (the futility stop ends a
        # walk on a not_better whose timing varies), and only such new settings get a table
        assert {k: after[k] for k in before} == before
        tables = len(after)
    assert first.best["core_count"] == 14 and first.best["thp"] == "always"
    # (host, configuration) pairs seen: one table each
    with sqlite3.connect(db) as con:
        rows = con.execute(
            "SELECT c.purpose, d.threading_a, d.threading_b FROM decisions d "
            "JOIN comparisons c ON c.id = d.comparison_id"
        ).fetchall()
        pairs = con.execute(
            "SELECT COUNT(*), COUNT(DISTINCT host || config_key) FROM threading_tables"
        ).fetchone()
    assert len(rows) == first.comparisons + second.comparisons
    for purpose, a, b in rows:
        assert a.startswith("auto:") and b.startswith("auto:"), (purpose, a, b)
        assert " @ " in a and a.endswith(" qps") and len(a) <= 100
    assert pairs[0] == pairs[1] == tables
    # the verdict for 14 cores was reached with each side on its own threading
    c14 = [r for r in rows if r[0] == "knob:core_count" and "block" in r[2]]
    assert c14 and all("async-dispatch-poll" in r[1] for r in c14)


def _pair(trainer: object, tmp: Path) -> SimPair:
    exp = load_experiment(ON)
    model = SimModel.load(exp.resolve("midtier-skylake18.toml"), space=exp.space)
    base = exp.baseline_config
    assert exp.cotune is not None
    return SimPair(model, seed=3, initial=(base, base), cotune=exp.cotune,
                   trainer=trainer, table_dir=tmp / "tables")  # type: ignore[arg-type]  # fmt: skip


class FailingSecond(SimTrainer):
    """Trains normally, except the ``nth`` call, which fails half-way."""

    def __init__(self, model: SimModel, nth: int) -> None:
        super().__init__(model)
        self.n = 0
        self.nth = nth

    def train(self, endpoint, spec: CotuneSpec):  # type: ignore[no-untyped-def]
        self.n += 1
        if self.n == self.nth:
            from musku.tune.cotune import ThreadingState

            endpoint.set_fixed(ThreadingState("sync-inline-poll", 1, 0, 0))  # mid-training
            raise HostError("musku_loadgen exited with status 1")
        return super().train(endpoint, spec)


def test_failed_training_rolls_back_knobs_and_threading_on_both_hosts(tmp_path: Path) -> None:
    exp = load_experiment(ON)
    model = SimModel.load(exp.resolve("midtier-skylake18.toml"), space=exp.space)
    trainer = FailingSecond(model, nth=2)
    pair = _pair(trainer, tmp_path)
    base = exp.baseline_config
    cand = base.with_("core_count", 14)
    before = [h.configuration() for h in pair.hosts]
    assert pair.midtiers is not None
    threads = [mt.get() for mt in pair.midtiers]
    # host a is co-tuned for the baseline (first training), host b's training fails
    with pytest.raises(HostError) as exc:
        pair.apply((base, cand))
    msg = exc.value.one_line()
    assert "musku_loadgen exited" in msg and "both hosts rolled back" in msg and "\n" not in msg
    assert "runs async-dispatch-poll p1 w2 r1 again" in msg
    assert [h.configuration() for h in pair.hosts] == before
    assert [mt.get() for mt in pair.midtiers] == threads  # host a's table unloaded again
    assert pair.threading() == ("async-dispatch-poll p1 w2 r1",) * 2
    assert pair.now() > 0  # the time spent is spent
    # the pair is usable afterwards: host a's table comes from the cache, b trains
    pair.apply((base, cand))
    a, b = pair.threading()
    assert " async-dispatch-poll " in a and " async-dispatch-block " in b
    assert pair.cotuned[0] is not None and pair.cotuned[0].source == "cache"
    assert trainer.n == 3
    pair.close()


def test_failed_training_restores_tables_of_another_core_count(tmp_path: Path) -> None:
    """Both hosts on their tables for 18 cores; a move to 14 / 12 cores fails on host b: both
    go back to 18 cores and to their 18-core tables (which a 14-core host would call stale)."""
    exp = load_experiment(ON)
    model = SimModel.load(exp.resolve("midtier-skylake18.toml"), space=exp.space)
    pair = _pair(FailingSecond(model, nth=4), tmp_path)
    assert pair.midtiers is not None
    base = exp.baseline_config
    pair.apply((base, base))
    before = pair.threading()
    states = [mt.get() for mt in pair.midtiers]
    assert all(st.auto_mode for st in states)
    with pytest.raises(HostError, match="both hosts rolled back"):
        pair.apply((base.with_("core_count", 14), base.with_("core_count", 12)))
    assert [h.configuration() for h in pair.hosts] == [base, base]
    assert [mt.get() for mt in pair.midtiers] == states and pair.threading() == before
    pair.close()


def test_sim_pair_without_cotuning_keeps_the_initial_threading(tmp_path: Path) -> None:
    exp = load_experiment(OFF)
    pair = open_pair(exp)
    base = exp.baseline_config
    pair.apply((base, base.with_("core_count", 12)))
    assert pair.threading() == ("async-dispatch-poll p1 w2 r1",) * 2
    # the mismatch cost is in the measurements: 12 cores on the poll threading
    assert isinstance(pair, SimPair)
    assert pair._factors == [(1.0, 1.0), pytest.approx((0.965, 1.12))]
    pair.close()


def test_training_takes_host_time(tmp_path: Path) -> None:
    exp = load_experiment(ON)
    assert exp.cotune is not None
    model = SimModel.load(exp.resolve("midtier-skylake18.toml"), space=exp.space)
    pair = _pair(SimTrainer(model), tmp_path)
    base = exp.baseline_config
    cand = base.with_("thp", "always")
    training = exp.cotune.points() * 3.5  # (duration + warm-up) per point
    assert pair.apply((base, cand)) == pytest.approx(model.timing.apply_s + training)
    assert pair.apply((base, cand)) == 0.0  # nothing changed
    assert pair.apply((cand, base)) == pytest.approx(model.timing.apply_s + training)
    # back to configurations each host was co-tuned for: cached tables, no training
    assert pair.apply((base, cand)) == pytest.approx(model.timing.apply_s)
    assert [t.trainings for t in pair.tuners or ()] == [2, 2]
    pair.close()
    assert len(list((tmp_path / "tables").rglob("*.json"))) == 4  # a given directory stays
    # a pair's own (temporary) table directory goes with it
    own = SimPair(model, initial=(base, base), cotune=exp.cotune)
    d = own._own_table_dir
    own.apply((base, base))
    assert d is not None and any(d.rglob("*.json"))
    own.close()
    assert not d.exists()


def test_configuration_keys_are_per_host_configuration() -> None:
    """Hosts at the same configuration still train (or look up) a table each: tables are
    per host, as real hosts differ."""
    exp = load_experiment(ON)
    pair = open_pair(exp)
    assert isinstance(pair, SimPair) and pair.tuners is not None
    base = exp.baseline_config
    pair.apply((base, base))
    assert [t.trainings for t in pair.tuners] == [1, 1]
    assert Configuration.from_key(pair.cotuned[0].trained["config_key"]) == base  # type: ignore[index,union-attr]
    pair.close()
