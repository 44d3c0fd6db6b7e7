"""Property test (Hypothesis) for agent requests (issue 29, item 8): a real agent daemon on a
fake host (bench/fuzz_agent.py's :class:`Fuzzer`: Unix socket and HMAC-signed TCP) gets
generated requests (valid, a hostile field, unknown ops and fields, malformed lines, a line
over the limit, authentication attacks). Each gets a reply within the budget: accepted or a
clean error (status 3, 4 or 6), never an internal error or no reply, and a refused request
leaves the host's knob files as they were. bench/fuzz_agent.py runs thousands."""

from __future__ import annotations

import importlib.util
import os
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.timing import scaled

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root (socket ownership)")
EXAMPLES = int(os.environ.get("MUSKU_PROPERTY_EXAMPLES", "40"))


def _bench() -> Any:
    path = Path(__file__).resolve().parents[2] / "bench" / "fuzz_agent.py"
    spec = importlib.util.spec_from_file_location("fuzz_agent", path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def fuzzer() -> Iterator[Any]:
    mod = _bench()
    fz = mod.Fuzzer()
    try:
        yield fz
    finally:
        fz.close()


def test_generated_requests_get_clean_replies(fuzzer: Any) -> None:
    mod = _bench()

    @settings(
        max_examples=EXAMPLES,
        deadline=None,  # the reply time is checked explicitly, scaled for a busy machine
        derandomize=True,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
        database=None,
    )
    @given(st.integers(min_value=0, max_value=2**32 - 1))
    def prop(seed: int) -> None:
        r = fuzzer.one(random.Random(seed), str(seed))
        assert r["outcome"] in ("accepted", "clean"), r
        assert r["outcome"] == "accepted" or r["status"] in (3, 4, 6), r
        assert r["seconds"] < scaled(mod.BUDGET_S), r

    prop()
    assert fuzzer.rss_mib() < mod.RSS_BUDGET_MIB
