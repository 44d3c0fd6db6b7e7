"""What the read commands report, as library calls: ``musku check``'s summary of an experiment
and ``musku sku diff``'s knob-by-knob difference. Plain data (the ``--json`` forms); the CLI
only renders them (:mod:`musku.display`), and tests call these directly."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from musku.domain import SoftSku, Value
from musku.errors import InputError
from musku.experiment import Experiment, load_experiment
from musku.knobs.spec import sort_key
from musku.sim.model import SimModel


def experiment_summary(exp: Experiment) -> dict[str, Any]:
    """What a sweep of ``exp`` would do: its space, comparisons, metric, hosts, co-tuning."""
    data: dict[str, Any] = {
        "experiment": exp.name,
        "service": exp.service.name,
        "platform": exp.platform.name,
        "mode": exp.mode.value,
        "baseline": exp.baseline,
        "knobs": {k: list(v) for k, v in exp.space.items()},
        "stock": exp.stock.as_dict(),
        "production": exp.production.as_dict(),
        "independent_comparisons": sum(len(v) - 1 for v in exp.space.values()),
        "exhaustive_configurations": math.prod(len(v) for v in exp.space.values()),
        "metric": {"primary": exp.spec.metric, "direction": exp.spec.direction.value},
        "guardrails": [str(g) for g in exp.spec.guardrails],
        "statistics": exp.stats.__dict__,
        "hosts": {"backend": exp.hosts.backend, **dict(exp.hosts.options)},
        "threading": None,
    }
    ct = exp.cotune
    if ct is not None:
        data["threading"] = {
            "cotune": True,
            "service": ct.service,
            "loads": list(ct.loads),
            "candidates": [c.key() for c in ct.candidates()],
            "seconds_per_point": ct.duration_s + ct.warmup_s,
        }
    return data


def check_host_files(exp: Experiment) -> None:
    """What the backend's factory reads before it opens a host, read and checked the same
    way, without opening one: for ``sim``, the model file against the experiment. ``musku
    check``, ``sweep`` and ``pair calibrate`` call this, so that check refuses what the sweep
    would (nothing is simulated or written). Here, above the experiment model, because it
    reads the simulator's model (which reads platform catalogs through the experiment's
    loader)."""
    if exp.hosts.backend != "sim":
        return
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


def check_experiment(path: str | Path) -> tuple[Experiment, dict[str, Any]]:
    """``musku check``: load and validate the experiment file, check what the sweep reads
    before its hosts open (the sim model), and summarise it. InputError on bad input."""
    exp = load_experiment(path)
    check_host_files(exp)
    return exp, experiment_summary(exp)


@dataclass(frozen=True)
class SkuDiff:
    """Two soft SKUs knob by knob (:func:`sku_diff`)."""

    first: int
    second: int
    skus: tuple[SoftSku, SoftSku]
    rows: list[dict[str, Any]]  # {"knob", "first", "second", "same"}: knobs either one sets

    def to_dict(self) -> dict[str, Any]:
        return {"first": self.first, "second": self.second, "knobs": self.rows}


def sku_diff(store: Any, first: int, second: int) -> SkuDiff:
    """``musku sku diff``: the soft SKUs ``first`` and ``second`` of the results DB, knob by
    knob in the registry's order; InputError naming an id that is not there."""
    recs = [store.softsku(first), store.softsku(second)]
    for i, rec in zip((first, second), recs, strict=True):
        if rec is None:
            raise InputError(f"no soft SKU with id {i}")
    a, b = (r.sku for r in recs)
    rows = []
    for knob in sorted(set(a.configuration) | set(b.configuration), key=sort_key):
        va: Value | None = a.configuration.get(knob)
        vb: Value | None = b.configuration.get(knob)
        if va is None and vb is None:
            continue
        rows.append({"knob": knob, "first": va, "second": vb, "same": va == vb})
    return SkuDiff(first, second, (a, b), rows)
