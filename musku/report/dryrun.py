"""``musku sweep FILE --dry-run``: what a sweep would do, with nothing applied and nothing
written to the results DB.

- the comparisons the strategy plans (an independent sweep's scans may stop early on an
  ordered knob and add run-offs and confirmations; the plan gives each knob's settings and the
  most comparisons it can take);
- the host probes and checks: simulated hosts load and check their model; agent hosts answer
  ``hello`` and their ``check`` operation (validate a configuration, list the writes, write
  nothing) for every planned configuration; the local host probes its knobs and dry-runs each
  planned value (the same code as the agent's ``check``);
- an estimate of host time: from the latest finished run of the same experiment in the
  results DB when there is one, else from the statistics settings and the simulator model's
  noise and timing, with the sample cap as the bound;
- with a host pool (docs/fleet.md): its hosts, pairs and idle host, and an estimate of the
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
from musku.errors import MuskuError
from musku.hostfs import HostFS
from musku.hosts.agent import _host_options, make_link
from musku.hosts.pool import agent_entries, entry_name, form_pairs
from musku.knobs import load_knob
from musku.sim.fleet import host_names
from musku.sim.model import SimModel
from musku.sim.pair import open_pair
from musku.storage.protocols import ComparisonStore, RunStore
from musku.sweep.schedule import CostModel, estimate_clock
from musku.sweep.strategies import EXHAUSTIVE_LIMIT


class PastRuns(RunStore, ComparisonStore, Protocol):
    """What the dry run reads of earlier runs: the experiment's latest run, its comparisons."""


def planned(experiment: Any) -> dict[str, Any]:
    """The comparisons the sweep plans, per knob, and their count (scans may stop early;
    run-offs and confirmations come on top)."""
    base: Configuration = experiment.baseline_config
    mode = experiment.mode.value
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
    exhaustive = math.prod(len(v) for v in experiment.space.values())
    validations = 0 if experiment.stock == experiment.production else 2
    validations = max(validations, 1)
    if mode == "exhaustive":
        total = exhaustive - 1 + validations
        note = f"every configuration of the cross product ({exhaustive:,}) against the baseline"
        if exhaustive > EXHAUSTIVE_LIMIT:
            note += f"; more than {EXHAUSTIVE_LIMIT}: the sweep refuses it (narrow the space or use search)"
    elif mode == "search":
        total = single * (1 + experiment.search_rounds) + validations
        note = (
            f"the independent scan, then up to {experiment.search_rounds} coordinate-descent rounds"
        )
    else:
        total = single + validations
        note = (
            "each knob's settings against the baseline (an ordered knob's scan may stop early; "
            "close winners get a run-off and a confirmation), then the soft SKU's validations"
        )
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
    """Probe and check the hosts without applying anything. ``ok`` False when a host (or the
    model) refuses a planned configuration or cannot be reached."""
    backend = experiment.hosts.backend
    if backend == "sim":
        return _check_sim(experiment)
    if backend == "agent":
        return _check_agents(experiment, configs)
    if backend == "local":
        return _check_local(experiment, configs)
    return {"backend": backend, "ok": True, "hosts": [], "note": "no check for this backend"}


def _check_sim(experiment: Any) -> dict[str, Any]:
    try:
        pair = open_pair(experiment)
    except MuskuError as exc:
        return {"backend": "sim", "ok": False, "hosts": [], "error": exc.one_line()}
    try:
        info = dict(pair.describe())
    finally:
        pair.close()
    pool = pool_layout(experiment)
    names = (
        [f"{pool['first']} .. {pool['last']}"] if pool is not None else info.get("hosts", [])
    )  # a fleet's hosts share the model
    return {
        "backend": "sim",
        "ok": True,
        "hosts": [
            {"name": str(h), "ok": True, "check": "model loaded; every planned setting modelled"}
            for h in names
        ],
    }


def _check_agents(experiment: Any, configs: list[Configuration]) -> dict[str, Any]:
    opts = experiment.hosts.options
    out: dict[str, Any] = {"backend": "agent", "ok": True, "hosts": []}
    try:
        hosts = _host_options(opts)
    except MuskuError as exc:
        return {**out, "ok": False, "error": exc.one_line()}
    for h in hosts:
        row: dict[str, Any] = {"name": h.name, "ok": True}
        link = None
        try:
            link = make_link(h, opts, timeout=60.0)
            hello = link.call("hello")
            row["agent"] = {
                k: hello.get(k) for k in ("version", "protocol", "hostname") if k in hello
            }
            writes = 0
            for cfg in configs:
                got = link.call("check", config=dict(cfg.as_dict()))
                writes += sum(len(w) for w in dict(got.get("writes", {})).values())
            row["check"] = (
                f"{len(configs)} configurations accepted ({writes} planned writes, none made)"
            )
        except MuskuError as exc:
            row.update(ok=False, error=exc.one_line())
        except Exception as exc:  # a host that cannot be reached: its line, not a traceback
            row.update(ok=False, error=f"{type(exc).__name__}: {exc}")
        finally:
            if link is not None:
                link.close()
        out["ok"] = out["ok"] and row["ok"]
        out["hosts"].append(row)
    return out


def _check_local(experiment: Any, configs: list[Configuration]) -> dict[str, Any]:
    """This host's knobs, probed read-only, each planned value validated and dry-run."""
    fs = HostFS("/", read_only=True)
    row: dict[str, Any] = {"name": "local", "ok": True, "knobs": {}}
    values: dict[str, set[Any]] = {}
    for cfg in configs:
        for knob, v in cfg.settings:
            if knob in experiment.space:
                values.setdefault(knob, set()).add(v)
    for knob, vals in values.items():
        try:
            k = load_knob(knob, fs)
            support = k.probe()
            if not support.supported:
                row["knobs"][knob] = f"unsupported: {support.reason}"
                row["ok"] = False
                continue
            writes = 0
            for v in sorted(vals, key=str):
                writes += len(k.apply(k.validate(v), dry_run=True))
            row["knobs"][knob] = (
                f"{len(vals)} settings accepted ({writes} planned writes, none made)"
            )
        except MuskuError as exc:
            row["knobs"][knob] = exc.one_line()
            row["ok"] = False
    return {"backend": "local", "ok": row["ok"], "hosts": [row]}


def estimate(experiment: Any, plan: Mapping[str, Any], past: Any = None) -> dict[str, Any]:
    """Host time the sweep would take: from ``past`` (comparisons of an earlier run) when
    given, else from the statistics settings and the model."""
    n = int(plan["comparisons_planned"])
    st = experiment.stats
    per_window = st.sample_interval_s
    if experiment.hosts.backend == "local":  # switchback: two sub-windows, each switched
        from musku.hosts.local import window_seconds

        per_window = window_seconds(st.sample_interval_s, experiment.hosts.options)
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
    per = None
    if experiment.hosts.backend == "sim":
        per = _model_seconds(experiment)
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
    backend, opts = experiment.hosts.backend, experiment.hosts.options
    if backend == "sim" and opts.get("fleet") is not None:
        names = host_names(int(opts["fleet"]))
    elif backend == "agent" and len(entries := agent_entries(experiment)) > 2:
        names = [entry_name(e) for e in entries]
    else:
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


def _model_seconds(experiment: Any) -> float | None:
    """Host seconds of a comparison whose effect is twice min_effect: the windows for the
    confidence sequence (radius ~3 standard errors) to clear zero, with the model's AR(1) noise
    on both hosts, plus two warm-ups and the apply time (reboots where a reboot knob changes)."""
    opt = experiment.hosts.options.get("model")
    if not isinstance(opt, str):
        return None
    try:
        model = SimModel.load(experiment.resolve(opt), space=experiment.space)
    except MuskuError:
        return None
    noise = model.noise
    scale = float(experiment.hosts.options.get("noise_scale", 1.0) or 1.0)
    sd = (
        math.sqrt(2.0) * noise.ar_sigma * scale * math.sqrt((1 + noise.ar_phi) / (1 - noise.ar_phi))
    )
    st = experiment.stats
    half = st.min_effect  # an effect of 2 x min_effect clears 0 at this half-width
    windows = min(st.sample_cap, math.ceil((3.0 * sd / half) ** 2))
    timing = model.timing
    return 2 * st.warmup_s + windows * st.sample_interval_s + 2 * timing.apply_s


def dry_run(experiment: Any, store: PastRuns | None = None) -> dict[str, Any]:
    from musku.summary import decidable  # lazy: above the experiment model

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
