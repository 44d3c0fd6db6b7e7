"""Guardrails on a multi-arm scan (issue 32 item 4): every candidate arm is checked at every
look; a breach eliminates the arm at once, puts its host back on the baseline, and its per-arm
row says ``guardrail`` as the pairwise test's would. A scan with no breach is unchanged."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from musku.design.group import run_scan
from musku.domain import Decision
from musku.experiment import load_experiment
from musku.sim.group import SimGroup
from musku.sim.model import SimModel
from musku.storage import open_store
from musku.sweep import run_sweep
from tests.sweep.test_multiarm_sweep import WEB, _web


def _setup() -> tuple[Any, SimModel]:
    exp = load_experiment(WEB)
    return exp, SimModel.load(exp.resolve(exp.hosts.options["model"]), space=exp.space)


def test_a_breaking_arm_goes_at_its_first_look_and_its_host_back_to_the_baseline() -> None:
    exp, model = _setup()
    base = exp.baseline_config
    # core_count 2 and 4: QoS violations 60 % / 30 % (limit 1 %); 16: within every guardrail
    arms = [base, base.with_("core_count", 2), base.with_("core_count", 4)]
    arms.append(base.with_("core_count", 16))
    for seed in range(3):
        g = SimGroup(model, 4, seed=seed, initial=base)
        ran: list[np.ndarray] = []
        r = run_scan(
            g,
            arms,
            exp.stats,
            guardrails=exp.spec.guardrails,
            on_period=lambda p, row, t, means, ran=ran: ran.append(row.copy()),
        )
        assert set(r.guardrail) == {1, 2}, r.guardrail
        assert all(why.startswith("guardrail qos_violation_rate") for why in r.guardrail.values())
        assert {1, 2} <= set(r.outcome.eliminated) and not {1, 2} & set(r.outcome.active)
        assert r.outcome.best not in (1, 2)
        # they ran in the first period only (the first look), never after it
        assert {1, 2} <= set(ran[0].tolist())
        assert all(not {1, 2} & set(row.tolist()) for row in ran[1:])
        assert len(ran) > 1
        # ... their hosts ran the baseline instead (shown as -arm)
        assert {-1, -2} <= {int(a) for row in ran[1:] for a in row}
        # no host of the group is left on a breaking setting
        assert all(c["core_count"] not in (2, 4) for c in g.configs)
        # arm 3 (16 cores) is measured to the end, not pruned
        assert 3 in ran[-1].tolist() or 3 in r.outcome.eliminated


def test_a_scan_with_no_breach_is_unchanged_by_the_guardrails() -> None:
    exp, model = _setup()
    base = exp.baseline_config
    for arms in ([base] * 4, [base, *(base.with_("core_count", v) for v in (14, 16))]):
        got = []
        for guard in ((), exp.spec.guardrails):
            g = SimGroup(model, len(arms), seed=7, initial=base)
            got.append(run_scan(g, arms, exp.stats, guardrails=guard))
        a, b = got
        assert not b.guardrail
        assert (a.periods, a.samples, a.host_time_s) == (b.periods, b.samples, b.host_time_s)
        assert a.outcome == b.outcome and a.estimates == b.estimates


def test_multiarm_sweep_prunes_the_breaking_core_counts_by_the_guardrail(tmp_path: Path) -> None:
    exp = load_experiment(_web(tmp_path, 8))
    store = open_store(f"sqlite:///{tmp_path}/r.db")
    try:
        rep = run_sweep(exp, store=store, seed=1)
        assert rep.experiment_id is not None
        rows = [
            c for c in store.comparisons(rep.experiment_id) if c.purpose == "multiarm:core_count"
        ]
        samples = {c.id: store.samples(c.id) for c in rows}
    finally:
        store.close()
    model = SimModel.load(exp.resolve(exp.hosts.options["model"]), space=exp.space)
    limit = {g.metric: g.limit for g in exp.spec.guardrails}["qos_violation_rate"]
    breaking = {
        v
        for v in exp.space["core_count"]
        if model.point(exp.baseline_config.with_("core_count", v)).qos > 2 * limit
    }
    assert breaking  # 2, 4, 6, 8 cores in the Web/Skylake model
    pruned = {
        c.candidate["core_count"]
        for c in rows
        if c.result and c.result.decision is Decision.GUARDRAIL
    }
    assert pruned == breaking
    for c in rows:
        assert c.result is not None
        if c.candidate["core_count"] in breaking:
            assert c.result.reason.startswith("guardrail qos_violation_rate <= 0.01 broken")
            # measured on the candidate in the first period (the first look) only
            # the row ends at that look, as a pairwise comparison stopped by a guardrail
            assert {s["period"] for s in samples[c.id]} == {0}
            assert sorted(s["role"] for s in samples[c.id]) == ["A", "B"]
        else:  # one host per role and period
            periods = {s["period"] for s in samples[c.id]}
            assert len(samples[c.id]) == 2 * len(periods) > 2
    (knob,) = [o for o in rep.knobs if o.knob == "core_count"]
    assert set(knob.pruned) == breaking
    assert knob.best_value not in breaking
    assert rep.best["core_count"] == 18


class _QosService:
    """A service writing musku-stats/1 whose QoS violations depend on its host's THP setting:
    20 % of requests with THP ``never``, none otherwise (the agent's service sampler turns the
    counters into ``qos_violation_rate``)."""

    def __init__(self, path: Path, host: Any) -> None:
        import threading

        self.path, self.host = path, host
        self.stop = threading.Event()
        self.t = threading.Thread(target=self.run, daemon=True)

    def run(self) -> None:
        import json
        import os
        import time

        from tests.agent.helpers import THP

        last, req, bad = time.time(), 0.0, 0.0
        while not self.stop.is_set():
            now = time.time()
            n = (now - last) * 2000.0
            last = now
            req += n
            bad += n * (0.2 if "[never]" in self.host.read(THP) else 0.0)
            tmp = self.path.with_suffix(".tmp")
            counters = {"requests": int(req), "qos_violations": int(bad)}
            tmp.write_text(
                json.dumps({"format": "musku-stats/1", "pid": 1, "t": now, "counters": counters})
            )
            os.replace(tmp, self.path)
            time.sleep(0.02)


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root")
def test_an_agent_group_prunes_an_arm_whose_hosts_report_a_broken_guardrail(
    tmp_path: Path,
) -> None:
    """Three real agent daemons (fake hosts, Unix sockets): the arm THP ``never`` breaks
    ``qos_violation_rate <= 0.01`` on whichever host runs it; it goes at its first look and
    that host is back on the baseline at once."""
    from musku.domain import Configuration, Guardrail, StatsSettings
    from musku.hosts.agent import AgentGroup, AgentHost, SocketLink
    from tests.agent.helpers import THP, config, fake_host, spawn_daemon
    from tests.hosts.test_hostpair_contract import _stop
    from tests.timing import scaled

    daemons: list[tuple[int, Any, _QosService]] = []
    hosts: list[AgentHost] = []
    try:
        for name in "abc":
            host = fake_host(tmp_path / name / "host")
            svc = _QosService(tmp_path / name / "stats.json", host)
            svc.t.start()
            cfg = config(
                tmp_path / name,
                sample_interval_s=0.05,
                samplers={"service": {"stats_file": str(svc.path)}},
            )
            daemons.append((spawn_daemon(cfg, host, timeout=scaled(20.0)), host, svc))
        for name in "abc":
            h = AgentHost(name, SocketLink(tmp_path / name / "agent.sock"))
            h.hello()
            hosts.append(h)
        g = AgentGroup(
            hosts,
            metric="qps",
            lease_s=scaled(10.0),
            name="guard",
            tick_s=0.1,
            guard_metrics=["qos_violation_rate"],
        )
        arms = [Configuration.of(thp=v) for v in ("madvise", "always", "never")]
        ran: list[list[int]] = []

        def on_period(p: int, row: Any, t: float, means: Any) -> None:
            ran.append([int(a) for a in row])

        st = StatsSettings(warmup_s=0.0, sample_interval_s=0.1, sample_cap=24)
        r = run_scan(
            g,
            arms,
            st,
            pilot_windows=8,
            min_period_windows=8,
            on_period=on_period,
            guardrails=[Guardrail("qos_violation_rate", "<=", 0.01)],
        )
        thp_at_end = [h.read(THP) for _, h, _ in daemons]
        assert set(r.guardrail) == {2}, (r.guardrail, r.outcome)
        assert r.guardrail[2].startswith("guardrail qos_violation_rate <= 0.01 broken")
        assert len(ran) > 1 and 2 in ran[0] and all(2 not in row for row in ran[1:])
        assert all("[never]" not in t for t in thp_at_end)
        assert g.guard["qos_violation_rate"].shape[1] == 3
        g.restore()
        g.close()
    finally:
        for h in hosts:
            h.link.close()
        _stop(daemons)
