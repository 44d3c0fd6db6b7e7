"""The agent's side of co-tuning (:mod:`musku.tune.cotune`) on a real host: the mid-tier
reached through ``musku_admin`` (:class:`AdminEndpoint`), tables trained with
:mod:`musku.tune.train` on the running mid-tier (:class:`ServiceTrainer`), and the
``threading`` field of an ``apply`` request (:class:`AgentRequest`, built by the controller's
:class:`musku.hosts.cotune.ControllerTables`)."""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from musku.cotune_spec import CotuneSpec
from musku.errors import HostError, InputError
from musku.services import runtime
from musku.tune.cotune import Endpoint, ThreadingState


class AdminEndpoint:
    """A real mid-tier through ``musku_admin`` (:func:`musku.services.runtime.admin`)."""

    def __init__(self, admin: str = "", admin_port_file: str = "", *, host: str = "") -> None:
        if not admin and not admin_port_file:
            raise InputError("co-tuning needs the mid-tier's admin address or admin_port_file")
        self.admin = admin
        self.port_file = admin_port_file
        self.host = host or socket.gethostname()

    def address(self) -> str:
        """The Admin address (a port file is read each time: the mid-tier may have restarted)."""
        if self.admin:
            return self.admin
        try:
            port = int(Path(self.port_file).read_text().strip())
        except (OSError, ValueError) as exc:
            raise HostError(
                f"cannot read the mid-tier's port from {self.port_file}: {exc}"
            ) from None
        return f"127.0.0.1:{port}"

    def get(self) -> ThreadingState:
        return ThreadingState.from_json(runtime.admin(self.address(), "get"))

    def set_auto(self, table_path: Path) -> ThreadingState:
        return ThreadingState.from_json(
            runtime.set_threading(self.address(), "auto", table=str(table_path))
        )

    def set_fixed(self, state: ThreadingState) -> ThreadingState:
        return ThreadingState.from_json(
            runtime.set_threading(
                self.address(),
                state.model,
                pollers=state.pollers,
                workers=state.workers,
                responders=state.responders,
            )
        )

    def cpus(self) -> int:
        return os.cpu_count() or 1


class ServiceTrainer:
    """Trains on the host's running mid-tier with :func:`musku.tune.train.train` (open-loop
    ``musku_loadgen`` points, switching the mid-tier over the Admin RPC)."""

    def __init__(self, loadgen_cpus: Sequence[int] | None = None) -> None:
        self.loadgen_cpus = loadgen_cpus

    def train(self, endpoint: Endpoint, spec: CotuneSpec) -> tuple[dict[str, Any], float]:
        # lazy: the training code pulls in numpy and scipy, which only a training needs
        from musku.tune import train as tr

        if not isinstance(endpoint, AdminEndpoint):
            raise InputError("ServiceTrainer trains on a real mid-tier (AdminEndpoint)")
        if spec.load_data:
            data = Path(spec.load_data)
            if not data.is_file():
                raise InputError(f"the load generator's data {data} does not exist on this host")
        elif spec.service == "setalgebra":
            data = runtime.setalgebra_data(runtime.default_data_dir())[1]
        else:
            raise InputError(f"co-tuning {spec.service} needs [threading] load_data (the load "
                             "generator's data on the host)")  # fmt: skip
        t0 = time.monotonic()
        table, _grid = tr.train(
            tr.Target(endpoint.address(), spec.service, data),
            list(spec.loads),
            spec.candidates(),
            duration_s=spec.duration_s,
            warmup_s=spec.warmup_s,
            loadgen_cpus=self.loadgen_cpus,
        )
        table["host"] = endpoint.host
        return table, time.monotonic() - t0


@dataclass(frozen=True)
class AgentRequest:
    """The ``threading`` field of an agent ``apply`` request:
    ``{"spec": CotuneSpec JSON, "platform": NAME, "table": TABLE or null}``."""

    spec: CotuneSpec
    platform: str
    table: Mapping[str, Any] | None = None

    @classmethod
    def parse(cls, raw: object) -> AgentRequest | None:
        if raw is None:
            return None
        if not isinstance(raw, Mapping):
            raise InputError("threading must be an object {spec, platform, table}")
        unknown = set(raw) - {"spec", "platform", "table"}
        if unknown:
            raise InputError(f"threading: unknown key(s) {', '.join(sorted(unknown))}")
        spec = CotuneSpec.from_json(raw.get("spec"))
        if not spec.admin and not spec.admin_port_file:
            raise InputError("threading spec needs admin or admin_port_file")
        platform = raw.get("platform", "")
        table = raw.get("table")
        if not isinstance(platform, str) or (table is not None and not isinstance(table, Mapping)):
            raise InputError("threading: platform must be text and table an object")
        return cls(spec, platform, table)

    def to_json(self) -> dict[str, Any]:
        return {"spec": self.spec.to_json(), "platform": self.platform, "table": self.table}
