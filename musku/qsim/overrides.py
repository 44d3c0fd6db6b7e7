"""A normalised qsim document with a run's command-line overrides (``--qps``, ``--duration``,
``--seed``): plain dictionaries, free of the model's pydantic schema, so the quick path
(:mod:`musku.qsim.quick`) applies them to a cached document without loading it."""

from __future__ import annotations

import math

from musku.errors import InputError

TYPE_CHECKING = False  # not typing's: the qsim quick path never imports typing
if TYPE_CHECKING:
    from typing import Any

MAX_COUNT = (1 << 53) - 1  # max_requests, max_live_*: the engine reads them as doubles
MAX_DURATION_S = 1e6  # simulated seconds (11.6 days): [run] duration_s, epochs, --duration
MAX_QPS = 1e9  # an open-loop rate


def with_overrides(
    doc: dict[str, Any],
    *,
    qps: float | None = None,
    duration_s: float | None = None,
    seed: int | None = None,
    max_requests: int | None = None,
) -> dict[str, Any]:
    """A copy of a normalised document with the run's command-line overrides applied."""
    out = dict(doc)
    if duration_s is not None:
        if not (math.isfinite(duration_s) and 0 < duration_s <= MAX_DURATION_S):
            raise InputError(
                f"--duration must be > 0 and at most {MAX_DURATION_S:g} s, not {duration_s}"
            )
        out["duration_s"] = duration_s
        out["warmup_s"] = min(doc["warmup_s"], duration_s / 10)
    if seed is not None:
        if not 0 <= seed < 2**63:
            raise InputError(f"--seed must be in 0..2^63-1, not {seed}")
        out["seed"] = seed
    if max_requests is not None:
        if not 0 <= max_requests <= MAX_COUNT:
            raise InputError(f"max_requests must be in 0..{MAX_COUNT}, not {max_requests}")
        out["max_requests"] = max_requests
    if qps is not None:
        if not (math.isfinite(qps) and 0 < qps <= MAX_QPS):
            raise InputError(f"--qps must be > 0 and at most {MAX_QPS:g}, got {qps}")
        client = dict(doc["client"])
        if client["kind"] != "open":
            raise InputError("--qps needs an open-loop client (this model's client is closed)")
        client["epochs"] = [{"end_s": out["duration_s"] * 2, "qps": qps}]
        out["client"] = client
    elif duration_s is not None and doc["client"]["kind"] == "open":
        client = dict(doc["client"])
        eps = [dict(e) for e in client["epochs"]]
        eps[-1]["end_s"] = max(eps[-1]["end_s"], out["duration_s"] * 2)
        client["epochs"] = eps
        out["client"] = client
    return out
