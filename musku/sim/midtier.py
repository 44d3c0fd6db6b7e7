"""Simulated mid-tiers: the co-tuner's seams (:class:`musku.tune.cotune.Endpoint`,
:class:`musku.tune.cotune.Trainer`) on a simulated host, so sim hosts co-tune through the very
code path real hosts take (table cache, results DB, training, ``auto`` with a table file).

A :class:`SimMidtier` holds what the host's mid-tier runs: a fixed model with pool sizes, or
``auto`` with a decision table it loaded (and checked with the rules the C++ side applies:
format, service, CPU count, rows) from a file. Its offered load is the model's ``qps`` at the
host's configuration; in ``auto`` the table row for that load decides the model. The
simulator's throughput then carries the model's ``[threading]`` mismatch cost whenever that
model is not the best one for the host's configuration.

:class:`SimTrainer` "measures" every candidate at every grid load as the model says (the best
model's p99 is the configuration's; any other pays ``mismatch_p99``), builds the table with
:func:`musku.tune.train.build_table` and reports the host seconds real training would take
(points x (duration + warm-up)), which the simulated pair adds to the apply's host time.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

from musku.cotune_spec import MODELS, Candidate, CotuneSpec
from musku.domain import Configuration
from musku.errors import InputError
from musku.experiment import load_platform
from musku.knob_spec import by_resource
from musku.sim.model import SimModel
from musku.tune.cotune import Endpoint, ThreadingState
from musku.tune.table import check_table
from musku.tune.train import build_table


class SimMidtier:
    """One simulated host's mid-tier (an :class:`~musku.tune.cotune.Endpoint`)."""

    def __init__(self, model: SimModel, host: str, service: str, config: Configuration) -> None:
        if model.threading is None:
            raise InputError(f"sim model {model.name!r} has no [threading] section")
        self.model = model
        self.host = host
        self.service = service
        self.config = config
        c = Candidate.of(model.threading.initial, 2)
        self.initial = self._state(c.model, c.pollers, c.workers, c.responders)
        self._fixed = self.initial
        self._table: dict[str, Any] | None = None
        self._table_path = ""
        self.switches = 0

    MAX_POOLS = (4, 8, 4)  # --max-pollers/workers/responders, as musku deploys mid-tiers

    def _state(self, model: str, pollers: int, workers: int, responders: int) -> ThreadingState:
        mp, mw, mr = self.MAX_POOLS
        return ThreadingState(model, pollers, workers, responders, max_pollers=mp,
                              max_workers=mw, max_responders=mr)  # fmt: skip

    def _validate(self, model: str, pollers: int, workers: int, responders: int) -> None:
        """The C++ side's ``ValidateThreading``: InputError (INVALID_ARGUMENT), nothing changes."""
        mp, mw, mr = self.MAX_POOLS
        if model not in MODELS:
            raise InputError(f"unknown threading model {model!r}")
        if not (1 <= pollers <= mp and 0 <= workers <= mw and 0 <= responders <= mr):
            raise InputError(
                f"pool sizes p{pollers} w{workers} r{responders} beyond the maxima "
                f"p{mp} w{mw} r{mr}"
            )
        if "-dispatch-" in model and workers < 1:
            raise InputError(f"{model} needs at least one worker")
        if model.startswith("async-") and responders < 1:
            raise InputError(f"{model} needs at least one response thread")

    # ------------------------------------------------------------------ Endpoint

    def cpus(self) -> int:
        """Active cores at the host's configuration (the catalog's count without a core_count
        knob): a table trained with other cores is stale, as on a real host."""
        cc = by_resource(self.model.full_settings(self.config)).get("cores")
        if isinstance(cc, int):
            return cc
        if self.model.platform:
            return load_platform(self.model.platform).cores
        return 1

    def offered_qps(self) -> float:
        return self.model.reference["qps"] * self.model.throughput(self.config)

    def _row(self) -> dict[str, Any]:
        assert self._table is not None
        qps = self.offered_qps()
        rows = self._table["rows"]
        return next((r for r in rows if qps <= r["max_qps"]), rows[-1])

    def get(self) -> ThreadingState:
        if self._table is None:
            return replace(self._fixed, measured_qps=self.offered_qps())
        r = self._row()
        state = self._state(r["model"], r["pollers"], r["workers"], r["responders"])
        return replace(state, auto_mode=True, table=self._table_path,
                       measured_qps=self.offered_qps())  # fmt: skip

    def set_auto(self, table_path: Path) -> ThreadingState:
        path = str(table_path)
        try:
            data = json.loads(Path(path).read_text())
        except (OSError, ValueError) as exc:
            raise InputError(f"threading table {path} is corrupt: {exc}") from None
        check_table(data, self.service, cpus=self.cpus(), where=path)  # as the mid-tier does
        for r in data["rows"]:
            self._validate(r["model"], r["pollers"], r["workers"], r["responders"])
        self._table, self._table_path = data, path
        self.switches += 1
        return self.get()

    def set_fixed(self, state: ThreadingState) -> ThreadingState:
        self._validate(state.model, state.pollers, state.workers, state.responders)
        self._fixed = self._state(state.model, state.pollers, state.workers, state.responders)
        self._table, self._table_path = None, ""
        self.switches += 1
        return self.get()

    # ------------------------------------------------------------------ the simulator's side

    def running(self) -> str:
        """The model in force now."""
        return self.get().model


class SimTrainer:
    """Trains a table on a :class:`SimMidtier` from the model (a :class:`Trainer`)."""

    def __init__(self, model: SimModel) -> None:
        self.model = model

    def train(self, endpoint: Endpoint, spec: CotuneSpec) -> tuple[dict[str, Any], float]:
        if not isinstance(endpoint, SimMidtier):
            raise InputError("SimTrainer trains simulated mid-tiers only")
        cands = spec.candidates()
        cfg = endpoint.config
        base_p99_us = self.model.metric(cfg, "p99_ms") * 1000.0
        grid: dict[str, dict[float, dict[str, Any]]] = {}
        for q in spec.loads:
            for c in cands:
                # the mid-tier runs each candidate in turn, as real training switches it
                endpoint.set_fixed(ThreadingState(c.model, c.pollers, c.workers, c.responders))
                _, p99_mult = self.model.threading_factor(cfg, c.model)
                p99 = base_p99_us * p99_mult * (1.0 + 0.01 * (c.pollers + c.workers - 1))
                grid.setdefault(c.key(), {})[q] = {
                    "qps": q,
                    "achieved_qps": q,
                    "p50_us": p99 / 3.0,
                    "p99_us": p99,
                    "errors": 0,
                    "ok": int(q * spec.duration_s),
                }
        table = build_table(
            spec.service, list(spec.loads), grid, cands, host=endpoint.host, cpus=endpoint.cpus()
        )
        table["simulated"] = True
        return table, spec.points() * (spec.duration_s + spec.warmup_s)
