"""The ``qsim`` host backend: ``musku sweep`` against a queueing model (docs/qsim.md).

``[hosts] backend = "qsim"`` with ``model = "path/to/model.toml"`` runs each host's windows
through the queueing network: the knobs act on the model, the metrics come from the engine.

- ``core_freq`` (GHz): every service's core frequency; each stage's time scales by its own
  ``dvfs_scale`` s as ``1 - s + s f_base / f`` (f_base: the machine's ``freq_base_ghz``);
- ``uncore_freq`` (GHz): every stage's time scales by ``1 - k + k u_stock / u`` (k the option
  ``uncore_scale``, default 0.1; u_stock the experiment's stock uncore frequency);
- ``core_count``: each machine keeps that many cores for services (its interrupt cores apart);
  instances wanting more cores than that share them (threads-to-cores mapping).

Other knobs are not modelled: an experiment that sweeps them is refused (exit status 3).
Each configuration is simulated once (``sim_seconds`` of simulated time, seeded from the pair's
seed and the configuration); every window then reports its figures times the documented host
noise: a lognormal factor of relative standard deviation ``noise`` (default 2 %) per metric and
window, plus a fixed ``host_bias`` on host B's throughput. Metrics: ``qps``, ``p50_ms``,
``p99_ms``, ``mean_ms`` and ``qos_violation_rate`` (the share of requests slower than
``qos_ms``, default 1 ms). Options: model, qps, sim_seconds, noise, host_bias, qos_ms,
uncore_scale.
"""

from __future__ import annotations

import hashlib
import math
import random
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from musku.domain import Configuration, Sample
from musku.errors import InputError
from musku.hosts.base import Host, HostPair
from musku.knob_spec import by_resource, knob_names, spec_of
from musku.qsim.engine import simulate
from musku.qsim.model import QsimModel, normalise, parse, read_model
from musku.qsim.overrides import with_overrides
from musku.schema.tomlpos import Positions

RESOURCES = ("core_ghz", "uncore_ghz", "cores")
"""What the model predicts the effect of; a knob is modelled when its spec sets one."""


def modelled() -> tuple[str, ...]:
    """The knobs whose effect the qsim backend predicts (by their specs' ``resource``)."""
    return tuple(k for k in knob_names() if spec_of(k).resource in RESOURCES)


OPTIONS = ("model", "qps", "sim_seconds", "noise", "host_bias", "qos_ms", "uncore_scale")


class QsimHost(Host):
    def __init__(self, name: str, config: Configuration) -> None:
        self.name = name
        self._config = config

    def configuration(self) -> Configuration:
        return self._config


class QsimPair(HostPair):
    """Two hosts whose service is a queueing model; seeded and reproducible."""

    def __init__(
        self,
        model: QsimModel,
        pos: Positions,
        path: Path,
        baseline: Configuration,
        *,
        seed: int = 0,
        qps: float | None = None,
        sim_seconds: float = 1.0,
        noise: float = 0.02,
        host_bias: float = 0.0,
        qos_ms: float = 1.0,
        uncore_scale: float = 0.1,
        uncore_stock: float | None = None,
    ) -> None:
        self.model, self._pos, self._path = model, pos, path
        self.seed, self.qps, self.sim_seconds = seed, qps, sim_seconds
        self.noise, self.host_bias, self.qos_ms = noise, host_bias, qos_ms
        self.uncore_scale, self.uncore_stock = uncore_scale, uncore_stock
        self.hosts = (QsimHost("qsim-a", baseline), QsimHost("qsim-b", baseline))
        self._initial = (baseline, baseline)
        self._t = 0.0
        self._cache: dict[Configuration, dict[str, float]] = {}
        self._rng = random.Random(seed)

    def now(self) -> float:
        return self._t

    def apply(self, configs: tuple[Configuration, Configuration]) -> float:
        if len(configs) != 2:
            raise InputError("apply takes one configuration per host")
        merged = [h.configuration().merged(c) for h, c in zip(self.hosts, configs, strict=True)]
        for cfg in merged:
            self.document(cfg)  # validates before anything changes
        for host, cfg in zip(self.hosts, merged, strict=True):
            assert isinstance(host, QsimHost)
            host._config = cfg
        return 0.0

    def document(self, cfg: Configuration) -> dict[str, Any]:
        """The engine document of the model under a configuration."""
        doc = knob_document(
            self.model, self._pos, self._path, by_resource(cfg.as_dict()),
            uncore_scale=self.uncore_scale, uncore_stock=self.uncore_stock,
        )  # fmt: skip
        return with_overrides(doc, qps=self.qps, duration_s=self.sim_seconds)

    def figures(self, cfg: Configuration) -> dict[str, float]:
        """The model's figures under ``cfg`` (simulated once per configuration)."""
        if cfg not in self._cache:
            doc = self.document(cfg)
            key = hashlib.sha256(repr(cfg.settings).encode()).digest()
            doc["seed"] = (self.seed * 1_000_003 + int.from_bytes(key[:4], "big")) % (2**63)
            r = simulate(doc)
            lat = r["latency"]
            total = sum(c for _, c in r["latency_buckets"]) or 1
            slow = sum(c for ub, c in r["latency_buckets"] if ub > self.qos_ms * 1000)
            self._cache[cfg] = {
                "qps": r["throughput_qps"],
                "mean_ms": lat["mean_us"] / 1000,
                "p50_ms": lat["p50_us"] / 1000,
                "p99_ms": lat["p99_us"] / 1000,
                "qos_violation_rate": slow / total if not r["saturated"] else 1.0,
            }
        return self._cache[cfg]

    def window(self, seconds: float) -> tuple[Sample, Sample]:
        if not (isinstance(seconds, int | float) and math.isfinite(seconds) and seconds > 0):
            raise InputError(f"window length must be a positive number of seconds, not {seconds!r}")
        self._t += seconds
        out = []
        for h, host in enumerate(self.hosts):
            base = self.figures(host.configuration())
            metrics = {}
            for name, v in base.items():
                factor = math.exp(self._rng.gauss(0.0, self.noise) - self.noise**2 / 2)
                if name == "qps" and h == 1:
                    factor *= 1 + self.host_bias
                metrics[name] = v * factor if name != "qos_violation_rate" else min(1.0, v * factor)
            out.append(Sample(host=host.name, t=self._t, duration=float(seconds), metrics=metrics))
        return out[0], out[1]

    def restore(self) -> None:
        self.apply(self._initial)

    def describe(self) -> Mapping[str, Any]:
        return {
            "hosts": [h.name for h in self.hosts],
            "backend": "qsim",
            "model": str(self._path),
            "seed": self.seed,
            "noise": self.noise,
            "host_bias": self.host_bias,
            "qos_ms": self.qos_ms,
        }


def knob_document(
    m: QsimModel,
    pos: Positions,
    path: Path,
    d: Mapping[str, object],
    *,
    uncore_scale: float = 0.1,
    uncore_stock: float | None = None,
) -> dict[str, Any]:
    """The normalised engine document of model ``m`` with the resources ``d`` (``cores``,
    ``core_ghz``, ``uncore_ghz``: :func:`musku.knob_spec.by_resource` of a configuration) set
    as the module says; uncore only with a stock uncore frequency to scale against. The one
    knob-to-model mapping of the backend and of ``musku qsim predict``."""
    machines = list(m.machines)
    services = list(m.services)
    if "cores" in d:
        n = int(d["cores"])  # type: ignore[call-overload]
        machines = [mc.model_copy(update={"cores": mc.irq_cores + min(n, mc.cores - mc.irq_cores)})
                    for mc in m.machines]  # fmt: skip
        avail = {mc.name: mc.cores - mc.irq_cores for mc in machines}
        services = []
        for s in m.services:
            names = s.machines or [machines[0].name]
            room = min(avail[x] for x in names if x in avail) if not s.irq else 10**9
            want = s.cores_per_instance or s.threads
            services.append(s.model_copy(update={"cores_per_instance": min(want, room)}))
    if "core_ghz" in d:
        f = float(d["core_ghz"])  # type: ignore[arg-type]
        services = [s.model_copy(update={"freq_ghz": f}) for s in services]
    model = m.model_copy(update={"machines": machines, "services": services})
    doc = normalise(model, pos, path)
    if "uncore_ghz" in d and uncore_stock:
        u = float(d["uncore_ghz"])  # type: ignore[arg-type]
        for s in doc["services"]:
            s["time_scale"] = 1 - uncore_scale + uncore_scale * uncore_stock / u
    return doc


def _num(opts: Mapping[str, Any], name: str, default: float | None, where: str) -> float | None:
    v = opts.get(name, default)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v) or v < 0:
        raise InputError(f"[hosts] {name} must be a number >= 0, not {v!r}", where=where)
    return float(v)


def open_pair(experiment: Any, seed: int = 0) -> QsimPair:
    """The ``qsim`` backend factory (``[hosts] backend = "qsim"``, ``model = ...``)."""
    opts = experiment.hosts.options
    where = str(experiment.path)
    unknown = set(opts) - set(OPTIONS)
    if unknown:
        raise InputError(f"[hosts] unknown qsim option(s) {', '.join(sorted(unknown))} "
                         f"(allowed: {', '.join(OPTIONS)})", where=where)  # fmt: skip
    model_opt = opts.get("model")
    if not isinstance(model_opt, str) or not model_opt:
        raise InputError('[hosts] backend "qsim" needs model = "path/to/model.toml"', where=where)
    other = sorted(set(experiment.space) - set(modelled()))
    if other:
        raise InputError(f"the qsim backend models {', '.join(modelled())}; this experiment also "
                         f"sweeps {', '.join(other)}", where=where)  # fmt: skip
    path = experiment.resolve(model_opt)
    model, pos = parse(read_model(path), path)
    normalise(model, pos, path)  # errors now, with file:line
    stock = by_resource(experiment.stock.as_dict()).get("uncore_ghz")
    qps = _num(opts, "qps", None, where)
    return QsimPair(
        model, pos, path, experiment.baseline_config,
        seed=seed,
        qps=qps if qps else None,
        sim_seconds=_num(opts, "sim_seconds", 1.0, where) or 1.0,
        noise=_num(opts, "noise", 0.02, where) or 0.0,
        host_bias=_num(opts, "host_bias", 0.0, where) or 0.0,
        qos_ms=_num(opts, "qos_ms", 1.0, where) or 1.0,
        uncore_scale=_num(opts, "uncore_scale", 0.1, where) or 0.0,
        uncore_stock=float(stock) if isinstance(stock, int | float) else None,
    )  # fmt: skip
