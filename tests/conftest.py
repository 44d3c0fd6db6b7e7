"""Fixtures shared by several test folders, and the suite's hang guard scaled to the machine."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import settings

from tests.timing import slowdown

pytest_plugins = ["tests.fixtures.toy", "tests.fixtures.sshd"]

# Hypothesis' per-example deadline (200 ms by default) is a wall-clock bound: on this 2-core
# machine beside other work one example of a pure function took 504 ms in a test run (load 24).
# Examples are bounded by the suite's hang guard instead; a test that needs a deadline sets one.
settings.register_profile("musku", deadline=None)
settings.load_profile("musku")


DURATIONS = Path(__file__).with_name("durations.json")


def bare_id(nodeid: str) -> str:
    """A node id without xdist's ``@group`` suffix (an ``@`` inside ``[...]`` is a parameter's)."""
    at = nodeid.rfind("@")
    return nodeid[:at] if at > nodeid.rfind("]") else nodeid


def durations_table() -> Path:
    """The schedule's weights: tests/durations.json, or the file ``MUSKU_TEST_DURATIONS`` names
    (tests/test_xdist_groups.py gives its own)."""
    return Path(os.environ.get("MUSKU_TEST_DURATIONS") or DURATIONS)


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--record-durations",
        metavar="PATH",
        default=None,
        help="write each test's seconds (setup + call + teardown, >= 2 s) as JSON in the form "
        "of tests/durations.json, the weights of the xdist schedule (docs/testing.md)",
    )


def pytest_configure(config: pytest.Config) -> None:
    """Under ``--dist loadgroup`` xdist hands the groups out in collection order only without
    its default reordering (``--loadscope-reorder``: the groups with the most tests first,
    which put the one-test modules that take minutes, test_readme and the e2e scenario, last,
    each holding one worker while the other idled). The order is set by
    ``pytest_collection_modifyitems`` below: the heaviest groups first."""
    if getattr(config.option, "dist", "no") == "loadgroup":
        config.option.loadscopereorder = False
    path = config.getoption("--record-durations")
    if path and not hasattr(config, "workerinput"):  # the controller (or a serial run)
        config.pluginmanager.register(DurationRecord(Path(path)), "musku-durations")


class DurationRecord:
    """Sums each test's phases as the controller receives them and writes them at the end."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.seconds: dict[str, float] = {}

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        node = bare_id(report.nodeid)
        self.seconds[node] = self.seconds.get(node, 0.0) + report.duration

    def pytest_sessionfinish(self) -> None:
        kept = {n: round(s, 1) for n, s in self.seconds.items() if s >= 2.0}
        rest = [s for s in self.seconds.values() if s < 2.0]
        record = {
            "about": json.loads(DURATIONS.read_text())["about"] if DURATIONS.exists() else "",
            "default_s": round(sum(rest) / len(rest), 2) if rest else 1.0,
            "seconds": dict(sorted(kept.items(), key=lambda kv: (-kv[1], kv[0]))),
        }
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.write_text(json.dumps(record, indent=1) + "\n")


def real_kernel_groups(interfaces: dict[str, tuple[str, ...]]) -> dict[str, str]:
    """The xdist group of each real-kernel test, from the kernel interfaces it touches
    (``@pytest.mark.root("thp", "hugepages")``): tests that share an interface, directly or
    through a third test, are one group, run one at a time on one worker; tests in different
    groups may run at once. A test that names none (a bare ``root``) may touch anything: then
    every real-kernel test is one group, ``real-kernel``. A group is named after its
    interfaces: ``real-hugepages-thp``."""
    if not interfaces:
        return {}
    if any(not touched for touched in interfaces.values()):
        return dict.fromkeys(interfaces, "real-kernel")
    parent: dict[str, str] = {}

    def find(x: str) -> str:
        while parent.setdefault(x, x) != x:
            x = parent[x]
        return x

    for touched in interfaces.values():
        for other in touched[1:]:
            parent[find(other)] = find(touched[0])
    members: dict[str, set[str]] = {}
    for touched in interfaces.values():
        for name in touched:
            members.setdefault(find(name), set()).add(name)
    return {
        test: "real-" + "-".join(sorted(members[find(touched[0])]))
        for test, touched in interfaces.items()
    }


def group_weights(items: list[pytest.Item], groups: list[str]) -> dict[str, float]:
    """Each group's expected seconds: the sum of its tests' from tests/durations.json."""
    path = durations_table()
    table = json.loads(path.read_text()) if path.exists() else {}
    seconds: dict[str, float] = table.get("seconds", {})
    default = float(table.get("default_s", 1.0))
    weights: dict[str, float] = {}
    for item, group in zip(items, groups, strict=True):
        node = bare_id(item.nodeid)
        weights[group] = weights.get(group, 0.0) + float(seconds.get(node, default))
    return weights


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Under pytest-xdist (scripts/test: ``-n 2 --dist loadgroup``) a test module runs on one
    worker, so its module fixtures are built once; the tests that change this machine's real
    kernel state (the ``root`` marker: THP, static huge pages, CPU hotplug, cpusets) run on one
    worker, one at a time, as in a serial run, per group of kernel interfaces they touch
    (``real_kernel_groups``): a THP comparison and a CPU hotplug may run at once, two THP
    comparisons never. The groups are handed out heaviest first (``group_weights``), so the
    tests that take minutes start at once instead of holding one worker at the end.

    The group is the node id's ``@group`` suffix, which xdist's scheduler reads. xdist 3.8's
    worker appends it (from these ``xdist_group`` markers, in its own hook of this name, after
    this one: ``tryfirst``) to ``item._nodeid``, which pytest 9.2 no longer reads (a node's id is
    ``item._id``): no test had a group, modules were spread over both workers and two real-kernel
    tests ran at once (a real THP A/B's agent held the host for two minutes while test_local's
    fixture waited for it, or its agent lost the host lock). So the suffix is set here too."""
    if not config.pluginmanager.hasplugin("xdist"):
        return
    touched: dict[str, tuple[str, ...]] = {}
    for item in items:
        marker = item.get_closest_marker("root")
        if marker is not None:
            touched[item.nodeid] = tuple(str(a) for a in marker.args)
    real = real_kernel_groups(touched)
    groups = [real.get(item.nodeid) or item.nodeid.split("::", 1)[0] for item in items]
    grouping = bool(getattr(config.option, "loadgroup", False))  # set on xdist's workers
    for item, group in zip(items, groups, strict=True):
        item.add_marker(pytest.mark.xdist_group(group))
        node_id = getattr(item, "_id", None)  # pytest >= 9.2: structured, parsed from a string
        if grouping and node_id is not None and not item.nodeid.endswith(f"@{group}"):
            item._id = type(node_id).parse(f"{item.nodeid}@{group}")
    if grouping:
        weights = group_weights(items, groups)
        first = {g: i for i, g in reversed(list(enumerate(groups)))}
        order = sorted(range(len(items)), key=lambda i: (-weights[groups[i]], first[groups[i]], i))
        items[:] = [items[i] for i in order]


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
