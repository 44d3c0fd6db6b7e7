"""Co-tuning: judge every knob configuration under test with its best threading.

Fewer cores or another frequency change which threading model serves a mid-tier best, so an
A/B comparison of a knob is only fair when each side runs the threading that suits *its*
configuration. After the knobs of a configuration are applied and verified (and before any
measurement window), the :class:`CoTuner` of a host

1. looks up the threading decision table for (service, host, platform, configuration key):
   first the on-disk cache, then the results DB (the controller's store, or a table the
   controller offers with the request);
2. trains it when there is none (on the host's running mid-tier; training is host time: real
   backends spend it inside ``apply``, the simulator advances its clock by it) and stores it in
   the cache and the DB;
3. puts the mid-tier on ``auto`` with that table over the Admin RPC and reports what it runs
   now, e.g. ``auto:3f9a0c1e async-dispatch-block p1 w2 r1 @ 950 qps``.

A cached or stored table that is corrupt, stale (trained on another CPU count) or refused by
the mid-tier is dropped and the table retrained; a failed training or a refused fresh table
puts the mid-tier back on the threading it had and raises :class:`HostError` (the caller
rolls the knobs back: never a half-applied host).

The layers: the spec is part of the experiment model (:mod:`musku.cotune_spec`); this module
is the host-side logic, shared by real and simulated hosts. The mid-tier is reached through
the :class:`Endpoint` protocol and tables are trained by a :class:`Trainer`: on real hosts
:class:`musku.agent.cotune.AdminEndpoint` / :class:`~musku.agent.cotune.ServiceTrainer` (the
agent side, with the agent request's form), on simulated ones
:class:`musku.sim.midtier.SimMidtier` / :class:`~musku.sim.midtier.SimTrainer`. The controller
side (offering and storing tables over agents) is :mod:`musku.hosts.cotune`. Nothing here
imports heavy libraries: the agent imports it.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

# the spec's names are re-exported: code written against the one-module cotune keeps working
from musku.cotune_spec import DEFAULT_LOADS as DEFAULT_LOADS
from musku.cotune_spec import DEFAULT_WORKERS as DEFAULT_WORKERS
from musku.cotune_spec import MIDTIER_KEYS as MIDTIER_KEYS
from musku.cotune_spec import MODELS as MODELS
from musku.cotune_spec import RECORD_MAX
from musku.cotune_spec import CotuneSpec as CotuneSpec
from musku.domain import Configuration
from musku.errors import HostError, InputError, MuskuError
from musku.storage.protocols import TableStore
from musku.tune.table import check_table, write_table

log = logging.getLogger("musku.tune")


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
    store: TableStore | None = None  # the results store: tables looked up there and saved there
    trainings: int = field(default=0)

    @property
    def host(self) -> str:
        return self.endpoint.host

    def _key(self, config: Configuration | str) -> str:
        return config.key() if isinstance(config, Configuration) else str(config)

    def _check(self, table: Any, key: str, cpus: int, transport: str) -> dict[str, Any]:
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
