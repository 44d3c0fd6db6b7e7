"""``musku qsim predict`` (docs/qsim.md "Predicting a sweep") and ``[sweep] order_by =
"prediction"``: knob settings predicted on small models against closed forms, beside a real
sweep's results DB, and the scan order."""

from __future__ import annotations

import csv
import io
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from musku.domain import Configuration, Decision
from musku.errors import InputError, UnsupportedError
from musku.experiment import load_experiment
from musku.qsim.predict import NOT_EXPRESSIBLE, Effect, Measured, agreement, predict
from musku.storage import open_store
from musku.strict_json import loads_strict
from musku.sweep.predicted import by_gain
from musku.sweep.schedule import scan_order
from musku.sweep.sweep import run_sweep

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.services

# One server, exp(10 us) at 2.2 GHz, the whole time CPU-bound (dvfs_scale 1), no hops: M/M/1.
MM1 = """\
[run]
duration_s = 1.0
warmup_s = 0.05

[network]
latency_us = 0

[[machines]]
name = "m"
cores = 1
freq_base_ghz = 2.2

[[services]]
name = "server"
execution = "simple"

  [[services.stages]]
  name = "work"
  time = {{ dist = "exp", mean_us = 10 }}
  dvfs_scale = 1.0

[[paths]]
  [[paths.nodes]]
  name = "only"
  service = "server"

[client]
kind = "open"
qps = {qps}
"""

# Four threads on a machine of four cores, exp(10 us) each: M/M/4; core_count = 2 leaves them
# two cores (the cores bound the rate: M/M/2).
MMC = """\
[run]
duration_s = 0.5
warmup_s = 0.05

[network]
latency_us = 0

[[machines]]
name = "m"
cores = 4

[[services]]
name = "server"
execution = "threads"
threads = 4

  [[services.stages]]
  name = "work"
  time = { dist = "exp", mean_us = 10 }

[[paths]]
  [[paths.nodes]]
  name = "only"
  service = "server"

[client]
kind = "open"
qps = 120000
"""

EXPERIMENT = """\
[experiment]
name = "{name}"

[service]
name = "toy"
knobs = {knobs}

[platform]
catalog = "skylake18"

[platform.settings]
{settings}

{production}

[sweep]
baseline = "production"
scan = "{scan}"
{order}

[metric]
primary = "p99_ms"

[statistics]
confidence = 0.95
min_effect = 0.02
warmup_s = 0.0
sample_cap = 60
seed = 1

[hosts]
backend = "qsim"
model = "model.toml"
sim_seconds = 0.3
noise = 0.02

[predict]
seeds = {seeds}
duration_s = {duration}
"""


def experiment(
    tmp: Path,
    model: str,
    *,
    name: str = "toy",
    knobs: str = '["core_freq"]',
    settings: str = "core_freq = [1.6, 2.2]",
    production: str = "",
    scan: str = "full",
    order: str = "",
    seeds: int = 3,
    duration: float = 1.0,
) -> Path:
    (tmp / "model.toml").write_text(model)
    f = tmp / f"{name}.toml"
    text = EXPERIMENT.format(
        name=name, knobs=knobs, settings=settings, production=production, scan=scan,
        order=order, seeds=seeds, duration=duration,
    )  # fmt: skip
    f.write_text(text)
    return f


def row(pred: object, knob: str, setting: object) -> object:
    return next(r for r in pred.rows if r.knob == knob and r.setting == setting)  # type: ignore[attr-defined]


def inside(x: float, lo: float, hi: float, widen: float) -> bool:
    return lo * (1 - widen) <= x <= hi * (1 + widen)


# --------------------------------------------------------------------------- closed forms


def test_frequency_cut_on_mm1(tmp_path: Path, engine: str) -> None:
    """A CPU-bound M/M/1 at rho 0.5: 1.6 GHz instead of 2.2 stretches the service time by
    2.2/1.6, so capacity falls to 1.6/2.2 of mu and p99 = ln(100) / (mu' - lambda) rises
    2.2x (92 us -> 203 us)."""
    lam = 50_000.0
    e = load_experiment(experiment(tmp_path, MM1.format(qps=lam)))
    p = predict(e)
    base, cut = row(p, "core_freq", 2.2), row(p, "core_freq", 1.6)
    mu, mu_cut = 1e5, 1e5 * 1.6 / 2.2
    p99 = math.log(100) / (mu - lam) * 1e6
    p99_cut = math.log(100) / (mu_cut - lam) * 1e6
    assert base.baseline and not cut.baseline  # type: ignore[attr-defined]
    # capacity: utilisation-based, exact for M/M/1 up to the sampled service times
    assert abs(p.base["capacity_qps"] / mu - 1) < 0.02
    assert abs(cut.means["capacity_qps"] / mu_cut - 1) < 0.02  # type: ignore[attr-defined]
    c = cut.effects["capacity_qps"]  # type: ignore[attr-defined]
    assert abs(c.value - (1.6 / 2.2 - 1)) < 0.01 and c.lo <= c.value <= c.hi
    # p99 against the closed form, the interval over seeds widened by 5 %
    assert abs(p.base["p99_us"] / p99 - 1) < 0.08
    assert abs(cut.means["p99_us"] / p99_cut - 1) < 0.08  # type: ignore[attr-defined]
    lo, hi = cut.intervals["p99_us"]  # type: ignore[attr-defined]
    assert inside(p99_cut, lo, hi, 0.05)
    r = cut.effects["p99_us"]  # type: ignore[attr-defined]
    assert inside(p99_cut / p99 - 1, r.lo, r.hi, 0.1), (r, p99_cut / p99 - 1)
    # the gain in the experiment's metric (p99, lower is better): baseline / setting - 1
    assert cut.gain.value == pytest.approx(1 / (1 + r.value) - 1)  # type: ignore[attr-defined]
    assert cut.gain.value < -0.4  # type: ignore[attr-defined]


def erlang_c_mean_us(c: int, lam: float, mu: float) -> float:
    a = lam / mu
    rho = a / c
    top = a**c / math.factorial(c) / (1 - rho)
    pw = top / (sum(a**k / math.factorial(k) for k in range(c)) + top)
    return (pw / (c * mu - lam) + 1 / mu) * 1e6


def test_core_count_on_mmc_matches_erlang_c(tmp_path: Path, engine: str) -> None:
    """Four threads of exp(10 us) at 120 kQPS: M/M/4 on 4 cores, M/M/2 when core_count
    leaves 2; each mean sojourn against Erlang C within its interval, capacity 4 mu and 2 mu."""
    lam, mu = 120_000.0, 1e5
    f = experiment(
        tmp_path, MMC, knobs='["core_count"]', settings="core_count = [2, 18]", duration=0.5
    )
    p = predict(load_experiment(f))
    four, two = row(p, "core_count", 18), row(p, "core_count", 2)
    for r, c in ((four, 4), (two, 2)):
        w = erlang_c_mean_us(c, lam, mu)
        lo, hi = r.intervals["mean_us"]  # type: ignore[attr-defined]
        assert inside(w, lo, hi, 0.02), (c, w, lo, hi)
        assert abs(r.means["capacity_qps"] / (c * mu) - 1) < 0.03  # type: ignore[attr-defined]
    assert two.effects["capacity_qps"].value == pytest.approx(-0.5, abs=0.02)  # type: ignore[attr-defined]
    # Erlang C's ratio of the two means inside the predicted effect's interval (widened 2 %)
    want = erlang_c_mean_us(2, lam, mu) / erlang_c_mean_us(4, lam, mu) - 1
    e = two.effects["mean_us"]  # type: ignore[attr-defined]
    assert inside(want, e.lo, e.hi, 0.02), (want, e)


# --------------------------------------------------------------------------- what it refuses


def test_not_expressible_and_no_model(tmp_path: Path, engine: str) -> None:
    f = experiment(
        tmp_path,
        MM1.format(qps=20000),
        knobs='["core_freq", "uncore_freq"]',
        settings="core_freq = [2.0, 2.2]\nuncore_freq = [1.4, 1.8]",
        seeds=2,
        duration=0.2,
    )
    p = predict(load_experiment(f))
    # the model has no uncore term and the file gives no uncore_scale: no made-up number
    un = row(p, "uncore_freq", 1.4)
    assert un.note == NOT_EXPRESSIBLE and not un.effects and un.gain is None  # type: ignore[attr-defined]
    assert row(p, "core_freq", 2.0).gain is not None  # type: ignore[attr-defined]
    # with an uncore share given, it is predicted: 1 - k + k u_stock / u = 1.2 at k = 0.7
    f.write_text(f.read_text() + "uncore_scale = 0.7\n")
    got = row(predict(load_experiment(f)), "uncore_freq", 1.4)
    assert got.note == "" and got.effects["capacity_qps"].value < -0.1  # type: ignore[attr-defined]
    # no model anywhere: one line naming both ways to give one
    sim = on_sim(f).replace("uncore_scale = 0.7\n", "")
    # a model that can express none of the swept knobs: exit 4's typed refusal
    mute = sim.replace("[predict]\n", '[predict]\nmodel = "model.toml"\n')
    mute = mute.replace('["core_freq", "uncore_freq"]', '["prefetch", "thp"]')
    f.write_text(mute.replace("core_freq = [2.0, 2.2]\nuncore_freq = [1.4, 1.8]", ""))
    with pytest.raises(UnsupportedError, match="can express none of the knobs prefetch, thp"):
        predict(load_experiment(f))
    f.write_text(sim)
    with pytest.raises(
        InputError, match=r"names no queueing model.*--model M.toml or \[predict\] model"
    ):
        predict(load_experiment(f))


def on_sim(f: Path) -> str:
    """The experiment's text with simulated hosts (a sim model, no queueing model)."""
    (f.parent / "m.toml").write_text((ROOT / "experiments/sim/web-skylake18.toml").read_text())
    text = f.read_text()
    return (
        text[: text.index("[hosts]")]
        + '[hosts]\nbackend = "sim"\nmodel = "m.toml"\n\n'
        + text[text.index("[predict]") :]
    )


def run_cli(*args: str, db: str | None = None) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    env.pop("MUSKU_DB", None)
    env["MUSKU_QSIM_PROGRESS_AFTER_S"] = "1000"
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    argv = [sys.executable, "-m", "musku", "qsim", "predict", *args]
    if db is not None:
        argv += ["--db", db]
    return subprocess.run(argv, capture_output=True, text=True, env=env, timeout=600, check=False)


def test_saturated_baseline_and_setting(tmp_path: Path, engine: str) -> None:
    # the baseline itself overloaded: nothing to predict against (exit 3, one line)
    f = experiment(tmp_path, MM1.format(qps=120000), seeds=2, duration=0.3)
    out = run_cli(str(f), "-q", db=f"sqlite:///{tmp_path / 'none.db'}")
    assert out.returncode == 3, out.stderr
    assert (
        out.stderr.count("\n") == 1 and "saturates" in out.stderr and "Traceback" not in out.stderr
    )
    # 1.6 GHz overloads a server at rho 0.8 at 2.2: its row says so, latency not predicted
    f = experiment(tmp_path, MM1.format(qps=80000), seeds=2, duration=0.5)
    out = run_cli(str(f), "-q", "--format", "csv")
    assert out.returncode == 0, out.stderr
    rows = {r["setting"]: r for r in csv.DictReader(io.StringIO(out.stdout))}
    assert rows["1.6"]["status"] == "saturated" and rows["1.6"]["p99_effect"] == ""
    assert rows["2.2"]["status"] == "baseline"
    assert "saturate the model at" in out.stderr and "core_freq=1.6" in out.stderr
    # JSON stays strict: the saturated setting's unbounded gain is null, not -Infinity
    out = run_cli(str(f), "-q", "--json")
    assert out.returncode == 0, out.stderr
    doc = loads_strict(out.stdout)
    (sat,) = [r for r in doc["rows"] if r["setting"] == 1.6]
    assert sat["saturated"] and sat["gain"]["value"] is None and "p99_us" not in sat["effects"]
    assert sat["effects"]["capacity_qps"]["value"] < -0.2


# --------------------------------------------------------------------------- beside a sweep


def test_beside_a_real_sweep(tmp_path: Path, engine: str) -> None:
    """A sweep on the qsim backend into a new DB, then `musku qsim predict` (a real process)
    prints each setting's prediction next to the sweep's measured effect, and they agree."""
    f = experiment(
        tmp_path, MM1.format(qps=40000), settings="core_freq = [1.9, 2.2]", seeds=2, duration=0.5
    )
    url = f"sqlite:///{tmp_path / 'r.db'}"
    store = open_store(url)
    try:
        run_sweep(load_experiment(f), store=store)
    finally:
        store.close()
    out = run_cli(str(f), "--format", "json", "-q", db=url)
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    (cut,) = [r for r in doc["rows"] if r["setting"] == 1.9]
    assert cut["gain"]["value"] < 0 and cut["measured"]["estimate"] < 0
    assert cut["measured"]["decision"] == Decision.WORSE.value
    assert cut["agreement"].startswith("sign"), cut
    assert doc["sweep"].startswith("sweep ") and "1 settings measured" in doc["sweep"]
    table = run_cli(str(f), "-q", db=url)
    assert table.returncode == 0, table.stderr
    line = next(
        x
        for x in table.stdout.splitlines()
        if x.lstrip("│ ").startswith("core_freq") and "1.9" in x
    )
    # both columns on the setting's line: the predicted gain and the measured effect
    assert f"{cut['gain']['value'] * 100:+.1f}" in line
    assert f"{cut['measured']['estimate'] * 100:+.1f}" in line and "sign" in line


# --------------------------------------------------------------------------- a sweep's order


def test_order_by_prediction_changes_only_the_order(tmp_path: Path, engine: str) -> None:
    settings = "core_freq = [1.6, 1.9, 2.2]"
    prod = "[production]\ncore_freq = 1.9"
    plain = experiment(tmp_path, MM1.format(qps=40000), name="plain", settings=settings,
                       production=prod, scan="unimodal", seeds=2, duration=0.3)  # fmt: skip
    ordered_f = experiment(tmp_path, MM1.format(qps=40000), name="ordered", settings=settings,
                           production=prod, scan="unimodal", order='order_by = "prediction"',
                           seeds=2, duration=0.3)  # fmt: skip
    a, b = load_experiment(plain), load_experiment(ordered_f)
    assert scan_order(a, "core_freq", 1.9) == [[1.6], [2.2]]  # down first, as ever
    assert scan_order(b, "core_freq", 1.9) == [[2.2], [1.6]]  # the predicted gain first
    url = f"sqlite:///{tmp_path / 'r.db'}"
    found = {}
    for e in (a, b):
        store = open_store(url)
        try:
            rep = run_sweep(e, store=store)
            run = store.find_experiment(e.name)
            assert run is not None
            cmps = store.comparisons(run.id)
        finally:
            store.close()
        walked = [c.candidate["core_freq"] for c in cmps if c.purpose == "knob:core_freq"]
        decided = {c.candidate["core_freq"]: c.result.decision for c in cmps
                   if c.purpose == "knob:core_freq" and c.result is not None}  # fmt: skip
        found[e.name] = (walked, decided, rep.best)
    assert found["plain"][0][:2] == [1.6, 2.2]
    assert found["ordered"][0][:2] == [2.2, 1.6]
    # the same decisions and the same soft SKU: only the order moved
    assert found["plain"][1] == found["ordered"][1]
    assert (
        found["plain"][2]
        == found["ordered"][2]
        == Configuration.of(**{**a.baseline_config.as_dict(), "core_freq": 2.2})
    )


def test_order_by_prediction_needs_a_model(tmp_path: Path) -> None:
    f = experiment(tmp_path, MM1.format(qps=1000), order='order_by = "prediction"')
    text = on_sim(f)
    f.write_text(text)
    with pytest.raises(InputError, match="names no queueing model"):
        run_sweep(load_experiment(f))
    f.write_text(text.replace('order_by = "prediction"', 'order_by = "guess"'))
    with pytest.raises(InputError, match="order_by must be 'none' or 'prediction'"):
        load_experiment(f)


@given(
    values=st.lists(st.integers(0, 40), max_size=10, unique=True),
    cut=st.integers(0, 10),
    two=st.booleans(),
    gains=st.dictionaries(st.integers(0, 40), st.integers(-100, 100), max_size=12),
)
def test_ordered_is_a_reordering(
    values: list[int], cut: int, two: bool, gains: dict[int, float]
) -> None:
    """The same settings, nothing added or lost; one walk sorted by gain (unknown ones after,
    in their order); two walks each kept intact (the unimodal stop needs their order)."""
    walks = [values[:cut], values[cut:]] if two else [values]
    got = by_gain([list(w) for w in walks], gains)
    assert sorted(v for w in got for v in w) == sorted(v for w in walks for v in w)
    if len(walks) == 2 and any(g in gains for w in walks for g in w):
        assert sorted(got) == sorted(walks)  # each walk intact
    elif len(walks) == 1 and any(v in gains for v in walks[0]):
        known = [v for v in got[0] if v in gains]
        assert [gains[v] for v in known] == sorted((gains[v] for v in known), reverse=True)
        assert got[0][len(known) :] == [v for v in walks[0] if v not in gains]


def test_agreement() -> None:
    m = Measured(1, 1, "p99_ms", -0.05, -0.07, -0.03, "worse")
    assert agreement(Effect(-0.06, -0.08, -0.04), m, 0.01) == "sign and size"
    assert agreement(Effect(-0.30, -0.32, -0.28), m, 0.01) == "sign"
    assert agreement(Effect(0.05, 0.03, 0.07), m, 0.01) == "no"
    assert agreement(Effect(0.0, -0.01, 0.01), m, 0.01) == "no"  # predicted no effect
    # a saturated prediction against a guardrail decision taken without a bounded interval
    inf = math.inf
    pruned = Measured(1, 2, "p99_ms", -5.0, -inf, inf, "guardrail")
    assert agreement(Effect(-inf, -inf, -inf), pruned, 0.01) == "sign"
    assert agreement(Effect(0.01, 0.005, 0.02), pruned, 0.01) == "no"


def test_t_quantile_against_scipy() -> None:
    from scipy.special import stdtrit

    from musku.qsim.predict import t975

    for df in range(1, 400):
        assert t975(df) == pytest.approx(float(stdtrit(df, 0.975)), abs=2e-4)
