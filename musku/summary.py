"""What the read commands report, as library calls: ``musku check``'s summary of an experiment
and ``musku sku diff``'s knob-by-knob difference. Plain data (the ``--json`` forms); the CLI
only renders them (:mod:`musku.display`), and tests call these directly."""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from musku.abtest.structure import feasibility
from musku.design.advice import mode_advice
from musku.domain import ComparisonResult, SoftSku, TimeBreakdown, Value
from musku.errors import InputError
from musku.experiment import Experiment, load_experiment
from musku.hosts.backend import backend_of
from musku.knob_spec import sort_key
from musku.storage.protocols import SkuStore


def experiment_summary(exp: Experiment) -> dict[str, Any]:
    """What a sweep of ``exp`` would do: its space, comparisons, metric, hosts, co-tuning."""
    data: dict[str, Any] = {
        "experiment": exp.name,
        "service": exp.service.name,
        "platform": exp.platform.name,
        "mode": str(exp.mode),
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
        "decidable": decidable(exp),
        "mode_advice": mode_advice(exp),  # pairwise or multiarm: which is expected faster
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


def noise_guess(exp: Experiment) -> tuple[float, str] | None:
    """(sd of one window's log-ratio B vs A, where it comes from) as far as is known before
    anything runs, from the backend (``Backend.prior``): the simulator's model (both hosts'
    AR(1) noise), the local backend's documented guess for this VM; None for agent hosts
    (nothing known)."""
    prior = backend_of(exp).prior(exp)
    return None if prior is None else (prior.noise_sd, prior.noise_source)


def decidable(exp: Experiment) -> dict[str, Any]:
    """Whether the sample cap can allow a decision at min_effect
    (:func:`musku.abtest.structure.feasibility`), with the noise assumed and the cap that
    would; ``check`` and ``sweep --dry-run`` show it before anything runs."""
    guess = noise_guess(exp)
    fit = feasibility(exp.stats, guess[0] if guess else None)
    return {**fit.to_json(), "noise_source": guess[1] if guess else None}


def check_structure(exp: Experiment) -> None:
    """Refuse a sample cap too small for any decision (the first possible decision point does
    not fit in it), before hosts open: one line, exit 3, with the cap that would."""
    fit = feasibility(exp.stats)
    if not fit.ok:
        raise InputError(f"[statistics] {fit.reason}", where=str(exp.path))


def check_host_files(exp: Experiment) -> None:
    """What the backend's factory reads before it opens a host, read and checked the same
    way, without opening one (``Backend.check_files``: for ``sim``, the model file against
    the experiment). ``musku check``, ``sweep`` and ``pair calibrate`` call this, so that
    check refuses what the sweep would (nothing is simulated or written). Also refuses a
    sample cap too small for any decision (:func:`check_structure`)."""
    check_structure(exp)
    backend_of(exp).check_files(exp)


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


def sku_diff(store: SkuStore, first: int, second: int) -> SkuDiff:
    """``musku sku diff``: the soft SKUs ``first`` and ``second`` of the results DB, knob by
    knob in the registry's order; InputError naming an id that is not there."""
    recs = [store.softsku(first), store.softsku(second)]
    for i, rec in zip((first, second), recs, strict=True):
        if rec is None:
            raise InputError(f"no soft SKU with id {i}")
    a, b = (r.sku for r in recs if r is not None)
    rows = []
    for knob in sorted(set(a.configuration) | set(b.configuration), key=sort_key):
        va: Value | None = a.configuration.get(knob)
        vb: Value | None = b.configuration.get(knob)
        if va is None and vb is None:
            continue
        rows.append({"knob": knob, "first": va, "second": vb, "same": va == vb})
    return SkuDiff(first, second, (a, b), rows)


def time_totals(results: Iterable[ComparisonResult]) -> dict[str, float | int]:
    """Where the results' host time went, summed (``musku results NAME --json``'s ``time``):
    the :class:`~musku.domain.TimeBreakdown` parts in host seconds, their total, and how many
    results recorded none (stored before revision 0009, multi-arm per-arm rows)."""
    time, missing = TimeBreakdown.total(results)
    return {**time.as_dict(), "total_s": time.total_s, "missing": missing}
