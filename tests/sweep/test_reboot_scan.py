"""``[sweep] reboot_knobs = "scan-live"`` (issue 31 item 4): a reboot knob scanned with its
live mechanism, the choice confirmed once with the reboot; the sim's two mechanisms; at most
one reboot per host per period; the option's bad inputs (docs/experiment.md)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from musku.abtest import run_comparison
from musku.domain import ComparisonResult, Configuration, Decision
from musku.errors import UnsupportedError
from musku.experiment import load_experiment
from musku.sim import SimModel, SimPair
from musku.sim.pair import pair_setup
from musku.sweep import run_sweep
from tests.cli.test_exit_codes import musku, one_error_line
from tests.fixtures.toy import MODEL

ROOT = Path(__file__).resolve().parents[2]
WEB_SKYLAKE = ROOT / "experiments" / "web-skylake.toml"

SYNTH: dict[str, Any] = {
    "model": {"name": "synthetic"},
    "reference": {"mips": 1000.0, "qps": 100.0, "p99_ms": 10.0, "power_w": 100.0},
    "knobs": {
        "cdp": {"throughput": {"off": 1.0, "6:5": 1.05}},
        "core_count": {
            "throughput": {"4": 0.3, "16": 0.9, "18": 1.0},
            "warmup": {"4": {"amplitude": 0.08, "tau_s": 240.0}},
            "live": {"throughput": 0.9, "warmup": {"amplitude": 0.03, "tau_s": 60.0}},
        },
    },
    "noise": {"load": {}, "warmup": {}},
}
A = Configuration.of(cdp="off", core_count=18)
REBOOT = frozenset({"core_count"})


def synth() -> SimModel:
    return SimModel.from_dict(SYNTH, source="synthetic")


def test_live_mechanism_no_reboot_short_transient_its_own_effect() -> None:
    m = synth()
    pair = SimPair(m, seed=0, initial=(A, A), reboot_knobs=REBOOT, noise_scale=0.0)
    pair.live_knobs = REBOOT
    four = A.with_("core_count", 4)
    # live: the apply's seconds only, no reboot, the live transient, the live effect
    assert pair.apply((A, four)) == pytest.approx(m.timing.apply_s)
    assert pair.reboots == 0 and pair.host_reboots == [0, 0]
    assert pair.point(1).throughput == pytest.approx(0.3 * 0.9)
    assert [w[2] for w in pair._warm[1][1:]] == [60.0]  # not the reboot's 240 s JIT restart
    # the same setting by the reboot mechanism: a change (the kernel must boot with it)
    pair.live_knobs = frozenset()
    assert pair.apply((A, four)) == pytest.approx(m.timing.apply_s + m.timing.reboot_s)
    assert pair.host_reboots == [0, 1]
    assert pair.point(1).throughput == pytest.approx(0.3)
    assert [w[2] for w in pair._warm[1][1:]] == [240.0]
    # a live setting undone to the booted one needs no reboot
    pair.live_knobs = REBOOT
    pair.apply((A.with_("core_count", 16), four))
    assert pair.point(0).throughput == pytest.approx(0.9 * 0.9)
    pair.live_knobs = frozenset()
    assert pair.apply((A, four)) == pytest.approx(m.timing.apply_s)
    assert pair.host_reboots == [0, 1]  # host 0 booted with 18: back there live
    assert pair.point(0).throughput == pytest.approx(1.0)


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(st.booleans(), st.sampled_from([4, 16, 18]), st.sampled_from([4, 16, 18])),
        min_size=1,
        max_size=12,
    )
)
def test_at_most_one_reboot_per_host_per_apply_and_effect_by_mechanism(
    steps: list[tuple[bool, int, int]],
) -> None:
    """Any sequence of applies under either mechanism: a host reboots at most once per apply
    (the driver applies once per period), only under the reboot mechanism and only when the
    setting differs from the one it booted with; it runs the live effect exactly while its
    setting differs from the booted one."""
    m = synth()
    pair = SimPair(m, seed=0, initial=(A, A), reboot_knobs=REBOOT, noise_scale=0.0)
    booted = [18, 18]
    for live, a, b in steps:
        pair.live_knobs = REBOOT if live else frozenset()
        before = list(pair.host_reboots)
        pair.apply((A.with_("core_count", a), A.with_("core_count", b)))
        for h, v in enumerate((a, b)):
            rebooted = pair.host_reboots[h] - before[h]
            assert rebooted in (0, 1)
            assert rebooted == int(not live and v != booted[h])
            if rebooted:
                booted[h] = v
            want = m.point(A.with_("core_count", v)).throughput * (0.9 if v != booted[h] else 1)
            assert pair.point(h).throughput == pytest.approx(want)


def _compare(live: bool) -> tuple[ComparisonResult, SimPair, int]:
    exp = load_experiment(WEB_SKYLAKE)
    pair = pair_setup(exp).pair(seed=3)
    spec = exp.spec
    if live:
        pair.live_knobs = REBOOT
        spec = dataclasses.replace(spec, reboot_knobs=frozenset())
    base = exp.baseline_config
    applies = pair.applies
    result = run_comparison(pair, base, base.with_("core_count", 16), spec, seed=5)
    return result, pair, pair.applies - applies


def test_a_reboot_comparison_reboots_each_host_at_most_once_per_period() -> None:
    result, pair, applies = _compare(live=False)
    assert result.decision is Decision.WORSE
    assert max(pair.host_reboots) > 0 and all(r <= applies for r in pair.host_reboots)
    assert result.time is not None and result.time.reboot_s > 0
    live, lpair, _ = _compare(live=True)
    # the live mechanism: the same answer, no reboot, shorter periods
    assert live.decision is Decision.WORSE and lpair.host_reboots == [0, 0]
    assert live.time is not None and live.time.reboot_s == 0
    assert live.host_time_s < result.host_time_s


def _toy(tmp: Path, reboot_tp: float, live_tp: float, extra: str = "") -> Path:
    """The toy service with only core_count, made a reboot knob (a catalog copy), where one
    vCPU gives ``reboot_tp`` set by a reboot and ``reboot_tp * live_tp`` set live."""
    cat = (ROOT / "knobs" / "firecracker-vm.toml").read_text()
    cat = cat.replace("settings = [1, 2]\n", "settings = [1, 2]\nreboot = true\n", 1)
    (tmp / "vm-reboot.toml").write_text(cat)
    model = MODEL.replace('"1" = 0.55', f'"1" = {reboot_tp}').replace(
        '[knobs.core_count.qos]\n"1" = 0.4\n', ""
    )
    model = model.replace(
        "[knobs.thp.throughput]",
        f"[knobs.core_count.live]\nthroughput = {live_tp}\n\n[knobs.thp.throughput]",
    )
    (tmp / "m.toml").write_text(model)
    exp = f"""
[experiment]
name = "live-toy"
[service]
name = "toy"
knobs = ["core_count", "thp", "shp"]
uses_shp = true
[platform]
catalog = "{tmp / "vm-reboot.toml"}"
[production]
thp = "madvise"
shp = 0
[sweep]
reboot_knobs = "scan-live"
{extra}
[metric]
primary = "mips"
[statistics]
min_effect = 0.004
warmup_s = 30
sample_cap = 20000
seed = 7
[hosts]
backend = "sim"
model = "m.toml"
"""
    path = tmp / "live-toy.toml"
    path.write_text(exp)
    return path


@pytest.mark.parametrize(
    ("reboot_tp", "live_tp", "chosen"),
    [
        (1.03, 0.99, 1),  # better both ways: the live choice is confirmed with the reboot
        (1.0, 1.03, 2),  # better only live: the reboot confirmation disagrees, baseline kept
    ],
)
def test_live_scan_then_one_reboot_confirmation(
    tmp_path: Path, reboot_tp: float, live_tp: float, chosen: int
) -> None:
    rep = run_sweep(load_experiment(_toy(tmp_path, reboot_tp, live_tp)), seed=1)
    (o,) = [k for k in rep.knobs if k.knob == "core_count"]
    assert o.best_value == chosen == rep.best["core_count"]
    purposes = [r.decision for r in o.results]
    confirm = o.results[-1]
    assert len(purposes) >= 2  # the live scan's comparison(s), then the reboot's
    assert confirm.time is not None and confirm.time.reboot_s > 0
    assert all(r.time is not None and r.time.reboot_s == 0 for r in o.results[:-1])
    assert (confirm.decision is Decision.BETTER) == (chosen == 1)


def test_a_live_scan_that_keeps_the_baseline_reboots_nothing(tmp_path: Path) -> None:
    rep = run_sweep(load_experiment(_toy(tmp_path, 0.6, 0.985)), seed=1)
    (o,) = [k for k in rep.knobs if k.knob == "core_count"]
    assert o.best_value == 2
    assert all(r.time is not None and r.time.reboot_s == 0 for r in o.results)


def _variant(tmp: Path, old: str, new: str) -> Path:
    text = WEB_SKYLAKE.read_text().replace("[sweep]\n", '[sweep]\nreboot_knobs = "scan-live"\n')
    model = (WEB_SKYLAKE.parent / "sim" / "web-skylake18.toml").resolve()
    text = text.replace('model = "sim/web-skylake18.toml"', f'model = "{model}"')
    assert old in text
    path = tmp / "v.toml"
    path.write_text(text.replace(old, new))
    return path


def test_option_loads_and_names_the_live_knobs(tmp_path: Path) -> None:
    exp = load_experiment(_variant(tmp_path, "[hosts]", "[hosts]"))
    assert exp.reboot_scan == "scan-live" and exp.live_knobs == frozenset({"core_count"})
    assert load_experiment(WEB_SKYLAKE).live_knobs == frozenset()


AGENT_HOSTS = '[hosts]\nbackend = "agent"\nhosts = ["a", "b"]\n'


@pytest.mark.parametrize(
    ("old", "new", "code", "words"),
    [
        ('reboot_knobs = "scan-live"', 'reboot_knobs = "live"', 3, "must be 'reboot' or"),
        ("tolerates_reboot = true", "tolerates_reboot = false", 3, "no reboot knob"),
        ('mode = "independent"', 'mode = "multiarm"', 4, "'multiarm' has no per-knob scan"),
        ('mode = "independent"', 'mode = "exhaustive"', 4, "'exhaustive' has no per-knob"),
        ("[hosts]\n", "AGENT", 4, "cannot switch"),
    ],
)
def test_bad_input_is_one_line_with_its_exit_code(
    tmp_path: Path, old: str, new: str, code: int, words: str
) -> None:
    path = _variant(tmp_path, old, "[hosts]\n" if new == "AGENT" else new)
    text = path.read_text()
    if new == "AGENT":
        text = text[: text.index("[hosts]")] + AGENT_HOSTS
    elif "multiarm" in new:
        text = text.replace("[hosts]\n", "[hosts]\nfleet = 8\n")
    path.write_text(text)
    proc = musku("check", str(path))
    assert proc.returncode == code, proc.stderr
    assert words in one_error_line(proc)


def test_a_model_without_the_live_mechanism_is_unsupported(tmp_path: Path) -> None:
    model = (WEB_SKYLAKE.parent / "sim" / "web-skylake18.toml").read_text()
    start = model.index("[knobs.core_count.live]")
    end = model.index("[noise]")
    (tmp_path / "m.toml").write_text(model[:start] + model[end:])
    path = _variant(tmp_path, "[hosts]", "[hosts]")
    path.write_text(
        path.read_text().replace(
            str((WEB_SKYLAKE.parent / "sim" / "web-skylake18.toml").resolve()),
            str(tmp_path / "m.toml"),
        )
    )
    with pytest.raises(UnsupportedError, match="does not model core_count's live mechanism"):
        pair_setup(load_experiment(path))
    # the dry run's host check says so (exit 6, docs/cli.md), in one line
    proc = musku("sweep", str(path), "--dry-run")
    assert proc.returncode == 6, proc.stderr
    assert "does not model core_count's live mechanism" in one_error_line(proc)
