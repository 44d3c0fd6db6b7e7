"""A host backend from outside the musku package: two toy hosts on a virtual clock whose
throughput a documented formula gives (THP ``always`` makes them ``speedup`` faster, ``never``
half that slower), with seeded log-normal noise. musku's code names it nowhere: it plugs in
as ``[hosts] backend = "tests.hosts.toybackend:ToyBackend"`` (docs/architecture.md "How to
add a backend"; tests/hosts/test_out_of_tree_backend.py)."""

from __future__ import annotations

import math
import random
from collections.abc import Mapping
from typing import Annotated, Any, ClassVar, Literal

from pydantic import Field

from musku.domain import Configuration, Sample
from musku.errors import UnsupportedError
from musku.hosts.backend import Backend, Prior
from musku.hosts.base import Host, HostPair
from musku.schema.document import bounds
from musku.schema.hosts import HostOptions, parse_options

TARGET = "tests.hosts.toybackend:ToyBackend"
APPLY_S = 5.0


class ToyOptions(HostOptions):
    """``backend = "toy"``'s ``[hosts]`` options."""

    BACKEND: ClassVar[str] = "toy"
    backend: Literal["toy"] = "toy"
    speedup: Annotated[float, bounds(minimum=0.0, maximum=1.0)] = Field(
        default=0.1, description="how much faster THP 'always' makes a host (relative)"
    )
    noise: Annotated[float, bounds(minimum=0.0, maximum=0.5)] = 0.01


class ToyHost(Host):
    def __init__(self, name: str, config: Configuration) -> None:
        self.name = name
        self.config = config

    def configuration(self) -> Configuration:
        return self.config


class ToyPair(HostPair):
    persistent = False

    def __init__(self, opts: ToyOptions, baseline: Configuration, seed: int) -> None:
        self.opts = opts
        self.hosts = (ToyHost("toy-a", baseline), ToyHost("toy-b", baseline))
        self.baseline = baseline
        self.rng = random.Random(seed)
        self.clock = 0.0

    def now(self) -> float:
        return self.clock

    def apply(self, configs: tuple[Configuration, Configuration]) -> float:
        for cfg in configs:
            if cfg.as_dict().get("thp") not in (None, "always", "madvise", "never"):
                raise UnsupportedError(f"toy hosts cannot run thp={cfg.as_dict().get('thp')}")
        changed = any(h.config != c for h, c in zip(self.hosts, configs, strict=True))
        for h, c in zip(self.hosts, configs, strict=True):
            h.config = c
        took = APPLY_S if changed else 0.0
        self.clock += took
        return took

    def _qps(self, host: ToyHost) -> float:
        thp = host.config.as_dict().get("thp")
        gain = {"always": self.opts.speedup, "never": -self.opts.speedup / 2}.get(str(thp), 0.0)
        return 1000.0 * (1.0 + gain) * math.exp(self.rng.gauss(0.0, self.opts.noise))

    def window(self, seconds: float) -> tuple[Sample, Sample]:
        self.clock += seconds
        a, b = (
            Sample(h.name, self.clock, seconds, {"mips": self._qps(h), "qps": self._qps(h)})
            for h in self.hosts
        )
        return a, b

    def restore(self) -> None:
        for h in self.hosts:
            h.config = self.baseline

    def describe(self) -> Mapping[str, Any]:
        return {"hosts": [h.name for h in self.hosts], "backend": "toy"}


class ToyBackend(Backend):
    """Two toy hosts: one pair, no pools, groups or deployments."""

    name = "toy"
    options = ToyOptions

    def open_pair(self, experiment: Any, *, seed: int = 0) -> ToyPair:
        opts = parse_options(ToyOptions, experiment.hosts.options, str(experiment.path))
        return ToyPair(opts, experiment.baseline_config, seed)

    def prior(self, experiment: Any) -> Prior | None:
        noise = float(experiment.hosts.options.get("noise", 0.01))
        return Prior(
            noise_sd=math.sqrt(2.0) * noise,
            noise_source="the toy formula's noise",
            apply_s=APPLY_S,
            reboot_s=0.0,
        )
