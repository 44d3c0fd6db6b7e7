"""The shared knob contract (musku.testing.knobs), for every knob on every reference host.

Hosts: an Intel Xeon with MSRs, resctrl+CDP, intel_uncore_frequency, GRUB (core_count in reboot
mode); an AMD EPYC with acpi-cpufreq and MSR 0xC0000108 (no CDP, no uncore control); this VM
from its captured snapshot (THP, huge pages, CPU hotplug only).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from musku.domain import KNOBS, Value
from musku.knobs import probe_all
from musku.testing.fakehost import (
    FakeHost,
    amd_host,
    fixture_expect,
    fixture_names,
    intel_host,
    vm_host,
)
from musku.testing.knobs import KnobCase, KnobContract

HOSTS: dict[str, Callable[[Path], FakeHost]] = {
    "intel": intel_host,
    "amd": amd_host,
}

SUPPORTED: dict[str, set[str]] = {
    "intel": set(KNOBS),
    "amd": {"core_freq", "core_count", "prefetch", "thp", "shp"},
}

# (target, another value for the "outside change") per knob and host
TARGETS: dict[str, dict[str, tuple[Value, Value]]] = {
    "core_freq": {"intel": (2.0, 2.5), "amd": (2.0, 1.8)},
    "uncore_freq": {"intel": (1.8, 1.5)},
    "core_count": {"intel": (2, 3), "amd": (3, 2)},
    "cdp": {"intel": ("6:5", "2:9")},
    "prefetch": {"intel": ("dcu", "all_off"), "amd": ("l1_only", "l2_only")},
    "thp": {"intel": ("never", "madvise"), "amd": ("madvise", "never")},
    "shp": {"intel": (64, 100), "amd": (256, 0)},
}


def _fixture_builder(name: str) -> Callable[[Path], FakeHost]:
    return lambda root: FakeHost.from_fixture(root, name)


# every captured snapshot (this VM's, and any added with tests.knobs.capture + expect.json)
for _name in fixture_names():
    _expect = fixture_expect(_name)
    HOSTS[_name] = vm_host if _name == "firecracker-vm" else _fixture_builder(_name)
    SUPPORTED[_name] = set(_expect["supported"])  # type: ignore[call-overload]
    for _knob, (_target, _other) in dict(_expect["targets"]).items():  # type: ignore[call-overload]
        TARGETS[_knob][_name] = (_target, _other)
assert "firecracker-vm" in HOSTS, "this VM's captured snapshot is missing"

CASES = [(k, h) for h in HOSTS for k in KNOBS]


def test_probe_matrix(tmp_path: Path) -> None:
    for name, build in HOSTS.items():
        host = build(tmp_path / name)
        support = probe_all(host.fs())
        assert {k for k, s in support.items() if s.supported} == SUPPORTED[name], name
        for k, s in support.items():
            if not s.supported:
                assert s.reason, (name, k)


def _case(knob: str, host_name: str, root: Path) -> KnobCase:
    host = HOSTS[host_name](root / host_name)
    if knob in SUPPORTED[host_name]:
        target, other = TARGETS[knob][host_name]
        return KnobCase(knob, host, target, other)
    # unsupported here: any value another host takes (apply must refuse it, typed)
    target, _ = next(iter(TARGETS[knob].values()))
    return KnobCase(knob, host, target, supported=False)


class TestKnobContract(KnobContract):
    """musku.testing.knobs.KnobContract, for every built-in knob on every reference host."""

    @pytest.fixture(params=CASES, ids=[f"{k}-{h}" for k, h in CASES])
    def case(self, request: pytest.FixtureRequest, tmp_path: Path) -> KnobCase:
        knob, host_name = request.param
        return _case(knob, host_name, tmp_path)
