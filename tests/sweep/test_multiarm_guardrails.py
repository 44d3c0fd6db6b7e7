"""Guardrails on a multi-arm scan (issue 32 item 4, issue 31 item 6): every candidate arm is
checked in a short probe before it runs a full period (the guardrails and the primary metric's
floor), then at every look; a breach eliminates the arm at once, puts its host back on the
baseline, and its per-arm row says ``guardrail`` as the pairwise test's would. A scan with no
breach is unchanged."""

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


def test_a_breaking_arm_is_stopped_in_the_probe_and_its_host_back_to_the_baseline() -> None:
    exp, model = _setup()
    base = exp.baseline_config
    # core_count 2 and 4: QoS violations 60 % / 30 % (limit 1 %); THP always: within every
    # guardrail (+1.5 % over production)
    arms = [base, base.with_("core_count", 2), base.with_("core_count", 4)]
    arms.append(base.with_("thp", "always"))
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
        for why in r.guardrail.values():
            assert why.startswith("guardrail qos_violation_rate") and "(in the probe)" in why
        assert {1, 2} <= set(r.outcome.eliminated) and not {1, 2} & set(r.outcome.active)
        assert r.outcome.best not in (1, 2)
        # stopped in the probe: their hosts ran the baseline from the first period on (-arm)
        assert {-1, -2} <= set(ran[0].tolist())
        assert all(not {1, 2} & set(row.tolist()) for row in ran)
        assert len(ran) > 1
        assert {-1, -2} <= {int(a) for row in ran[1:] for a in row}
        # no host of the group is left on a breaking setting
        assert all(c["core_count"] not in (2, 4) for c in g.configs)
        # arm 3 (THP always) is measured to the end, not pruned
        assert 3 in ran[-1].tolist() or 3 in r.outcome.eliminated


class _Recording(SimGroup):
    """A simulated group that logs every apply (clock, configurations): how long each host ran
    each configuration, from the group's own clock."""

    log: list[tuple[float, list[Any]]]

    def apply(self, configs: Any) -> float:
        if not hasattr(self, "log"):
            self.log = []
        self.log.append((self.t, list(configs)))
        return super().apply(configs)


def _seconds_on(g: _Recording, cfg: Any) -> float:
    """Host seconds (summed over hosts) the group ran ``cfg``, apply to apply."""
    total = 0.0
    marks = [*g.log, (g.t, [])]
    for (t0, cfgs), (t1, _) in zip(marks, marks[1:], strict=False):
        total += sum(t1 - t0 for c in cfgs if c == cfg)
    return total


def test_the_87_percent_mips_arm_is_stopped_within_the_probe_without_any_guardrail() -> None:
    """core_count 2 costs 87 % of MIPS in the Web/Skylake model: with no [[guardrails]] at
    all, the primary metric's floor stops it within the probe (about a minute of windows after
    the warm-up), its host goes back to the baseline at once, and the scan goes on with the
    other arms."""
    exp, model = _setup()
    base = exp.baseline_config
    bad = base.with_("core_count", 2)
    arms = [base, bad, base.with_("thp", "always"), base.with_("shp", 300)]
    for seed in range(3):
        g = _Recording(model, 4, seed=seed, initial=base)
        ran: list[np.ndarray] = []
        r = run_scan(
            g,
            arms,
            exp.stats,
            on_period=lambda p, row, t, means, ran=ran: ran.append(row.copy()),
        )
        assert set(r.guardrail) == {1}, r.guardrail
        why = r.guardrail[1]
        assert why.startswith("guardrail primary metric >= -10% of the baseline broken")
        loss = float(why.split("candidate ")[1].split("%")[0])
        assert -92.0 < loss < -80.0, why  # the model's -87 %, in the arm's warm-up
        # within the probe: one apply, the warm-up and the probe's windows on that host
        on_bad = _seconds_on(g, bad)
        assert 0 < on_bad <= exp.stats.warmup_s + 60 + model.timing.apply_s + 1, on_bad
        assert ran[0].tolist().count(-1) == 1 and all(1 not in row.tolist() for row in ran)
        assert all(c != bad for c in g.configs)
        # the rest of the scan went on: several periods, the other arms measured
        assert r.periods > 1 and {2, 3} <= {int(a) for row in ran for a in row}
        assert r.outcome.best != 1


def test_a_scan_whose_every_candidate_breaks_ends_in_the_probe() -> None:
    exp, model = _setup()
    base = exp.baseline_config
    arms = [base, base.with_("core_count", 2), base.with_("core_count", 4)]
    g = SimGroup(model, 3, seed=4, initial=base)
    r = run_scan(g, arms, exp.stats, guardrails=exp.spec.guardrails)
    assert set(r.guardrail) == {1, 2}
    assert r.outcome.decision is Decision.GUARDRAIL and r.outcome.best == 0
    assert r.periods == 1
    # one apply, the warm-up, the probe, the apply back: minutes, not the two design cycles
    assert r.host_time_s < exp.stats.warmup_s + 60 + 3 * model.timing.apply_s + 60
    assert all(c == base for c in g.configs)


def test_a_scan_with_no_breach_is_unchanged_by_the_guardrails() -> None:
    exp, model = _setup()
    base = exp.baseline_config
    good = [base.with_("thp", "always"), base.with_("shp", 300)]
    for arms in ([base] * 4, [base, *good]):
        got = []
        for guard in ((), exp.spec.guardrails):
            g = SimGroup(model, len(arms), seed=7, initial=base)
            got.append(run_scan(g, arms, exp.stats, guardrails=guard))
        a, b = got
        assert not a.guardrail and not b.guardrail
        assert (a.periods, a.samples, a.host_time_s) == (b.periods, b.samples, b.host_time_s)
        assert a.outcome == b.outcome and a.estimates == b.estimates


def test_the_probe_measures_the_windows_a_scan_without_it_would() -> None:
    """The probe is the first part of the first period: with nothing to stop, a scan with the
    probe measures the same windows and decides the same as one without it."""
    exp, model = _setup()
    base = exp.baseline_config
    arms = [base, base.with_("thp", "always"), base.with_("shp", 300)]
    got = []
    for probe in (60, 0):
        g = SimGroup(model, 3, seed=3, initial=base)
        got.append(
            run_scan(g, arms, exp.stats, guardrails=exp.spec.guardrails, probe_windows=probe)
        )
    a, b = got
    assert (a.periods, a.samples, a.host_time_s) == (b.periods, b.samples, b.host_time_s)
    assert a.outcome.decision == b.outcome.decision and a.outcome.best == b.outcome.best


def test_multiarm_sweep_stops_the_breaking_core_counts_in_the_probe(tmp_path: Path) -> None:
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
    base = exp.baseline_config

    def point(v: object) -> Any:
        return model.point(base.with_("core_count", v))

    breaking = {v for v in exp.space["core_count"] if point(v).qos > 2 * limit}
    assert breaking  # 2, 4, 6, 8 cores in the Web/Skylake model
    # far below the floor: 10, 12 and 14 cores (-37 %, -27 %, -18 % of MIPS)
    costly = {
        v
        for v in exp.space["core_count"]
        if point(v).throughput < 0.85 * point(base["core_count"]).throughput
    }
    pruned = {
        c.candidate["core_count"]: c.result.reason
        for c in rows
        if c.result and c.result.decision is Decision.GUARDRAIL
    }
    assert breaking | costly <= set(pruned), pruned
    for v, why in pruned.items():
        assert "in the probe" in why
        if v in breaking:
            assert why.startswith("guardrail qos_violation_rate <= 0.01 broken")
    for c in rows:
        assert c.result is not None
        if c.candidate["core_count"] in pruned:
            # stopped in the probe, before the first look: no period of it to store
            assert samples[c.id] == []
        else:  # one host per role and period
            periods = {s["period"] for s in samples[c.id]}
            assert len(samples[c.id]) == 2 * len(periods) > 2
    (knob,) = [o for o in rep.knobs if o.knob == "core_count"]
    assert set(knob.pruned) == set(pruned)
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
        # stopped in the probe: its host ran the baseline from the first period on
        assert "(in the probe)" in r.guardrail[2]
        assert len(ran) > 1 and -2 in ran[0] and all(2 not in row for row in ran)
        assert all("[never]" not in t for t in thp_at_end)
        assert g.guard["qos_violation_rate"].shape[1] == 3
        g.restore()
        g.close()
    finally:
        for h in hosts:
            h.link.close()
        _stop(daemons)


def test_a_knob_whose_probe_stops_arms_is_scanned_again_on_more_squares() -> None:
    """core_count on Web/Skylake (9 settings, 9 hosts, a reboot per change): the probe stops
    the settings that break a guardrail or the MIPS floor; the arms left are scanned at once
    without them, on as many Williams squares as the 9 hosts hold, until a scan's probe stops
    nothing more or every candidate is gone; the knob stays at 18 cores. Seed 5: 2-12 cores
    stopped on 9 hosts, then 14 of (18, 14, 16) on three squares, then 16 on four; seed 0:
    every setting in the first probe (16 cores, -9 %, in its reboot's warm-up)."""
    from musku.design.fleet import scan_knob

    exp, model = _setup()
    for seed, scans in ((5, 3), (0, 1)):
        results: list[Any] = []
        ks = scan_knob(
            exp,
            model,
            "core_count",
            9,
            seed,
            on_scan=lambda r, g, periods, results=results: results.append((r, g.n)),
        )
        assert ks.chosen == 18 and ks.hosts == 9 and ks.scans == len(results) == scans
        assert ks.time_s == pytest.approx(sum(r.host_time_s for r, _ in results))
        assert ks.time_s < 0.5 * 3600  # the whole knob: minutes of probes, no design cycle
        stopped: set[object] = set()
        for i, (r, n) in enumerate(results):
            assert n == r.replicas * len(r.arms) and r.replicas == min(4, 9 // len(r.arms))
            assert r.arms[0]["core_count"] == 18
            assert not {a["core_count"] for a in r.arms[1:]} & stopped  # never run again
            assert all("in the probe" in why for why in r.guardrail.values())
            stopped |= {r.arms[k]["core_count"] for k in r.guardrail}
            last = i == len(results) - 1
            assert r.restarted is not last and (r.periods == 0) is not last
        (r, _) = results[-1]
        assert r.outcome.decision is Decision.GUARDRAIL and r.outcome.best == 0
        assert stopped == set(exp.space["core_count"]) - {18}
