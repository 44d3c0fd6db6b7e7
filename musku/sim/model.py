"""Simulator model files: how a service's metrics respond to soft-SKU knobs, and the noise.

The schema is documented in docs/sim.md. A model is parsed and validated once
(:meth:`SimModel.load` / :meth:`SimModel.from_dict`); every problem is an
:class:`~musku.errors.InputError` naming the file and, where it can, the line.

The response is multiplicative: the throughput (relative MIPS, 1.0 at the reference) of a
configuration is the product of one multiplier per knob setting, times the multiplier of every
interaction whose conditions all hold. Interactions are how composition is made sub-additive
(two knobs relieving the same bottleneck do not stack their gains).
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from musku.cotune_spec import MODELS
from musku.domain import Configuration, Direction, Value, canonical_value, format_value
from musku.errors import InputError, UnsupportedError
from musku.experiment import load_platform
from musku.knob_spec import Kind, is_knob, known_list, spec_of
from musku.schema.document import Document, line_of
from musku.schema.simmodel import KnobTable, SimModelFile, WarmupEntry
from musku.schema.simmodel import Noise as NoiseTable
from musku.schema.simmodel import ThreadingTable as ThreadingTableFile

METRICS: dict[str, Direction] = {
    "mips": Direction.HIGHER,
    "qps": Direction.HIGHER,
    "p99_ms": Direction.LOWER,
    "qos_violation_rate": Direction.LOWER,
    "power_w": Direction.LOWER,
    "offered_qps": Direction.HIGHER,
}
"""Metrics a simulated host reports, with the direction in which each is better."""


@dataclass(frozen=True)
class LoadModel:
    """The live-load signal common to both hosts (relative load, 1.0 = average)."""

    diurnal_amplitude: float = 0.15  # +- fraction of the mean
    diurnal_period_s: float = 86_400.0
    jitter_sigma: float = 0.005  # white noise per tick, common to both hosts
    burst_rate_per_h: float = 1.0  # Poisson rate of load bursts
    burst_amplitude: float = 0.08  # mean burst height (fraction of the mean load)
    burst_duration_s: float = 300.0  # exponential decay time constant of a burst
    # partly shared load: the per-tick jitter of host h is
    # jitter_sigma * (sqrt(c) z_common + sqrt(1 - c) z_h), c = host_correlation
    host_correlation: float = 1.0  # correlation of the two hosts' per-tick load jitter
    sensitivity_spread: float = 0.0  # host slopes on the load: 1 - spread/2 and 1 + spread/2
    share_sigma: float = 0.0  # stationary sd of each host's own routing-share wobble
    share_tau_s: float = 600.0  # its AR(1) time constant


@dataclass(frozen=True)
class NoiseModel:
    """Per-host noise, host bias, outliers and the warm-up transient."""

    tick_s: float = 1.0  # AR(1) time step
    host_bias: float = 0.003  # hosts[1] is this much faster than hosts[0] (relative)
    ar_phi: float = 0.6  # AR(1) coefficient per tick
    ar_sigma: float = 0.02  # stationary std of the per-tick log-noise of one host
    outlier_prob: float = 0.001  # per window per host
    outlier_scale: float = 0.3  # outlier log-deviation is +-scale*U(0.5, 1.5)
    p99_sigma: float = 0.03  # extra per-window log-noise of p99
    power_sigma: float = 0.005  # per-window log-noise of power
    p99_load_gain: float = 0.5  # p99 *= 1 + gain * (load - 1)
    power_load_gain: float = 0.3  # power *= 1 + gain * (load - 1)
    warmup_amplitude: float = 0.05  # relative throughput loss right after a change
    warmup_tau_s: float = 40.0  # its exponential decay time constant
    start_warm: bool = False  # hosts start warm (True) or cold, warming up from t = 0
    innovation_df: float = 0.0  # Student-t df of the AR(1) innovations (0: Gaussian)
    wander_sd: float = 0.0  # stationary sd of a slow per-host log-throughput wander
    wander_tau_s: float = 3600.0  # its AR(1) time constant (long: a slow drift)
    load: LoadModel = field(default_factory=LoadModel)

    @property
    def shared_load(self) -> bool:
        """Whether the load is identical on both hosts (the original model)."""
        ld = self.load
        return ld.host_correlation >= 1.0 and ld.sensitivity_spread == 0 and ld.share_sigma == 0


@dataclass(frozen=True)
class Warmup:
    """An extra warm-up transient: relative loss ``amplitude`` decaying with ``tau_s``."""

    amplitude: float
    tau_s: float


@dataclass(frozen=True)
class Timing:
    apply_s: float = 2.0  # host seconds to apply a change that needs no reboot
    reboot_s: float = 180.0  # extra host seconds when a reboot knob changes


@dataclass(frozen=True)
class Interaction:
    """Extra throughput multiplier applied when every condition holds."""

    when: Mapping[str, tuple[bool, frozenset[Value]]]  # knob -> (negated, values)
    throughput: float
    p99: float
    why: str = ""
    warmup: Warmup | None = None  # extra transient when a change makes this hold

    def holds(self, settings: Mapping[str, Value]) -> bool:
        for knob, (negated, values) in self.when.items():
            if knob not in settings:
                return False
            inside = settings[knob] in values
            if inside == negated:
                return False
        return True


@dataclass(frozen=True)
class ThreadingRule:
    """Where the best threading model differs: ``best`` when every condition holds."""

    when: Mapping[str, tuple[bool, frozenset[Value]]]
    best: str
    why: str = ""

    def holds(self, settings: Mapping[str, Value]) -> bool:
        return Interaction(self.when, 1.0, 1.0).holds(settings)


@dataclass(frozen=True)
class ThreadingResponse:
    """The model's ``[threading]``: the best threading model per configuration, and the cost
    of running another one. The reference figures are measured with the best model."""

    initial: str  # what the hosts' mid-tiers run until co-tuned (pools p1 w2 r1 or so)
    best: str  # the best model where no rule applies
    mismatch: float  # relative throughput lost on a model that is not the best
    mismatch_p99: float  # relative p99 added then
    rules: tuple[ThreadingRule, ...] = ()

    def best_for(self, settings: Mapping[str, Value]) -> str:
        for rule in self.rules:
            if rule.holds(settings):
                return rule.best
        return self.best

    def signature(self) -> str:
        """Short hash of what decides the best threading (tables trained from another
        ``[threading]`` must not be reused: the simulator keys its tables by it)."""
        rules = [
            {
                "when": {
                    k: [neg, sorted(map(str, vals))] for k, (neg, vals) in sorted(r.when.items())
                },
                "best": r.best,
            }
            for r in self.rules
        ]
        text = json.dumps([self.best, rules], sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()[:8]


@dataclass(frozen=True)
class KnobResponse:
    throughput: Mapping[Value, float]
    p99: Mapping[Value, float]
    qos: Mapping[Value, float]
    power: Mapping[Value, float]
    warmup: Mapping[Value, Warmup] = field(default_factory=dict)
    # the live mechanism ([knobs.<knob>.live]; None: the model does not model one): the
    # multiplier on the setting's throughput while set live, and a live change's transient
    live_throughput: float | None = None
    live_warmup: Warmup | None = None

    @property
    def settings(self) -> tuple[Value, ...]:
        return tuple(self.throughput)


@dataclass(frozen=True)
class Point:
    """Noiseless response of one configuration (relative to the reference where noted)."""

    throughput: float  # relative MIPS
    p99: float  # relative p99
    qos: float  # absolute QoS-violation rate
    power: float  # relative power


_Source = Document  # the setting helper below takes the document it reports against


def _table_error(src: Document, message: str, table: str) -> InputError:
    """An error pointing at ``[table]`` or, when only its sub-tables exist, the first of them
    (or at ``key = ...`` inside the parent table when ``table`` is ``parent.key``)."""
    for header in (table, f"{table}.throughput", f"{table}.p99", f"{table}.qos", f"{table}.power"):
        line = line_of(src.text, header) if src.text else None
        if line:
            return InputError(message, where=f"{src.path}:{line}")
    parent, _, key = table.rpartition(".")
    return src.error(message, key, parent) if parent else src.error(message)


def _entry_error(src: Document, header: str, i: int) -> Any:
    """The error maker of entry ``i`` of an array of tables: ``[[header]] #i+1: ...`` at its
    header's line."""
    loc: tuple[str | int, ...] = (*header.split("."), i)

    def err(msg: str) -> InputError:  # the line is looked up only for an error
        line = src.positions.line(loc) if src.text else None
        return InputError(f"[[{header}]] #{i + 1}: {msg}", where=src.where(line))

    return err


def _conditions(
    src: Document, when_raw: object, knobs: Mapping[str, KnobResponse], ierr: Any
) -> dict[str, tuple[bool, frozenset[Value]]]:
    """``when = { knob = value | [values] | "!value" }`` of an interaction or a threading rule."""
    if not isinstance(when_raw, dict) or not when_raw:
        raise ierr("needs when = { knob = value, ... } with at least one condition")
    when: dict[str, tuple[bool, frozenset[Value]]] = {}
    for knob, cond in when_raw.items():
        if knob not in knobs:
            raise ierr(f"condition on knob '{knob}' that the model does not have")
        negated = isinstance(cond, str) and cond.startswith("!")
        items = cond if isinstance(cond, list) else [cond[1:] if negated else cond]
        if not items:
            raise ierr(f"empty condition list for '{knob}'")
        vals: set[Value] = set()
        for raw in items:
            try:
                cond_value = _setting(src, knob, raw, "when", "interactions")
            except InputError:
                raise ierr(f"{raw!r} is not a valid {knob} setting") from None
            if cond_value not in knobs[knob].throughput:
                raise ierr(f"{knob} = {raw!r} is not modelled in [knobs.{knob}]")
            vals.add(cond_value)
        when[knob] = (negated, frozenset(vals))
    return when


def _threading_section(
    src: Document, tbl: ThreadingTableFile | None, knobs: Mapping[str, KnobResponse]
) -> ThreadingResponse | None:
    """The optional ``[threading]`` table: which threading model serves best where, and what
    running another one costs (docs/threading.md, "Co-tuning")."""
    if tbl is None:
        return None
    mismatch = tbl.mismatch
    p99 = 1.0 / (1.0 - mismatch) - 1.0 if tbl.mismatch_p99 is None else tbl.mismatch_p99
    if not 0.0 <= p99 < 10.0:
        raise src.error("[threading] mismatch_p99 must be in [0, 10)", "mismatch_p99",
                        "threading")  # fmt: skip
    rules: list[ThreadingRule] = []
    for i, item in enumerate(tbl.rules):
        rerr = _entry_error(src, "threading.rules", i)
        when = _conditions(src, item.when, knobs, rerr)
        if item.best not in MODELS:
            raise rerr(f"best = {item.best!r} is not a threading model")
        rules.append(ThreadingRule(when, str(item.best), item.why))
    return ThreadingResponse(tbl.initial, tbl.best, mismatch, p99, tuple(rules))


def _setting(src: _Source, knob: str, raw: object, key: str, table: str) -> Value:
    """A setting given as a TOML key (always text) or a value, in canonical form."""
    candidates: list[object] = [raw]
    if isinstance(raw, str) and spec_of(knob).kind is Kind.COUNT:
        candidates = [int(raw)] if re.fullmatch(r"-?\d+", raw.strip()) else []
    for cand in candidates:
        try:
            return canonical_value(knob, cand)
        except (TypeError, ValueError):
            pass
    raise src.error(f"[{table}] {raw!r} is not a valid {knob} setting", key, table)


class SimModel:
    """A parsed, validated simulator model. Build with :meth:`load` or :meth:`from_dict`."""

    def __init__(
        self,
        *,
        name: str,
        description: str,
        source: str,
        reference: Mapping[str, float],
        reference_config: Configuration | None,
        knobs: Mapping[str, KnobResponse],
        interactions: tuple[Interaction, ...],
        noise: NoiseModel,
        timing: Timing,
        platform: str | None = None,
        threading: ThreadingResponse | None = None,
    ) -> None:
        self.name = name
        self.description = description
        self.source = source
        self.reference = dict(reference)
        self.reference_config = reference_config
        self.knobs = dict(knobs)
        self.interactions = interactions
        self.noise = noise
        self.timing = timing
        self.platform = platform
        self.threading = threading
        self._cache: dict[Configuration, Point] = {}

    def __repr__(self) -> str:
        return f"SimModel({self.name!r}, source={self.source!r})"

    # ----------------------------------------------------------------- construction

    @classmethod
    def load(
        cls, path: str | Path, *, space: Mapping[str, Iterable[Value]] | None = None
    ) -> SimModel:
        """Parse and validate a model file. With ``space`` (an experiment's knob -> settings),
        every modelled knob and setting must be in it, and every setting in it modelled."""
        return cls._parse(Document.read(path), space)

    @classmethod
    def from_dict(
        cls,
        data: Mapping[str, Any],
        source: str = "<dict>",
        *,
        space: Mapping[str, Iterable[Value]] | None = None,
    ) -> SimModel:
        """The same schema as a model file, from a dict (errors name ``source``)."""
        if not isinstance(data, Mapping):
            raise InputError("a sim model must be a table/dict", where=source)
        return cls._parse(Document.of(data, source), space)

    @classmethod
    def _parse(cls, src: Document, space: Mapping[str, Iterable[Value]] | None) -> SimModel:
        """The file validated by :class:`~musku.schema.simmodel.SimModelFile`, then its
        settings checked against the knobs, the platform's catalog and ``space``."""
        f = src.validate(SimModelFile)
        platform_name = f.model.platform
        catalog: Mapping[str, tuple[Value, ...]] | None = None
        if platform_name is not None:
            try:
                catalog = load_platform(platform_name).settings
            except InputError as exc:
                raise src.error(exc.message, "platform", "model") from None
        allowed_space = None if space is None else {k: set(v) for k, v in space.items()}
        ref = f.reference
        reference = {
            "mips": ref.mips,
            "qps": ref.qps,
            "p99_ms": ref.p99_ms,
            "power_w": ref.power_w,
            "qos_violation_rate": ref.qos_violation_rate,
        }
        knobs = {
            knob: _knob_response(src, knob, spec, catalog, platform_name, allowed_space)
            for knob, spec in f.knobs.items()
        }
        reference_config = _reference_config(src, ref.config, knobs)
        interactions: list[Interaction] = []
        for i, item in enumerate(f.interactions):
            when = _conditions(src, item.when, knobs, _entry_error(src, "interactions", i))
            p99 = 1.0 / item.throughput if item.p99 is None else item.p99
            warm = None if item.warmup is None else Warmup(item.warmup.amplitude, item.warmup.tau_s)
            interactions.append(Interaction(when, item.throughput, p99, item.why, warm))
        model = cls(
            name=src.path.stem if f.model.name is None else f.model.name,
            description=f.model.description,
            source=str(src.path),
            reference=reference,
            reference_config=reference_config,
            knobs=knobs,
            interactions=tuple(interactions),
            noise=_noise(f.noise),
            timing=Timing(apply_s=f.timing.apply_s, reboot_s=f.timing.reboot_s),
            platform=platform_name,
            threading=_threading_section(src, f.threading, knobs),
        )
        if reference_config is not None:
            tp = model.throughput(reference_config)
            if abs(tp - 1.0) > 1e-9:
                raise src.error(
                    f"[reference.config] throughput there must be 1.0, but interactions make it "
                    f"{tp:.6g}",
                    "config",
                    "reference",
                )
        return model

    # ----------------------------------------------------------------- the response

    def settings(self, knob: str) -> tuple[Value, ...]:
        """The settings modelled for ``knob`` (empty when the model ignores it)."""
        resp = self.knobs.get(knob)
        return resp.settings if resp else ()

    def check(self, config: Configuration) -> None:
        """Raise :class:`UnsupportedError` when ``config`` has a setting the model lacks."""
        for knob, value in config.settings:
            resp = self.knobs.get(knob)
            if resp is not None and value not in resp.throughput:
                choices = ", ".join(format_value(knob, v) for v in resp.settings)
                raise UnsupportedError(
                    f"sim model {self.name!r} has no setting {knob}={format_value(knob, value)} "
                    f"(modelled: {choices})",
                    where=self.source,
                )

    def point(self, config: Configuration, live: frozenset[str] = frozenset()) -> Point:
        """Noiseless response of ``config``; knobs it leaves out sit at the reference.
        ``live``: knobs the host runs with their live mechanism (away from the setting it
        booted with): their ``[knobs.<knob>.live] throughput`` multiplies the response."""
        if live:
            base = self.point(config)
            m = 1.0
            for knob in sorted(live):
                resp = self.knobs.get(knob)
                if resp is not None and resp.live_throughput is not None:
                    m *= resp.live_throughput
            return Point(base.throughput * m, base.p99 / m, base.qos, base.power)
        cached = self._cache.get(config)
        if cached is not None:
            return cached
        self.check(config)
        settings = dict(config.settings)
        if self.reference_config is not None:
            for knob, value in self.reference_config.settings:
                settings.setdefault(knob, value)
        tp = p99 = power = 1.0
        qos = self.reference["qos_violation_rate"]
        for knob, resp in self.knobs.items():
            setting = settings.get(knob)
            if setting is None:
                continue
            m = resp.throughput[setting]
            tp *= m
            p99 *= resp.p99.get(setting, 1.0 / m)
            power *= resp.power.get(setting, 1.0)
            qos = max(qos, resp.qos.get(setting, 0.0))
        for inter in self.interactions:
            if inter.holds(settings):
                tp *= inter.throughput
                p99 *= inter.p99
        result = Point(tp, p99, qos, power)
        if len(self._cache) < 65_536:
            self._cache[config] = result
        return result

    def warmups(
        self,
        old: Configuration,
        new: Configuration,
        live: frozenset[str] = frozenset(),
        also: frozenset[str] = frozenset(),
    ) -> list[Warmup]:
        """The transients a host goes through when it changes from ``old`` to ``new``: the
        default ``[noise.warmup]`` one, plus the extra one of every changed knob whose new
        setting has a ``[knobs.<knob>.warmup]`` entry, plus that of every interaction with a
        ``warmup`` that holds at ``new`` and whose knobs the change touched. Knobs in
        ``live`` changed by their live mechanism: their ``[knobs.<knob>.live] warmup``
        instead; knobs in ``also`` count as changed (a live setting now set by a reboot)."""
        n = self.noise
        out = [Warmup(n.warmup_amplitude, n.warmup_tau_s)] if n.warmup_amplitude > 0 else []
        a, b = self.full_settings(old), self.full_settings(new)
        changed = {k for k in set(a) | set(b) if a.get(k) != b.get(k)} | set(also)
        for knob in sorted(changed):
            resp = self.knobs.get(knob)
            if knob in live:  # a live change: its own transient, not the reboot's
                w = resp.live_warmup if resp is not None else None
            else:
                w = resp.warmup.get(b[knob]) if resp is not None and knob in b else None
            if w is not None and w.amplitude > 0:
                out.append(w)
        for inter in self.interactions:
            w = inter.warmup
            if w is not None and w.amplitude > 0 and changed & set(inter.when) and inter.holds(b):
                out.append(w)
        return out

    def full_settings(self, config: Configuration) -> dict[str, Value]:
        """``config`` with the knobs it leaves out at the reference configuration's values."""
        settings = dict(config.settings)
        if self.reference_config is not None:
            for knob, value in self.reference_config.settings:
                settings.setdefault(knob, value)
        return settings

    def best_threading(self, config: Configuration) -> str:
        """The threading model that serves ``config`` best ("" if the model has no
        ``[threading]``)."""
        if self.threading is None:
            return ""
        return self.threading.best_for(self.full_settings(config))

    def threading_factor(self, config: Configuration, running: str) -> tuple[float, float]:
        """(throughput, p99) multipliers of running model ``running`` at ``config``: 1 on the
        best model, the mismatch cost on any other."""
        t = self.threading
        if t is None or not running or running == self.best_threading(config):
            return 1.0, 1.0
        return 1.0 - t.mismatch, 1.0 + t.mismatch_p99

    def throughput(self, config: Configuration) -> float:
        """Noiseless relative MIPS (1.0 = the reference)."""
        return self.point(config).throughput

    def metric(self, config: Configuration, name: str) -> float:
        """Noiseless value of metric ``name`` (absolute units) at ``config``."""
        p = self.point(config)
        ref = self.reference
        if name == "mips":
            return ref["mips"] * p.throughput
        if name == "qps":
            return ref["qps"] * p.throughput
        if name == "p99_ms":
            return ref["p99_ms"] * p.p99
        if name == "qos_violation_rate":
            return p.qos
        if name == "power_w":
            return ref["power_w"] * p.power
        if name == "offered_qps":  # the load balancer's share: no knob changes it
            return ref["qps"]
        raise InputError(f"unknown metric {name!r} (sim metrics: {', '.join(METRICS)})")

    def true_effect(self, a: Configuration, b: Configuration, metric: str = "mips") -> float:
        """Relative effect of ``b`` over ``a`` in the metric's good direction: +0.045 = 4.5 %
        better (``b/a - 1`` when higher is better, ``1 - b/a`` when lower is)."""
        direction = METRICS.get(metric)
        if direction is None:
            raise InputError(f"unknown metric {metric!r} (sim metrics: {', '.join(METRICS)})")
        va, vb = self.metric(a, metric), self.metric(b, metric)
        if va == 0.0:
            return 0.0 if vb == 0.0 else (-math.inf if direction is Direction.LOWER else math.inf)
        ratio = vb / va
        return ratio - 1.0 if direction is Direction.HIGHER else 1.0 - ratio

    def best_setting(self, knob: str, base: Configuration, metric: str = "mips") -> Value:
        """The setting of ``knob`` with the largest true effect over ``base`` (ties: base's)."""
        settings = self.settings(knob)
        if not settings:
            raise InputError(f"sim model {self.name!r} does not model knob {knob!r}")
        current = base.get(knob)
        best: Value = current if current in settings and current is not None else settings[0]
        best_eff = self.true_effect(base, base.with_(knob, best), metric)
        for s in settings:
            eff = self.true_effect(base, base.with_(knob, s), metric)
            if eff > best_eff + 1e-12:
                best, best_eff = s, eff
        return best


def _noise(tbl: NoiseTable) -> NoiseModel:
    ld, warm = tbl.load, tbl.warmup
    return NoiseModel(
        **tbl.model_dump(exclude={"load", "warmup"}),
        warmup_amplitude=warm.amplitude,
        warmup_tau_s=warm.tau_s,
        start_warm=warm.start == "warm",
        load=LoadModel(**ld.model_dump()),
    )


def _knob_response(
    src: Document,
    knob: str,
    spec: KnobTable,
    catalog: Mapping[str, tuple[Value, ...]] | None,
    platform_name: str | None,
    allowed_space: Mapping[str, set[Value]] | None,
) -> KnobResponse:
    """``[knobs.<knob>]``: its settings in canonical form, in the platform's catalog and the
    experiment's space (the multipliers are checked by the schema)."""
    table = f"knobs.{knob}"
    if not is_knob(knob):
        raise _table_error(src, f"unknown knob '{knob}' (knobs: {known_list()})", table)
    if catalog is not None and knob not in catalog:
        raise _table_error(src, f"knob '{knob}' is not in platform '{platform_name}'", table)
    if allowed_space is not None and knob not in allowed_space:
        raise _table_error(
            src,
            f"knob '{knob}' is not in the experiment's space "
            f"({', '.join(allowed_space) or 'empty'})",
            table,
        )
    tables: dict[str, dict[Value, float]] = {}
    for part in ("throughput", "p99", "qos", "power"):
        sub = f"{table}.{part}"
        values: dict[Value, float] = {}
        for key, number in getattr(spec, part).items():
            setting = _setting(src, knob, key, key, sub)
            if setting in values:
                raise src.error(f"[{sub}] lists {key!r} twice", key, sub)
            if part == "throughput":
                if catalog is not None and setting not in catalog[knob]:
                    choices = ", ".join(format_value(knob, x) for x in catalog[knob])
                    raise src.error(
                        f"[{sub}] {knob} = {key!r} is not in platform "
                        f"'{platform_name}' ({choices})",
                        key,
                        sub,
                    )
                if allowed_space is not None and setting not in allowed_space[knob]:
                    choices = ", ".join(
                        format_value(knob, x) for x in sorted(allowed_space[knob], key=str)
                    )
                    raise src.error(
                        f"[{sub}] {knob} = {key!r} is not in the experiment's space ({choices})",
                        key,
                        sub,
                    )
            elif setting not in tables["throughput"]:
                raise src.error(
                    f"[{sub}] {key!r} has no throughput in [{table}.throughput]", key, sub
                )
            values[setting] = number
        tables[part] = values
    if allowed_space is not None:
        missing = [v for v in allowed_space[knob] if v not in tables["throughput"]]
        if missing:
            raise _table_error(
                src,
                f"[{table}.throughput] does not model the experiment's setting(s) "
                f"{', '.join(format_value(knob, v) for v in missing)}",
                table,
            )
    return KnobResponse(
        throughput=tables["throughput"],
        p99=tables["p99"],
        qos=tables["qos"],
        power=tables["power"],
        warmup=_knob_warmups(src, knob, spec.warmup, tables["throughput"]),
        live_throughput=None if spec.live is None else spec.live.throughput,
        live_warmup=(
            None
            if spec.live is None or spec.live.warmup is None
            else Warmup(spec.live.warmup.amplitude, spec.live.warmup.tau_s)
        ),
    )


def _knob_warmups(
    src: Document, knob: str, raw: Mapping[str, WarmupEntry], settings: Mapping[Value, float]
) -> dict[Value, Warmup]:
    """``[knobs.<knob>.warmup]``: setting = { amplitude, tau_s }, an extra transient on a host
    whose change puts the knob at that setting."""
    table = f"knobs.{knob}.warmup"
    out: dict[Value, Warmup] = {}
    for key, entry in raw.items():
        setting = _setting(src, knob, key, key, table)
        if setting not in settings:
            raise src.error(
                f"[{table}] {key!r} has no throughput in [knobs.{knob}.throughput]", key, table
            )
        out[setting] = Warmup(entry.amplitude, entry.tau_s)
    return out


def _reference_config(
    src: Document, raw: Mapping[str, Any] | None, knobs: Mapping[str, KnobResponse]
) -> Configuration | None:
    """``[reference.config]``: where every multiplier is 1.0."""
    if raw is None:
        return None
    cfg: dict[str, Value] = {}
    for knob, value_raw in raw.items():
        if not is_knob(knob):
            raise src.error(f"[reference.config] unknown knob '{knob}'", knob, "reference.config")
        value = _setting(src, knob, value_raw, knob, "reference.config")
        resp = knobs.get(knob)
        if resp is not None:
            if value not in resp.throughput:
                raise src.error(
                    f"[reference.config] {knob} = {value_raw!r} is not modelled in [knobs.{knob}]",
                    knob,
                    "reference.config",
                )
            if abs(resp.throughput[value] - 1.0) > 1e-9:
                raise src.error(
                    f"[reference.config] the reference setting {knob} = {value_raw!r} must have "
                    f"throughput 1.0 in [knobs.{knob}.throughput], not "
                    f"{resp.throughput[value]:g}",
                    knob,
                    "reference.config",
                )
        cfg[knob] = value
    return Configuration.of(cfg)


__all__ = [
    "METRICS",
    "SimModel",
    "NoiseModel",
    "LoadModel",
    "Timing",
    "Interaction",
    "Warmup",
    "ThreadingResponse",
    "ThreadingRule",
]
