"""The knob tests list every registered knob, so each starts from the built-ins alone."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from musku import knob_spec


@pytest.fixture(autouse=True)
def _builtin_knobs_only() -> Iterator[None]:
    """Drop every knob a catalog or plug-in registered before this test: a module- or
    session-scoped fixture elsewhere (a sweep of an experiment on firecracker-vm.toml) can
    register ``swappiness`` for the rest of the process, before the root conftest's per-test
    snapshot is taken, and CI's order then found it in six knob tests. The root conftest's
    fixture, set up first, puts the registry back afterwards."""
    with knob_spec._lock:
        for table in (knob_spec._targets, knob_spec._specs, knob_spec._classes):
            for name in [n for n in table if n not in knob_spec.BUILTIN]:
                del table[name]
    yield
