"""Which sweep mode is expected to reach the soft SKU sooner on a pool: ``pairwise``
(``mode = "independent"`` on the pool's pairs) or ``multiarm`` (issue 32 item 4, issue 31
item 6).

``musku check`` and ``musku sweep --dry-run`` print it. The answer rests on the figures measured
on the Web/Skylake model (docs/design.md "When to choose multiarm", ``bench/fleet.py``, both
modes in the same run): on 16 simulated hosts pairwise reached the soft SKU sooner and with
fewer host-hours; on 64, multiarm did, on both counts (the guarded probe ends core_count's scan
in minutes, and the free hosts run replicated squares that decide after one design cycle). The
nearest measured pool size decides. A lone scan of a knob with many settings and no reboot is
where multi-arm can be sooner on the clock at any size (shp, 7 settings), so such knobs are
named. No host is opened."""

from __future__ import annotations

from typing import Any

from musku.experiment import Experiment
from musku.hosts.backend import backend_of

# docs/design.md, bench/fleet.py --sizes 16,64 --seeds 5 --jobs 1 (2026-11-28, both modes in
# the same run): hosts -> (pairwise host-clock h, pairwise host-hours, multiarm host-clock h,
# multiarm host-hours), medians; 16 hosts' pairwise figures since the futility stop
# (docs/design.md "The futility stop in the sweep", 6 seeds, 2026-11-29); 64 hosts' not re-measured
MEASURED: dict[int, tuple[float, float, float, float]] = {
    16: (3.98, 54.1, 7.42, 85.0),
    64: (4.63, 143.2, 3.40, 85.8),
}
MANY_SETTINGS = 6  # candidate settings from which a lone multi-arm scan was measured sooner


def pool_hosts(exp: Experiment) -> int:
    """The hosts a sweep of ``exp`` gets: its backend's pool (``Backend.pool_names``: a sim
    ``fleet``, the agent hosts listed), else one pair."""
    names = backend_of(exp).pool_names(exp)
    return 2 if names is None else len(names)


def mode_advice(exp: Experiment) -> dict[str, Any]:
    """``{"hosts", "faster", "text", "knobs"}``: the mode expected to be faster for this pool
    and knob set, one line saying why, and the knobs whose lone scan multi-arm may finish
    sooner (many settings, no reboot)."""
    n = pool_hosts(exp)
    base = exp.baseline_config
    many = [
        k
        for k in exp.space
        if sum(1 for v in exp.space[k] if v != base.get(k)) >= MANY_SETTINGS
        and k not in exp.spec.reboot_knobs
    ]
    if n < 3:
        return {
            "hosts": n,
            "faster": "pairwise",
            "knobs": [],
            "text": f"pairwise: {n} hosts are one pair (multiarm needs >= 3)",
        }
    near = min(MEASURED, key=lambda h: (abs(h - n), h))
    pc, ph, mc, mh = MEASURED[near]
    faster = "multiarm" if mc < pc else "pairwise"
    text = (
        f"{faster} expected faster on {n} hosts: measured at {near} hosts (Web/Skylake, "
        f"docs/design.md) pairwise {pc:.1f} h host-clock and {ph:.0f} host-hours, multiarm "
        f"{mc:.1f} h and {mh:.0f}"
    )
    if many and faster == "pairwise":
        text += (
            f"; multiarm may finish a lone scan of {', '.join(many)} sooner "
            f"(>= {MANY_SETTINGS} settings, no reboot) at more host-hours"
        )
    return {"hosts": n, "faster": faster, "knobs": many, "text": text}
