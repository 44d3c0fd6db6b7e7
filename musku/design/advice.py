"""Which sweep mode is expected to reach the soft SKU sooner on a pool: ``pairwise``
(``mode = "independent"`` on the pool's pairs) or ``multiarm`` (issue 32 item 4).

``musku check`` and ``musku sweep --dry-run`` print it. The answer rests on the figures measured
on the Web/Skylake model (docs/design.md "Figures"): on 8, 16 and 32 simulated hosts the
multi-arm sweep took longer to the soft SKU (host-clock) and 2.6-3.5x the host-hours of the
pairwise one, because a group holds K + 1 hosts for at least two design cycles with a warm-up
discard at every switch (and a reboot per switch for reboot knobs), whatever the effect sizes.
A lone scan of a knob with many settings and no reboot is where multi-arm can be sooner on the
clock (shp, 7 settings: 0.71x the pairwise time, still 2.5x the host-hours), so such knobs are
named. No host is opened."""

from __future__ import annotations

from typing import Any

from musku.experiment import Experiment
from musku.hosts.backend import backend_of

# docs/design.md, bench/fleet.py --seeds 10 (2026-11-26): hosts -> (pairwise host-clock h,
# pairwise host-hours, multiarm host-clock h, multiarm host-hours), medians
MEASURED: dict[int, tuple[float, float, float, float]] = {
    8: (10.64, 46.1, 16.88, 122.5),
    16: (6.59, 41.2, 15.48, 167.5),
    32: (6.59, 41.2, 12.37, 167.5),
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
    text = (
        f"pairwise expected faster on {n} hosts: measured at {near} hosts (Web/Skylake, "
        f"docs/design.md) {pc:.1f} h host-clock and {ph:.0f} host-hours against multiarm's "
        f"{mc:.1f} h and {mh:.0f}; multiarm holds K+1 hosts per knob for >= 2 design cycles"
    )
    if many:
        text += (
            f"; multiarm may finish a lone scan of {', '.join(many)} sooner "
            f"(>= {MANY_SETTINGS} settings, no reboot) at more host-hours"
        )
    return {"hosts": n, "faster": "pairwise", "knobs": many, "text": text}
