"""``musku check`` and ``musku sweep --dry-run`` say which mode (pairwise or multiarm) is
expected to be faster for the pool and knob set (issue 32 item 4; musku.design.advice)."""

from __future__ import annotations

import json
from pathlib import Path

from musku.design.advice import MEASURED, mode_advice, pool_hosts
from musku.experiment import load_experiment
from tests.cli.test_exit_codes import musku
from tests.sweep.test_multiarm_sweep import WEB, _web


def test_the_advice_names_the_pool_and_the_measured_figures(tmp_path: Path) -> None:
    for fleet, faster in ((3, "pairwise"), (8, "pairwise"), (16, "pairwise"), (40, "pairwise")):
        exp = load_experiment(_web(tmp_path, fleet))
        a = mode_advice(exp)
        assert pool_hosts(exp) == a["hosts"] == fleet
        assert a["faster"] == faster
        near = min(MEASURED, key=lambda h: (abs(h - fleet), h))
        pc, _, mc, _ = MEASURED[near]
        assert f"{faster} expected faster on {fleet} hosts: measured at {near} hosts" in a["text"]
        assert f"{pc:.1f} h" in a["text"] and f"{mc:.1f} h" in a["text"]
        # knobs with >= 6 other settings and no reboot: core_freq, cdp, shp; never core_count
        # (a reboot knob here) nor thp (3 settings)
        assert set(a["knobs"]) == {"core_freq", "cdp", "shp"}
    # from the 64-host figures on, multiarm: sooner and fewer host-hours there
    for fleet in (41, 64, 128):
        a = mode_advice(load_experiment(_web(tmp_path, fleet)))
        pc, ph, mc, mh = MEASURED[64]
        assert mc < pc and mh < ph
        assert a["faster"] == "multiarm", a
        assert f"multiarm expected faster on {fleet} hosts: measured at 64 hosts" in a["text"]
    one_pair = mode_advice(load_experiment(WEB))
    assert one_pair["hosts"] == 2 and "multiarm needs >= 3" in one_pair["text"]


def test_check_and_dry_run_print_it(tmp_path: Path) -> None:
    multi = _web(tmp_path, 16)
    out = musku("check", str(multi))
    assert out.returncode == 0, out.stderr
    line = " ".join(out.stdout.split())
    assert "mode: pairwise expected faster on 16 hosts" in line
    assert 'mode = "independent" runs pairwise' in line
    got = musku("check", str(multi), "--json")
    assert json.loads(got.stdout)["mode_advice"]["faster"] == "pairwise"
    dry = musku("sweep", str(multi), "--dry-run")
    assert dry.returncode == 0, dry.stderr
    assert "mode: pairwise expected faster on 16 hosts" in " ".join(dry.stdout.split())
    pairwise = musku("check", str(_web(tmp_path, 8, mode="independent")))
    assert "mode: pairwise expected faster on 8 hosts" in " ".join(pairwise.stdout.split())
    assert "runs pairwise" not in pairwise.stdout
    big = musku("check", str(_web(tmp_path, 64, mode="independent")))
    line = " ".join(big.stdout.split())
    assert "mode: multiarm expected faster on 64 hosts" in line
    assert 'mode = "multiarm" runs multi-arm groups' in line
    # one pair: nothing to choose, no line
    assert "mode:" not in musku("check", str(WEB)).stdout
