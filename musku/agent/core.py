"""The agent's state machine: knobs, journal, lease, spool. No sockets here (see server.py).

Requests are JSON objects ``{"op": NAME, ...}``; :meth:`Agent.handle` answers every request
with ``{"ok": true, "result": ...}`` or ``{"ok": false, "error": {"type", "status", "message"}}``
and never raises: a malformed request gets a clear error and the daemon keeps running.

Safety rules (docs/agent.md):

- everything is validated before the first write: an unknown knob, an unsupported knob or a
  value outside what the probe says this host can take is refused with nothing written;
- the snapshot of a knob is journaled (fsync) before the knob is written; a failed write or
  verify rolls back what this request applied, in reverse order, and the request fails;
- an experiment holds a lease; when it lapses the agent rolls the experiment back;
- a deployed soft SKU is kept across restarts (TuneD #416); an unfinished experiment or deploy
  found at start is rolled back;
- co-tuning (an ``apply`` with a ``threading`` field, docs/threading.md "Co-tuning"): once the
  knobs are applied and verified, the host's mid-tier is put on the threading table of the
  configuration (looked up in the agent's table cache, the table the controller offers, or
  trained); the mid-tier's threading before the experiment is journaled with the experiment
  and restored when it is rolled back. A failed co-tuning rolls back this request's knob
  writes (the co-tuner has put the mid-tier back on what it ran) and the request fails;
- the host files a request names (the mid-tier's port file, the load data) are read through
  the host filesystem, strictly beneath the root, size-capped, before the lock is taken, and
  no reply quotes their content (musku/agent/cotune.py).
"""

from __future__ import annotations

import logging
import math
import socket
import threading
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from musku import __version__
from musku.agent import reboot as reboot_mode
from musku.agent.core_errors import error_reply
from musku.agent.cotune import AdminEndpoint, AgentRequest, ServiceTrainer, stage
from musku.agent.journal import Journal, TxKind
from musku.agent.metrics import AgentMetrics
from musku.agent.spool import Spool
from musku.cotune_spec import CotuneSpec
from musku.domain import Configuration, Value
from musku.errors import HostError, InputError, MuskuError, UnsupportedError
from musku.hostfs import HostFS
from musku.knob_spec import is_knob, knob_names, known_list, sort_key
from musku.knobs import load_knob
from musku.knobs.base import InvalidSetting, Knob, Snapshot, Support
from musku.metrics import load_sampler
from musku.metrics.base import Sampler
from musku.tune.cotune import CoTuner, Endpoint, TableCache, ThreadingState, Trainer, restore

if TYPE_CHECKING:
    from musku.agent.config import AgentConfig

log = logging.getLogger("musku.agent")

PROTOCOL = 1
__all__ = ["OPS", "PROTOCOL", "Agent", "error_reply"]

OPS = (
    "hello",
    "capabilities",
    "check",
    "apply",
    "renew",
    "collect",
    "ack",
    "deploy",
    "rollback",
    "status",
    "metrics",
)

# who asks (docs/agent.md "Ownership"): the experiment, the controller process, and an explicit
# operator override of another owner's lease. A request without "controller" is anonymous.
OWNER_FIELDS = frozenset({"experiment", "controller", "override"})
# the fields each op takes besides "op" (anything else is refused: a misspelt "undeploy"
# must not be silently ignored)
FIELDS: dict[str, frozenset[str]] = {
    "hello": frozenset(),
    "capabilities": frozenset(),
    "check": frozenset({"config"}),
    "apply": frozenset({"config", "lease_s", "experiment", "threading", *OWNER_FIELDS}),
    "renew": frozenset({"lease_s", *OWNER_FIELDS}),
    "collect": frozenset({"cursor", "limit", "ack"}),
    "ack": frozenset({"cursor"}),
    "deploy": frozenset({"config", *OWNER_FIELDS}),
    "rollback": frozenset({"undeploy", *OWNER_FIELDS}),
    "status": frozenset(),
    "metrics": frozenset(),
}
MAX_NAME = 200  # an experiment id
MAX_CURSOR = 2**63 - 1  # spool row ids are SQLite integers

KnobFactory = Callable[..., "Knob"]
EndpointFactory = Callable[["CotuneSpec"], "Endpoint"]


def _default_knob_factory(name: str, fs: HostFS, **options: object) -> Knob:
    return load_knob(name, fs, **options)


def _config_of(raw: object, what: str = "config") -> Configuration:
    if not isinstance(raw, dict):
        raise InputError(f"{what} must be an object knob -> value")
    try:
        return Configuration.of(raw)
    except KeyError as exc:
        raise InputError(f"{what}: unknown knob {exc.args[0]!r} (knobs: {known_list()})") from None
    except (TypeError, ValueError) as exc:
        raise InputError(f"{what}: {exc}") from None


def _number(req: Mapping[str, Any], key: str, default: float | None = None) -> float:
    v = req.get(key, default)
    if v is None:
        raise InputError(f"request needs {key!r}")
    if isinstance(v, bool) or not isinstance(v, int | float):
        raise InputError(f"{key} must be a number, not {_short(v)}")
    try:
        f = float(v)
    except OverflowError:
        f = math.inf
    if not math.isfinite(f):
        raise InputError(f"{key} must be a finite number")
    return f


def _integer(req: Mapping[str, Any], key: str, default: int | None, lo: int, hi: int) -> int:
    v = req.get(key, default)
    if v is None:
        raise InputError(f"request needs {key!r}")
    if isinstance(v, bool) or not isinstance(v, int):
        raise InputError(f"{key} must be an integer, not {_short(v)}")
    if not lo <= v <= hi:
        raise InputError(f"{key} must be an integer in {lo}..{hi}")
    return v


def _flag(req: Mapping[str, Any], key: str, default: bool) -> bool:
    """A JSON boolean (a string "false" is refused, not read as true)."""
    v = req.get(key, default)
    if not isinstance(v, bool):
        raise InputError(f"{key} must be true or false, not {_short(v)}")
    return v


def _owner_of(req: Mapping[str, Any]) -> tuple[str, str]:
    """(experiment, controller) a request speaks for; "" is anonymous / unnamed."""
    out = []
    for key in ("experiment", "controller"):
        v = req.get(key, "")
        if not isinstance(v, str) or len(v) > MAX_NAME:
            raise InputError(f"{key} must be a string of at most {MAX_NAME} characters")
        out.append(v)
    return out[0], out[1]


def _short(v: object) -> str:
    text = repr(v)
    return text if len(text) <= 60 else text[:57] + "..."


class Agent:
    """One host's agent. Thread-safe: requests, the lease check and sampling share one lock."""

    def __init__(
        self,
        config: AgentConfig,
        *,
        fs: HostFS | None = None,
        knob_factory: KnobFactory | None = None,
        samplers: list[Sampler] | None = None,
        clock: Callable[[], float] = time.monotonic,
        threading_endpoint: EndpointFactory | None = None,
        threading_trainer: Trainer | None = None,
    ) -> None:
        self.config = config
        self.fs = fs if fs is not None else HostFS(config.root)
        self._factory = knob_factory or _default_knob_factory
        self._clock = clock
        self.lock = threading.RLock()
        config.state_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        self.journal = Journal(config.state_dir / "journal.sqlite")
        self.spool = Spool(config.state_dir / "spool.sqlite", max_rows=config.spool_max_rows)
        self.metrics = AgentMetrics()
        self._knobs: dict[str, Knob] = {}
        self.lease_deadline: float | None = None
        self.lease_s = 0.0
        self.expected: dict[str, Value] = {}  # knob -> value the host should be at now
        self.experiment: dict[str, Any] = {}  # id, config of the open experiment
        self.samplers: list[Sampler] = samplers if samplers is not None else []
        self._sampler_backends: dict[str, str] = {}
        self._last_sample_t = time.time()
        self._drift_reported: set[str] = set()
        self.started = time.time()
        self.recovered: list[str] = []
        self.degraded: list[str] = []
        self.blocked = ""  # set when a rollback could not complete: changes are refused
        # co-tuning: how the mid-tier is reached and tables trained (tests inject fakes)
        self._threading_endpoint = threading_endpoint
        self._threading_trainer = threading_trainer
        self.threading = ""  # what the mid-tier ran after the last co-tuned apply
        # reboot-mode knobs (musku/agent/reboot.py): written, waiting for the next boot
        self.reboot_pending: dict[str, Value] = {}
        self.reboot_status: dict[str, Any] = reboot_mode.load_status(config.state_dir)
        self.reboot_thread: threading.Thread | None = None  # runs the hook after the reply

    # ------------------------------------------------------------------ knobs

    def knob(self, name: str) -> Knob:
        if not is_knob(name):
            raise InputError(f"unknown knob {name!r} (knobs: {known_list()})")
        k = self._knobs.get(name)
        if k is None:
            k = self._factory(name, self.fs, **self.config.knobs.get(name, {}))
            self._knobs[name] = k
        return k

    def _probe(self, name: str) -> Support:
        return self.knob(name).probe()

    def _validate(self, config: Configuration) -> dict[str, Value]:
        """Canonical values for every knob, or raise with nothing written."""
        out: dict[str, Value] = {}
        for name, value in config.settings:
            support = self._probe(name)
            if not support.supported:
                raise UnsupportedError(f"{name} is not supported on this host: {support.reason}")
            v = self.knob(name).validate(value)
            if support.settings and v not in support.settings:
                allowed = ", ".join(str(s) for s in support.settings)
                raise InvalidSetting(
                    f"{name} = {value!r} is outside this host's capabilities ({allowed})"
                )
            out[name] = v
        return out

    def _write(self, values: Mapping[str, Value]) -> list[str]:
        """Journal-then-write each knob that differs; verify. Caller holds the lock and an open
        transaction. On failure rolls back this call's writes and raises HostError."""
        mark = self.journal.last_seq()
        changed: list[str] = []
        try:
            for name in sorted(values, key=sort_key):  # sweep order
                knob, value = self.knob(name), values[name]
                if not knob.plan(value):
                    continue
                snap: Snapshot = knob.snapshot()
                seq = self.journal.record_step(name, snap.to_json(), value)
                knob.apply(value)
                if not knob.verify(value) and not reboot_mode.defer(self, name, value):
                    raise HostError(f"{name} did not take {value!r} (read back {knob.read()!r})")
                self.journal.mark_done(seq)
                changed.append(name)
        except Exception as exc:
            undone = self._undo(after=mark)
            msg = exc.one_line() if isinstance(exc, MuskuError) else f"{type(exc).__name__}: {exc}"
            raise HostError(f"apply failed ({msg}); rolled back {undone} write(s)") from None
        return changed

    def _undo(self, after: int = 0) -> int:
        """Roll back journaled steps with seq > after, newest first. Raises HostError if a
        restore fails (the step stays journaled: the next start retries it)."""
        failed: list[str] = []
        steps = self.journal.steps(after)
        for step in reversed(steps):
            try:
                self.knob(step.knob).rollback(Snapshot.from_json(step.snapshot))
                self.journal.forget_step(step.seq)
            except Exception as exc:  # noqa: BLE001 - continue restoring the others
                failed.append(f"{step.knob}: {exc}")
                log.error("rollback of %s failed: %s", step.knob, exc)
        if failed:
            self.degraded.append("rollback failed: " + "; ".join(failed))
            raise HostError("ROLLBACK FAILED for " + "; ".join(failed))
        return len(steps)

    def _deployed_values(self) -> dict[str, Value]:
        d = self.journal.deployed()
        return dict(d["config"]) if d else {}

    # ------------------------------------------------------------------ life cycle

    def recover(self) -> list[str]:
        """At start: roll back an unfinished transaction, re-establish a deployed soft SKU."""
        with self.lock:
            msgs: list[str] = []
            # a journaled pending reboot: verified (the experiment goes on) or rolled back
            rebooted, kept = reboot_mode.resume(self)
            msgs += [rebooted] if rebooted else []
            kind = self.journal.open_tx()
            if kind is TxKind.EXPERIMENT:
                self._restore_owner(self.journal.tx_info())
            if kind is not None and not kept:
                n = len(self.journal.steps())
                threading_info = self.journal.tx_info().get("threading")
                try:
                    self._undo()
                except HostError as exc:
                    # come up anyway (status shows it) but refuse changes until resolved
                    self.blocked = f"recovery incomplete: {exc.one_line()}"
                    log.critical("%s; run 'musku agent rollback' once fixed", self.blocked)
                    self.recovered = [self.blocked]
                    return self.recovered
                if threading_info:
                    msgs.append(self._restore_threading(threading_info))
                self.journal.close_tx()
                msgs.append(f"rolled back an unfinished {kind.value} ({n} write(s), reverse order)")
                self.metrics.rollbacks.labels(reason="recovery").inc()
            deployed = self._deployed_values()
            if deployed and not kept:
                try:
                    cfg = _config_of(deployed, "deployed soft SKU")
                    values = self._validate(cfg)
                    stale = [n for n, v in values.items() if not self.knob(n).verify(v)]
                    if stale:
                        self.journal.begin(TxKind.DEPLOY, {"config": deployed, "reapply": True})
                        try:
                            self._write(values)
                        finally:
                            self.journal.close_tx()
                        msgs.append(f"re-applied the deployed soft SKU ({', '.join(stale)})")
                    else:
                        msgs.append(f"deployed soft SKU in place: {cfg}")
                except MuskuError as exc:
                    self.degraded.append(f"deployed soft SKU not re-applied: {exc.one_line()}")
                    log.error("deployed soft SKU not re-applied: %s", exc.one_line())
            self.expected = {**deployed, **kept}
            for m in msgs:
                log.info("recovery: %s", m)
            self.recovered = msgs
            return msgs

    def start_samplers(self) -> None:
        if self.samplers:
            for s in self.samplers:
                s.start()
            return
        for name, opts in self.config.samplers.items():
            try:
                s = load_sampler(name, self.fs, **opts)
                support = s.probe()
            except MuskuError as exc:
                log.warning("sampler %s: %s", name, exc.one_line())
                continue
            if not support.supported:
                log.info("sampler %s unavailable: %s", name, support.reason)
                self._sampler_backends[name] = "unavailable: " + support.reason
                continue
            s.start()
            self._sampler_backends[name] = getattr(s, "backend", "") or support.backend
            log.info("sampler %s: %s", name, self._sampler_backends[name])
            self.samplers.append(s)
        self._last_sample_t = time.time()

    def close(self, *, rollback_experiment: bool = True) -> None:
        """Stop. An open experiment is rolled back (its lease cannot be honoured while the agent
        is down); a deployed soft SKU stays (TuneD #416)."""
        with self.lock:
            if reboot_mode.pending(self) is not None:
                log.info("stopping for the pending reboot: the experiment stays journaled")
            elif rollback_experiment and self.journal.open_tx() is TxKind.EXPERIMENT:
                log.info("stopping: rolling back the running experiment; deployed SKU kept")
                self._rollback_experiment("stop")
            for s in self.samplers:
                try:
                    s.close()
                except Exception as exc:  # noqa: BLE001
                    log.warning("sampler close: %s", exc)
            self.spool.close()
            self.journal.close()

    def tick(self) -> None:
        """Lease check (call at least every tenth of the shortest lease)."""
        if self.lease_deadline is None or self._clock() < self.lease_deadline:
            return
        with self.lock:
            if self.lease_deadline is not None and self._clock() >= self.lease_deadline:
                log.warning(
                    "lease expired (%.1fs not renewed): reverting to baseline", self.lease_s
                )
                self.metrics.lease_expiries.inc()
                try:
                    self._rollback_experiment("lease")
                except MuskuError as exc:
                    log.error("lease rollback: %s (retrying in 5s)", exc.one_line())
                    self.lease_deadline = self._clock() + 5.0

    def _rollback_experiment(self, reason: str) -> int:
        """Roll back the open transaction (an experiment; or a deploy whose recovery failed)."""
        n = 0
        if self.journal.open_tx() is not None:
            threading_info = self.journal.tx_info().get("threading")
            try:
                n = self._undo()
            except HostError as exc:
                self.blocked = exc.one_line()
                raise
            if threading_info:
                log.info("%s", self._restore_threading(threading_info))
            self.journal.close_tx()
            self.blocked = ""
            self.metrics.rollbacks.labels(reason=reason).inc()
        self.lease_deadline = None
        self.experiment = {}
        self.expected = self._deployed_values()
        return n

    # ------------------------------------------------------------------ co-tuning

    def _endpoint(self, spec: CotuneSpec) -> Endpoint:
        if self._threading_endpoint is not None:
            return self._threading_endpoint(spec)
        return AdminEndpoint(spec.admin, spec.admin_port_file, fs=self.fs)

    def _stage(self, request: AgentRequest) -> AgentRequest:
        """The request with the host files it names read (the port file: the address it holds;
        the load data: the agent's copy under its state directory), strictly beneath the host
        root, before the lock is taken (:func:`musku.agent.cotune.stage`)."""
        spec = stage(
            self.fs,
            request.spec,
            self.config.state_dir / "load-data",
            port_file=self._threading_endpoint is None,
        )
        return AgentRequest(spec, request.platform, request.table)

    def _cotune(self, request: AgentRequest, config: Configuration) -> dict[str, Any]:
        """Co-tune the mid-tier for ``config`` (caller holds the lock, the knobs are applied).
        Journals the mid-tier's threading before the experiment's first co-tuning."""
        endpoint = self._endpoint(request.spec)
        info = self.journal.tx_info()
        if "threading" not in info:
            before = endpoint.get()  # HostError if the mid-tier cannot be reached
            info["threading"] = {"spec": request.spec.to_json(), "before": before.to_json()}
            self.journal.set_tx_info(info)
        tuner = CoTuner(
            request.spec,
            endpoint,
            self._threading_trainer or ServiceTrainer(),
            TableCache(self.config.table_dir),
            request.platform,
        )
        result = tuner.cotune(config, offered=request.table)
        self.threading = result.threading
        return result.to_json()

    def _restore_threading(self, info: Mapping[str, Any]) -> str:
        """Put the mid-tier back on the threading journaled before the experiment (best
        effort: a mid-tier that is gone or refuses is logged, not fatal)."""
        try:
            spec = CotuneSpec.from_json(info.get("spec"))
            before = ThreadingState.from_json(info.get("before") or {})
            state = restore(self._endpoint(spec), before)
        except MuskuError as exc:
            return f"mid-tier threading not restored: {exc.one_line()}"
        self.threading = ""
        if state is None:
            return f"mid-tier threading not restored to {before.describe()} (see the log)"
        return f"mid-tier threading restored to {before.describe()}"

    # ------------------------------------------------------------------ sampling

    def sample_once(self) -> None:
        """One spool row: every sampler's figures since the last row, plus knob verification."""
        t0 = time.perf_counter()
        now = time.time()
        duration = now - self._last_sample_t
        self._last_sample_t = now
        values: dict[str, float] = {}
        for s in self.samplers:
            try:
                values.update(s.sample())
            except Exception as exc:  # noqa: BLE001 - one bad source must not stop sampling
                log.warning("sampler %s failed: %s", s.name, exc)
        valid, note, key = True, "", ""
        if self.lock.acquire(blocking=False):
            try:
                drifted = self._drifted()
                key = Configuration.of(self.expected).key() if self.expected else ""
            finally:
                self.lock.release()
            if drifted:
                valid, note = False, "outside change: " + ", ".join(drifted)
                self.metrics.drift.inc()
                new = set(drifted) - self._drift_reported
                if new:
                    log.warning(
                        "outside change of %s: windows marked invalid", ", ".join(sorted(new))
                    )
                self._drift_reported = set(drifted)
            else:
                self._drift_reported = set()
        else:
            note = "busy"  # an apply is in progress: the controller skips this row
        self.spool.add(now, duration, values, valid=valid, note=note, config=key)
        for k, v in values.items():
            self.metrics.last.labels(metric=k).set(v)
        self.metrics.sample_seconds.observe(time.perf_counter() - t0)

    def _drifted(self) -> list[str]:
        out = []
        for name, value in self.expected.items():
            if name in self.reboot_pending:  # written, waiting for the boot: not drift
                continue
            try:
                if not self.knob(name).verify(value):
                    out.append(name)
            except MuskuError:
                out.append(name)
        return out

    # ------------------------------------------------------------------ requests

    def handle(self, request: object) -> dict[str, Any]:
        op = request.get("op") if isinstance(request, dict) else None
        label = op if isinstance(op, str) and op in OPS else "invalid"
        try:
            if not isinstance(request, dict):
                raise InputError('a request is a JSON object {"op": ...}')
            if not isinstance(op, str) or op not in OPS:
                raise InputError(f"unknown op {_short(op)} (ops: {', '.join(OPS)})")
            extra = set(request) - FIELDS[op] - {"op"}
            if extra:
                names = ", ".join(_short(k) for k in sorted(extra)[:5])
                allowed = ", ".join(sorted(FIELDS[op])) or "none"
                raise InputError(f"{op}: unknown field(s) {names} (fields: {allowed})")
            result = getattr(self, f"op_{op}")(request)
            self.metrics.requests.labels(op=label, outcome="ok").inc()
            return {"ok": True, "result": result}
        except Exception as exc:  # noqa: BLE001 - every failure becomes an error reply
            if not isinstance(exc, MuskuError):
                log.exception("request %s failed", label)
            self.metrics.requests.labels(op=label, outcome="error").inc()
            return error_reply(exc)

    def op_hello(self, req: dict[str, Any]) -> dict[str, Any]:
        return {
            "protocol": PROTOCOL,
            "version": __version__,
            "hostname": socket.gethostname(),
            "time": time.time(),
            "sample_interval_s": self.config.sample_interval_s,
            "samplers": dict(self._sampler_backends),
            "ownership": True,  # takes experiment/controller/override (docs/agent.md)
        }

    def op_capabilities(self, req: dict[str, Any]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for name in knob_names():
            try:
                s = self._probe(name)
                out[name] = {
                    "supported": s.supported,
                    "reason": s.reason,
                    "backend": s.backend,
                    "settings": list(s.settings),
                    "reboot": s.reboot,
                }
                if s.supported:
                    out[name]["current"] = self.knob(name).read()
            except MuskuError as exc:
                out[name] = {"supported": False, "reason": exc.one_line()}
        return {"knobs": out, "samplers": dict(self._sampler_backends)}

    def op_check(self, req: dict[str, Any]) -> dict[str, Any]:
        """Validate a configuration and return the planned writes; nothing is written."""
        with self.lock:
            values = self._validate(_config_of(req.get("config")))
            plan = {
                n: [w.path for w in self.knob(n).apply(v, dry_run=True)] for n, v in values.items()
            }
            return {"config": values, "writes": plan}

    # ------------------------------------------------------------------ ownership

    def _lease_owner(self) -> tuple[str, str, float] | None:
        """(experiment, controller, lease remaining) of a live lease; None when the agent is free
        (no experiment, or its lease lapsed: the next tick rolls it back)."""
        if not self.experiment or self.lease_deadline is None:
            return None
        remaining = self.lease_deadline - self._clock()
        if remaining <= 0:
            return None
        return self.experiment["id"], self.experiment.get("controller", ""), remaining

    def _check_owner(self, req: Mapping[str, Any], op: str) -> bool:
        """Refuse another owner's request (HostError naming the owner) unless it carries
        ``override``; True when this request takes over (an override, or another owner after
        the lease lapsed): the old experiment must be rolled back first. Call under the lock."""
        held = self._lease_owner()
        exp, controller = _owner_of(req)
        override = _flag(req, "override", False)
        if held is None:
            # a lapsed lease the next tick would roll back: another owner's apply does it now
            return bool(self.experiment) and (
                controller != self.experiment.get("controller", "")
                or exp not in ("", self.experiment["id"])
            )
        h_exp, h_ctl, remaining = held
        if controller == h_ctl and exp in ("", h_exp):
            return False
        who = (
            f"experiment {h_exp!r} (controller {h_ctl or 'anonymous'}, lease {remaining:.0f}s left)"
        )
        if not override:
            raise HostError(
                f"{op} refused: this agent is held by {who}; an operator can override "
                "('musku agent rollback --force', 'musku sweep --take-over-agents')"
            )
        log.warning(
            "operator override: %s by experiment %r (controller %s) takes over from %s",
            op,
            exp,
            controller or "anonymous",
            who,
        )
        return True

    def _journal_lease(self, lease: float) -> None:
        """Keep the lease's wall-clock end in the journal: the owner outlives an agent restart."""
        if self.journal.open_tx() is TxKind.EXPERIMENT:
            self.journal.set_tx_info({**self.journal.tx_info(), "lease_until": time.time() + lease})

    def _restore_owner(self, info: Mapping[str, Any]) -> None:
        """At recovery: the journaled owner keeps the agent for what is left of its lease."""
        left = float(info.get("lease_until", 0) or 0) - time.time()
        if info.get("experiment") and left > 0:
            self.experiment = {
                "id": str(info["experiment"]),
                "controller": str(info.get("controller", "")),
            }
            self.lease_deadline = self._clock() + left
            log.info(
                "recovery: experiment %r (controller %s) keeps this agent for %.0fs more",
                self.experiment["id"],
                self.experiment["controller"] or "anonymous",
                left,
            )

    def _owner_status(self) -> dict[str, Any] | None:
        held = self._lease_owner()
        if held is None:
            return None
        return {"experiment": held[0], "controller": held[1], "lease_remaining_s": held[2]}

    def _check_not_blocked(self) -> None:
        if self.blocked:
            raise HostError(
                f"agent refuses changes: {self.blocked} (fix, then 'musku agent rollback')"
            )

    def op_apply(self, req: dict[str, Any]) -> dict[str, Any]:
        self._check_not_blocked()
        cfg = _config_of(req.get("config"))
        lease = _number(req, "lease_s", self.config.default_lease_s)
        if not 0 < lease <= self.config.max_lease_s:
            raise InputError(f"lease_s must be in (0, {self.config.max_lease_s:g}]")
        experiment = req.get("experiment", "")
        if not isinstance(experiment, str) or len(experiment) > MAX_NAME:
            raise InputError(f"experiment must be a string of at most {MAX_NAME} characters")
        cotune = AgentRequest.parse(req.get("threading"))  # bad input: refused, nothing written
        t0 = time.monotonic()
        if cotune is not None:
            # the host files the request names are read now, never under the lock
            cotune = self._stage(cotune)
        with self.lock:
            if self._check_owner(req, "apply"):  # an override or a lapsed lease: it ends
                self._rollback_experiment("override")
            if reboot_mode.pending(self) is not None:
                raise HostError("apply refused: this host is rebooting into the last apply")
            values = self._validate(cfg)
            began = False
            if self.journal.open_tx() is None:
                exp = experiment or f"exp-{int(time.time())}"
                controller = _owner_of(req)[1]
                self.journal.begin(
                    TxKind.EXPERIMENT,
                    {
                        "experiment": exp,
                        "controller": controller,
                        "lease_until": time.time() + lease,
                    },
                )
                self.experiment = {"id": exp, "controller": controller}
                began = True
            mark = self.journal.last_seq()
            threading: dict[str, Any] | None = None
            rebooting: dict[str, Any] | None = None
            self.reboot_pending = {}
            try:
                changed = self._write(values)
                if reboot_mode.due(self, values):  # journal, run the hook; a bad hook rolls back
                    rebooting = reboot_mode.start(self, mark, lease)
                if cotune is not None and rebooting is None:
                    try:
                        threading = self._cotune(cotune, cfg)
                    except MuskuError as exc:
                        # never a half-applied host: this request's knob writes go too
                        try:
                            undone = self._undo(after=mark)
                        except HostError as rb:
                            self.blocked = rb.one_line()  # steps stay journaled: retried
                            raise HostError(f"{exc.one_line()}; {rb.one_line()}") from None
                        raise type(exc)(
                            f"{exc.one_line()}; rolled back {undone} knob write(s)"
                        ) from None
            except MuskuError:
                if began and not self.blocked:
                    self.journal.close_tx()
                    self.experiment = {}
                self.metrics.applies.labels(outcome="rolled_back").inc()
                raise
            self.expected = {**self._deployed_values(), **self.expected, **values}
            self.lease_s = lease
            # rebooting: no lease until the agent is back and has verified the boot
            self.lease_deadline = None if rebooting else self._clock() + lease
            self._journal_lease(lease)
            self.metrics.applies.labels(outcome="ok").inc()
            log.info(
                "applied %s (changed: %s), lease %.1fs", cfg, ", ".join(changed) or "none", lease
            )
            reply = {
                "changed": changed,
                "config": Configuration.of(self.expected).as_dict(),
                "key": Configuration.of(self.expected).key(),
                "seconds": time.monotonic() - t0,
                "experiment": self.experiment.get("id", ""),
                "time": time.time(),
            }
            if threading is not None:
                reply["threading"] = threading
            if rebooting is not None:
                reply["rebooting"] = True
                reply["reboot"] = rebooting
            return reply

    def op_renew(self, req: dict[str, Any]) -> dict[str, Any]:
        lease = _number(req, "lease_s", self.lease_s or self.config.default_lease_s)
        if not 0 < lease <= self.config.max_lease_s:
            raise InputError(f"lease_s must be in (0, {self.config.max_lease_s:g}]")
        with self.lock:
            self._check_owner(req, "renew")
            if self.journal.open_tx() is not TxKind.EXPERIMENT or self.lease_deadline is None:
                raise HostError("no experiment is running here (lease lapsed or agent restarted)")
            self.lease_s = lease
            self.lease_deadline = self._clock() + lease
            self._journal_lease(lease)
            return {
                "lease_s": lease,
                "experiment": self.experiment.get("id", ""),
                "time": time.time(),
            }

    def op_collect(self, req: dict[str, Any]) -> dict[str, Any]:
        cursor = _integer(req, "cursor", 0, 0, MAX_CURSOR)
        limit = _integer(req, "limit", 5000, 1, 100_000)
        if req.get("ack") is not None:  # acknowledge earlier rows in the same round trip
            ack = _integer(req, "ack", None, 0, MAX_CURSOR)
            if ack > cursor:
                raise InputError("ack must be between 0 and cursor")
            self.spool.ack(ack)
        rows, nxt = self.spool.collect(cursor, limit)
        return {"rows": [r.to_json() for r in rows], "cursor": nxt, "time": time.time()}

    def op_ack(self, req: dict[str, Any]) -> dict[str, Any]:
        cursor = _integer(req, "cursor", None, 0, MAX_CURSOR)
        return {"deleted": self.spool.ack(cursor)}

    def op_deploy(self, req: dict[str, Any]) -> dict[str, Any]:
        self._check_not_blocked()
        cfg = _config_of(req.get("config"))
        with self.lock:
            self._check_owner(req, "deploy")
            values = self._validate(cfg)
            if self.journal.open_tx() is TxKind.EXPERIMENT:
                self._rollback_experiment("deploy")
            new = {**self._deployed_values(), **values}
            self.journal.begin(TxKind.DEPLOY, {"config": new})
            try:
                changed = self._write(values)
            except MuskuError:
                self.journal.close_tx()
                raise
            self.journal.close_tx(deployed={"config": new, "at": time.time()})
            self.expected = dict(new)
            log.info(
                "deployed soft SKU %s (changed: %s)",
                Configuration.of(new),
                ", ".join(changed) or "none",
            )
            return {"deployed": new, "changed": changed}

    def op_rollback(self, req: dict[str, Any]) -> dict[str, Any]:
        undeploy = _flag(req, "undeploy", False)
        with self.lock:
            self._check_owner(req, "rollback")
            n = self._rollback_experiment("request")
            if not undeploy:
                return {"rolled_back": n, "deployed": self._deployed_values()}
            originals = self.journal.originals()
            for name, snap in reversed(originals):
                self.knob(name).rollback(Snapshot.from_json(snap))
            self.journal.close_tx(deployed=None)
            self.journal.forget_originals()
            self.expected = {}
            self.metrics.rollbacks.labels(reason="undeploy").inc()
            log.info("undeployed: %d knob(s) restored to their pre-musku state", len(originals))
            return {
                "rolled_back": n,
                "restored_originals": [n for n, _ in originals],
                "deployed": {},
            }

    def op_status(self, req: dict[str, Any]) -> dict[str, Any]:
        with self.lock:
            tx = self.journal.open_tx()
            remaining = (
                None
                if self.lease_deadline is None
                else max(0.0, self.lease_deadline - self._clock())
            )
            return {
                "experiment": self.experiment.get("id", "") if tx is TxKind.EXPERIMENT else "",
                "owner": self._owner_status(),
                "expected": dict(self.expected),
                "deployed": self._deployed_values(),
                "lease_remaining_s": remaining,
                "spool_rows": self.spool.count(),
                "spool_dropped": self.spool.dropped,
                "spool_head": self.spool.head(),
                "recovered": list(self.recovered),
                "degraded": list(self.degraded),
                "blocked": self.blocked,
                "uptime_s": time.time() - self.started,
                "samplers": dict(self._sampler_backends),
                "threading": self.threading,
                "reboot": reboot_mode.status_of(self),
                "started": self.started,
            }

    def op_metrics(self, req: dict[str, Any]) -> dict[str, Any]:
        deadline = self.lease_deadline
        self.metrics.refresh(
            lease_remaining=-1 if deadline is None else max(0.0, deadline - self._clock()),
            spool_rows=self.spool.count(),
            experiment_active=bool(self.experiment),
        )
        return {"text": self.metrics.exposition()}
