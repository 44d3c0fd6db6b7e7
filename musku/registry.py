"""Registries map short names to implementations given as ``"module:Attr"`` strings.

Built-ins are aliases; a user may pass any ``"package.module:Class"`` instead.
"""

from __future__ import annotations

import importlib
import threading
from collections.abc import Callable, Mapping
from typing import Any

from musku.errors import InputError, MuskuError


def load(spec: str, aliases: Mapping[str, str], *, kind: str) -> Any:
    """Resolve ``spec`` (an alias or ``module:attr``) to the object it names."""
    target = aliases.get(spec, spec)
    if ":" not in target:
        known = ", ".join(sorted(aliases))
        raise InputError(f"unknown {kind} {spec!r} (known: {known}; or give 'module:Class')")
    module_name, _, attr = target.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise InputError(f"{kind} {spec!r}: cannot import {module_name!r}: {exc}") from None
    try:
        return getattr(module, attr)
    except AttributeError:
        raise InputError(f"{kind} {spec!r}: {module_name!r} has no {attr!r}") from None


class PluginError(InputError):
    """A plug-in that cannot be registered: a name registered twice, a required method
    missing, or its contract failed. One line naming the plug-in (exit 3), raised when the
    plug-in is loaded, before anything runs."""


class Registry:
    """Names -> plug-in objects of one kind (host backends, sweep strategies, metric samplers,
    report figures).

    A plug-in is one object with a ``name`` and the methods its kind requires. Built-ins are
    aliases (``name -> "module:attr"``); an out-of-tree plug-in is given as
    ``"package.module:attr"`` where a name goes, registered with :meth:`register`, or shipped
    as an entry point in ``group`` (``name = "package.module:attr"``). ``attr`` is the object
    itself, or a class or factory called without arguments that returns it. Resolving a
    plug-in imports its module once and checks it (:meth:`check`); its short name then works
    everywhere. ``verify(target, obj)`` checks the rest of a plug-in's shape (raises
    :class:`PluginError`).

    ``base``: the class every plug-in must derive from (checked first: "is not a ..."; a
    class that leaves methods abstract is named as lacking them, not called). With
    ``instantiate=False`` the plug-in is the class itself (a metric sampler: the agent builds
    one per host with its options), checked as a class: a subclass of ``base`` with no
    abstract method left.
    """

    def __init__(
        self,
        kind: str,
        builtins: Mapping[str, str],
        *,
        group: str,
        required: tuple[str, ...] = (),
        verify: Callable[[str, Any], None] | None = None,
        base: type | None = None,
        instantiate: bool = True,
    ) -> None:
        self.kind = kind
        self.group = group
        self.required = required
        self.verify = verify
        self.base = base
        self.instantiate = instantiate
        self._builtin = dict(builtins)
        self._targets: dict[str, str] = dict(builtins)  # name -> "module:attr"
        self._objects: dict[str, Any] = {}  # name or "module:attr" -> checked object
        self._entry_points_read = False
        self._lock = threading.RLock()

    def names(self) -> list[str]:
        """Every registered name (built-ins first), without importing any plug-in."""
        with self._lock:
            self._read_entry_points()
            return list(self._targets)

    def known(self, name: str) -> bool:
        """``name`` is registered, or a ``module:attr`` (checked when resolved)."""
        return ":" in name or name in self.names()

    def get(self, name: str) -> Any:
        """The plug-in registered as ``name`` (or named by ``module:attr``), loaded and checked.
        Unknown, unimportable or malformed: :class:`InputError` / :class:`PluginError`."""
        with self._lock:
            if name in self._objects:
                return self._objects[name]
            self._read_entry_points()
            target = self._targets.get(name, name)
            if ":" not in target:
                known = ", ".join(self._targets)
                raise InputError(
                    f"unknown {self.kind} {name!r} (known: {known}; or give 'module:attr')"
                )
            obj = self._check(target, load(target, {}, kind=self.kind))
            own = str(obj.name)
            if name != target and own != name:
                raise PluginError(
                    f"{self.kind} {target!r} is named {own!r}, registered as {name!r}"
                )
            self._claim(own, target)
            self._objects[own] = obj
            self._objects[target] = obj
            self._objects[name] = obj
            return obj

    def register(self, target: str) -> Any:
        """Register the plug-in ``"package.module:attr"`` (loaded and checked now); returns it.
        The same target twice is harmless; another plug-in claiming a registered name is
        refused (:class:`PluginError`)."""
        return self.get(target)

    def unregister(self, name: str) -> None:
        """Forget an out-of-tree plug-in (tests clean up with it); built-ins stay."""
        with self._lock:
            if name in self._builtin:
                raise InputError(f"{self.kind} {name!r} is built in")
            target = self._targets.pop(name, None)
            for key in [k for k, v in self._objects.items() if k in (name, target)]:
                del self._objects[key]

    def check(self, target: str, obj: Any) -> Any:
        """``obj`` is a ``base`` (an instance; the class itself when not ``instantiate``), has
        a string ``name`` and every required method (none of them abstract); else one line
        naming ``target`` (:class:`PluginError`)."""
        if self.base is not None and not self._is_base(obj):
            base = f"{self.base.__module__}.{self.base.__qualname__}"
            raise PluginError(f"{self.kind} {target!r} is not a {base}")
        name = getattr(obj, "name", None)
        if not isinstance(name, str) or not name or ":" in name:
            raise PluginError(f"{self.kind} {target!r} has no name (a 'name' string without ':')")
        abstract: frozenset[str] = getattr(obj, "__abstractmethods__", frozenset())
        missing = [m for m in self.required if not callable(getattr(obj, m, None)) or m in abstract]
        if missing:
            raise PluginError(
                f"{self.kind} {target!r} ({name}) lacks required method(s): {', '.join(missing)}"
            )
        if self.verify is not None:
            self.verify(target, obj)
        return obj

    def _is_base(self, obj: Any) -> bool:
        assert self.base is not None
        if self.instantiate:
            return isinstance(obj, self.base)
        return isinstance(obj, type) and issubclass(obj, self.base)

    def _check(self, target: str, found: Any) -> Any:
        if not self.instantiate:
            return self.check(target, found)
        if isinstance(found, type) and self.base is not None and not issubclass(found, self.base):
            return self.check(target, found)  # "is not a <base>", before calling it
        abstract = (
            set(getattr(found, "__abstractmethods__", ()))
            if isinstance(found, type) and self.base is not None
            else ()
        )
        if abstract:  # with a base: named before calling it ("lacks draw", not a TypeError)
            raise PluginError(
                f"{self.kind} {target!r} lacks required method(s): {', '.join(sorted(abstract))}"
            )
        if isinstance(found, type) or (callable(found) and not hasattr(found, "name")):
            try:
                found = found()
            except MuskuError:
                raise
            except Exception as exc:  # a plug-in's own bug: its one line, not a traceback
                raise PluginError(
                    f"{self.kind} {target!r}: its factory failed: {type(exc).__name__}: {exc}"
                ) from None
        return self.check(target, found)

    def _claim(self, name: str, target: str) -> None:
        prior = self._targets.get(name)
        if prior is not None and prior != target:
            raise PluginError(
                f"{self.kind} {target!r} registers the name {name!r} twice (already {prior!r})"
            )
        self._targets[name] = target

    def _read_entry_points(self) -> None:
        if self._entry_points_read:
            return
        self._entry_points_read = True
        # lazy: importlib.metadata costs ~40 ms to import; only where a plug-in is looked up
        from importlib import metadata

        for ep in metadata.entry_points(group=self.group):
            prior = self._targets.get(ep.name)
            if prior is not None and prior != ep.value:
                raise PluginError(
                    f"{self.kind} entry point {ep.value!r} registers the name {ep.name!r} "
                    f"twice (already {prior!r})"
                )
            self._targets[ep.name] = ep.value


BACKEND_METHODS = (
    "open_pair",
    "pool_names",
    "open_pool",
    "open_group",
    "group_metric",
    "open_fleet",
    "check_files",
    "prior",
    "window_s",
    "check",
)
"""What every host backend has (:class:`musku.hosts.backend.Backend`)."""

CAPABILITIES = ("reboots", "pools", "groups", "deploys", "real_hosts")


def _backend_shape(target: str, obj: Any) -> None:
    """A backend's options model (None, or a model whose ``BACKEND`` is the backend's name)
    and its capabilities (booleans)."""
    options = getattr(obj, "options", None)
    if options is not None and (
        not callable(getattr(options, "model_validate", None))
        or getattr(options, "BACKEND", None) != obj.name
    ):
        raise PluginError(
            f"host backend {target!r} ({obj.name}): options must be a "
            f"musku.schema.hosts.HostOptions model with BACKEND = {obj.name!r}"
        )
    for cap in CAPABILITIES:
        if not isinstance(getattr(obj, cap, None), bool):
            raise PluginError(
                f"host backend {target!r} ({obj.name}): capability {cap!r} must be True or False"
            )


BACKENDS = Registry(
    "host backend",
    {
        "sim": "musku.sim.backend:SimBackend",
        "agent": "musku.hosts.agent_backend:AgentBackend",
        "local": "musku.hosts.local_backend:LocalBackend",
        "qsim": "musku.qsim.backend:QsimBackend",
    },
    group="musku.backends",
    required=BACKEND_METHODS,
    verify=_backend_shape,
)
"""Host backends (``[hosts] backend``): :mod:`musku.hosts.backend`."""

STRATEGIES = Registry(
    "sweep strategy",
    {
        "independent": "musku.sweep.modes:Independent",
        "exhaustive": "musku.sweep.modes:Exhaustive",
        "search": "musku.sweep.modes:Search",
        "multiarm": "musku.sweep.modes:Multiarm",
    },
    group="musku.strategies",
    required=("check", "plan", "run"),
)
"""Sweep strategies (``[sweep] mode``): :mod:`musku.sweep.modes`."""
