"""A sweep on a pool of simulated hosts: comparisons at once on disjoint pairs, the same
answers for the same seed, the hosts of each comparison in the DB, resume."""

from __future__ import annotations

import threading
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from musku.domain import ComparisonResult, Configuration, ExperimentStatus
from musku.errors import Interrupted
from musku.experiment import load_experiment
from musku.storage import open_store
from musku.sweep import run_sweep
from musku.sweep.runner import NullProgress
from musku.testing.postgres import fresh_pg_database, pg_server  # noqa: F401 - fixtures
from tests.fixtures.toy import EXPERIMENT, MODEL


def _fleet(tmp_path: Path, n: int, mode: str = "independent", name: str = "toy") -> Path:
    (tmp_path / "toy-model.toml").write_text(MODEL)
    path = tmp_path / f"{name}-{mode}-{n}.toml"
    path.write_text(
        EXPERIMENT.format(name=name, mode=mode).replace("[hosts]\n", f"[hosts]\nfleet = {n}\n")
    )
    return path


class InFlight(NullProgress):
    """Counts the comparisons in flight at once, and which threads ran them."""

    def __init__(self, stop_after: int | None = None, stop: threading.Event | None = None):
        self.lock = threading.Lock()
        self.now = 0
        self.most = 0
        self.threads: set[str] = set()
        self.finished = 0
        self.stop_after, self.stop = stop_after, stop

    def comparison_started(self, purpose: str, baseline: Any, candidate: Any) -> None:
        with self.lock:
            self.now += 1
            self.most = max(self.most, self.now)
            self.threads.add(threading.current_thread().name)

    def comparison_finished(self, purpose: str, result: ComparisonResult, cached: bool) -> None:
        with self.lock:
            if not cached:
                self.now -= 1
            self.finished += 1
            if self.stop is not None and self.stop_after and self.finished >= self.stop_after:
                self.stop.set()


def _answers(rep: Any) -> list[tuple[str, str, str, float]]:
    return [
        (o.knob, r.candidate.key(), r.decision.value, r.estimate)
        for o in rep.knobs
        for r in o.results
    ]


def test_a_pool_runs_comparisons_at_once_and_the_clock_is_the_longest_pair(
    tmp_path: Path,
) -> None:
    exp = load_experiment(_fleet(tmp_path, 6))
    seen = InFlight()
    store = open_store(f"sqlite:///{tmp_path}/r.db")
    try:
        rep = run_sweep(exp, store=store, progress=seen)
        hosts = store.comparison_hosts(rep.experiment_id)
        records = {c.id: c.to_dict()["hosts"] for c in store.comparisons(rep.experiment_id)}
        samples_of = {cid: {s["host"] for s in store.samples(cid)} for cid in hosts}
        [rec] = [e for e in store.experiments() if e.id == rep.experiment_id]
    finally:
        store.close()
    assert ExperimentStatus(rec.status) is ExperimentStatus.DONE
    # more than one comparison in flight, on more than one pair's thread
    assert seen.most > 1
    assert len({t for t in seen.threads if t.startswith("musku-pair-")}) > 1
    # the knobs' scans ran on several pairs at once: the host-clock to the soft SKU is the
    # longest pair's (plus the composed SKU's validation), less than the host time summed
    assert rep.pairs == 3
    assert rep.clock_s < rep.host_time_s
    assert rep.best == Configuration.of(core_count=2, thp="always", shp=128)
    # every comparison row names its pair, pairs of the fleet, several of them
    names = {f"sim-{i:03d}" for i in range(6)}
    assert hosts and all(a in names and b in names and a != b for a, b in hosts.values())
    assert len(set(hosts.values())) > 1
    assert records == {cid: list(pair) for cid, pair in hosts.items()}  # `musku results --json`
    # each comparison's samples are filed under its own pair's hosts (their pool indices)
    for cid, (a, b) in hosts.items():
        idx = {int(a[-3:]), int(b[-3:])}
        assert samples_of[cid] <= idx


def test_the_same_seed_gives_the_same_sweep_on_a_pool(tmp_path: Path) -> None:
    exp = load_experiment(_fleet(tmp_path, 5, mode="exhaustive"))  # odd: sim-004 idles
    messages: list[str] = []

    class Say(NullProgress):
        def message(self, text: str) -> None:
            messages.append(text)

    one = run_sweep(exp, progress=Say())
    two = run_sweep(exp)
    assert any("sim-004 idles" in m for m in messages)
    assert _answers(one) == _answers(two)
    assert one.best == two.best and one.clock_s == two.clock_s
    assert one.sku is not None and two.sku is not None
    assert one.sku.vs_production.estimate == two.sku.vs_production.estimate  # type: ignore[union-attr]
    # another seed draws other hosts and other noise
    three = run_sweep(exp, seed=exp.stats.seed + 1)
    assert _answers(three) != _answers(one)


def test_a_pool_sweep_resumes_where_it_stopped(tmp_path: Path) -> None:
    exp = load_experiment(_fleet(tmp_path, 4))
    url = f"sqlite:///{tmp_path}/r.db"
    stop = threading.Event()
    with open_store(url) as store, pytest.raises(Interrupted):
        run_sweep(exp, store=store, progress=InFlight(stop_after=3, stop=stop), stop=stop)
    with open_store(url) as store:
        [first] = store.experiments()
        assert ExperimentStatus(first.status) is ExperimentStatus.INTERRUPTED
        kept = store.completed(first.id)
        assert len(kept) >= 3
        rep = run_sweep(exp, store=store, resume=True)
        assert rep.experiment_id == first.id
        done = store.completed(first.id)
        hosts = store.comparison_hosts(first.id)
    assert rep.measured < rep.comparisons  # the kept ones answered from the DB
    assert rep.best == Configuration.of(core_count=2, thp="always", shp=128)
    # each comparison finished once
    keys = Counter((p, r.baseline.key(), r.candidate.key()) for p, r in done)
    assert max(keys.values()) == 1
    assert all(a is not None for a, _ in hosts.values())


@pytest.mark.postgres
def test_a_pool_sweep_on_postgresql_goes_through_the_queue_once(
    tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """On PostgreSQL the pool's pairs take the comparisons through the shared queue: each is
    queued, claimed and measured once, on the pair that claimed it, named in its row."""
    url = fresh_pg_database(request.getfixturevalue("pg_server"))
    exp = load_experiment(_fleet(tmp_path, 4))
    seen = InFlight()
    with open_store(url) as store:
        rep = run_sweep(exp, store=store, progress=seen)
        done = store.completed(rep.experiment_id)
        hosts = store.comparison_hosts(rep.experiment_id)
        states = store.queue_states([rep.experiment_id])[rep.experiment_id]
    assert seen.most > 1  # the two pairs measured at once
    assert rep.best == Configuration.of(core_count=2, thp="always", shp=128)
    keys = Counter((p, r.baseline.key(), r.candidate.key()) for p, r in done)
    assert max(keys.values()) == 1 and len(keys) == rep.comparisons
    assert {k: v for k, v in states.counts.items() if v} == {"done": rep.comparisons}
    names = {f"sim-{i:03d}" for i in range(4)}
    assert all(a in names and b in names and a != b for a, b in hosts.values())
    assert len(set(hosts.values())) == 2
    assert rep.clock_s < rep.host_time_s


def test_a_pool_with_more_pairs_than_knobs_walks_both_ways_at_once(tmp_path: Path) -> None:
    """Web/Skylake on 32 simulated hosts (16 pairs, 7 knobs): an ordered knob's settings run
    at once (its two walks on lanes of their own, or side by side, one comparison per
    setting, issue 31 item 3), each setting compared once; the soft SKU's two validations
    run at the same time, each pooled over pairs of its own (issue 31 item 1)."""
    root = Path(__file__).resolve().parents[2] / "experiments"
    text = (root / "web-skylake.toml").read_text()
    model = (root / "sim" / "web-skylake18.toml").resolve()
    text = text.replace('model = "sim/web-skylake18.toml"', f'model = "{model}"')
    path = tmp_path / "web.toml"
    path.write_text(text.replace("[hosts]\n", "[hosts]\nfleet = 32\n"))
    exp = load_experiment(path)
    store = open_store(f"sqlite:///{tmp_path}/r.db")
    try:
        rep = run_sweep(exp, store=store, seed=3)
        comps = {c.id: c for c in store.comparisons(rep.experiment_id)}
        on = {
            cid: {s["host"] for s in store.samples(cid)}
            for cid, c in comps.items()
            if c.purpose.startswith("validate:")
        }
    finally:
        store.close()
    shp = [
        int(c.candidate["shp"])
        for c in comps.values()
        if c.purpose == "knob:shp" and c.candidate["shp"] != c.baseline["shp"]
    ]
    assert len(shp) == len(set(shp)) and {v < 200 for v in shp} == {True, False}
    validate = {c.purpose: cid for cid, c in comps.items() if c.purpose.startswith("validate:")}
    assert set(validate) == {"validate:production", "validate:stock"}
    prod, stock = on[validate["validate:production"]], on[validate["validate:stock"]]
    assert len(prod) >= 8 and len(stock) >= 8 and not prod & stock  # >= 4 pairs each, apart
    for cid in validate.values():
        result = comps[cid].result
        assert result is not None and "pooled over" in result.method
    # in less host-clock time than host time; pools hold more hosts than one pair's two
    assert rep.clock_s < rep.host_time_s / 2
    assert rep.host_hours > 2 * rep.host_time_s / 3600
