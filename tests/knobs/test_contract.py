"""The shared knob contract, for every knob on every reference host.

Hosts: an Intel Xeon with MSRs, resctrl+CDP, intel_uncore_frequency, GRUB (core_count in reboot
mode); an AMD EPYC with acpi-cpufreq and MSR 0xC0000108 (no CDP, no uncore control); this VM
from its captured snapshot (THP, huge pages, CPU hotplug only).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from musku.domain import KNOBS, Value
from musku.errors import UnsupportedError
from musku.knobs import load_knob, probe_all
from musku.knobs.base import Drift, Knob, Snapshot
from tests.knobs.fakehost import (
    FakeHost,
    amd_host,
    fixture_expect,
    fixture_names,
    intel_host,
    vm_host,
)

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
SUPPORTED_CASES = [(k, h) for k, h in CASES if k in SUPPORTED[h]]
UNSUPPORTED_CASES = [(k, h) for k, h in CASES if k not in SUPPORTED[h]]


def _tree(host: FakeHost) -> dict[str, bytes | None]:
    return {p: b for p, b in host.tree().items() if not p.endswith(".musku.bak")}


def _make(knob: str, host_name: str, tmp_path: Path) -> tuple[FakeHost, Knob]:
    host = HOSTS[host_name](tmp_path / host_name)
    return host, load_knob(knob, host.fs())


def _settle(host: FakeHost, knob: Knob) -> None:
    """Reboot-mode knobs take effect at the next boot: boot the fake host."""
    if knob.probe().reboot:
        host.reboot()


def test_probe_matrix(tmp_path: Path) -> None:
    for name, build in HOSTS.items():
        host = build(tmp_path / name)
        support = probe_all(host.fs())
        assert {k for k, s in support.items() if s.supported} == SUPPORTED[name], name
        for k, s in support.items():
            if not s.supported:
                assert s.reason, (name, k)


@pytest.mark.parametrize(("knob", "host_name"), UNSUPPORTED_CASES)
def test_unsupported_is_typed(knob: str, host_name: str, tmp_path: Path) -> None:
    host, k = _make(knob, host_name, tmp_path)
    support = k.probe()
    assert support.supported is False and support.reason
    before = _tree(host)
    with pytest.raises(UnsupportedError, match=knob):
        k.apply("off" if knob == "cdp" else 2.0)
    assert _tree(host) == before


@pytest.mark.parametrize(("knob", "host_name"), SUPPORTED_CASES)
def test_dry_run_writes_nothing(knob: str, host_name: str, tmp_path: Path) -> None:
    host, k = _make(knob, host_name, tmp_path)
    target, _ = TARGETS[knob][host_name]
    before = _tree(host)
    writes = k.apply(target, dry_run=True)
    assert writes, "a change was expected"
    assert _tree(host) == before
    assert not k.verify(target)


@pytest.mark.parametrize(("knob", "host_name"), SUPPORTED_CASES)
def test_apply_verify_idempotent(knob: str, host_name: str, tmp_path: Path) -> None:
    host, k = _make(knob, host_name, tmp_path)
    target, _ = TARGETS[knob][host_name]
    assert k.read() != target
    assert k.apply(target)
    _settle(host, k)
    assert k.verify(target)
    assert k.read() == target
    after = _tree(host)
    assert k.apply(target) == []  # idempotent: nothing left to write
    assert _tree(host) == after
    # a fresh knob object on the same host agrees (no hidden in-memory state)
    assert load_knob(knob, host.fs()).verify(target)


@pytest.mark.parametrize(("knob", "host_name"), SUPPORTED_CASES)
def test_outside_change_detected(knob: str, host_name: str, tmp_path: Path) -> None:
    host, k = _make(knob, host_name, tmp_path)
    target, other = TARGETS[knob][host_name]
    k.apply(target)
    _settle(host, k)
    assert k.verify(target)
    intruder = load_knob(knob, host.fs())  # someone else changes the knob
    intruder.apply(other)
    assert not k.verify(target)
    with pytest.raises(Drift, match=knob):
        k.check(target)


@pytest.mark.parametrize(("knob", "host_name"), SUPPORTED_CASES)
def test_rollback_restores_bytes(knob: str, host_name: str, tmp_path: Path) -> None:
    host, k = _make(knob, host_name, tmp_path)
    target, _ = TARGETS[knob][host_name]
    before = _tree(host)
    snap = k.snapshot()
    k.apply(target)
    assert _tree(host) != before
    # the snapshot survives persistence (the agent journals it as JSON)
    restored = Snapshot.from_json(snap.to_json())
    load_knob(knob, host.fs()).rollback(restored)
    assert _tree(host) == before
    # rolling back again is harmless
    k.rollback(restored)
    assert _tree(host) == before
