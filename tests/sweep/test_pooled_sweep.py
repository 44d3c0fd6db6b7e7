"""A sweep on a pool whose comparisons are pooled over several pairs at once (issue 31 items
1 and 3): the scheduler gives a comparison k pairs when free pairs outnumber the ready tasks,
idle pairs join long comparisons, and the DB keeps one decision per comparison with its
strata (every pair's windows under its hosts' pool indices)."""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path
from typing import Any

from musku.domain import Configuration, ExperimentStatus
from musku.experiment import load_experiment
from musku.storage import open_store
from musku.sweep import run_sweep
from musku.sweep.runner import NullProgress
from musku.sweep.schedule import MAX_WIDTH, allocate, list_schedule
from tests.sweep.test_pool_sweep import _fleet

ROOT = Path(__file__).resolve().parents[2]
POOLED = re.compile(r"pooled over (\d+) pairs")


def _width(method: str) -> int:
    m = POOLED.search(method)
    return int(m.group(1)) if m else 1


def test_a_16_host_sweep_pools_comparisons_and_stores_one_decision_each(tmp_path: Path) -> None:
    exp = load_experiment(ROOT / "experiments" / "web-skylake-fleet16.toml")
    said: list[str] = []

    class Say(NullProgress):
        def message(self, text: str) -> None:
            said.append(text)

    with open_store(f"sqlite:///{tmp_path}/r.db") as store:
        rep = run_sweep(exp, store=store, seed=0, progress=Say())
        [rec] = store.experiments()
        rows = store.comparisons(rep.experiment_id)
        hosts = store.comparison_hosts(rep.experiment_id)
        done = store.completed(rep.experiment_id)
        wide = [c for c in rows if c.result is not None and _width(c.result.method) > 1]
        samples = {c.id: {s["host"] for s in store.samples(c.id)} for c in wide}
    assert ExperimentStatus(rec.status) is ExperimentStatus.DONE
    assert rep.pairs == 8
    # k > 1: some comparisons ran on several pairs at once, at most MAX_WIDTH
    assert wide, [c.result.method for c in rows if c.result is not None]
    assert all(2 <= _width(c.result.method) <= MAX_WIDTH for c in wide if c.result)
    # one decision per comparison: every row finished once, the summary counts them
    assert all(c.result is not None for c in rows)
    keys = Counter((p, r.baseline.key(), r.candidate.key()) for p, r in done)
    assert max(keys.values()) == 1 and len(done) == rep.comparisons == len(rows)
    for c in wide:
        assert c.result is not None
        k = _width(c.result.method)
        # its strata named in the reason, each pair's samples under its own hosts
        named = re.findall(r"(sim-\d{3})\+(sim-\d{3})", c.result.reason.split("strata: ")[-1])
        assert len(named) == k, c.result.reason
        assert samples[c.id] == {int(h[-3:]) for pair in named for h in pair}
        # a pool from the start has no one pair; one that others joined keeps its first
        assert hosts[c.id] in ((None, None), named[0])
    # the soft SKU is the paper's, the clock beats one pair's, host-hours count the pools
    assert rep.best == Configuration.of(
        **{**exp.baseline_config.as_dict(), "cdp": "6:5", "thp": "always", "shp": 300}
    )
    assert rep.sku is not None and rep.sku.vs_production.decision.value == "better"
    assert rep.clock_s < rep.host_time_s
    assert rep.host_hours * 3600 > 2 * rep.host_time_s  # pooled: more than one pair's hosts
    assert not any("degenerates" in m for m in said)


def test_a_pool_of_one_usable_pair_says_so_once_and_runs_todays_sweep(tmp_path: Path) -> None:
    exp = load_experiment(_fleet(tmp_path, 3))  # 3 hosts: one pair, sim-002 idles
    said: list[str] = []

    class Say(NullProgress):
        def message(self, text: str) -> None:
            said.append(text)

    rep = run_sweep(exp, progress=Say())
    assert sum("pooling degenerates" in m for m in said) == 1
    assert rep.pairs == 1
    assert all(_width(r.method) == 1 for o in rep.knobs for r in o.results)
    assert "pooled over" not in " ".join(r.method for o in rep.knobs for r in o.results)


def test_free_pairs_go_to_the_longest_chain_and_only_where_they_pay() -> None:
    """allocate: one pair per ready task while pairs are scarce; spare pairs to the longest
    chain, in a jump to a width that pays (a 2-pair pool does not), never past MAX_WIDTH."""

    def cost(i: int, k: int) -> float:  # a pool pays from 4 pairs, floor at 6
        return {1: 100.0, 2: 300.0, 3: 120.0, 4: 60.0, 5: 50.0}.get(k, 45.0)

    prio = {0: 500.0, 1: 100.0, 2: 300.0}
    assert allocate(2, [0, 1, 2], prio, cost) == {0: 1, 2: 1}  # scarce: today's schedule
    assert allocate(3, [0, 1, 2], prio, cost) == {0: 1, 1: 1, 2: 1}
    assert allocate(6, [0, 1, 2], prio, cost) == {0: 4, 1: 1, 2: 1}  # the jump to 4
    assert allocate(64, [0], prio, cost) == {0: 6}  # a seventh pair would not pay
    assert allocate(64, [0], prio, lambda i, k: 100.0 / k) == {0: MAX_WIDTH}
    assert allocate(5, [0], prio, None) == {0: 1}  # no cost curve: whole tasks on one pair
    # the list schedule with pools is never longer than without
    costs = [100.0, 100.0, 100.0]
    deps = {2: [0, 1]}
    plain = list_schedule(costs, 8, deps)[0]
    pooled = list_schedule(costs, 8, deps, cost_at=cost)[0]
    assert pooled < plain


def test_a_pair_failing_mid_comparison_leaves_the_others_to_finish_it(tmp_path: Path) -> None:
    """A task given the pool's 4 pairs: one pair's link goes down for good mid-comparison;
    the comparison finishes on the other three (the failed pair's stratum kept to its last
    look, named in the reason) and the pair is out of the pool for what follows."""
    from musku.errors import HostError
    from tests.sweep.test_schedule import _pool_runner

    runner, pool = _pool_runner(tmp_path, 8)
    try:
        base = runner.experiment.baseline_config
        pair = pool.pairs[2]
        real = pair.windows
        left = [400]

        def windows(seconds: float, count: int) -> Any:  # the link dies after 400 windows
            if left[0] < count:
                raise HostError(f"{pair.hosts[0].name}: link down")
            left[0] -= count
            return real(seconds, count)

        pair.windows = windows  # type: ignore[method-assign]
        [r] = runner.map(
            lambda lane, c: lane.compare("t", base, c),
            [base.with_("thp", "always")],
            tag="t",
            cost=[100.0],
            cost_at=lambda i, k: 100.0 / k,
        )
        name = "+".join(pool.host_names(2))
        assert "pooled over 4 pairs" in r.method
        assert f"{name} failed (" in r.reason and "kept to its last look" in r.reason
        assert r.decision.value == "better", r.reason
        assert 2 in pool.failed and pool.live() == [0, 1, 3]
    finally:
        pool.close()
