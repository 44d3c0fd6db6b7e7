"""The independent sweep as multi-arm scans on a simulated fleet (issue 20, item 2).

:func:`multiarm_sweep` runs every knob's scan (the baseline and its other settings) as Williams
scans (:func:`musku.design.group.run_scan`) on groups of a fleet of ``n_hosts`` simulated hosts,
then composes the chosen settings with the production configuration and validates the
composition against production and stock with today's paired tester on one pair, as
``musku sweep`` does. It is the multi-arm counterpart of ``run_sweep`` on a ``fleet = N`` pool
(the pairwise strategy), for ``bench/fleet.py`` to compare in the same run.

- A knob with more arms than the fleet has hosts is scanned in chunks (the baseline and up to
  ``n_hosts - 1`` other settings each); the chunks' winners then meet in one more scan with
  the baseline. A fleet of two hosts rotates only two arms, which is the pairwise design, so
  :func:`multiarm_sweep` needs at least three.
- Groups of the fleet run side by side: each knob holds a group of ``min(n_hosts, arms)``
  hosts for the whole of its scans, and knobs start, largest first, as soon as enough hosts
  are free (list scheduling on the virtual clock). Host-clock time to the soft SKU is when the
  last knob finishes plus the validation; host-hours count every held host for the whole time
  it is held.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from musku.abtest import run_comparison
from musku.design.group import PeriodSink, ScanResult, run_scan
from musku.domain import ComparisonResult, Configuration, Decision
from musku.errors import InputError
from musku.experiment import Experiment
from musku.hosts.group import HostGroup
from musku.hosts.pool import derive_seed
from musku.sim.group import SimGroup
from musku.sim.model import SimModel
from musku.sim.pair import open_pair


@dataclass
class KnobScan:
    """One knob's multi-arm scans: the setting chosen, the group it held and for how long."""

    knob: str
    chosen: object
    hosts: int
    time_s: float
    scans: int
    start_s: float = 0.0


@dataclass
class MultiArmSweep:
    best: Configuration
    knobs: list[KnobScan]
    validation: list[ComparisonResult] = field(default_factory=list)
    clock_s: float = 0.0  # host-clock time to the validated soft SKU
    host_hours: float = 0.0


MAX_REPLICAS = 4
"""At most this many Williams squares of one scan side by side (replicas beyond decide little
sooner: the first look needs one full cycle whatever the replication)."""


def _chunks(values: Sequence[object], size: int) -> list[list[object]]:
    return [list(values[i : i + size]) for i in range(0, len(values), size)]


Period = tuple[int, Any, float, Any]
"""One period of a scan as :data:`musku.design.group.PeriodSink` receives it."""


def _keep(periods: list[Period]) -> PeriodSink:
    def on_period(p: int, row: Any, t: float, means: Any) -> None:
        periods.append((p, row.copy(), t, means.copy()))

    return on_period


def group_size(experiment: Experiment, knob: str, n_hosts: int) -> int:
    """Hosts ``knob``'s scans hold: the baseline and its other settings, at most ``n_hosts``."""
    base = experiment.baseline_config
    return min(n_hosts, sum(1 for v in experiment.space[knob] if v != base[knob]) + 1)


def scan_knob(
    experiment: Experiment,
    model: SimModel | None,
    knob: str,
    n_hosts: int,
    seed: int,
    *,
    open_group: Callable[[int, int], HostGroup] | None = None,
    on_scan: Callable[[ScanResult, HostGroup, list[Period]], None] | None = None,
    should_stop: Callable[[], bool] | None = None,
    hosts: int | None = None,
) -> KnobScan:
    """Scan ``knob`` from the experiment's baseline on groups of at most ``n_hosts`` hosts.

    ``open_group(size, scan)`` gives the group scan number ``scan`` runs on (default: a
    :class:`SimGroup` of ``model`` seeded from ``seed``, ``knob`` and ``scan``); ``on_scan``
    hears of every finished scan with its group and its periods (the sweep records them).
    ``hosts``: the hosts the knob holds (default: its group, :func:`group_size`); a scan runs
    ``min(MAX_REPLICAS, hosts // arms)`` Williams squares side by side on them. A scan whose
    probe stops some arms (:func:`musku.design.group.run_scan`, ``restart_after_probe``) is
    followed at once by a scan of the arms left, with as many squares as the hosts held
    allow (core_count on Web/Skylake: 2-14 cores stopped, 16 and 18 on four squares)."""
    if n_hosts < 3:
        raise InputError(f"a multi-arm scan needs a group of >= 3 hosts, not {n_hosts}")
    base = experiment.baseline_config
    values: list[object] = [v for v in experiment.space[knob] if v != base[knob]]
    group = group_size(experiment, knob, n_hosts)
    time_s, scans = 0.0, 0

    def sim_group(size: int, scan: int) -> HostGroup:
        assert model is not None
        return SimGroup(
            model,
            size,
            seed=derive_seed(seed, knob, scan),
            initial=base,
            reboot_knobs=experiment.spec.reboot_knobs,
        )

    make = open_group or sim_group
    held = group if hosts is None else max(group, min(n_hosts, hosts))
    while True:
        winners: list[object] = []
        for chunk in _chunks(values, group - 1):
            arms = [base, *(base.with_(knob, v) for v in chunk)]
            while True:
                # the hosts held run as many squares of the arms as fit, side by side
                reps = max(1, min(MAX_REPLICAS, held // len(arms)))
                g = make(reps * len(arms), scans)
                periods: list[Period] = []
                cap = experiment.stats.sample_cap  # a small cap (a quick run) shortens the pilot
                r = run_scan(
                    g,
                    arms,
                    experiment.stats,
                    pilot_windows=min(240, max(8, cap // 8)),
                    min_period_windows=min(120, max(4, cap // 16)),
                    on_period=_keep(periods),
                    should_stop=should_stop,
                    guardrails=experiment.spec.guardrails,
                    restart_after_probe=True,
                )
                if on_scan is not None:
                    on_scan(r, g, periods)
                scans += 1
                time_s += r.host_time_s
                if not r.restarted:
                    break
                # some arms broke in the probe: the rest are scanned again without them, on
                # more squares where the hosts held allow
                arms = [a for k, a in enumerate(arms) if k not in r.guardrail]
            if r.outcome.decision is Decision.BETTER and r.outcome.best != 0:
                winners.append(r.best[knob])
        if len(winners) <= 1 or len(winners) == len(values):
            # one winner (or none), or no chunk narrowed anything down: take the first
            # chunk winner (a run-off could not shrink the field on a group this small)
            chosen = winners[0] if winners else base[knob]
            return KnobScan(knob, chosen, held, time_s, scans)
        values = winners  # the chunks' winners meet in one more scan with the baseline


def multiarm_sweep(experiment: Experiment, n_hosts: int, seed: int) -> MultiArmSweep:
    """The independent sweep as multi-arm scans on a fleet of ``n_hosts`` simulated hosts."""
    model = SimModel.load(
        experiment.resolve(experiment.hosts.options["model"]), space=experiment.space
    )
    scans = [scan_knob(experiment, model, k, n_hosts, seed) for k in experiment.space]
    # list scheduling: largest groups first, each as soon as enough hosts are free
    free, now = n_hosts, 0.0
    running: list[tuple[float, int]] = []  # (end, hosts)
    for ks in sorted(scans, key=lambda s: (-s.hosts, -s.time_s)):
        while free < ks.hosts:
            end, h = heapq.heappop(running)
            now, free = max(now, end), free + h
        ks.start_s = now
        free -= ks.hosts
        heapq.heappush(running, (now + ks.time_s, ks.hosts))
    done = max((s.start_s + s.time_s for s in scans), default=0.0)
    best = experiment.production.merged(Configuration.of({s.knob: s.chosen for s in scans}))
    pair = open_pair(experiment, seed=derive_seed(seed, "validate"))
    t0 = pair.now()
    validation = [run_comparison(pair, experiment.production, best, experiment.spec, seed=seed)]
    if experiment.stock != experiment.production:
        validation.append(
            run_comparison(pair, experiment.stock, best, experiment.spec, seed=seed + 1)
        )
    v_time = pair.now() - t0
    host_hours = sum(s.hosts * s.time_s for s in scans) / 3600.0 + 2 * v_time / 3600.0
    return MultiArmSweep(best, scans, validation, done + v_time, host_hours)


def summary(sweep: MultiArmSweep) -> dict[str, Any]:
    return {
        "best": sweep.best.as_dict(),
        "clock_h": sweep.clock_s / 3600.0,
        "host_hours": sweep.host_hours,
        "scans": sum(s.scans for s in sweep.knobs),
    }
