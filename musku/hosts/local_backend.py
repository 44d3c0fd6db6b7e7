"""The ``local`` host backend (``[hosts] backend = "local"``): one real host, arms A and B
switched back in randomized windows (:mod:`musku.hosts.local`)."""

from __future__ import annotations

from typing import Any

from musku.domain import Configuration
from musku.errors import MuskuError
from musku.experiment import Experiment
from musku.hostfs import HostFS
from musku.hosts.backend import Backend, Prior
from musku.hosts.local import NOISE_SD_GUESS, LocalSwitchbackPair, open_pair, window_seconds
from musku.knobs import load_knob
from musku.schema.hosts import LocalOptions


class LocalBackend(Backend):
    """This machine, both arms on it (switchback)."""

    name = "local"
    options = LocalOptions
    real_hosts = True

    def open_pair(self, experiment: Experiment, *, seed: int = 0) -> LocalSwitchbackPair:
        return open_pair(experiment, seed=seed)

    def prior(self, experiment: Experiment) -> Prior | None:
        return Prior(
            noise_sd=NOISE_SD_GUESS,
            noise_source="the local backend's guess (measured on a busy 2-vCPU VM)",
        )

    def window_s(self, experiment: Experiment, interval_s: float) -> float:
        """Switchback: two sub-windows, each switched."""
        return window_seconds(interval_s, experiment.hosts.options)

    def check(self, experiment: Experiment, configs: list[Configuration]) -> dict[str, Any]:
        """This host's knobs, probed read-only, each planned value validated and dry-run
        (the same code as the agent's ``check``)."""
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
        return {"backend": self.name, "ok": row["ok"], "hosts": [row]}
