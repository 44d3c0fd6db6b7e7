"""The ``sim`` host backend (``[hosts] backend = "sim"``): simulated pairs on a virtual clock
(:mod:`musku.sim.pair`), a ``fleet = N`` pool of them (:mod:`musku.sim.fleet`), multi-arm
groups (:class:`musku.sim.group.SimGroup`) and a deployment fleet whose hosts' state is
what the results DB says they run (:class:`SimFleet`). docs/sim.md, docs/fleet.md."""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from musku.domain import Configuration
from musku.errors import InputError, MuskuError
from musku.experiment import Experiment
from musku.hosts.backend import Backend, Fleet, GroupOpener, Prior
from musku.hosts.base import HostPair
from musku.hosts.group import HostGroup
from musku.hosts.pool import HostPool, derive_seed
from musku.schema.hosts import SimOptions, parse_options
from musku.sim.fleet import fleet_biases, host_names, open_fleet
from musku.sim.group import SimGroup
from musku.sim.model import SimModel
from musku.sim.pair import SimPair, open_pair, pair_setup


class SimBackend(Backend):
    """Simulated hosts: one pair, or a ``fleet = N`` pool of pairs."""

    name = "sim"
    options = SimOptions
    reboots = True
    pools = True
    groups = True
    deploys = True

    def open_pair(self, experiment: Experiment, *, seed: int = 0) -> SimPair:
        return open_pair(experiment, seed=seed)

    def pool_names(self, experiment: Experiment) -> list[str] | None:
        fleet = experiment.hosts.options.get("fleet")
        return None if fleet is None else host_names(int(fleet))

    def open_pool(
        self,
        experiment: Experiment,
        *,
        seed: int,
        open_pair: Callable[[Experiment, int], HostPair] | None = None,
    ) -> HostPool:
        if experiment.hosts.options.get("fleet") is not None:
            return open_fleet(experiment, seed)
        return super().open_pool(experiment, seed=seed, open_pair=open_pair)

    def open_group(
        self, experiment: Experiment, pool: HostPool, seed: int
    ) -> tuple[list[str], GroupOpener]:
        exp = experiment
        model = SimModel.load(exp.resolve(exp.hosts.options["model"]), space=exp.space)
        names = list(pool.names)
        biases = pool.biases

        def sim(hosts: list[int], knob: str, scan: int) -> HostGroup:
            g = SimGroup(
                model,
                len(hosts),
                seed=derive_seed(seed, "multiarm", knob, scan),
                initial=exp.baseline_config,
                reboot_knobs=exp.spec.reboot_knobs,
            )
            if biases is not None:  # the fleet's own hosts
                g.bias = np.asarray([biases[h] for h in hosts], dtype=float)
            g.names = [names[h] for h in hosts]
            return g

        return names, sim

    def group_metric(self, experiment: Experiment) -> str:
        return "mips"  # a simulated group's arms are compared on the model's throughput

    def open_fleet(
        self,
        experiment: Experiment,
        *,
        seed: int,
        state: Mapping[str, Configuration],
        code_version: str | None = None,
    ) -> Fleet:
        return SimFleet(experiment, seed, state)

    def check_files(self, experiment: Experiment) -> None:
        """The model file against the experiment: every stock and production setting
        modelled, and a ``[threading]`` section when co-tuning."""
        exp = experiment
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

    def prior(self, experiment: Experiment) -> Prior | None:
        """The model's noise (both hosts' AR(1)) and timing; None when the model is unreadable."""
        opt = experiment.hosts.options.get("model")
        if not isinstance(opt, str):
            return None
        try:
            model = SimModel.load(experiment.resolve(opt), space=experiment.space)
        except MuskuError:
            return None
        n = model.noise
        scale = float(experiment.hosts.options.get("noise_scale", 1.0) or 1.0)
        sd = math.sqrt(2.0) * n.ar_sigma * scale * math.sqrt((1 + n.ar_phi) / (1 - n.ar_phi))
        return Prior(
            noise_sd=sd,
            noise_source="the simulator model's noise",
            apply_s=float(model.timing.apply_s),
            reboot_s=float(model.timing.reboot_s),
        )

    def check(self, experiment: Experiment, configs: list[Configuration]) -> dict[str, Any]:
        """The model loads and models every planned setting (a fleet's hosts share it)."""
        try:
            pair = open_pair(experiment)
        except MuskuError as exc:
            return {"backend": self.name, "ok": False, "hosts": [], "error": exc.one_line()}
        try:
            info = dict(pair.describe())
        finally:
            pair.close()
        fleet = self.pool_names(experiment)
        names = [f"{fleet[0]} .. {fleet[-1]}"] if fleet else info.get("hosts", [])
        return {
            "backend": self.name,
            "ok": True,
            "hosts": [
                {
                    "name": str(h),
                    "ok": True,
                    "check": "model loaded; every planned setting modelled",
                }
                for h in names
            ],
        }


class SimFleet(Fleet):
    """A simulated fleet (``[hosts] fleet = N``; without it the pair ``sim-a``, ``sim-b``)."""

    backend = "sim"

    def __init__(
        self, experiment: Experiment, seed: int, state: Mapping[str, Configuration]
    ) -> None:
        self.setup = pair_setup(experiment)
        opts = parse_options(SimOptions, experiment.hosts.options, str(experiment.path))
        self.model_path = experiment.resolve(opts.model)
        n = self.setup.options.fleet
        if n is None:
            self.names = ["sim-a", "sim-b"]
            self.biases = [0.0, self.setup.options.host_bias or self.setup.model.noise.host_bias]
        else:
            self.names = host_names(n)
            self.biases = fleet_biases(self.setup.model, n, seed, self.setup.options.bias_sd)
        self.seed = seed
        self.baseline = self.setup.baseline
        self._config = {name: self.baseline for name in self.names}
        for name, cfg in state.items():
            if name in self._config:
                self._config[name] = self.baseline.merged(cfg)

    def code_version(self) -> str:
        digest = hashlib.sha256(self.model_path.read_bytes()).hexdigest()[:12]
        return f"sim:{self.setup.model.name}@{digest}"

    def open_pair(self, production: str, canary: str, owner: str, seed: int) -> SimPair:
        i, j = self.names.index(production), self.names.index(canary)
        rel = (1.0 + self.biases[j]) / (1.0 + self.biases[i]) - 1.0
        s = self.setup
        return SimPair(
            s.model,
            seed=derive_seed(seed, owner, production, canary),
            host_bias=rel,
            noise_scale=s.options.noise_scale,
            initial=(self._config[production], self._config[canary]),
            reboot_knobs=s.reboot_knobs,
            names=(production, canary),
            cotune=s.cotune,
        )

    def settle(self, pair: HostPair, owner: str, canary: Configuration | None) -> None:
        try:
            if canary is not None:
                self.deploy(pair.hosts[1].name, canary, owner)
        finally:
            pair.close()

    def deploy(self, name: str, config: Configuration, owner: str) -> None:
        merged = self._config[name].merged(config)
        self.setup.model.check(merged)  # refuses before anything changes
        self._config[name] = merged

    def deployed(self, name: str) -> Configuration:
        return self._config[name]

    def undeploy(self, name: str, owner: str) -> None:
        self._config[name] = self.baseline
