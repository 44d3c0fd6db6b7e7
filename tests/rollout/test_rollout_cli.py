"""``musku sku deploy`` / ``watch`` from the command line: output, one error line, exit codes
(docs/cli.md: 3 bad input, 7 advantage gone, 8 rolled back)."""

from __future__ import annotations

import json
from pathlib import Path

from musku.storage import open_store
from tests.cli.test_exit_codes import musku, one_error_line
from tests.rollout.test_rollout import BAD, GOOD, MODEL, _experiment, _sku


def test_deploy_and_watch_exit_codes(tmp_path: Path) -> None:
    exp = _experiment(tmp_path)
    url = f"sqlite:///{tmp_path / 'r.db'}"
    with open_store(url) as store:
        good, bad = _sku(store, exp, GOOD), _sku(store, exp, BAD)
    env = {"MUSKU_DB": url}
    ok = musku("sku", "deploy", str(good), "--hosts", "sim-000,sim-001", "--hosts", "sim-002",
               "--wave-size", "2", "--canary-time", "14400", "-q", env=env)  # fmt: skip
    assert ok.returncode == 0, ok.stderr
    assert "canary sim-000 against sim-003: better" in ok.stdout
    assert "wave 1: sim-001, sim-002 (read back)" in ok.stdout
    assert "soft SKU 1 deployed on 3 host(s)" in ok.stdout
    lost = musku("sku", "deploy", str(bad), "--hosts", "sim-003", "-q", env=env)
    assert lost.returncode == 8
    assert "canary sim-003 against" in one_error_line(lost) and "rolled back" in lost.stderr
    twice = musku("sku", "deploy", str(bad), "--hosts", "sim-004,sim-004", env=env)
    assert twice.returncode == 3 and "listed twice" in one_error_line(twice)
    taken = musku("sku", "deploy", str(bad), "--hosts", "sim-001", env=env)
    assert taken.returncode == 3 and "live deployment 1" in one_error_line(taken)
    exp_file = str(exp.path)
    holds = musku("sku", "watch", exp_file, "--once", "--check-time", "14400", env=env)
    assert holds.returncode == 0, holds.stderr
    assert "deployment 1: holds" in holds.stdout
    (tmp_path / "toy-model.toml").write_text(  # a code push: huge pages gain nothing any more
        MODEL.replace("always = 1.02", "always = 1.0")
        .replace('"256" = 1.015', '"256" = 1.0')
        .replace("throughput = 1.03", "throughput = 1.0")
    )
    gone = musku("sku", "watch", exp_file, "--once", "--check-time", "14400", "--json", env=env)
    assert gone.returncode == 7
    assert "advantage gone: deployment(s) 1" in one_error_line(gone)
    (row,) = json.loads(gone.stdout)
    assert row["flagged"] and row["verdict"] in ("gone", "lost")
    listed = musku("sku", "deployments", "--json", env=env)
    assert listed.returncode == 0, listed.stderr
    first, second = json.loads(listed.stdout)
    assert (first["status"], second["status"]) == ("deployed", "rolled_back")
    assert [w["verdict"] for w in first["watches"]] == ["holds", row["verdict"]]
    inf = musku("sku", "deploy", str(good), "--hosts", "sim-005", "--canary-time", "inf", env=env)
    assert inf.returncode == 3 and "finite number of seconds" in one_error_line(inf)
