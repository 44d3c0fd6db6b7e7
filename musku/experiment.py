"""Experiment files (TOML) and platform knob catalogs (``knobs/*.toml``).

The format is documented in docs/experiment.md; examples live in ``experiments/``.
Every problem is an :class:`~musku.errors.InputError` naming the file and, where it can, the line.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from musku.cotune_spec import DEFAULT_LOADS, DEFAULT_WORKERS, MIDTIER_KEYS, MODELS, CotuneSpec
from musku.domain import (
    ComparisonSpec,
    Configuration,
    Direction,
    Guardrail,
    StatsSettings,
    SweepMode,
    Value,
    format_value,
)
from musku.errors import InputError, UnsupportedError
from musku.inputfiles import safe_exists
from musku.knob_spec import (
    LineError,
    configure_knob,
    is_knob,
    known_list,
    resolve,
    sort_key,
    spec_of,
)
from musku.registry import BACKENDS, STRATEGIES
from musku.schema.document import Document, line_of
from musku.schema.experiment import (
    MAX_CORES,
    MAX_LLC_WAYS,  # noqa: F401 (part of this module's interface)
    MAX_SEED,  # noqa: F401 (part of this module's interface)
    CatalogFile,
    ExperimentFile,
    GuardrailEntry,
    PredictTable,
    ServiceTable,
    ThreadingTable,
)


@dataclass(frozen=True)
class Platform:
    """A platform's knob catalog: which settings each knob can take there."""

    name: str
    description: str
    vendor: str  # "intel" | "amd" | "other"
    cores: int
    llc_ways: int
    settings: Mapping[str, tuple[Value, ...]]  # knob -> allowed settings (ordered)
    stock: Configuration  # the platform's out-of-the-box configuration
    reboot_knobs: frozenset[str]  # knobs whose change needs a reboot (e.g. isolcpus mode)
    path: Path | None = None
    facts: Mapping[str, Any] = field(default_factory=dict)  # the rest of [platform]


@dataclass(frozen=True)
class Service:
    name: str
    knobs: tuple[str, ...]  # knobs that apply to this service
    tolerates_reboot: bool = True
    uses_shp: bool = False


@dataclass(frozen=True)
class HostsSpec:
    backend: str  # "sim" | "agent" | "local" | "module:factory"
    options: Mapping[str, Any] = field(default_factory=dict)  # the rest of [hosts]


@dataclass(frozen=True)
class ThreadingSection:
    """The optional ``[threading]`` table: co-tune the mid-tier's threading per configuration."""

    cotune: bool  # off by default: hosts keep whatever threading they run
    spec: CotuneSpec  # service, training grid, where each host's mid-tier is


@dataclass(frozen=True)
class PredictSection:
    """The optional ``[predict]`` table: the queueing model that predicts each setting's
    effect (``musku qsim predict``; docs/qsim.md "Predicting a sweep"). Unset keys fall back
    to the ``qsim`` backend's options, then to the model's own (:mod:`musku.qsim.predict`)."""

    model: str | None = None  # relative to the experiment file
    qps: float | None = None
    seeds: int = 3
    duration_s: float = 1.0
    uncore_scale: float | None = None


@dataclass(frozen=True)
class Experiment:
    name: str
    description: str
    path: Path
    service: Service
    platform: Platform
    space: Mapping[str, tuple[Value, ...]]  # knob -> settings to sweep (service's knobs only)
    stock: Configuration
    production: Configuration
    baseline: str  # "production" | "stock": what each knob is scaled against
    mode: SweepMode  # a registered sweep strategy (musku.sweep.modes) or "module:attr"
    spec: ComparisonSpec
    hosts: HostsSpec
    raw: Mapping[str, Any] = field(default_factory=dict)
    search_rounds: int = 2
    scan: str = "unimodal"  # "unimodal": stop scanning an ordered knob past two worsening losses
    threading: ThreadingSection | None = None  # the [threading] table, if the file has one
    predict: PredictSection | None = None  # the [predict] table, if the file has one
    order_by: str = "none"  # "prediction": each knob's settings by predicted gain (scan_order)
    # "scan-live": reboot knobs scanned with their live mechanism, the choice confirmed with
    # the reboot ([sweep] reboot_knobs; strategies._scan_knob); "reboot": as they are
    reboot_scan: str = "reboot"

    @property
    def live_knobs(self) -> frozenset[str]:
        """The reboot knobs of the space a scan sets live (empty unless ``scan-live``)."""
        if self.reboot_scan != "scan-live":
            return frozenset()
        return frozenset(k for k in self.space if k in self.spec.reboot_knobs)

    @property
    def cotune(self) -> CotuneSpec | None:
        """How to co-tune each host's threading, or None when co-tuning is off."""
        return self.threading.spec if self.threading is not None and self.threading.cotune else None

    @property
    def baseline_config(self) -> Configuration:
        return self.production if self.baseline == "production" else self.stock

    @property
    def stats(self) -> StatsSettings:
        return self.spec.stats

    def resolve(self, relative: str | Path) -> Path:
        """A path given in the experiment file, relative to that file."""
        p = Path(relative)
        return p if p.is_absolute() else (self.path.parent / p)


# --------------------------------------------------------------------------- loading helpers

_Source = Document  # the knob-value helpers below take the document they report against

MAX_SHP = 1 << 24
"""Most static huge pages a setting may reserve."""

MAX_GHZ = 10.0
"""Highest core or uncore frequency setting, GHz."""


def _canonical(knob: str, value: object, *, cores: int, ways: int) -> Value:
    """A setting in canonical form, refusing what a host cannot take (the knob's spec
    decides: :meth:`musku.knob_spec.KnobSpec.check`; e.g. a frequency that is not a finite
    number of GHz in (0, 10], a core count outside 1..cores, a CDP split with non-ASCII digits
    or that does not add up to the LLC's ways, a negative huge page count).
    Raises ValueError/TypeError like :func:`canonical_value`."""
    return spec_of(knob).check(value, cores=cores, ways=ways)


# --------------------------------------------------------------------------- catalogs


def catalog_dirs() -> list[Path]:
    """Where platform catalogs are looked up: $MUSKU_KNOBS_PATH, the source tree, the wheel."""
    dirs: list[Path] = []
    env = os.environ.get("MUSKU_KNOBS_PATH")
    if env:
        dirs.extend(Path(p) for p in env.split(os.pathsep) if p)
    here = Path(__file__).resolve().parent
    dirs.append(here.parent / "knobs")  # source checkout / editable install
    dirs.append(here / "_data" / "knobs")  # installed wheel
    return [d for d in dirs if d.is_dir()]


def available_platforms() -> list[str]:
    names: set[str] = set()
    for d in catalog_dirs():
        names.update(p.stem for p in d.glob("*.toml"))
    return sorted(names)


def load_platform(name_or_path: str | Path) -> Platform:
    """Load a catalog by name (``skylake18``) or by path to a TOML file."""
    candidate = Path(name_or_path)
    path: Path | None = (
        candidate if candidate.suffix == ".toml" and safe_exists(candidate) else None
    )
    if path is None:
        for d in catalog_dirs():
            p = d / f"{name_or_path}.toml"
            if safe_exists(p):
                path = p
                break
        if path is None:
            known = ", ".join(available_platforms()) or "none found"
            raise InputError(f"unknown platform {str(name_or_path)!r} (known: {known})")
    src = Document.read(path)
    catalog = src.validate(CatalogFile)
    plat, cores, ways = catalog.platform, catalog.platform.cores, catalog.platform.llc_ways
    settings: dict[str, tuple[Value, ...]] = {}
    reboot: set[str] = set()
    for key, spec in catalog.knobs.items():
        table = f"knobs.{key}"
        if spec.kind is not None:  # the line defines the knob (kind = "sysfs")
            try:
                configure_knob(spec.kind, key, {"path": spec.path, "settings": spec.settings})
            except LineError as exc:  # the schema checked the line: only a knob's own rules
                raise src.error(f"[{table}] {exc}", exc.key, table) from None
            except InputError as exc:  # the name is another knob's
                raise src.error(f"[{table}] {exc.one_line()}", key) from None
        knob = resolve(key)  # a registered name, or an out-of-tree "module:Class"
        raw, n = spec.settings, ways if spec.ways is None else spec.ways
        splits = spec_of(knob).default_settings(n)  # WAYS knobs: every split of the LLC
        if raw == "splits" or (raw is None and splits is not None):
            if splits is None:
                raise src.error(f'[{table}] settings = "splits" is for cdp only', "settings", table)
            if n < 2:
                raise src.error(f"{knob} needs llc_ways >= 2", knob)
            values: tuple[Value, ...] = splits
        elif isinstance(raw, list) and raw:
            try:
                values = tuple(_canonical(knob, v, cores=cores, ways=n) for v in raw)
            except (TypeError, ValueError) as exc:
                raise src.error(f"[{table}] {exc}", "settings", table) from None
        else:
            raise src.error(f"[{table}] needs a non-empty 'settings' list", knob)
        if len(set(values)) != len(values):
            raise src.error(f"[{table}] lists a setting twice", "settings", table)
        settings[knob] = values
        if spec_of(knob).needs_reboot if spec.reboot is None else spec.reboot:  # catalog, else spec
            reboot.add(knob)
    stock = _configuration(src, "stock", catalog.stock, settings)
    raw_platform = src.data["platform"]
    facts = {
        k: v for k, v in raw_platform.items() if k not in {"name", "vendor", "cores", "llc_ways"}
    }
    return Platform(
        name=plat.name,
        description=str(raw_platform.get("description", "")),
        vendor=plat.vendor,
        cores=cores,
        llc_ways=ways,
        settings=settings,
        stock=stock,
        reboot_knobs=frozenset(reboot),
        path=path,
        facts=facts,
    )


def _configuration(
    src: _Source,
    table: str,
    raw: Mapping[str, Any],
    allowed: Mapping[str, tuple[Value, ...]],
) -> Configuration:
    values: dict[str, Value] = {}
    for knob, value in raw.items():
        if not is_knob(knob):
            raise src.error(f"[{table}] unknown knob '{knob}' (knobs: {known_list()})", knob, table)
        knob = resolve(knob)
        if knob not in allowed:
            raise src.error(
                f"[{table}] knob '{knob}' is not in the platform's catalog", knob, table
            )
        try:
            v = _canonical(knob, value, cores=MAX_CORES, ways=0)
        except (TypeError, ValueError) as exc:
            raise src.error(f"[{table}] {exc}", knob, table) from None
        if v not in allowed[knob]:
            choices = ", ".join(format_value(knob, x) for x in allowed[knob])
            raise src.error(
                f"[{table}] {knob} = {value!r} is not in the platform's catalog ({choices})",
                knob,
                table,
            )
        values[knob] = v
    return Configuration.of(values)


# --------------------------------------------------------------------------- experiments


def _per_host_midtiers(hosts: Any) -> bool:
    """Whether every [hosts] entry names its own mid-tier (``midtier_admin`` /
    ``midtier_admin_port_file``, agent backend; the values are checked when the hosts are
    opened)."""
    return (
        isinstance(hosts, list)
        and len(hosts) == 2
        and all(isinstance(h, dict) and any(k in h for k in MIDTIER_KEYS) for h in hosts)
    )


def _threading(
    src: Document,
    tbl: ThreadingTable | None,
    service: str,
    backend: str,
    hosts: Any = None,
    *,
    real_hosts: bool = False,
) -> ThreadingSection | None:
    """The ``[threading]`` table (docs/experiment.md), checked against the service and the
    backend (its keys and values are checked by :class:`ThreadingTable`): co-tuning on
    ``real_hosts`` (the backend's capability) needs the mid-tier's Admin address."""
    if tbl is None:
        return None
    name = service if tbl.service is None else tbl.service
    if not name:
        raise src.error("[threading] service must not be empty", "service", "threading")
    spec = CotuneSpec(
        service=name,
        loads=DEFAULT_LOADS if tbl.loads is None else tuple(tbl.loads),
        models=MODELS if tbl.models is None else tuple(tbl.models),
        workers=DEFAULT_WORKERS if tbl.workers is None else tuple(tbl.workers),
        duration_s=tbl.duration_s,
        warmup_s=tbl.warmup_s,
        admin=tbl.admin,
        admin_port_file=tbl.admin_port_file,
        load_data=tbl.load_data,
    )
    cotune = tbl.cotune
    problem = spec.problem()
    if problem:
        first = problem.split()[0]
        key = {"unknown": "models", "give": "admin_port_file"}.get(first, first)
        raise src.error(f"[threading] {problem}", key, "threading")
    per_host = real_hosts and _per_host_midtiers(hosts)
    if cotune and real_hosts and not (spec.admin or spec.admin_port_file or per_host):
        raise src.error(
            f'[threading] cotune on {backend} hosts needs admin = "host:port" or '
            "admin_port_file (where each host's mid-tier answers the Admin RPC; agent hosts "
            "may instead each give midtier_admin or midtier_admin_port_file in [hosts])",
            "cotune",
            "threading",
        )
    if cotune and real_hosts and not spec.load_data and name != "setalgebra":
        raise src.error(
            f"[threading] cotune of {name} needs load_data (the load generator's data on the "
            "hosts; only Set Algebra's is generated)",
            "cotune",
            "threading",
        )
    return ThreadingSection(cotune=cotune, spec=spec)


def _host_backend(src: Document, backend: str) -> Any:
    """The registered backend ``[hosts] backend`` names (:data:`musku.registry.BACKENDS`):
    an unknown name, or a plug-in that cannot be loaded, is one line at the key."""
    if not BACKENDS.known(backend):
        known = ", ".join(BACKENDS.names())
        raise src.error(
            f"[hosts] unknown backend {backend!r} (known: {known}; or 'module:attr')",
            "backend",
            "hosts",
        )
    try:
        return BACKENDS.get(backend)
    except InputError as exc:
        raise src.error(exc.message, "backend", "hosts") from None


def _check_host_options(src: Document, plugin: Any, options: Mapping[str, Any]) -> None:
    """The backend's options, checked against its declared model (``Backend.options``)
    without opening a host, so that ``musku check`` refuses what ``musku sweep`` would."""
    model = plugin.options
    if model is not None:
        src.validate(model, {**options, "backend": plugin.name}, prefix=("hosts",))


def _sweep_strategy(src: Document, mode: str) -> Any:
    """The registered strategy ``[sweep] mode`` names (:data:`musku.registry.STRATEGIES`):
    an unknown name, or a plug-in that cannot be loaded, is one line at the key."""
    if not STRATEGIES.known(mode):
        known = ", ".join(STRATEGIES.names())
        raise src.error(
            f"[sweep] mode {mode!r} is not one of {known} (or 'module:attr')", "mode", "sweep"
        )
    try:
        return STRATEGIES.get(mode)
    except InputError as exc:
        raise src.error(exc.message, "mode", "sweep") from None


def load_experiment(path: str | Path) -> Experiment:
    """Parse and validate an experiment file. Raises InputError with file:line."""
    src = Document.read(path)
    data = src.data
    f = src.validate(ExperimentFile)
    try:
        platform = load_platform(f.platform.catalog)
    except InputError as exc:
        if exc.where is None:
            raise src.error(exc.message, "catalog", "platform") from None
        raise
    service = _service(src, f.service, platform)
    space = _space(src, f.platform.settings, service, platform)

    # stock and production
    stock = platform.stock.merged(_configuration(src, "stock", f.stock, platform.settings))
    production = stock.merged(_configuration(src, "production", f.production, platform.settings))

    default_dir = (
        "lower"
        if f.metric.primary.endswith(("_ms", "_us", "_w")) or f.metric.primary.startswith("p9")
        else "higher"
    )
    guardrails = tuple(
        Guardrail(g.metric, "<=" if g.max is not None else ">=", float(_limit(g)))
        for g in f.guardrails
    )
    st = f.statistics
    stats = StatsSettings(
        confidence=float(st.confidence),
        min_effect=float(st.min_effect),
        warmup_s=float(st.warmup_s),
        sample_interval_s=float(st.sample_interval_s),
        sample_cap=st.sample_cap,
        seed=st.seed,
        period=st.period,
    )

    strategy = _sweep_strategy(src, f.sweep.mode)

    # hosts
    backend = f.hosts.backend
    plugin = _host_backend(src, backend)
    hosts_tbl = data.get("hosts", {})
    hosts = HostsSpec(
        backend=backend, options={k: v for k, v in hosts_tbl.items() if k != "backend"}
    )
    threading = _threading(
        src,
        f.threading,
        service.name,
        backend,
        hosts.options.get("hosts"),
        real_hosts=bool(plugin.real_hosts),
    )
    _check_host_options(src, plugin, hosts.options)

    reboot_knobs = platform.reboot_knobs if service.tolerates_reboot else frozenset()
    spec = ComparisonSpec(
        metric=f.metric.primary,
        direction=Direction(f.metric.direction or default_dir),
        guardrails=guardrails,
        stats=stats,
        reboot_knobs=frozenset(reboot_knobs),
    )
    experiment = Experiment(
        name=f.experiment.name,
        description=f.experiment.description,
        path=src.path.resolve(),
        service=service,
        platform=platform,
        space=space,
        stock=stock,
        production=production,
        baseline=f.sweep.baseline,
        mode=SweepMode(f.sweep.mode),
        spec=spec,
        hosts=hosts,
        raw=data,
        search_rounds=f.sweep.search_rounds,
        scan=f.sweep.scan,
        threading=threading,
        predict=_predict(f.predict),
        order_by=f.sweep.order_by,
        reboot_scan=f.sweep.reboot_knobs,
    )
    _check_reboot_scan(src, experiment)
    strategy.check(experiment)  # what the mode cannot run (exhaustive's size, multiarm's pool)
    return experiment


def _check_reboot_scan(src: Document, experiment: Experiment) -> None:
    """``[sweep] reboot_knobs = "scan-live"`` needs a reboot knob to scan, every one with a
    live mechanism (bad input otherwise), on hosts that can switch mechanisms (the sim)."""
    if experiment.reboot_scan != "scan-live":
        return
    where = "[sweep] reboot_knobs = 'scan-live'"
    reboot = sorted(k for k in experiment.space if k in experiment.spec.reboot_knobs)
    if not reboot:
        raise src.error(
            f"{where}: the space has no reboot knob (or the service does not tolerate reboots)",
            "reboot_knobs",
            "sweep",
        )
    at = src.where(line_of(src.text, "reboot_knobs", "sweep"))
    if experiment.mode in ("multiarm", "exhaustive"):
        raise UnsupportedError(
            f"{where}: mode {str(experiment.mode)!r} has no per-knob scan on pairs to run "
            "live (use it with independent or search)",
            where=at,
        )
    no_live = [k for k in reboot if not spec_of(k).live_mechanism]
    if no_live:
        raise UnsupportedError(
            f"{where}: {', '.join(no_live)} has no live mechanism (only a reboot sets it)",
            where=at,
        )
    if experiment.hosts.backend != "sim":
        raise UnsupportedError(
            f"{where}: hosts backend {experiment.hosts.backend!r} cannot switch "
            f"{', '.join(reboot)} between the live and the reboot mechanism per comparison "
            "(only the sim backend can yet)",
            where=at,
        )


def _predict(t: PredictTable | None) -> PredictSection | None:
    if t is None:
        return None
    return PredictSection(t.model, t.qps, t.seeds, t.duration_s, t.uncore_scale)


def _limit(g: GuardrailEntry) -> float:
    limit = g.max if g.max is not None else g.min
    assert limit is not None  # GuardrailEntry requires exactly one
    return limit


def _service(src: Document, svc: ServiceTable, platform: Platform) -> Service:
    """``[service]``: its knobs must be on the platform (default: all the catalog's)."""
    svc_knobs = list(platform.settings) if svc.knobs is None else svc.knobs
    for k in svc_knobs:
        if not is_knob(k):
            raise src.error(
                f"[service] unknown knob {k!r} (knobs: {known_list()})", "knobs", "service"
            )
        if resolve(k) not in platform.settings:
            raise src.error(
                f"[service] knob '{k}' is not available on platform '{platform.name}'",
                "knobs",
                "service",
            )
    svc_knobs = [resolve(k) for k in svc_knobs]
    # knobs swept only when the service opts in (shp: [service] uses_shp), per their specs
    opt_in = [k for k in svc_knobs if spec_of(k).service_flag == "uses_shp"]
    uses_shp = bool(opt_in) if svc.uses_shp is None else svc.uses_shp
    if not uses_shp:
        svc_knobs = [k for k in svc_knobs if k not in opt_in]
    return Service(
        name=svc.name,
        knobs=tuple(sorted(set(svc_knobs), key=sort_key)),
        tolerates_reboot=svc.tolerates_reboot,
        uses_shp=uses_shp,
    )


def _space(
    src: Document, narrowed: Mapping[str, Any], service: Service, platform: Platform
) -> dict[str, tuple[Value, ...]]:
    """The settings to sweep: the catalog's, narrowed by ``[platform.settings]``."""
    space: dict[str, tuple[Value, ...]] = {}
    for knob in service.knobs:
        if knob in narrowed:
            space[knob] = tuple(
                _configuration(src, "platform.settings", {knob: v}, platform.settings)[knob]
                for v in narrowed[knob]
            )
        else:
            space[knob] = platform.settings[knob]
    for knob in narrowed:
        if knob not in service.knobs:
            raise src.error(
                f"[platform.settings] knob '{knob}' is not one of the service's knobs",
                knob,
                "platform.settings",
            )
    return space
