"""Knob specs: what musku knows about a knob besides how to set it, and the one list of knobs.

Each knob module declares ``SPEC = KnobSpec(...)`` next to its :class:`~musku.knobs.base.Knob`
class (which points at it with ``spec = SPEC``): the value kind, the sweep order, how a value
is parsed, canonicalised, checked against a platform and formatted, whether its settings are
ordered (unimodal scans walk them), its per-knob limits, its default for "needs a reboot", and
the columns it shows in the analysts' ``configurations`` view. The rest of musku looks the spec
up (:func:`spec_of`) instead of testing knob names.

This module imports nothing from musku but :mod:`musku.errors`: it is in the base layer
(docs/architecture.md, "Layers"), below the model that uses it at import time. A spec is loaded on first use by importing its knob module; the built-in knob
modules import only the standard library and musku's own light modules.

The registry: the built-in knobs by alias (:data:`BUILTIN`), plus out-of-tree knobs given as
``"package.module:Class"`` (the class's ``spec`` names the knob). They are registered by
:func:`register_knob`, by naming them where a knob name is expected (a platform catalog's
``[knobs."package.module:Class"]``, ``Configuration.of``), or by an installed distribution's
``musku.knobs`` entry point (name = knob name, value = ``"package.module:Class"``).
"""

from __future__ import annotations

import enum
import importlib
import logging
import math
import re
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from musku.errors import InputError

log = logging.getLogger(__name__)

Value = int | float | str
"""A knob value: a JSON-able primitive, one canonical form per knob (``musku.domain``)."""


class Kind(enum.Enum):
    """How a knob's values look."""

    GHZ = "ghz"  # a frequency in GHz (float), or "turbo"
    COUNT = "count"  # a non-negative integer (cores, pages...)
    CHOICE = "choice"  # a name (a mode, a named configuration from the catalog)
    WAYS = "ways"  # "off" or "DATA:CODE" cache ways


MAX_GHZ = 10.0
"""Highest frequency setting a catalog or experiment may name, GHz."""


@dataclass(frozen=True)
class Column:
    """One column a knob contributes to the analysts' wide ``configurations`` view.

    ``type`` is the SQL type (``float``, ``int``, ``bool``, ``text``); ``source`` says how it
    is computed from the knob's row in ``configuration_settings``: ``number`` (its numeric
    value, NULL for a name such as "turbo"), ``text`` (its canonical text), ``is:LITERAL``
    (true when the text is LITERAL, false otherwise, NULL when unset), ``part:N`` (the N-th
    ``:``-separated integer of the text, NULL when there is none)."""

    name: str
    type: str
    source: str


@dataclass(frozen=True)
class Msr:
    """A model-specific register a knob reads, and the only bits it may write
    (``write_mask``; 0 = read-only). :class:`musku.hostfs.HostFS`'s MSR allow-list is the
    union of the registered knobs' registers."""

    register: int
    name: str
    write_mask: int = 0


@dataclass(frozen=True)
class Support:
    """Result of a knob's ``probe`` (:meth:`musku.knobs.base.Knob.probe`): supported, or the
    reason why not (a typed answer). Defined here, with the specs, so that
    :func:`musku.knobs.probe_all` builds one without importing the knob base."""

    supported: bool
    reason: str = ""
    backend: str = ""  # which mechanism would be used: "cpufreq", "msr", "resctrl", "sysfs", ...
    details: dict[str, object] = field(default_factory=dict)
    settings: tuple[Value, ...] = ()  # settings this host can take, when the probe can tell
    # a knob taking any integer in [low, high] (SHP's page count) instead of a list
    settings_range: tuple[int, int] | None = None
    reboot: bool = False  # applying needs a reboot in this mode


@dataclass(frozen=True)
class KnobSpec:
    """Everything musku needs to know about a knob's values (not how to set them)."""

    name: str
    kind: Kind
    order: int = 1000  # sweep order: lower first; ties by name
    description: str = ""
    choices: tuple[str, ...] = ()  # CHOICE: the only names allowed (empty: any name)
    low: int = 0  # COUNT: smallest value a setting may take
    high: int | None = None  # COUNT: largest (None: no limit beyond high_is_cores)
    high_is_cores: bool = False  # COUNT: at most the platform's cores
    ordered: bool | None = None  # unimodal scans walk its settings (default: GHZ and COUNT)
    needs_reboot: bool = False  # default when a catalog does not say (``reboot = true``)
    # a reboot knob that can also be set live, without a reboot (core_count's cpuset/hotplug
    # mode): ``[sweep] reboot_knobs = "scan-live"`` may scan it that way (docs/experiment.md)
    live_mechanism: bool = False
    service_flag: str = ""  # a [service] flag that must be true to sweep it ("uses_shp")
    columns: tuple[Column, ...] = ()  # the wide view's columns (default: from the kind)
    msrs: tuple[Msr, ...] = ()  # registers it reads or writes (the HostFS allow-list)
    # what it sets, for models that predict its effect (the qsim backend): "cores" (active
    # cores), "core_ghz", "uncore_ghz"; empty: a model must be told (sim model files)
    resource: str = ""
    # "module:attr" of its fake-kernel rules (KernelRule objects) for the knob tests' fake
    # host trees (musku.testing.fakehost); loaded only by the fake kernel
    fake_kernel: str = ""
    extra: dict[str, object] = field(default_factory=dict, compare=False, hash=False)

    def __post_init__(self) -> None:
        if not re.fullmatch(r"[a-z][a-z0-9_]{0,62}", self.name):
            raise InputError(
                f"knob name {self.name!r} must be lower-case letters, digits and _ "
                "(it names a database column)"
            )

    # ------------------------------------------------------------------ derived

    @property
    def is_ordered(self) -> bool:
        """True when the settings have an order a scan can walk (frequencies, counts)."""
        if self.ordered is not None:
            return self.ordered
        return self.kind in (Kind.GHZ, Kind.COUNT)

    @property
    def view_columns(self) -> tuple[Column, ...]:
        if self.columns:
            return self.columns
        n = self.name
        if self.kind is Kind.GHZ:
            return (Column(n, "float", "number"), Column(f"{n}_turbo", "bool", "is:turbo"))
        if self.kind is Kind.COUNT:
            return (Column(n, "int", "number"),)
        if self.kind is Kind.WAYS:
            return (
                Column(n, "text", "text"),
                Column(f"{n}_data_ways", "int", "part:0"),
                Column(f"{n}_code_ways", "int", "part:1"),
            )
        return (Column(n, "text", "text"),)

    # ------------------------------------------------------------------ values

    def canonical(self, value: object) -> Value:
        """The canonical primitive for ``value`` (raises ValueError/TypeError)."""
        n = self.name
        if self.kind is Kind.GHZ:
            if isinstance(value, str):
                if value == "turbo":
                    return value
                value = float(value)
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise TypeError(f"{n} takes a frequency in GHz, not {value!r}")
            return round(float(value), 3)
        if self.kind is Kind.COUNT:
            if isinstance(value, bool) or not isinstance(value, int):
                if isinstance(value, float) and value.is_integer():
                    return int(value)
                raise TypeError(f"{n} takes an integer, not {value!r}")
            return int(value)
        if self.kind is Kind.WAYS:
            if not isinstance(value, str):
                raise TypeError(f"{n} takes 'off' or 'DATA:CODE' ways, not {value!r}")
            if value == "off":
                return value
            data, sep, code = value.partition(":")
            if not sep or not data.isdigit() or not code.isdigit():
                raise ValueError(
                    f"{n} takes 'off' or 'DATA:CODE' ways such as '6:5', not {value!r}"
                )
            return f"{int(data)}:{int(code)}"
        if not isinstance(value, str):
            raise TypeError(f"{n} takes a name, not {value!r}")
        if self.choices and value not in self.choices:
            raise ValueError(f"{n} takes one of {', '.join(self.choices)}, not {value!r}")
        return value

    def check(self, value: object, *, cores: int, ways: int) -> Value:
        """A setting a platform with ``cores`` cores and ``ways`` LLC ways can take, in
        canonical form: stricter than :meth:`canonical` (ASCII digits only, limits)."""
        n = self.name
        if self.kind is Kind.WAYS and isinstance(value, str) and value != "off":
            data, sep, code = value.partition(":")
            ascii_digits = data.isascii() and code.isascii() and data.isdigit() and code.isdigit()
            if not (sep and ascii_digits):
                raise ValueError(
                    f"{n} takes 'off' or 'DATA:CODE' ways such as '6:5', not {value!r}"
                )
            if len(data) > 3 or len(code) > 3 or int(data) < 1 or int(code) < 1:
                raise ValueError(f"{n} {value!r}: data and code each need 1 or more ways")
            if ways and int(data) + int(code) != ways:
                raise ValueError(f"{n} {value!r} does not split the LLC's {ways} ways")
        ghz_text = self.kind is Kind.GHZ and isinstance(value, str)
        if ghz_text and not str(value).isascii():
            raise ValueError(f"{n} takes a frequency in GHz, not {value!r}")
        v = self.canonical(value)
        if self.kind is Kind.GHZ and not isinstance(v, str):
            if not (math.isfinite(v) and 0.0 < v <= MAX_GHZ):
                raise ValueError(f"{n} {value!r} is not a frequency in (0, {MAX_GHZ:g}] GHz")
        elif self.kind is Kind.COUNT:
            high = cores if self.high_is_cores else self.high
            if not int(v) >= self.low or (high is not None and int(v) > high):
                where = " (the platform's cores)" if self.high_is_cores else ""
                top = "" if high is None else str(high)
                raise ValueError(f"{n} {value!r} is not in {self.low}..{top}{where}")
        return v

    def coerce(self, text: str) -> Value:
        """A value typed on the command line (``KNOB=VALUE``), in canonical form."""
        if self.kind is Kind.COUNT:
            return self.canonical(int(text))
        if self.kind is Kind.GHZ and text != "turbo":
            return self.canonical(float(text))
        return self.canonical(text)

    def format(self, value: Value) -> str:
        """Human form: '2.2GHz', '6d:5c', 'always'."""
        if self.kind is Kind.GHZ and not isinstance(value, str):
            return f"{value:g}GHz"
        if self.kind is Kind.WAYS and value != "off":
            data, _, code = str(value).partition(":")
            return f"{data}d:{code}c"
        return str(value)

    def default_settings(self, ways: int) -> tuple[Value, ...] | None:
        """Settings when a catalog lists none (``settings = "splits"`` for WAYS knobs)."""
        if self.kind is Kind.WAYS:
            return ("off",) + tuple(f"{d}:{ways - d}" for d in range(1, ways))
        return None

    # ------------------------------------------------------------------ storage

    @staticmethod
    def db_text(value: Value) -> str:
        """The text stored in ``configuration_settings.value``."""
        return repr(value) if isinstance(value, float) else str(value)

    @staticmethod
    def db_number(value: Value) -> float | None:
        """The number stored in ``configuration_settings.number`` (NULL for names)."""
        if isinstance(value, bool) or not isinstance(value, int | float):
            return None
        return float(value)


# --------------------------------------------------------------------------- the registry

BUILTIN: dict[str, str] = {
    "core_freq": "musku.knobs.core_freq:CoreFreqKnob",
    "uncore_freq": "musku.knobs.uncore_freq:UncoreFreqKnob",
    "core_count": "musku.knobs.core_count:CoreCountKnob",
    "cdp": "musku.knobs.cdp:CdpKnob",
    "prefetch": "musku.knobs.prefetch:PrefetchKnob",
    "thp": "musku.knobs.thp:ThpKnob",
    "shp": "musku.knobs.shp:ShpKnob",
}
"""The built-in knobs (alias -> ``module:Class``), in sweep order."""

ENTRY_POINT_GROUP = "musku.knobs"

CONFIGURED: dict[str, str] = {"sysfs": "musku.knobs.sysfs"}
"""Knob kinds one catalog line defines (``[knobs.NAME] kind = "sysfs"``): kind -> the module
implementing it (:mod:`musku.knobs.sysfs` is the model), which provides ``check(fields)``
(raises :class:`LineError`), ``configure(name, fields)`` (registers the knob, returns its
name) and ``define(json)`` (the knob's class from the JSON of its target ``kind:{...}``, so
any process can load a knob a database or a message names). Imported on first use."""


class LineError(ValueError):
    """A catalog line defining a knob is wrong: ``key`` is the key to point at."""

    def __init__(self, key: str, message: str) -> None:
        super().__init__(message)
        self.key = key


def _configured(kind: str) -> Any:
    if kind not in CONFIGURED:
        raise LineError("kind", f"kind must be one of {', '.join(CONFIGURED)}, not {kind!r}")
    return importlib.import_module(CONFIGURED[kind])


def check_line(kind: str, fields: Mapping[str, object]) -> None:
    """Raise :class:`LineError` when ``fields`` (``path``, ``settings``...) cannot define a
    knob of ``kind``; what one line can tell (the loaders check the rest)."""
    _configured(kind).check(fields)


def configure_knob(kind: str, name: str, fields: Mapping[str, object]) -> str:
    """Register the knob ``name`` a catalog line of ``kind`` defines; its registered name.
    :class:`LineError` for a bad line, :class:`InputError` when ``name`` is another knob."""
    return str(_configured(kind).configure(name, fields))


_lock = threading.RLock()
_targets: dict[str, str] = dict(BUILTIN)  # knob name -> "module:Class"
_specs: dict[str, KnobSpec] = {}
_classes: dict[str, type] = {}  # knob name -> its class, once imported or built
_entry_points_read = False


def _import_class(target: str) -> type:
    module_name, sep, attr = target.partition(":")
    if module_name in CONFIGURED and attr.startswith("{"):
        built = _configured(module_name).define(attr)
        if not isinstance(built, type):
            raise InputError(f"knob {target!r} does not name a class")
        return built
    if not sep or not module_name or not attr:
        raise InputError(f"knob {target!r}: give 'package.module:Class'")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise InputError(f"knob {target!r}: cannot import {module_name!r}: {exc}") from None
    try:
        cls = getattr(module, attr)
    except AttributeError:
        raise InputError(f"knob {target!r}: {module_name!r} has no {attr!r}") from None
    if not isinstance(cls, type):
        raise InputError(f"knob {target!r} does not name a class")
    return cls


def _spec_of_class(target: str, cls: type) -> KnobSpec:
    spec = getattr(cls, "spec", None)
    if not isinstance(spec, KnobSpec):
        raise InputError(f"knob {target!r} has no 'spec' (a musku.knob_spec.KnobSpec)")
    return spec


def register_knob(target: str) -> KnobSpec:
    """Register the out-of-tree knob ``"package.module:Class"``; returns its spec.

    Registering the same class twice is harmless; a second class claiming a registered name
    is refused (:class:`InputError`)."""
    with _lock:
        for name, known in _targets.items():
            if known == target:
                return spec_of(name)
        cls = _import_class(target)
        spec = _spec_of_class(target, cls)
        if spec.name in _targets:
            raise InputError(
                f"knob {target!r} is named {spec.name!r}, already {_targets[spec.name]!r}"
            )
        _targets[spec.name] = target
        _specs[spec.name] = spec
        _classes[spec.name] = cls
        return spec


def unregister_knob(name: str) -> None:
    """Forget an out-of-tree knob (tests that register one clean up with it); built-ins stay."""
    with _lock:
        if name in BUILTIN:
            raise InputError(f"knob {name!r} is built in")
        _targets.pop(name, None)
        _specs.pop(name, None)
        _classes.pop(name, None)


def _read_entry_points() -> None:
    global _entry_points_read
    if _entry_points_read:
        return
    _entry_points_read = True
    # lazy: importlib.metadata costs ~40 ms to import, and `musku --help` imports this module
    from importlib import metadata

    for ep in metadata.entry_points(group=ENTRY_POINT_GROUP):
        if ep.name not in _targets:
            _targets[ep.name] = ep.value


def resolve(name: str) -> str:
    """The knob name for ``name``: itself when registered, the spec's name for a
    ``module:Class`` (registering it). Raises KeyError for an unknown name."""
    if name in _targets:
        return name
    if ":" in name:
        return register_knob(name).name
    with _lock:
        _read_entry_points()
    if name in _targets:
        return name
    raise KeyError(name)


def spec_of(name: str) -> KnobSpec:
    """The spec of knob ``name`` (a registered name or ``module:Class``); KeyError if unknown."""
    spec = _specs.get(name)
    if spec is not None:
        return spec
    with _lock:
        name = resolve(name)
        spec = _specs.get(name)
        if spec is None:
            target = _targets[name]
            cls = _import_class(target)
            spec = _spec_of_class(target, cls)
            if spec.name != name:
                raise InputError(
                    f"knob {target!r} is registered as {name!r} but named {spec.name!r}"
                )
            _specs[name] = spec
            _classes[name] = cls
        return spec


def class_of(name: str) -> type:
    """The class implementing knob ``name`` (a registered name or ``module:Class``);
    KeyError if unknown, :class:`InputError` if it cannot be loaded."""
    cls = _classes.get(name)
    if cls is not None:
        return cls
    with _lock:
        spec_of(name)
        name = resolve(name)
        cls = _classes.get(name)
        if cls is None:
            cls = _classes[name] = _import_class(_targets[name])
        return cls


def is_knob(name: object) -> bool:
    """True for a registered knob name (or a loadable ``module:Class``)."""
    if not isinstance(name, str):
        return False
    try:
        resolve(name)
    except (KeyError, InputError):
        return False
    return True


def target_of(name: str) -> str:
    """The ``module:Class`` implementing knob ``name``."""
    return _targets[resolve(name)]


def by_resource(values: Mapping[str, Value]) -> dict[str, Value]:
    """``values`` (knob -> value) keyed by the resource each knob sets (its spec's
    ``resource``); knobs without one are left out."""
    out: dict[str, Value] = {}
    for knob, value in values.items():
        resource = spec_of(knob).resource
        if resource:
            out[resource] = value
    return out


def knob_names() -> tuple[str, ...]:
    """Every registered knob: the built-ins, then out-of-tree knobs, in sweep order."""
    with _lock:
        _read_entry_points()
        names = []
        for name in list(_targets):
            try:
                spec_of(name)
            except InputError as exc:  # a broken installed plugin: say so, list the others
                log.warning("knob %s (%s) skipped: %s", name, _targets[name], exc.one_line())
                _targets.pop(name)
                continue
            names.append(name)
    return tuple(sorted(names, key=sort_key))


def sort_key(name: str) -> tuple[int, str]:
    """Sort key putting knobs in sweep order (the spec's order, then the name)."""
    return (spec_of(name).order, name)


class _Platform(Protocol):
    name: str
    settings: Mapping[str, tuple[Value, ...]]


def coerce_setting(platform: _Platform, knob: str, raw: str) -> Value:
    """``KNOB=VALUE`` typed on the command line -> a setting of ``platform``'s catalog.

    Raises :class:`InputError` (one line) for an unknown knob, one the catalog does not list,
    a value of the wrong form, or a setting the catalog does not offer."""
    try:
        spec = spec_of(knob)
    except KeyError:
        raise InputError(f"unknown knob {knob!r} (knobs: {known_list()})") from None
    knob = spec.name
    if knob not in platform.settings:
        raise InputError(f"knob {knob!r} is not in platform {platform.name}'s catalog")
    try:
        value = spec.coerce(raw)
    except (TypeError, ValueError) as exc:
        raise InputError(f"{knob}={raw}: {exc}") from None
    if value not in platform.settings[knob]:
        choices = ", ".join(str(v) for v in platform.settings[knob])
        raise InputError(f"{knob}={raw} is not in platform {platform.name}'s catalog ({choices})")
    return value


def known_list() -> str:
    """'core_freq, uncore_freq, ...' for error messages."""
    return ", ".join(knob_names())


__all__ = [
    "BUILTIN",
    "Column",
    "KnobSpec",
    "Kind",
    "MAX_GHZ",
    "Msr",
    "Value",
    "CONFIGURED",
    "LineError",
    "by_resource",
    "check_line",
    "class_of",
    "coerce_setting",
    "configure_knob",
    "is_knob",
    "knob_names",
    "known_list",
    "register_knob",
    "resolve",
    "sort_key",
    "spec_of",
    "target_of",
    "unregister_knob",
]
