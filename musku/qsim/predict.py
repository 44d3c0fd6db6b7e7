"""``musku qsim predict EXPERIMENT``: a queueing model predicts each knob setting's effect on
capacity and latency at the experiment's load, beside what a sweep measured (docs/qsim.md,
"Predicting a sweep: `musku qsim predict`").

For every knob the experiment sweeps and every setting of its space, the model is changed as
the ``qsim`` backend changes it (:func:`musku.qsim.hosts.knob_document`: ``core_freq`` sets the
services' frequency, each stage scaling by its ``dvfs_scale``, the share of its time that is
not memory-bound; ``core_count`` the cores a machine keeps for services; ``uncore_freq`` only
with an ``uncore_scale`` given), and run at the experiment's load under ``seeds`` seeds. The
baseline configuration (the one the sweep scales each knob against) runs under the same seeds,
so each effect is the mean over seeds of the per-seed ratio setting / baseline, minus one, with
its Student-t interval over the seeds (common random numbers: the ratio's spread is far below
either figure's own).

Capacity is utilisation-based: the completed rate over the bottleneck's utilisation (the
busiest service's thread utilisation, or the mean utilisation of the cores a service is placed
on, whichever is higher). Exact for a work-conserving queue whose service time does not depend
on the load (M/M/c: lambda / (lambda / c mu) = c mu); below the truth where batching makes
work per request fall with load (an epoll stage's batches grow).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from musku.domain import Configuration, Value
from musku.errors import InputError, UnsupportedError
from musku.knob_spec import by_resource, spec_of
from musku.qsim.engine import Limits, simulate
from musku.qsim.hosts import knob_document
from musku.qsim.model import QsimModel, normalise, parse, read_model
from musku.qsim.overrides import with_overrides
from musku.schema.tomlpos import Positions

NOT_EXPRESSIBLE = "not expressible in the model"

FIGURES = ("capacity_qps", "p50_us", "p99_us", "mean_us")
"""What each run predicts (capacity: completed rate over the bottleneck's utilisation)."""

METRIC_FIGURE: Mapping[str, str] = {
    "p99_ms": "p99_us",
    "p50_ms": "p50_us",
    "mean_ms": "mean_us",
    "qps": "capacity_qps",
}
"""An experiment's primary metric -> the predicted figure it is compared with (``qps``: the
capacity; a metric not listed is not predicted, and a sweep ordered by prediction then orders
by capacity)."""

ProgressFn = Callable[[int, int], None]


@dataclass(frozen=True)
class Setup:
    """What a prediction runs: the model and the load, and where each came from."""

    model_path: Path
    source: str  # "--model", "[predict] model" or "[hosts] model"
    qps: float | None  # None: the model's own client
    seeds: tuple[int, ...]
    duration_s: float
    uncore_scale: float | None
    uncore_stock: float | None


def setup(experiment: Any, model: Path | None = None) -> Setup:
    """The model and load ``experiment`` is predicted with: ``model`` (``--model``), else its
    ``[predict] model``, else the ``qsim`` backend's ``[hosts] model``; the load is ``[predict]
    qps``, else the ``qsim`` backend's ``qps``, else the model's client. Without a model:
    InputError (exit 3)."""
    pred = experiment.predict
    opts: Mapping[str, Any] = experiment.hosts.options if experiment.hosts.backend == "qsim" else {}
    where = str(experiment.path)
    if model is not None:
        path, source = Path(model), "--model"
    elif pred is not None and pred.model:
        path, source = experiment.resolve(pred.model), "[predict] model"
    elif isinstance(opts.get("model"), str) and opts["model"]:
        path, source = experiment.resolve(opts["model"]), "[hosts] model"
    else:
        raise InputError(
            f"experiment {experiment.name!r} names no queueing model to predict with: give "
            '--model M.toml or [predict] model = "M.toml" (docs/qsim.md "Predicting a sweep")',
            where=where,
        )
    qps = pred.qps if pred is not None and pred.qps is not None else None
    if qps is None and isinstance(opts.get("qps"), int | float) and opts["qps"] > 0:
        qps = float(opts["qps"])
    scale = pred.uncore_scale if pred is not None else None
    if scale is None and isinstance(opts.get("uncore_scale"), int | float):
        scale = float(opts["uncore_scale"])  # the backend's, when its file gives one
    stock = by_resource(experiment.stock.as_dict()).get("uncore_ghz")
    n = pred.seeds if pred is not None else 3
    base_seed = int(experiment.stats.seed)
    return Setup(
        model_path=path,
        source=source,
        qps=qps,
        seeds=tuple(base_seed * 1000 + i + 1 for i in range(n)),
        duration_s=pred.duration_s if pred is not None else 1.0,
        uncore_scale=scale,
        uncore_stock=float(stock) if isinstance(stock, int | float) else None,
    )


def expressible(knob: str, s: Setup) -> bool:
    """Whether the model can express ``knob``: core frequency and core count always; uncore
    frequency with an ``uncore_scale`` and a stock uncore frequency; nothing else (prefetch,
    CDP, THP, SHP, sysfs knobs: the model format has no term for them)."""
    resource = spec_of(knob).resource
    if resource in ("core_ghz", "cores"):
        return True
    return resource == "uncore_ghz" and s.uncore_scale is not None and bool(s.uncore_stock)


@dataclass(frozen=True)
class Run:
    """One engine run's figures."""

    figures: Mapping[str, float]
    saturated: bool
    stop_reason: str
    throughput_qps: float
    offered_qps: float


@dataclass(frozen=True)
class Effect:
    """A relative effect, setting over baseline (+0.1: 10 % more), with its interval."""

    value: float
    lo: float
    hi: float

    def to_dict(self) -> dict[str, float]:
        return {"value": self.value, "lo": self.lo, "hi": self.hi}


@dataclass(frozen=True)
class Measured:
    """What the sweep measured for one setting: its comparison against the baseline."""

    run_id: int
    comparison_id: int
    metric: str
    estimate: float  # relative, in the metric's good direction
    ci_low: float
    ci_high: float
    decision: str

    def to_dict(self) -> dict[str, Any]:
        return {
            "run_id": self.run_id,
            "comparison_id": self.comparison_id,
            "metric": self.metric,
            "estimate": self.estimate,
            "ci_low": self.ci_low,
            "ci_high": self.ci_high,
            "decision": self.decision,
        }


@dataclass(frozen=True)
class Row:
    """One knob setting's prediction (and measurement, when there is one)."""

    knob: str
    setting: Value
    baseline: bool  # the baseline's own setting
    note: str = ""  # NOT_EXPRESSIBLE, or why there is no figure
    saturated: bool = False
    means: Mapping[str, float] = field(default_factory=dict)  # figure -> mean over seeds
    intervals: Mapping[str, tuple[float, float]] = field(default_factory=dict)
    effects: Mapping[str, Effect] = field(default_factory=dict)  # figure -> vs baseline
    gain: Effect | None = None  # the primary metric's effect, good direction positive
    measured: Measured | None = None
    agreement: str = ""  # "sign and size", "sign", "no", or "" (nothing to compare)

    @property
    def predicted(self) -> bool:
        return not self.note

    def to_dict(self) -> dict[str, Any]:
        return {
            "knob": self.knob,
            "setting": self.setting,
            "baseline": self.baseline,
            "note": self.note,
            "saturated": self.saturated,
            "figures": {
                k: {
                    "mean": v,
                    "lo": self.intervals.get(k, (None, None))[0],
                    "hi": self.intervals.get(k, (None, None))[1],
                }
                for k, v in self.means.items()
            },  # fmt: skip
            "effects": {k: e.to_dict() for k, e in self.effects.items()},
            "gain": self.gain.to_dict() if self.gain is not None else None,
            "measured": self.measured.to_dict() if self.measured is not None else None,
            "agreement": self.agreement,
        }


@dataclass(frozen=True)
class Prediction:
    experiment: str
    model: str
    source: str
    qps: float  # the offered load the runs had
    seeds: tuple[int, ...]
    duration_s: float
    metric: str
    figure: str | None  # the predicted figure the metric is compared with
    direction: int  # +1 higher is better, -1 lower
    baseline: Configuration
    base: Mapping[str, float]
    base_intervals: Mapping[str, tuple[float, float]]
    rows: tuple[Row, ...]
    sweep_note: str = ""  # which sweep the measured column comes from, or why there is none

    @property
    def saturated(self) -> list[Row]:
        return [r for r in self.rows if r.saturated]

    def to_dict(self) -> dict[str, Any]:
        return {
            "experiment": self.experiment,
            "model": self.model,
            "model_from": self.source,
            "qps": self.qps,
            "seeds": list(self.seeds),
            "duration_s": self.duration_s,
            "metric": self.metric,
            "predicted_figure": self.figure,
            "direction": "higher" if self.direction > 0 else "lower",
            "baseline": self.baseline.as_dict(),
            "baseline_figures": {
                k: {"mean": v, "lo": self.base_intervals[k][0], "hi": self.base_intervals[k][1]}
                for k, v in self.base.items()
            },
            "sweep": self.sweep_note,
            "rows": [r.to_dict() for r in self.rows],
        }


# --------------------------------------------------------------------------- the runs


def utilisation(result: Mapping[str, Any], doc: Mapping[str, Any]) -> float:
    """The bottleneck's utilisation: the highest of each service's thread utilisation and the
    mean utilisation of the cores its instances are placed on."""
    util = {(c["machine"], int(c["core"])): float(c["util"]) for c in result.get("cores", [])}
    names = [m["name"] for m in doc["machines"]]
    rho = max((float(s["thread_util"]) for s in result["services"].values()), default=0.0)
    for svc in doc["services"]:
        placed = {
            (names[inst["machine"]], int(core))
            for inst in svc.get("instances", [])
            for core in inst.get("cores", [])
        }
        got = [util[c] for c in placed if c in util]
        if got:
            rho = max(rho, sum(got) / len(got))
    return rho


def run_once(doc: dict[str, Any], limits: Limits | None = None) -> Run:
    """One engine run of a document; its figures (capacity utilisation-based)."""
    r = simulate(doc, limits=limits)
    lat = r["latency"]
    thr = float(r["throughput_qps"])
    rho = utilisation(r, doc)
    cap = thr / rho if rho > 0 else math.inf
    return Run(
        figures={
            "capacity_qps": cap,
            "p50_us": float(lat["p50_us"]),
            "p99_us": float(lat["p99_us"]),
            "mean_us": float(lat["mean_us"]),
        },
        saturated=bool(r["saturated"]),
        stop_reason=str(r.get("stop_reason", "")),
        throughput_qps=thr,
        offered_qps=float(r.get("offered_qps", thr)),
    )


_T975 = (12.7062, 4.3027, 3.1824, 2.7764, 2.5706, 2.4469, 2.3646, 2.3060, 2.2622, 2.2281,
         2.2010, 2.1788, 2.1604, 2.1448, 2.1314, 2.1199, 2.1098, 2.1009, 2.0930, 2.0860,
         2.0796, 2.0739, 2.0687, 2.0639, 2.0595, 2.0555, 2.0518, 2.0484, 2.0452, 2.0423)  # fmt: skip
"""Student-t 97.5 % quantiles for 1..30 degrees of freedom (no scipy: ~1 CPU-s to import)."""


def t975(df: int) -> float:
    """Student-t 97.5 % quantile: the table, then the Cornish-Fisher expansion (within 1e-4
    beyond 30 degrees of freedom)."""
    if df <= len(_T975):
        return _T975[df - 1]
    z = 1.959964
    return z + (z**3 + z) / (4 * df) + (5 * z**5 + 16 * z**3 + 3 * z) / (96 * df**2)


def mean_interval(xs: Sequence[float]) -> tuple[float, float, float]:
    """Mean and its 95 % Student-t interval (at least two values)."""
    n = len(xs)
    m = sum(xs) / n
    sd = math.sqrt(sum((x - m) ** 2 for x in xs) / (n - 1)) if n > 1 else math.inf
    h = t975(n - 1) * sd / math.sqrt(n) if n > 1 else math.inf
    return m, m - h, m + h


class Model:
    """A model file, read once, and its documents under configurations."""

    def __init__(self, s: Setup) -> None:
        self.setup = s
        self.model: QsimModel
        self.pos: Positions
        self.model, self.pos = parse(read_model(s.model_path), s.model_path)
        normalise(self.model, self.pos, s.model_path)  # errors now, with file:line

    def document(self, cfg: Configuration, seed: int) -> dict[str, Any]:
        s = self.setup
        doc = knob_document(
            self.model, self.pos, s.model_path, by_resource(cfg.as_dict()),
            uncore_scale=s.uncore_scale or 0.0, uncore_stock=s.uncore_stock,
        )  # fmt: skip
        return with_overrides(doc, qps=s.qps, duration_s=s.duration_s, seed=seed)


def predict(
    experiment: Any,
    *,
    model: Path | None = None,
    knobs: Iterable[str] | None = None,
    limits: Limits | None = None,
    on_progress: ProgressFn | None = None,
) -> Prediction:
    """Every setting of every knob the experiment sweeps (or ``knobs``), predicted against the
    experiment's baseline configuration. The baseline saturated: InputError (exit 3); no knob
    the model can express: UnsupportedError (exit 4)."""
    s = setup(experiment, model)
    m = Model(s)
    base_cfg: Configuration = experiment.baseline_config
    metric = experiment.spec.metric
    direction = 1 if experiment.spec.direction.value == "higher" else -1
    figure = METRIC_FIGURE.get(metric)
    names = list(experiment.service.knobs) if knobs is None else list(knobs)
    if not any(expressible(k, s) for k in names):
        raise UnsupportedError(
            f"the model can express none of the knobs {', '.join(names)} sweeps (core_freq and "
            "core_count always, uncore_freq with [predict] uncore_scale): nothing to predict",
            where=str(experiment.path),
        )
    todo = [
        (k, v) for k in names if expressible(k, s) for v in experiment.space[k] if v != base_cfg[k]
    ]
    total, done = (len(todo) + 1) * len(s.seeds), 0

    def runs(cfg: Configuration) -> list[Run]:
        nonlocal done
        out = []
        for seed in s.seeds:
            out.append(run_once(m.document(cfg, seed), limits))
            done += 1
            if on_progress is not None:
                on_progress(done, total)
        return out

    base_runs = runs(base_cfg)
    sat = [r for r in base_runs if r.saturated]
    if sat:
        raise InputError(
            f"the model saturates at the experiment's load under the baseline configuration "
            f"({base_runs[0].offered_qps:,.0f} req/s offered, {sat[0].throughput_qps:,.0f} "
            f"completed: {sat[0].stop_reason}): nothing to predict against; lower [predict] qps",
            where=str(s.model_path),
        )
    base_means, base_iv = _summary(base_runs)
    rows: list[Row] = []
    for knob in names:
        for value in experiment.space[knob]:
            if value == base_cfg[knob]:
                rows.append(Row(knob, value, True, means=base_means, intervals=base_iv))
                continue
            if not expressible(knob, s):
                rows.append(Row(knob, value, False, note=NOT_EXPRESSIBLE))
                continue
            got = runs(base_cfg.with_(knob, value))
            rows.append(_row(knob, value, got, base_runs, figure, direction))
    return Prediction(
        experiment=experiment.name,
        model=str(s.model_path),
        source=s.source,
        qps=base_runs[0].offered_qps,
        seeds=s.seeds,
        duration_s=s.duration_s,
        metric=metric,
        figure=figure,
        direction=direction,
        baseline=base_cfg,
        base=base_means,
        base_intervals=base_iv,
        rows=tuple(rows),
    )


def _summary(runs: Sequence[Run]) -> tuple[dict[str, float], dict[str, tuple[float, float]]]:
    means, iv = {}, {}
    for f in FIGURES:
        mu, lo, hi = mean_interval([r.figures[f] for r in runs])
        means[f], iv[f] = mu, (lo, hi)
    return means, iv


def _row(
    knob: str,
    value: Value,
    got: Sequence[Run],
    base: Sequence[Run],
    figure: str | None,
    direction: int,
) -> Row:
    means, iv = _summary(got)
    saturated = any(r.saturated for r in got)
    effects: dict[str, Effect] = {}
    for f in FIGURES:
        if saturated and f != "capacity_qps":
            continue  # a growing backlog's latency is not a prediction
        mu, lo, hi = mean_interval(
            [a.figures[f] / b.figures[f] for a, b in zip(got, base, strict=True)]
        )
        effects[f] = Effect(mu - 1, lo - 1, hi - 1)
    gain = None
    key = figure or "capacity_qps"
    if key in effects:
        e = effects[key]
        if direction > 0:
            gain = e
        else:  # lower is better: B better by A/B - 1
            gain = Effect(1 / (1 + e.value) - 1, 1 / (1 + e.hi) - 1, 1 / (1 + e.lo) - 1)
    elif saturated and direction < 0:
        gain = Effect(-math.inf, -math.inf, -math.inf)  # a latency that grows without bound
    return Row(
        knob,
        value,
        False,
        note="saturated" if saturated else "",
        saturated=saturated,
        means=means,
        intervals=iv,
        effects=effects,
        gain=gain,
    )


# --------------------------------------------------------------------------- beside a sweep


def agreement(gain: Effect, measured: Measured, min_effect: float) -> str:
    """Whether a predicted gain agrees with a measured one: ``sign and size`` (the same sign,
    and the two intervals overlap), ``sign`` (the same sign, the sizes apart, or one of them
    unbounded), ``no``. A sign is +, - or 0: 0 when the interval holds zero or lies within
    ``min_effect`` of it. A measurement without a bounded interval (a guardrail decision
    taken early) has its decision's sign: ``better`` +, ``worse`` and ``guardrail`` -, else 0;
    a saturated prediction's gain is -inf."""

    def sign(lo: float, hi: float) -> int:
        if lo > 0 and hi >= min_effect:
            return 1
        if hi < 0 and lo <= -min_effect:
            return -1
        return 0

    p = sign(gain.lo, gain.hi)
    bounded = math.isfinite(measured.ci_low) and math.isfinite(measured.ci_high)
    if bounded:
        q = sign(measured.ci_low, measured.ci_high)
    else:
        q = {"better": 1, "worse": -1, "guardrail": -1}.get(measured.decision, 0)
    if p != q:
        return "no"
    if not (bounded and math.isfinite(gain.lo) and math.isfinite(gain.hi)):
        return "sign"
    overlap = gain.lo <= measured.ci_high and measured.ci_low <= gain.hi
    return "sign and size" if overlap else "sign"


def beside(
    pred: Prediction, experiment: Any, store: Any, *, min_effect: float | None = None
) -> Prediction:
    """``pred`` with each row's measured effect from the latest sweep of the experiment in
    ``store`` (a comparison of the baseline against the baseline with that one setting
    changed), and whether the two agree."""
    from musku.storage.lookup import find_run  # lazy: SQLAlchemy only when a DB is read

    try:
        found = find_run(store, experiment.name, "sweep")
    except InputError as exc:
        return _with(pred, [], f"no sweep to compare with: {exc.message}")
    run_id = found.record.id
    base = pred.baseline
    measured: dict[tuple[str, object], Measured] = {}
    for rec in store.comparisons(run_id):
        res = rec.result
        if res is None or rec.baseline != base:
            continue
        changed = [k for k in rec.candidate if rec.candidate.get(k) != base.get(k)]
        if len(changed) != 1:
            continue
        k = changed[0]
        measured[(k, rec.candidate[k])] = Measured(
            run_id=run_id,
            comparison_id=rec.id,
            metric=pred.metric,
            estimate=float(res.estimate),
            ci_low=float(res.ci_low),
            ci_high=float(res.ci_high),
            decision=res.decision.value,
        )
    eff = min_effect if min_effect is not None else float(experiment.stats.min_effect)
    rows = []
    for r in pred.rows:
        got = measured.get((r.knob, r.setting))
        agree = ""
        if got is not None and r.gain is not None and pred.figure is not None:
            agree = agreement(r.gain, got, eff)
        rows.append(_replace(r, measured=got, agreement=agree))
    note = f"sweep {run_id} ({found.record.status.value}): {len(measured)} settings measured"
    return _with(pred, rows, note)


def _replace(r: Row, **kw: Any) -> Row:
    return replace(r, **kw)


def _with(pred: Prediction, rows: list[Row], note: str) -> Prediction:
    return replace(pred, rows=tuple(rows) if rows else pred.rows, sweep_note=note)


# --------------------------------------------------------------------------- a sweep's order


def gains(pred: Prediction) -> dict[str, dict[Value, float]]:
    """Per knob, each predicted setting's gain in the primary metric's good direction (the
    capacity's when the metric is not predicted); settings without a prediction are left
    out (:func:`order` puts them last)."""
    out: dict[str, dict[Value, float]] = {}
    for r in pred.rows:
        if r.gain is not None:
            out.setdefault(r.knob, {})[r.setting] = r.gain.value
    return out


def order(values: Sequence[object], gain: Mapping[Any, float]) -> list[object]:
    """``values`` by predicted gain, best first; those without one after, in their order."""
    known = [v for v in values if v in gain]
    rest = [v for v in values if v not in gain]
    return sorted(known, key=lambda v: -gain[v]) + rest


# --------------------------------------------------------------------------- tables

CSV_HEADER = [
    "knob", "setting", "baseline", "status",
    "capacity_qps", "capacity_effect", "capacity_lo", "capacity_hi",
    "p50_us", "p50_effect", "p50_lo", "p50_hi",
    "p99_us", "p99_effect", "p99_lo", "p99_hi",
    "gain", "gain_lo", "gain_hi",
    "measured", "measured_lo", "measured_hi", "decision", "agreement",
]  # fmt: skip
"""``--format csv``: one row per knob setting; effects relative (0.1 = +10 %); ``gain`` the
primary metric's predicted effect in its good direction, ``measured`` the sweep's."""


def status(r: Row) -> str:
    return "baseline" if r.baseline else (r.note or "predicted")


def _cell(x: Any) -> Any:
    """A CSV cell: a number that is not finite is left empty (as strict JSON's null)."""
    return "" if isinstance(x, float) and not math.isfinite(x) else x


def csv_rows(pred: Prediction) -> list[list[Any]]:
    out: list[list[Any]] = []
    for r in pred.rows:
        row: list[Any] = [r.knob, r.setting, r.baseline, status(r)]
        for f in ("capacity_qps", "p50_us", "p99_us"):
            e = r.effects.get(f)
            row.append(r.means.get(f, ""))
            row += [e.value, e.lo, e.hi] if e is not None else ["", "", ""]
        g = r.gain
        row += [g.value, g.lo, g.hi] if g is not None and math.isfinite(g.value) else ["", "", ""]
        m = r.measured
        row += [m.estimate, m.ci_low, m.ci_high, m.decision] if m is not None else ["", "", "", ""]
        row.append(r.agreement)
        out.append([_cell(x) for x in row])
    return out
