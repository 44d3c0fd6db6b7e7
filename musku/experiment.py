"""Experiment files (TOML) and platform knob catalogs (``knobs/*.toml``).

The format is documented in docs/experiment.md; examples live in ``experiments/``.
Every problem is an :class:`~musku.errors.InputError` naming the file and, where it can, the line.
"""

from __future__ import annotations

import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from musku.domain import (
    KNOBS,
    ComparisonSpec,
    Configuration,
    Direction,
    Guardrail,
    StatsSettings,
    SweepMode,
    Value,
    canonical_value,
    format_value,
)
from musku.errors import InputError
from musku.tune.cotune import DEFAULT_LOADS, DEFAULT_WORKERS, MIDTIER_KEYS, MODELS, CotuneSpec


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
    mode: SweepMode
    spec: ComparisonSpec
    hosts: HostsSpec
    raw: Mapping[str, Any] = field(default_factory=dict)
    search_rounds: int = 2
    scan: str = "unimodal"  # "unimodal": stop scanning an ordered knob past two worsening losses
    threading: ThreadingSection | None = None  # the [threading] table, if the file has one

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


def _line_of(text: str, key: str, table: str | None = None) -> int | None:
    """Best-effort line number of ``key = ...`` (inside ``[table]`` when given)."""
    in_table = table is None
    for number, line in enumerate(text.splitlines(), start=1):
        stripped = line.strip()
        header = re.match(r"^\[\[?\s*([^\]]+?)\s*\]\]?", stripped)
        if header:
            if table is not None:
                in_table = header.group(1) == table
            name = header.group(1)
            if table is None and (key == name or name.endswith("." + key)):
                return number
            continue
        if in_table and re.match(rf"^\"?{re.escape(key)}\"?\s*=", stripped):
            return number
    return None


class _Source:
    """A parsed TOML file plus what is needed to point at lines in it."""

    def __init__(self, path: Path) -> None:
        self.path = path
        try:
            self.text = path.read_text(encoding="utf-8")
        except FileNotFoundError:
            raise InputError("no such file", where=str(path)) from None
        except (OSError, UnicodeDecodeError) as exc:
            raise InputError(f"cannot read: {exc}", where=str(path)) from None
        try:
            self.data = tomllib.loads(self.text)
        except tomllib.TOMLDecodeError as exc:
            msg = str(exc)
            m = re.search(r"\(at line (\d+), column (\d+)\)", msg)
            where = f"{path}:{m.group(1)}" if m else str(path)
            msg = re.sub(r"\s*\(at line \d+, column \d+\)", "", msg)
            raise InputError(f"malformed TOML: {msg}", where=where) from None

    def error(self, message: str, key: str | None = None, table: str | None = None) -> InputError:
        line = _line_of(self.text, key, table) if key else None
        return InputError(message, where=f"{self.path}:{line}" if line else str(self.path))

    def table(self, name: str, *, required: bool = True) -> dict[str, Any]:
        value = self.data.get(name)
        if value is None:
            if required:
                raise self.error(f"missing required table [{name}]")
            return {}
        if not isinstance(value, dict):
            raise self.error(f"[{name}] must be a table", key=name)
        return value

    def get(self, table: str, key: str, kind: type | tuple[type, ...], default: Any = ...) -> Any:
        tbl = self.data.get(table, {})
        if not isinstance(tbl, dict):
            raise self.error(f"[{table}] must be a table", key=table)
        if key not in tbl:
            if default is ...:
                raise self.error(f"[{table}] needs '{key}'", key=table)
            return default
        value = tbl[key]
        kinds = kind if isinstance(kind, tuple) else (kind,)
        ok = not (isinstance(value, bool) and bool not in kinds) and isinstance(value, kinds)
        if not ok:
            names = " or ".join(k.__name__ for k in kinds)
            raise self.error(f"[{table}] {key} must be {names}, not {value!r}", key, table)
        return value


def _check_keys(src: _Source, table: str, data: Mapping[str, Any], allowed: set[str]) -> None:
    for key in data:
        if key not in allowed:
            raise src.error(
                f"[{table}] has unknown key '{key}' (allowed: {', '.join(sorted(allowed))})",
                key,
                table,
            )


# --------------------------------------------------------------------------- catalogs


def catalog_dirs() -> list[Path]:
    """Where platform catalogs are looked up: $MUSKU_KNOBS_PATH, the source tree, the wheel."""
    import os

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


def _cdp_splits(ways: int) -> tuple[str, ...]:
    return ("off",) + tuple(f"{d}:{ways - d}" for d in range(1, ways))


def load_platform(name_or_path: str | Path) -> Platform:
    """Load a catalog by name (``skylake18``) or by path to a TOML file."""
    candidate = Path(name_or_path)
    path: Path | None = candidate if candidate.suffix == ".toml" and candidate.exists() else None
    if path is None:
        for d in catalog_dirs():
            p = d / f"{name_or_path}.toml"
            if p.exists():
                path = p
                break
        if path is None:
            known = ", ".join(available_platforms()) or "none found"
            raise InputError(f"unknown platform {str(name_or_path)!r} (known: {known})")
    src = _Source(path)
    plat = src.table("platform")
    name = src.get("platform", "name", str)
    vendor = src.get("platform", "vendor", str, "other")
    cores = src.get("platform", "cores", int)
    ways = src.get("platform", "llc_ways", int, 0)
    if cores < 1:
        raise src.error("[platform] cores must be >= 1", "cores", "platform")
    knob_tables = src.table("knobs")
    settings: dict[str, tuple[Value, ...]] = {}
    reboot: set[str] = set()
    for knob, spec in knob_tables.items():
        table = f"knobs.{knob}"
        if knob not in KNOBS:
            raise src.error(f"unknown knob '{knob}' (knobs: {', '.join(KNOBS)})", knob)
        if not isinstance(spec, dict):
            raise src.error(f"[{table}] must be a table", knob)
        _check_keys(src, table, spec, {"settings", "reboot", "description", "ways"})
        raw = spec.get("settings")
        if raw == "splits" or (raw is None and knob == "cdp"):
            n = int(spec.get("ways", ways))
            if n < 2:
                raise src.error("cdp needs llc_ways >= 2", knob)
            values: tuple[Value, ...] = _cdp_splits(n)
        elif isinstance(raw, list) and raw:
            try:
                values = tuple(canonical_value(knob, v) for v in raw)
            except (TypeError, ValueError) as exc:
                raise src.error(f"[{table}] {exc}", "settings", table) from None
        else:
            raise src.error(f"[{table}] needs a non-empty 'settings' list", knob)
        if len(set(values)) != len(values):
            raise src.error(f"[{table}] lists a setting twice", "settings", table)
        settings[knob] = values
        if spec.get("reboot", False):
            reboot.add(knob)
    stock_raw = src.table("stock")
    stock = _configuration(src, "stock", stock_raw, settings)
    facts = {k: v for k, v in plat.items() if k not in {"name", "vendor", "cores", "llc_ways"}}
    return Platform(
        name=name,
        description=str(plat.get("description", "")),
        vendor=vendor,
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
        if knob not in KNOBS:
            raise src.error(
                f"[{table}] unknown knob '{knob}' (knobs: {', '.join(KNOBS)})", knob, table
            )
        if knob not in allowed:
            raise src.error(
                f"[{table}] knob '{knob}' is not in the platform's catalog", knob, table
            )
        try:
            v = canonical_value(knob, value)
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

_TOP = {
    "experiment",
    "service",
    "platform",
    "stock",
    "production",
    "sweep",
    "metric",
    "guardrails",
    "statistics",
    "hosts",
    "threading",
}

_THREADING_KEYS = {
    "cotune",
    "service",
    "loads",
    "models",
    "workers",
    "duration_s",
    "warmup_s",
    "admin",
    "admin_port_file",
    "load_data",
}


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
    src: _Source, service: str, backend: str, hosts: Any = None
) -> ThreadingSection | None:
    """The ``[threading]`` table (docs/experiment.md), validated with file:line errors."""
    if "threading" not in src.data:
        return None
    tbl = src.table("threading")
    _check_keys(src, "threading", tbl, _THREADING_KEYS)
    cotune = src.get("threading", "cotune", bool, False)
    name = src.get("threading", "service", str, service)
    if not name:
        raise src.error("[threading] service must not be empty", "service", "threading")

    def num_list(key: str, default: tuple[Any, ...], kind: type) -> tuple[Any, ...]:
        raw = src.get("threading", key, list, list(default))
        for v in raw:
            ok = not isinstance(v, bool) and (
                isinstance(v, int | float) if kind is float else isinstance(v, int)
            )
            if not ok:
                what = "numbers" if kind is float else "integers"
                raise src.error(f"[threading] {key} must be a list of {what}, not {v!r}", key,
                                "threading")  # fmt: skip
        return tuple(float(v) if kind is float else v for v in raw)

    loads = num_list("loads", DEFAULT_LOADS, float)
    workers = num_list("workers", DEFAULT_WORKERS, int)
    models = src.get("threading", "models", list, list(MODELS))
    for m in models:
        if m not in MODELS:
            raise src.error(
                f"[threading] unknown threading model {m!r} (models: {', '.join(MODELS)})",
                "models",
                "threading",
            )
    num = (int, float)
    spec = CotuneSpec(
        service=name,
        loads=loads,
        models=tuple(models),
        workers=workers,
        duration_s=float(src.get("threading", "duration_s", num, 3.0)),
        warmup_s=float(src.get("threading", "warmup_s", num, 0.5)),
        admin=src.get("threading", "admin", str, ""),
        admin_port_file=src.get("threading", "admin_port_file", str, ""),
        load_data=src.get("threading", "load_data", str, ""),
    )
    problem = spec.problem()
    if problem:
        first = problem.split()[0]
        key = {"unknown": "models", "give": "admin_port_file"}.get(first, first)
        raise src.error(f"[threading] {problem}", key, "threading")
    per_host = backend == "agent" and _per_host_midtiers(hosts)
    if (
        cotune
        and backend in ("agent", "local")
        and not (spec.admin or spec.admin_port_file or per_host)
    ):
        raise src.error(
            f'[threading] cotune on {backend} hosts needs admin = "host:port" or '
            "admin_port_file (where each host's mid-tier answers the Admin RPC; agent hosts "
            "may instead each give midtier_admin or midtier_admin_port_file in [hosts])",
            "cotune",
            "threading",
        )
    if cotune and backend in ("agent", "local") and not spec.load_data and name != "setalgebra":
        raise src.error(
            f"[threading] cotune of {name} needs load_data (the load generator's data on the "
            "hosts; only Set Algebra's is generated)",
            "cotune",
            "threading",
        )
    return ThreadingSection(cotune=cotune, spec=spec)


def load_experiment(path: str | Path) -> Experiment:
    """Parse and validate an experiment file. Raises InputError with file:line."""
    src = _Source(Path(path))
    data = src.data
    for key in data:
        if key not in _TOP:
            raise src.error(f"unknown table [{key}] (allowed: {', '.join(sorted(_TOP))})", key)

    name = src.get("experiment", "name", str)
    description = src.get("experiment", "description", str, "")

    # platform
    plat_tbl = src.table("platform")
    _check_keys(src, "platform", plat_tbl, {"catalog", "settings"})
    catalog = src.get("platform", "catalog", str)
    try:
        platform = load_platform(catalog)
    except InputError as exc:
        if exc.where is None:
            raise src.error(exc.message, "catalog", "platform") from None
        raise

    # service
    svc = src.table("service")
    _check_keys(src, "service", svc, {"name", "knobs", "tolerates_reboot", "uses_shp"})
    svc_knobs = src.get("service", "knobs", list, list(platform.settings))
    for k in svc_knobs:
        if not isinstance(k, str) or k not in KNOBS:
            raise src.error(
                f"[service] unknown knob {k!r} (knobs: {', '.join(KNOBS)})", "knobs", "service"
            )
        if k not in platform.settings:
            raise src.error(
                f"[service] knob '{k}' is not available on platform '{platform.name}'",
                "knobs",
                "service",
            )
    uses_shp = src.get("service", "uses_shp", bool, "shp" in svc_knobs)
    if not uses_shp and "shp" in svc_knobs:
        svc_knobs = [k for k in svc_knobs if k != "shp"]
    service = Service(
        name=src.get("service", "name", str),
        knobs=tuple(k for k in KNOBS if k in svc_knobs),
        tolerates_reboot=src.get("service", "tolerates_reboot", bool, True),
        uses_shp=uses_shp,
    )

    # space: catalog settings, optionally narrowed by [platform.settings]
    narrowed = plat_tbl.get("settings", {})
    if not isinstance(narrowed, dict):
        raise src.error("[platform.settings] must be a table", "settings", "platform")
    space: dict[str, tuple[Value, ...]] = {}
    for knob in service.knobs:
        allowed = platform.settings[knob]
        if knob in narrowed:
            lst = narrowed[knob]
            if not isinstance(lst, list) or not lst:
                raise src.error(
                    f"[platform.settings] {knob} must be a non-empty list",
                    knob,
                    "platform.settings",
                )
            chosen = _configuration(src, "platform.settings", {knob: lst[0]}, platform.settings)
            del chosen
            vals = []
            for v in lst:
                vals.append(
                    _configuration(src, "platform.settings", {knob: v}, platform.settings)[knob]
                )
            space[knob] = tuple(vals)
        else:
            space[knob] = allowed
    for knob in narrowed:
        if knob not in service.knobs:
            raise src.error(
                f"[platform.settings] knob '{knob}' is not one of the service's knobs",
                knob,
                "platform.settings",
            )

    # stock and production
    stock = platform.stock.merged(
        _configuration(src, "stock", src.table("stock", required=False), platform.settings)
    )
    prod_raw = src.table("production", required=False)
    production = stock.merged(_configuration(src, "production", prod_raw, platform.settings))

    # sweep
    sweep = src.table("sweep", required=False)
    _check_keys(src, "sweep", sweep, {"mode", "baseline", "search_rounds", "scan"})
    mode_s = src.get("sweep", "mode", str, "independent")
    try:
        mode = SweepMode(mode_s)
    except ValueError:
        raise src.error(
            f"[sweep] mode {mode_s!r} is not one of independent, exhaustive, search",
            "mode",
            "sweep",
        ) from None
    baseline = src.get("sweep", "baseline", str, "production")
    if baseline not in ("production", "stock"):
        raise src.error("[sweep] baseline must be 'production' or 'stock'", "baseline", "sweep")
    search_rounds = src.get("sweep", "search_rounds", int, 2)
    scan = src.get("sweep", "scan", str, "unimodal")
    if scan not in ("unimodal", "full"):
        raise src.error("[sweep] scan must be 'unimodal' or 'full'", "scan", "sweep")
    if search_rounds < 1:
        raise src.error("[sweep] search_rounds must be >= 1", "search_rounds", "sweep")

    # metric
    met = src.table("metric", required=False)
    _check_keys(src, "metric", met, {"primary", "direction"})
    primary = src.get("metric", "primary", str, "mips")
    default_dir = (
        "lower" if primary.endswith(("_ms", "_us", "_w")) or primary.startswith("p9") else "higher"
    )
    dir_s = src.get("metric", "direction", str, default_dir)
    try:
        direction = Direction(dir_s)
    except ValueError:
        raise src.error(
            "[metric] direction must be 'higher' or 'lower'", "direction", "metric"
        ) from None

    # guardrails
    guards_raw = data.get("guardrails", [])
    if not isinstance(guards_raw, list):
        raise src.error("guardrails must be an array of tables [[guardrails]]", "guardrails")
    guardrails = []
    for g in guards_raw:
        if not isinstance(g, dict):
            raise src.error("each [[guardrails]] must be a table", "guardrails")
        _check_keys(src, "guardrails", g, {"metric", "max", "min"})
        metric = g.get("metric")
        if not isinstance(metric, str):
            raise src.error('[[guardrails]] needs metric = "name"', "guardrails")
        if ("max" in g) == ("min" in g):
            raise src.error(
                f"[[guardrails]] {metric}: give exactly one of max or min", "guardrails"
            )
        limit = g.get("max", g.get("min"))
        if isinstance(limit, bool) or not isinstance(limit, int | float):
            raise src.error(f"[[guardrails]] {metric}: limit must be a number", "guardrails")
        guardrails.append(Guardrail(metric, "<=" if "max" in g else ">=", float(limit)))

    # statistics
    st = src.table("statistics", required=False)
    _check_keys(
        src,
        "statistics",
        st,
        {"confidence", "min_effect", "warmup_s", "sample_interval_s", "sample_cap", "seed"},
    )
    num = (int, float)
    stats = StatsSettings(
        confidence=float(src.get("statistics", "confidence", num, 0.95)),
        min_effect=float(src.get("statistics", "min_effect", num, 0.005)),
        warmup_s=float(src.get("statistics", "warmup_s", num, 60.0)),
        sample_interval_s=float(src.get("statistics", "sample_interval_s", num, 1.0)),
        sample_cap=int(src.get("statistics", "sample_cap", int, 30_000)),
        seed=int(src.get("statistics", "seed", int, 0)),
    )
    checks = [
        ("confidence", 0.5 < stats.confidence < 1.0, "must be between 0.5 and 1 (exclusive)"),
        ("min_effect", 0.0 < stats.min_effect < 0.5, "must be a relative effect in (0, 0.5)"),
        ("warmup_s", stats.warmup_s >= 0.0, "must be >= 0"),
        ("sample_interval_s", stats.sample_interval_s > 0.0, "must be > 0"),
        ("sample_cap", stats.sample_cap >= 10, "must be >= 10"),
    ]
    for key, ok, why in checks:
        if not ok:
            raise src.error(f"[statistics] {key} {why}", key, "statistics")

    # hosts
    hosts_tbl = src.table("hosts", required=False)
    backend = src.get("hosts", "backend", str, "sim")
    from musku.hosts.base import BACKENDS

    if backend not in BACKENDS and ":" not in backend:
        raise src.error(
            f"[hosts] unknown backend {backend!r} (known: {', '.join(BACKENDS)})",
            "backend",
            "hosts",
        )
    hosts = HostsSpec(
        backend=backend, options={k: v for k, v in hosts_tbl.items() if k != "backend"}
    )

    threading = _threading(src, service.name, backend, hosts.options.get("hosts"))

    reboot_knobs = platform.reboot_knobs if service.tolerates_reboot else frozenset()
    spec = ComparisonSpec(
        metric=primary,
        direction=direction,
        guardrails=tuple(guardrails),
        stats=stats,
        reboot_knobs=frozenset(reboot_knobs),
    )
    return Experiment(
        name=name,
        description=description,
        path=src.path.resolve(),
        service=service,
        platform=platform,
        space=space,
        stock=stock,
        production=production,
        baseline=baseline,
        mode=mode,
        spec=spec,
        hosts=hosts,
        raw=data,
        search_rounds=search_rounds,
        scan=scan,
        threading=threading,
    )
