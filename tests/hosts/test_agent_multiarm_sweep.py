"""The ``mode = "multiarm"`` strategy on four real agent daemons (fake hosts, Unix
sockets): the knob's scan runs as one group of three of the pool's agents, its per-arm rows are
stored, every host is put back at the end."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from musku.domain import Decision
from musku.experiment import load_experiment
from musku.storage import open_store
from musku.sweep.multiarm import multiarm
from musku.sweep.sweep import experiment_run
from tests.agent.helpers import THP
from tests.hosts.test_hostpair_contract import _spawn, _stop
from tests.timing import scaled

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root")


def test_a_multiarm_sweep_on_agent_hosts(tmp_path: Path) -> None:
    daemons = _spawn(tmp_path, "abcd", {})
    try:
        hosts = ", ".join(
            f'{{ name = "{n}", socket = "{tmp_path / n / "agent.sock"}" }}' for n in "abcd"
        )
        path = tmp_path / "agents.toml"
        path.write_text(
            '[experiment]\nname = "agent-multiarm"\n[service]\nname = "svc"\nknobs = ["thp"]\n'
            '[platform]\ncatalog = "firecracker-vm"\n[sweep]\nmode = "multiarm"\n'
            '[metric]\nprimary = "qps"\ndirection = "higher"\n'
            "[statistics]\nwarmup_s = 0.0\nsample_interval_s = 0.1\nsample_cap = 24\n"
            # the lease: 10 s on an idle machine; a busy one renews it late, and a lapsed lease
            # reverts the host under the group ("host not at the arm's configuration")
            f'[hosts]\nbackend = "agent"\nlease_s = {scaled(10.0):.1f}\nhosts = [{hosts}]\n'
        )
        exp = load_experiment(path)
        store = open_store(f"sqlite:///{tmp_path}/r.db")
        try:
            # the strategy as run_sweep runs it, less the soft SKU's pairwise validation (about
            # half a minute of the pair tester on these hosts; the sim tests cover it)
            with experiment_run(exp, store=store, seed=2) as runner:
                best, outcomes = multiarm(runner)
                # the group put its hosts back when the knob's scans ended
                base_thp = exp.baseline_config["thp"]
                assert all(f"[{base_thp}]" in host.read(THP) for _, host, _ in daemons[:3])
                exp_id = runner.experiment_id
            assert exp_id is not None
            rows = store.comparisons(exp_id)
            samples = {c.id: store.samples(c.id) for c in rows}
        finally:
            store.close()
        # the fake service's rate does not depend on thp: no setting is declared better
        assert best == exp.baseline_config
        assert [o.knob for o in outcomes] == ["thp"] and len(outcomes[0].results) == 2
        mine = [c for c in rows if c.purpose == "multiarm:thp"]
        others = {exp.baseline_config.with_("thp", v).key() for v in exp.space["thp"]} - {
            exp.baseline_config.key()
        }
        assert {c.candidate.key() for c in mine} == others
        for c in mine:
            assert c.result is not None and c.result.decision is not Decision.BETTER
            assert c.hosts is not None and set(c.hosts) <= set("abc")
            assert samples[c.id] and {s["role"] for s in samples[c.id]} == {"A", "B"}
        # every host back at its own setting after the sweep
        assert all("[madvise]" in host.read(THP) for _, host, _ in daemons)
    finally:
        _stop(daemons)
