"""``musku knobs probe`` on fake hosts and on this machine."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from musku.hostfs import HostFS
from musku.knobs.cli import app
from musku.testing.fakehost import MSR_STRIDE, amd_host, intel_host

runner = CliRunner()


def test_probe_json_intel(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    intel_host(tmp_path, hwp=True)
    # the CLI builds a plain HostFS on --root: give it the fake MSR files' register spacing
    monkeypatch.setattr(HostFS, "_msr_offset", lambda self, reg: reg * MSR_STRIDE)
    result = runner.invoke(app, ["probe", "--json", "--root", str(tmp_path)])
    assert result.exit_code == 0, result.output
    knobs = json.loads(result.stdout)["knobs"]
    assert knobs["core_freq"]["supported"] is False and "HWP" in knobs["core_freq"]["reason"]
    assert knobs["cdp"]["supported"] and knobs["cdp"]["current"] == "off"
    assert knobs["core_count"]["reboot"] is True
    assert knobs["thp"]["current"] == "always"


def test_probe_table_amd(tmp_path: Path) -> None:
    amd_host(tmp_path)
    result = runner.invoke(app, ["probe", "--root", str(tmp_path)])
    assert result.exit_code == 0, result.output
    assert "uncore_freq" in result.stdout and "AMD" in result.stdout


def test_probe_bad_root_is_one_line(tmp_path: Path) -> None:
    result = runner.invoke(app, ["probe", "--root", str(tmp_path / "missing")])
    assert result.exit_code == 3
    assert "Traceback" not in result.output
    assert "not a directory" in result.output


def test_probe_this_host() -> None:
    result = runner.invoke(app, ["probe", "--json"])
    assert result.exit_code == 0, result.output
    knobs = json.loads(result.stdout)["knobs"]
    assert set(knobs) == {"core_freq", "uncore_freq", "core_count", "cdp", "prefetch", "thp", "shp"}
    for row in knobs.values():
        assert row["supported"] or row["reason"]
