"""Co-tuning: judge every knob configuration under test with its best threading.

Fewer cores or another frequency change which threading model serves a mid-tier best, so an
A/B comparison of a knob is only fair when each side runs the threading that suits *its*
configuration. After the knobs of a configuration are applied and verified (and before any
measurement window), the :class:`CoTuner` of a host

1. looks up the threading decision table for (service, host, platform, configuration key):
   first the on-disk cache, then the results DB (the controller's store, or a table the
   controller offers with the request);
2. trains it when there is none (:mod:`musku.tune.train` on the host's running mid-tier;
   training is host time: real backends spend it inside ``apply``, the simulator advances its
   clock by it) and stores it in the cache and the DB;
3. puts the mid-tier on ``auto`` with that table over the Admin RPC and reports what it runs
   now, e.g. ``auto:3f9a0c1e async-dispatch-block p1 w2 r1 @ 950 qps``.

A cached or stored table that is corrupt, stale (trained on another CPU count) or refused by
the mid-tier is dropped and the table retrained; a failed training or a refused fresh table
puts the mid-tier back on the threading it had and raises :class:`HostError` (the caller
rolls the knobs back: never a half-applied host).

The mid-tier is reached through the :class:`Endpoint` protocol (real hosts:
:class:`AdminEndpoint`, the ``musku_admin`` binary; simulated hosts:
:class:`musku.sim.midtier.SimMidtier`), tables are trained by a :class:`Trainer`
(:class:`ServiceTrainer` / :class:`musku.sim.midtier.SimTrainer`). Nothing here imports
heavy libraries: the agent and the CLI's ``--help`` import it.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import socket
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Protocol

from musku.domain import Configuration
from musku.errors import HostError, InputError, MuskuError

log = logging.getLogger("musku.tune")

MODELS: tuple[str, ...] = tuple(
    f"{leaf}-{disp}-{wait}"
    for leaf in ("sync", "async")
    for disp in ("inline", "dispatch")
    for wait in ("block", "poll")
)
"""The eight threading models (= ``musku.services.runtime.THREADING_MODELS``)."""

DEFAULT_LOADS: tuple[float, ...] = (20.0, 100.0, 500.0, 1000.0, 2000.0)
DEFAULT_WORKERS: tuple[int, ...] = (1, 2)
RECORD_MAX = 100  # the results DB's threading_a / threading_b columns hold 100 characters


# --------------------------------------------------------------------------- the spec


@dataclass(frozen=True)
class CotuneSpec:
    """How to co-tune a host's mid-tier: the experiment's ``[threading]`` table (docs/threading.md,
    "Co-tuning"). Sent to agents with every ``apply`` as JSON."""

    service: str
    loads: tuple[float, ...] = DEFAULT_LOADS  # training grid (offered QPS)
    models: tuple[str, ...] = MODELS  # candidate models
    workers: tuple[int, ...] = DEFAULT_WORKERS  # worker-pool sizes tried for dispatch models
    duration_s: float = 3.0  # measured seconds per (load, candidate) point
    warmup_s: float = 0.5
    admin: str = ""  # the mid-tier's Admin address on the host, "host:port"
    admin_port_file: str = ""  # or the file the mid-tier wrote its port to (--port-file)
    load_data: str = ""  # the load generator's data on the host ("" = the generated dataset)

    def candidates(self) -> list[Any]:
        """(model, pools) candidates: every model; dispatch models once per worker count."""
        from musku.tune.train import Candidate

        out: list[Any] = []
        for m in self.models:
            if "-dispatch-" in m:
                out.extend(Candidate.of(m, w) for w in self.workers)
            else:
                out.append(Candidate.of(m))
        return out

    def points(self) -> int:
        """Measurements one training takes."""
        dispatch = sum(1 for m in self.models if "-dispatch-" in m)
        return len(self.loads) * (len(self.models) - dispatch + dispatch * len(self.workers))

    def training_s(self) -> float:
        """Host seconds one training takes (load-generator start-up included, roughly)."""
        return self.points() * (self.duration_s + self.warmup_s + 0.3)

    def to_json(self) -> dict[str, Any]:
        return {
            "service": self.service,
            "loads": list(self.loads),
            "models": list(self.models),
            "workers": list(self.workers),
            "duration_s": self.duration_s,
            "warmup_s": self.warmup_s,
            "admin": self.admin,
            "admin_port_file": self.admin_port_file,
            "load_data": self.load_data,
        }

    @classmethod
    def from_json(cls, data: object) -> CotuneSpec:
        """Parse and validate (an agent request's ``threading.spec``); InputError on bad input."""
        if not isinstance(data, Mapping):
            raise InputError("threading spec must be an object")
        unknown = set(data) - set(cls.__dataclass_fields__)
        if unknown:
            raise InputError(f"threading spec: unknown key(s) {', '.join(sorted(unknown))}")
        d = dict(data)
        if not isinstance(d.get("service"), str) or not d["service"]:
            raise InputError("threading spec needs service")
        for key in ("loads", "models", "workers"):
            if key in d:
                if not isinstance(d[key], list | tuple):
                    raise InputError(f"threading spec: {key} must be a list")
                d[key] = tuple(d[key])
        for key in ("admin", "admin_port_file", "load_data"):
            if not isinstance(d.get(key, ""), str):
                raise InputError(f"threading spec: {key} must be text")
        for key in ("duration_s", "warmup_s"):
            v = d.get(key, 0.0)
            if isinstance(v, bool) or not isinstance(v, int | float):
                raise InputError(f"threading spec: {key} must be a number")
        spec = cls(**d)
        problem = spec.problem()
        if problem:
            raise InputError(f"threading spec: {problem}")
        return spec

    def problem(self) -> str:
        """What is wrong with this spec ("" if nothing): shared by the experiment loader."""
        if not self.loads or any(
            isinstance(q, bool) or not isinstance(q, int | float) or not q > 0 for q in self.loads
        ):
            return "loads must be a non-empty list of positive QPS values"
        if len(set(self.loads)) != len(self.loads):
            return "loads lists a load twice"
        if not self.models:
            return "models must not be empty"
        for m in self.models:
            if m not in MODELS:
                return f"unknown threading model {m!r} (models: {', '.join(MODELS)})"
        if len(set(self.models)) != len(self.models):
            return "models lists a model twice"
        if not self.workers or any(
            isinstance(w, bool) or not isinstance(w, int) or not 1 <= w <= 64 for w in self.workers
        ):
            return "workers must be a non-empty list of integers in 1..64"
        if not self.duration_s > 0:
            return "duration_s must be > 0"
        if not self.warmup_s >= 0:
            return "warmup_s must be >= 0"
        if self.admin and self.admin_port_file:
            return "give admin or admin_port_file, not both"
        if self.admin and not re.fullmatch(r"[^\s:]+:\d{1,5}", self.admin):
            return f"admin must be 'host:port', not {self.admin!r}"
        return ""


# --------------------------------------------------------------------------- the mid-tier's state


@dataclass(frozen=True)
class ThreadingState:
    """What a mid-tier runs (the Admin RPC's ``ThreadingState``)."""

    model: str
    pollers: int = 1
    workers: int = 0
    responders: int = 0
    auto_mode: bool = False
    table: str = ""  # path of the loaded decision table
    measured_qps: float = 0.0
    last_error: str = ""
    max_pollers: int = 0  # the pools' maxima (--max-*; 0 = not reported)
    max_workers: int = 0
    max_responders: int = 0
    leaf_transport: str = "unary"  # how it calls its leaves (a table is trained for one)

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> ThreadingState:
        """From ``musku_admin get`` / ``set`` output (or :meth:`to_json`); HostError when the
        reply is not a threading state."""
        try:
            return cls(
                model=str(d.get("model", "")),
                pollers=int(d.get("pollers", 0)),
                workers=int(d.get("workers", 0)),
                responders=int(d.get("responders", 0)),
                auto_mode=bool(d.get("auto_mode", False)),
                table=str(d.get("table", "")),
                measured_qps=float(d.get("measured_qps", 0.0)),
                last_error=str(d.get("last_error", "")),
                max_pollers=int(d.get("max_pollers", 0)),
                max_workers=int(d.get("max_workers", 0)),
                max_responders=int(d.get("max_responders", 0)),
                leaf_transport=str(d.get("leaf_transport") or "unary"),
            )
        except (AttributeError, TypeError, ValueError) as exc:
            raise HostError(f"malformed threading state from the mid-tier: {exc}") from None

    def to_json(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "pollers": self.pollers,
            "workers": self.workers,
            "responders": self.responders,
            "auto_mode": self.auto_mode,
            "table": self.table,
            "measured_qps": self.measured_qps,
            "last_error": self.last_error,
            "max_pollers": self.max_pollers,
            "max_workers": self.max_workers,
            "max_responders": self.max_responders,
            "leaf_transport": self.leaf_transport,
        }

    def describe(self, table_hash: str = "") -> str:
        """The record's form: ``auto:HASH MODEL pP wW rR @ N qps`` or ``MODEL pP wW rR``."""
        pools = f"p{self.pollers} w{self.workers} r{self.responders}"
        if self.auto_mode:
            text = f"auto:{table_hash or '?'} {self.model} {pools} @ {self.measured_qps:.0f} qps"
        else:
            text = f"{self.model} {pools}"
        return text[:RECORD_MAX]


def table_hash(table: Mapping[str, Any]) -> str:
    """Short hash of what a table decides (service, CPU count, rows): equal decisions, equal
    hash, whenever and wherever it was trained or stored."""
    core = {k: table.get(k) for k in ("service", "cpus", "rows")}
    text = json.dumps(core, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:8]


def file_hash(path: str | Path) -> str:
    """:func:`table_hash` of a table file ("?" if it cannot be read)."""
    try:
        return table_hash(json.loads(Path(path).read_text()))
    except (OSError, ValueError, AttributeError):
        return "?"


# --------------------------------------------------------------------------- the seams


class Endpoint(Protocol):
    """One host's mid-tier as the co-tuner sees it: the Admin RPC's threading control."""

    host: str

    def get(self) -> ThreadingState:
        """What the mid-tier runs now (HostError if it cannot be reached)."""
        ...

    def set_auto(self, table_path: Path) -> ThreadingState:
        """Load the table and switch to ``auto``. A table the mid-tier refuses (corrupt, stale,
        pools beyond its maxima) raises InputError and nothing changes."""
        ...

    def set_fixed(self, state: ThreadingState) -> ThreadingState:
        """Run ``state.model`` with ``state``'s pool sizes (leaves ``auto``)."""
        ...

    def cpus(self) -> int:
        """The host's CPU count as the mid-tier sees it (tables trained on another are stale)."""
        ...


class Trainer(Protocol):
    def train(self, endpoint: Endpoint, spec: CotuneSpec) -> tuple[dict[str, Any], float]:
        """Train a table on the endpoint's running mid-tier (it may be left on any candidate).
        Returns the table and the host seconds training took."""
        ...


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
        from musku.services import runtime

        return ThreadingState.from_json(runtime.admin(self.address(), "get"))

    def set_auto(self, table_path: Path) -> ThreadingState:
        from musku.services import runtime

        return ThreadingState.from_json(
            runtime.set_threading(self.address(), "auto", table=str(table_path))
        )

    def set_fixed(self, state: ThreadingState) -> ThreadingState:
        from musku.services import runtime

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
        from musku.services import runtime
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


# --------------------------------------------------------------------------- the cache


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]", "_", name) or "_"


class TableCache:
    """Tables on disk: ``ROOT/SERVICE/HOST/PLATFORM/<sha256(config key)[:16]>.json``. The file
    is what the mid-tier loads, so it lives on the mid-tier's host."""

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)

    def path(self, service: str, host: str, platform: str, key: str) -> Path:
        digest = hashlib.sha256(key.encode()).hexdigest()[:16]
        return self.root / _safe(service) / _safe(host) / _safe(platform) / f"{digest}.json"

    def load(self, service: str, host: str, platform: str, key: str) -> dict[str, Any] | None:
        """The cached table (None if there is none); InputError if the file is corrupt."""
        p = self.path(service, host, platform, key)
        try:
            text = p.read_text()
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise InputError(f"threading table {p} is unreadable: {exc.strerror}") from None
        try:
            data = json.loads(text)
        except ValueError as exc:
            raise InputError(f"threading table {p} is corrupt (not JSON): {exc}") from None
        if not isinstance(data, dict):
            raise InputError(f"threading table {p} is corrupt (not an object)")
        return data

    def save(
        self, service: str, host: str, platform: str, key: str, table: Mapping[str, Any]
    ) -> Path:
        from musku.tune.train import write_table

        p = self.path(service, host, platform, key)
        write_table(dict(table), p)
        return p

    def discard(self, service: str, host: str, platform: str, key: str) -> None:
        self.path(service, host, platform, key).unlink(missing_ok=True)


# --------------------------------------------------------------------------- the co-tuner


@dataclass(frozen=True)
class CotuneResult:
    """What one co-tuning did."""

    threading: str  # the record: what the mid-tier runs now
    state: ThreadingState
    table_hash: str
    source: str  # "cache" | "db" | "trained" | "retrained"
    seconds: float  # host seconds spent training (0 on a cache or DB hit)
    path: str  # the table file the mid-tier loaded
    trained: dict[str, Any] | None = None  # the table, when trained here (the controller stores it)
    notes: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {
            "threading": self.threading,
            "state": self.state.to_json(),
            "table_hash": self.table_hash,
            "source": self.source,
            "seconds": self.seconds,
            "path": self.path,
            "trained": self.trained,
            "notes": list(self.notes),
        }


@dataclass
class CoTuner:
    """Co-tunes one host's mid-tier for each configuration applied to the host."""

    spec: CotuneSpec
    endpoint: Endpoint
    trainer: Trainer
    cache: TableCache
    platform: str
    store: Any | None = None  # a musku.storage Store: tables looked up there and saved there
    trainings: int = field(default=0)

    @property
    def host(self) -> str:
        return self.endpoint.host

    def _key(self, config: Configuration | str) -> str:
        return config.key() if isinstance(config, Configuration) else str(config)

    def _check(self, table: Any, key: str, cpus: int, transport: str) -> dict[str, Any]:
        from musku.tune.train import check_table

        data = check_table(table, self.spec.service, cpus=cpus, leaf_transport=transport,
                           where=f"for {key} on {self.host}")  # fmt: skip
        stored_key = data.get("config_key")
        if stored_key is not None and stored_key != key:
            raise InputError(f"threading table for {key} on {self.host} is for {stored_key}")
        return data

    def lookup(
        self, config: Configuration | str, *, offered: Mapping[str, Any] | None = None
    ) -> tuple[dict[str, Any] | None, str, list[str]]:
        """(table, source, notes): the cached table, else the offered one, else the store's;
        (None, "", notes) when training is needed. Unusable tables are noted and dropped."""
        key = self._key(config)
        cpus = self.endpoint.cpus()
        transport = self.endpoint.get().leaf_transport
        notes: list[str] = []
        ids = (self.spec.service, self.host, self.platform, key)
        try:
            raw = self.cache.load(*ids)
            if raw is not None:
                return self._check(raw, key, cpus, transport), "cache", notes
        except InputError as exc:
            notes.append(f"cached table dropped: {exc.one_line()}")
            log.warning("%s: %s", self.host, notes[-1])
            self.cache.discard(*ids)
        stored: list[tuple[str, Any]] = []
        if offered is not None:
            stored.append(("db", offered))
        if self.store is not None:
            try:
                found = self.store.threading_table(*ids)
            except MuskuError as exc:
                notes.append(f"results DB not consulted: {exc.one_line()}")
                found = None
            if found is not None:
                stored.append(("db", found))
        for source, table in stored:
            try:
                return self._check(dict(table), key, cpus, transport), source, notes
            except InputError as exc:
                notes.append(f"stored table dropped: {exc.one_line()}")
                log.warning("%s: %s", self.host, notes[-1])
        return None, "", notes

    def check_pools(self, state: ThreadingState) -> None:
        """The training grid's pool sizes against the mid-tier's maxima (``--max-*``):
        InputError, before anything changes, when a candidate could never run there."""
        over = [w for w in self.spec.workers if state.max_workers and w > state.max_workers]
        if over:
            raise InputError(
                f"[threading] workers {over} exceed the worker pool of the mid-tier on "
                f"{self.host} (at most {state.max_workers}): impossible pool sizes"
            )
        asynchronous = any(m.startswith("async-") for m in self.spec.models)
        if asynchronous and state.max_responders == 0 and state.max_pollers:
            raise InputError(
                f"the mid-tier on {self.host} has no response threads (--max-responders 0): "
                "the async models cannot run there; leave them out of [threading] models"
            )

    def cotune(
        self, config: Configuration | str, *, offered: Mapping[str, Any] | None = None
    ) -> CotuneResult:
        """Put the host's mid-tier on ``auto`` with the table of ``config`` (the configuration
        the host is at now), training it first if needed.

        Lookup order: the on-disk cache, the ``offered`` table (the controller's, from the
        results DB), the results DB (``store``); unusable ones are dropped. InputError (nothing
        changed) when the grid's pool sizes cannot run on this mid-tier; HostError when
        training fails or the mid-tier refuses a freshly trained table: the mid-tier is then
        back on what it ran before (the caller rolls its knobs back)."""
        key = self._key(config)
        ids = (self.spec.service, self.host, self.platform, key)
        before = self.endpoint.get()
        self.check_pools(before)
        table, source, notes = self.lookup(key, offered=offered)
        seconds = 0.0
        trained: dict[str, Any] | None = None
        doing = "loading its table"
        try:
            if table is None:
                doing = "training its table"
                table, seconds = self._train(key)
                source, trained = "trained", table
            path = self.cache.path(*ids) if source == "cache" else self.cache.save(*ids, table)
            doing = "loading the table just trained" if trained is not None else doing
            try:
                state = self._set_auto(path, fresh=source != "cache")
            except InputError as exc:
                if trained is not None:
                    raise
                notes.append(f"{source} table refused by the mid-tier ({exc.one_line()})")
                log.warning("%s: %s: retraining", self.host, notes[-1])
                self.cache.discard(*ids)
                doing = "retraining its table"
                table, more = self._train(key)
                seconds += more
                source, trained = "retrained", table
                path = self.cache.save(*ids, table)
                doing = "loading the table just retrained"
                state = self._set_auto(path, fresh=True)
        except MuskuError as exc:
            if trained is not None:
                self.cache.discard(*ids)  # never offer a table the mid-tier refused
            back = self.restore(before)
            was = describe_state(before)
            now = (
                f"it runs {was} again"
                if back is not None
                else f"its previous threading ({was}) could not be restored"
            )
            raise HostError(
                f"co-tuning the mid-tier on {self.host} for {key} failed {doing} "
                f"({exc.one_line()}); {now}"
            ) from None
        if trained is not None and self.store is not None:
            try:
                self.store.save_threading_table(*ids, trained)
            except MuskuError as exc:
                notes.append(f"table not stored in the results DB: {exc.one_line()}")
                log.warning("%s: %s", self.host, notes[-1])
        h = table_hash(table)
        return CotuneResult(
            threading=state.describe(h),
            state=state,
            table_hash=h,
            source=source,
            seconds=seconds,
            path=str(path),
            trained=trained,
            notes=tuple(notes),
        )

    def _train(self, key: str) -> tuple[dict[str, Any], float]:
        """Train (the mid-tier may be left on any candidate: the caller restores it)."""
        log.info("%s: training the threading table for %s (%d points)", self.host, key,
                 self.spec.points())  # fmt: skip
        table, seconds = self.trainer.train(self.endpoint, self.spec)
        table = dict(table)
        table.update(host=self.host, platform=self.platform, config_key=key)
        table = self._check(table, key, self.endpoint.cpus(), self.endpoint.get().leaf_transport)
        self.trainings += 1
        return table, float(seconds)

    def _set_auto(self, path: Path, *, fresh: bool) -> ThreadingState:
        if not fresh:
            now = self.endpoint.get()
            if now.auto_mode and now.table == str(path):
                return now  # already on this very table
        state = self.endpoint.set_auto(path)
        if not state.auto_mode or state.table != str(path):
            raise HostError(
                f"the mid-tier did not switch to auto with {path} (it runs {state.describe()})"
            )
        return state

    def restore(self, state: ThreadingState) -> ThreadingState | None:
        """Put the mid-tier back on ``state`` (auto with its table, or the fixed model). Best
        effort: a failure is logged and None returned."""
        return restore(self.endpoint, state)


def restore(endpoint: Endpoint, state: ThreadingState) -> ThreadingState | None:
    """Put a mid-tier back on ``state``; best effort (logged, None on failure)."""
    try:
        if state.auto_mode and state.table:
            try:
                return endpoint.set_auto(Path(state.table))
            except InputError as exc:
                log.warning(
                    "%s: its old table is refused now (%s): back on its model instead",
                    endpoint.host,
                    exc.one_line(),
                )
        if not state.model:
            return None
        return endpoint.set_fixed(state)
    except MuskuError as exc:
        log.warning("%s: could not restore the threading %s: %s", endpoint.host,
                    state.describe(), exc.one_line())  # fmt: skip
        return None


def describe(endpoint: Endpoint) -> str:
    """What the endpoint's mid-tier runs now, in the record's form."""
    return describe_state(endpoint.get())


def describe_state(state: ThreadingState) -> str:
    """``state`` in the record's form, the hash read from its table file."""
    return state.describe(file_hash(state.table) if state.auto_mode and state.table else "")


# --------------------------------------------------------------------------- agents


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


# --------------------------------------------------------------------------- controllers


# [hosts] entry keys naming a host's own mid-tier (agent backend) -> the CotuneSpec field each sets
MIDTIER_KEYS = {"midtier_admin": "admin", "midtier_admin_port_file": "admin_port_file"}


class ControllerTables:
    """The controller's side of co-tuning on agent hosts: offers the results DB's table with
    each request and stores the tables the agents trained."""

    def __init__(self, spec: CotuneSpec, platform: str) -> None:
        self.spec = spec
        self.platform = platform
        self.store: Any | None = None

    def midtier(self, host: str, where: Mapping[str, str]) -> CotuneSpec:
        """The spec for a host whose mid-tier answers elsewhere than the experiment says
        (``where``: ``{"admin": "host:port"}`` or ``{"admin_port_file": path}``); InputError
        naming the host when that address is malformed."""
        if not where:
            return self.spec
        spec = replace(self.spec, admin=where.get("admin", ""),
                       admin_port_file=where.get("admin_port_file", ""))  # fmt: skip
        problem = spec.problem()
        if problem:
            raise InputError(f"[hosts] {host}: midtier_{problem}")
        return spec

    def request(
        self, host: str, config: Configuration, midtier: Mapping[str, str] | None = None
    ) -> dict[str, Any]:
        """The ``threading`` field of an ``apply`` request to the agent of ``host``
        (``midtier``: that host's own mid-tier address, see :meth:`midtier`)."""
        spec = self.midtier(host, midtier or {})
        table = None
        if self.store is not None:
            try:
                table = self.store.threading_table(
                    self.spec.service, host, self.platform, config.key()
                )
            except MuskuError as exc:
                log.warning("results DB not consulted for a threading table: %s", exc.one_line())
        return AgentRequest(spec, self.platform, table).to_json()

    def record(self, host: str, config: Configuration, reply: Mapping[str, Any]) -> str:
        """Store a table the agent trained; returns the threading it reports. HostError when
        the reply says nothing of threading (an agent that does not co-tune: the caller rolls
        the host back rather than compare without co-tuning)."""
        info = reply.get("threading") if isinstance(reply, Mapping) else None
        if not isinstance(info, Mapping) or not info.get("threading"):
            raise HostError(
                f"the agent on {host} did not co-tune the threading (a musku without "
                "co-tuning there?): upgrade it or set [threading] cotune = false"
            )
        trained = info.get("trained")
        if trained and self.store is not None:
            try:
                self.store.save_threading_table(
                    self.spec.service, host, self.platform, config.key(), trained
                )
            except MuskuError as exc:
                log.warning("threading table not stored in the results DB: %s", exc.one_line())
        for note in info.get("notes", []):
            log.warning("%s: %s", host, note)
        return str(info.get("threading", ""))


def timeout_for(spec: CotuneSpec, base: float = 120.0) -> float:
    """A request timeout that covers a training (and a retraining)."""
    return base + 2.5 * spec.training_s()
