"""``[sweep] mode = "multiarm"``: each knob's scan as one multi-arm crossover on a group of a
simulated fleet; the paper's soft SKU; per-arm comparison rows; A/A; bad input (one line, exit 3)."""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import pytest

from musku.design.group import run_scan
from musku.domain import Decision, ExperimentStatus
from musku.errors import InputError, Interrupted
from musku.experiment import load_experiment
from musku.sim.group import SimGroup
from musku.sim.model import SimModel
from musku.storage import open_store
from musku.sweep import run_sweep
from musku.sweep.runner import NullProgress
from musku.testing.postgres import fresh_pg_database, pg_server  # noqa: F401 - fixtures
from tests.cli.test_exit_codes import musku, one_error_line

ROOT = Path(__file__).resolve().parents[2]
WEB = ROOT / "experiments" / "web-skylake.toml"


def _web(tmp: Path, fleet: int | None, mode: str = "multiarm", direction: str = "higher") -> Path:
    text = WEB.read_text()
    model = (WEB.parent / "sim" / "web-skylake18.toml").resolve()
    text = text.replace('model = "sim/web-skylake18.toml"', f'model = "{model}"')
    text = text.replace('mode = "independent"', f'mode = "{mode}"')
    text = text.replace('direction = "higher"', f'direction = "{direction}"')
    if fleet is not None:
        text = text.replace("[hosts]\n", f"[hosts]\nfleet = {fleet}\n")
    path = tmp / f"web-{mode}-{fleet}.toml"
    path.write_text(text)
    return path


def _paper(exp) -> dict[str, object]:  # type: ignore[no-untyped-def]
    """Each knob's best setting over production in the sim model (bench/fleet.py's check)."""
    model = SimModel.load(exp.resolve(exp.hosts.options["model"]), space=exp.space)
    return {k: model.best_setting(k, exp.production) for k in exp.space}


@pytest.mark.parametrize("fleet", [8, 16])
def test_multiarm_sweep_finds_the_papers_soft_sku_and_stores_per_arm_rows(
    tmp_path: Path, fleet: int
) -> None:
    exp = load_experiment(_web(tmp_path, fleet))
    store = open_store(f"sqlite:///{tmp_path}/r.db")
    try:
        rep = run_sweep(exp, store=store, seed=1)
        assert rep.experiment_id is not None
        rows = [c for c in store.comparisons(rep.experiment_id) if c.purpose.startswith("multi")]
        # the first row measured to the scan's end (a guardrail's rows end at their breach:
        # tests/sweep/test_multiarm_guardrails.py)
        first = next(c for c in rows if c.result and c.result.decision is not Decision.GUARDRAIL)
        samples = store.samples(first.id)
    finally:
        store.close()
    assert rep.mode == "multiarm"
    assert rep.best.as_dict() == _paper(exp)
    assert rep.sku is not None and rep.sku.vs_production.decision is Decision.BETTER
    base = exp.baseline_config
    names = {f"sim-{i:03d}" for i in range(fleet)}
    for knob in exp.service.knobs:
        mine = [c for c in rows if c.purpose == f"multiarm:{knob}"]
        # one row per candidate arm of every scan: at least one per setting other than the base
        wanted = {base.with_(knob, v).key() for v in exp.space[knob] if v != base[knob]}
        assert wanted <= {c.candidate.key() for c in mine}
        assert all(c.baseline == base and c.result is not None for c in mine)
        assert all(c.hosts and set(c.hosts) <= names and len(set(c.hosts)) == 2 for c in mine)
        assert all(
            c.result and c.result.ci_low <= c.result.estimate <= c.result.ci_high for c in mine
        )
        # a claimed difference's interval (at the Holm step that claimed it) excludes 0
        for c in mine:
            assert c.result is not None
            if c.result.decision is Decision.BETTER:
                assert c.result.ci_low > 0
            if c.result.decision is Decision.WORSE:
                assert c.result.ci_high < 0
        # the chosen setting was declared better than the baseline (or the baseline kept)
        if rep.best[knob] != base[knob]:
            chosen = base.with_(knob, rep.best[knob])
            assert any(
                c.candidate == chosen and c.result and c.result.decision is Decision.BETTER
                for c in mine
            )
    # samples: one per host and period, the baseline's host as A, the candidate's as B
    periods = {s["seq"] for s in samples}
    assert len(samples) == first.sample_count == 2 * len(periods) > 8
    assert {s["role"] for s in samples} == {"A", "B"} and all(s["value"] > 0 for s in samples)
    assert len({s["host"] for s in samples}) > 2  # the arms rotate over the group's hosts


def test_aa_all_arms_identical_declares_no_setting_better() -> None:
    exp = load_experiment(WEB)
    model = SimModel.load(exp.resolve(exp.hosts.options["model"]), space=exp.space)
    base = exp.baseline_config
    for seed in range(4):
        g = SimGroup(model, 4, seed=seed, initial=base)
        r = run_scan(g, [base] * 4, exp.stats)
        assert r.outcome.decision is not Decision.BETTER
        assert Decision.BETTER not in r.outcome.vs_baseline.values()
        assert "Holm" in r.method


def test_holm_claims_everything_bonferroni_does_and_more() -> None:
    from itertools import combinations

    from musku.design.sequential import MultiArmProcedure

    more = 0
    for seed in range(10):
        rng = np.random.default_rng(seed)
        procs = {f: MultiArmProcedure(4, 2, fwer=f) for f in ("holm", "bonferroni")}
        effect = np.array([0.0, 0.006, 0.008, 0.02])
        for b in range(40):
            row = effect + rng.normal(0, 0.01, 4)
            for p in procs.values():
                p.add(row, b % 2)
        claims = {}
        for f, proc in procs.items():
            cs = {k: proc.contrast(*k) for k in combinations(range(4), 2)}
            claims[f] = proc._claims(cs)  # type: ignore[arg-type]
        assert claims["bonferroni"] <= claims["holm"]
        more += len(claims["holm"]) > len(claims["bonferroni"])
        # the always-valid p-value: the sequence at that level just excludes 0
        pv = procs["holm"].p_value(0, 3)
        c = procs["holm"].contrast(0, 3, alpha=min(1.0 - 1e-9, (pv or 1.0) * 1.01))
        assert pv is not None and c is not None and (pv == 1.0 or c.low > 0 or c.high < 0)
    assert more > 0


def test_a_single_pair_is_refused(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="a single pair cannot hold a group"):
        load_experiment(_web(tmp_path, None))
    with pytest.raises(InputError, match=r"group of >= 3 hosts.*this pool has 2"):
        load_experiment(_web(tmp_path, 2))
    # built in code past the file's checks, the strategy refuses it too
    import dataclasses

    from musku.domain import SweepMode

    exp = dataclasses.replace(load_experiment(WEB), mode=SweepMode("multiarm"))
    with pytest.raises(InputError, match="this pool has 2"):
        run_sweep(exp)


def test_bad_input_is_one_line_exit_3(tmp_path: Path) -> None:
    proc = musku("sweep", str(_web(tmp_path, 2)))
    assert proc.returncode == 3
    assert ">= 3 hosts" in one_error_line(proc)
    proc = musku("sweep", str(_web(tmp_path, 8, direction="lower")))
    assert proc.returncode == 3
    assert "higher-is-better" in one_error_line(proc)
    bad = _web(tmp_path, 8, mode="multi-arm")
    proc = musku("check", str(bad))
    assert proc.returncode == 3
    assert "multiarm" in one_error_line(proc)


class _StopAfterFirstKnob(NullProgress):
    def __init__(self, stop: threading.Event) -> None:
        self.stop = stop
        self.knobs: list[str] = []

    def message(self, text: str) -> None:
        if text.startswith("multiarm "):
            self.knobs.append(text.split()[1].rstrip(":"))
            self.stop.set()


def test_a_stop_ends_the_scans_and_keeps_the_finished_rows(tmp_path: Path) -> None:
    exp = load_experiment(_web(tmp_path, 16))
    stop = threading.Event()
    seen = _StopAfterFirstKnob(stop)
    store = open_store(f"sqlite:///{tmp_path}/r.db")
    try:
        with pytest.raises(Interrupted, match="multi-arm scan"):
            run_sweep(exp, store=store, seed=1, progress=seen, stop=stop)
        [rec] = store.experiments()
        rows = store.comparisons(rec.id)
    finally:
        store.close()
    assert ExperimentStatus(rec.status) is ExperimentStatus.INTERRUPTED
    # the first wave's other knob is stopped mid-scan (unless it, too, ended first), no later
    # wave measures anything; the finished knobs' rows are kept
    assert 1 <= len(seen.knobs) <= 2
    purposes = {c.purpose for c in rows}
    assert f"multiarm:{seen.knobs[0]}" in purposes and len(purposes) <= 2
    assert not any(c.purpose.startswith("validate") for c in rows)


@pytest.mark.postgres
def test_a_multiarm_sweep_on_postgresql_stores_its_rows(
    tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    url = fresh_pg_database(request.getfixturevalue("pg_server"))
    exp = load_experiment(_web(tmp_path, 8))
    with open_store(url) as store:
        rep = run_sweep(exp, store=store, seed=3)
        assert rep.experiment_id is not None
        rows = [c for c in store.comparisons(rep.experiment_id) if c.purpose.startswith("multi")]
        counts = [(c.sample_count, c.result.decision) for c in rows if c.result is not None]
    assert rep.best.as_dict() == _paper(exp)
    assert {c.purpose for c in rows} == {f"multiarm:{k}" for k in exp.service.knobs}
    assert len(counts) == len(rows)
    # a row the guardrail pruned ends at the look that pruned it: in the probe (no period
    # stored) for an arm far beyond its QoS limit or its MIPS floor, else at a look (two
    # windows or more); every other row ran the scan's looks
    assert all(n == 0 or n >= 2 for n, d in counts if d is Decision.GUARDRAIL)
    assert all(n > 8 for n, d in counts if d is not Decision.GUARDRAIL)
    assert any(d is Decision.GUARDRAIL for _, d in counts)
