"""``[sweep] order_by = "prediction"``: each knob's settings walked in the order of their gain
predicted by the experiment's queueing model (:mod:`musku.qsim.predict`, docs/qsim.md
"Predicting a sweep"). The predictions run once per experiment (cached here) before the first
scan; what is compared, and how each comparison decides, are unchanged: only the order of a
knob's settings (one walk), or of its two walks (``scan = "unimodal"``: each walk keeps its
outward order, which its stop rule needs; the walk holding the best predicted setting goes
first)."""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import Any

from musku.qsim.predict import gains, predict

_lock = threading.Lock()
_cache: dict[tuple[Any, ...], dict[str, dict[Any, float]]] = {}


def _key(experiment: Any) -> tuple[Any, ...]:
    return (
        str(experiment.path),
        experiment.baseline_config,  # not the run's seed: `sweep --seed` keeps the file's order
        tuple((k, tuple(experiment.space[k])) for k in experiment.service.knobs),
    )


def scan_gains(experiment: Any) -> Mapping[str, Mapping[Any, float]]:
    """Per knob, each setting's predicted gain in the primary metric's good direction (run
    once per experiment; a missing model is an InputError, exit 3)."""
    key = _key(experiment)
    with _lock:  # pool scans ask from several threads: one prediction
        if key not in _cache:
            _cache[key] = gains(predict(experiment))
        return _cache[key]


def ordered(experiment: Any, knob: str, walks: list[list[object]]) -> list[list[object]]:
    """``walks`` (:func:`musku.sweep.schedule.scan_order`) in the predicted order."""
    return by_gain(walks, scan_gains(experiment).get(knob, {}))


def by_gain(walks: list[list[object]], gain: Mapping[Any, float]) -> list[list[object]]:
    """One walk: its settings by ``gain``, best first, those without one after in their
    order. Two walks (``scan = "unimodal"``): each kept as it is, the one holding the best
    gain first (a tie keeps their order)."""
    if not gain:
        return walks
    if len(walks) == 1:
        known = [v for v in walks[0] if v in gain]
        rest = [v for v in walks[0] if v not in gain]
        return [sorted(known, key=lambda v: -gain[v]) + rest]

    def best(walk: list[object]) -> float:
        return max((gain[v] for v in walk if v in gain), default=float("-inf"))

    return sorted(walks, key=lambda w: -best(w))
