"""A small, fully controlled host pair for the A/B tester's unit tests.

Per window and host ``h``::

    mips = level(config_h) * (1 + bias * h) * load(t) * warm_h(t) * exp(x_h(t))

- ``load(t)``: common to both hosts: a slow sine plus white jitter (``load_sd``);
- ``x_h``: AR(1) with coefficient ``phi`` and stationary std ``sigma`` per window;
- ``warm_h(t) = 1 - amp * exp(-(t - t_apply_h) / tau)`` after host ``h``'s configuration
  changed (a host whose configuration is unchanged keeps its state);
- ``load_sensitivity``: host 1's throughput scales with ``load ** s`` on top, a host bias that
  drifts with the slowly varying load (it does not cancel in the ratio);
- ``p99_ms`` moves against mips: ``p99_base * p99_level(config) / (mips ratio) * noise``;
- windows listed in ``invalid`` (global window indices) come back with ``valid=False`` and a
  wild metric value, like a window during which someone else changed a knob.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable

import numpy as np
from scipy.signal import lfilter

from musku.domain import Configuration, Sample
from musku.hosts.base import Host, HostPair


class FakeHost(Host):
    def __init__(self, name: str, config: Configuration) -> None:
        self.name = name
        self.config = config

    def configuration(self) -> Configuration:
        return self.config


class FakePair(HostPair):
    def __init__(
        self,
        level: Callable[[Configuration], float] | None = None,
        *,
        seed: int = 0,
        bias: float = 0.003,
        phi: float = 0.5,
        sigma: float = 0.01,
        load_sd: float = 0.05,
        load_amp: float = 0.1,
        load_period_s: float = 7200.0,
        warm_amp: float = 0.0,
        warm_tau_s: float = 30.0,
        apply_s: float = 2.0,
        reboot_s: float = 0.0,
        reboot_knobs: Iterable[str] = (),
        p99_base: float = 10.0,
        p99_level: Callable[[Configuration], float] | None = None,
        invalid: Iterable[int] = (),
        initial: Configuration | None = None,
        threading_models: tuple[str, str] = ("", ""),
        load_sensitivity: float = 0.0,
    ) -> None:
        cfg = initial or Configuration()
        self.hosts: tuple[FakeHost, FakeHost] = (FakeHost("fake0", cfg), FakeHost("fake1", cfg))
        self.level = level or (lambda c: 1.0)
        self.p99_level = p99_level or (lambda c: 1.0)
        self.rng = np.random.default_rng(seed)
        self.bias = bias
        self.phi = phi
        self.sigma = sigma
        self.load_sd = load_sd
        self.load_amp = load_amp
        self.load_period_s = load_period_s
        self.phase = float(self.rng.uniform(0, 2 * math.pi))
        self.warm_amp = warm_amp
        self.warm_tau_s = warm_tau_s
        self.apply_s = apply_s
        self.reboot_s = reboot_s
        self.reboot_knobs = frozenset(reboot_knobs)
        self.p99_base = p99_base
        self.invalid = set(invalid)
        self.threading_models = threading_models
        self.load_sensitivity = load_sensitivity
        self.t = 0.0
        self.count = 0  # windows measured so far
        self.warm_start = np.full(2, -1e9)
        self.x = self.rng.standard_normal(2) * sigma
        self.applied: list[tuple[Configuration, Configuration]] = []
        self.initial = cfg

    def restore(self) -> None:
        for host in self.hosts:  # back at the baseline (HostPair contract), no time spent
            host.config = self.initial

    def now(self) -> float:
        return self.t

    def apply(self, configs: tuple[Configuration, Configuration]) -> float:
        cost = 0.0
        for h, cfg in enumerate(configs):
            changed = self.hosts[h].config.diff(cfg)
            if not changed:
                continue
            c = self.apply_s + (self.reboot_s if self.reboot_knobs & changed.keys() else 0.0)
            self.hosts[h].config = cfg
            self.warm_start[h] = self.t + c
            cost = max(cost, c)
        self.applied.append((configs[0], configs[1]))
        self.t += cost
        return cost

    def window(self, seconds: float) -> tuple[Sample, Sample]:
        return self.windows(seconds, 1)[0]

    def windows(self, seconds: float, count: int) -> list[tuple[Sample, Sample]]:
        if count == 0:
            return []
        ends = self.t + seconds * np.arange(1, count + 1)
        mid = ends - seconds / 2
        load = 1.0 + self.load_amp * np.sin(2 * math.pi * mid / self.load_period_s + self.phase)
        load = load * np.exp(self.load_sd * self.rng.standard_normal(count))
        e = self.rng.standard_normal((count, 2)) * self.sigma * math.sqrt(1 - self.phi**2)
        x, _ = lfilter([1.0], [1.0, -self.phi], e, axis=0, zi=(self.phi * self.x)[None, :])
        self.x = x[-1].copy()
        age = mid[:, None] - self.warm_start[None, :]
        warm = 1.0 - self.warm_amp * np.exp(-np.maximum(age, 0.0) / self.warm_tau_s)
        lv = np.array([self.level(h.config) for h in self.hosts])
        bias = np.array([1.0, 1.0 + self.bias])
        ratio = bias * warm * np.exp(x)
        # host 1 responds a little more to the load: a host bias that drifts with it
        ratio[:, 1] *= load**self.load_sensitivity
        mips = 1000.0 * lv * ratio * load[:, None]
        pl = np.array([self.p99_level(h.config) for h in self.hosts])
        p99 = self.p99_base * pl / ratio * np.exp(0.02 * self.rng.standard_normal((count, 2)))
        out: list[tuple[Sample, Sample]] = []
        for i in range(count):
            bad = (self.count + i) in self.invalid
            pair = []
            for h in (0, 1):
                m = float(mips[i, h]) * (5.0 if bad else 1.0)
                pair.append(
                    Sample(
                        host=self.hosts[h].name,
                        t=float(ends[i]),
                        duration=seconds,
                        metrics={"mips": m, "p99_ms": float(p99[i, h])},
                        valid=not bad,
                        note="knob drift" if bad else "",
                    )
                )
            out.append((pair[0], pair[1]))
        self.count += count
        self.t = float(ends[-1])
        return out

    def threading(self) -> tuple[str, str]:
        return self.threading_models


def freq_level(effect: float) -> Callable[[Configuration], float]:
    """Throughput level: ``1 + effect`` when core_freq is 2.2 GHz, else 1."""

    def level(c: Configuration) -> float:
        return 1.0 + effect if c.get("core_freq") == 2.2 else 1.0

    return level


A = Configuration.of(core_freq=2.0)
B = Configuration.of(core_freq=2.2)
