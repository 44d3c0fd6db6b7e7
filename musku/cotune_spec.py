"""The co-tuning part of the experiment model: the ``[threading]`` table's spec.

:class:`CotuneSpec` is what an experiment asks of co-tuning (docs/threading.md, "Co-tuning"):
the service, the training grid and where each host's mid-tier answers. The experiment loader
builds it, the controller sends it to agents with every ``apply`` (:mod:`musku.hosts.cotune`),
the agent and the simulator co-tune with it (:mod:`musku.agent.cotune`, :mod:`musku.tune.cotune`).
A value type only: nothing here imports more than the standard library and :mod:`musku.errors`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from musku.errors import InputError

MODELS: tuple[str, ...] = tuple(
    f"{leaf}-{disp}-{wait}"
    for leaf in ("sync", "async")
    for disp in ("inline", "dispatch")
    for wait in ("block", "poll")
)
"""The eight threading models of the services' framework (``--threading MODEL``)."""

DEFAULT_LOADS: tuple[float, ...] = (20.0, 100.0, 500.0, 1000.0, 2000.0)
DEFAULT_WORKERS: tuple[int, ...] = (1, 2)
RECORD_MAX = 100  # the results DB's threading_a / threading_b columns hold 100 characters

# [hosts] entry keys naming a host's own mid-tier (agent backend) -> the CotuneSpec field each sets
MIDTIER_KEYS = {"midtier_admin": "admin", "midtier_admin_port_file": "admin_port_file"}


@dataclass(frozen=True, order=True)
class Candidate:
    """One threading a training measures: a model and its pool sizes."""

    model: str
    pollers: int = 1
    workers: int = 0
    responders: int = 0

    def key(self) -> str:
        return f"{self.model} p={self.pollers} w={self.workers} r={self.responders}"

    def row(self) -> dict[str, Any]:
        return {"model": self.model, "pollers": self.pollers, "workers": self.workers,
                "responders": self.responders}  # fmt: skip

    @classmethod
    def of(cls, model: str, workers: int = 2) -> Candidate:
        if model not in MODELS:
            raise InputError(f"unknown threading model {model!r}")
        dispatch = "-dispatch-" in model
        asynchronous = model.startswith("async-")
        return cls(model, 1, workers if dispatch else 0, 1 if asynchronous else 0)


@dataclass(frozen=True)
class CotuneSpec:
    """How to co-tune a host's mid-tier: the experiment's ``[threading]`` table (docs/threading.md,
    "Co-tuning"). Sent to agents with every ``apply`` as JSON."""

    service: str
    loads: tuple[float, ...] = DEFAULT_LOADS  # training grid (offered QPS)
    models: tuple[str, ...] = MODELS  # candidate models
    workers: tuple[int, ...] = DEFAULT_WORKERS  # worker-pool sizes tried for dispatch models
    duration_s: float = 3.0  # measured seconds per (load, candidate) point
    warmup_s: float = 0.5
    admin: str = ""  # the mid-tier's Admin address on the host, "host:port"
    admin_port_file: str = ""  # or the file the mid-tier wrote its port to (--port-file)
    load_data: str = ""  # the load generator's data on the host ("" = the generated dataset)

    def candidates(self) -> list[Candidate]:
        """(model, pools) candidates: every model; dispatch models once per worker count."""
        out: list[Candidate] = []
        for m in self.models:
            if "-dispatch-" in m:
                out.extend(Candidate.of(m, w) for w in self.workers)
            else:
                out.append(Candidate.of(m))
        return out

    def points(self) -> int:
        """Measurements one training takes."""
        dispatch = sum(1 for m in self.models if "-dispatch-" in m)
        return len(self.loads) * (len(self.models) - dispatch + dispatch * len(self.workers))

    def training_s(self) -> float:
        """Host seconds one training takes (load-generator start-up included, roughly)."""
        return self.points() * (self.duration_s + self.warmup_s + 0.3)

    def to_json(self) -> dict[str, Any]:
        return {
            "service": self.service,
            "loads": list(self.loads),
            "models": list(self.models),
            "workers": list(self.workers),
            "duration_s": self.duration_s,
            "warmup_s": self.warmup_s,
            "admin": self.admin,
            "admin_port_file": self.admin_port_file,
            "load_data": self.load_data,
        }

    @classmethod
    def from_json(cls, data: object) -> CotuneSpec:
        """Parse and validate (an agent request's ``threading.spec``); InputError on bad input."""
        if not isinstance(data, Mapping):
            raise InputError("threading spec must be an object")
        unknown = set(data) - set(cls.__dataclass_fields__)
        if unknown:
            raise InputError(f"threading spec: unknown key(s) {', '.join(sorted(unknown))}")
        d = dict(data)
        if not isinstance(d.get("service"), str) or not d["service"]:
            raise InputError("threading spec needs service")
        for key in ("loads", "models", "workers"):
            if key in d:
                if not isinstance(d[key], list | tuple):
                    raise InputError(f"threading spec: {key} must be a list")
                d[key] = tuple(d[key])
        for key in ("admin", "admin_port_file", "load_data"):
            if not isinstance(d.get(key, ""), str):
                raise InputError(f"threading spec: {key} must be text")
        for key in ("duration_s", "warmup_s"):
            v = d.get(key, 0.0)
            if isinstance(v, bool) or not isinstance(v, int | float):
                raise InputError(f"threading spec: {key} must be a number")
        spec = cls(**d)
        problem = spec.problem()
        if problem:
            raise InputError(f"threading spec: {problem}")
        return spec

    def problem(self) -> str:
        """What is wrong with this spec ("" if nothing): shared by the experiment loader."""
        if not self.loads or any(
            isinstance(q, bool) or not isinstance(q, int | float) or not q > 0 for q in self.loads
        ):
            return "loads must be a non-empty list of positive QPS values"
        if len(set(self.loads)) != len(self.loads):
            return "loads lists a load twice"
        if not self.models:
            return "models must not be empty"
        for m in self.models:
            if m not in MODELS:
                return f"unknown threading model {m!r} (models: {', '.join(MODELS)})"
        if len(set(self.models)) != len(self.models):
            return "models lists a model twice"
        if not self.workers or any(
            isinstance(w, bool) or not isinstance(w, int) or not 1 <= w <= 64 for w in self.workers
        ):
            return "workers must be a non-empty list of integers in 1..64"
        if not self.duration_s > 0:
            return "duration_s must be > 0"
        if not self.warmup_s >= 0:
            return "warmup_s must be >= 0"
        if self.admin and self.admin_port_file:
            return "give admin or admin_port_file, not both"
        if self.admin and not re.fullmatch(r"[^\s:]+:\d{1,5}", self.admin):
            return f"admin must be 'host:port', not {self.admin!r}"
        return ""
