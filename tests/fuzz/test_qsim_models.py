"""Property test (Hypothesis) for qsim model files (issue 29, item 8): a generated model
(tests/fuzz/qsim_docs.py: the 2-tier model with a histogram and a fan-out, mutated like every
other input kind) either passes ``musku qsim check`` and runs (a short window under a small
engine budget), or gives one clean line with exit status 3. Never an internal error, never a
model ``check`` accepts and ``run`` refuses, never over the CPU budget, never a file written
beside the model. bench/fuzz.py runs the same generator on thousands of models."""

from __future__ import annotations

import os
import random
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.experiment.generators import draw, to_toml
from tests.fuzz.qsim_docs import BUDGET_CPU_S, check_qsim, prepare, qsim_base

EXAMPLES = int(os.environ.get("MUSKU_PROPERTY_EXAMPLES", "20"))


@pytest.fixture(scope="module")
def folder() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="musku-qsim-prop-") as d:
        prepare(Path(d))
        yield Path(d)


def _files(d: Path) -> set[str]:
    return {p.name for p in d.iterdir()} - {"gen-qsim.toml"}


def test_the_base_model_is_accepted(engine: str, folder: Path) -> None:
    outcome, status, _, message = check_qsim(to_toml(qsim_base()), folder)
    assert (outcome, status) == ("accepted", 0), message


def test_generated_models_check_and_run_or_fail_cleanly(engine: str, folder: Path) -> None:
    before = _files(folder)

    @settings(
        max_examples=EXAMPLES,
        deadline=None,  # the CPU budget is checked explicitly (a busy machine inflates wall time)
        derandomize=True,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
        database=None,
    )
    @given(st.integers(min_value=0, max_value=2**32 - 1))
    def prop(seed: int) -> None:
        text = draw(random.Random(seed), qsim_base())
        outcome, status, cpu, message = check_qsim(text, folder)
        assert outcome in ("accepted", "clean"), (outcome, status, message)
        assert outcome == "accepted" or status == 3, (status, message)
        assert cpu < BUDGET_CPU_S, (cpu, message)

    prop()
    assert _files(folder) == before  # nothing written beside the model
