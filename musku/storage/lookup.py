"""Which run a name means: ``musku report NAME``, ``musku results NAME`` and the exports take
the latest *finished sweep* of that name, or the latest finished run of another kind with
``--kind`` (sweep, abtest, deploy, watch, calibrate: :data:`musku.domain.RUN_KINDS`); an id
names one run whatever its kind. Bad input raises :class:`~musku.errors.InputError` (one line,
exit 3): an unknown kind, a name with no run, a name with runs of other kinds only (the line
names them), a number that is both a run's id and another run's name."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from musku.domain import RUN_KINDS, ExperimentStatus, run_kind
from musku.errors import InputError
from musku.storage.protocols import RunStore
from musku.storage.records import ExperimentRecord


@dataclass(frozen=True)
class FoundRun:
    """The run a reference resolved to, and the one line saying which (``note``)."""

    record: ExperimentRecord
    note: str

    def to_dict(self) -> dict[str, Any]:
        r = self.record
        return {"id": r.id, "name": r.name, "kind": r.kind, "status": r.status.value,
                "note": self.note}  # fmt: skip


def check_kind(kind: str) -> str:
    if kind not in RUN_KINDS:
        raise InputError(f"--kind {kind!r}: choose one of {', '.join(RUN_KINDS)}")
    return kind


def choose(
    runs: list[tuple[int, str, ExperimentStatus]], kind: str
) -> tuple[int, ExperimentStatus] | None:
    """The run of ``kind`` to use among a name's runs (id, mode, status), oldest first: the
    latest finished (``done``) one; without one, the latest that is not ``failed`` (an
    interrupted or running sweep still has comparisons to show); else None."""
    mine = [(i, st) for i, m, st in runs if run_kind(m) == kind]
    for want in (
        lambda st: st is ExperimentStatus.DONE,
        lambda st: st is not ExperimentStatus.FAILED,
    ):
        found = [r for r in mine if want(r[1])]
        if found:
            return found[-1]
    return None


def find_run(store: RunStore, ref: str, kind: str = "sweep") -> FoundRun:
    """The run ``ref`` (a name or an id) means, with the line saying which (see the module)."""
    check_kind(kind)
    ref = ref.strip()
    if not ref:
        raise InputError("which run? give a name or an id (`musku results` lists them)")
    runs = store.runs_named(ref)
    if ref.isascii() and ref.isdigit():  # not `²` or `١٢`, which int() refuses or reads
        rec = store.find_experiment(int(ref))
        if rec is not None and runs:
            raise InputError(
                f"{ref!r} is both run {ref}'s id and the name of run(s) "
                f"{', '.join(str(i) for i, _, _ in runs)}: give the id of the one you mean"
            )
        if rec is not None:
            return FoundRun(rec, _note(rec, f"run {rec.id}"))
    if not runs:
        raise InputError(f"no run named {ref!r} in the results DB (`musku results` lists them)")
    found = choose(runs, kind)
    if found is None:
        others = ", ".join(f"{run_kind(m)} {i} ({st.value})" for i, m, st in runs)
        kinds = sorted({run_kind(m) for _, m, _ in runs})
        raise InputError(
            f"no {kind} named {ref!r}; its runs: {others}: give --kind "
            f"{'|'.join(kinds)} or a run's id"
        )
    rec = store.experiment(found[0])
    why = (
        f"the latest finished {kind}"
        if rec.status is ExperimentStatus.DONE
        else f"no finished {kind}: the latest {kind}"
    )
    return FoundRun(rec, _note(rec, f"{why} of {ref!r}"))


def _note(rec: ExperimentRecord, why: str) -> str:
    return f"using {rec.kind} run {rec.id} of {rec.name!r} ({rec.status.value}): {why}"
