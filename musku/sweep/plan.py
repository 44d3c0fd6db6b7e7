"""``musku sweep FILE --dry-run``: what a sweep would do, with nothing applied and nothing
written to the results DB.

- the comparisons the strategy plans (an independent sweep's scans may stop early on an
  ordered knob and add run-offs and confirmations; the plan gives each knob's settings and the
  most comparisons it can take);
- the host probes and checks, each backend's own (``Backend.check``): simulated hosts load
  and check their model; agent hosts answer ``hello`` and their ``check`` operation (validate
  a configuration, list the writes, write nothing) for every planned configuration; the local
  host probes its knobs and dry-runs each planned value (the same code as the agent's
  ``check``);
- an estimate of host time: from the latest finished run of the same experiment in the
  results DB when there is one, else from the statistics settings and what the backend models
  of its hosts' noise and timing (``Backend.prior``, ``Backend.window_s``), with the sample
  cap as the bound;
- with a host pool (docs/fleet.md, ``Backend.pool_names``): its hosts, pairs and idle host, and an estimate of the
  host-clock time to the soft SKU: the sweep's tasks scheduled on the pairs as ``musku
  sweep`` schedules them, with the expected host times the pairs are scheduled by
  (:mod:`musku.sweep.schedule`), then the validations (at once).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, Protocol

from musku.design.advice import mode_advice
from musku.domain import Configuration, ExperimentStatus
from musku.hosts.backend import Prior, backend_of
from musku.hosts.pool import form_pairs
from musku.storage.protocols import ComparisonStore, RunStore
from musku.summary import decidable
from musku.sweep.modes import strategy_of
from musku.sweep.schedule import CostModel, estimate_clock


class PastRuns(RunStore, ComparisonStore, Protocol):
    """What the dry run reads of earlier runs: the experiment's latest run, its comparisons."""


def planned(experiment: Any) -> dict[str, Any]:
    """The comparisons the sweep plans, per knob, and their count (scans may stop early;
    run-offs and confirmations come on top)."""
    base: Configuration = experiment.baseline_config
    mode = experiment.mode
    knobs = []
    configs: list[Configuration] = [base]
    for knob, values in experiment.space.items():
        current = base.get(knob)
        others = [v for v in values if v != current]
        knobs.append(
            {
                "knob": knob,
                "baseline": current,
                "settings": others,
                "comparisons": len(others),
                "reboot": knob in experiment.spec.reboot_knobs,
            }
        )
        configs += [base.with_(knob, v) for v in others]
    single = sum(k["comparisons"] for k in knobs)
    validations = 0 if experiment.stock == experiment.production else 2
    validations = max(validations, 1)
    total, note = strategy_of(experiment).plan(experiment, single, validations)
    return {
        "mode": mode,
        "baseline": base.as_dict(),
        "knobs": knobs,
        "validations": validations,
        "comparisons_planned": total,
        "note": note,
        "configurations": configs,
    }


def check_hosts(experiment: Any, configs: list[Configuration]) -> dict[str, Any]:
    """Probe and check the hosts without applying anything (``Backend.check``). ``ok`` False
    when a host (or the model) refuses a planned configuration or cannot be reached."""
    return backend_of(experiment).check(experiment, configs)


def estimate(experiment: Any, plan: Mapping[str, Any], past: Any = None) -> dict[str, Any]:
    """Host time the sweep would take: from ``past`` (comparisons of an earlier run) when
    given, else from the statistics settings and the model."""
    n = int(plan["comparisons_planned"])
    st = experiment.stats
    backend = backend_of(experiment)
    per_window = backend.window_s(experiment, st.sample_interval_s)
    cap_s = st.warmup_s + st.sample_cap * per_window
    if past:
        done = [c.result.host_time_s for c in past if c.result is not None]
        if done:
            mean = sum(done) / len(done)
            return {
                "source": f"the latest finished run of {experiment.name} ({len(done)} comparisons, {mean / 60:.1f} min each)",
                "per_comparison_s": mean,
                "total_s": mean * n,
                "bound_s": cap_s * n,
            }
    per = _model_seconds(experiment, backend.prior(experiment))
    if per is None:
        return {
            "source": "the sample cap only (no model, no past run)",
            "per_comparison_s": None,
            "total_s": None,
            "bound_s": cap_s * n,
        }
    return {
        "source": "the statistics settings and the simulator model's noise and timing, "
        "for effects of twice min_effect",
        "per_comparison_s": per,
        "total_s": per * n,
        "bound_s": cap_s * n,
    }


def pool_layout(experiment: Any) -> dict[str, Any] | None:
    """The experiment's host pool as ``musku sweep`` pairs it (None: one pair)."""
    names = backend_of(experiment).pool_names(experiment)
    if names is None:
        return None
    groups, idle = form_pairs(names)
    return {
        "hosts": len(names),
        "pairs": len(groups),
        "first": names[0],
        "last": names[-1],
        "idle": names[idle] if idle is not None else None,
    }


def pool_clock(experiment: Any, pairs: int) -> float | None:
    """Host-clock to the soft SKU on ``pairs`` pairs: the sweep's own schedule of its tasks'
    expected host times (:func:`musku.sweep.schedule.estimate_clock`, the model the pool's
    pairs are scheduled by, printed again beside the measured clock after the sweep). None
    for the modes whose later phases depend on results (search, multiarm)."""
    return estimate_clock(experiment, pairs)


def _model_seconds(experiment: Any, prior: Prior | None) -> float | None:
    """Host seconds of a comparison whose effect is twice min_effect: the windows for the
    confidence sequence (radius ~3 standard errors) to clear zero, with the backend's modelled
    noise (``prior``: the simulator's AR(1) noise on both hosts), plus two warm-ups and the
    apply time. None when the backend models no timing."""
    if prior is None or prior.apply_s is None:
        return None
    st = experiment.stats
    half = st.min_effect  # an effect of 2 x min_effect clears 0 at this half-width
    windows = min(st.sample_cap, math.ceil((3.0 * prior.noise_sd / half) ** 2))
    return 2 * st.warmup_s + windows * st.sample_interval_s + 2 * prior.apply_s


def dry_run(experiment: Any, store: PastRuns | None = None) -> dict[str, Any]:
    plan = planned(experiment)
    configs = plan.pop("configurations")
    past = None
    if store is not None:
        rec = store.find_experiment(experiment.name)
        if rec is not None and rec.status is ExperimentStatus.DONE:
            past = store.comparisons(rec.id)
    hosts = check_hosts(experiment, configs)
    est = estimate(experiment, plan, past)
    pool = pool_layout(experiment)
    if pool is not None:
        est["clock_s"] = pool_clock(experiment, int(pool["pairs"]))
        est["clock_source"] = CostModel.of(experiment).source
    return {
        "experiment": experiment.name,
        "plan": plan,
        "pool": pool,
        "hosts": hosts,
        "host_time": est,
        "decidable": decidable(experiment),
        "mode_advice": mode_advice(experiment),  # pairwise or multiarm: which is faster
        "applied": False,
        "db_rows_written": 0,
    }
