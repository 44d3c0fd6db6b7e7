"""`musku results ID --format csv|parquet|json`: every row, strict JSON, Parquet in row groups,
samples streamed in bounded batches; bad input one line, exit 3."""

from __future__ import annotations

import csv
import io
import math
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from musku.cli import app
from musku.report import export
from musku.storage import open_store
from musku.strict_json import loads_strict
from tests.cli.test_exit_codes import musku, one_error_line

runner = CliRunner()


def _ids(url: str) -> tuple[int, list[Any], list[dict[str, Any]]]:
    with open_store(url) as store:
        rec = store.find_experiment("toy")
        assert rec is not None
        comps = store.comparisons(rec.id)
        samples = [{**s, "comparison_id": c.id} for c in comps for s in store.samples(c.id)]
    return rec.id, comps, samples


def test_samples_in_every_format_match_the_store(
    toy_db: tuple[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import pyarrow.parquet as pq

    url, _ = toy_db
    _, comps, samples = _ids(url)
    monkeypatch.setattr(export, "BATCH_ROWS", 1000)  # several batches, several row groups
    for fmt in export.FORMATS:
        out = tmp_path / f"s.{fmt}"
        r = runner.invoke(
            app,
            ["results", "toy", "--db", url, "--format", fmt, "--table", "samples", "-o", str(out)],
        )
        assert r.exit_code == 0, r.output
    rows = list(csv.DictReader(io.StringIO((tmp_path / "s.csv").read_text())))
    data = loads_strict((tmp_path / "s.json").read_text())
    pf = pq.ParquetFile(tmp_path / "s.parquet")
    table = pf.read().to_pylist()
    assert len(rows) == len(data) == len(table) == len(samples) > 2000
    assert pf.metadata.num_row_groups == math.ceil(len(samples) / 1000)
    key = {(s["comparison_id"], s["seq"], s["host"]): s for s in samples}
    for got in (data[::97], table[::89]):
        for row in got:
            want = key[(row["comparison_id"], row["seq"], row["host"])]
            assert row["value"] == pytest.approx(want["value"])
            assert row["warmup"] is want["warmup"] and row["valid"] is want["valid"]
            assert row["role"] == want["role"]
    for row in rows[::101]:
        want = key[(int(row["comparison_id"]), int(row["seq"]), int(row["host"]))]
        assert float(row["value"]) == pytest.approx(want["value"])
        assert row["warmup"] == ("true" if want["warmup"] else "false")


def test_comparisons_and_decisions(toy_db: tuple[str, Path]) -> None:
    url, _ = toy_db
    _, comps, _ = _ids(url)
    got = loads_strict(musku("results", "toy", "--db", url, "--format", "json").stdout)
    assert [c["comparison_id"] for c in got] == [c.id for c in comps]
    assert got[0]["purpose"] == comps[0].purpose and got[0]["sample_count"] > 0
    decided = [c for c in comps if c.result is not None]
    proc = musku("results", "toy", "--db", url, "--format", "csv", "--table", "decisions")
    rows = list(csv.DictReader(io.StringIO(proc.stdout)))
    assert [int(r["comparison_id"]) for r in rows] == [c.id for c in decided]
    assert {r["decision"] for r in rows} == {c.result.decision.value for c in decided if c.result}


def test_sample_batches_are_bounded(toy_db: tuple[str, Path]) -> None:
    url, _ = toy_db
    with open_store(url) as store:
        rec = store.find_experiment("toy")
        assert rec is not None
        sizes = [len(b) for b in store.sample_batches(rec.id, columns=["seq"], batch_rows=500)]
    assert max(sizes) == 500 and len(sizes) > 4


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["toy", "--format", "xlsx"], "--format 'xlsx'"),
        (["toy", "--format", "csv", "--table", "hosts"], "--table 'hosts'"),
        (["--format", "csv"], "exports one experiment"),
        (["nosuch", "--format", "csv"], "no run named 'nosuch'"),
        (["toy", "--format", "csv", "-o", "/nonexistent-dir/x.csv"], "no directory"),
    ],
)
def test_bad_input_is_one_line_exit_3(
    toy_db: tuple[str, Path], args: list[str], needle: str
) -> None:
    url, _ = toy_db
    proc = musku("results", *args, "--db", url)
    assert proc.returncode == 3, proc.stderr
    assert needle in one_error_line(proc)
