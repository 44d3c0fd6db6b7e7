"""The read commands' library calls (musku.summary), called directly and against the CLI's
--json output: the CLI only renders what they return."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from musku.domain import SoftSku
from musku.errors import InputError
from musku.experiment import load_experiment
from musku.storage import open_store
from musku.summary import check_experiment, experiment_summary, sku_diff
from tests.cli.test_exit_codes import musku
from tests.report.test_rough_edges import _result


def test_check_summary_is_what_the_cli_prints(toy: Any) -> None:
    path = toy("independent", name="summary-toy")
    exp, data = check_experiment(path)
    assert data["experiment"] == "summary-toy" and data["mode"] == "independent"
    assert data["independent_comparisons"] == sum(len(v) - 1 for v in exp.space.values())
    assert data["threading"] is None  # the toy does not co-tune
    assert experiment_summary(exp) == data
    proc = musku("check", str(path), "--json")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == json.loads(json.dumps(data))


def test_check_refuses_bad_input_before_summarising(tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text('[experiment]\nname = "x"\n')
    with pytest.raises(InputError):
        check_experiment(bad)


def test_sku_diff_knob_by_knob(toy: Any, tmp_path: Path) -> None:
    exp = load_experiment(toy("independent", name="diff-toy"))
    base = exp.production
    one, two = base.with_("thp", "always"), base.with_("thp", "always").with_("shp", 128)
    with open_store(f"sqlite:///{tmp_path}/r.db") as store:
        exp_id = store.create_experiment(exp)
        ids = [
            store.save_softsku(
                exp_id,
                SoftSku(
                    "toy",
                    exp.platform.name,
                    cfg,
                    vs_production=_result(baseline=base, candidate=cfg, estimate=g),
                ),
            )
            for cfg, g in ((one, 0.02), (two, 0.03))
        ]
        diff = sku_diff(store, ids[0], ids[1])
        assert {r["knob"] for r in diff.rows if not r["same"]} == {"shp"}
        same = {r["knob"]: r["first"] for r in diff.rows if r["same"]}
        assert same["thp"] == "always"
        assert diff.to_dict()["first"] == ids[0] and diff.skus[1].configuration == two
        with pytest.raises(InputError, match="no soft SKU with id 999"):
            sku_diff(store, ids[0], 999)
