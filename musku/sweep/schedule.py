"""How long a sweep's tasks are expected to take, and the order a pool's pairs take them in.

One model serves the scheduler (:meth:`musku.sweep.runner.Runner.map`: longest expected task
first, the first free pair takes the next) and the dry-run's estimate
(:mod:`musku.report.dryrun`: the same tasks list-scheduled on the pool's pairs), so the
estimate printed beside the measured host-clock after a sweep is the one the pairs were
scheduled by (issue 31 item 2).

A comparison is expected to take :meth:`CostModel.comparison_s` host seconds: the steady
windows for the confidence sequence to clear zero for an effect of twice ``min_effect``
(radius about three standard errors of the per-window log-ratio, whose spread comes from the
simulator model's noise when the hosts are simulated, else a default), plus one swap per
crossover period (an apply, the warm-up discarded, and a reboot when a reboot knob changes),
periods being :data:`~musku.abtest.driver.SWAP_OVERHEAD` times the swap cost as the driver
makes them, at least two. It reads nothing measured (no earlier run, no calibration), so a
sweep's schedule, like its results, is a function of the experiment file and the seed.
A walk of an ordered knob under ``scan = "unimodal"`` is expected to stop after
:data:`UNIMODAL_EXPECTED` comparisons (two losses that get worse stop it), a knob's choice to
take one comparison (its confirmation; run-offs only on close calls), a validation one
comparison that changes every knob the soft SKU changes.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from musku.abtest.driver import SWAP_OVERHEAD
from musku.domain import Configuration
from musku.errors import MuskuError
from musku.sim.model import SimModel

UNIMODAL_EXPECTED = 3
"""Comparisons a walk of an ordered knob is expected to take under ``scan = "unimodal"``."""
MIN_PERIODS = 2  # a crossover needs both role orders
DEFAULT_SD = 0.03  # per-window log-ratio spread when nothing better is known


@dataclass(frozen=True)
class CostModel:
    """Expected host seconds of the comparisons of one experiment (see the module)."""

    windows: int  # steady windows an effect of twice min_effect needs
    interval_s: float
    warmup_s: float
    apply_s: float
    reboot_s: float
    reboot_knobs: frozenset[str]
    source: str

    @classmethod
    def of(cls, experiment: Any) -> CostModel:
        """The model for ``experiment``: its statistics settings, and the simulator model's
        noise and timing when its hosts are simulated."""
        st = experiment.stats
        sd, apply_s, reboot_s = DEFAULT_SD, 2.0, 180.0
        source = "the statistics settings and default noise and timing"
        model = _sim_model(experiment)
        if model is not None:
            noise = model.noise
            scale = float(experiment.hosts.options.get("noise_scale", 1.0) or 1.0)
            sd = math.sqrt(2.0) * noise.ar_sigma * scale
            sd *= math.sqrt((1 + noise.ar_phi) / (1 - noise.ar_phi))
            apply_s, reboot_s = float(model.timing.apply_s), float(model.timing.reboot_s)
            source = (
                "the statistics settings and the simulator model's noise and timing, for "
                "effects of twice min_effect"
            )
        windows = min(int(st.sample_cap), math.ceil((3.0 * sd / st.min_effect) ** 2))
        return cls(
            windows=windows,
            interval_s=float(st.sample_interval_s),
            warmup_s=float(st.warmup_s),
            apply_s=apply_s,
            reboot_s=reboot_s,
            reboot_knobs=frozenset(experiment.spec.reboot_knobs),
            source=source,
        )

    def comparison_s(self, changed: Iterable[str]) -> float:
        """Expected host seconds of one comparison that changes the knobs ``changed``."""
        reboot = bool(set(changed) & self.reboot_knobs)
        swap = self.apply_s + self.warmup_s + (self.reboot_s if reboot else 0.0)
        measuring = self.windows * self.interval_s
        periods = max(MIN_PERIODS, math.ceil(measuring / max(SWAP_OVERHEAD * swap, 1e-9)))
        return measuring + periods * swap

    def between(self, baseline: Configuration, candidate: Configuration) -> float:
        return self.comparison_s(baseline.diff(candidate))

    def walk_s(self, knob: str, walk: Sequence[object], unimodal: bool) -> float:
        """A walk of ``knob``'s scan: its comparisons, fewer under a unimodal stop."""
        n = min(len(walk), UNIMODAL_EXPECTED) if unimodal else len(walk)
        return n * self.comparison_s((knob,))

    def choose_s(self, knob: str) -> float:
        """A knob's choice after its scan: the confirmation."""
        return self.comparison_s((knob,))

    def scan_s(self, walks: Sequence[Sequence[object]], knob: str) -> float:
        """A knob's whole scan (its walks one after the other, then its choice)."""
        unimodal = len(walks) == 2
        return sum(self.walk_s(knob, w, unimodal) for w in walks) + self.choose_s(knob)


def order(costs: Sequence[float]) -> list[int]:
    """Task indices, longest expected first (ties: in task order)."""
    return sorted(range(len(costs)), key=lambda i: (-costs[i], i))


def list_schedule(costs: Sequence[float], pairs: int) -> tuple[float, list[int]]:
    """Makespan of ``costs`` on ``pairs`` pairs when the first free pair takes the longest
    task left (ties: the lower pair), and the pair each task went to."""
    if pairs < 1:
        raise ValueError("list_schedule needs at least one pair")
    free: list[tuple[float, int]] = [(0.0, p) for p in range(pairs)]
    where = [0] * len(costs)
    for i in order(costs):
        t, p = heapq.heappop(free)
        where[i] = p
        heapq.heappush(free, (t + costs[i], p))
    return max(t for t, _ in free), where


def _sim_model(experiment: Any) -> SimModel | None:
    """The simulator model a ``sim`` experiment names (None: not simulated, or unreadable)."""
    opt = experiment.hosts.options.get("model")
    if experiment.hosts.backend != "sim" or not isinstance(opt, str):
        return None
    try:
        return SimModel.load(experiment.resolve(opt), space=experiment.space)
    except MuskuError:
        return None
