"""Experiment files: the shipped examples load; every kind of bad input is one clear line."""

from __future__ import annotations

from pathlib import Path

import pytest

from musku.domain import Configuration, Direction
from musku.errors import InputError
from musku.experiment import load_experiment

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((ROOT / "experiments").glob("*.toml")) + sorted(
    (ROOT / "experiments" / "sim").glob("cotune-*.toml")  # co-tuning, next to their sim model
)


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_shipped_examples_load(path: Path) -> None:
    exp = load_experiment(path)
    assert exp.name
    assert set(exp.space) == set(exp.service.knobs)
    for knob, values in exp.space.items():
        assert values and set(values) <= set(exp.platform.settings[knob])
        assert exp.production[knob] in exp.platform.settings[knob]


GOOD = """
[experiment]
name = "t"

[service]
name = "web"
knobs = ["thp", "shp", "cdp"]
uses_shp = true

[platform]
catalog = "skylake18"

[platform.settings]
shp = [0, 200, 300]

[production]
thp = "madvise"
shp = 200

[sweep]
mode = "search"

[metric]
primary = "p99_ms"

[[guardrails]]
metric = "qos_violation_rate"
max = 0.01

[statistics]
confidence = 0.9
min_effect = 0.01
sample_cap = 1000

[hosts]
backend = "sim"
model = "sim/whatever.toml"
"""


def write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "exp.toml"
    p.write_text(text)
    return p


def test_good_file(tmp_path: Path) -> None:
    exp = load_experiment(write(tmp_path, GOOD))
    assert exp.service.knobs == ("cdp", "thp", "shp")  # in sweep order
    assert exp.space["shp"] == (0, 200, 300)
    assert exp.space["cdp"][0] == "off" and len(exp.space["cdp"]) == 11
    assert exp.production == exp.stock.with_("thp", "madvise").with_("shp", 200)
    assert exp.baseline_config == exp.production
    assert exp.mode == "search"
    assert exp.spec.direction is Direction.LOWER  # inferred from a latency metric
    assert exp.spec.guardrails[0].holds(0.005) and not exp.spec.guardrails[0].holds(0.02)
    assert exp.stats.confidence == 0.9 and exp.stats.sample_cap == 1000
    assert exp.spec.reboot_knobs == {"core_count"}
    assert exp.resolve("sim/whatever.toml") == tmp_path / "sim/whatever.toml"
    assert Configuration.from_key(exp.production.key()) == exp.production


@pytest.mark.parametrize(
    ("old", "new", "expected"),
    [
        ('name = "t"', 'name = "t', r"exp.toml:3: malformed TOML"),
        (
            'knobs = ["thp", "shp", "cdp"]',
            'knobs = ["thp", "turbo"]',
            r"exp.toml:7: \[service\] unknown knob 'turbo'",
        ),
        (
            'thp = "madvise"',
            'thp = "sometimes"',
            r"exp.toml:\d+: \[production\] thp = 'sometimes' is not in the platform's catalog",
        ),
        (
            "shp = [0, 200, 300]",
            "shp = [0, 250]",
            r"\[platform.settings\] shp = 250 is not in the platform's catalog",
        ),
        (
            'catalog = "skylake18"',
            'catalog = "pentium4"',
            r"exp.toml:\d+: unknown platform 'pentium4'",
        ),
        (
            'mode = "search"',
            'mode = "random"',
            r"exp.toml:\d+: \[sweep\] mode 'random' is not one of",
        ),
        (
            "confidence = 0.9",
            "confidence = 1.5",
            r"exp.toml:\d+: \[statistics\] confidence must be between",
        ),
        ("min_effect = 0.01", "min_effect = -1", r"\[statistics\] min_effect must be"),
        ("sample_cap = 1000", "sample_cap = 3", r"\[statistics\] sample_cap must be >= 10"),
        ("sample_cap = 1000", 'sample_cap = "lots"', r"\[statistics\] sample_cap must be int"),
        ('backend = "sim"', 'backend = "cloud"', r"\[hosts\] unknown backend 'cloud'"),
        ("max = 0.01", "max = 0.01\nmin = 0.0", r"give exactly one of max or min"),
        ("[sweep]", "[sweeep]", r"unknown table \[sweeep\]"),
        (
            'primary = "p99_ms"',
            'primary = "p99_ms"\ndirection = "up"',
            r"direction must be 'higher' or 'lower'",
        ),
    ],
)
def test_bad_input_is_one_clear_line(tmp_path: Path, old: str, new: str, expected: str) -> None:
    assert old in GOOD
    with pytest.raises(InputError, match=expected) as e:
        load_experiment(write(tmp_path, GOOD.replace(old, new, 1)))
    assert "\n" not in str(e.value)


def test_knob_not_on_platform(tmp_path: Path) -> None:
    text = GOOD.replace('catalog = "skylake18"', 'catalog = "zen3-epyc64"').replace(
        "[platform.settings]\nshp = [0, 200, 300]\n", ""
    )
    with pytest.raises(InputError, match="knob 'cdp' is not available on platform 'zen3-epyc64'"):
        load_experiment(write(tmp_path, text))


def test_missing_file() -> None:
    with pytest.raises(InputError, match="no such file"):
        load_experiment("/nonexistent/exp.toml")
