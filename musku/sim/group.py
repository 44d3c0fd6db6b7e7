"""A simulated group of hosts running a multi-arm crossover scan.

:class:`SimGroup` is ``n`` simulated hosts driven by a :class:`musku.sim.model.SimModel`: the
model's responses (:meth:`SimModel.point`), transients (:meth:`SimModel.warmups`), timing, and
its host/noise model (docs/sim.md) extended from two hosts to ``n``. Per host ``h`` and per tick
the primary metric (MIPS) is::

    ref_mips * throughput(config_h) * (1 + bias_h) * load_h(t) * warm_h(t) * exp(x_h(t)) * outlier

- ``load_h(t) = 1 + slope_h (diurnal(t) + bursts(t) + jitter_h(t)) + share_h(t)``: one live
  load for the group (a load balancer in front of it), with the model's partial sharing: the
  per-tick jitter correlates ``host_correlation`` between hosts, slopes spread uniformly over
  ``1 +- sensitivity_spread / 2``, each host's routing share wobbles (``share_sigma``).
- ``bias_h``: a fixed bias per host, drawn ``Normal(0, bias_sd)`` (clipped to +-5 %) from the
  seed; ``bias_sd`` defaults to the model's ``host_bias``, so a group's spread of biases is that
  of a pair's.
- ``x_h``: AR(1) (``ar_phi``, ``ar_sigma``, Student-t innovations when ``innovation_df``) plus the
  slow ``wander``; outliers with ``outlier_prob``; the warm-up transients of every change.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from musku.domain import Configuration
from musku.errors import InputError
from musku.hosts.group import FloatArray
from musku.sim.model import SimModel
from musku.sim.noise import ar1

_BURST_BLOCK_S = 3600.0


class SimGroup:
    """``n_hosts`` simulated hosts under one live load, on one virtual clock. Seeded."""

    def __init__(
        self,
        model: SimModel,
        n_hosts: int,
        *,
        seed: int = 0,
        bias_sd: float | None = None,
        initial: Configuration | None = None,
        reboot_knobs: frozenset[str] = frozenset(),
    ) -> None:
        if isinstance(n_hosts, bool) or not isinstance(n_hosts, int) or n_hosts < 2:
            raise InputError(f"a group needs >= 2 hosts, not {n_hosts!r}")
        n = model.noise
        sd = abs(n.host_bias) if bias_sd is None else float(bias_sd)
        if not (math.isfinite(sd) and 0.0 <= sd < 0.1):
            raise InputError(f"bias_sd = {bias_sd!r} must be in [0, 0.1)")
        cfg = initial if initial is not None else (model.reference_config or Configuration())
        model.check(cfg)
        self.model = model
        self.n = n_hosts
        self.seed = int(seed)
        self.reboot_knobs = frozenset(reboot_knobs)
        ss = np.random.SeedSequence([self.seed, 0x6A0F])
        (bias_ss, load_ss, own_ss, host_ss, wander_ss, share_ss, out_ss, burst_ss, phase_ss) = (
            ss.spawn(9)
        )
        self.bias = np.clip(np.random.default_rng(bias_ss).normal(0.0, sd, n_hosts), -0.05, 0.05)
        self._rng_load = np.random.default_rng(load_ss)
        self._rng_own = np.random.default_rng(own_ss)
        self._rng_host = np.random.default_rng(host_ss)
        self._rng_wander = np.random.default_rng(wander_ss)
        self._rng_share = np.random.default_rng(share_ss)
        self._rng_out = np.random.default_rng(out_ss)
        self._burst_seed = int(burst_ss.generate_state(1)[0])
        self._phase = float(np.random.default_rng(phase_ss).uniform(0.0, 2 * math.pi))
        lm = n.load
        u = np.random.default_rng([self.seed, 0x510]).uniform(-0.5, 0.5, n_hosts)
        self._slope = 1.0 + lm.sensitivity_spread * u
        self._x = self._rng_host.standard_normal(n_hosts) * n.ar_sigma
        self._w = self._rng_wander.standard_normal(n_hosts) * n.wander_sd
        self._share = self._rng_share.standard_normal(n_hosts) * lm.share_sigma
        self.configs: list[Configuration] = [cfg] * n_hosts
        self._tp = np.array([model.point(cfg).throughput] * n_hosts)
        self._p99 = np.array([model.point(cfg).p99] * n_hosts)
        self._qos = np.array([model.point(cfg).qos] * n_hosts)
        # the guardrail metrics' own noise: a separate stream, so MIPS is as before
        self._rng_met = np.random.default_rng([self.seed, 0x99A])
        self.guard: dict[str, FloatArray] = {}
        self._warm: list[list[tuple[float, float, float]]] = [[] for _ in range(n_hosts)]
        if not n.start_warm and n.warmup_amplitude > 0:
            self._warm = [[(0.0, n.warmup_amplitude, n.warmup_tau_s)] for _ in range(n_hosts)]
        self._bursts: dict[int, tuple[FloatArray, FloatArray]] = {}
        self.t = 0.0
        self.applies = 0
        self.names = [f"sim-{h}" for h in range(n_hosts)]

    @property
    def tick_s(self) -> float:
        return self.model.noise.tick_s

    def apply(self, configs: Sequence[Configuration]) -> float:
        """Put host ``h`` on ``configs[h]``; the hosts change in parallel: the clock advances by
        the slowest host's apply (plus reboot) time. Returns the seconds spent."""
        if len(configs) != self.n:
            raise InputError(f"apply takes one configuration per host ({self.n})")
        for cfg in configs:
            self.model.check(cfg)
        timing = self.model.timing
        cost = 0.0
        for h, cfg in enumerate(configs):
            old = self.configs[h]
            changed = old.diff(cfg)
            if not changed:
                continue
            c = timing.apply_s + (timing.reboot_s if self.reboot_knobs & set(changed) else 0.0)
            start = self.t + c
            self._warm[h] = [(start, w.amplitude, w.tau_s) for w in self.model.warmups(old, cfg)]
            self.configs[h] = cfg
            pt = self.model.point(cfg)
            self._tp[h], self._p99[h], self._qos[h] = pt.throughput, pt.p99, pt.qos
            cost = max(cost, c)
        if cost > 0:
            self.applies += 1
            self.measure(max(1, round(cost / self.model.noise.tick_s)))  # time passes, unmeasured
        return cost

    def measure(self, count: int) -> FloatArray:
        """``count`` windows of one tick: MIPS, shape ``(count, n_hosts)``."""
        n = self.model.noise
        lm = n.load
        dt = n.tick_s
        ts: FloatArray = self.t + (np.arange(count, dtype=float) + 0.5) * dt
        dev = lm.diurnal_amplitude * np.sin(2 * math.pi * ts / lm.diurnal_period_s + self._phase)
        dev = dev + self._burst_load(ts)
        c = lm.host_correlation
        z_common = self._rng_load.standard_normal(count)
        z_own = self._rng_own.standard_normal((count, self.n))
        jitter = lm.jitter_sigma * (math.sqrt(c) * z_common[:, None] + math.sqrt(1 - c) * z_own)
        load = 1.0 + self._slope[None, :] * (dev[:, None] + jitter)
        if lm.share_sigma > 0:
            share, self._share = _ar_path(
                self._rng_share, self._share, count, dt, lm.share_sigma, lm.share_tau_s
            )
            load = load + share
        load = np.maximum(load, 0.05)
        phi = n.ar_phi
        if n.innovation_df > 0:
            df = n.innovation_df
            innov = self._rng_host.standard_t(df, (count, self.n)) * math.sqrt((df - 2.0) / df)
        else:
            innov = self._rng_host.standard_normal((count, self.n))
        e = innov * (n.ar_sigma * math.sqrt(1.0 - phi * phi))
        x = ar1(phi, e, self._x)
        self._x = x[-1].copy()
        if n.wander_sd > 0:
            w, self._w = _ar_path(self._rng_wander, self._w, count, dt, n.wander_sd, n.wander_tau_s)
            x = x + w
        warm = np.ones((count, self.n))
        for h in range(self.n):
            comps = [w for w in self._warm[h] if ts[0] - w[0] < 50.0 * w[2]]
            self._warm[h] = comps
            for start, amp, tau in comps:
                warm[:, h] -= amp * np.exp(-np.maximum(ts - start, 0.0) / tau)
        warm = np.maximum(warm, 0.05)
        u = self._rng_out.random((count, self.n, 3))
        outlier = np.where(
            u[:, :, 0] < n.outlier_prob,
            np.exp(np.where(u[:, :, 2] < 0.5, -1.0, 1.0) * n.outlier_scale * (0.5 + u[:, :, 1])),
            1.0,
        )
        ref = self.model.reference["mips"]
        mips = ref * (self._tp * (1.0 + self.bias))[None, :] * load * warm * np.exp(x) * outlier
        # the guardrail metrics of the same windows, as the simulated pair draws them
        # (musku/sim/pair.py): p99 rises with load, noise and warm-up; QoS violations with p99^3
        z = self._rng_met.standard_normal((count, self.n))
        p99_rel = (
            np.maximum(1.0 + n.p99_load_gain * (load - 1.0), 0.05)
            * np.exp(-0.5 * x + n.p99_sigma * z)
            / warm
            / np.sqrt(outlier)
        )
        p99_nom = self.model.reference["p99_ms"] * self._p99 / (1.0 + self.bias)
        self.guard = {
            "p99_ms": np.asarray(p99_nom[None, :] * p99_rel, dtype=float),
            "qos_violation_rate": np.asarray(
                np.minimum(1.0, self._qos[None, :] * p99_rel**3), dtype=float
            ),
        }
        self.t += count * dt
        return np.asarray(mips, dtype=float)

    def _burst_load(self, ts: FloatArray) -> FloatArray:
        lm = self.model.noise.load
        if lm.burst_rate_per_h <= 0 or lm.burst_amplitude <= 0 or ts.size == 0:
            return np.zeros(ts.size)
        lo, hi = float(ts[0]) - 8 * lm.burst_duration_s, float(ts[-1])
        starts, amps = [], []
        for b in range(
            math.floor(max(lo, 0.0) / _BURST_BLOCK_S), math.floor(hi / _BURST_BLOCK_S) + 1
        ):
            blk = self._bursts.get(b)
            if blk is None:
                rng = np.random.default_rng([self._burst_seed, b])
                nb = rng.poisson(lm.burst_rate_per_h * _BURST_BLOCK_S / 3600.0)
                st = np.sort(b * _BURST_BLOCK_S + rng.uniform(0, _BURST_BLOCK_S, nb))
                blk = self._bursts[b] = (st, lm.burst_amplitude * rng.uniform(0.5, 1.5, nb))
            starts.append(blk[0])
            amps.append(blk[1])
        s, a = np.concatenate(starts), np.concatenate(amps)
        age = ts[:, None] - s[None, :]
        contrib = np.where(age >= 0, np.exp(-np.maximum(age, 0) / lm.burst_duration_s), 0.0)
        return np.asarray(contrib @ a, dtype=float)


def _ar_path(
    rng: np.random.Generator, state: FloatArray, m: int, dt: float, sd: float, tau: float
) -> tuple[FloatArray, FloatArray]:
    rho = math.exp(-dt / tau)
    e = rng.standard_normal((m, state.size)) * (sd * math.sqrt(1.0 - rho * rho))
    path = ar1(rho, e, state)
    return path, path[-1].copy()
