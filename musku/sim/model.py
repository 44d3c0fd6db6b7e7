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

import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from musku.domain import KNOBS, Configuration, Direction, Value, canonical_value, format_value
from musku.errors import InputError, UnsupportedError
from musku.experiment import _line_of, _Source, load_platform

METRICS: dict[str, Direction] = {
    "mips": Direction.HIGHER,
    "qps": Direction.HIGHER,
    "p99_ms": Direction.LOWER,
    "qos_violation_rate": Direction.LOWER,
    "power_w": Direction.LOWER,
    "offered_qps": Direction.HIGHER,
}
"""Metrics a simulated host reports, with the direction in which each is better."""

_TOP = {"model", "reference", "knobs", "interactions", "noise", "timing", "threading"}
_KNOB_KEYS = {"throughput", "p99", "qos", "power", "warmup", "description"}
_REF_KEYS = {"mips", "qps", "p99_ms", "power_w", "qos_violation_rate", "config"}


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
        import hashlib
        import json

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


def _table_error(src: _Source, message: str, table: str) -> InputError:
    """An error pointing at ``[table]`` or, when only its sub-tables exist, the first of them
    (or at ``key = ...`` inside the parent table when ``table`` is ``parent.key``)."""
    for header in (table, f"{table}.throughput", f"{table}.p99", f"{table}.qos", f"{table}.power"):
        line = _line_of(src.text, header) if src.text else None
        if line:
            return InputError(message, where=f"{src.path}:{line}")
    parent, _, key = table.rpartition(".")
    return src.error(message, key, parent) if parent else src.error(message)


class _DictSource(_Source):
    """A :class:`_Source` over a dict (no text, so errors name the source only)."""

    def __init__(self, data: Mapping[str, Any], name: str) -> None:
        self.path = Path(name)
        self.text = ""
        self.data = dict(data)


def _nth_header_line(text: str, header: str, n: int) -> int | None:
    count = 0
    for number, line in enumerate(text.splitlines(), start=1):
        if re.match(rf"^\[\[\s*{re.escape(header)}\s*\]\]", line.strip()):
            if count == n:
                return number
            count += 1
    return None


def _conditions(
    src: _Source, when_raw: object, knobs: Mapping[str, KnobResponse], ierr: Any
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


def _threading_section(src: _Source, knobs: Mapping[str, KnobResponse]) -> ThreadingResponse | None:
    """The optional ``[threading]`` table: which threading model serves best where, and what
    running another one costs (docs/threading.md, "Co-tuning")."""
    from musku.cotune_spec import MODELS

    if "threading" not in src.data:
        return None
    tbl = src.table("threading")
    allowed = {"initial", "best", "mismatch", "mismatch_p99", "rules"}
    for key in tbl:
        if key not in allowed:
            raise src.error(
                f"[threading] has unknown key '{key}' (allowed: {', '.join(sorted(allowed))})",
                key,
                "threading",
            )

    def model_name(value: object, key: str) -> str:
        if value not in MODELS:
            raise src.error(
                f"[threading] {key} = {value!r} is not a threading model ({', '.join(MODELS)})",
                key,
                "threading",
            )
        return str(value)

    initial = model_name(tbl.get("initial", "async-dispatch-block"), "initial")
    if "best" not in tbl:
        raise src.error("[threading] needs 'best' (the best model where no rule applies)",
                        "threading")  # fmt: skip
    best = model_name(tbl["best"], "best")
    mismatch = _number(src, tbl.get("mismatch", 0.0), "[threading] mismatch", "mismatch",
                       "threading")  # fmt: skip
    if not 0.0 <= mismatch < 0.9:
        raise src.error("[threading] mismatch must be in [0, 0.9)", "mismatch", "threading")
    p99 = _number(src, tbl.get("mismatch_p99", 1.0 / (1.0 - mismatch) - 1.0),
                  "[threading] mismatch_p99", "mismatch_p99", "threading")  # fmt: skip
    if not 0.0 <= p99 < 10.0:
        raise src.error("[threading] mismatch_p99 must be in [0, 10)", "mismatch_p99",
                        "threading")  # fmt: skip
    rules_raw = tbl.get("rules", [])
    if not isinstance(rules_raw, list):
        raise src.error("[threading] rules must be an array of tables [[threading.rules]]",
                        "rules", "threading")  # fmt: skip
    rules: list[ThreadingRule] = []
    for i, item in enumerate(rules_raw):
        line = _nth_header_line(src.text, "threading.rules", i)

        def rerr(msg: str, line: int | None = line, i: int = i) -> InputError:
            where = f"{src.path}:{line}" if line else str(src.path)
            return InputError(f"[[threading.rules]] #{i + 1}: {msg}", where=where)

        if not isinstance(item, dict):
            raise rerr("must be a table")
        for key in item:
            if key not in {"when", "best", "why"}:
                raise rerr(f"unknown key '{key}' (allowed: best, when, why)")
        when = _conditions(src, item.get("when"), knobs, rerr)
        if item.get("best") not in MODELS:
            raise rerr(f"best = {item.get('best')!r} is not a threading model")
        why = item.get("why", "")
        if not isinstance(why, str):
            raise rerr("why must be text")
        rules.append(ThreadingRule(when, str(item["best"]), why))
    return ThreadingResponse(initial, best, mismatch, p99, tuple(rules))


def _number(src: _Source, value: object, what: str, key: str, table: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise src.error(f"{what} must be a number, not {value!r}", key, table)
    v = float(value)
    if not math.isfinite(v):
        raise src.error(f"{what} must be finite, not {value!r}", key, table)
    return v


def _setting(src: _Source, knob: str, raw: object, key: str, table: str) -> Value:
    """A setting given as a TOML key (always text) or a value, in canonical form."""
    candidates: list[object] = [raw]
    if isinstance(raw, str) and knob in ("core_count", "shp"):
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
        src = _Source(Path(path))
        return cls._parse(src, space)

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
        return cls._parse(_DictSource(data, source), space)

    @classmethod
    def _parse(cls, src: _Source, space: Mapping[str, Iterable[Value]] | None) -> SimModel:
        data = src.data
        for key in data:
            if key not in _TOP:
                raise src.error(f"unknown table [{key}] (allowed: {', '.join(sorted(_TOP))})", key)

        # [model]
        meta = src.table("model", required=False)
        for key in meta:
            if key not in {"name", "description", "platform"}:
                raise src.error(
                    f"[model] has unknown key '{key}' (allowed: description, name, platform)",
                    key,
                    "model",
                )
        name = src.get("model", "name", str, src.path.stem)
        description = src.get("model", "description", str, "")
        platform_name = src.get("model", "platform", str, None)
        catalog: Mapping[str, tuple[Value, ...]] | None = None
        if platform_name is not None:
            try:
                catalog = load_platform(platform_name).settings
            except InputError as exc:
                raise src.error(exc.message, "platform", "model") from None
        allowed_space: dict[str, set[Value]] | None = None
        if space is not None:
            allowed_space = {k: set(v) for k, v in space.items()}

        # [reference]
        ref_tbl = src.table("reference")
        for key in ref_tbl:
            if key not in _REF_KEYS:
                raise src.error(
                    f"[reference] has unknown key '{key}' "
                    f"(allowed: {', '.join(sorted(_REF_KEYS))})",
                    key,
                    "reference",
                )
        reference: dict[str, float] = {}
        for metric, default in (
            ("mips", None),
            ("qps", None),
            ("p99_ms", None),
            ("power_w", None),
            ("qos_violation_rate", 0.0),
        ):
            if metric not in ref_tbl:
                if default is None:
                    raise src.error(f"[reference] needs '{metric}'", "reference")
                reference[metric] = default
                continue
            v = _number(src, ref_tbl[metric], f"[reference] {metric}", metric, "reference")
            if metric == "qos_violation_rate":
                if not 0.0 <= v < 1.0:
                    raise src.error(
                        "[reference] qos_violation_rate must be in [0, 1)", metric, "reference"
                    )
            elif v <= 0.0:
                raise src.error(f"[reference] {metric} must be > 0", metric, "reference")
            reference[metric] = v

        # [knobs.<knob>]
        knob_tbl = src.table("knobs")
        knobs: dict[str, KnobResponse] = {}
        for knob, spec in knob_tbl.items():
            table = f"knobs.{knob}"
            if knob not in KNOBS:
                raise _table_error(src, f"unknown knob '{knob}' (knobs: {', '.join(KNOBS)})", table)
            if catalog is not None and knob not in catalog:
                raise _table_error(
                    src, f"knob '{knob}' is not in platform '{platform_name}'", table
                )
            if allowed_space is not None and knob not in allowed_space:
                raise _table_error(
                    src,
                    f"knob '{knob}' is not in the experiment's space "
                    f"({', '.join(allowed_space) or 'empty'})",
                    table,
                )
            if not isinstance(spec, dict):
                raise src.error(f"[{table}] must be a table", knob, "knobs")
            for key in spec:
                if key not in _KNOB_KEYS:
                    raise _table_error(
                        src,
                        f"[{table}] has unknown key '{key}' "
                        f"(allowed: {', '.join(sorted(_KNOB_KEYS))})",
                        f"{table}.{key}",
                    )
            if not isinstance(spec.get("throughput"), dict) or not spec["throughput"]:
                raise _table_error(
                    src, f"[{table}] needs a non-empty [{table}.throughput] table", table
                )
            tables: dict[str, dict[Value, float]] = {}
            for part in ("throughput", "p99", "qos", "power"):
                raw = spec.get(part, {})
                sub = f"{table}.{part}"
                if not isinstance(raw, dict):
                    raise src.error(f"[{sub}] must be a table of setting = number", part, table)
                values: dict[Value, float] = {}
                for key, number in raw.items():
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
                                f"[{sub}] {knob} = {key!r} is not in the experiment's space "
                                f"({choices})",
                                key,
                                sub,
                            )
                    elif setting not in tables["throughput"]:
                        raise src.error(
                            f"[{sub}] {key!r} has no throughput in [{table}.throughput]", key, sub
                        )
                    v = _number(src, number, f"[{sub}] {key}", key, sub)
                    if part == "qos":
                        if not 0.0 <= v <= 1.0:
                            raise src.error(
                                f"[{sub}] {key}: a violation rate is in [0, 1]", key, sub
                            )
                    elif v <= 0.0:
                        raise src.error(f"[{sub}] {key}: a multiplier must be > 0", key, sub)
                    values[setting] = v
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
            knobs[knob] = KnobResponse(
                throughput=tables["throughput"],
                p99=tables["p99"],
                qos=tables["qos"],
                power=tables["power"],
                warmup=_knob_warmups(src, knob, spec.get("warmup", {}), tables["throughput"]),
            )

        # [reference.config]
        ref_cfg_raw = ref_tbl.get("config")
        reference_config: Configuration | None = None
        if ref_cfg_raw is not None:
            if not isinstance(ref_cfg_raw, dict):
                raise src.error("[reference.config] must be a table", "config", "reference")
            cfg: dict[str, Value] = {}
            for knob, raw in ref_cfg_raw.items():
                if knob not in KNOBS:
                    raise src.error(
                        f"[reference.config] unknown knob '{knob}'", knob, "reference.config"
                    )
                value = _setting(src, knob, raw, knob, "reference.config")
                resp = knobs.get(knob)
                if resp is not None:
                    if value not in resp.throughput:
                        raise src.error(
                            f"[reference.config] {knob} = {raw!r} is not modelled "
                            f"in [knobs.{knob}]",
                            knob,
                            "reference.config",
                        )
                    if abs(resp.throughput[value] - 1.0) > 1e-9:
                        raise src.error(
                            f"[reference.config] the reference setting {knob} = {raw!r} must have "
                            f"throughput 1.0 in [knobs.{knob}.throughput], not "
                            f"{resp.throughput[value]:g}",
                            knob,
                            "reference.config",
                        )
                cfg[knob] = value
            reference_config = Configuration.of(cfg)

        # [[interactions]]
        inter_raw = data.get("interactions", [])
        if not isinstance(inter_raw, list):
            raise src.error(
                "interactions must be an array of tables [[interactions]]", "interactions"
            )
        interactions: list[Interaction] = []
        for i, item in enumerate(inter_raw):
            line = _nth_header_line(src.text, "interactions", i)

            def ierr(msg: str, line: int | None = line, i: int = i) -> InputError:
                where = f"{src.path}:{line}" if line else str(src.path)
                return InputError(f"[[interactions]] #{i + 1}: {msg}", where=where)

            if not isinstance(item, dict):
                raise ierr("must be a table")
            for key in item:
                if key not in {"when", "throughput", "p99", "why", "warmup"}:
                    raise ierr(f"unknown key '{key}' (allowed: p99, throughput, warmup, when, why)")
            when = _conditions(src, item.get("when"), knobs, ierr)
            if "throughput" not in item:
                raise ierr("needs throughput = <multiplier>")
            mult = item["throughput"]
            if isinstance(mult, bool) or not isinstance(mult, int | float) or not mult > 0:
                raise ierr(f"throughput must be a number > 0, not {mult!r}")
            if not math.isfinite(float(mult)):
                raise ierr("throughput must be finite")
            p99 = item.get("p99", 1.0 / float(mult))
            if isinstance(p99, bool) or not isinstance(p99, int | float) or not p99 > 0:
                raise ierr(f"p99 must be a number > 0, not {p99!r}")
            why = item.get("why", "")
            if not isinstance(why, str):
                raise ierr("why must be text")
            warm: Warmup | None = None
            if "warmup" in item:
                try:
                    warm = _warmup_entry(src, item["warmup"], "warmup", "interactions")
                except InputError as exc:
                    raise ierr(exc.message) from None
            interactions.append(Interaction(when, float(mult), float(p99), why, warm))

        noise = cls._parse_noise(src)
        timing = cls._parse_timing(src)
        threading = _threading_section(src, knobs)
        model = cls(
            name=name,
            description=description,
            source=str(src.path),
            reference=reference,
            reference_config=reference_config,
            knobs=knobs,
            interactions=tuple(interactions),
            noise=noise,
            timing=timing,
            platform=platform_name,
            threading=threading,
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

    @staticmethod
    def _parse_noise(src: _Source) -> NoiseModel:
        tbl = src.table("noise", required=False)
        d = NoiseModel()
        fields_ = {
            "tick_s": (d.tick_s, lambda v: v > 0, "must be > 0"),
            "host_bias": (d.host_bias, lambda v: -0.5 < v < 0.5, "must be in (-0.5, 0.5)"),
            "ar_phi": (d.ar_phi, lambda v: 0 <= v < 1, "must be in [0, 1)"),
            "ar_sigma": (d.ar_sigma, lambda v: 0 <= v < 1, "must be in [0, 1)"),
            "outlier_prob": (d.outlier_prob, lambda v: 0 <= v <= 1, "must be in [0, 1]"),
            "outlier_scale": (d.outlier_scale, lambda v: 0 <= v < 3, "must be in [0, 3)"),
            "p99_sigma": (d.p99_sigma, lambda v: 0 <= v < 1, "must be in [0, 1)"),
            "power_sigma": (d.power_sigma, lambda v: 0 <= v < 1, "must be in [0, 1)"),
            "p99_load_gain": (d.p99_load_gain, lambda v: v >= 0, "must be >= 0"),
            "power_load_gain": (d.power_load_gain, lambda v: v >= 0, "must be >= 0"),
            "innovation_df": (
                d.innovation_df,
                lambda v: v == 0 or 2 < v <= 1000,
                "must be 0 (Gaussian) or in (2, 1000]",
            ),
            "wander_sd": (d.wander_sd, lambda v: 0 <= v < 0.5, "must be in [0, 0.5)"),
            "wander_tau_s": (d.wander_tau_s, lambda v: v > 0, "must be > 0"),
        }
        sub_load = tbl.get("load", {})
        sub_warm = tbl.get("warmup", {})
        for name, sub in (("load", sub_load), ("warmup", sub_warm)):
            if not isinstance(sub, dict):
                raise src.error(f"[noise.{name}] must be a table", name, "noise")
        values = _read_numbers(src, "noise", tbl, fields_, skip={"load", "warmup"})
        ld = LoadModel()
        load_fields = {
            "diurnal_amplitude": (
                ld.diurnal_amplitude,
                lambda v: 0 <= v < 0.9,
                "must be in [0, 0.9)",
            ),
            "diurnal_period_s": (ld.diurnal_period_s, lambda v: v > 0, "must be > 0"),
            "jitter_sigma": (ld.jitter_sigma, lambda v: 0 <= v < 0.5, "must be in [0, 0.5)"),
            "burst_rate_per_h": (
                ld.burst_rate_per_h,
                lambda v: 0 <= v <= 3600,
                "must be in [0, 3600]",
            ),
            "burst_amplitude": (ld.burst_amplitude, lambda v: 0 <= v < 2, "must be in [0, 2)"),
            "burst_duration_s": (ld.burst_duration_s, lambda v: v > 0, "must be > 0"),
            "host_correlation": (ld.host_correlation, lambda v: 0 <= v <= 1, "must be in [0, 1]"),
            "sensitivity_spread": (
                ld.sensitivity_spread,
                lambda v: 0 <= v < 1,
                "must be in [0, 1)",
            ),
            "share_sigma": (ld.share_sigma, lambda v: 0 <= v < 0.5, "must be in [0, 0.5)"),
            "share_tau_s": (ld.share_tau_s, lambda v: v > 0, "must be > 0"),
        }
        load_values = _read_numbers(src, "noise.load", sub_load, load_fields)
        warm_fields = {
            "amplitude": (d.warmup_amplitude, lambda v: 0 <= v < 1, "must be in [0, 1)"),
            "tau_s": (d.warmup_tau_s, lambda v: v > 0, "must be > 0"),
        }
        start = sub_warm.get("start", "cold")
        if start not in ("cold", "warm"):
            raise src.error(
                f"[noise.warmup] start must be 'cold' or 'warm', not {start!r}",
                "start",
                "noise.warmup",
            )
        warm = _read_numbers(src, "noise.warmup", sub_warm, warm_fields, skip={"start"})
        return NoiseModel(
            **values,
            warmup_amplitude=warm["amplitude"],
            warmup_tau_s=warm["tau_s"],
            start_warm=start == "warm",
            load=LoadModel(**load_values),
        )

    @staticmethod
    def _parse_timing(src: _Source) -> Timing:
        tbl = src.table("timing", required=False)
        d = Timing()
        vals = _read_numbers(
            src,
            "timing",
            tbl,
            {
                "apply_s": (d.apply_s, lambda v: v >= 0, "must be >= 0"),
                "reboot_s": (d.reboot_s, lambda v: v >= 0, "must be >= 0"),
            },
        )
        return Timing(**vals)

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

    def point(self, config: Configuration) -> Point:
        """Noiseless response of ``config``; knobs it leaves out sit at the reference."""
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

    def warmups(self, old: Configuration, new: Configuration) -> list[Warmup]:
        """The transients a host goes through when it changes from ``old`` to ``new``: the
        default ``[noise.warmup]`` one, plus the extra one of every changed knob whose new
        setting has a ``[knobs.<knob>.warmup]`` entry, plus that of every interaction with a
        ``warmup`` that holds at ``new`` and whose knobs the change touched."""
        n = self.noise
        out = [Warmup(n.warmup_amplitude, n.warmup_tau_s)] if n.warmup_amplitude > 0 else []
        a, b = self.full_settings(old), self.full_settings(new)
        changed = {k for k in set(a) | set(b) if a.get(k) != b.get(k)}
        for knob in sorted(changed):
            resp = self.knobs.get(knob)
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


def _warmup_entry(src: _Source, raw: object, key: str, table: str) -> Warmup:
    """``{ amplitude = 0.05, tau_s = 120.0 }``: an extra warm-up transient."""
    if not isinstance(raw, dict):
        raise src.error(
            f"[{table}] {key} must be {{ amplitude = <loss>, tau_s = <seconds> }}", key, table
        )
    for k in raw:
        if k not in ("amplitude", "tau_s"):
            raise src.error(
                f"[{table}] {key}: unknown key '{k}' (allowed: amplitude, tau_s)", key, table
            )
    if "amplitude" not in raw or "tau_s" not in raw:
        raise src.error(f"[{table}] {key} needs amplitude and tau_s", key, table)
    amp = _number(src, raw["amplitude"], f"[{table}] {key} amplitude", key, table)
    tau = _number(src, raw["tau_s"], f"[{table}] {key} tau_s", key, table)
    if not 0.0 <= amp < 1.0:
        raise src.error(
            f"[{table}] {key} amplitude must be in [0, 1), not {raw['amplitude']!r}", key, table
        )
    if not 0.0 < tau <= 86_400.0:
        raise src.error(
            f"[{table}] {key} tau_s must be in (0, 86400], not {raw['tau_s']!r}", key, table
        )
    return Warmup(amp, tau)


def _knob_warmups(
    src: _Source, knob: str, raw: object, settings: Mapping[Value, float]
) -> dict[Value, Warmup]:
    """``[knobs.<knob>.warmup]``: setting = { amplitude, tau_s }, an extra transient on a host
    whose change puts the knob at that setting."""
    table = f"knobs.{knob}.warmup"
    if not isinstance(raw, dict):
        raise src.error(f"[{table}] must be a table of setting = {{ ... }}", "warmup", table)
    out: dict[Value, Warmup] = {}
    for key, entry in raw.items():
        setting = _setting(src, knob, key, key, table)
        if setting not in settings:
            raise src.error(
                f"[{table}] {key!r} has no throughput in [knobs.{knob}.throughput]", key, table
            )
        out[setting] = _warmup_entry(src, entry, key, table)
    return out


def _read_numbers(
    src: _Source,
    table: str,
    tbl: Mapping[str, Any],
    spec: Mapping[str, tuple[float, Any, str]],
    skip: set[str] | frozenset[str] = frozenset(),
) -> dict[str, float]:
    out: dict[str, float] = {}
    for key in tbl:
        if key not in spec and key not in skip:
            allowed = ", ".join(sorted(set(spec) | set(skip)))
            raise src.error(f"[{table}] has unknown key '{key}' (allowed: {allowed})", key, table)
    for key, (default, ok, why) in spec.items():
        if key not in tbl:
            out[key] = float(default)
            continue
        v = _number(src, tbl[key], f"[{table}] {key}", key, table)
        if not ok(v):
            raise src.error(f"[{table}] {key} {why}, not {tbl[key]!r}", key, table)
        out[key] = v
    return out


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
