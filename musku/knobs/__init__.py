"""Knob plugins: a registry of ``"module:Class"`` strings, loaded lazily.

``from musku.knobs import load_knob, probe_all`` imports no plugin module; each is imported when
first loaded. A user may name any ``"package.module:Class"`` implementing
:class:`musku.knobs.base.Knob` instead of a built-in alias. The registry and each knob's
self-description live in :mod:`musku.knob_spec`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from musku.errors import InputError, MuskuError
from musku.knob_spec import (
    BUILTIN,
    Support,
    class_of,
    knob_names,
    register_knob,
    resolve,
    spec_of,
)
from musku.registry import load

if TYPE_CHECKING:
    from musku.hostfs import HostFS
    from musku.knobs.base import Knob

REGISTRY: dict[str, str] = BUILTIN
"""The built-in knobs (alias -> ``module:Class``); :func:`musku.knob_spec.knob_names` lists
every registered knob, out-of-tree ones included."""


def knob_class(name: str) -> type[Knob]:
    # lazy: `import musku.knobs` loads no knob code (the base pulls in hostfs)
    from musku.knobs.base import Knob

    cls: object
    try:
        cls = class_of(name)
    except (KeyError, InputError):
        # a spec-less plugin, or registry.load explains what is wrong with it
        cls = load(name, REGISTRY, kind="knob")
    if not (isinstance(cls, type) and issubclass(cls, Knob)):
        raise InputError(f"knob {name!r} does not name a musku.knobs.base.Knob subclass")
    return cls


def load_knob(name: str, fs: HostFS, **options: object) -> Knob:
    """The knob ``name`` (alias or ``module:Class``) bound to ``fs`` with its options."""
    return knob_class(name)(fs, **options)


def probe_all(
    fs: HostFS,
    names: tuple[str, ...] | list[str] | None = None,
    **options: object,
) -> dict[str, Support]:
    """Probe every knob (or ``names``). ``options`` maps knob name -> that knob's options dict.

    Never raises for an unsupported knob: a failing probe becomes ``Support(False, reason)``.
    """
    out: dict[str, Support] = {}
    for name in names or knob_names():
        opts = options.get(name, {})
        if not isinstance(opts, dict):
            raise InputError(f"options for knob {name!r} must be a table")
        try:
            out[name] = load_knob(name, fs, **opts).probe()
        except MuskuError as exc:
            out[name] = Support(False, exc.one_line())
        except OSError as exc:
            out[name] = Support(False, f"{exc.strerror or exc}")
    return out


__all__ = [
    "REGISTRY",
    "knob_class",
    "knob_names",
    "load_knob",
    "probe_all",
    "register_knob",
    "resolve",
    "spec_of",
]
