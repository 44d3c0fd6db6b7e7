"""Host pools: pairing, the refusals of bad pools, the sim fleet's hosts, failed pairs."""

from __future__ import annotations

import dataclasses
import os
import signal
import threading
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from musku.cli import main
from musku.domain import Configuration
from musku.errors import HostError, InputError
from musku.experiment import load_experiment
from musku.hosts.pool import Locked, derive_seed, form_pairs, open_pool
from musku.sim.fleet import fleet_biases, open_fleet
from musku.storage import open_store
from musku.storage.records import ComparisonStatus
from musku.sweep import strategies
from musku.sweep.runner import Runner
from tests.fixtures.toy import EXPERIMENT, MODEL

ROOT = Path(__file__).resolve().parents[2]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.text(min_size=1, max_size=6), min_size=2, max_size=60, unique=True))
def test_pairs_are_disjoint_and_use_every_host_at_most_once(names: list[str]) -> None:
    pairs, idle = form_pairs(names)
    used = [i for p in pairs for i in p]
    assert len(used) == len(set(used))  # disjoint: each host in at most one pair
    assert all(a != b for a, b in pairs)
    assert len(pairs) == len(names) // 2
    # every host is in a pair, but the odd pool's one idle host
    assert set(used) | ({idle} if idle is not None else set()) == set(range(len(names)))
    assert (idle is not None) == (len(names) % 2 == 1)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.sampled_from("abcdef"), min_size=2, max_size=12))
def test_a_host_listed_twice_is_refused(names: list[str]) -> None:
    if len(set(names)) == len(names):
        form_pairs(names)
        return
    with pytest.raises(InputError, match="listed twice"):
        form_pairs(names)


@pytest.mark.parametrize("names", [[], ["only"]])
def test_a_pool_of_fewer_than_two_is_refused(names: list[str]) -> None:
    with pytest.raises(InputError, match="too small"):
        form_pairs(names)


def test_derived_seeds_depend_on_what_they_name_only() -> None:
    assert derive_seed(7, "pair", 3) == derive_seed(7, "pair", 3)
    seeds = {derive_seed(7, "pair", p) for p in range(200)} | {derive_seed(8, "pair", 0)}
    assert len(seeds) == 201
    assert all(0 <= s < 2**31 for s in seeds)


def _exp(tmp_path: Path, hosts: str, mode: str = "independent") -> Path:
    (tmp_path / "toy-model.toml").write_text(MODEL)
    text = EXPERIMENT.format(name="toy", mode=mode)
    text = text[: text.index("[hosts]")] + hosts
    path = tmp_path / "exp.toml"
    path.write_text(text)
    return path


SIM = '[hosts]\nbackend = "sim"\nmodel = "toy-model.toml"\n'


def test_a_fleet_is_pairs_of_hosts_with_the_groups_biases(tmp_path: Path) -> None:
    exp = load_experiment(_exp(tmp_path, SIM + "fleet = 7\nbias_sd = 0.01\n"))
    pool = open_fleet(exp, seed=5)
    try:
        assert len(pool) == 3 and pool.idle == ["sim-006"]
        assert [pool.host_names(p) for p in range(3)] == [
            ("sim-000", "sim-001"),
            ("sim-002", "sim-003"),
            ("sim-004", "sim-005"),
        ]
        # the biases are the multi-arm group's draw; each pair's is its hosts' ratio
        b = fleet_biases(pool.pairs[0].model, 7, 5, 0.01)  # type: ignore[attr-defined]
        assert pool.biases == b and len(set(b)) == 7
        for p, (i, j) in enumerate(pool.groups):
            rel = pool.pairs[p].host_bias  # type: ignore[attr-defined]
            assert rel == pytest.approx((1 + b[j]) / (1 + b[i]) - 1)
        # same seed, same fleet; another seed, other hosts
        again = open_fleet(exp, seed=5)
        assert again.biases == b
        assert open_fleet(exp, seed=6).biases != b
        desc = pool.describe()
        assert [h["name"] for h in desc["hosts"]] == [f"sim-{i:03d}" for i in range(7)]
        assert desc["pool"]["idle"] == ["sim-006"]
    finally:
        pool.close()


@pytest.mark.parametrize(
    ("hosts", "message", "code"),
    [
        (SIM + "fleet = 1\n", "fleet = 1: a pool needs at least 2 hosts", 3),
        (SIM + "fleet = 0\n", "a pool needs at least 2 hosts", 3),
        (
            '[hosts]\nbackend = "local"\nfleet = 4\n',
            "the local backend cannot have a fleet",
            3,
        ),
        (
            '[hosts]\nbackend = "agent"\nhosts = ["a", "b", "a"]\n',
            "host 'a' is listed twice",
            3,
        ),
        ('[hosts]\nbackend = "agent"\nhosts = ["a"]\n', "at least two hosts", 3),
        (SIM + "fleet = 4\nhost_bias = 0.01\n", "give bias_sd instead", 3),
    ],
)
def test_bad_pools_are_one_line_with_exit_3(
    tmp_path: Path, hosts: str, message: str, code: int, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _exp(tmp_path, hosts)
    with pytest.raises(InputError, match=message):
        load_experiment(path)
    with pytest.raises(SystemExit) as exit_:
        main(["sweep", str(path), "--db", f"sqlite:///{tmp_path}/r.db", "-q"])
    assert exit_.value.code == code
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "r.db").exists()  # refused before anything is written


def test_an_agent_pool_opens_one_pair_per_two_hosts_and_names_the_idle_one(
    tmp_path: Path,
) -> None:
    exp = load_experiment(
        _exp(tmp_path, '[hosts]\nbackend = "agent"\nhosts = ["h0", "h1", "h2", "h3", "h4"]\n')
    )
    opened: list[tuple[list[Any], int]] = []
    sim = load_experiment(_exp(tmp_path / "s", SIM)) if (tmp_path / "s").mkdir() is None else None
    assert sim is not None

    def fake_open(e: Any, seed: int) -> Any:
        # each pair is opened by the backend factory on its own two hosts
        opened.append((list(e.hosts.options["hosts"]), seed))
        if e.hosts.options["hosts"] == ["h2", "h3"]:
            raise HostError("h2: connect timed out after 10 s")
        from musku.sim.pair import open_pair

        return open_pair(sim, seed=seed)

    pool = open_pool(exp, seed=3, open_pair=fake_open)
    try:
        assert [h for h, _ in opened] == [["h0", "h1"], ["h2", "h3"]]
        assert len({s for _, s in opened}) == 2
        assert pool.idle == ["h4"]
        assert pool.live() == [0]  # the unreachable pair is failed, the rest goes on
        assert "timed out" in pool.failed[1]
    finally:
        pool.close()


class _Flaky:
    """A pair that fails (HostError, as a silent agent's bounded timeout) after some windows."""

    def __init__(self, pair: Any, after: int) -> None:
        self._pair, self._left = pair, after

    def __getattr__(self, name: str) -> Any:
        return getattr(self._pair, name)

    def windows(self, seconds: float, count: int) -> Any:
        self._left -= count
        if self._left < 0:
            raise HostError("sim-002: agent silent for 30 s (lease lapsed)")
        return self._pair.windows(seconds, count)

    def window(self, seconds: float) -> Any:
        return self.windows(seconds, 1)[0]


def test_a_failed_pair_is_marked_and_the_rest_of_the_pool_goes_on(tmp_path: Path) -> None:
    exp = load_experiment(_exp(tmp_path, SIM + "fleet = 6\n"))
    pool = open_fleet(exp, seed=1)
    pool.pairs[1] = _Flaky(pool.pairs[1], after=50)  # type: ignore[assignment]
    store = open_store(f"sqlite:///{tmp_path}/r.db")
    exp_id = store.create_experiment(exp)
    store.add_hosts(exp_id, pool.describe())
    runner = Runner(
        exp, pool.pairs[0], pool=pool, seed=1, store=Locked(store), experiment_id=exp_id
    )
    try:
        best, outcomes = strategies.independent(runner)
        records = store.comparisons(exp_id)
        hosts = store.comparison_hosts(exp_id)
    finally:
        pool.close()
        store.close()
    assert list(pool.failed) == [1] and "lease lapsed" in pool.failed[1]
    # every knob was scanned to the end on the pairs that stayed up
    assert [o.knob for o in outcomes] == list(exp.service.knobs)
    assert all(o.results for o in outcomes)
    assert best["thp"] == "always"
    # the failed pair's comparison is aborted (not left running), and ran again elsewhere
    status = Counter(r.status for r in records)
    assert status[ComparisonStatus.RUNNING] == 0 and status[ComparisonStatus.ABORTED] == 1
    [aborted] = [r for r in records if r.status is ComparisonStatus.ABORTED]
    assert hosts[aborted.id] == ("sim-002", "sim-003")
    again = [
        r
        for r in records
        if r.status is ComparisonStatus.FINISHED
        and (r.purpose, r.candidate) == (aborted.purpose, aborted.candidate)
    ]
    assert len(again) == 1 and hosts[again[0].id] != ("sim-002", "sim-003")


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root (the agents' fake hosts)")
def test_an_agent_pool_drives_its_pairs_at_once_and_goes_on_without_a_dead_one(
    tmp_path: Path,
) -> None:
    """Four real agent daemons on fake hosts (Unix sockets) and one host whose agent is not
    there: pairs (a, b), (c, d) are driven at once; (e, f) cannot be reached: marked failed."""
    from tests.agent.helpers import THP, config, fake_host, spawn_daemon

    daemons = []
    entries: list[dict[str, str]] = []
    for name in "abcd":
        host = fake_host(tmp_path / name / "host")
        cfg = config(tmp_path / name, sample_interval_s=0.05)
        daemons.append((spawn_daemon(cfg, host), host))
        entries.append({"name": name, "socket": str(cfg.socket)})
    entries += [
        {"name": "e", "socket": str(tmp_path / "e.sock")},
        {"name": "f", "socket": str(tmp_path / "f.sock")},
    ]
    exp = load_experiment(ROOT / "experiments" / "local-vm.toml")
    exp = dataclasses.replace(
        exp,
        hosts=dataclasses.replace(exp.hosts, backend="agent", options={"hosts": entries}),
    )
    pool = open_pool(exp, seed=1)
    try:
        assert [pool.host_names(p) for p in range(3)] == [("a", "b"), ("c", "d"), ("e", "f")]
        assert pool.live() == [0, 1] and "cannot reach" in pool.failed[2]
        runner = Runner(exp, pool.pairs[0], pool=pool, seed=1)
        inside = threading.Barrier(2, timeout=60)  # both pairs inside their task at once
        always = Configuration.of({"thp": "always"})

        def task(lane: Runner, i: int) -> tuple[str, str]:
            inside.wait()
            lane.pair.apply((always, always))
            a, b = lane.pair.window(0.2)
            assert a.valid and b.valid
            return lane.pair.hosts[0].name, lane.pair.hosts[1].name

        assert runner.map(task, [0, 1]) == [("a", "b"), ("c", "d")]
        assert all("[always]" in h.read(THP) for _, h in daemons)
        pool.restore()
        assert all("[always]" not in h.read(THP) for _, h in daemons)
    finally:
        pool.close()
        for pid, _ in daemons:
            os.kill(pid, signal.SIGTERM)
            os.waitpid(pid, 0)
