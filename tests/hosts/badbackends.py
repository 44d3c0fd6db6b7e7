"""Host backends that must be refused when loaded (tests/hosts/test_out_of_tree_backend.py)."""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from musku.hosts.backend import Backend
from musku.schema.hosts import HostOptions
from tests.hosts.toybackend import ToyBackend, ToyOptions


class Twice(ToyBackend):
    """Claims the built-in simulator's name."""

    name = "sim"
    options = None


class NoCheck:
    """Not a Backend subclass, and lacks most of a backend's methods."""

    name = "nocheck"
    options = None

    def open_pair(self, experiment: Any, *, seed: int = 0) -> Any:
        raise AssertionError("never opened")


class OtherOptions(HostOptions):
    BACKEND: ClassVar[str] = "other"
    backend: Literal["other"] = "other"


class WrongOptions(ToyBackend):
    """Its options model belongs to another backend name."""

    name = "wrongopts"
    options = OtherOptions


class Broken(Backend):
    """Its factory (the class) cannot even build it: abstract ``open_pair``."""

    name = "broken"


TOY_OPTIONS = ToyOptions
