"""``musku sku deploy`` and ``musku sku watch``: roll a soft SKU out, and keep checking it.

Deploy (docs/rollout.md)::

    canary ──A/B against a production host──> rolling ──wave, read back, wave...──> deployed
       │ worse / guardrail / host failure / Ctrl-C          │ a host fails or reads back wrong
       └────────────── rolled_back (every applied host back at baseline) ◄┘ (failed: the
                                                                            rollback did not)

The canary comparison is musku's sequential A/B tester (:meth:`musku.sweep.runner.Runner.
compare`) with the experiment's metric, guardrails and statistics, capped at ``canary_time_s``
of host time; it is recorded as a run of mode ``deploy`` (its comparisons, samples and
decision as any other). The tester swaps the two hosts' roles each period, so the production
host runs the soft SKU part of the time; once the comparison ends it is back at production.
The canary passes unless the decision is ``worse`` or ``guardrail``: a comparison that finds
no difference within the canary time is no reason to stop a soft SKU validated by its sweep.

Watch: each live ``deployed`` deployment is compared again (a deployed host against a
production host, purpose ``watch``), at once (``--once``), then every ``every_s`` or when the
code version changes; a verdict other than ``holds`` (still significantly better) flags it.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from musku.domain import (
    ComparisonResult,
    Configuration,
    Decision,
    DeploymentStatus,
    ExperimentStatus,
)
from musku.errors import HostError, InputError, Interrupted, MuskuError, RolledBack
from musku.experiment import Experiment, load_experiment
from musku.owner import controller_id
from musku.rollout.fleet import Fleet, check_hosts, open_fleet
from musku.storage.protocols import DeploymentStore, ResultStore, RunStore
from musku.storage.records import DeploymentRecord, SoftSkuRecord
from musku.storage.store import ClaimHeld
from musku.sweep.runner import NullProgress, Progress, Runner
from musku.sweep.sweep import CLAIM_STALE_S, HEARTBEAT_S, ClaimKeeper, claim_experiment

log = logging.getLogger(__name__)

LOSING = (Decision.WORSE, Decision.GUARDRAIL)
"""Canary decisions that roll the deployment back."""

FleetOpener = Callable[..., Fleet]


@dataclass
class DeployReport:
    """What ``musku sku deploy`` did."""

    deployment_id: int
    soft_sku_id: int
    status: DeploymentStatus
    canary: list[dict[str, Any]] = field(default_factory=list)  # per canary host: its result
    waves: list[list[str]] = field(default_factory=list)
    reason: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {
            "deployment_id": self.deployment_id,
            "soft_sku_id": self.soft_sku_id,
            "status": self.status.value,
            "canary": self.canary,
            "waves": self.waves,
            "reason": self.reason,
        }


@dataclass(frozen=True)
class WatchResult:
    """One re-validation of one deployment."""

    deployment_id: int
    verdict: str  # "holds" | "gone" | "lost"
    code_version: str | None
    comparison_id: int | None
    decision: str
    estimate: float
    reason: str

    @property
    def flagged(self) -> bool:
        return self.verdict != "holds"

    def to_dict(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "flagged": self.flagged}


# ---------------------------------------------------------------------------- helpers


def sku_configuration(experiment: Experiment, sku: SoftSkuRecord) -> Configuration:
    """The soft SKU over the experiment's production configuration (refused, one line, when
    it was found for another service or platform)."""
    s = sku.sku
    if (s.service, s.platform) != (experiment.service.name, experiment.platform.name):
        raise InputError(
            f"soft SKU {sku.id} is for {s.service} on {s.platform}, but "
            f"{experiment.path} is {experiment.service.name} on {experiment.platform.name}"
        )
    return experiment.production.merged(s.configuration)


def fleet_state(store: ResultStore, backend: str) -> dict[str, Configuration]:
    """What the results DB says each host runs: the applied hosts of live deployments."""
    state: dict[str, Configuration] = {}
    for dep in store.deployments(live=True):
        if dep.backend != backend:
            continue
        rec = store.softsku(dep.soft_sku_id)
        if rec is None:
            continue
        for host in dep.applied_hosts():
            state[host] = rec.sku.configuration
    return state


def _taken(store: DeploymentStore, backend: str) -> dict[str, int]:
    """Host -> the live deployment holding it."""
    out: dict[str, int] = {}
    for dep in store.deployments(live=True):
        if dep.backend == backend:
            for host in dep.hosts:
                out.setdefault(host, dep.id)
    return out


def production_hosts(fleet: Fleet, taken: Mapping[str, int], avoid: Sequence[str]) -> list[str]:
    """Hosts still on production (in no live deployment and not in ``avoid``)."""
    return [h for h in fleet.names if h not in taken and h not in avoid]


def check_time(seconds: float | None, option: str) -> None:
    """A host-time budget: a finite number of seconds above 0 (None: none given)."""
    if seconds is not None and not (math.isfinite(seconds) and seconds > 0):
        raise InputError(f"{option} {seconds}: must be a finite number of seconds above 0")


def _spec_for(experiment: Experiment, host_time_s: float | None) -> Experiment:
    """The experiment with its sample cap set from a host-time budget (None: as it is)."""
    if host_time_s is None:
        return experiment
    stats = experiment.stats
    cap = max(1, int(host_time_s / stats.sample_interval_s))
    spec = dataclasses.replace(
        experiment.spec, stats=dataclasses.replace(stats, sample_cap=min(cap, stats.sample_cap))
    )
    return dataclasses.replace(experiment, spec=spec)


def _compare(
    store: ResultStore,
    experiment: Experiment,
    exp_id: int,
    pair: Any,
    purpose: str,
    baseline: Configuration,
    candidate: Configuration,
    *,
    progress: Progress,
    stop: threading.Event,
    seed: int,
) -> tuple[ComparisonResult, int | None]:
    """One comparison through the sweep's runner, recorded under run ``exp_id``."""
    runner = Runner(
        experiment, pair, store=store, experiment_id=exp_id, progress=progress, stop=stop, seed=seed
    )
    result = runner.compare(purpose, baseline, candidate)
    return result, store.comparison_id_of(exp_id, purpose)


# ---------------------------------------------------------------------------- deploy


def experiment_for(store: ResultStore, sku_id: int, file: Path | None) -> Experiment:
    """The experiment a deployment of ``sku_id`` runs under: ``file``, else the file of the
    run that found the soft SKU (as recorded in the DB)."""
    if file is None:
        rec = store.softsku(sku_id)
        if rec is None:
            raise InputError(f"no soft SKU with id {sku_id} (`musku sku show` lists them)")
        file = Path(store.experiment(rec.experiment_id).path)
        if not file.is_file():
            raise InputError(
                f"soft SKU {sku_id} was found by {file}, which is not there any more: "
                "give --experiment FILE"
            )
    return load_experiment(file)


def check_request(
    hosts: Sequence[str], canary: int, wave_size: int, fleet_names: Sequence[str] | None = None
) -> None:
    """The command line's refusals that need no database: empty, a host twice, the canary."""
    if not hosts:
        raise InputError("--hosts: give at least one host")
    seen: dict[str, int] = {}
    for i, h in enumerate(hosts):
        if h in seen:
            raise InputError(f"--hosts: host {h!r} is listed twice (positions {seen[h]} and {i})")
        seen[h] = i
    if canary < 1:
        raise InputError(f"--canary {canary}: at least one canary host")
    if canary > len(hosts):
        raise InputError(f"--canary {canary} is bigger than the {len(hosts)} host(s) given")
    if wave_size < 1:
        raise InputError(f"--wave-size {wave_size}: at least one host per wave")


def deploy_sku(
    store: ResultStore,
    experiment: Experiment,
    sku_id: int,
    hosts: Sequence[str],
    *,
    canary: int = 1,
    canary_time_s: float | None = None,
    wave_size: int = 1,
    seed: int | None = None,
    code_version: str | None = None,
    progress: Progress | None = None,
    stop: threading.Event | None = None,
    fleet_opener: FleetOpener = open_fleet,
    claim_stale_s: float = CLAIM_STALE_S,
    heartbeat_s: float = HEARTBEAT_S,
) -> DeployReport:
    """Deploy soft SKU ``sku_id`` on ``hosts``: canary, A/B, waves (module docstring).

    Returns the report of a deployed SKU; raises :class:`RolledBack` (exit 8) when the canary
    lost or broke a guardrail, :class:`HostError` when a host failed (rolled back),
    :class:`Interrupted` on ``stop``; each after every applied host is back at baseline and
    the deployment row says so. Bad requests are refused before anything is written.

    The deployment's controller claims its experiment and heartbeats it every
    ``heartbeat_s`` until the deployment ends: a ``canary`` / ``rolling`` deployment holding
    a requested host whose controller's heartbeat is older than ``claim_stale_s`` is taken
    over (:func:`take_over`), a live one is refused."""
    progress = progress or NullProgress()
    stop = stop or threading.Event()
    check_request(hosts, canary, wave_size)
    check_time(canary_time_s, "--canary-time")
    rec = store.softsku(sku_id)
    if rec is None:
        raise InputError(f"no soft SKU with id {sku_id} (`musku sku show` lists them)")
    sku = sku_configuration(experiment, rec)
    run_seed = experiment.stats.seed if seed is None else seed
    backend = experiment.hosts.backend
    fleet = fleet_opener(
        experiment, seed=run_seed, state=fleet_state(store, backend), code_version=code_version
    )
    try:
        check_hosts(fleet, hosts)
        taken = _taken(store, backend)
        for dep_id in dict.fromkeys(taken[h] for h in hosts if h in taken):
            dep = store.deployment(dep_id)
            if dep is not None and dep.status is not DeploymentStatus.DEPLOYED:
                take_over(store, fleet, dep, claim_stale_s, progress)
        taken = _taken(store, backend)
        for h in hosts:
            if h in taken:
                dep = store.deployment(taken[h])
                assert dep is not None  # _taken read it from the live deployments
                raise InputError(
                    f"host {h} already runs soft SKU {dep.soft_sku_id} of live deployment "
                    f"{dep.id} ({dep.status.value})"
                )
        canaries = list(hosts[:canary])
        # production hosts outside the rollout first: they stay on production afterwards
        outside = production_hosts(fleet, taken, hosts)
        if not outside:
            raise InputError(
                f"no production hosts left after this deployment: every host of "
                f"{experiment.path.name} other than --hosts runs a deployed soft SKU; keep at "
                "least one out (the canary A/B and `musku sku watch` compare against it)"
            )
        inside = [h for h in hosts[canary:] if h not in taken]
        prods = outside + inside
        if not prods:
            raise InputError(
                "no production hosts left to compare the canary against: every other host "
                "is a canary or runs a deployed soft SKU"
            )
        exp_id = store.create_experiment(experiment, mode="deploy")
        claim_experiment(store, exp_id, claim_stale_s)  # new and ours: no other controller holds it
        keeper = ClaimKeeper(store, exp_id, controller_id(), heartbeat_s)
        try:
            return _deploy(
                keeper,
                store, experiment, fleet, exp_id, sku_id, sku, hosts, canaries, prods,
                canary=canary, canary_time_s=canary_time_s, wave_size=wave_size,
                run_seed=run_seed, progress=progress, stop=stop,
            )  # fmt: skip
        finally:
            keeper.close()
    finally:
        fleet.close()


def _deploy(
    keeper: ClaimKeeper,
    store: ResultStore,
    experiment: Experiment,
    fleet: Fleet,
    exp_id: int,
    sku_id: int,
    sku: Configuration,
    hosts: Sequence[str],
    canaries: list[str],
    prods: list[str],
    *,
    canary: int,
    canary_time_s: float | None,
    wave_size: int,
    run_seed: int,
    progress: Progress,
    stop: threading.Event,
) -> DeployReport:
    """The deployment of :func:`deploy_sku` once its experiment is claimed."""
    backend = experiment.hosts.backend
    store.set_status(exp_id, ExperimentStatus.RUNNING)
    try:
        dep_id = store.create_deployment(
            sku_id,
            exp_id,
            backend=backend,
            hosts=list(hosts),
            canary_hosts=canaries,
            controller=controller_id(),
            code_version=fleet.code_version(),
        )
    except BaseException:
        store.set_status(exp_id, ExperimentStatus.FAILED)
        raise
    roll = _Rollout(store, experiment, fleet, exp_id, dep_id, sku_id, sku, progress, stop)
    roll.lost = lambda: keeper.lost
    try:
        roll.canary(canaries, prods, canary_time_s, run_seed)
        roll.rolling([list(hosts[i : i + wave_size]) for i in range(canary, len(hosts), wave_size)])
    except BaseException as exc:
        roll.roll_back(exc)
        if not keeper.lost:  # else the controller that took it over ended the run
            store.set_status(exp_id, ExperimentStatus.FAILED)
        raise
    store.set_status(exp_id, ExperimentStatus.DONE)
    return roll.report


def take_over(
    store: ResultStore, fleet: Fleet, dep: DeploymentRecord, stale_s: float, progress: Progress
) -> None:
    """Deployment ``dep`` (``canary`` or ``rolling``) left by a controller whose heartbeat is
    older than ``stale_s``: claim its experiment, put every host of it not recorded as back
    at production back (those it may have been applying when it stopped too), and mark it
    ``rolled_back`` (``failed``, raising :class:`HostError`, when a host could not be put
    back), with a note naming the old controller. Refused, one line (exit 3), while that
    controller's heartbeat is fresh."""
    try:
        claim_experiment(store, dep.experiment_id, stale_s)
    except ClaimHeld as exc:
        raise InputError(
            f"deployment {dep.id} ({dep.status.value}) is in progress under controller "
            f"{dep.controller}: {exc.one_line()}"
        ) from None
    me = controller_id()
    try:
        progress.message(
            f"deployment {dep.id}: controller {dep.controller} stopped: taking over, "
            "rolling its hosts back"
        )
        waves = [dict(w) for w in dep.waves]
        back = {str(h) for w in waves if w.get("state") != "applied" for h in w.get("hosts", [])}
        # every host not recorded as back at production: an applied one, and any the old
        # controller may have been applying when it stopped (undeploying a host that never
        # got the soft SKU changes nothing)
        errors: list[str] = []
        for host in reversed(dep.hosts):
            if host in back:
                continue
            try:
                fleet.undeploy(host, f"deployment-{dep.id}")
            except MuskuError as exc:
                errors.append(f"{host}: {exc.one_line()}")
        for wave in waves:
            if wave.get("state") in ("applied", "restored"):
                wave["state"] = "rolled_back"
        reason = f"controller {dep.controller} stopped (stale heartbeat); taken over by {me}"
        if errors:
            reason += f"; not rolled back: {'; '.join(errors)}"
        status = DeploymentStatus.FAILED if errors else DeploymentStatus.ROLLED_BACK
        store.update_deployment(dep.id, waves=waves, status=status, reason=reason)
        if store.experiment(dep.experiment_id).status is ExperimentStatus.RUNNING:
            store.set_status(dep.experiment_id, ExperimentStatus.FAILED)
        if errors:
            raise HostError(f"deployment {dep.id}: {reason}")
    finally:
        store.release(dep.experiment_id, me)


class _Rollout:
    """One deployment's steps, its waves as recorded, and the rollback."""

    def __init__(
        self,
        store: ResultStore,
        experiment: Experiment,
        fleet: Fleet,
        exp_id: int,
        dep_id: int,
        sku_id: int,
        sku: Configuration,
        progress: Progress,
        stop: threading.Event,
    ) -> None:
        self.store, self.experiment, self.fleet = store, experiment, fleet
        self.exp_id, self.dep_id, self.sku = exp_id, dep_id, sku
        self.progress, self.stop = progress, stop
        self.owner = f"deployment-{dep_id}"
        self.waves: list[dict[str, Any]] = []
        self.report = DeployReport(dep_id, sku_id, DeploymentStatus.CANARY)
        self.lost: Callable[[], bool] = lambda: False  # the claim was taken over

    def _record(self, **fields: Any) -> None:
        if self.lost():  # another controller took it over: the row is its now
            raise HostError(
                f"deployment {self.dep_id}: taken over by another controller (this one's "
                "heartbeat went stale)"
            )
        self.store.update_deployment(self.dep_id, waves=self.waves, **fields)

    def canary(
        self, canaries: list[str], prods: list[str], canary_time_s: float | None, seed: int
    ) -> None:
        base = self.experiment.production
        exp = _spec_for(self.experiment, canary_time_s)
        for i, host in enumerate(canaries):
            prod = prods[i % len(prods)]
            self.progress.message(f"deployment {self.dep_id}: canary {host} against {prod}")
            pair = self.fleet.open_pair(prod, host, self.owner, seed)
            wave: dict[str, Any] = {"kind": "canary", "hosts": [host], "production": prod}
            try:
                pair.apply((base, self.sku))  # the canary gets the soft SKU
                wave["state"] = "applied"
                self.waves.append(wave)
                self._record()
                result, cmp_id = _compare(
                    self.store,
                    exp,
                    self.exp_id,
                    pair,
                    f"deploy:canary:{host}",
                    base,
                    self.sku,
                    progress=self.progress,
                    stop=self.stop,
                    seed=seed,
                )
            except BaseException:
                try:
                    pair.restore()  # both hosts back at what they ran before
                    wave["state"] = "restored"
                except MuskuError:
                    pass  # still "applied": the rollback undeploys it
                finally:
                    pair.close()
                raise
            keep = result.decision not in LOSING
            self.fleet.settle(pair, self.owner, self.sku if keep else None)
            if not keep:
                wave["state"] = "rolled_back"
            wave.update(
                comparison_id=cmp_id, decision=result.decision.value, estimate=result.estimate
            )
            self.report.canary.append(
                {
                    "host": host,
                    "production": prod,
                    "comparison_id": cmp_id,
                    "decision": result.decision.value,
                    "estimate": result.estimate,
                    "ci": [result.ci_low, result.ci_high],
                    "reason": result.reason,
                }
            )
            self._record(canary_comparison_id=cmp_id if i == 0 or not keep else None)
            if not keep:
                raise RolledBack(
                    f"deployment {self.dep_id}: canary {host} against {prod}: "
                    f"{result.decision.value} ({result.estimate:+.2%}; {result.reason}): "
                    "rolled back"
                )

    def rolling(self, waves: list[list[str]]) -> None:
        self._record(status=DeploymentStatus.ROLLING)
        self.report.status = DeploymentStatus.ROLLING
        for n, hosts in enumerate(waves, start=1):
            if self.stop.is_set():
                raise Interrupted(f"deployment {self.dep_id}: stopped before wave {n}")
            self.progress.message(f"deployment {self.dep_id}: wave {n}: {', '.join(hosts)}")
            wave: dict[str, Any] = {"kind": "wave", "hosts": [], "state": "applied"}
            self.waves.append(wave)
            for host in hosts:
                try:
                    self.fleet.deploy(host, self.sku, self.owner)
                except MuskuError as exc:
                    raise HostError(f"wave {n}: {host}: deploy failed: {exc.one_line()}") from None
                wave["hosts"].append(host)
                self._record()
            for host in hosts:  # read back before the next wave
                got = self.fleet.deployed(host)
                wrong = {
                    k: (v, got.get(k)) for k, v in self.sku.as_dict().items() if got.get(k) != v
                }
                if wrong:
                    shown = ", ".join(f"{k}={a!r} reads back {b!r}" for k, (a, b) in wrong.items())
                    raise HostError(f"wave {n}: {host}: verify failed: {shown}")
            wave["verified"] = True
            self.report.waves.append(list(hosts))
            self._record()
        self._record(status=DeploymentStatus.DEPLOYED, reason="")
        self.report.status = DeploymentStatus.DEPLOYED

    def roll_back(self, cause: BaseException) -> None:
        """Every host this deployment applied the soft SKU to back at baseline, newest first;
        the row ends ``rolled_back`` (``failed`` when a host could not be put back)."""
        errors: list[str] = []
        for wave in reversed(self.waves):
            if wave.get("state") == "restored":
                wave["state"] = "rolled_back"  # its pair's restore put it back
            if wave.get("state") != "applied":
                continue
            for host in reversed(wave["hosts"]):
                try:
                    self.fleet.undeploy(host, self.owner)
                except MuskuError as exc:
                    errors.append(f"{host}: {exc.one_line()}")
            wave["state"] = "rolled_back"
        why = cause.one_line() if isinstance(cause, MuskuError) else f"{type(cause).__name__}"
        status = DeploymentStatus.FAILED if errors else DeploymentStatus.ROLLED_BACK
        reason = why + (f"; not rolled back: {'; '.join(errors)}" if errors else "")
        if not self.lost():  # else the controller that took it over recorded its end
            self._record(status=status, reason=reason)
        self.report.status, self.report.reason = status, reason


def rollback_deployment(
    store: ResultStore,
    dep_id: int,
    *,
    experiment_file: Path | None = None,
    progress: Progress | None = None,
    fleet_opener: FleetOpener = open_fleet,
    claim_stale_s: float = CLAIM_STALE_S,
) -> DeploymentRecord:
    """``musku sku rollback DEPLOYMENT``: every host deployment ``dep_id`` applied its soft
    SKU to back at its baseline, newest first, and the row ``rolled_back`` (``failed``, with
    :class:`HostError`, when a host could not be put back), so its hosts are free for another
    deployment. A ``canary`` / ``rolling`` deployment is taken over when its controller's
    heartbeat is stale (:func:`take_over`). Refused (one line, exit 3, nothing changed): an
    unknown deployment, one already ended, one another live controller holds."""
    progress = progress or NullProgress()
    dep = store.deployment(dep_id)
    if dep is None:
        raise InputError(f"no deployment {dep_id} (`musku sku deployments` lists them)")
    if not dep.status.live:
        raise InputError(
            f"deployment {dep_id} is {dep.status.value} already: its hosts run no soft SKU of it"
        )
    experiment = (
        load_experiment(experiment_file)
        if experiment_file is not None
        else _deployed_by(store, dep, dep.backend)
    )
    fleet = fleet_opener(
        experiment,
        seed=experiment.stats.seed,
        state=fleet_state(store, dep.backend),
        code_version=None,
    )
    try:
        check_hosts(fleet, dep.hosts)
        if dep.status is not DeploymentStatus.DEPLOYED:
            take_over(store, fleet, dep, claim_stale_s, progress)
            got = store.deployment(dep_id)
            assert got is not None
            return got  # type: ignore[no-any-return]
        try:
            claim_experiment(store, dep.experiment_id, claim_stale_s)
        except ClaimHeld as exc:
            raise InputError(
                f"deployment {dep.id} is held by another controller: {exc.one_line()}"
            ) from None
        me = controller_id()
        try:
            _end(
                store,
                fleet,
                dep,
                progress,
                where="its baseline",
                state="rolled_back",
                status=DeploymentStatus.ROLLED_BACK,
                why=f"rolled back by an operator (musku sku rollback, controller {me})",
                unmet="not rolled back",
            )
        finally:
            store.release(dep.experiment_id, me)
        got = store.deployment(dep_id)
        assert got is not None
        return got  # type: ignore[no-any-return]
    finally:
        fleet.close()


def _end(
    store: ResultStore,
    fleet: Any,
    dep: Any,
    progress: Any,
    *,
    where: str,
    state: str,
    status: DeploymentStatus,
    why: str,
    unmet: str,
) -> None:
    """End deployment ``dep`` by an operator's command: every applied host put back (last
    first), its applied waves marked ``state``, the row ``status`` with reason ``why``; a
    host that cannot be put back makes the row FAILED, named after ``unmet``, and raises
    HostError."""
    errors: list[str] = []
    for host in reversed(dep.applied_hosts()):
        progress.message(f"deployment {dep.id}: {host} back at {where}")
        try:
            fleet.undeploy(host, f"deployment-{dep.id}")
        except MuskuError as exc:
            errors.append(f"{host}: {exc.one_line()}")
    waves = [dict(w) for w in dep.waves]
    for wave in waves:
        if wave.get("state") in ("applied", "restored"):
            wave["state"] = state
    if errors:
        why += f"; {unmet}: {'; '.join(errors)}"
        status = DeploymentStatus.FAILED
    store.update_deployment(dep.id, waves=waves, status=status, reason=why)
    if errors:
        raise HostError(f"deployment {dep.id}: {why}")


def retire_deployment(
    store: ResultStore,
    dep_id: int,
    *,
    reason: str = "",
    experiment_file: Path | None = None,
    progress: Progress | None = None,
    fleet_opener: FleetOpener = open_fleet,
    claim_stale_s: float = CLAIM_STALE_S,
) -> DeploymentRecord:
    """``musku sku retire DEPLOYMENT``: end a ``deployed`` deployment as planned (superseded
    by a newer soft SKU, the service leaving these hosts, the trial over): every host it
    applied its soft SKU to back at production, newest first, its waves ``retired``, the row
    ``retired`` with ``reason``; its hosts are free for another deployment and no watch looks
    at it again. Unlike :func:`rollback_deployment` it says nothing against the soft SKU and
    takes nothing over: only a ``deployed`` deployment is retired. Refused (one line, exit 3,
    nothing changed): an unknown deployment, one already ended, one still rolling out (its
    controller's, or ``musku sku rollback``'s, to end), one another controller holds (a
    rollback or retire under way). A host that cannot be put back leaves the row ``failed``
    naming it (:class:`HostError`, exit 6), as a rollback does: no deployment is left
    ``deployed`` on hosts that no longer run it, nor ``retired`` on hosts that still do."""
    progress = progress or NullProgress()
    dep = store.deployment(dep_id)
    if dep is None:
        raise InputError(f"no deployment {dep_id} (`musku sku deployments` lists them)")
    if not dep.status.live:
        raise InputError(f"deployment {dep_id} is {dep.status.value} already: nothing to retire")
    if dep.status is not DeploymentStatus.DEPLOYED:
        raise InputError(
            f"deployment {dep_id} is still {dep.status.value} (controller {dep.controller}): "
            f"only a deployed one is retired; `musku sku rollback {dep_id}` stops a rollout"
        )
    experiment = (
        load_experiment(experiment_file)
        if experiment_file is not None
        else _deployed_by(store, dep, dep.backend)
    )
    fleet = fleet_opener(
        experiment,
        seed=experiment.stats.seed,
        state=fleet_state(store, dep.backend),
        code_version=None,
    )
    try:
        check_hosts(fleet, dep.hosts)
        try:
            claim_experiment(store, dep.experiment_id, claim_stale_s)
        except ClaimHeld as exc:
            raise InputError(
                f"deployment {dep.id} is held by another controller: {exc.one_line()}"
            ) from None
        me = controller_id()
        try:
            current = store.deployment(dep_id)  # a rollback may have ended it meanwhile
            if current is None or current.status is not DeploymentStatus.DEPLOYED:
                state = current.status.value if current else "gone"
                raise InputError(f"deployment {dep_id} is {state} already: nothing to retire")
            why = f"retired by an operator (musku sku retire, controller {me})"
            _end(
                store,
                fleet,
                current,
                progress,
                where="production",
                state="retired",
                status=DeploymentStatus.RETIRED,
                why=f"{why}: {reason}" if reason else why,
                unmet="not put back",
            )
        finally:
            store.release(dep.experiment_id, me)
        got = store.deployment(dep_id)
        assert got is not None
        return got  # type: ignore[no-any-return]
    finally:
        fleet.close()


# ---------------------------------------------------------------------------- watch


def verdict_of(decision: Decision) -> str:
    """``holds`` (significantly better), ``lost`` (worse or a guardrail), else ``gone``."""
    if decision is Decision.BETTER:
        return "holds"
    if decision in LOSING:
        return "lost"
    return "gone"


def _due(
    store: DeploymentStore,
    dep: DeploymentRecord,
    version: str | None,
    every_s: float | None,
    now: float,
) -> bool:
    watches = store.watches(dep.id)
    last_version = watches[-1].code_version if watches else dep.code_version
    if version is not None and version != last_version:
        return True  # a code push since the last check
    if every_s is None:
        return False
    last = watches[-1].checked_at if watches else dep.finished_at or dep.updated_at
    return now - last.timestamp() >= every_s


def watch_round(
    store: ResultStore,
    experiment: Experiment,
    *,
    force: bool = False,
    every_s: float | None = None,
    check_time_s: float | None = None,
    seed: int | None = None,
    code_version: str | None = None,
    progress: Progress | None = None,
    stop: threading.Event | None = None,
    fleet_opener: FleetOpener = open_fleet,
) -> list[WatchResult]:
    """Re-validate the experiment's service's ``deployed`` deployments that are due (all of
    them with ``force``): one comparison each, a deployed host against a production host,
    recorded under a run of mode ``watch`` and as a ``deployment_watches`` row."""
    progress = progress or NullProgress()
    stop = stop or threading.Event()
    check_time(check_time_s, "--check-time")
    backend = experiment.hosts.backend
    run_seed = experiment.stats.seed if seed is None else seed
    deps = []
    for dep in store.deployments(live=True):
        if dep.backend != backend or dep.status is not DeploymentStatus.DEPLOYED:
            continue
        rec = store.softsku(dep.soft_sku_id)
        if rec is None or (rec.sku.service, rec.sku.platform) != (
            experiment.service.name,
            experiment.platform.name,
        ):
            continue
        deps.append((dep, rec))
    if not deps:
        if force:  # asked for a check: say there is nothing to check
            raise InputError(
                f"no deployed soft SKU of {experiment.service.name} on "
                f"{experiment.platform.name} to watch (`musku sku deployments` lists them)"
            )
        return []
    # each deployment on the hosts of its own experiment file: the watched file when it has
    # the deployment's hosts, else the file that deployed it (one service, many files)
    groups: dict[str, tuple[Experiment, list[tuple[DeploymentRecord, SoftSkuRecord]]]] = {}
    names: dict[str, list[str]] = {}
    fleets: dict[str, Fleet] = {}
    state = fleet_state(store, backend)
    try:

        def fleet_of(exp: Experiment) -> Fleet:
            key = str(exp.path)
            if key not in fleets:
                fleets[key] = fleet_opener(
                    exp, seed=run_seed, state=state, code_version=code_version
                )
                names[key] = list(fleets[key].names)
            return fleets[key]

        for dep, rec in deps:
            exp = experiment
            if not set(dep.hosts) <= set(fleet_of(experiment).names):
                exp = _deployed_by(store, dep, backend)
                fleet_of(exp)
            groups.setdefault(str(exp.path), (exp, []))[1].append((dep, rec))
        version = fleet_of(experiment).code_version()
        now = time.time()
        taken = _taken(store, backend)
        plan: list[tuple[Experiment, Fleet, DeploymentRecord, SoftSkuRecord, list[str]]] = []
        for key, (exp, members) in groups.items():
            fleet = fleets[key]
            v = fleet.code_version()
            prods = production_hosts(fleet, taken, ())
            for dep, rec in members:
                if not (force or _due(store, dep, v, every_s, now)):
                    continue
                if not dep.applied_hosts():
                    raise InputError(f"deployment {dep.id} has no applied host to re-validate")
                if not prods:
                    raise InputError(
                        f"deployment {dep.id}: no production hosts left to compare against: "
                        f"every host of {exp.path.name} runs a deployed soft SKU "
                        f"(`musku sku rollback {dep.id}` frees them)"
                    )
                plan.append((exp, fleet, dep, rec, prods))
        if not plan:
            return []
        out: list[WatchResult] = []
        exp_id = store.create_experiment(experiment, mode="watch")
        store.set_status(exp_id, ExperimentStatus.RUNNING)
        try:
            for n, (exp, fleet, dep, rec, prods) in enumerate(plan):
                v = fleet.code_version() if fleet is not fleet_of(experiment) else version
                out.append(
                    _watch_one(
                        store,
                        _spec_for(exp, check_time_s),
                        exp_id,
                        fleet,
                        dep,
                        rec,
                        prods,
                        n,
                        v,
                        run_seed,
                        progress,
                        stop,
                    )  # fmt: skip
                )
        except BaseException:
            store.set_status(exp_id, ExperimentStatus.FAILED)
            raise
        store.set_status(exp_id, ExperimentStatus.DONE)
        return out
    finally:
        for f in fleets.values():
            f.close()


def _deployed_by(store: RunStore, dep: DeploymentRecord, backend: str) -> Experiment:
    """The experiment file deployment ``dep`` was made with (its hosts), as the DB records
    it; refused (one line, exit 3) when that file is gone or is not on ``backend``."""
    run = store.experiment(dep.experiment_id)
    path = Path(run.path)
    if not path.is_file():
        raise InputError(
            f"deployment {dep.id} runs on {', '.join(dep.hosts)}, hosts of {path}, which is "
            "not there any more: watch with that experiment file"
        )
    exp = load_experiment(path)
    if exp.hosts.backend != backend:
        raise InputError(f"deployment {dep.id} was made with {path} on another backend")
    return exp


def _watch_one(
    store: ResultStore,
    experiment: Experiment,
    exp_id: int,
    fleet: Fleet,
    dep: DeploymentRecord,
    rec: SoftSkuRecord,
    prods: list[str],
    n: int,
    version: str | None,
    seed: int,
    progress: Progress,
    stop: threading.Event,
) -> WatchResult:
    applied = dep.applied_hosts()
    if not applied:
        raise InputError(f"deployment {dep.id} has no applied host to re-validate")
    if not prods:
        raise InputError(
            f"deployment {dep.id}: no production hosts left to compare against: every host "
            "runs a deployed soft SKU"
        )
    k = len(store.watches(dep.id))  # rotate over the deployment's hosts from check to check
    host, prod = applied[k % len(applied)], prods[(n + k) % len(prods)]
    sku = sku_configuration(experiment, rec)
    base = experiment.production
    owner = f"deployment-{dep.id}"
    progress.message(f"deployment {dep.id}: re-validating {host} against {prod}")
    pair = fleet.open_pair(prod, host, owner, seed)
    try:
        result, cmp_id = _compare(
            store, experiment, exp_id, pair, f"watch:{dep.id}:{host}", base, sku,
            progress=progress, stop=stop, seed=seed,
        )  # fmt: skip
    except BaseException:
        try:
            fleet.settle(pair, owner, sku)
        except MuskuError as exc:  # the comparison's own error is the one to report
            log.error("deployment %d: %s not settled: %s", dep.id, host, exc.one_line())
        raise
    fleet.settle(pair, owner, sku)  # the deployed host stays deployed
    verdict = verdict_of(result.decision)
    reason = f"{result.decision.value} ({result.estimate:+.2%}): {result.reason}"
    store.add_watch(
        dep.id, verdict=verdict, code_version=version, comparison_id=cmp_id, reason=reason
    )
    return WatchResult(
        dep.id, verdict, version, cmp_id, result.decision.value, result.estimate, reason
    )


def watch(
    store: ResultStore,
    experiment: Experiment,
    *,
    every_s: float,
    poll_s: float,
    stop: threading.Event,
    on_round: Callable[[list[WatchResult]], None],
    **kwargs: Any,
) -> list[WatchResult]:
    """Watch until ``stop``: a forced round first, then a round every ``poll_s`` that
    re-validates what is due (``every_s`` since its last check, or a code push). Returns every
    flagged result."""
    flagged: list[WatchResult] = []
    force = True
    while not stop.is_set():
        try:
            results = watch_round(
                store, experiment, force=force, every_s=every_s, stop=stop, **kwargs
            )
        except Interrupted:
            if stop.is_set():  # Ctrl-C during a comparison: it is recorded as aborted
                break
            raise
        force = False
        flagged.extend(r for r in results if r.flagged)
        on_round(results)
        stop.wait(poll_s)
    return flagged
