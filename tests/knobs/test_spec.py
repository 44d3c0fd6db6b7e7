"""Knob specs and the one registry: the built-ins describe themselves, out-of-tree knobs
register by ``module:Class``, by ``register_knob`` or by an installed entry point."""

from __future__ import annotations

import re
import sys
import types
from collections.abc import Iterator
from pathlib import Path

import pytest

import musku.knob_spec as spec_mod
from musku.domain import KNOBS, Configuration
from musku.errors import InputError
from musku.knob_spec import (
    BUILTIN,
    Kind,
    KnobSpec,
    coerce_setting,
    is_knob,
    knob_names,
    register_knob,
    spec_of,
    unregister_knob,
)
from musku.knobs import knob_class
from tests.knobs.toyknob import TARGET


@pytest.fixture
def clean_registry() -> Iterator[None]:
    yield
    for name in ("readahead", "swappiness"):
        if name in spec_mod._targets:
            unregister_knob(name)


def test_builtins_describe_themselves() -> None:
    assert KNOBS == tuple(BUILTIN) == knob_names()
    for name in KNOBS:
        spec = spec_of(name)
        assert spec.name == name and knob_class(name).spec is spec
    assert [spec_of(k).order for k in KNOBS] == sorted(spec_of(k).order for k in KNOBS)
    ordered = {k for k in KNOBS if spec_of(k).is_ordered}
    assert ordered == {"core_freq", "uncore_freq", "core_count", "shp"}  # unimodal scans
    assert {k: spec_of(k).kind for k in ("core_freq", "cdp", "thp", "shp")} == {
        "core_freq": Kind.GHZ,
        "cdp": Kind.WAYS,
        "thp": Kind.CHOICE,
        "shp": Kind.COUNT,
    }
    assert [k for k in KNOBS if spec_of(k).service_flag] == ["shp"]


@pytest.mark.parametrize(
    ("knob", "value", "expected"),
    [
        ("core_freq", "2.2", 2.2),
        ("core_freq", 2.21234, 2.212),
        ("core_freq", "turbo", "turbo"),
        ("core_count", 18.0, 18),
        ("cdp", "06:05", "6:5"),
        ("cdp", "off", "off"),
        ("thp", "never", "never"),
    ],
)
def test_canonical(knob: str, value: object, expected: object) -> None:
    assert spec_of(knob).canonical(value) == expected


@pytest.mark.parametrize(
    ("knob", "value", "cores", "ways", "needle"),
    [
        ("core_count", 0, 18, 11, "not in 1..18 (the platform's cores)"),
        ("core_count", 19, 18, 11, "not in 1..18"),
        ("shp", -1, 18, 11, "not in 0..16777216"),
        ("shp", 1 << 25, 18, 11, "not in 0..16777216"),
        ("core_freq", 12.0, 18, 11, "not a frequency in (0, 10] GHz"),
        ("core_freq", "２.2", 18, 11, "takes a frequency"),
        ("cdp", "6:6", 18, 11, "does not split the LLC's 11 ways"),
        ("cdp", "0:11", 18, 11, "need 1 or more ways"),
        ("core_count", True, 18, 11, "takes an integer"),
    ],
)
def test_check_refuses_what_a_platform_cannot_take(
    knob: str, value: object, cores: int, ways: int, needle: str
) -> None:
    with pytest.raises((TypeError, ValueError)) as info:
        spec_of(knob).check(value, cores=cores, ways=ways)
    assert needle in str(info.value)


def test_coerce_and_format() -> None:
    assert spec_of("shp").coerce("256") == 256 and spec_of("core_freq").coerce("1.90") == 1.9
    assert spec_of("core_freq").format(2.2) == "2.2GHz" and spec_of("cdp").format("6:5") == "6d:5c"
    assert spec_of("cdp").default_settings(3) == ("off", "1:2", "2:1")
    assert spec_of("thp").default_settings(3) is None
    platform = types.SimpleNamespace(name="p", settings={"shp": (0, 256)})
    assert coerce_setting(platform, "shp", "256") == 256
    for knob, raw, needle in [
        ("warp", "1", "unknown knob 'warp'"),
        ("thp", "never", "not in platform p's catalog"),
        ("shp", "x", "shp=x:"),
        ("shp", "128", "shp=128 is not in platform p's catalog (0, 256)"),
    ]:
        with pytest.raises(InputError, match=re.escape(needle)):
            coerce_setting(platform, knob, raw)


def test_a_spec_name_must_suit_a_column() -> None:
    with pytest.raises(InputError, match="lower-case"):
        KnobSpec(name="Read-Ahead", kind=Kind.COUNT)


def test_register_by_target_and_refusals(clean_registry: None) -> None:
    spec = register_knob(TARGET)
    assert spec.name == "readahead" and register_knob(TARGET) is spec  # twice is harmless
    assert Configuration.of(readahead=64).key() == '{"readahead":64}'
    for target, needle in [
        ("tests.knobs.nowhere:Knob", "cannot import 'tests.knobs.nowhere'"),
        ("tests.knobs.toyknob:Nothing", "has no 'Nothing'"),
        ("musku.hostfs:HostFS", "has no 'spec'"),
    ]:
        with pytest.raises(InputError, match=re.escape(needle)):
            register_knob(target)
    # another class claiming the name is refused
    module = types.ModuleType("knobspec_twin")
    module.Twin = type("Twin", (), {"spec": KnobSpec(name="readahead", kind=Kind.COUNT)})  # type: ignore[attr-defined]
    sys.modules["knobspec_twin"] = module
    try:
        with pytest.raises(InputError, match="already 'tests.knobs.toyknob:ReadaheadKnob'"):
            register_knob("knobspec_twin:Twin")
    finally:
        del sys.modules["knobspec_twin"]
    with pytest.raises(InputError, match="built in"):
        unregister_knob("thp")


def test_an_installed_entry_point_registers_a_knob(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, clean_registry: None
) -> None:
    """A distribution declaring ``[musku.knobs] readahead = "module:Class"`` (a real
    dist-info directory on sys.path, found by importlib.metadata)."""
    dist = tmp_path / "toyknobs-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: toyknobs\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text(f"[musku.knobs]\nreadahead = {TARGET}\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(spec_mod, "_entry_points_read", False)
    assert is_knob("readahead")
    assert knob_names()[-1] == "readahead" and spec_of("readahead").kind is Kind.COUNT
    assert Configuration.of(readahead=256.0)["readahead"] == 256


def test_a_broken_entry_point_is_skipped_not_fatal(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    dist = tmp_path / "brokenknobs-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: brokenknobs\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text("[musku.knobs]\nswappiness = nowhere.at_all:Knob\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(spec_mod, "_entry_points_read", False)
    assert knob_names() == KNOBS  # the built-ins are still listed
    assert "swappiness" in caplog.text and "cannot import 'nowhere.at_all'" in caplog.text
    assert not is_knob("swappiness")
