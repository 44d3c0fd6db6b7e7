"""Model files: the shipped ones load; every kind of bad input is one line naming file:line."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from musku.domain import Configuration
from musku.errors import InputError, UnsupportedError
from musku.sim import SimModel

ROOT = Path(__file__).resolve().parents[2]
# model files (experiments/sim also holds experiment files that use them: cotune-*.toml)
MODELS = sorted(
    p
    for p in (ROOT / "experiments" / "sim").glob("*.toml")
    if "model" in tomllib.loads(p.read_text(encoding="utf-8"))
)

GOOD = """\
[model]
name = "tiny"
platform = "skylake18"

[reference]
mips = 1000.0
qps = 100.0
p99_ms = 10.0
power_w = 100.0

[reference.config]
cdp = "off"
thp = "always"

[knobs.cdp.throughput]
"off" = 1.0
"6:5" = 1.05
"5:6" = 1.02

[knobs.thp.throughput]
always = 1.0
madvise = 0.98

[knobs.thp.p99]
madvise = 1.01

[[interactions]]
when = { cdp = "!off", thp = "always" }
throughput = 0.99
why = "overlap"

[noise]
ar_phi = 0.6

[noise.load]
diurnal_amplitude = 0.1

[timing]
reboot_s = 100.0
"""


def write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "model.toml"
    p.write_text(text, encoding="utf-8")
    return p


@pytest.mark.parametrize("path", MODELS, ids=lambda p: p.name)
def test_shipped_models_load(path: Path) -> None:
    model = SimModel.load(path)
    assert model.reference_config is not None
    assert model.throughput(model.reference_config) == pytest.approx(1.0)
    assert model.knobs


def test_good_model_parses_every_part(tmp_path: Path) -> None:
    m = SimModel.load(write(tmp_path, GOOD))
    assert m.name == "tiny" and m.platform == "skylake18"
    assert m.noise.ar_phi == 0.6 and m.noise.load.diurnal_amplitude == 0.1
    assert m.timing.reboot_s == 100.0 and m.timing.apply_s == 2.0
    base = Configuration.of(cdp="off", thp="always")
    # knob multiplier times the interaction, which holds here
    assert m.throughput(base.with_("cdp", "6:5")) == pytest.approx(1.05 * 0.99)
    # interaction off: thp is not "always"
    assert m.throughput(Configuration.of(cdp="6:5", thp="madvise")) == pytest.approx(1.05 * 0.98)
    assert m.metric(base, "mips") == 1000.0
    assert m.metric(Configuration.of(thp="madvise"), "p99_ms") == pytest.approx(10.1)
    # default p99 multiplier is the inverse of the throughput one
    assert m.metric(Configuration.of(cdp="5:6", thp="madvise"), "p99_ms") == pytest.approx(
        10.0 * 1.01 / 1.02
    )
    assert m.true_effect(base, base.with_("thp", "madvise")) == pytest.approx(-0.02)
    assert m.true_effect(base, base.with_("thp", "madvise"), "p99_ms") == pytest.approx(-0.01)
    # a partial configuration sits at the reference for the knobs it leaves out
    assert m.throughput(Configuration.of(cdp="6:5")) == pytest.approx(1.05 * 0.99)


def test_from_dict_is_the_same_schema() -> None:
    data = tomllib.loads(GOOD)
    m = SimModel.from_dict(data, source="bench")
    assert m.throughput(Configuration.of(cdp="6:5", thp="madvise")) == pytest.approx(1.05 * 0.98)
    data["knobs"]["cdp"]["throughput"]["6:5"] = -1
    with pytest.raises(InputError) as err:
        SimModel.from_dict(data, source="bench")
    assert str(err.value).startswith("bench: ")


def test_unknown_setting_at_use_is_unsupported(tmp_path: Path) -> None:
    m = SimModel.load(write(tmp_path, GOOD))
    with pytest.raises(UnsupportedError, match="cdp=4d:7c"):
        m.throughput(Configuration.of(cdp="4:7"))
    with pytest.raises(InputError, match="unknown metric"):
        m.metric(Configuration.of(cdp="off"), "latency")


BAD = [
    # (replace this, with this, expected line (1-based, None = file only), message fragment)
    ('[model]\nname = "tiny"', '[model]\nname = "tiny"\ncolour = 1', 3, "unknown key 'colour'"),
    ("[timing]", "[timings]", 38, "unknown table [timings]"),
    ('platform = "skylake18"', 'platform = "pentium"', 3, "unknown platform"),
    ("mips = 1000.0", "mips = -1.0", 6, "mips must be > 0"),
    ("qps = 100.0", 'qps = "many"', 7, "must be a number"),
    ("p99_ms = 10.0\n", "", 5, "needs 'p99_ms'"),
    ("[knobs.thp.throughput]", "[knobs.tlb.throughput]", 20, "unknown knob 'tlb'"),
    ('"6:5" = 1.05', '"6:6" = 1.05', 17, "not in platform 'skylake18'"),
    ('"6:5" = 1.05', '"six" = 1.05', 17, "not a valid cdp setting"),
    ('"6:5" = 1.05', '"6:5" = 0.0', 17, "multiplier must be > 0"),
    ('"6:5" = 1.05', '"6:5" = nan', 17, "must be finite"),
    ("madvise = 1.01", "never = 1.01", 25, "has no throughput"),
    ("[knobs.thp.p99]", "[knobs.thp.latency]", 24, "unknown key 'latency'"),
    ("[knobs.thp.p99]", "[knobs.thp]\ncolour = 2\n[knobs.thp.p99]", 25, "unknown key 'colour'"),
    ('cdp = "off"\nthp', 'cdp = "4:7"\nthp', 12, "not modelled"),
    ('thp = "always"\n\n[knobs', 'thp = "madvise"\n\n[knobs', 13, "must have throughput 1.0"),
    ('when = { cdp = "!off", thp = "always" }', 'when = { tlb = "on" }', 27, "does not have"),
    ('when = { cdp = "!off", thp = "always" }', 'when = { cdp = "3:8" }', 27, "not modelled"),
    ("throughput = 0.99", "throughput = -0.99", 27, "throughput must be a number > 0"),
    ('why = "overlap"', 'why = "overlap"\nhow = 1', 27, "unknown key 'how'"),
    ("ar_phi = 0.6", "ar_phi = 1.0", 33, "ar_phi must be in [0, 1)"),
    ("ar_phi = 0.6", "ar_sigma = -0.1", 33, "ar_sigma must be in [0, 1)"),
    ("ar_phi = 0.6", "outlier_prob = 2", 33, "outlier_prob must be in [0, 1]"),
    ("ar_phi = 0.6", "host_bias = true", 33, "must be a number"),
    ("ar_phi = 0.6", "drift = 0.1", 33, "unknown key 'drift'"),
    ("diurnal_amplitude = 0.1", "diurnal_amplitude = 1.5", 36, "diurnal_amplitude must be"),
    ("diurnal_amplitude = 0.1", "diurnal_period_s = 0", 36, "diurnal_period_s must be > 0"),
    ("reboot_s = 100.0", "reboot_s = -5", 39, "reboot_s must be >= 0"),
    ("mips = 1000.0", "mips = = 1000.0", 6, "malformed TOML"),
    ('when = { cdp = "!off", thp = "always" }\n', "", 27, "#1: needs when = { knob = value"),
    ("madvise = 1.01\n", "madvise = 1.01\n[knobs.thp]\nqos = 3\n", 27, "[knobs.thp.qos] must be a"),
]


@pytest.mark.parametrize(("old", "new", "line", "fragment"), BAD, ids=[b[3] for b in BAD])
def test_bad_input_is_one_line_with_file_and_line(
    tmp_path: Path, old: str, new: str, line: int | None, fragment: str
) -> None:
    assert old in GOOD
    path = write(tmp_path, GOOD.replace(old, new, 1))
    with pytest.raises(InputError) as err:
        SimModel.load(path)
    text = str(err.value)
    assert "\n" not in text
    assert fragment in text
    expected = f"{path}:{line}: " if line else f"{path}: "
    assert text.startswith(expected), text


def test_missing_file_and_missing_reference(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="no such file"):
        SimModel.load(tmp_path / "absent.toml")
    path = write(tmp_path, '[model]\nname = "x"\n[knobs.thp.throughput]\nalways = 1.0\n')
    with pytest.raises(InputError, match=r"missing required table \[reference\]"):
        SimModel.load(path)


def test_space_checks_both_ways(tmp_path: Path) -> None:
    path = write(tmp_path, GOOD)
    ok = {"cdp": ("off", "6:5", "5:6"), "thp": ("always", "madvise")}
    SimModel.load(path, space=ok)
    # a modelled setting outside the experiment's space
    with pytest.raises(InputError, match="not in the experiment's space") as err:
        SimModel.load(path, space={"cdp": ("off", "6:5"), "thp": ("always", "madvise")})
    assert str(err.value).startswith(f"{path}:18: ")
    # a modelled knob outside the space
    with pytest.raises(InputError, match="knob 'thp' is not in the experiment's space") as err:
        SimModel.load(path, space={"cdp": ("off", "6:5", "5:6")})
    assert str(err.value).startswith(f"{path}:20: ")
    # a setting of the space the model does not cover
    with pytest.raises(InputError, match="does not model the experiment's setting") as err:
        SimModel.load(path, space={"cdp": ("off", "6:5", "5:6", "4:7"), "thp": ok["thp"]})
    assert "4d:7c" in str(err.value)
