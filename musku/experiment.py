"""Experiment files (TOML) and platform knob catalogs (``knobs/*.toml``).

The format is documented in docs/experiment.md; examples live in ``experiments/``.
Every problem is an :class:`~musku.errors.InputError` naming the file and, where it can, the line.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from musku.cotune_spec import DEFAULT_LOADS, DEFAULT_WORKERS, MIDTIER_KEYS, MODELS, CotuneSpec
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
from musku.inputfiles import (
    MAX_LABEL_CHARS,
    MAX_NAME_CHARS,
    MAX_PATH_CHARS,
    parse_toml,
    read_text,
    safe_exists,
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


def _header_name(stripped: str) -> str | None:
    """The table name of a ``[table]`` or ``[[table]]`` header line, else None. A plain scan:
    a regular expression here backtracked cubically on a line of ``[`` and spaces."""
    if not stripped.startswith("["):
        return None
    inner = stripped[2:] if stripped.startswith("[[") else stripped[1:]
    end = inner.find("]")
    name = inner[:end].strip() if end > 0 else ""
    return name or None


def _is_key_line(stripped: str, key: str) -> bool:
    """Whether ``stripped`` starts ``key =`` or ``"key" =``."""
    rest = stripped[1:] if stripped.startswith('"') else stripped
    if not rest.startswith(key):
        return False
    rest = rest[len(key) :]
    rest = rest[1:] if rest.startswith('"') else rest
    return rest.lstrip().startswith("=")


def _line_of(text: str, key: str, table: str | None = None) -> int | None:
    """Best-effort line number of ``key = ...`` (inside ``[table]`` when given), in time
    linear in the size of the text (tomllib keeps no positions)."""
    in_table = table is None
    for number, line in enumerate(text.splitlines(), start=1):
        stripped = line.strip()
        name = _header_name(stripped)
        if name is not None:
            if table is not None:
                in_table = name == table
            if table is None and (key == name or name.endswith("." + key)):
                return number
            continue
        if in_table and _is_key_line(stripped, key):
            return number
    return None


class _Source:
    """A parsed TOML file plus what is needed to point at lines in it."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.text = read_text(path)
        self.data = parse_toml(self.text, str(path))

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


MAX_CORES = 4096
"""Most cores a catalog may declare."""

MAX_LLC_WAYS = 64
"""Most LLC ways a catalog may declare (a resctrl capacity bitmask is at most 64 bits)."""

MAX_SHP = 1 << 24
"""Most static huge pages a setting may reserve."""

MAX_GHZ = 10.0
"""Highest core or uncore frequency setting, GHz."""

MAX_SEED = (1 << 63) - 1
"""Seeds are in 0..2**63-1 (they seed numpy's SeedSequence and are stored as BIGINT)."""


def _finite(value: Any) -> bool:
    return not isinstance(value, bool) and isinstance(value, int | float) and math.isfinite(value)


def _label(src: _Source, table: str, key: str, value: str, limit: int) -> str:
    if not value.strip():
        raise src.error(f"[{table}] {key} must not be empty", key, table)
    if len(value) > limit:
        raise src.error(
            f"[{table}] {key} is {len(value):,} characters long (the limit is {limit})", key, table
        )
    return value


def _canonical(knob: str, value: object, *, cores: int, ways: int) -> Value:
    """A setting in canonical form, refusing what a host cannot take: a frequency that is not
    a finite number of GHz in (0, 10], a core count outside 1..cores, a CDP split with
    non-ASCII digits or that does not add up to the LLC's ways, a negative huge page count.
    Raises ValueError/TypeError like :func:`canonical_value`."""
    if knob == "cdp" and isinstance(value, str) and value != "off":
        data, sep, code = value.partition(":")
        if not (sep and data.isascii() and code.isascii() and data.isdigit() and code.isdigit()):
            raise ValueError(f"cdp takes 'off' or 'DATA:CODE' ways such as '6:5', not {value!r}")
        if len(data) > 3 or len(code) > 3 or int(data) < 1 or int(code) < 1:
            raise ValueError(f"cdp {value!r}: data and code each need 1 or more ways")
        if ways and int(data) + int(code) != ways:
            raise ValueError(f"cdp {value!r} does not split the LLC's {ways} ways")
    freq = knob in ("core_freq", "uncore_freq")
    if freq and isinstance(value, str) and value != "turbo" and not value.isascii():
        raise ValueError(f"{knob} takes a frequency in GHz, not {value!r}")
    v = canonical_value(knob, value)
    if knob in ("core_freq", "uncore_freq") and not isinstance(v, str):
        if not (math.isfinite(v) and 0.0 < v <= MAX_GHZ):
            raise ValueError(f"{knob} {value!r} is not a frequency in (0, {MAX_GHZ:g}] GHz")
    elif knob == "core_count" and not 1 <= int(v) <= cores:
        raise ValueError(f"core_count {value!r} is not in 1..{cores} (the platform's cores)")
    elif knob == "shp" and not 0 <= int(v) <= MAX_SHP:
        raise ValueError(f"shp {value!r} is not in 0..{MAX_SHP}")
    return v


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
    src = _Source(path)
    plat = src.table("platform")
    name = _label(src, "platform", "name", src.get("platform", "name", str), MAX_LABEL_CHARS)
    vendor = src.get("platform", "vendor", str, "other")
    cores = src.get("platform", "cores", int)
    ways = src.get("platform", "llc_ways", int, 0)
    if not 1 <= cores <= MAX_CORES:
        raise src.error(f"[platform] cores must be in 1..{MAX_CORES}", "cores", "platform")
    if not 0 <= ways <= MAX_LLC_WAYS:
        raise src.error(f"[platform] llc_ways must be in 0..{MAX_LLC_WAYS}", "llc_ways", "platform")
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
        n = spec.get("ways", ways)
        if isinstance(n, bool) or not isinstance(n, int) or not 0 <= n <= MAX_LLC_WAYS:
            raise src.error(
                f"[{table}] ways must be an integer in 2..{MAX_LLC_WAYS}", "ways", table
            )
        if not isinstance(spec.get("reboot", False), bool):
            raise src.error(f"[{table}] reboot must be true or false", "reboot", table)
        if raw == "splits" or (raw is None and knob == "cdp"):
            if knob != "cdp":
                raise src.error(f'[{table}] settings = "splits" is for cdp only', "settings", table)
            if n < 2:
                raise src.error("cdp needs llc_ways >= 2", knob)
            values: tuple[Value, ...] = _cdp_splits(n)
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
            ok = _finite(v) if kind is float else not isinstance(v, bool) and isinstance(v, int)
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
    for key in ("duration_s", "warmup_s"):
        if not _finite(src.get("threading", key, num, 0.0)):
            raise src.error(f"[threading] {key} must be a finite number", key, "threading")
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


HOST_OPTIONS = {
    "sim": {"model", "host_bias", "noise_scale"},
    "agent": {
        "hosts",
        "ssh_user",
        "ssh_port",
        "remote_command",
        "identity_file",
        "known_hosts",
        "connect_timeout_s",
        "lease_s",
    },
    "local": {
        "settle_s",
        "lease_s",
        "socket",
        "state_dir",
        "workload",
        "stats_file",
        "arena_mib",
        "madvise",
        "agent_sample_interval_s",
    },
}
"""Each built-in backend's ``[hosts]`` options (a ``module:factory`` backend checks its own)."""

_HOST_NUMBERS = {
    # key: (lowest, highest) of a finite number
    "host_bias": (-0.5, 0.5),
    "noise_scale": (0.0, 100.0),
    "connect_timeout_s": (0.1, 600.0),
    "lease_s": (1.0, 3600.0),
    "settle_s": (0.0, 600.0),
    "agent_sample_interval_s": (0.01, 10.0),
    "arena_mib": (8, 1 << 20),
}
_HOST_PATHS = {"model", "identity_file", "known_hosts", "socket", "state_dir", "stats_file"}


def _check_host_options(src: _Source, backend: str, options: Mapping[str, Any]) -> None:
    """A built-in backend's options, checked as its factory would, without opening a host,
    so that ``musku check`` refuses what ``musku sweep`` would."""
    allowed = HOST_OPTIONS.get(backend)
    if allowed is None:
        return
    if backend == "sim" and not isinstance(options.get("model"), str):
        raise src.error("[hosts] backend 'sim' needs model = \"path/to/model.toml\"", "hosts")
    for key, value in options.items():
        if key not in allowed:
            raise src.error(
                f"[hosts] unknown option '{key}' for the {backend} backend "
                f"(allowed: backend, {', '.join(sorted(allowed))})",
                key,
                "hosts",
            )
        if key in _HOST_NUMBERS:
            lo, hi = _HOST_NUMBERS[key]
            if not _finite(value) or not lo <= value <= hi:
                raise src.error(f"[hosts] {key} must be a number in [{lo:g}, {hi:g}]", key, "hosts")
        if key in _HOST_PATHS and (
            not isinstance(value, str) or not value or len(value) > MAX_PATH_CHARS or "\0" in value
        ):
            raise src.error(
                f"[hosts] {key} must be a file name of 1..{MAX_PATH_CHARS} characters", key, "hosts"
            )
    if backend == "agent":
        from musku.hosts.agent import _host_options

        try:
            names = [h.name for h in _host_options(options)]
        except InputError as exc:
            raise src.error(exc.message, "hosts", "hosts") from None
        if any(len(n) > 255 for n in names):  # hosts.name is a VARCHAR(255)
            raise src.error("[hosts] a host name is longer than 255 characters", "hosts", "hosts")
        cmd = options.get("remote_command", ["musku"])
        if not isinstance(cmd, list) or not cmd or not all(isinstance(c, str) and c for c in cmd):
            raise src.error("[hosts] remote_command must be a list of strings", "remote_command",
                            "hosts")  # fmt: skip
        for key in ("ssh_user",):
            if key in options and not isinstance(options[key], str):
                raise src.error(f"[hosts] {key} must be a string", key, "hosts")
    elif backend == "local":
        if options.get("workload", "builtin") not in ("builtin", "none"):
            raise src.error(
                "[hosts] workload must be 'builtin' or 'none' (a service already running)",
                "workload",
                "hosts",
            )
        if not isinstance(options.get("madvise", False), bool):
            raise src.error("[hosts] madvise must be true or false", "madvise", "hosts")


def check_host_files(exp: Experiment) -> None:
    """What the backend's factory reads before it opens a host, read and checked the same
    way, without opening one: for ``sim``, the model file against the experiment. ``musku
    check`` calls this, so that it refuses what ``musku sweep`` would (nothing is simulated
    or written)."""
    if exp.hosts.backend != "sim":
        return
    from musku.sim.model import SimModel

    where = str(exp.path)
    model = SimModel.load(exp.resolve(str(exp.hosts.options["model"])), space=exp.space)
    for cfg in (exp.stock, exp.production):
        for knob, value in cfg.settings:
            if model.knobs.get(knob) and value not in model.knobs[knob].throughput:
                raise InputError(
                    f"model {model.source} does not model the experiment's {knob}={value!r}",
                    where=where,
                )
    if exp.cotune is not None and model.threading is None:
        raise InputError(
            f"[threading] cotune = true, but the sim model {model.source} has no [threading] "
            "section (which threading serves each configuration best)",
            where=where,
        )


def _check_exhaustive(exp: Experiment) -> None:
    """An exhaustive sweep over :data:`~musku.sweep.strategies.EXHAUSTIVE_LIMIT`
    configurations is refused here, by ``check`` and ``sweep`` alike, before anything is
    recorded (the strategy repeats the check for experiments built in code)."""
    if exp.mode is not SweepMode.EXHAUSTIVE:
        return
    from musku.sweep.strategies import EXHAUSTIVE_LIMIT

    size = math.prod(len(exp.space[k]) for k in exp.service.knobs)
    if size > EXHAUSTIVE_LIMIT:
        raise InputError(
            f"exhaustive sweep of {exp.name} would compare {size:,} configurations "
            f'(limit {EXHAUSTIVE_LIMIT}): narrow [platform.settings] or use mode = "search"',
            where=str(exp.path),
        )


def load_experiment(path: str | Path) -> Experiment:
    """Parse and validate an experiment file. Raises InputError with file:line."""
    src = _Source(Path(path))
    data = src.data
    for key in data:
        if key not in _TOP:
            raise src.error(f"unknown table [{key}] (allowed: {', '.join(sorted(_TOP))})", key)

    _check_keys(src, "experiment", src.table("experiment"), {"name", "description"})
    name = _label(src, "experiment", "name", src.get("experiment", "name", str), MAX_NAME_CHARS)
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
        name=_label(src, "service", "name", src.get("service", "name", str), MAX_LABEL_CHARS),
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
    primary = _label(src, "metric", "primary", src.get("metric", "primary", str, "mips"), 100)
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
        if not math.isfinite(limit):
            raise src.error(f"[[guardrails]] {metric}: limit must be a finite number", "guardrails")
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
        ("seed", stats.seed >= 0, "must be >= 0"),
        # upper limits: an infinite warm-up or interval would never end a window
        ("warmup_s", stats.warmup_s <= 86400.0, "must be at most 86400 (a day)"),
        ("sample_interval_s", 1e-3 <= stats.sample_interval_s <= 3600.0, "must be in 0.001..3600"),
        ("sample_cap", stats.sample_cap <= 10_000_000, "must be at most 10000000"),
        ("seed", stats.seed <= MAX_SEED, f"must be at most {MAX_SEED}"),
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
    _check_host_options(src, backend, hosts.options)

    reboot_knobs = platform.reboot_knobs if service.tolerates_reboot else frozenset()
    spec = ComparisonSpec(
        metric=primary,
        direction=direction,
        guardrails=tuple(guardrails),
        stats=stats,
        reboot_knobs=frozenset(reboot_knobs),
    )
    experiment = Experiment(
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
    _check_exhaustive(experiment)
    return experiment
