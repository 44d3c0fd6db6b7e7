"""Fakes at the co-tuner's seams: a mid-tier that enforces the C++ side's rules on tables and
pool sizes (``services/framework/src/auto_policy.cc``, ``threading.cc``), and trainers that
succeed, fail or return bad tables. Plus a real SQLite results store."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

from musku.cotune_spec import MODELS, Candidate, CotuneSpec
from musku.errors import HostError, InputError
from musku.tune.cotune import Endpoint, ThreadingState
from musku.tune.table import check_table
from musku.tune.train import build_table


class FakeMidtier:
    """An :class:`~musku.tune.cotune.Endpoint`: one mid-tier's threading control."""

    def __init__(
        self,
        host: str = "h1",
        *,
        cpus: int = 8,
        service: str = "setalgebra",
        model: str = "async-dispatch-block",
        maxima: tuple[int, int, int] = (4, 8, 4),
        leaf_transport: str = "unary",
    ) -> None:
        self.host = host
        self.ncpus = cpus
        self.leaf_transport = leaf_transport
        self.service = service
        self.maxima = maxima
        self.state = self._state(Candidate.of(model, 2))
        self.loaded: list[str] = []  # table paths set_auto accepted
        self.refusals: list[str] = []  # set_auto refuses the next tables with these reasons
        self.unreachable = False

    def _state(self, c: Candidate, **kw: Any) -> ThreadingState:
        mp, mw, mr = self.maxima
        return ThreadingState(c.model, c.pollers, c.workers, c.responders, max_pollers=mp,
                              max_workers=mw, max_responders=mr,
                              leaf_transport=self.leaf_transport, **kw)  # fmt: skip

    def _validate(self, model: str, p: int, w: int, r: int) -> None:
        mp, mw, mr = self.maxima
        if model not in MODELS:
            raise InputError(f"unknown threading model {model!r}")
        if not (1 <= p <= mp and 0 <= w <= mw and 0 <= r <= mr):
            raise InputError(f"pools p{p} w{w} r{r} beyond the maxima")

    def get(self) -> ThreadingState:
        if self.unreachable:
            raise HostError(f"cannot reach the mid-tier on {self.host}")
        return self.state

    def set_auto(self, table_path: Path) -> ThreadingState:
        if self.refusals:
            raise InputError(self.refusals.pop(0))
        try:
            data = json.loads(Path(table_path).read_text())
        except (OSError, ValueError) as exc:
            raise InputError(f"threading table {table_path} is corrupt: {exc}") from None
        check_table(data, self.service, cpus=self.ncpus, leaf_transport=self.leaf_transport,
                    where=str(table_path))  # fmt: skip
        for r in data["rows"]:
            self._validate(r["model"], r["pollers"], r["workers"], r["responders"])
        r = data["rows"][0]
        c = Candidate(r["model"], r["pollers"], r["workers"], r["responders"])
        self.state = self._state(c, auto_mode=True, table=str(table_path), measured_qps=42.0)
        self.loaded.append(str(table_path))
        return self.state

    def set_fixed(self, state: ThreadingState) -> ThreadingState:
        self._validate(state.model, state.pollers, state.workers, state.responders)
        c = Candidate(state.model, state.pollers, state.workers, state.responders)
        self.state = self._state(c)
        return self.state

    def cpus(self) -> int:
        return self.ncpus


class FakeTrainer:
    """Trains a one-row table whose best model is ``best``; it switches the mid-tier through
    every candidate first, as real training does. ``fail`` makes it raise half-way."""

    def __init__(self, best: str = "sync-inline-block", *, seconds: float = 100.0) -> None:
        self.best = best
        self.seconds = seconds
        self.calls = 0
        self.fail: Exception | None = None
        self.corrupt = False  # return a table with a bad row

    def train(self, endpoint: Endpoint, spec: CotuneSpec) -> tuple[dict[str, Any], float]:
        self.calls += 1
        cands = spec.candidates()
        for c in cands[: len(cands) // 2 or 1]:
            endpoint.set_fixed(ThreadingState(c.model, c.pollers, c.workers, c.responders))
        if self.fail is not None:
            raise self.fail
        best = Candidate.of(self.best, spec.workers[0])
        grid = {
            c.key(): {
                q: {
                    "qps": q,
                    "achieved_qps": q,
                    "errors": 0,
                    "p99_us": 100.0 if c == best else 300.0,
                }  # fmt: skip
                for q in spec.loads
            }
            for c in {*cands, best}
        }
        table = build_table(spec.service, list(spec.loads), grid, sorted({*cands, best}),
                            host=endpoint.host, cpus=endpoint.cpus(),
                            leaf_transport=endpoint.get().leaf_transport)  # fmt: skip
        if self.corrupt:
            table["rows"] = [dict(table["rows"][0], model="no-such-model")]
        return table, self.seconds


def spec(**kw: Any) -> CotuneSpec:
    base: dict[str, Any] = {
        "service": "setalgebra",
        "loads": (100.0, 1000.0),
        "models": ("sync-inline-block", "async-dispatch-block"),
        "workers": (1, 2),
        "duration_s": 1.0,
        "warmup_s": 0.1,
    }
    base.update(kw)
    return CotuneSpec(**base)


def table_for(endpoint: FakeMidtier, model: str = "sync-inline-block", **over: Any) -> dict:
    """A valid table for ``endpoint`` (as if trained earlier), with ``over`` changes."""
    c = Candidate.of(model, 1)
    t = {
        "format": "musku-threading-table/1",
        "service": endpoint.service,
        "host": endpoint.host,
        "cpus": endpoint.ncpus,
        "rows": [{"max_qps": 1e12, **c.row()}],
    }
    t.update(over)
    return t


def same_state(a: ThreadingState, b: ThreadingState) -> bool:
    """Equal threading (what runs), whatever the measured load."""
    return replace(a, measured_qps=0.0) == replace(b, measured_qps=0.0)
