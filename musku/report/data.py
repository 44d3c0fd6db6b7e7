"""What a report shows, read from the results DB: the experiment, its comparisons (with their
windows as arrays), its soft SKU. Bad input raises :class:`~musku.errors.InputError` (one line,
exit 3): an unknown experiment, an experiment with no finished comparison yet."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from musku.abtest import stats
from musku.abtest.calibration import calibrations_used
from musku.abtest.rules import WANDER_SD, WANDER_TAU_S, to_relative
from musku.domain import Configuration, Decision
from musku.errors import InputError
from musku.storage.lookup import FoundRun, find_run
from musku.storage.protocols import ResultStore, RunStore, SampleStore
from musku.storage.records import ComparisonRecord, ExperimentRecord, SoftSkuRecord

PAPER_HOST_HOURS = (5.0, 10.0)
"""Host time of one knob sweep in the SoftSKU paper (Sriraman et al., ISCA 2019): 5-10 h."""

PAPER_GAINS: Mapping[tuple[str, str], tuple[float, float]] = {
    # (service, platform) -> (soft SKU vs stock, vs production), the paper's Fig. 19
    ("web", "skylake18"): (0.062, 0.045),
    ("web", "broadwell16"): (0.072, 0.030),
    ("ads1", "skylake18"): (0.025, 0.025),
}

SERIES_COLUMNS = ("comparison_id", "seq", "host", "t", "role", "period", "warmup", "valid", "value")


@dataclass
class Series:
    """One comparison's windows, host by host: arrays indexed by window (``seq``), one row per
    host that measured it (``hosts``: their indices in the run's pool, ascending: a pair's two
    hosts, or the hosts of a multi-arm scan, each of which ran the baseline or the candidate in
    some periods)."""

    t: np.ndarray  # (n,) seconds, the first host's clock
    value: np.ndarray  # (H, n) primary metric per host (NaN: the host has no such window)
    role_b: np.ndarray  # (H, n) bool: the host ran B
    period: np.ndarray  # (n,)
    warmup: np.ndarray  # (n,) bool (any host)
    valid: np.ndarray  # (n,) bool (every host)
    hosts: tuple[int, ...] = (0, 1)

    @property
    def size(self) -> int:
        return int(self.t.size)

    @property
    def pair(self) -> bool:
        """Two hosts that measured every window: the crossover estimator applies."""
        return len(self.hosts) == 2

    def a_b(self) -> tuple[np.ndarray, np.ndarray]:
        """Per window, the value on the host that ran A and on the host that ran B (NaN where
        a window has no such host)."""
        has = np.isfinite(self.value)
        b_rows = self.role_b & has
        a_rows = ~self.role_b & has
        vb = np.where(b_rows, self.value, 0.0).sum(axis=0) / np.maximum(b_rows.sum(axis=0), 1)
        va = np.where(a_rows, self.value, 0.0).sum(axis=0) / np.maximum(a_rows.sum(axis=0), 1)
        vb[b_rows.sum(axis=0) == 0] = np.nan
        va[a_rows.sum(axis=0) == 0] = np.nan
        return va, vb

    def relative(self, direction: float) -> np.ndarray:
        """Per window, B over A relative (``direction`` -1: lower is better, so a drop is a
        gain), NaN where either is missing or not positive."""
        va, vb = self.a_b()
        with np.errstate(divide="ignore", invalid="ignore"):
            r = np.expm1(direction * np.log(vb / va))
        r[~np.isfinite(r)] = np.nan
        return r


@dataclass
class ReportData:
    experiment: ExperimentRecord
    meta: Mapping[str, Any]
    comparisons: list[ComparisonRecord]
    softskus: list[SoftSkuRecord]
    series: dict[int, Series] = field(default_factory=dict)
    run_note: str = ""  # which run a name resolved to (musku.storage.lookup)
    calibrations: list[Any] = field(default_factory=list)  # pair calibrations it used

    @property
    def resolved(self) -> Mapping[str, Any]:
        return self.meta.get("resolved") or {}

    @property
    def direction(self) -> float:
        return -1.0 if self.experiment.direction == "lower" else 1.0

    @property
    def baseline_config(self) -> Configuration:
        key = "stock" if self.experiment.baseline == "stock" else "production"
        return Configuration.of(self.resolved.get(key) or {})

    @property
    def space(self) -> dict[str, list[Any]]:
        return {k: list(v) for k, v in (self.resolved.get("space") or {}).items()}

    @property
    def statistics(self) -> Mapping[str, Any]:
        return self.resolved.get("statistics") or {}

    @property
    def sku(self) -> SoftSkuRecord | None:
        return self.softskus[-1] if self.softskus else None

    @property
    def host_time_s(self) -> float:
        return sum(c.result.host_time_s for c in self.comparisons if c.result is not None)

    def knob_comparisons(self, knob: str) -> list[ComparisonRecord]:
        """The knob's own comparisons against the baseline: purpose ``knob:<knob>``, or a
        multi-arm scan's rows (``multiarm:<knob>``, one per candidate arm)."""
        return [c for c in self.comparisons if c.purpose in (f"knob:{knob}", f"multiarm:{knob}")]

    def knob_steps(self, knob: str) -> list[ComparisonRecord]:
        """Run-offs and confirmations of the knob (purpose ``knob:<knob>:<step>``)."""
        return [c for c in self.comparisons if c.purpose.startswith(f"knob:{knob}:")]


def find(store: RunStore, ref: str, kind: str = "sweep") -> FoundRun:
    """The run ``ref`` means: the latest finished sweep of a name, or of ``kind``; an id
    (:func:`musku.storage.lookup.find_run`)."""
    return find_run(store, ref, kind)


def load(store: ResultStore, ref: str, *, kind: str = "sweep", series: bool = True) -> ReportData:
    """Everything the report of run ``ref`` (name or id, see :func:`find`) shows."""
    found = find(store, ref, kind)
    rec = found.record
    comps = store.comparisons(rec.id)
    if not any(c.result is not None and c.result.decision.final for c in comps):
        raise InputError(
            f"experiment {rec.name!r} (id {rec.id}) has no finished comparison yet: nothing to "
            "report (run or resume its sweep first)"
        )
    skus = [s for s in store.softskus() if s.experiment_id == rec.id]
    data = ReportData(rec, store.experiment_meta(rec.id), comps, skus, run_note=found.note)
    data.calibrations = calibrations_used(store, rec, comps)
    if series:
        data.series = load_series(store, rec.id, [c.id for c in comps if c.result is not None])
    return data


def load_series(
    store: SampleStore, exp_id: int, comparison_ids: Sequence[int]
) -> dict[int, Series]:
    """Every comparison's windows as :class:`Series`, streamed from the DB in batches."""
    if not comparison_ids:
        return {}
    wanted = set(comparison_ids)
    cols: dict[int, list[list[tuple[Any, ...]]]] = {}
    for batch in store.sample_batches(exp_id, columns=SERIES_COLUMNS):
        for row in batch:
            if row[0] in wanted:
                cols.setdefault(int(row[0]), []).append(row)  # type: ignore[arg-type]
    return {cid: _series(rows) for cid, rows in cols.items()}  # type: ignore[arg-type]


def _series(rows: list[tuple[Any, ...]]) -> Series:
    seqs = sorted({int(r[1]) for r in rows})
    hosts = tuple(sorted({int(r[2]) for r in rows}))
    index = {s: i for i, s in enumerate(seqs)}
    slot = {h: k for k, h in enumerate(hosts)}
    n, nh = len(seqs), len(hosts)
    t = np.full(n, np.nan)
    t_host = np.full(n, nh)  # the slot whose clock t holds: the first host's
    value = np.full((nh, n), np.nan)
    role_b = np.zeros((nh, n), dtype=bool)
    period = np.zeros(n, dtype=np.int64)
    warmup = np.zeros(n, dtype=bool)
    valid = np.ones(n, dtype=bool)
    for _, seq, host, tt, role, per, warm, ok, val in rows:
        i, h = index[int(seq)], slot[int(host)]
        if h < t_host[i] and tt is not None:
            t[i], t_host[i] = float(tt), h
        value[h, i] = np.nan if val is None else float(val)
        role_b[h, i] = role == "B"
        period[i] = int(per)
        warmup[i] |= bool(warm)
        valid[i] &= bool(ok)
    if np.isnan(t).any():  # a window with no time: its sequence number keeps the order
        t = np.where(np.isnan(t), np.arange(n, dtype=float), t)
    return Series(t, value, role_b, period, warmup, valid, hosts)


def running_interval(
    s: Series, direction: float, confidence: float
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray] | None:
    """The effect of B over A and its confidence sequence, recomputed after each batch of the
    stored windows with the tester's estimator (crossover batch means, host bias removed once
    both role orders are seen) and boundary: (t, estimate, low, high), relative. The live
    tester chose its batch size from a pilot, so its looks need not line up exactly."""
    if not s.pair:  # a multi-arm scan's per-period means: no pairwise crossover to recompute
        return None
    keep = s.valid & ~s.warmup & np.all(np.isfinite(s.value), axis=0) & np.all(s.value > 0, axis=0)
    if keep.sum() < 12:
        return None
    v0, v1 = s.value[0, keep], s.value[1, keep]
    b_on_1 = s.role_b[1, keep]
    # sign-adjusted log-ratio B/A per window; sign +1 when host 0 ran A
    d = direction * np.where(b_on_1, np.log(v1 / v0), np.log(v0 / v1))
    sign = np.where(b_on_1, 1.0, -1.0)
    per, tt = s.period[keep], s.t[keep]
    # each period's time span, as the tester's: its between-period (wander) variance component
    # widens the interval when the periods are long against the wander's time scale
    step = float(np.median(np.diff(tt))) if tt.size > 1 else 0.0
    spans = np.full((int(per.max()) + 1, 2), np.nan)
    for p in np.unique(per):
        at = tt[per == p]
        spans[int(p)] = float(at.min()) - step, float(at.max())
    wander = stats.Wander(WANDER_SD, WANDER_TAU_S)
    rho = max(0.0, stats.ar1_coefficient(d - d.mean()))
    b = stats.choose_batch_size(rho, target=0.1, maximum=max(5, d.size // 12))
    out_t, est, lo, hi = [], [], [], []
    ys: list[float] = []
    ss: list[float] = []
    ps: list[int] = []
    i = 0
    while i + b <= d.size:
        sl = slice(i, i + b)
        if np.unique(per[sl]).size == 1:  # batches stay within a period, as the tester's
            ys.append(float(d[sl].mean()))
            ss.append(float(sign[i]))
            ps.append(int(per[i]))
            i += b
        else:
            i = int(np.flatnonzero(per[i:] != per[i])[0]) + i
            continue
        y, sg, pp = np.array(ys), np.array(ss), np.array(ps)
        e = stats.crossover_estimate(y, sg, pp, spans=spans, wander=wander) or stats.plain_estimate(
            y, pp
        )
        if e is None:
            continue
        hw = stats.cs_halfwidth(e.se, e.n_eff, 1.0 - confidence, max(4.0, d.size / b / 2), df=e.df)
        out_t.append(float(tt[i - 1]))
        est.append(to_relative(e.mean, direction))
        lo.append(to_relative(e.mean - hw, direction))
        hi.append(to_relative(e.mean + hw, direction))
    if not out_t:
        return None
    return np.array(out_t), np.array(est), np.array(lo), np.array(hi)


def host_bias(s: Series) -> float | None:
    """Host 1 over host 0 on the same configuration, relative: half the sum of the two role
    orders' mean log-ratios (the effect cancels, the bias stays). None before both orders,
    and for a scan of more than two hosts."""
    if not s.pair:
        return None
    keep = s.valid & ~s.warmup & np.all(np.isfinite(s.value), axis=0) & np.all(s.value > 0, axis=0)
    r = np.log(s.value[1, keep] / s.value[0, keep])
    b1 = s.role_b[1, keep]
    if b1.sum() < 2 or (~b1).sum() < 2:
        return None
    return float(np.expm1(0.5 * (r[b1].mean() + r[~b1].mean())))


def decided(c: ComparisonRecord) -> bool:
    return c.result is not None and c.result.decision is not Decision.ABORTED
