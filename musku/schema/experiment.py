"""The experiment file and the platform catalog (``knobs/*.toml``), declared as models.

These models check each table's keys, each value's type and each range that does not depend
on another file. What does (a knob on the platform, a setting in its catalog, the sim model
against the space) is checked by the loaders in :mod:`musku.experiment` once the platform is
read. The format is documented in docs/experiment.md.
"""

from __future__ import annotations

import math
import re
from typing import Annotated, Any, ClassVar

from pydantic import AfterValidator, BeforeValidator, Field, model_validator

from musku.inputfiles import MAX_LABEL_CHARS, MAX_NAME_CHARS, MAX_PATH_CHARS
from musku.knob_spec import CONFIGURED, LineError, check_line, is_knob, known_list
from musku.schema.document import Check, Refusal, Strict, bounds

MAX_CORES = 4096
"""Most cores a catalog may declare."""

MAX_LLC_WAYS = 64
"""Most LLC ways a catalog may declare (a resctrl capacity bitmask is at most 64 bits)."""

MAX_SEED = (1 << 63) - 1
"""Seeds are in 0..2**63-1 (they seed numpy's SeedSequence and are stored as BIGINT)."""

THREADING_MODELS: tuple[str, ...] = tuple(
    f"{leaf}-{disp}-{wait}"
    for leaf in ("sync", "async")
    for disp in ("inline", "dispatch")
    for wait in ("block", "poll")
)
"""The mid-tier's threading models (``musku.tune.cotune.MODELS`` spells the same list)."""


def label(limit: int) -> Check:
    """A name stored in a database column of ``limit`` characters."""

    def check(value: str) -> str:
        if not value.strip():
            raise Refusal("{at} must not be empty")
        if len(value) > limit:
            raise Refusal(f"{{at}} is {len(value):,} characters long (the limit is {limit})")
        return value

    return Check(check, mode="after", minLength=1, maxLength=limit)


def rule(ok: Any, why: str) -> AfterValidator:
    """A range check worded ``{at} <why>``."""

    def check(value: Any) -> Any:
        if not ok(value):
            raise Refusal("{at} " + why)
        return value

    return AfterValidator(check)


def one_of(choices: tuple[str, ...], message: str) -> AfterValidator:
    def check(value: str) -> str:
        if value not in choices:
            raise Refusal(message.replace("{value}", repr(value)))
        return value

    return AfterValidator(check)


def _knob_name(value: Any) -> Any:
    if not is_knob(value):  # a registered name, or an out-of-tree "module:Class"
        raise Refusal(f"unknown knob '{value}' (knobs: {known_list()})")
    return value


KnobName = Annotated[str, Check(_knob_name, mode="after")]
SYSFS_NAME = re.compile(r"[a-z][a-z0-9_]{0,62}")
"""The name of a knob a catalog line defines (``[knobs.<name>] kind = "sysfs"``)."""
"""A knob's name as a table's key (``[knobs.<knob>]``): one of the registered knobs."""

# ----------------------------------------------------------------------------- experiment


class ExperimentTable(Strict):
    name: Annotated[str, label(MAX_NAME_CHARS)]
    description: str = ""


class PlatformTable(Strict):
    catalog: str = Field(description="a catalog's name (knobs/NAME.toml) or a path to one")
    settings: dict[str, Any] = Field(
        default_factory=dict, description="knob = [settings]: the catalog's, narrowed"
    )

    @model_validator(mode="after")
    def _lists(self) -> PlatformTable:
        for knob, value in self.settings.items():
            if not isinstance(value, list) or not value:
                raise Refusal(
                    f"[platform.settings] {knob} must be a non-empty list",
                    line_key=knob,
                    line_table="platform.settings",
                )
        return self

    @classmethod
    def shape(cls, data: dict[str, Any]) -> None:
        if not isinstance(data.get("settings", {}), dict):
            raise Refusal("[platform.settings] must be a table", key="settings")


class ServiceTable(Strict):
    name: Annotated[str, label(MAX_LABEL_CHARS)]
    knobs: list[Any] | None = Field(
        default=None, description="knobs that apply (default: the catalog's)"
    )
    tolerates_reboot: bool = True
    uses_shp: bool | None = None


class SweepTable(Strict):
    mode: Annotated[str, label(MAX_LABEL_CHARS)] = Field(
        default="independent",
        description="a registered sweep strategy (independent, exhaustive, search, multiarm, "
        "or one an entry point adds) or 'module:attr' (the loader checks it)",
    )
    baseline: Annotated[
        str, one_of(("production", "stock"), "[sweep] baseline must be 'production' or 'stock'")
    ] = "production"
    search_rounds: Annotated[int, rule(lambda v: v >= 1, "must be >= 1"), bounds(minimum=1)] = 2
    scan: Annotated[
        str, one_of(("unimodal", "full"), "[sweep] scan must be 'unimodal' or 'full'")
    ] = "unimodal"
    reboot_knobs: Annotated[
        str,
        one_of(("reboot", "scan-live"), "[sweep] reboot_knobs must be 'reboot' or 'scan-live'"),
    ] = Field(
        default="reboot",
        description="'scan-live': scan a reboot knob with its live mechanism (no reboot), then "
        "confirm the chosen setting once with the reboot (docs/experiment.md)",
    )
    order_by: Annotated[
        str,
        one_of(("none", "prediction"), "[sweep] order_by must be 'none' or 'prediction'"),
    ] = Field(
        default="none",
        description="'prediction': walk each knob's settings in the order of their gain "
        "predicted by the [predict] model (docs/qsim.md)",
    )


class MetricTable(Strict):
    primary: Annotated[str, label(100)] = "mips"
    direction: (
        Annotated[
            str, one_of(("higher", "lower"), "[metric] direction must be 'higher' or 'lower'")
        ]
        | None
    ) = None


class GuardrailEntry(Strict):
    UNKNOWN: ClassVar[str] = "[guardrails] has unknown key '{key}' (allowed: {allowed})"
    NOT_TABLE: ClassVar[str] = "each [[guardrails]] must be a table"

    metric: str
    max: float | None = None
    min: float | None = None

    @classmethod
    def shape(cls, data: dict[str, Any]) -> None:
        metric = data.get("metric")
        if not isinstance(metric, str):
            raise Refusal('[[guardrails]] needs metric = "name"')
        if ("max" in data) == ("min" in data):
            raise Refusal(f"[[guardrails]] {metric}: give exactly one of max or min")
        limit = data.get("max", data.get("min"))
        if isinstance(limit, bool) or not isinstance(limit, int | float):
            raise Refusal(f"[[guardrails]] {metric}: limit must be a number")
        if not math.isfinite(limit):
            raise Refusal(f"[[guardrails]] {metric}: limit must be a finite number")


class StatisticsTable(Strict):
    confidence: Annotated[
        float,
        rule(lambda v: 0.5 < v < 1.0, "must be between 0.5 and 1 (exclusive)"),
        bounds(exclusiveMinimum=0.5, exclusiveMaximum=1.0),
    ] = 0.95
    min_effect: Annotated[
        float,
        rule(lambda v: 0.0 < v < 0.5, "must be a relative effect in (0, 0.5)"),
        bounds(exclusiveMinimum=0.0, exclusiveMaximum=0.5),
    ] = 0.005
    warmup_s: Annotated[
        float,
        rule(lambda v: v >= 0.0, "must be >= 0"),
        rule(lambda v: v <= 86400.0, "must be at most 86400 (a day)"),
        bounds(minimum=0.0, maximum=86400.0),
    ] = 60.0
    sample_interval_s: Annotated[
        float,
        rule(lambda v: v > 0.0, "must be > 0"),
        rule(lambda v: 1e-3 <= v <= 3600.0, "must be in 0.001..3600"),
        bounds(minimum=1e-3, maximum=3600.0),
    ] = 1.0
    sample_cap: Annotated[
        int,
        rule(lambda v: v >= 10, "must be >= 10"),
        rule(lambda v: v <= 10_000_000, "must be at most 10000000"),
        bounds(minimum=10, maximum=10_000_000),
    ] = 30_000
    seed: Annotated[
        int,
        rule(lambda v: v >= 0, "must be >= 0"),
        rule(lambda v: v <= MAX_SEED, f"must be at most {MAX_SEED}"),
        bounds(minimum=0, maximum=MAX_SEED),
    ] = 0
    period: Annotated[
        str,
        one_of(
            ("swap", "auto"),
            "[statistics] period must be 'swap' (3x the swap cost) or 'auto' (the length "
            "minimising the expected host time), not {value}",
        ),
    ] = "swap"


class HostsTable(Strict):
    """``[hosts]``: the backend, and its options (each built-in backend's are declared in
    :mod:`musku.schema.hosts` and checked against it by the loader)."""

    model_config = Strict.model_config | {"extra": "allow"}

    backend: str = Field(default="sim", description="sim, agent, local, qsim or module:factory")

    @model_validator(mode="before")
    @classmethod
    def _known_keys(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            raise Refusal(cls.NOT_TABLE, here=True)
        return data


def _numbers(value: Any) -> Any:
    if isinstance(value, list):
        for v in value:
            ok = not isinstance(v, bool) and isinstance(v, int | float) and math.isfinite(v)
            if not ok:
                raise Refusal(f"{{at}} must be a list of numbers, not {v!r}")
    return value


def _integers(value: Any) -> Any:
    if isinstance(value, list):
        for v in value:
            if isinstance(v, bool) or not isinstance(v, int):
                raise Refusal(f"{{at}} must be a list of integers, not {v!r}")
    return value


def _models(value: Any) -> Any:
    if isinstance(value, list):
        for m in value:
            if m not in THREADING_MODELS:
                raise Refusal(
                    f"[threading] unknown threading model {m!r} "
                    f"(models: {', '.join(THREADING_MODELS)})"
                )
    return value


FiniteNumber = Annotated[float, rule(math.isfinite, "must be a finite number")]


class ThreadingTable(Strict):
    """``[threading]``: co-tune each host's mid-tier threading (docs/threading.md)."""

    cotune: bool = False
    service: str | None = None
    loads: Annotated[list[float], BeforeValidator(_numbers)] | None = None
    models: Annotated[list[str], BeforeValidator(_models)] | None = None
    workers: Annotated[list[int], BeforeValidator(_integers)] | None = None
    duration_s: FiniteNumber = 3.0
    warmup_s: FiniteNumber = 0.5
    admin: str = ""
    admin_port_file: str = ""
    load_data: str = ""


class PredictTable(Strict):
    """``[predict]``: the queueing model that predicts each setting's effect (``musku qsim
    predict``, ``[sweep] order_by = "prediction"``; docs/qsim.md "Predicting a sweep")."""

    model: Annotated[str, label(MAX_PATH_CHARS)] | None = Field(
        default=None, description="a qsim model file, relative to the experiment"
    )
    qps: (
        Annotated[
            float,
            rule(lambda v: math.isfinite(v) and 0 < v <= 1e9, "must be in (0, 1e9]"),
            bounds(exclusiveMinimum=0.0, maximum=1e9),
        ]
        | None
    ) = Field(default=None, description="the experiment's load (default: the model's client)")
    seeds: Annotated[
        int, rule(lambda v: 2 <= v <= 100, "must be in 2..100"), bounds(minimum=2, maximum=100)
    ] = 3
    duration_s: Annotated[
        float,
        rule(lambda v: math.isfinite(v) and 0.01 <= v <= 1e4, "must be in 0.01..10000"),
        bounds(minimum=0.01, maximum=1e4),
    ] = 1.0
    uncore_scale: (
        Annotated[
            float,
            rule(lambda v: math.isfinite(v) and 0 <= v <= 1, "must be in 0..1"),
            bounds(minimum=0.0, maximum=1.0),
        ]
        | None
    ) = Field(
        default=None,
        description="share of each stage's time that scales with the uncore frequency "
        "(without it uncore_freq is not expressible in the model)",
    )


class ExperimentFile(Strict):
    """An experiment file (docs/experiment.md)."""

    UNKNOWN: ClassVar[str] = "unknown table [{key}] (allowed: {allowed})"

    experiment: ExperimentTable
    service: ServiceTable
    platform: PlatformTable
    stock: dict[str, Any] = Field(default_factory=dict, description="knob = setting")
    production: dict[str, Any] = Field(default_factory=dict, description="knob = setting")
    sweep: SweepTable = SweepTable()
    metric: MetricTable = MetricTable()
    guardrails: list[GuardrailEntry] = []
    statistics: StatisticsTable = StatisticsTable()
    hosts: HostsTable = HostsTable()
    threading: ThreadingTable | None = None
    predict: PredictTable | None = None

    @classmethod
    def shape(cls, data: dict[str, Any]) -> None:
        if not isinstance(data.get("guardrails", []), list):
            raise Refusal(
                "guardrails must be an array of tables [[guardrails]]", line_key="guardrails"
            )


# ----------------------------------------------------------------------------- catalogs


def _ways(value: Any) -> Any:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_LLC_WAYS:
        raise Refusal(f"{{at}} must be an integer in 2..{MAX_LLC_WAYS}")
    return value


def _reboot(value: Any) -> Any:
    if not isinstance(value, bool):
        raise Refusal("{at} must be true or false")
    return value


class KnobCatalog(Strict):
    """``[knobs.<knob>]``: the settings a knob takes on the platform; with ``kind = "sysfs"``
    the line also defines the knob (a generic sysctl/sysfs attribute, docs/knobs.md)."""

    settings: Any = Field(
        default=None,
        description='the settings, in order; "splits" for every CDP split of the ways',
        json_schema_extra={"anyOf": [{"type": "array", "minItems": 1}, {"const": "splits"}]},
    )
    reboot: Annotated[bool, BeforeValidator(_reboot)] | None = Field(
        default=None, description="changing it needs a reboot (default: the knob's spec)"
    )
    description: Any = ""
    ways: Annotated[int, BeforeValidator(_ways), bounds(minimum=0, maximum=MAX_LLC_WAYS)] | None = (
        None
    )
    kind: str | None = Field(
        default=None,
        description='"sysfs": this line defines the knob, a generic sysctl/sysfs attribute',
        json_schema_extra={"enum": list(CONFIGURED)},
    )
    path: str | None = Field(
        default=None, description="kind = sysfs: the attribute, under /proc/sys or /sys"
    )

    @model_validator(mode="after")
    def _defined(self) -> KnobCatalog:
        if self.kind is None:
            if self.path is not None:
                raise Refusal('{table} path is only for kind = "sysfs"', key="path", here=True)
            return self
        try:
            check_line(self.kind, {"path": self.path, "settings": self.settings})
        except LineError as exc:
            raise Refusal(f"{{table}} {exc}", key=exc.key, here=True) from None
        return self


class PlatformFacts(Strict):
    """``[platform]`` of a catalog; keys beyond these are facts kept for the record."""

    model_config = Strict.model_config | {"extra": "allow"}

    name: Annotated[str, label(MAX_LABEL_CHARS)]
    vendor: str = "other"
    cores: Annotated[
        int, rule(lambda v: 1 <= v <= MAX_CORES, f"must be in 1..{MAX_CORES}"), bounds(minimum=1)
    ]
    llc_ways: Annotated[
        int,
        rule(lambda v: 0 <= v <= MAX_LLC_WAYS, f"must be in 0..{MAX_LLC_WAYS}"),
        bounds(minimum=0, maximum=MAX_LLC_WAYS),
    ] = 0

    @model_validator(mode="before")
    @classmethod
    def _known_keys(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            raise Refusal(cls.NOT_TABLE, here=True)
        return data


class CatalogFile(Strict):
    """A platform catalog (``knobs/NAME.toml``, docs/knobs.md)."""

    model_config = Strict.model_config | {"extra": "ignore"}

    platform: PlatformFacts
    knobs: dict[str, KnobCatalog] = Field(description="knob name -> its [knobs.<knob>] table")
    stock: dict[str, Any] = Field(description="knob = setting out of the box")

    @model_validator(mode="after")
    def _knob_names(self) -> CatalogFile:
        for key, table in self.knobs.items():
            if table.kind is None:
                if not is_knob(key):  # a registered name, or an out-of-tree "module:Class"
                    raise Refusal(
                        f"[knobs] unknown knob '{key}' (knobs: {known_list()})", line_key=key
                    )
            elif not SYSFS_NAME.fullmatch(key):
                raise Refusal(
                    f"[knobs.{key}] a sysfs knob's name must be lower-case letters, digits "
                    "and _ (it names a database column)",
                    line_key=key,
                )
        return self

    @model_validator(mode="before")
    @classmethod
    def _known_keys(cls, data: Any) -> Any:
        return data
