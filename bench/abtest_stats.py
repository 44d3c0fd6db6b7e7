#!/usr/bin/env python3
"""Statistical robustness of musku's sequential A/B tester, on the simulator.

One table, one row per condition (the simulator wrong in one way real hosts are), each with:
runs; A/A (or null) false positives, rate and Clopper-Pearson 95 % interval; power for a true
+1.00 % effect with the sign right; coverage of the 95 % intervals at the stop (null and +1 %
runs); median samples per host to the decision for +1 %. Targets: false positives <= 5 %,
coverage >= 94 %, power >= 90 % (printed as PASS/FAIL per row).

The set-up: ``experiments/sim/web-skylake18.toml`` (the shipped model, with its realistic
partly shared load, wander, heavy tails and warm start), the candidate the prefetcher step
l2hw_dcu -> all_on set to exactly +1.00 % (or to 0 for the null runs of conditions whose
candidate differs from the baseline); min_effect 0.5 %, warmup_s 60, 95 %, cap 30,000.
"Calibrated" rows calibrate the pair first (a real ``musku pair calibrate``:
:func:`musku.abtest.calibrate.calibrate_pair` on the same simulated hosts, default precision),
then run the comparison with that calibration, which enables the early path; their power
runs may use a larger true effect (the row says) to measure the early path's power and
error, printed in a table of their own (decided before the first swap, wrong sign, coverage).

``--calibration-runs N``: N calibrations per selected row, on their own: coverage of the
calibration's interval of the pair's true (constant) host bias, Clopper-Pearson.

Second table: samples and A/A rates of musku's paired test (``cs``) next to the paper-style
unpaired Welch test (``welch``) at host load correlation 0, 0.5, 0.9 and 0.99, in the same run;
third: the CUPED gain (median samples with and without the covariate adjustment).

    python bench/abtest_stats.py                # full: 300 null + 100 power runs per row
    python bench/abtest_stats.py --runs 100     # null runs per row (power: runs / 3)
    python bench/abtest_stats.py --quick        # smoke test: a few runs of a few rows
"""

from __future__ import annotations

import argparse
import json
import math
import multiprocessing as mp
import statistics
import sys
import time
import tomllib
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
MODEL_FILE = ROOT / "experiments" / "sim" / "web-skylake18.toml"


@dataclass(frozen=True)
class Cond:
    name: str
    noise: dict[str, Any] = field(default_factory=dict)  # [noise] overrides
    load: dict[str, Any] = field(default_factory=dict)  # [noise.load] overrides
    warm: dict[str, Any] = field(default_factory=dict)  # [noise.warmup] overrides
    warmup: tuple[float, float] | None = None  # candidate's extra (amplitude, tau_s)
    host_bias: float | None = None
    calibrated: bool = False  # a real pair calibration first (the early path on)
    noise_scale: float = 1.0  # the calibration's measured noise (lrv) multiplied by this
    # the noise only: one real calibration of the model (its own seed) measures the noise,
    # pooled into every run's variance (rule options); no bias, no early path
    noise_cal: bool = False
    # the wander only (issue 30 item 1): one real calibration of the model (its own seed)
    # measures the host bias's wander; every run uses it as its pair's calibration, the early
    # path off (so the row differs from the uncalibrated one by the wander prior alone)
    wander_cal: bool = False
    effect: float = 0.01  # the power runs' true effect
    null_differs: bool = False  # the null candidate is another configuration (same speed)
    # no null runs: they would repeat another row's (the same A/A model and seeds)
    power_only: bool = False
    rule: str = "cs"
    options: tuple[tuple[str, Any], ...] = ()
    table: str = "main"


CONDITIONS: list[Cond] = [
    Cond("shipped model (web-skylake18)"),
    Cond(
        "shipped model, load fully shared (old)",
        load={"host_correlation": 1.0, "sensitivity_spread": 0.0, "share_sigma": 0.0},
        noise={"wander_sd": 0.0, "innovation_df": 0.0},
    ),  # fmt: skip
    # issue 30 item 4: a calibration's measured noise pooled into the variance ("noise
    # calibrated": one real calibration of the model measures it, no early path); honest when
    # it is wrong by 1.5x either way (a drift since, another load); "+0.5 %" rows: the
    # power runs' true effect is min_effect itself (NO_DIFFERENCE there must stay <= alpha)
    Cond("shipped model, noise calibrated", noise_cal=True),
    Cond("shipped model, noise calibrated 1.5x low", noise_cal=True, noise_scale=1 / 1.5),
    Cond("shipped model, noise calibrated 1.5x high", noise_cal=True, noise_scale=1.5),
    Cond("shipped model, +0.5 % effect", effect=0.005, power_only=True),
    Cond("shipped model, -0.5 % effect", effect=-0.005, power_only=True),
    Cond(
        "shipped model, noise calibrated 1.5x low, +0.5 % effect",
        noise_cal=True,
        noise_scale=1 / 1.5,
        effect=0.005,
    ),  # fmt: skip
    Cond("shipped model, calibrated", calibrated=True),
    Cond("host bias 1 %, uncalibrated", host_bias=0.01),
    Cond("host bias 1 %, calibrated", host_bias=0.01, calibrated=True),
    Cond("host bias 2 %, uncalibrated", host_bias=0.02),
    Cond("host bias 2 %, calibrated", host_bias=0.02, calibrated=True),
    Cond("host bias 3 %, uncalibrated", host_bias=0.03),
    Cond("host bias 3 %, calibrated", host_bias=0.03, calibrated=True),
    # issue 30 item 5: the early path's power and error under true effects it can decide
    Cond("calibrated, +3 % effect", calibrated=True, effect=0.03),
    Cond("host bias 2 %, calibrated, +3 % effect", host_bias=0.02, calibrated=True, effect=0.03),
    Cond("candidate warm-up +5 % tau 120 s", warmup=(0.05, 120.0), null_differs=True),
    Cond("candidate warm-up +10 % tau 300 s", warmup=(0.10, 300.0), null_differs=True),
    # the equivalence error where decisions take many long periods (power runs only)
    Cond(
        "candidate warm-up +10 % tau 300 s, +0.5 % effect",
        warmup=(0.10, 300.0),
        effect=0.005,
        power_only=True,
    ),  # fmt: skip
    Cond(
        "candidate warm-up +10 % tau 300 s, -0.5 % effect",
        warmup=(0.10, 300.0),
        effect=-0.005,
        power_only=True,
    ),  # fmt: skip
    # diagnostic: the warm-up rows without the per-host wander (their ~1 h periods let the
    # wander move the host bias between periods, which the crossover does not remove)
    Cond(
        "candidate warm-up +5 % tau 120 s, no wander",
        warmup=(0.05, 120.0),
        null_differs=True,
        noise={"wander_sd": 0.0},
    ),  # fmt: skip
    Cond(
        "candidate warm-up +10 % tau 300 s, no wander",
        warmup=(0.10, 300.0),
        null_differs=True,
        noise={"wander_sd": 0.0},
    ),  # fmt: skip
    # issue 30: a host bias that wanders faster and further than the tester's prior (0.3 %
    # over an hour), no shared per-second load jitter (less noise: decisions come sooner,
    # the wander weighs more), and hosts that start cold with a slow warm-up
    Cond("extra slow wander 0.5 % (17 min)", noise={"wander_sd": 0.005, "wander_tau_s": 1000.0}),
    Cond("extra slow wander 1 % (17 min)", noise={"wander_sd": 0.01, "wander_tau_s": 1000.0}),
    Cond(
        "extra slow wander 0.5 % (17 min), wander calibrated",
        noise={"wander_sd": 0.005, "wander_tau_s": 1000.0},
        wander_cal=True,
    ),  # fmt: skip
    Cond(
        "extra slow wander 1 % (17 min), wander calibrated",
        noise={"wander_sd": 0.01, "wander_tau_s": 1000.0},
        wander_cal=True,
    ),  # fmt: skip
    Cond("shipped model, wander calibrated", wander_cal=True),
    # issue 30 item 2: the warm-up transient fitted jointly over the applies (rule option
    # transient = "fit") instead of discarded per apply (the default)
    Cond("shipped model, transient fit", options=(("transient", "fit"),)),
    Cond(
        "candidate warm-up +5 % tau 120 s, transient fit",
        warmup=(0.05, 120.0),
        null_differs=True,
        options=(("transient", "fit"),),
    ),  # fmt: skip
    Cond(
        "candidate warm-up +10 % tau 300 s, transient fit",
        warmup=(0.10, 300.0),
        null_differs=True,
        options=(("transient", "fit"),),
    ),  # fmt: skip
    Cond(
        "extra slow wander 1 % (17 min), wander calibrated, transient fit",
        noise={"wander_sd": 0.01, "wander_tau_s": 1000.0},
        wander_cal=True,
        options=(("transient", "fit"),),
    ),  # fmt: skip
    Cond("no shared load jitter", load={"jitter_sigma": 0.0}),
    Cond(
        "cold start, slow warm-up 15 %/300 s",
        warm={"start": "cold", "amplitude": 0.15, "tau_s": 300.0},
    ),  # fmt: skip
    Cond("AR phi 0.9", noise={"ar_phi": 0.9}),
    Cond("wander sd 1 %", noise={"wander_sd": 0.01}),
    Cond("Student-t(3) innovations", noise={"innovation_df": 3.0}),
    Cond("host load correlation 0.5", load={"host_correlation": 0.5}),
    Cond("host load correlation 0.9", load={"host_correlation": 0.9}),
]

PAIRING = [0.0, 0.5, 0.9, 0.99]


def pairing_conds() -> list[Cond]:
    out = []
    for c in PAIRING:
        for rule in ("cs", "welch"):
            out.append(Cond(f"corr {c:g} {rule}", load={"host_correlation": c}, rule=rule,
                            table="pairing"))  # fmt: skip
        out.append(Cond(f"corr {c:g} cs-nocuped", load={"host_correlation": c},
                        options=(("covariate", None),), table="cuped"))  # fmt: skip
    return out


@dataclass(frozen=True)
class Task:
    cond: int
    kind: str  # "null" | "power" | "calibration"
    seed: int


@dataclass(frozen=True)
class Outcome:
    task: Task
    decision: str
    estimate: float
    ci_low: float
    ci_high: float
    samples: int
    truth: float
    cpu_s: float
    early: bool = False  # decided before the first swap (the calibration's early path)
    host_h: float = math.nan  # host-clock hours
    expected_h: float = math.nan  # what the period cost model expected (musku.abtest.periods)
    period_s: float = math.nan  # the crossover period length used


_STATE: dict[str, Any] = {}


def _model(cond: Cond, power: bool) -> Any:
    from musku.sim import SimModel

    data = tomllib.loads(MODEL_FILE.read_text())
    knobs = data["knobs"]["prefetch"]
    knobs["throughput"]["l2hw_dcu"] = 1.0 / (1.0 + cond.effect) if power else 1.0
    if cond.warmup is not None:
        amp, tau = cond.warmup
        knobs["warmup"] = {"all_on": {"amplitude": amp, "tau_s": tau}}
    noise = data.setdefault("noise", {})
    noise.update(cond.noise)
    noise.setdefault("load", {}).update(cond.load)
    noise.setdefault("warmup", {}).update(cond.warm)
    return SimModel.from_dict(data, source=f"{MODEL_FILE.name}: {cond.name}")


def _init(conds: list[Cond], period: str = "swap") -> None:
    from musku.domain import ComparisonSpec, StatsSettings

    _STATE["conds"] = conds
    _STATE["models"] = {}
    _STATE["spec"] = ComparisonSpec(
        metric="mips",
        stats=StatsSettings(
            confidence=0.95, min_effect=0.005, warmup_s=60.0, sample_cap=30_000, period=period
        ),
    )


def _run(task: Task) -> Outcome:
    from musku.abtest import run_comparison
    from musku.abtest.calibrate import calibrate_pair
    from musku.abtest.calibration import PairMemory, decided_early, pair_identity
    from musku.sim import SimPair

    cond: Cond = _STATE["conds"][task.cond]
    power = task.kind == "power"
    key = (task.cond, power)
    if key not in _STATE["models"]:
        _STATE["models"][key] = _model(cond, power)
    model = _STATE["models"][key]
    assert model.reference_config is not None
    base = model.reference_config.with_("prefetch", "l2hw_dcu")
    cand = base.with_("prefetch", "all_on") if power or cond.null_differs else base
    pair = SimPair(model, seed=task.seed, host_bias=cond.host_bias, initial=(base, base))
    memory = PairMemory()
    t0 = time.process_time()
    if cond.calibrated or task.kind == "calibration":
        cal, cr = calibrate_pair(pair, base, _STATE["spec"], seed=task.seed)
        if task.kind == "calibration":
            nan = math.nan
            return Outcome(
                task, "calibration", cal.bias if cal else nan, cal.ci_low if cal else nan,
                cal.ci_high if cal else nan, cr.samples, pair.host_bias,
                time.process_time() - t0, host_h=cr.host_time_s / 3600,
            )  # fmt: skip
        _, hw = pair_identity(pair.describe())
        if cal is not None and cond.noise_scale != 1.0:
            cal = replace(cal, noise_lrv=cal.noise_lrv * cond.noise_scale)
        memory = PairMemory(calibration=cal, hardware=hw)
    options = dict(cond.options)
    if cond.wander_cal:
        _, hw = pair_identity(pair.describe())
        cal = replace(_wander_calibration(task.cond, model, base), hardware=hw)
        memory = PairMemory(calibration=cal, hardware=hw)
        options.update(early=False)
    if cond.noise_cal:
        lrv, df = _noise_calibration(task.cond, model, base)
        options.update(noise_lrv=lrv * cond.noise_scale, noise_df=df)
    h0 = pair.now()
    r = run_comparison(
        pair, base, cand, _STATE["spec"], seed=task.seed, rule=cond.rule,
        rule_options=options, memory=memory,
    )  # fmt: skip
    return Outcome(
        task,
        r.decision.value,
        r.estimate,
        r.ci_low,
        r.ci_high,
        r.samples,
        model.true_effect(base, cand, "mips"),
        time.process_time() - t0,
        early=decided_early(r.reason),
        host_h=(pair.now() - h0) / 3600,
        expected_h=r.expected_s / 3600 if r.expected_s is not None else math.nan,
        period_s=r.period_s if r.period_s is not None else math.nan,
    )


NOISE_CAL_SEED = 777_000


def _noise_calibration(cond: int, model: Any, base: Any) -> tuple[float, float]:
    """(lrv per window, df) one real ``calibrate_pair`` of the model measures (seeded apart
    from every run; once per condition and worker)."""
    from musku.abtest.calibrate import calibrate_pair
    from musku.sim import SimPair

    key = f"noise {cond}"
    if key not in _STATE:
        pair = SimPair(model, seed=NOISE_CAL_SEED, initial=(base, base))
        cal, _ = calibrate_pair(pair, base, _STATE["spec"], seed=NOISE_CAL_SEED)
        got = cal.noise_for("mips", 1.0) if cal is not None else None
        if got is None:
            raise RuntimeError("the noise calibration measured no noise")
        _STATE[key] = got
    lrv, df = _STATE[key]
    return float(lrv), float(df)


def _wander_calibration(cond: int, model: Any, base: Any) -> Any:
    """One real ``calibrate_pair`` of the model (seeded apart from every run; once per
    condition and worker): the calibration whose measured wander every run of a
    ``wander_cal`` row uses. Its hardware identity is rewritten per run (each run's pair has
    its own seed, which the simulator's identity includes)."""
    from musku.abtest.calibrate import calibrate_pair
    from musku.sim import SimPair

    key = f"wander {cond}"
    if key not in _STATE:
        pair = SimPair(model, seed=NOISE_CAL_SEED, initial=(base, base))
        cal, _ = calibrate_pair(pair, base, _STATE["spec"], seed=NOISE_CAL_SEED)
        if cal is None or cal.wander() is None:
            raise RuntimeError("the wander calibration measured no wander")
        print(
            f"  {_STATE['conds'][cond].name}: calibration measured wander sd "
            f"{cal.wander_sd * 100:.2f} %, tau {cal.wander_tau_s:.0f} s",
            file=sys.stderr,
            flush=True,
        )
        _STATE[key] = cal
    return _STATE[key]


ORACLE_SEGMENTS = 8  # steady A/A segments per condition
ORACLE_SEGMENT = 3000  # windows per segment (about a period of the warm-up rows)
ORACLE_BATCH = 100  # windows per batch mean


def oracle_samples(cond: Cond, effect: float = 0.01, power: float = 0.9) -> float:
    """The fixed-horizon oracle: samples per host a fixed-n paired test at 95 % needs for
    ``power`` at ``effect``, knowing the noise: ``(z_0.975 + z_power)^2 lrv / log(1 +
    effect)^2`` with ``lrv`` the long-run variance per window of the CUPED-adjusted log-ratio
    in steady state (batch means of 100 windows within 3,000-window segments of 8 seeded A/A
    pairs: the noise within a period, the host bias's slow wander removed as a crossover
    would). It never pays for warm-up, swaps or monitoring."""
    from scipy.special import ndtri

    from musku.sim import SimPair

    model = _model(cond, False)
    assert model.reference_config is not None
    base = model.reference_config.with_("prefetch", "l2hw_dcu")
    ds: list[Any] = []
    cs: list[Any] = []
    for k in range(ORACLE_SEGMENTS):
        pair = SimPair(model, seed=900_000 + k, host_bias=cond.host_bias, initial=(base, base))
        pair.arrays(1.0, 3600)  # past any start-up transient
        w = pair.arrays(1.0, ORACLE_SEGMENT)
        d = np.log(w.mips[:, 1] / w.mips[:, 0])
        c = np.log(w.offered_qps[:, 1] / w.offered_qps[:, 0])
        ds.append(d - d.mean())
        cs.append(c - c.mean())
    dc, cc = np.concatenate(ds), np.concatenate(cs)
    theta = float(cc @ dc) / float(cc @ cc) if float(cc @ cc) > 0 else 0.0
    nb = ORACLE_SEGMENT // ORACLE_BATCH
    bm = [
        (d - theta * c)[: nb * ORACLE_BATCH].reshape(nb, ORACLE_BATCH).mean(axis=1)
        for d, c in zip(ds, cs, strict=True)
    ]
    lrv = ORACLE_BATCH * float(np.mean([b.var(ddof=1) for b in bm]))
    z = float(ndtri(0.975)) + float(ndtri(power))
    return z * z * lrv / math.log1p(effect) ** 2


def clopper_pearson(k: int, n: int, conf: float = 0.95) -> tuple[float, float]:
    from scipy.stats import beta

    a = 1 - conf
    lo = 0.0 if k == 0 else float(beta.ppf(a / 2, k, n - k + 1))
    hi = 1.0 if k == n else float(beta.ppf(1 - a / 2, k + 1, n - k))
    return lo, hi


def _fp(runs: list[Outcome]) -> tuple[int, int, str]:
    k = sum(o.decision in ("better", "worse") for o in runs)
    n = len(runs)
    if not n:
        return 0, 0, "-"
    lo, hi = clopper_pearson(k, n)
    return k, n, f"{100 * k / n:5.1f} % [{100 * lo:.1f}, {100 * hi:.1f}]"


def _stats(runs: list[Outcome]) -> dict[str, Any]:
    runs = [o for o in runs if o.task.kind != "calibration"]
    null = [o for o in runs if o.task.kind == "null"]
    pw = [o for o in runs if o.task.kind == "power"]
    k, n, fp = _fp(null)
    # the right sign: better for a gain, worse for a loss (the -0.5 % row)
    good = sum(o.decision == ("worse" if o.truth < 0 else "better") for o in pw)
    plo, phi = clopper_pearson(good, len(pw)) if pw else (float("nan"), float("nan"))
    cov_runs = [o for o in runs if o.decision != "aborted"]
    cov = sum(o.ci_low <= o.truth <= o.ci_high for o in cov_runs)
    return {
        "null_n": n,
        "fp_k": k,
        "fp": fp,
        "power_n": len(pw),
        "power": good / len(pw) if pw else float("nan"),
        "power_ci": f"[{100 * plo:.1f}, {100 * phi:.1f}]",
        "cov_n": len(cov_runs),
        "coverage": cov / len(cov_runs) if cov_runs else float("nan"),
        "median": statistics.median(o.samples for o in pw) if pw else float("nan"),
        "null_median": statistics.median(o.samples for o in null) if null else float("nan"),
        "null_host_h": statistics.median(o.host_h for o in null) if null else float("nan"),
        "cpu": statistics.median(o.cpu_s for o in runs) if runs else float("nan"),
    }


def report(conds: list[Cond], outs: list[Outcome], oracle_on: bool = True) -> bool:
    by: dict[int, list[Outcome]] = {}
    for o in outs:
        by.setdefault(o.task.cond, []).append(o)
    ok = True
    print("\n| condition | null runs | false positives [CP 95 %] | +1 % runs "
          "| power, sign right [CP 95 %] | coverage | median samples (+1 %) "
          "| oracle (fixed n, 90 %) | median samples (null) | targets | median host h (null) |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for i, c in enumerate(conds):
        if c.table != "main" or i not in by:
            continue
        s = _stats(by[i])
        checks = [
            s["fp_k"] <= 0.05 * s["null_n"],
            s["power"] >= 0.90 or abs(c.effect) < 0.01,  # a +-0.5 % row: the table below
            s["coverage"] >= 0.94,
        ]
        ok &= all(checks)
        flag = "PASS" if all(checks) else "FAIL (" + ", ".join(
            w for w, g in zip(("FP", "power", "coverage"), checks, strict=True) if not g) + ")"  # fmt: skip
        oracle = oracle_samples(c) if oracle_on else float("nan")
        print(
            f"| {c.name} | {s['null_n']} | {s['fp']} | {s['power_n']} | "
            f"{100 * s['power']:.1f} % {s['power_ci']} | {100 * s['coverage']:.1f} % "
            f"({s['cov_n']}) | {s['median']:,.0f} | {oracle:,.0f} | {s['null_median']:,.0f} "
            f"| {flag} | {s['null_host_h']:.2f} |"
        )
    _host_time_table(conds, by)
    eq_rows = [(i, c) for i, c in enumerate(conds) if abs(c.effect) < 0.01 and i in by]
    if eq_rows:
        print("\nNO_DIFFERENCE at a true effect of +-min_effect (0.5 %; target <= alpha = 5 %):")
        print("| condition | runs | no_difference [CP 95 %] | better | worse | median samples |")
        print("|---|---|---|---|---|---|")
        for i, c in eq_rows:
            pw = [o for o in by[i] if o.task.kind == "power"]
            k = sum(o.decision == "no_difference" for o in pw)
            lo, hi = clopper_pearson(k, len(pw)) if pw else (math.nan, math.nan)
            med = statistics.median(o.samples for o in pw) if pw else math.nan
            good = sum(o.decision == "better" for o in pw)
            bad = sum(o.decision == "worse" for o in pw)
            ok &= k <= 0.05 * len(pw)
            print(f"| {c.name} | {len(pw)} | {100 * k / max(1, len(pw)):.1f} % "
                  f"[{100 * lo:.1f}, {100 * hi:.1f}] | {good} | {bad} | {med:,.0f} |")  # fmt: skip
    early_rows = [(i, c) for i, c in enumerate(conds) if c.calibrated and i in by]
    if early_rows:
        print("\nThe early path (a real calibration first; decided before the first swap):")
        print("| condition | true effect | runs | decided early | early wrong sign / A/A "
              "early decisions | early coverage | median samples early | median samples "
              "crossover |")  # fmt: skip
        print("|---|---|---|---|---|---|---|---|")
        for i, c in early_rows:
            for kind, eff in (("power", c.effect), ("null", 0.0)):
                rs = [o for o in by[i] if o.task.kind == kind]
                ea = [o for o in rs if o.early]
                la = [o for o in rs if not o.early]
                # an early decision is better or worse: wrong when worse for a true gain,
                # and every one of an A/A
                wrong = sum(o.decision == "worse" or kind == "null" for o in ea)
                cov = sum(o.ci_low <= o.truth <= o.ci_high for o in ea)
                med_e = statistics.median(o.samples for o in ea) if ea else float("nan")
                med_l = statistics.median(o.samples for o in la) if la else float("nan")
                print(
                    f"| {c.name} | {eff * 100:+.0f} % | {len(rs)} | {len(ea)} | {wrong} | "
                    f"{cov}/{len(ea)} | {med_e:,.0f} | {med_l:,.0f} |"
                )
    cal_rows = [(i, c) for i, c in enumerate(conds) if i in by]
    cal_rows = [(i, c) for i, c in cal_rows if any(o.task.kind == "calibration" for o in by[i])]
    if cal_rows:
        print("\n`musku pair calibrate` (real calibrations): its interval against the true bias:")
        print("| condition | calibrations | coverage [CP 95 %] | median half-width "
              "| median samples | median host h | targets |")  # fmt: skip
        print("|---|---|---|---|---|---|---|")
        for i, c in cal_rows:
            rs = [o for o in by[i] if o.task.kind == "calibration" and math.isfinite(o.estimate)]
            k = sum(o.ci_low <= o.truth <= o.ci_high for o in rs)
            lo, hi = clopper_pearson(k, len(rs)) if rs else (math.nan, math.nan)
            ok &= k >= 0.94 * len(rs)
            hw = statistics.median((o.ci_high - o.ci_low) / 2 for o in rs) if rs else math.nan
            print(
                f"| {c.name} | {len(rs)} | {100 * k / max(1, len(rs)):.1f} % [{100 * lo:.1f}, "
                f"{100 * hi:.1f}] | ±{100 * hw:.2f} % | "
                f"{statistics.median(o.samples for o in rs) if rs else math.nan:,.0f} | "
                f"{statistics.median(o.host_h for o in rs) if rs else math.nan:.2f} | "
                f"{'PASS' if k >= 0.94 * len(rs) else 'FAIL (coverage)'} |"
            )
    pairing = {c.name: by.get(i, []) for i, c in enumerate(conds) if c.table != "main"}
    if any(pairing.values()):
        print("\nPaired (musku cs) vs paper-style unpaired Welch, same runs, +1 % effect:")
        print("| host load correlation | cs median samples | cs A/A FP | welch median samples "
              "| welch A/A FP | welch / cs samples | cs without CUPED median | CUPED gain |")  # fmt: skip
        print("|---|---|---|---|---|---|---|---|")
        for rho in PAIRING:
            cs = _stats(pairing.get(f"corr {rho:g} cs", []))
            w = _stats(pairing.get(f"corr {rho:g} welch", []))
            nc = _stats(pairing.get(f"corr {rho:g} cs-nocuped", []))
            print(
                f"| {rho:g} | {cs['median']:,.0f} | {cs['fp']} | {w['median']:,.0f} | {w['fp']} | "
                f"{w['median'] / cs['median']:.2f} | {nc['median']:,.0f} | "
                f"{nc['median'] / cs['median']:.2f}x |"
            )
    return ok


def _host_time_table(conds: list[Cond], by: dict[int, list[Outcome]]) -> None:
    """Host time per comparison: measured (median host-clock hours) next to what the period
    cost model expected for the period used (:mod:`musku.abtest.periods`), and the period."""

    def med(xs: list[float]) -> float:
        xs = [x for x in xs if math.isfinite(x)]
        return statistics.median(xs) if xs else math.nan

    print("\nHost time per comparison (median; expected: the period cost model's, for effects "
          "of twice min_effect):")  # fmt: skip
    print("| condition | period s (null) | host h null | expected h null "
          "| period s (+1 %) | host h +1 % | expected h +1 % |")  # fmt: skip
    print("|---|---|---|---|---|---|---|")
    for i, c in enumerate(conds):
        if c.table != "main" or i not in by:
            continue
        cols: list[str] = []
        for kind in ("null", "power"):
            rs = [o for o in by[i] if o.task.kind == kind]
            cols += [
                f"{med([o.period_s for o in rs]):,.0f}",
                f"{med([o.host_h for o in rs]):.2f}",
                f"{med([o.expected_h for o in rs]):.2f}",
            ]
        print(f"| {c.name} | " + " | ".join(cols) + " |")


def _save(path: Path, conds: list[Cond], outs: list[Outcome]) -> None:
    """Append the outcomes as JSON lines keyed by condition name (``--load`` reads them)."""
    with path.open("a") as f:
        for o in outs:
            row = asdict(o)
            row["cond_name"] = conds[o.task.cond].name
            f.write(json.dumps(row) + "\n")


def _load(paths: list[Path], conds: list[Cond]) -> list[Outcome]:
    index = {c.name: i for i, c in enumerate(conds)}
    outs: list[Outcome] = []
    seen: set[tuple[str, str, int]] = set()
    for path in paths:
        for line in path.read_text().splitlines():
            row = json.loads(line)
            name = row.pop("cond_name")
            task = row.pop("task")
            key = (name, task["kind"], task["seed"])
            if name not in index or key in seen:  # a run saved twice counts once
                continue
            seen.add(key)
            outs.append(Outcome(Task(index[name], task["kind"], task["seed"]), **row))
    return outs


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=300, help="null runs per condition (300)")
    ap.add_argument("--power-runs", type=int, default=None, help="+1 %% runs (runs / 3)")
    ap.add_argument("--pairing-runs", type=int, default=40, help="runs per pairing-table cell")
    ap.add_argument(
        "--calibration-runs", type=int, default=0,
        help="pair calibrations per selected row, coverage of the true bias (0)",
    )  # fmt: skip
    ap.add_argument("--quick", action="store_true", help="smoke test: few runs, few rows")
    ap.add_argument(
        "--only", action="append", default=[],
        help="run only conditions whose name has this text (repeat for several)",
    )  # fmt: skip
    ap.add_argument(
        "--skip", action="append", default=[],
        help="leave out conditions whose name has this text (repeat for several)",
    )  # fmt: skip
    ap.add_argument(
        "--jobs", "--workers", dest="jobs", type=int, default=1,
        help="worker processes (default 1: the machine is shared)",
    )  # fmt: skip
    ap.add_argument("--seed", type=int, default=1000, help="first seed")
    ap.add_argument(
        "--period", choices=("swap", "auto"), default="swap",
        help="[statistics] period: swap (3x the swap cost, default) or auto (cost model)",
    )  # fmt: skip
    ap.add_argument(
        "--rule-option", action="append", default=[], metavar="KEY=VALUE",
        help="a cs rule option for every cs row (e.g. equivalence=sprt; repeat for several)",
    )  # fmt: skip
    ap.add_argument(
        "--save", type=Path,
        help="append every run's outcome to this JSON-lines file (runs it holds are skipped)",
    )  # fmt: skip
    ap.add_argument(
        "--load", type=Path, nargs="+",
        help="no runs: print the tables from outcomes saved with --save (runs merged)",
    )  # fmt: skip
    args = ap.parse_args(argv)
    if args.runs < 1 or args.jobs < 1 or args.pairing_runs < 0:
        ap.error("--runs and --jobs must be >= 1, --pairing-runs >= 0")
    conds = CONDITIONS + pairing_conds()
    extra: list[tuple[str, Any]] = []
    for item in args.rule_option:
        key, eq, val = item.partition("=")
        if not eq or not key:
            ap.error(f"--rule-option {item!r}: expected KEY=VALUE")
        try:
            extra.append((key, json.loads(val)))
        except json.JSONDecodeError:
            extra.append((key, val))  # a bare string
    if extra:
        conds = [replace(c, options=c.options + tuple(extra)) if c.rule == "cs" else c
                 for c in conds]  # fmt: skip
    if args.load:
        missing = [str(p) for p in args.load if not p.is_file()]
        if missing:
            ap.error(f"no such file: {missing[0]}")
        saved = _load(args.load, conds)
        print(f"{len(saved)} saved comparisons from {len(args.load)} file(s)")
        return 0 if report(conds, saved) else 1
    runs, power_runs, pruns = args.runs, args.power_runs, args.pairing_runs
    if args.quick:
        quick = (
            "shipped model (web-skylake18)",
            "shipped model, noise calibrated 1.5x high",
            "host bias 1 %, uncalibrated",
        )
        conds = [c for c in CONDITIONS if c.name in quick]
        runs, power_runs, pruns = min(runs, 6), 3, 0
    if args.only:
        conds = [c for c in conds if any(text in c.name for text in args.only)]
    if args.skip:
        conds = [c for c in conds if not any(text in c.name for text in args.skip)]
    if power_runs is None:
        power_runs = max(1, runs // 3)
    tasks: list[tuple[int, Task]] = []  # (round, task)
    calibrated_models: set[str] = set()  # calibration runs once per distinct pair model
    for i, c in enumerate(conds):
        if c.table == "main":
            tasks += [
                (3 * j, Task(i, "null", args.seed + j)) for j in range(0 if c.power_only else runs)
            ]
            tasks += [(9 * j, Task(i, "power", args.seed + 100_000 + j)) for j in range(power_runs)]
            model_key = json.dumps([c.noise, c.load, c.warm, c.host_bias], sort_keys=True)
            if model_key in calibrated_models:
                continue
            calibrated_models.add(model_key)
            tasks += [
                (9 * j, Task(i, "calibration", args.seed + 200_000 + j))
                for j in range(0 if args.quick else args.calibration_runs)
            ]
        else:
            tasks += [(j, Task(i, "power", args.seed + 100_000 + j)) for j in range(pruns)]
            if c.rule == "welch" or c.options == ():
                tasks += [(j, Task(i, "null", args.seed + j)) for j in range(pruns)]
    # round-robin over the conditions (null runs three to a power run), so that a run cut
    # short (or read back from --save) has every row with comparable counts
    tasks.sort(key=lambda rt: rt[0])
    order = [t for _, t in tasks]
    if args.save is not None and args.save.is_file():
        # resume: what the file already holds is not run again
        have = {
            (conds[o.task.cond].name, o.task.kind, o.task.seed) for o in _load([args.save], conds)
        }
        order = [t for t in order if (conds[t.cond].name, t.kind, t.seed) not in have]
    workers = args.jobs
    print(f"{len(order)} comparisons on {workers} worker(s)...", flush=True)
    t0 = time.perf_counter()
    outs: list[Outcome] = []

    def done(o: Outcome) -> None:
        outs.append(o)
        if args.save is not None:
            _save(args.save, conds, [o])
        if len(outs) % 200 == 0:
            print(f"  {len(outs)} done, {time.perf_counter() - t0:.0f} s", flush=True)

    if workers == 1:
        _init(conds, args.period)
        for t in order:
            done(_run(t))
    else:
        with mp.get_context("fork").Pool(workers, _init, (conds, args.period)) as pool:
            for o in pool.imap_unordered(_run, order, chunksize=2):
                done(o)
    wall = time.perf_counter() - t0
    ok = report(conds, outs)
    cpu = statistics.median(o.cpu_s for o in outs) if outs else 0.0
    print(f"\nwall time {wall:.0f} s on {workers} worker(s); median CPU {cpu:.2f} s per comparison")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
