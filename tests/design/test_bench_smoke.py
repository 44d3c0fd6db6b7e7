"""bench/multiarm.py: its interval, its usage errors, and a tiny run of both parts."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _bench() -> ModuleType:
    spec = importlib.util.spec_from_file_location("bench_multiarm", ROOT / "bench/multiarm.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules["bench_multiarm"] = mod
    spec.loader.exec_module(mod)
    return mod


def test_clopper_pearson_and_usage() -> None:
    mod = _bench()
    lo, hi = mod.clopper_pearson(0, 300)
    assert lo == 0.0 and 0.011 < hi < 0.013  # 1 - 0.025 ** (1 / 300)
    lo, hi = mod.clopper_pearson(15, 300)
    assert 0.02 < lo < 0.05 < hi < 0.09
    assert mod.main(["--jobs", "0"]) == 2
    assert mod.main(["--runs", "0", "--seeds", "0", "--knob", "nope"]) == 3


@pytest.mark.slow
def test_tiny_run(capsys: pytest.CaptureFixture[str]) -> None:
    mod = _bench()
    assert mod.main(["--runs", "2", "--arms", "3", "--seeds", "1", "--jobs", "1"]) == 0
    out = capsys.readouterr().out
    assert "family-wise false positives: " in out and "/2 = " in out
    assert "multi-arm hosts  5" in out and "pairwise  hosts  2" in out
