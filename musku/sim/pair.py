"""A simulated pair of "identical" hosts under the same live load, on a virtual clock.

Per host and per tick (``noise.tick_s``, 1 s by default) the measured throughput is::

    ref_mips * throughput(config) * (1 + bias_h) * load(t) * warm_h(t) * exp(x_h(t))

- ``load(t)``: live load common to both hosts: a diurnal sine, Poisson bursts decaying
  exponentially, and a little white jitter. It cancels in the hosts' ratio.
- ``bias_h``: a fixed bias between the two hosts (``hosts[1]`` is ``host_bias`` faster).
- ``warm_h(t) = 1 - A exp(-(t - t_h) / tau)``: the cold-cache transient after a change on host
  ``h`` applied (rebooted) at ``t_h``; a host whose configuration did not change keeps its state.
- ``x_h``: AR(1) noise per host with coefficient ``ar_phi`` per tick and stationary std
  ``ar_sigma``. A window longer than a tick averages its sub-steps (at most 256 per window;
  the AR coefficient is rescaled to the sub-step as ``phi ** (dt / tick_s)``).

Each window of each host is then an outlier with probability ``outlier_prob`` (log-deviation
``+-outlier_scale * U(0.5, 1.5)``). p99, the QoS-violation rate and power follow (docs/sim.md).

Random streams are separate per purpose and drawn in window order, so ``windows(s, n)`` gives
the same numbers as ``n`` calls of ``window(s)`` (up to floating-point rounding).

A model with a ``[threading]`` section gives each host a simulated mid-tier
(:class:`musku.sim.midtier.SimMidtier`): a host whose mid-tier runs another threading model than
the best one for its configuration loses ``mismatch`` of its throughput and gains
``mismatch_p99`` of p99. With co-tuning (``cotune``, the experiment's ``[threading]``), every
``apply`` co-tunes each host whose configuration changed through
:class:`musku.tune.cotune.CoTuner` (table cache, results DB, training: its host seconds are
the apply's), so each side runs its best threading; without it the mid-tiers stay on the
model's ``initial`` threading.
"""

from __future__ import annotations

import math
import shutil
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from musku.domain import Configuration, Sample, Value
from musku.errors import InputError, MuskuError, UnsupportedError
from musku.hosts.base import Host, HostPair
from musku.schema.hosts import SimOptions, parse_options
from musku.sim.midtier import SimMidtier, SimTrainer
from musku.sim.model import Point, SimModel
from musku.sim.noise import ar1
from musku.storage.protocols import TableStore
from musku.tune.cotune import (
    CoTuner,
    CotuneResult,
    CotuneSpec,
    TableCache,
    Trainer,
    describe,
    restore,
)

if TYPE_CHECKING:
    from musku.experiment import Experiment

_MAX_SUBSTEPS = 256
_BURST_BLOCK_S = 3600.0


class SimHost(Host):
    """One simulated host: its name and the configuration applied to it."""

    def __init__(self, name: str, config: Configuration) -> None:
        self.name = name
        self._config = config

    def configuration(self) -> Configuration:
        return self._config


@dataclass(frozen=True)
class WindowArrays:
    """``count`` paired windows as arrays of shape ``(count, 2)`` (column h = hosts[h])."""

    t: np.ndarray  # (count,) window end times
    duration: float
    mips: np.ndarray
    qps: np.ndarray
    p99_ms: np.ndarray
    qos_violation_rate: np.ndarray
    power_w: np.ndarray
    offered_qps: np.ndarray  # the request rate the load balancer sends each host

    def metric(self, name: str) -> np.ndarray:
        value = getattr(self, name, None)
        if not isinstance(value, np.ndarray) or name in ("t",):
            raise InputError(f"unknown sim metric {name!r}")
        return value


class SimPair(HostPair):
    """Two simulated hosts driven by a :class:`SimModel`. Seeded and reproducible."""

    persistent = False  # made anew by each run: nothing learned carries over (HostPair)

    def __init__(
        self,
        model: SimModel,
        seed: int = 0,
        host_bias: float | None = None,
        noise_scale: float = 1.0,
        initial: tuple[Configuration, Configuration] | None = None,
        reboot_knobs: frozenset[str] = frozenset(),
        names: tuple[str, str] = ("sim-a", "sim-b"),
        cotune: CotuneSpec | None = None,
        trainer: Trainer | None = None,
        table_dir: str | Path | None = None,
        start_warm: bool | None = None,
    ) -> None:
        if not noise_scale >= 0.0 or not math.isfinite(noise_scale):
            raise InputError(f"noise_scale must be >= 0, not {noise_scale!r}")
        if initial is None:
            ref = model.reference_config or Configuration()
            initial = (ref, ref)
        for cfg in initial:
            model.check(cfg)
        self.model = model
        self.seed = int(seed)
        self.reboot_knobs = frozenset(reboot_knobs)
        self.noise_scale = float(noise_scale)
        n = model.noise
        bias = n.host_bias if host_bias is None else float(host_bias)
        if not -0.5 < bias < 0.5:
            raise InputError(f"host_bias must be in (-0.5, 0.5), not {bias!r}")
        self.host_bias = bias
        self._bias = np.array([1.0, 1.0 + bias])
        self.hosts: tuple[SimHost, SimHost] = (
            SimHost(names[0], initial[0]),
            SimHost(names[1], initial[1]),
        )
        self._initial = initial
        self._t = 0.0
        # warm-up transients per host: (start, amplitude, tau); a cold start begins the
        # model's default transient at t = 0 on both hosts, a warm start has none
        self.start_warm = n.start_warm if start_warm is None else bool(start_warm)
        self._warm: list[list[tuple[float, float, float]]] = [[], []]
        if not self.start_warm and n.warmup_amplitude > 0:
            self._warm = [[(0.0, n.warmup_amplitude, n.warmup_tau_s)] for _ in range(2)]
        self._points = [model.point(initial[0]), model.point(initial[1])]
        ss = np.random.SeedSequence([self.seed, 0x5155])
        host_ss, load_ss, out_ss, met_ss, gap_ss, phase_ss = ss.spawn(6)
        self._rng_host = np.random.default_rng(host_ss)
        self._rng_load = np.random.default_rng(load_ss)
        self._rng_out = np.random.default_rng(out_ss)
        self._rng_met = np.random.default_rng(met_ss)
        self._rng_gap = np.random.default_rng(gap_ss)
        self._phase = float(np.random.default_rng(phase_ss).uniform(0.0, 2 * math.pi))
        self._burst_seed = [self.seed, 0xB0B5]
        self._bursts: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        sigma = n.ar_sigma * self.noise_scale
        # stationary start
        self._x = self._rng_gap.standard_normal(2) * sigma
        # streams of the newer noise sources (spawned after the original six, so a model
        # without them draws exactly the numbers it always did)
        own_ss, wander_ss, share_ss = ss.spawn(3)
        self._rng_own = np.random.default_rng(own_ss)
        self._rng_wander = np.random.default_rng(wander_ss)
        self._rng_share = np.random.default_rng(share_ss)
        lm = n.load
        self._slope = np.array(
            [1.0 - 0.5 * lm.sensitivity_spread, 1.0 + 0.5 * lm.sensitivity_spread]
        )
        self._w = self._rng_wander.standard_normal(2) * (n.wander_sd * self.noise_scale)
        self._share = self._rng_share.standard_normal(2) * (lm.share_sigma * self.noise_scale)
        self._simple = n.shared_load and n.innovation_df == 0 and n.wander_sd == 0
        self.applies = 0
        self.reboots = 0
        # the live mechanism (docs/sim.md "Reboot knobs set live"): reboot knobs the next
        # applies set live (no reboot: the runner sets it for a scan-live walk), and per host
        # each reboot knob's setting as booted (a live setting is one away from it)
        self.live_knobs: frozenset[str] = frozenset()
        self._boot: list[dict[str, Value]] = [
            {k: v for k, v in model.full_settings(cfg).items() if k in self.reboot_knobs}
            for cfg in initial
        ]
        self.host_reboots = [0, 0]  # reboots per host (one apply reboots a host at most once)
        self._setup_threading(model, names, initial, cotune, trainer, table_dir)

    # ----------------------------------------------------------------- threading

    def _setup_threading(
        self,
        model: SimModel,
        names: tuple[str, str],
        initial: tuple[Configuration, Configuration],
        cotune: CotuneSpec | None,
        trainer: Trainer | None,
        table_dir: str | Path | None,
    ) -> None:
        self.cotune = cotune
        self.midtiers: tuple[SimMidtier, SimMidtier] | None = None
        self.tuners: tuple[CoTuner, CoTuner] | None = None
        self.cotuned: list[CotuneResult | None] = [None, None]
        self._tuned_for: list[str | None] = [None, None]
        self._factors = [(1.0, 1.0), (1.0, 1.0)]  # (throughput, p99) of each host's threading
        self._own_table_dir: Path | None = None
        if model.threading is None:
            if cotune is not None:
                raise InputError(
                    f"sim model {model.source or model.name} has no [threading] section: "
                    "co-tuning needs one (docs/threading.md, Co-tuning)"
                )
            return
        service = cotune.service if cotune is not None else model.name
        self.midtiers = (
            SimMidtier(model, names[0], service, initial[0]),
            SimMidtier(model, names[1], service, initial[1]),
        )
        if cotune is not None:
            if table_dir is None:
                self._own_table_dir = Path(tempfile.mkdtemp(prefix="musku-sim-tables-"))
                table_dir = self._own_table_dir
            cache = TableCache(table_dir)
            # the platform under which tables are stored: tables trained on another model's
            # [threading] must never be reused
            platform = f"{model.platform or 'sim'}/sim-{model.threading.signature()}"
            train = trainer if trainer is not None else SimTrainer(model)
            self.tuners = (
                CoTuner(cotune, self.midtiers[0], train, cache, platform),
                CoTuner(cotune, self.midtiers[1], train, cache, platform),
            )
        self._update_factors()

    def _update_factors(self) -> None:
        if self.midtiers is None:
            return
        for h, mt in enumerate(self.midtiers):
            self._factors[h] = self.model.threading_factor(self.hosts[h].configuration(),
                                                           mt.running())  # fmt: skip

    def use_store(self, store: TableStore) -> None:
        if self.tuners is not None:
            for t in self.tuners:
                t.store = store

    def threading(self) -> tuple[str, str]:
        if self.midtiers is None:
            return ("", "")
        return describe(self.midtiers[0]), describe(self.midtiers[1])

    def _cotune(self, configs: list[Configuration], old: list[Configuration]) -> np.ndarray:
        """Co-tune each host whose mid-tier is not on its configuration's table yet; the host
        seconds each host spent (training). On failure (HostError / InputError from the
        co-tuner) both hosts' mid-tiers are back on what they ran at their ``old``
        configurations and the error propagates (the caller puts the knobs back)."""
        spent = np.zeros(2)
        if self.tuners is None or self.midtiers is None:
            return spent
        before = [mt.get() for mt in self.midtiers]
        tuned_before = list(self._tuned_for)
        try:
            for h, cfg in enumerate(configs):
                key = cfg.key()
                self.midtiers[h].config = cfg
                if self._tuned_for[h] == key:
                    continue
                res = self.tuners[h].cotune(cfg)
                spent[h] = res.seconds
                self.cotuned[h] = res
                self._tuned_for[h] = key
        except MuskuError:
            # the knobs go back first (a table is checked against the host's CPU count), then
            # each mid-tier that does not run what it ran before is put back on it
            for h, mt in enumerate(self.midtiers):
                mt.config = old[h]
                if replace(mt.get(), measured_qps=0.0) != replace(before[h], measured_qps=0.0):
                    restore(mt, before[h])
            self._tuned_for = tuned_before
            raise
        return spent

    def _point(self, h: int, cfg: Configuration) -> Point:
        """Host ``h``'s response at ``cfg``: reboot knobs away from their booted setting
        run live (the model's ``[knobs.<knob>.live]``)."""
        full = self.model.full_settings(cfg)
        live = frozenset(k for k, v in self._boot[h].items() if full.get(k) != v)
        return self.model.point(cfg, live=live)

    # ----------------------------------------------------------------- HostPair

    def now(self) -> float:
        return self._t

    def apply(self, configs: tuple[Configuration, Configuration]) -> float:
        if len(configs) != 2:
            raise InputError("apply takes one configuration per host")
        new = []
        for host, cfg in zip(self.hosts, configs, strict=True):
            merged = host.configuration().merged(cfg)
            self.model.check(merged)  # raises before anything changes
            new.append(merged)
        costs = np.zeros(2)
        boot_before = [dict(b) for b in self._boot]
        set_live: list[frozenset[str]] = [frozenset(), frozenset()]
        forced: list[frozenset[str]] = [frozenset(), frozenset()]
        for h, (host, cfg) in enumerate(zip(self.hosts, new, strict=True)):
            target = self.model.full_settings(cfg)
            # a setting run live that is now to be set by the reboot mechanism is a change
            relive = {
                k
                for k in self.reboot_knobs - self.live_knobs
                if target.get(k) != self._boot[h].get(k)
            }
            changed = set(host.configuration().diff(cfg)) | relive
            if not changed:
                continue
            cost = self.model.timing.apply_s
            # a reboot knob changes by a reboot unless set live; back at the booted setting
            # a live setting is undone live (the kernel command line never changed)
            rebooted = {
                k
                for k in self.reboot_knobs.intersection(changed)
                if k not in self.live_knobs and target.get(k) != self._boot[h].get(k)
            }
            set_live[h] = frozenset(self.reboot_knobs.intersection(changed) - rebooted)
            forced[h] = frozenset(relive)
            if rebooted:
                cost += self.model.timing.reboot_s
                self.reboots += 1
                self.host_reboots[h] += 1
                for k in rebooted:
                    self._boot[h][k] = target[k]
            costs[h] = cost
        t0 = self._t
        old = [h.configuration() for h in self.hosts]
        for h, cfg in enumerate(new):
            if costs[h] > 0:
                start = t0 + costs[h]
                # a change restarts the transient: what the old configuration had left of
                # its own is replaced by the new one's (cold caches, remapped heap, ...)
                self._warm[h] = [
                    (start, w.amplitude, w.tau_s)
                    for w in self.model.warmups(old[h], cfg, live=set_live[h], also=forced[h])
                ]
                self.hosts[h]._config = cfg
                self._points[h] = self._point(h, cfg)
            if self.midtiers is not None:
                self.midtiers[h].config = self.hosts[h].configuration()
        try:
            # after the knobs are applied (and verified): each side gets its best threading
            costs += self._cotune(new, old)
        except MuskuError as exc:
            # never a half-applied host: both back at their configurations, time still spent
            self._boot = boot_before
            for h, cfg in enumerate(old):
                self.hosts[h]._config = cfg
                self._points[h] = self._point(h, cfg)
                if self.midtiers is not None:
                    self.midtiers[h].config = cfg
            self._update_factors()
            used = float(costs.max())
            if used > 0:
                self._advance(used)
            raise type(exc)(f"{exc.one_line()} (both hosts rolled back)") from None
        self._update_factors()
        used = float(costs.max())
        if used > 0:
            self.applies += 1
            self._advance(used)
        return used

    def window(self, seconds: float) -> tuple[Sample, Sample]:
        n = self.model.noise
        if (
            self._simple
            and isinstance(seconds, int | float)
            and 0 < seconds <= n.tick_s * (1 + 1e-9)
            and math.isfinite(seconds)
        ):
            return self._one_window(float(seconds))
        return self.windows(seconds, 1)[0]

    def windows(self, seconds: float, count: int) -> list[tuple[Sample, Sample]]:
        """Vectorised: the numbers come from :meth:`arrays`; most of the time left is building
        the :class:`Sample` objects (use :meth:`arrays` directly where that matters)."""
        if isinstance(count, int) and count == 0:  # no windows (HostPair contract): no time
            return []
        arr = self.arrays(seconds, count)
        rows = np.stack(
            (arr.mips, arr.qps, arr.p99_ms, arr.qos_violation_rate, arr.power_w, arr.offered_qps),
            axis=-1,
        ).tolist()
        duration = float(seconds)
        base_a = {"host": self.hosts[0].name, "t": 0.0, "duration": duration}
        base_a.update(metrics=None, valid=True, note="")
        base_b = dict(base_a, host=self.hosts[1].name)
        # Sample is a frozen dataclass; filling __dict__ skips its per-field __setattr__ cost
        # and gives objects equal to Sample(host, t, duration, metrics).
        new = object.__new__
        setd = object.__setattr__
        out: list[tuple[Sample, Sample]] = []
        append = out.append
        for t, ((a0, a1, a2, a3, a4, a5), (b0, b1, b2, b3, b4, b5)) in zip(
            arr.t.tolist(), rows, strict=True
        ):
            a = new(Sample)
            da = base_a.copy()
            da["t"] = t
            da["metrics"] = {
                "mips": a0,
                "qps": a1,
                "p99_ms": a2,
                "qos_violation_rate": a3,
                "power_w": a4,
                "offered_qps": a5,
            }
            setd(a, "__dict__", da)
            b = new(Sample)
            db = base_b.copy()
            db["t"] = t
            db["metrics"] = {
                "mips": b0,
                "qps": b1,
                "p99_ms": b2,
                "qos_violation_rate": b3,
                "power_w": b4,
                "offered_qps": b5,
            }
            setd(b, "__dict__", db)
            append((a, b))
        return out

    def restore(self) -> None:
        self.apply(self._initial)

    def close(self) -> None:
        if self._own_table_dir is not None:
            shutil.rmtree(self._own_table_dir, ignore_errors=True)
            self._own_table_dir = None

    def describe(self) -> Mapping[str, Any]:
        return {
            "hosts": [h.name for h in self.hosts],
            "backend": "sim",
            "model": self.model.name,
            "model_source": self.model.source,
            "platform": self.model.platform or "",
            "seed": self.seed,
            "host_bias": self.host_bias,
            "noise_scale": self.noise_scale,
            "cotune": self.cotune.to_json() if self.cotune is not None else None,
        }

    # ----------------------------------------------------------------- the engine

    def arrays(self, seconds: float, count: int) -> WindowArrays:
        """``count`` consecutive paired windows of ``seconds`` each, as numpy arrays.
        The fast path: :meth:`windows` is this plus building :class:`Sample` objects."""
        if not (isinstance(seconds, int | float) and math.isfinite(seconds) and seconds > 0):
            raise InputError(f"window length must be > 0 seconds, not {seconds!r}")
        if isinstance(count, bool) or not isinstance(count, int) or count < 0:
            raise InputError(f"window count must be an integer >= 0, not {count!r}")
        seconds = float(seconds)
        n = self.model.noise
        ref = self.model.reference
        k = min(_MAX_SUBSTEPS, max(1, math.ceil(seconds / n.tick_s - 1e-9)))
        dt = seconds / k
        m = count * k
        t0 = self._t
        # sub-step midpoints
        ts = t0 + (np.arange(m) + 0.5) * dt
        z_load = self._rng_load.standard_normal(m)
        if n.shared_load:
            load = self._load(ts, z_load)[:, None]  # (m, 1): the same on both hosts
        else:
            load = self._host_loads(ts, z_load, dt)  # (m, 2)
        # AR(1) per host on the sub-step grid
        sigma = n.ar_sigma * self.noise_scale
        phi = n.ar_phi ** (dt / n.tick_s)
        if n.innovation_df > 0:
            df = n.innovation_df
            innov = self._rng_host.standard_t(df, (m, 2)) * math.sqrt((df - 2.0) / df)
        else:
            innov = self._rng_host.standard_normal((m, 2))
        e = innov * (sigma * math.sqrt(1.0 - phi * phi))
        if m:
            x = ar1(phi, e, self._x)
            self._x = x[-1].copy()
        else:
            x = e
        if n.wander_sd > 0 and m:
            w, self._w = self._ar_path(self._rng_wander, self._w, m, dt, n.wander_sd,
                                       n.wander_tau_s)  # fmt: skip
            x = x + w
        # warm-up transients per host
        warm = np.ones((m, 2))
        for h in (0, 1):
            comps = [c for c in self._warm[h] if ts.size == 0 or ts[0] - c[0] < 50.0 * c[2]]
            self._warm[h] = comps
            for start, amp, tau in comps:
                warm[:, h] -= amp * np.exp(-np.maximum(ts - start, 0.0) / tau)
        warm = np.maximum(warm, 0.05)
        lw = load * warm
        if k > 1:
            f_mips = (lw * np.exp(x)).reshape(count, k, 2).mean(axis=1)
            f_qps = (lw * np.exp(0.5 * x)).reshape(count, k, 2).mean(axis=1)
            load_w = load.reshape(count, k, -1).mean(axis=1)
            warm_w = warm.reshape(count, k, 2).mean(axis=1)
            x_w = x.reshape(count, k, 2).mean(axis=1)
        else:
            f_mips = lw * np.exp(x)
            f_qps = lw * np.exp(0.5 * x)
            load_w, warm_w, x_w = load, warm, x
        # per-window draws: outliers (3 uniforms) and metric noise (2 normals) per host
        u = self._rng_out.random((count, 2, 3))
        z = self._rng_met.standard_normal((count, 2, 2))
        hit = u[:, :, 0] < n.outlier_prob * min(1.0, self.noise_scale) if self.noise_scale else None
        outlier = np.ones((count, 2))
        if hit is not None and hit.any():
            sign = np.where(u[:, :, 2] < 0.5, -1.0, 1.0)
            outlier = np.where(hit, np.exp(sign * n.outlier_scale * (0.5 + u[:, :, 1])), 1.0)
        pts = self._points
        (ft0, fp0), (ft1, fp1) = self._factors
        tp = np.array([pts[0].throughput * ft0, pts[1].throughput * ft1]) * self._bias
        mips = ref["mips"] * tp * f_mips * outlier
        qps = ref["qps"] * tp * f_qps
        p99_nom = ref["p99_ms"] * np.array([pts[0].p99 * fp0, pts[1].p99 * fp1]) / self._bias
        load_gain = 1.0 + n.p99_load_gain * (load_w - 1.0)
        p99_noise = np.exp(-0.5 * x_w + n.p99_sigma * self.noise_scale * z[:, :, 0])
        p99_rel = np.maximum(load_gain, 0.05) * p99_noise / warm_w / np.sqrt(outlier)
        p99 = p99_nom * p99_rel
        qos = np.minimum(1.0, np.array([pts[0].qos * fp0**3, pts[1].qos * fp1**3]) * p99_rel**3)
        power_nom = ref["power_w"] * np.array([pts[0].power, pts[1].power])
        power = (
            power_nom
            * np.maximum(1.0 + n.power_load_gain * (load_w - 1.0), 0.05)
            * np.exp(n.power_sigma * self.noise_scale * z[:, :, 1])
        )
        offered = ref["qps"] * np.broadcast_to(load_w, (count, 2))
        ends = t0 + seconds * np.arange(1, count + 1)
        self._t = t0 + seconds * count
        return WindowArrays(ends, seconds, mips, qps, p99, qos, power, offered)

    @staticmethod
    def _ar_path(
        rng: np.random.Generator, state: np.ndarray, m: int, dt: float, sd: float, tau: float
    ) -> tuple[np.ndarray, np.ndarray]:
        """``m`` sub-steps of a stationary AR(1) per host with std ``sd`` and time constant
        ``tau`` (coefficient ``exp(-dt / tau)``), continuing from ``state``."""
        rho = math.exp(-dt / tau)
        e = rng.standard_normal((m, 2)) * (sd * math.sqrt(1.0 - rho * rho))
        path = ar1(rho, e, state)
        return path, path[-1].copy()

    def _host_loads(self, ts: np.ndarray, z_common: np.ndarray, dt: float) -> np.ndarray:
        """Per-host load (m, 2) when the load is only partly shared: the common diurnal
        swing and bursts, each host's own slope on them (``sensitivity_spread``), per-tick
        jitter correlated ``host_correlation`` between the hosts, and each host's own
        slowly wobbling routing share (``share_sigma``, ``share_tau_s``)."""
        lm = self.model.noise.load
        scale = self.noise_scale
        m = ts.size
        dev = self._load(ts, np.zeros(m), floor=False) - 1.0  # diurnal + bursts
        c = lm.host_correlation
        z_own = self._rng_own.standard_normal((m, 2))
        jitter = (scale * lm.jitter_sigma) * (
            math.sqrt(c) * z_common[:, None] + math.sqrt(1.0 - c) * z_own
        )
        load = 1.0 + self._slope[None, :] * (dev[:, None] + jitter)
        if lm.share_sigma > 0 and m:
            share, self._share = self._ar_path(
                self._rng_share, self._share, m, dt, lm.share_sigma * scale, lm.share_tau_s
            )
            load = load + share
        return np.maximum(load, 0.05)

    def point(self, h: int) -> Point:
        """Noiseless response of host ``h``'s current configuration."""
        return self._points[h]

    def _one_window(self, seconds: float) -> tuple[Sample, Sample]:
        """One window of at most one tick: the same draws and formulas as :meth:`arrays`,
        in scalar arithmetic (a numpy pass over 1-element arrays costs ~10x more)."""
        n = self.model.noise
        lm = n.load
        ref = self.model.reference
        scale = self.noise_scale
        t0 = self._t
        tm = t0 + 0.5 * seconds
        z_load = float(self._rng_load.standard_normal(1)[0])
        load = 1.0 + scale * lm.diurnal_amplitude * math.sin(
            2 * math.pi * tm / lm.diurnal_period_s + self._phase
        )
        if lm.jitter_sigma:
            load += scale * lm.jitter_sigma * z_load
        if lm.burst_rate_per_h > 0 and lm.burst_amplitude > 0 and scale > 0:
            start, amp = self._bursts_between(tm - 8 * lm.burst_duration_s, tm)
            for st, am in zip(start.tolist(), amp.tolist(), strict=True):
                load += scale * am * math.exp(-(tm - st) / lm.burst_duration_s)
        load = max(load, 0.05)
        sigma = n.ar_sigma * scale
        phi = n.ar_phi ** (seconds / n.tick_s)
        e = self._rng_host.standard_normal((1, 2))[0] * (sigma * math.sqrt(1.0 - phi * phi))
        x = (e + phi * self._x).tolist()
        self._x = np.array(x)
        u = self._rng_out.random((1, 2, 3))[0].tolist()
        z = self._rng_met.standard_normal((1, 2, 2))[0].tolist()
        self._t = t_end = t0 + seconds
        out = []
        for h in (0, 1):
            pt = self._points[h]
            f_tp, f_p99 = self._factors[h]
            bias = float(self._bias[h])
            warm = 1.0
            for t_w, a_w, tau_w in self._warm[h]:
                warm -= a_w * math.exp(-max(tm - t_w, 0.0) / tau_w)
            warm = max(warm, 0.05)
            xh = x[h]
            outlier = 1.0
            if scale and u[h][0] < n.outlier_prob * min(1.0, scale):
                sign = -1.0 if u[h][2] < 0.5 else 1.0
                outlier = math.exp(sign * n.outlier_scale * (0.5 + u[h][1]))
            tp = pt.throughput * f_tp * bias
            mips = ref["mips"] * tp * (load * warm * math.exp(xh)) * outlier
            qps = ref["qps"] * tp * (load * warm * math.exp(0.5 * xh))
            p99_rel = (
                max(1.0 + n.p99_load_gain * (load - 1.0), 0.05)
                * math.exp(-0.5 * xh + n.p99_sigma * scale * z[h][0])
                / warm
                / math.sqrt(outlier)
            )
            p99 = ref["p99_ms"] * pt.p99 * f_p99 / bias * p99_rel
            qos = min(1.0, pt.qos * f_p99**3 * p99_rel**3)
            power = (
                ref["power_w"]
                * pt.power
                * max(1.0 + n.power_load_gain * (load - 1.0), 0.05)
                * math.exp(n.power_sigma * scale * z[h][1])
            )
            out.append(
                Sample(
                    self.hosts[h].name,
                    t_end,
                    seconds,
                    {
                        "mips": mips,
                        "qps": qps,
                        "p99_ms": p99,
                        "qos_violation_rate": qos,
                        "power_w": power,
                        "offered_qps": ref["qps"] * load,
                    },
                )
            )
        return out[0], out[1]

    def _load(self, ts: np.ndarray, z: np.ndarray, floor: bool = True) -> np.ndarray:
        lm = self.model.noise.load
        scale = self.noise_scale
        load = 1.0 + scale * lm.diurnal_amplitude * np.sin(
            2 * math.pi * ts / lm.diurnal_period_s + self._phase
        )
        if lm.jitter_sigma:
            load = load + scale * lm.jitter_sigma * z
        if lm.burst_rate_per_h > 0 and lm.burst_amplitude > 0 and scale > 0 and ts.size:
            start, amp = self._bursts_between(float(ts[0]) - 8 * lm.burst_duration_s, float(ts[-1]))
            if start.size:
                age = ts[:, None] - start[None, :]
                contrib = np.where(age >= 0, np.exp(-np.maximum(age, 0) / lm.burst_duration_s), 0.0)
                load = load + scale * (contrib @ amp)
        return np.maximum(load, 0.05) if floor else load

    def _bursts_between(self, lo: float, hi: float) -> tuple[np.ndarray, np.ndarray]:
        """Burst start times and heights in [lo, hi]; a pure function of the seed and time."""
        lm = self.model.noise.load
        first = math.floor(max(lo, 0.0) / _BURST_BLOCK_S)
        last = math.floor(max(hi, 0.0) / _BURST_BLOCK_S)
        starts, amps = [], []
        for b in range(first, last + 1):
            blk = self._bursts.get(b)
            if blk is None:
                rng = np.random.default_rng([*self._burst_seed, b])
                nb = rng.poisson(lm.burst_rate_per_h * _BURST_BLOCK_S / 3600.0)
                st = np.sort(b * _BURST_BLOCK_S + rng.uniform(0, _BURST_BLOCK_S, nb))
                am = lm.burst_amplitude * rng.uniform(0.5, 1.5, nb)
                if len(self._bursts) > 64:
                    self._bursts.clear()
                blk = self._bursts[b] = (st, am)
            starts.append(blk[0])
            amps.append(blk[1])
        s = np.concatenate(starts)
        a = np.concatenate(amps)
        keep = (s >= lo) & (s <= hi)
        return s[keep], a[keep]

    def _advance(self, seconds: float) -> None:
        """Let ``seconds`` of host time pass unmeasured (applies, reboots)."""
        n = self.model.noise
        sigma = n.ar_sigma * self.noise_scale
        rho = n.ar_phi ** (seconds / n.tick_s)
        self._x = rho * self._x + math.sqrt(max(0.0, 1.0 - rho * rho)) * sigma * (
            self._rng_gap.standard_normal(2)
        )
        for attr, rng, sd, tau in (
            ("_w", self._rng_wander, n.wander_sd, n.wander_tau_s),
            ("_share", self._rng_share, n.load.share_sigma, n.load.share_tau_s),
        ):
            if sd > 0:
                r = math.exp(-seconds / tau)
                state = getattr(self, attr)
                noise = rng.standard_normal(2) * (sd * self.noise_scale * math.sqrt(1.0 - r * r))
                setattr(self, attr, r * state + noise)
        self._t += seconds


@dataclass(frozen=True)
class PairSetup:
    """What every simulated pair of an experiment shares: its ``[hosts]`` options, its model
    (checked against the experiment), the baseline it starts at, reboot knobs, co-tuning."""

    options: SimOptions
    model: SimModel
    baseline: Configuration
    reboot_knobs: frozenset[str]
    cotune: CotuneSpec | None

    def pair(
        self,
        seed: int,
        host_bias: float | None = None,
        names: tuple[str, str] = ("sim-a", "sim-b"),
    ) -> SimPair:
        return SimPair(
            self.model,
            seed=seed,
            host_bias=self.options.host_bias if host_bias is None else host_bias,
            noise_scale=self.options.noise_scale,
            initial=(self.baseline, self.baseline),
            reboot_knobs=self.reboot_knobs,
            names=names,
            cotune=self.cotune,
        )


def pair_setup(experiment: Experiment) -> PairSetup:
    """The ``sim`` backend's setup: the model named by ``[hosts] model`` (relative to the
    experiment file), validated against the experiment's space."""
    where = str(experiment.path)
    opts = parse_options(SimOptions, experiment.hosts.options, where)
    model = SimModel.load(experiment.resolve(opts.model), space=experiment.space)
    baseline = experiment.baseline_config
    for cfg in (experiment.stock, experiment.production):
        for knob, value in cfg.settings:
            if model.knobs.get(knob) and value not in model.knobs[knob].throughput:
                raise InputError(
                    f"model {model.source} does not model the experiment's {knob}={value!r}",
                    where=where,
                )
    cotune = experiment.cotune
    if cotune is not None and model.threading is None:
        raise InputError(
            f"[threading] cotune = true, but the sim model {model.source} has no [threading] "
            "section (which threading serves each configuration best)",
            where=where,
        )
    for knob in sorted(experiment.live_knobs):
        resp = model.knobs.get(knob)
        if resp is not None and resp.live_throughput is None:
            raise UnsupportedError(
                f"[sweep] reboot_knobs = 'scan-live': the sim model {model.source} does not "
                f"model {knob}'s live mechanism (add [knobs.{knob}.live], docs/sim.md)",
                where=where,
            )
    return PairSetup(opts, model, baseline, frozenset(experiment.spec.reboot_knobs), cotune)


def open_pair(experiment: Experiment, seed: int = 0) -> SimPair:
    """The ``sim`` backend factory: one pair starting at the experiment's baseline (a
    ``fleet`` is opened by :func:`musku.sim.fleet.open_fleet`)."""
    return pair_setup(experiment).pair(seed)
