"""Registries map short names to implementations given as ``"module:Attr"`` strings.

Built-ins are aliases; a user may pass any ``"package.module:Class"`` instead.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from typing import Any

from musku.errors import InputError


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
