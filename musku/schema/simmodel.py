"""The simulator's model file (docs/sim.md), declared as a model.

These models check each table's keys, each number's type, finiteness and range, and the
shape of interactions and threading rules. What depends on the knobs (a setting's canonical
form, a setting in the platform's catalog or the experiment's space, a condition on a knob
the model has) is checked by :meth:`musku.sim.model.SimModel.load` afterwards.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Annotated, Any, ClassVar

from pydantic import BeforeValidator, Field, model_validator

from musku.schema.document import Check, Refusal, Strict, bounds
from musku.schema.experiment import THREADING_MODELS, KnobName


def number(message: str = "", ok: Callable[[float], bool] | None = None, **schema: Any) -> Any:
    """A finite number (``true`` is not one); ``ok`` refuses with ``message`` (``{at}`` is
    where, ``{value}`` the value as written)."""

    def check(value: Any) -> Any:
        return _number(value, "{at}", message, ok)

    return Check(check, **schema)


def _number(value: Any, at: str, message: str, ok: Callable[[float], bool] | None) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise Refusal(f"{at} must be a number, not {value!r}")
    if not math.isfinite(value):
        raise Refusal(f"{at} must be finite, not {value!r}")
    if ok is not None and not ok(float(value)):
        raise Refusal(message.replace("{at}", at).replace("{value}", repr(value)))
    return float(value)


def in_range(ok: Callable[[float], bool], why: str, **schema: Any) -> Any:
    """A number of ``[noise]``, ``[noise.load]``, ``[noise.warmup]`` or ``[timing]``."""
    return number("{at} " + why + ", not {value}", ok, **schema)


Multiplier = Annotated[
    float, number("{at}: a multiplier must be > 0", lambda v: v > 0, exclusiveMinimum=0)
]
Rate = Annotated[
    float,
    number("{at}: a violation rate is in [0, 1]", lambda v: 0 <= v <= 1, minimum=0, maximum=1),
]


def _warmup(raw: Any, at: str) -> Any:
    """``{ amplitude = 0.05, tau_s = 120.0 }``: an extra warm-up transient."""
    if not isinstance(raw, dict):
        raise Refusal(f"{at} must be {{ amplitude = <loss>, tau_s = <seconds> }}")
    for k in raw:
        if k not in ("amplitude", "tau_s"):
            raise Refusal(f"{at}: unknown key '{k}' (allowed: amplitude, tau_s)")
    if "amplitude" not in raw or "tau_s" not in raw:
        raise Refusal(f"{at} needs amplitude and tau_s")
    _number(raw["amplitude"], f"{at} amplitude", "", None)
    _number(raw["tau_s"], f"{at} tau_s", "", None)
    if not 0.0 <= raw["amplitude"] < 1.0:
        raise Refusal(f"{at} amplitude must be in [0, 1), not {raw['amplitude']!r}")
    if not 0.0 < raw["tau_s"] <= 86_400.0:
        raise Refusal(f"{at} tau_s must be in (0, 86400], not {raw['tau_s']!r}")
    return raw


class WarmupEntry(Strict):
    """An extra warm-up transient: relative loss ``amplitude`` decaying with ``tau_s``."""

    amplitude: Annotated[float, bounds(minimum=0, exclusiveMaximum=1)]
    tau_s: Annotated[float, bounds(exclusiveMinimum=0, maximum=86_400)]

    @model_validator(mode="before")
    @classmethod
    def _known_keys(cls, data: Any) -> Any:
        return _warmup(data, "{at}")


def _table_of(part: str) -> Any:
    def check(value: Any) -> Any:
        if not isinstance(value, dict):
            raise Refusal(f"[{{name}}.{part}] must be a table of setting = number")
        return value

    return BeforeValidator(check)


def _warmups(value: Any) -> Any:
    if not isinstance(value, dict):
        raise Refusal("[{name}.warmup] must be a table of setting = { ... }")
    return value


class LiveEntry(Strict):
    """``[knobs.<knob>.live]``: the knob set by its live mechanism (no reboot), for a reboot
    knob that has one: ``throughput``, a multiplier on top of the setting's own while the
    host runs it live (away from the setting it booted with); ``warmup``, the transient of a
    live change instead of the setting's ``[knobs.<knob>.warmup]`` (none: only
    ``[noise.warmup]``)."""

    throughput: Multiplier = 1.0
    warmup: WarmupEntry | None = None


class KnobTable(Strict):
    """``[knobs.<knob>]``: the knob's multipliers per setting (settings are the keys)."""

    throughput: Annotated[dict[str, Multiplier], _table_of("throughput")]
    p99: Annotated[dict[str, Multiplier], _table_of("p99")] = {}
    qos: Annotated[dict[str, Rate], _table_of("qos")] = {}
    power: Annotated[dict[str, Multiplier], _table_of("power")] = {}
    warmup: Annotated[dict[str, WarmupEntry], BeforeValidator(_warmups)] = {}
    live: LiveEntry | None = None
    description: Any = ""

    @classmethod
    def shape(cls, data: dict[str, Any]) -> None:
        if not isinstance(data.get("throughput"), dict) or not data["throughput"]:
            raise Refusal("{table} needs a non-empty [{name}.throughput] table", here=True)


def _config(value: Any) -> Any:
    if value is not None and not isinstance(value, dict):
        raise Refusal("[reference.config] must be a table")
    return value


class Reference(Strict):
    """``[reference]``: the absolute figures at the reference configuration."""

    mips: Annotated[float, number("{at} must be > 0", lambda v: v > 0, exclusiveMinimum=0)]
    qps: Annotated[float, number("{at} must be > 0", lambda v: v > 0, exclusiveMinimum=0)]
    p99_ms: Annotated[float, number("{at} must be > 0", lambda v: v > 0, exclusiveMinimum=0)]
    power_w: Annotated[float, number("{at} must be > 0", lambda v: v > 0, exclusiveMinimum=0)]
    qos_violation_rate: Annotated[
        float, number("{at} must be in [0, 1)", lambda v: 0 <= v < 1, minimum=0, exclusiveMaximum=1)
    ] = 0.0
    config: Annotated[dict[str, Any] | None, BeforeValidator(_config)] = None


class ModelTable(Strict):
    name: str | None = Field(default=None, description="default: the file's name")
    description: str = ""
    platform: str | None = Field(
        default=None, description="check the settings against this catalog"
    )


def _entries(header: str, check: Callable[[dict[str, Any], str], None]) -> BeforeValidator:
    """An array of tables, each checked with its ``#n`` in the message and its header's line
    (the entries' knob conditions are checked by the loader)."""

    def run(value: Any) -> Any:
        if not isinstance(value, list):
            return value  # the field's own type error
        for i, item in enumerate(value):
            try:
                if not isinstance(item, dict):
                    raise Refusal("must be a table")
                check(item, header)
            except Refusal as exc:
                raise Refusal(f"[[{header}]] #{i + 1}: {exc.message}", key=i) from None
        return value

    return BeforeValidator(run)


def _interaction(item: dict[str, Any], header: str) -> None:
    for key in item:
        if key not in {"when", "throughput", "p99", "why", "warmup"}:
            raise Refusal(f"unknown key '{key}' (allowed: p99, throughput, warmup, when, why)")
    if "throughput" not in item:
        raise Refusal("needs throughput = <multiplier>")
    mult = item["throughput"]
    if isinstance(mult, bool) or not isinstance(mult, int | float) or not mult > 0:
        raise Refusal(f"throughput must be a number > 0, not {mult!r}")
    if not math.isfinite(float(mult)):
        raise Refusal("throughput must be finite")
    p99 = item.get("p99", 1.0 / float(mult))
    if isinstance(p99, bool) or not isinstance(p99, int | float) or not p99 > 0:
        raise Refusal(f"p99 must be a number > 0, not {p99!r}")
    if not isinstance(item.get("why", ""), str):
        raise Refusal("why must be text")
    if "warmup" in item:
        _warmup(item["warmup"], "[interactions] warmup")


class Interaction(Strict):
    """``[[interactions]]``: an extra multiplier where every condition holds."""

    when: Any = Field(
        default=None,  # required: the loader words its absence
        description='knob = setting, [settings] or "!setting"',
        json_schema_extra={"type": "object"},
    )
    throughput: Annotated[float, bounds(exclusiveMinimum=0)]
    p99: Annotated[float, bounds(exclusiveMinimum=0)] | None = None
    why: str = ""
    warmup: WarmupEntry | None = None

    @model_validator(mode="before")
    @classmethod
    def _known_keys(cls, data: Any) -> Any:
        return data  # checked, in the file's words, by the list's validator


def _rule(item: dict[str, Any], header: str) -> None:
    for key in item:
        if key not in {"when", "best", "why"}:
            raise Refusal(f"unknown key '{key}' (allowed: best, when, why)")
    if not isinstance(item.get("why", ""), str):
        raise Refusal("why must be text")


class ThreadingRule(Strict):
    """``[[threading.rules]]``: where another threading model serves best."""

    when: Any = Field(default=None, json_schema_extra={"type": "object"})  # loader: required
    best: Any = Field(default=None, json_schema_extra={"enum": list(THREADING_MODELS)})
    why: str = ""

    @model_validator(mode="before")
    @classmethod
    def _known_keys(cls, data: Any) -> Any:
        return data  # checked, in the file's words, by the list's validator


def _model_name(key: str) -> BeforeValidator:
    def check(value: Any) -> Any:
        if value not in THREADING_MODELS:
            raise Refusal(
                f"[threading] {key} = {value!r} is not a threading model "
                f"({', '.join(THREADING_MODELS)})"
            )
        return value

    return BeforeValidator(check)


class ThreadingTable(Strict):
    """``[threading]``: the best threading model per configuration (docs/threading.md)."""

    initial: Annotated[str, _model_name("initial")] = "async-dispatch-block"
    best: Annotated[str, _model_name("best")]
    mismatch: Annotated[
        float,
        number("{at} must be in [0, 0.9)", lambda v: 0 <= v < 0.9, minimum=0, exclusiveMaximum=0.9),
    ] = 0.0
    mismatch_p99: (
        Annotated[
            float,
            number(
                "{at} must be in [0, 10)", lambda v: 0 <= v < 10, minimum=0, exclusiveMaximum=10
            ),
        ]
        | None
    ) = None
    rules: Annotated[
        list[ThreadingRule],
        _entries("threading.rules", _rule),
        BeforeValidator(lambda v: _array(v, "[threading] rules", "[[threading.rules]]")),
    ] = []

    @classmethod
    def shape(cls, data: dict[str, Any]) -> None:
        if "best" not in data:
            raise Refusal(
                "[threading] needs 'best' (the best model where no rule applies)",
                line_key="threading",
            )


def _array(value: Any, what: str, header: str) -> Any:
    if not isinstance(value, list):
        raise Refusal(f"{what} must be an array of tables {header}")
    return value


class Noise(Strict):
    """``[noise]``: per-host noise, host bias, outliers (docs/sim.md)."""

    tick_s: Annotated[float, in_range(lambda v: v > 0, "must be > 0", exclusiveMinimum=0)] = 1.0
    host_bias: Annotated[float, in_range(lambda v: -0.5 < v < 0.5, "must be in (-0.5, 0.5)")] = (
        0.003
    )
    ar_phi: Annotated[float, in_range(lambda v: 0 <= v < 1, "must be in [0, 1)")] = 0.6
    ar_sigma: Annotated[float, in_range(lambda v: 0 <= v < 1, "must be in [0, 1)")] = 0.02
    outlier_prob: Annotated[float, in_range(lambda v: 0 <= v <= 1, "must be in [0, 1]")] = 0.001
    outlier_scale: Annotated[float, in_range(lambda v: 0 <= v < 3, "must be in [0, 3)")] = 0.3
    p99_sigma: Annotated[float, in_range(lambda v: 0 <= v < 1, "must be in [0, 1)")] = 0.03
    power_sigma: Annotated[float, in_range(lambda v: 0 <= v < 1, "must be in [0, 1)")] = 0.005
    p99_load_gain: Annotated[float, in_range(lambda v: v >= 0, "must be >= 0")] = 0.5
    power_load_gain: Annotated[float, in_range(lambda v: v >= 0, "must be >= 0")] = 0.3
    innovation_df: Annotated[
        float, in_range(lambda v: v == 0 or 2 < v <= 1000, "must be 0 (Gaussian) or in (2, 1000]")
    ] = 0.0
    wander_sd: Annotated[float, in_range(lambda v: 0 <= v < 0.5, "must be in [0, 0.5)")] = 0.0
    wander_tau_s: Annotated[float, in_range(lambda v: v > 0, "must be > 0")] = 3600.0
    load: LoadTable = Field(default_factory=lambda: LoadTable())
    warmup: WarmupTable = Field(default_factory=lambda: WarmupTable())


class LoadTable(Strict):
    """``[noise.load]``: the live load common to both hosts."""

    diurnal_amplitude: Annotated[float, in_range(lambda v: 0 <= v < 0.9, "must be in [0, 0.9)")] = (
        0.15
    )
    diurnal_period_s: Annotated[float, in_range(lambda v: v > 0, "must be > 0")] = 86_400.0
    jitter_sigma: Annotated[float, in_range(lambda v: 0 <= v < 0.5, "must be in [0, 0.5)")] = 0.005
    burst_rate_per_h: Annotated[
        float, in_range(lambda v: 0 <= v <= 3600, "must be in [0, 3600]")
    ] = 1.0
    burst_amplitude: Annotated[float, in_range(lambda v: 0 <= v < 2, "must be in [0, 2)")] = 0.08
    burst_duration_s: Annotated[float, in_range(lambda v: v > 0, "must be > 0")] = 300.0
    host_correlation: Annotated[float, in_range(lambda v: 0 <= v <= 1, "must be in [0, 1]")] = 1.0
    sensitivity_spread: Annotated[float, in_range(lambda v: 0 <= v < 1, "must be in [0, 1)")] = 0.0
    share_sigma: Annotated[float, in_range(lambda v: 0 <= v < 0.5, "must be in [0, 0.5)")] = 0.0
    share_tau_s: Annotated[float, in_range(lambda v: v > 0, "must be > 0")] = 600.0


def _start(value: Any) -> Any:
    if value not in ("cold", "warm"):
        raise Refusal(f"[noise.warmup] start must be 'cold' or 'warm', not {value!r}")
    return value


class WarmupTable(Strict):
    """``[noise.warmup]``: the transient after every change."""

    amplitude: Annotated[float, in_range(lambda v: 0 <= v < 1, "must be in [0, 1)")] = 0.05
    tau_s: Annotated[float, in_range(lambda v: v > 0, "must be > 0")] = 40.0
    start: Annotated[str, BeforeValidator(_start)] = "cold"


class Timing(Strict):
    """``[timing]``: host seconds a change takes."""

    apply_s: Annotated[float, in_range(lambda v: v >= 0, "must be >= 0")] = 2.0
    reboot_s: Annotated[float, in_range(lambda v: v >= 0, "must be >= 0")] = 180.0


class SimModelFile(Strict):
    """A simulator model file (docs/sim.md)."""

    UNKNOWN: ClassVar[str] = "unknown table [{key}] (allowed: {allowed})"

    model: ModelTable = ModelTable()
    reference: Reference
    knobs: dict[KnobName, KnobTable]
    interactions: Annotated[
        list[Interaction],
        _entries("interactions", _interaction),
        BeforeValidator(lambda v: _array(v, "interactions", "[[interactions]]")),
    ] = []
    noise: Noise = Field(default_factory=lambda: Noise())
    timing: Timing = Timing()
    threading: ThreadingTable | None = None


Noise.model_rebuild()
