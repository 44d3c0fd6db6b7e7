"""``[sweep] mode = "multiarm"``: the independent sweep with each knob's scan as one multi-arm
crossover experiment on a group of the pool's hosts (issue 20, item 2; docs/fleet.md).

Each knob's scan (the baseline and its K other settings) runs as Williams scans
(:func:`musku.design.fleet.scan_knob`, :func:`musku.design.group.run_scan`) on a group of
``min(pool hosts, K + 1)`` hosts: a :class:`~musku.sim.group.SimGroup` for a simulated
``fleet = N`` (its hosts' biases those of the fleet's hosts), an
:class:`~musku.hosts.agent.AgentGroup` for agent hosts. Knobs are packed, largest group first,
into *waves* of disjoint groups that fit the pool (first fit): a wave's knobs run at once, one
thread each, and the next wave starts when the wave's longest scan ends (the host-clock adds
that). The hosts a wave leaves free go to its knobs as extra Williams squares of the same
scan (:func:`_replicate`; :func:`musku.design.fleet.scan_knob` runs ``hosts // arms`` squares,
at most :data:`~musku.design.fleet.MAX_REPLICAS`), which can decide after one design cycle.
The chosen settings are composed with the baseline and validated as the independent
strategy does (:meth:`musku.sweep.runner.Runner.generate_softsku`, run by ``run_sweep``).

Every scan is recorded as comparisons: for each candidate arm a row of purpose
``multiarm:<knob>`` (baseline and candidate configuration, the decision against the baseline
under the scan's family-wise error control, the estimate and interval, ``host_a``/``host_b``
the hosts that started on the baseline and on the candidate, the group's hosts in the reason,
``host_time_s`` the scan's host-clock time divided by K so that the rows add up to the scan's),
with one sample per host and period: the mean of the host's steady windows in that period (the
observation the procedure uses), role ``A`` on the host running the baseline, ``B`` on the one
running the candidate.

The guarded probe (issue 31 item 6): before any arm runs a full period, the first minute of
windows after the warm-up checks every candidate against the guardrails and the primary
metric's floor (:func:`musku.design.group.run_scan`); an arm that breaks is put back to the
baseline on its hosts at once, its row says ``guardrail`` (which, by how much, "in the probe"),
with no samples, and the arms left are scanned again without it, on as many squares as the
knob's hosts hold.

Guardrails (issue 32 item 4): after the probe, every candidate arm is checked at every look (each period) on
the guardrail metrics the group reports (the simulated group's ``p99_ms`` and
``qos_violation_rate``, the agents' spool rows; :func:`musku.design.group.run_scan`). A breach eliminates the arm at
once, its host goes back to the baseline, and later periods run the baseline in its place; the
arm's row has the decision ``guardrail`` with the pairwise test's reason ("guardrail
qos_violation_rate <= 0.01 broken: ..."), its samples end at that look, and the knob's outcome
lists the setting as pruned. Ctrl-C / ``musku abort`` stop every scan before its next period
(:class:`~musku.errors.Interrupted`; the rows of finished scans stay). On PostgreSQL the scans
are not put on the comparison queue: ``musku worker`` processes do not take multiarm scans
(the validation comparisons are queued as usual). A multi-arm scan is not resumed: ``--resume`` scans every knob again
(the earlier run's rows stay).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence

import numpy as np

from musku.design.fleet import MAX_REPLICAS, Period, group_size, scan_knob
from musku.design.group import ScanResult
from musku.design.williams import williams
from musku.domain import ComparisonResult, Configuration, Decision, format_value
from musku.errors import InputError
from musku.experiment import Experiment
from musku.hosts.backend import backend_of
from musku.hosts.group import HostGroup
from musku.sweep.limits import check_multiarm
from musku.sweep.runner import KnobOutcome, Runner

PURPOSE = "multiarm:{knob}"


def _opener(runner: Runner) -> tuple[list[str], Callable[[list[int], str, int], HostGroup]]:
    """The pool's usable hosts (names, pool order) and ``open(hosts, knob, scan)`` that gives a
    group on those host indices."""
    exp = runner.experiment
    pool = runner.pool
    n = len(runner.pair.hosts) if pool is None else len(pool.names)
    check_multiarm(exp, n)
    assert pool is not None  # one pair is two hosts: refused above
    backend = backend_of(exp)
    if not backend.groups:
        raise InputError(
            f'[sweep] mode = "multiarm" needs hosts that form groups, not {backend.name!r}',
            where=str(exp.path),
        )
    return backend.open_group(exp, pool, runner.seed)


def _waves(sizes: dict[str, int], capacity: int) -> list[list[tuple[str, int]]]:
    """Knobs packed (largest group first, first fit) into waves of disjoint host ranges:
    ``[(knob, first host), ...]`` per wave."""
    waves: list[list[tuple[str, int]]] = []
    used: list[int] = []
    for knob in sorted(sizes, key=lambda k: -sizes[k]):
        for w, load in enumerate(used):
            if load + sizes[knob] <= capacity:
                waves[w].append((knob, load))
                used[w] += sizes[knob]
                break
        else:
            waves.append([(knob, 0)])
            used.append(sizes[knob])
    return waves


def arm_results(
    result: ScanResult, names: Sequence[str]
) -> list[tuple[ComparisonResult, str, str]]:
    """One comparison per candidate arm against the baseline: (result, the host that started on
    the baseline, the host that started on the candidate)."""
    first = williams(len(result.arms))[0]
    out = []
    o = result.outcome
    # a scan stopped after its probe records the arms the probe stopped only (the arms left
    # are scanned again and recorded there)
    ks = [k for k in range(1, len(result.arms)) if not result.restarted or k in result.guardrail]
    for k in ks:
        decision = o.vs_baseline.get(k) or Decision.INCONCLUSIVE
        if k in result.guardrail:  # pruned as the pairwise test prunes a guardrail breach
            decision = Decision.GUARDRAIL
        est, low, high = result.estimates.get(k, (0.0, float("-inf"), float("inf")))
        chosen = " (chosen)" if o.best == k and o.decision is Decision.BETTER else ""
        why = o.eliminated.get(k, "")
        reason = (
            (f"{result.guardrail[k]}; " if k in result.guardrail else "")
            + f"{len(result.arms)}-arm crossover on {', '.join(names)}: arm {k}{chosen}"
            + (f", eliminated: {why}" if why else "")
            + f"; scan {o.decision.value if o.decision else 'open'}: {o.reason}"
        )
        out.append(
            (
                ComparisonResult(
                    baseline=result.arms[0],
                    candidate=result.arms[k],
                    decision=decision,
                    estimate=est,
                    ci_low=low,
                    ci_high=high,
                    samples=result.samples,
                    # the scan's host-clock shared by its K rows: the rows sum to the scan's
                    host_time_s=result.host_time_s / len(ks),
                    reason=reason,
                    method=result.method,
                ),
                names[int(np.flatnonzero(first == 0)[0])],
                names[int(np.flatnonzero(first == k)[0])],
            )
        )
    return out


def _record(
    runner: Runner,
    lock: threading.Lock,
    knob: str,
    outcome: KnobOutcome,
    metric: str,
) -> Callable[[ScanResult, HostGroup, list[Period]], None]:
    purpose = PURPOSE.format(knob=knob)
    store, exp_id = runner.store, runner.experiment_id

    def on_scan(result: ScanResult, group: HostGroup, periods: list[Period]) -> None:
        rows = arm_results(result, group.names)
        with lock:
            for r, host_a, host_b in rows:
                outcome.results.append(r)
                runner.results.append((purpose, r))
                runner.measured += 1
                if r.decision is Decision.GUARDRAIL:
                    outcome.pruned.append(r.candidate[knob])
                    value = format_value(knob, r.candidate[knob])  # type: ignore[arg-type]
                    why = result.guardrail.get(result.arms.index(r.candidate), r.reason)
                    runner.progress.message(f"multiarm {knob}={value} stopped: {why}")
                if store is None or exp_id is None:
                    continue
                k = result.arms.index(r.candidate)
                cmp_id = store.start_comparison(
                    exp_id, purpose, r.baseline, r.candidate, hosts=(host_a, host_b)
                )
                # a row pruned by a guardrail ends at the look that pruned it, as a pairwise
                # comparison stopped by a guardrail does
                ran_k = [p for p, row, _, _ in periods if k in (int(a) for a in row)]
                last = max(ran_k, default=-1) if k in result.guardrail else None
                samples = []
                for p, row, t, means in periods:
                    if last is not None and p > last:
                        break
                    for h, arm in enumerate(row):
                        if int(arm) in (0, k):
                            samples.append(
                                {
                                    "seq": p,
                                    "t": float(t),
                                    "host": group.names[h],
                                    "role": "A" if int(arm) == 0 else "B",
                                    "period": p,
                                    "warmup": False,
                                    "valid": True,
                                    "metrics": {metric: float(means[h])},
                                }
                            )
                store.add_samples(cmp_id, samples)
                store.finish_comparison(cmp_id, r)

    return on_scan


def _replicate(
    exp: Experiment, waves: list[list[tuple[str, int]]], sizes: dict[str, int], capacity: int
) -> tuple[list[list[tuple[str, int]]], dict[str, int]]:
    """The hosts a wave leaves free go to its knobs as more Williams squares (whole squares,
    at most :data:`~musku.design.fleet.MAX_REPLICAS` per knob), the knob with the longest
    expected scan first (a reboot knob, then the longest design cycle): ``(waves with the new
    first hosts, hosts each knob holds)``. A scan on two squares or more can decide after one
    cycle instead of two."""
    held = dict(sizes)
    out: list[list[tuple[str, int]]] = []

    def expected(knob: str) -> tuple[bool, int]:
        n = sizes[knob]
        return (knob in exp.spec.reboot_knobs, n if n % 2 == 0 else 2 * n)

    for wave in waves:
        spare = capacity - sum(sizes[k] for k, _ in wave)
        grew = True
        while grew:
            grew = False
            for knob in sorted((k for k, _ in wave), key=expected, reverse=True):
                if sizes[knob] <= spare and held[knob] + sizes[knob] <= MAX_REPLICAS * sizes[knob]:
                    held[knob] += sizes[knob]
                    spare -= sizes[knob]
                    grew = True
                    break
        first, placed = 0, []
        for knob, _ in wave:
            placed.append((knob, first))
            first += held[knob]
        out.append(placed)
    return out, held


def _put_back(groups: Sequence[HostGroup]) -> None:
    """Agent groups: every host back at its baseline and the lease stopped once the knob's
    scans end (or fail); the hosts are free for the next wave. Simulated groups: nothing."""
    for g in groups:
        restore = getattr(g, "restore", None)
        if restore is not None:
            try:
                restore()
            finally:
                g.close()  # type: ignore[attr-defined]


def multiarm(runner: Runner) -> tuple[Configuration, list[KnobOutcome]]:
    exp = runner.experiment
    base = exp.baseline_config
    names, open_group = _opener(runner)
    metric = backend_of(exp).group_metric(exp)
    knobs = [k for k in exp.service.knobs if any(v != base[k] for v in exp.space[k])]
    outcomes = {
        k: KnobOutcome(knob=k, baseline_value=base[k], best_value=base[k])
        for k in exp.service.knobs
    }
    sizes = {k: group_size(exp, k, len(names)) for k in knobs}
    waves, held = _replicate(exp, _waves(sizes, len(names)), sizes, len(names))
    lock = threading.Lock()
    for wave in waves:
        times: dict[str, float] = {}
        errors: list[BaseException] = []

        def scan(
            knob: str, first: int, times: dict[str, float], errors: list[BaseException]
        ) -> None:
            hosts = list(range(first, first + held[knob]))
            opened: list[HostGroup] = []

            def group(size: int, n: int) -> HostGroup:
                g = open_group(hosts[:size], knob, n)
                opened.append(g)
                return g

            try:
                ks = scan_knob(
                    exp,
                    None,
                    knob,
                    len(names),
                    runner.seed,
                    open_group=group,
                    on_scan=_record(runner, lock, knob, outcomes[knob], metric),
                    should_stop=runner.stop.is_set,
                    hosts=held[knob],
                )
            except BaseException as exc:  # re-raised below, after the wave's threads end
                with lock:
                    errors.append(exc)
                runner.stop.set()
                return
            finally:
                _put_back(opened)
            outcomes[knob].best_value = ks.chosen
            times[knob] = ks.time_s
            with lock:
                runner.host_seconds += ks.hosts * ks.time_s
            was, now = format_value(knob, base[knob]), format_value(knob, ks.chosen)  # type: ignore[arg-type]
            change = f"stays at {was}" if was == now else f"{was} -> {now}"
            runner.progress.message(
                f"multiarm {knob}: {change} ({ks.scans} scan(s), {held[knob]} hosts)"
            )

        threads = [
            threading.Thread(
                target=scan, args=(k, first, times, errors), name=f"musku-multiarm-{k}", daemon=True
            )
            for k, first in wave
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if errors:
            raise errors[0]
        runner.clock_s += max(times.values(), default=0.0)
    best = base
    for k in exp.service.knobs:
        best = best.with_(k, outcomes[k].best_value)
    return best, [outcomes[k] for k in exp.service.knobs]
