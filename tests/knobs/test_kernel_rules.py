"""The fake kernel's rule registry: each knob's spec contributes its rules
(``KnobSpec.fake_kernel``), an out-of-tree knob brings its own with no edit to musku
(``tests/knobs/toyknob.py``: the block layer's ``read_ahead_kb``), a tree may add one, and a
bad rule target is one clear line naming the knob."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from musku.errors import InputError
from musku.hostfs import HostFSError
from musku.knob_spec import BUILTIN, Kind, KnobSpec, register_knob, spec_of, unregister_knob
from musku.knobs import load_knob
from musku.testing.fakehost import FakeHost, FakeKernelFS, KernelRule, einval, kernel_rules
from tests.knobs.toyknob import TARGET

READ_AHEAD = "/sys/block/vda/queue/read_ahead_kb"


def test_every_built_in_rule_comes_from_a_knob_spec() -> None:
    by_knob = {name: spec_of(name).fake_kernel for name in BUILTIN}
    assert all(t.startswith(f"musku.testing.kernel.{n}:") for n, t in by_knob.items() if t)
    assert {n for n, t in by_knob.items() if t} == set(BUILTIN) - {"prefetch"}  # MSRs: a file
    names = {r.name for r in kernel_rules()}
    assert {"thp choice", "huge page pool", "CPU hotplug", "resctrl schemata"} <= names


def test_the_out_of_tree_knobs_rule_applies_once_it_is_registered(tmp_path: Path) -> None:
    host = FakeHost(tmp_path).file(READ_AHEAD, "128\n")
    fs = host.fs()
    try:
        fs.write_bytes(READ_AHEAD, b"130")  # no rule yet: a plain sysfs attribute
        assert host.read(READ_AHEAD) == "130\n"
        knob = load_knob(TARGET, fs)  # registers the knob, and with it its rule
        assert "read_ahead_kb" in {r.name for r in kernel_rules()}
        fs.write_bytes(READ_AHEAD, b"130")
        assert host.read(READ_AHEAD) == "128\n"  # kept in 4 KiB pages
        with pytest.raises(HostFSError, match="Invalid argument"):
            fs.write_bytes(READ_AHEAD, b"lots")
        assert knob.read() == 128
        snap = knob.snapshot()
        knob.apply(512)
        assert knob.verify(512)
        knob.rollback(snap)
        assert host.read(READ_AHEAD) == "128\n"
    finally:
        unregister_knob("readahead")
    assert "read_ahead_kb" not in {r.name for r in kernel_rules()}


@settings(max_examples=60, deadline=None)
@given(st.text(alphabet="0123456789 x-", min_size=1, max_size=8))
def test_the_toy_rule_is_the_kernels(tmp_path_factory: pytest.TempPathFactory, text: str) -> None:
    """A store the rule takes reads back as the page-rounded number; any other is EINVAL and
    changes nothing."""
    host = FakeHost(tmp_path_factory.mktemp("ra")).file(READ_AHEAD, "128\n")
    register_knob(TARGET)
    try:
        fs = host.fs()
        if text.strip().isdigit():
            fs.write_bytes(READ_AHEAD, text.encode())
            assert host.read(READ_AHEAD) == f"{int(text.strip()) // 4 * 4}\n"
        else:
            with pytest.raises(HostFSError, match="Invalid argument"):
                fs.write_bytes(READ_AHEAD, text.encode())
            assert host.read(READ_AHEAD) == "128\n"
    finally:
        unregister_knob("readahead")


def test_a_tree_of_its_own_rule_goes_first(tmp_path: Path) -> None:
    seen: list[str] = []

    def frozen(kernel: FakeKernelFS, path: str, text: str, match: re.Match[str]) -> None:
        seen.append(match.group(1))
        raise einval(path)

    host = FakeHost(tmp_path).thp().rule(KernelRule(r".*/transparent_hugepage/(\w+)", frozen))
    with pytest.raises(HostFSError, match="Invalid argument"):
        host.fs().write_bytes("/sys/kernel/mm/transparent_hugepage/enabled", b"never")
    assert seen == ["enabled"] and "[madvise]" in host.read(
        "/sys/kernel/mm/transparent_hugepage/enabled"
    )


class BadRulesKnob:
    """A spec whose rules target holds something else (registered only for the test)."""

    spec = KnobSpec(
        name="badrules", kind=Kind.COUNT, fake_kernel="tests.knobs.test_kernel_rules:NOT_RULES"
    )


class MissingRulesKnob:
    spec = KnobSpec(name="missingrules", kind=Kind.COUNT, fake_kernel="tests.knobs.nowhere:RULES")


NOT_RULES = ("a string is not a rule",)


@pytest.mark.parametrize(
    ("target", "name", "message"),
    [
        ("tests.knobs.test_kernel_rules:BadRulesKnob", "badrules", "are not KernelRule"),
        ("tests.knobs.test_kernel_rules:MissingRulesKnob", "missingrules", "cannot import"),
    ],
)
def test_a_bad_rules_target_is_one_line_naming_the_knob(
    tmp_path: Path, target: str, name: str, message: str
) -> None:
    register_knob(target)
    try:
        host = FakeHost(tmp_path).thp()
        with pytest.raises(InputError) as info:
            host.fs().write_bytes("/sys/kernel/mm/transparent_hugepage/enabled", b"never")
        text = info.value.one_line()
        assert name in text and message in text and "\n" not in text
    finally:
        unregister_knob(name)
