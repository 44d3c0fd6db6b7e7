"""Property tests (Hypothesis) for every input file kind musku reads: experiment files (through
``musku check``), platform catalogs, simulator models and the agent's configuration.

Property: a generated document (tests/experiment/generators.py: a valid document mutated with
hostile values, wrong types, unknown/missing keys, deep nesting, huge numbers, markup, device
paths, pathological lines, byte damage) either loads, or gives one clean error with exit
status 3 (bad input). Never an internal error (status 1), never over the time budget
(:data:`~tests.experiment.generators.BUDGET_S` CPU seconds per document),
never a write to the directory (the "host" of a loader), and the process stays under
:data:`ALLOC_BUDGET_MIB` of allocations (bench/fuzz.py: the process under
:data:`~tests.experiment.generators.RSS_BUDGET_MIB`). bench/fuzz.py runs the same generators
on 5,000+ documents.
"""

from __future__ import annotations

import os
import random
import tempfile
import tracemalloc
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.experiment.generators import (
    BASES,
    BUDGET_S,
    Workdir,
    check_document,
    draw,
    warm_up,
)

ALLOC_BUDGET_MIB = 128
"""Most memory (Python and numpy allocations, tracemalloc's peak) checking a kind's documents
may take: a file is capped at 1 MiB, so anything near this is an input that blew up."""
EXAMPLES = int(os.environ.get("MUSKU_PROPERTY_EXAMPLES", "60"))


@pytest.fixture(scope="module")
def work() -> Iterator[Workdir]:
    with tempfile.TemporaryDirectory(prefix="musku-prop-") as d:
        w = Workdir(Path(d))
        warm_up(w)  # first imports (scipy...) are not the document's time
        yield w


@pytest.mark.parametrize("kind", sorted(BASES))
def test_generated_documents_load_or_fail_cleanly(kind: str, work: Workdir) -> None:
    base = BASES[kind]()

    @settings(
        max_examples=EXAMPLES,
        deadline=None,  # the budget below is checked explicitly, scaled for a busy machine
        derandomize=True,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
        database=None,
    )
    @given(st.integers(min_value=0, max_value=2**32 - 1))
    def prop(seed: int) -> None:
        text = draw(random.Random(seed), base)  # the bench draws with the same generator
        outcome, status, seconds, message = check_document(kind, text, work)
        assert outcome != "internal", message
        assert outcome == "accepted" or status == 3, (status, message)
        assert seconds < BUDGET_S, (seconds, message)  # CPU seconds (generators.BUDGET_S)

    # the process's peak RSS is a high-water mark of every test before this one (reports,
    # services...), so the test bounds what checking these documents allocates instead;
    # bench/fuzz.py, a fresh process, checks RSS_BUDGET_MIB itself
    tracemalloc.start()
    try:
        prop()
        peak_mib = tracemalloc.get_traced_memory()[1] / 2**20
    finally:
        tracemalloc.stop()
    assert peak_mib < ALLOC_BUDGET_MIB, peak_mib


def test_the_shipped_documents_are_accepted(work: Workdir) -> None:
    """The bases themselves load: the mutations, not the generator, make documents bad."""
    from tests.experiment.generators import to_toml

    for kind, base in BASES.items():
        outcome, status, _, message = check_document(kind, to_toml(base()), work)
        assert (outcome, status) == ("accepted", 0), (kind, message)
