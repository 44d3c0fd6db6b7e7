"""The pool's scheduler (issue 31 item 2): the first free pair on the host clock takes the
ready task with the longest expected chain; no pair idles while a task is ready; the
assignment is a function of the seed, not of thread timing; the dry-run's estimate is the
same schedule with expected times."""

from __future__ import annotations

import random
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from musku.domain import Configuration
from musku.experiment import load_experiment
from musku.hosts.pool import open_pool
from musku.sweep import run_sweep
from musku.sweep.runner import NullProgress, Runner
from musku.sweep.schedule import CostModel, chains, estimate_clock, list_schedule
from musku.sweep.sweep import open_pair
from tests.fixtures.toy import EXPERIMENT, MODEL


def _fleet(tmp_path: Path, n: int, mode: str = "independent") -> Path:
    (tmp_path / "toy-model.toml").write_text(MODEL)
    path = tmp_path / f"toy-{mode}-{n}.toml"
    text = EXPERIMENT.format(name="toy", mode=mode).replace("[hosts]\n", f"[hosts]\nfleet = {n}\n")
    path.write_text(text)
    return path


costs_st = st.lists(st.floats(0.0, 100.0, allow_nan=False), min_size=1, max_size=25)


@settings(max_examples=200, deadline=None)
@given(costs=costs_st, pairs=st.integers(1, 8))
def test_list_schedule_is_within_grahams_bound(costs: list[float], pairs: int) -> None:
    """Without dependencies: no pair idles while a task waits, so the makespan is at most the
    mean load plus the longest task (Graham), and at least both; the longest task starts
    first, at 0."""
    span, where = list_schedule(costs, pairs)
    total, longest = sum(costs), max(costs)
    assert span >= max(longest, total / pairs) - 1e-9
    assert span <= total / pairs + longest + 1e-9
    assert len(where) == len(costs) and set(where) <= set(range(pairs))
    if pairs == 1:
        assert span == pytest.approx(total)


@settings(max_examples=200, deadline=None)
@given(
    costs=costs_st,
    pairs=st.integers(1, 6),
    data=st.data(),
)
def test_list_schedule_honours_dependencies(costs: list[float], pairs: int, data: Any) -> None:
    """With dependencies (a task on earlier ones): the makespan is at least the longest
    chain, and no pair idles while a task is ready (each task starts at the later of its
    release and the moment some pair was free, i.e. the schedule is a list schedule)."""
    n = len(costs)
    deps = {i: sorted(data.draw(st.sets(st.integers(0, i - 1), max_size=3))) for i in range(1, n)}
    span, _ = list_schedule(costs, pairs, deps)
    longest_chain = max(chains(costs, deps).values())
    assert span >= longest_chain - 1e-9
    # a chain bound for list schedules: span <= longest chain + (work off it) / pairs
    assert span <= longest_chain + sum(costs) / pairs + 1e-9


def _pool_runner(tmp_path: Path, n_hosts: int, seed: int = 7) -> tuple[Runner, Any]:
    exp = load_experiment(_fleet(tmp_path, n_hosts))
    pool = open_pool(exp, seed=seed, open_pair=lambda e, s: open_pair(e, seed=s))
    live = pool.live()
    return Runner(exp, pool.pairs[live[0]], seed=seed, pool=pool), pool


class Jitter(NullProgress):
    """Random wall-clock delays at every comparison start: thread timing that differs from
    run to run (the scheduler must not follow it)."""

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)
        self.lock = threading.Lock()

    def comparison_started(self, purpose: str, baseline: Any, candidate: Any) -> None:
        with self.lock:
            delay = self.rng.uniform(0.0, 0.05)
        time.sleep(delay)


def _run_map(runner: Runner, tasks: list[list[Configuration]], costs: list[float], deps: Any):  # type: ignore[no-untyped-def]
    base = runner.experiment.baseline_config
    ran: dict[int, tuple[str, str]] = {}
    took: dict[int, float] = {}

    def work(r: Runner, item: tuple[int, list[Configuration]]) -> list[str]:
        i, candidates = item
        out = [r.compare(f"task{i}", base, c).decision.value for c in candidates]
        ran[i], took[i] = r.host_names(), r.clock_s
        return out

    before = runner.clock_s
    answers = runner.map(work, list(enumerate(tasks)), tag="t", cost=costs, deps=deps)
    return answers, ran, took, runner.clock_s - before


def test_the_pool_runs_the_list_schedule_whatever_the_thread_timing(tmp_path: Path) -> None:
    """Tasks of several comparisons each, with made-up expected costs and dependencies, on 3
    real simulated pairs: the host-clock and the pair of every task are exactly the list
    schedule's with the times the tasks took (the first free pair took the ready task with
    the longest expected chain, nobody idled while a task was ready), and a second run with
    other thread timing gives the same assignment and answers."""
    exp = load_experiment(_fleet(tmp_path, 6))
    base = exp.baseline_config
    settings_ = [base.with_("thp", "always"), base.with_("shp", 128), base.with_("thp", "never")]
    tasks = [settings_[: 1 + (i % 3)] for i in range(7)]
    costs = [1.0, 5.0, 2.0, 2.0, 9.0, 1.0, 3.0]
    deps = {5: [1], 6: [0, 4]}
    got = []
    for jitter in (1, 2):
        runner, pool = _pool_runner(tmp_path, 6)
        runner.progress = Jitter(jitter)
        try:
            got.append(_run_map(runner, tasks, costs, deps))
        finally:
            pool.close()
    (answers, ran, took, clock), (answers2, ran2, _, clock2) = got
    assert answers == answers2 and ran == ran2 and clock == clock2
    names = [pool.host_names(p) for p in range(len(pool))]
    span, where = list_schedule(costs, len(names), deps, durations=[took[i] for i in range(7)])
    assert clock == pytest.approx(span)
    assert [names[p] for p in where] == [ran[i] for i in range(7)]
    # the longest chain started first: task 4 (9 + task 6's 3) on the first pair at 0
    assert ran[4] == names[0]


def test_a_pool_sweep_is_reproducible_and_beats_its_one_pair_clock(tmp_path: Path) -> None:
    """The toy sweep on 8 hosts, twice with thread jitter: the same answers, pairs and clock;
    its estimate is the dry-run's (estimate_clock with the pool's pairs)."""
    exp = load_experiment(_fleet(tmp_path, 8))
    one = run_sweep(exp, progress=Jitter(3))
    two = run_sweep(exp, progress=Jitter(4))
    key = [
        (o.knob, r.candidate.key(), r.decision.value, r.estimate)
        for o in one.knobs
        for r in o.results
    ]
    assert key == [
        (o.knob, r.candidate.key(), r.decision.value, r.estimate)
        for o in two.knobs
        for r in o.results
    ]
    assert one.clock_s == two.clock_s and one.best == two.best
    assert one.estimate_clock_s == estimate_clock(exp, 4)
    assert one.estimate_clock_s is not None and one.estimate_clock_s > 0
    assert one.clock_s < one.host_time_s


def test_the_cost_model_charges_reboots_and_walk_stops(tmp_path: Path) -> None:
    exp = load_experiment(_fleet(tmp_path, 8))
    model = CostModel.of(exp)
    live = model.comparison_s(["thp"])
    rebooting = CostModel(**{**model.__dict__, "reboot_knobs": frozenset({"thp"})})
    assert rebooting.comparison_s(["thp"]) > live
    # a unimodal walk is expected to stop after three comparisons; a plain walk runs out
    assert model.walk_s("shp", [1, 2, 3, 4, 5], True) == pytest.approx(
        3 * model.comparison_s(["shp"])
    )
    assert model.walk_s("shp", [1, 2, 3, 4, 5], False) == pytest.approx(
        5 * model.comparison_s(["shp"])
    )
    # more pairs never lengthen the estimate; one pair is the knobs' scans end to end
    clocks = [estimate_clock(exp, p) for p in (1, 2, 4, 8)]
    assert all(c is not None for c in clocks)
    assert clocks == sorted(clocks, reverse=True)  # type: ignore[type-var]
