"""Explicit domain <-> row conversion (no database needed, but for the configurations view)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from sqlalchemy import text

from musku.domain import Configuration
from musku.errors import DatabaseError
from musku.experiment import Experiment
from musku.storage import open_store
from musku.storage.convert import (
    SAMPLE_COLUMNS,
    configuration_columns,
    configuration_settings,
    sample_dict,
    sample_tuples,
)


def _wide_row(tmp_path: Path, experiment: Experiment, cfg: Configuration) -> dict[str, Any]:
    """``cfg`` stored in a fresh SQLite database, read back through the ``configurations``
    view (the knob rows broken out into the columns the table had before revision 0004)."""
    with open_store(f"sqlite:///{tmp_path / 'wide.db'}") as store:
        store.start_comparison(store.create_experiment(experiment), "bench", cfg, cfg)
        with store.engine.connect() as conn:
            (row,) = conn.execute(text("SELECT * FROM configurations")).mappings().all()
    return {k: v for k, v in row.items() if k != "id"}


def test_configuration_columns_cover_every_knob(tmp_path: Path, experiment: Experiment) -> None:
    cfg = Configuration.of(
        core_freq="turbo",
        uncore_freq=1.6,
        core_count=12,
        cdp="off",
        prefetch="dcu",
        thp="never",
        shp=200,
    )
    assert configuration_columns(cfg) == {"key": cfg.key()}
    assert configuration_settings(cfg) == [
        {"knob": "core_freq", "value": "turbo", "number": None},
        {"knob": "uncore_freq", "value": "1.6", "number": 1.6},
        {"knob": "core_count", "value": "12", "number": 12.0},
        {"knob": "cdp", "value": "off", "number": None},
        {"knob": "prefetch", "value": "dcu", "number": None},
        {"knob": "thp", "value": "never", "number": None},
        {"knob": "shp", "value": "200", "number": 200.0},
    ]
    cols = _wide_row(tmp_path, experiment, cfg)
    assert cols == {
        "key": cfg.key(),
        "core_freq": None,
        "core_turbo": True,
        "uncore_freq": 1.6,
        "uncore_turbo": False,
        "core_count": 12,
        "cdp": "off",
        "cdp_data_ways": None,
        "cdp_code_ways": None,
        "prefetch": "dcu",
        "thp": "never",
        "shp": 200,
    }
    assert Configuration.from_key(cols["key"]) == cfg


def test_partial_configuration_leaves_unset_knobs_null(
    tmp_path: Path, experiment: Experiment
) -> None:
    cols = _wide_row(tmp_path, experiment, Configuration.of(cdp="9:2"))
    assert (cols["cdp_data_ways"], cols["cdp_code_ways"]) == (9, 2)
    unset = [k for k, v in cols.items() if v is None]
    assert set(unset) == {
        "core_freq",
        "core_turbo",
        "uncore_freq",
        "uncore_turbo",
        "core_count",
        "prefetch",
        "thp",
        "shp",
    }


def test_sample_tuples_layout_and_extra() -> None:
    rows = [
        {
            "seq": np.int64(4),
            "t": np.float64(12.5),
            "host": "b",
            "role": "B",
            "metrics": {"p99_ms": np.float64(7.0), "mips": math.nan, "ipc": 1.25},
        }
    ]
    (t,) = sample_tuples(9, "p99_ms", rows, {"a": 0, "b": 1})
    row = dict(zip(SAMPLE_COLUMNS, t, strict=True))
    assert row["comparison_id"] == 9 and row["seq"] == 4 and row["host"] == 1
    assert row["period"] == 0 and row["warmup"] is False and row["valid"] is True
    assert row["value"] == 7.0 and row["p99_ms"] == 7.0 and row["mips"] is None
    assert json.loads(row["extra"]) == {"ipc": 1.25}
    back = sample_dict(row)
    assert back["metrics"] == {"p99_ms": 7.0, "ipc": 1.25} and back["host"] == 1


@pytest.mark.parametrize(
    ("row", "message"),
    [
        ({"t": 1.0, "host": 0, "role": "A"}, "has no 'seq'"),
        ({"seq": 1, "t": 1.0, "host": "nobody", "role": "A"}, "unknown host .nobody."),
        ({"seq": 1, "t": "soon", "host": 0, "role": "A"}, "could not convert"),
        ({"seq": 1, "t": 1.0, "host": 0, "role": "a"}, "role must be 'A' or 'B'"),
    ],
)
def test_bad_sample_rows(row: dict[str, object], message: str) -> None:
    with pytest.raises(DatabaseError, match=message) as info:
        sample_tuples(3, "mips", [{"seq": 0, "t": 0.0, "host": 0, "role": "A"}, row], {})
    assert "sample row 1 of comparison 3" in str(info.value)
