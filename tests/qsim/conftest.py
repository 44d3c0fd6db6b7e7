"""Shared fixtures: the engine binary (tests needing it skip when services/qsim is not built)."""

from __future__ import annotations

import pytest

from musku.errors import UnsupportedError


@pytest.fixture(scope="session")
def engine() -> str:
    from musku.qsim.engine import binary

    try:
        return str(binary())
    except UnsupportedError as e:
        pytest.skip(f"qsim engine not built: {e}")


MM1 = """\
[run]
duration_s = {duration}
warmup_s = 0.05
seed = 3

[[machines]]
name = "m"
cores = 1

[[services]]
name = "server"
execution = "simple"

  [[services.stages]]
  name = "work"
  time = {{ dist = "exp", mean_us = 10 }}

[[paths]]
  [[paths.nodes]]
  name = "only"
  service = "server"

[client]
qps = {qps}
"""
