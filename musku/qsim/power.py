"""A QoS-aware power manager on a qsim model, in the manner of μqSim's (docs/qsim.md, "Power").

The engine runs with a controller (``musku_qsim MODEL --control``): every ``window_s`` of
simulated time it reports the window's end-to-end p99 and, per service (a *tier*), its p99, its
busy core-seconds and its cores; the manager answers with the tiers' frequencies, applied from
then on (each stage scales by its ``dvfs_scale``: ``t (1 - s + s f_base / f)``).

:class:`QosPowerManager` follows the design μqSim's paper describes (our own code): the
end-to-end QoS target's range is cut into latency *buckets*; per bucket it remembers the per-tier
latency vectors seen while QoS was met (keeping those not dominated, i.e. the ones that use more
slack in some tier). Each decision it picks a target vector from the highest bucket it dares
(each bucket is accepted with a probability that rises after a slow-down that held QoS and falls
after one that did not), speeds up the tiers slower than the target, and slows down **one** tier
with slack, at random, one frequency step; then it observes for a few decisions before slowing
again. A QoS violation speeds up the tiers above the target (all of them without one).

:class:`PowerModel` turns busy and idle core-seconds at a frequency into energy.
"""

from __future__ import annotations

import json
import random
import subprocess
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from musku.errors import MuskuError
from musku.qsim.engine import Limits, binary, encode


@dataclass(frozen=True)
class PowerModel:
    """Per-core power: ``static_w`` always (idle or busy), plus, while busy, ``dynamic_w`` at
    ``f_max_ghz`` scaled by ``(f / f_max)^exponent`` (dynamic power ~ f V^2 with the voltage
    roughly proportional to f over the DVFS range: the cube). Defaults: a server core of the
    μqSim paper's Xeon class (2.6 GHz, ~8 W busy, ~2 W idle; an assumption, not a measurement)."""

    static_w: float = 2.0
    dynamic_w: float = 6.0
    f_max_ghz: float = 2.6
    exponent: float = 3.0

    def energy_j(self, busy_core_s: float, cores: int, window_s: float, f_ghz: float) -> float:
        dyn = self.dynamic_w * (f_ghz / self.f_max_ghz) ** self.exponent
        return self.static_w * cores * window_s + dyn * busy_core_s


@dataclass
class _Point:
    lat: dict[str, float]  # tier -> p99 us

    def dominates(self, o: _Point) -> bool:  # uses more slack in every tier
        return all(self.lat[k] > o.lat[k] for k in self.lat)


@dataclass
class _Bucket:
    points: list[_Point] = field(default_factory=list)
    prob: float = 1.0
    seen: bool = False

    def insert(self, p: _Point) -> None:
        if any(q.dominates(p) for q in self.points):
            return
        self.points = [q for q in self.points if not p.dominates(q)] + [p]


class QosPowerManager:
    """μqSim-style per-tier DVFS under an end-to-end p99 target (see the module's docstring)."""

    def __init__(
        self,
        tiers: list[str],
        qos_p99_us: float,
        freqs_ghz: list[float],
        *,
        buckets: int = 20,
        observe: int = 5,
        seed: int = 1,
    ) -> None:
        self.tiers = tiers
        self.qos = qos_p99_us
        self.freqs = sorted(freqs_ghz)
        self.level = {t: len(self.freqs) - 1 for t in tiers}  # start at the highest frequency
        self.buckets = [_Bucket() for _ in range(buckets)]
        self.step = qos_p99_us / buckets
        self.observe = observe
        self.observing = 0
        self.slowed: str | None = None
        self.slowed_bucket = -1
        self.current = -1  # the bucket the target came from
        self.target: _Point | None = None
        self.rng = random.Random(seed)

    def freq(self, tier: str) -> float:
        return self.freqs[self.level[tier]]

    def _bucket(self, p99: float) -> int:
        return min(len(self.buckets) - 1, int(p99 / self.step))

    def _up(self, tier: str) -> None:
        self.level[tier] = min(len(self.freqs) - 1, self.level[tier] + 1)

    def decide(self, e2e_p99: float, lat: dict[str, float]) -> None:
        """One decision from the last interval's end-to-end and per-tier p99s."""
        if e2e_p99 > self.qos:  # violation: speed up
            if self.slowed is not None:  # the last slow-down did it: trust that bucket less
                for bk in self.buckets[self.slowed_bucket :]:
                    bk.prob /= 4
            above = [t for t in self.tiers if self.target and lat[t] > self.target.lat[t]]
            for t in above or self.tiers:
                self._up(t)
            self.slowed, self.observing, self.target, self.current = None, 0, None, -1
            return
        point = _Point(dict(lat))
        b = self._bucket(e2e_p99)
        if not self.buckets[b].seen:  # a new bucket starts with its nearest lower one's trust
            lower = [x for x in self.buckets[:b] if x.seen]
            self.buckets[b].prob = lower[-1].prob if lower else 1.0
            self.buckets[b].seen = True
        self.buckets[b].insert(point)
        if self.observing > 0:
            self.observing -= 1
            if self.target is not None:
                for t in self.tiers:
                    if lat[t] > self.target.lat[t] and t != self.slowed:
                        self._up(t)
            if self.observing == 0 and self.slowed is not None:  # the slow-down held QoS
                for x in self.buckets[: self.slowed_bucket + 1]:
                    x.prob = min(1.0, x.prob * 1.1)
                self.slowed = None
            return
        # choose the target: climb the buckets above the current one while each is accepted
        chosen = -1
        for i in range(max(0, self.current), len(self.buckets)):
            bk = self.buckets[i]
            if not bk.points:
                continue
            if chosen < 0 or self.rng.random() <= bk.prob:
                chosen = i
            else:
                break
        if chosen < 0:
            return
        self.current = chosen

        def cost(p: _Point) -> float:  # the point nearest to now (least change)
            return sum(p.lat[t] / max(1e-9, lat[t]) for t in self.tiers)

        self.target = min(self.buckets[chosen].points, key=cost)
        slack = []
        for t in self.tiers:
            if lat[t] < self.target.lat[t] and self.level[t] > 0:
                slack.append(t)
            elif lat[t] >= self.target.lat[t]:
                self._up(t)
        if not slack:  # nothing to slow down towards the target: try one tier anyway
            slack = [t for t in self.tiers if self.level[t] > 0]
        if slack:
            t = self.rng.choice(slack)
            self.level[t] -= 1
            self.slowed, self.slowed_bucket, self.observing = t, b, self.observe


def run_controlled(
    doc: dict[str, Any],
    window_s: float,
    on_window: Callable[[dict[str, Any]], dict[str, Any]],
) -> dict[str, Any]:
    """Run a normalised model through ``musku_qsim --control``: ``on_window`` gets each
    window's report (engine.h, ``Controller``) and returns the answer (``{}``, ``{"freq_ratio":
    [...]}`` or ``{"stop": true}``). Returns the engine's result document."""
    if not window_s > 0:
        raise MuskuError(f"the control window must be positive, not {window_s}")
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as tf:
        tf.write(encode(dict(doc, control_interval_s=window_s)).decode())
        path = Path(tf.name)
    try:
        with subprocess.Popen(
            [str(binary()), str(path), "--control"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            preexec_fn=Limits.from_env().preexec(),  # noqa: PLW1509 - setrlimit only
        ) as proc:
            assert proc.stdin is not None and proc.stdout is not None
            result: dict[str, Any] | None = None
            try:
                for line in proc.stdout:
                    rep = json.loads(line)
                    if "t_s" not in rep:
                        result = rep
                        break
                    proc.stdin.write(json.dumps(on_window(rep)) + "\n")
                    proc.stdin.flush()
            finally:
                proc.stdin.close()
                err = proc.stderr.read() if proc.stderr else ""
                rc = proc.wait()
        if rc != 0 or result is None:
            raise MuskuError(f"musku_qsim --control exited with status {rc}: {err.strip()}")
        return result
    finally:
        path.unlink(missing_ok=True)


def run_managed(
    doc: dict[str, Any],
    *,
    qos_p99_us: float,
    decision_s: float,
    window_s: float = 0.1,
    freqs_ghz: list[float] | None = None,
    power: PowerModel | None = None,
    manage: bool = True,
    seed: int = 1,
    f_base_ghz: float = 2.6,
) -> dict[str, Any]:
    """Run a normalised model with the power manager deciding every ``decision_s`` (a multiple of
    ``window_s``; between decisions the per-tier p99s are the maximum over the windows).
    ``manage=False``: every tier stays at the highest frequency (the baseline). Returns the
    windows (p99, violation, frequencies, energy), the violation rate and the energy."""
    power = power or PowerModel()
    freqs = sorted(freqs_ghz or [1.2 + 0.2 * i for i in range(8)])  # μqSim's 1.2..2.6 GHz
    names = [s["name"] for s in doc["services"]]
    base = [f_base_ghz] * len(names)  # the machines' base frequency (ratio = f_base / f)
    tiers = [s["name"] for s in doc["services"]]
    mgr = QosPowerManager(tiers, qos_p99_us, freqs, seed=seed)
    every = max(1, round(decision_s / window_s))
    windows: list[dict[str, Any]] = []
    agg_e2e = 0.0
    agg: dict[str, float] = dict.fromkeys(tiers, 0.0)

    def on_window(rep: dict[str, Any]) -> dict[str, Any]:
        nonlocal agg_e2e, agg
        f_now = {t: mgr.freq(t) if manage else freqs[-1] for t in tiers}
        energy = sum(
            power.energy_j(s["busy_core_s"], s["cores"], window_s, f_now[s["name"]])
            for s in rep["services"]
        )
        windows.append({
            "t_s": rep["t_s"],
            "count": rep["count"],
            "p99_us": rep["p99_us"],
            "violation": rep["count"] > 0 and rep["p99_us"] > qos_p99_us,
            "freq_ghz": f_now,
            "energy_j": energy,
        })  # fmt: skip
        if rep["count"] > 0:
            agg_e2e = max(agg_e2e, rep["p99_us"])
            for s in rep["services"]:
                agg[s["name"]] = max(agg[s["name"]], s["p99_us"])
        if not manage or len(windows) % every:
            return {}
        if agg_e2e > 0:
            mgr.decide(agg_e2e, agg)
        agg_e2e, agg = 0.0, dict.fromkeys(tiers, 0.0)
        return {"freq_ratio": [base[i] / mgr.freq(n) for i, n in enumerate(names)]}

    result = run_controlled(doc, window_s, on_window)
    measured = [w for w in windows if w["count"] > 0]
    return {
        "decision_s": decision_s,
        "window_s": window_s,
        "windows": windows,
        "violation_rate": sum(w["violation"] for w in measured) / max(1, len(measured)),
        "energy_j": sum(w["energy_j"] for w in windows),
        "result": result,
    }
