"""Fixtures shared by several test folders, and the suite's hang guard scaled to the machine."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from hypothesis import settings

from tests.timing import slowdown

pytest_plugins = ["tests.fixtures.toy", "tests.fixtures.sshd"]

# Hypothesis' per-example deadline (200 ms by default) is a wall-clock bound: on this 2-core
# machine beside other work one example of a pure function took 504 ms in a test run (load 24).
# Examples are bounded by the suite's hang guard instead; a test that needs a deadline sets one.
settings.register_profile("musku", deadline=None)
settings.load_profile("musku")


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Under pytest-xdist (scripts/test: ``-n 2 --dist loadgroup``) a test module runs on one
    worker, so its module fixtures are built once; every test that changes this machine's real
    kernel state (the ``root`` marker: THP, static huge pages, CPU hotplug, cpusets) runs on one
    worker, one at a time, as in a serial run.

    The group is the node id's ``@group`` suffix, which xdist's scheduler reads. xdist 3.8's
    worker appends it (from these ``xdist_group`` markers, in its own hook of this name, after
    this one: ``tryfirst``) to ``item._nodeid``, which pytest 9.2 no longer reads (a node's id is
    ``item._id``): no test had a group, modules were spread over both workers and two real-kernel
    tests ran at once (a real THP A/B's agent held the host for two minutes while test_local's
    fixture waited for it, or its agent lost the host lock). So the suffix is set here too."""
    if not config.pluginmanager.hasplugin("xdist"):
        return
    for item in items:
        if item.get_closest_marker("root") is not None:
            group = "real-kernel"
        else:
            group = item.nodeid.split("::", 1)[0]
        item.add_marker(pytest.mark.xdist_group(group))
        node_id = getattr(item, "_id", None)  # pytest >= 9.2: structured, parsed from a string
        grouping = getattr(config.option, "loadgroup", False) and node_id is not None
        if grouping and not item.nodeid.endswith(f"@{group}"):
            item._id = type(node_id).parse(f"{item.nodeid}@{group}")


@pytest.fixture(autouse=True)
def _knob_registry_per_test() -> Iterator[None]:
    """Each test starts from the knob registry as the test before it found it: loading a
    catalog registers the knobs its lines define (``swappiness`` in firecracker-vm.toml) for
    the rest of the process, as it should in musku, but a later test listing every known knob
    must not depend on which tests ran first (CI's order found three)."""
    from musku import knob_spec

    with knob_spec._lock:
        saved = (dict(knob_spec._targets), dict(knob_spec._specs), dict(knob_spec._classes))
    yield
    with knob_spec._lock:
        for live, kept in zip(
            (knob_spec._targets, knob_spec._specs, knob_spec._classes), saved, strict=True
        ):
            live.clear()
            live.update(kept)


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_runtest_protocol(item: pytest.Item) -> Iterator[None]:
    """pytest-timeout's limit (``timeout`` in pyproject.toml, or a test's own
    ``@pytest.mark.timeout``) is a hang guard stated for an idle machine: scale it, like every
    deadline in the suite (tests/timing.py), by how loaded the machine is when the test starts.
    A CI run beside other work (load 20 on 2 CPUs) gives each process a tenth of a CPU; a test
    that takes 40 s alone then takes minutes without hanging. Runs before pytest-timeout's own
    wrapper reads the limit."""
    marker = item.get_closest_marker("timeout")
    base = None
    if marker is not None:
        base = marker.args[0] if marker.args else marker.kwargs.get("timeout")
    if base is None:
        base = item.config.getini("timeout")
    try:
        seconds = float(base)
    except (TypeError, ValueError):
        seconds = 0.0
    factor = slowdown()
    if seconds > 0 and factor > 1.0:
        item.add_marker(pytest.mark.timeout(seconds * factor), append=False)
    yield
