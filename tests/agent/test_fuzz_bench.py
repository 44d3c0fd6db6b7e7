"""bench/fuzz_agent.py in small (300 requests): the fuzzer runs, and a real agent gives no
internal error, nothing over budget and no refusal that wrote to the host."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest

from tests.timing import scaled

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(os.geteuid() != 0, reason="needs root (socket ownership)"),
]


def test_fuzzing_a_real_agent_finds_no_internal_error() -> None:
    path = Path(__file__).resolve().parents[2] / "bench" / "fuzz_agent.py"
    spec = importlib.util.spec_from_file_location("fuzz_agent", path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    # the bench's 2 s per request is an idle machine's budget: scaled on a busy one
    r = mod.run(300, seed=7, budget_s=scaled(mod.BUDGET_S))
    assert r["internal_errors"] == [] and r["over_budget"] == [], r
    assert r["refused_but_wrote"] == []
    assert r["accepted"] > 30 and sum(r["clean_errors_by_status"].values()) > 150
