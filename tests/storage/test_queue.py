"""The comparison queue (revision 0007) and ``musku abort``'s store side: on a real PostgreSQL,
concurrent claimers (``SELECT ... FOR UPDATE SKIP LOCKED``) never share a row and never wait;
an expired claim is claimed again once and its half-measured comparison aborted; a presumed
dead claimer's late result is not stored; abort releases claims and is final. SQLite refuses
the queue with one line (it runs one controller per experiment) but aborts the same way."""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest
from sqlalchemy import text, update

from musku.domain import Configuration, Decision, ExperimentStatus
from musku.errors import UnsupportedError
from musku.experiment import Experiment
from musku.storage import convert, open_store
from musku.storage.models import QueueRow
from musku.storage.records import ComparisonStatus, InvalidTransition
from musku.storage.store import Store
from musku.testing.storage import comparison_result, sample_rows

pg = pytest.mark.postgres


def _running(store: Store, experiment: Experiment) -> int:
    exp = store.create_experiment(experiment)
    store.set_status(exp, ExperimentStatus.RUNNING)
    return exp


def _candidates(experiment: Experiment) -> list[Configuration]:
    base = experiment.baseline_config
    return [
        base.with_(knob, value)
        for knob in ("cdp", "thp")
        for value in experiment.space[knob]
        if value != base[knob]
    ]


def _expire(store: Store, item_id: int) -> None:
    """As if its claimer had stopped beating a while ago."""
    with store.engine.begin() as conn:
        conn.execute(
            update(QueueRow)
            .where(QueueRow.id == item_id)
            .values(expires_at=convert.now() - timedelta(seconds=5))
        )


def test_sqlite_has_no_queue_but_aborts(tmp_path: object, experiment: Experiment) -> None:
    store = open_store(f"sqlite:///{tmp_path}/results.db")
    try:
        exp = _running(store, experiment)
        base = experiment.baseline_config
        with pytest.raises(UnsupportedError, match=r"the comparison queue needs PostgreSQL"):
            store.enqueue(exp, "knob:cdp", base, _candidates(experiment)[0], 1)
        assert not store.shared
        rec = store.abort_experiment(exp)
        assert rec.status is ExperimentStatus.ABORTED and rec.finished_at is not None
        store.set_status(exp, ExperimentStatus.INTERRUPTED)  # the run's own ending: a no-op
        assert store.experiment(exp).status is ExperimentStatus.ABORTED
    finally:
        store.close()


@pg
@pytest.mark.parametrize("db_url", ["postgresql"], indirect=True)
def test_enqueue_is_idempotent_and_claimers_never_share(
    db_url: str, store: Store, experiment: Experiment
) -> None:
    exp = _running(store, experiment)
    base = experiment.baseline_config
    cands = _candidates(experiment)
    ids = [store.enqueue(exp, "knob", base, c, n) for n, c in enumerate(cands)]
    assert len(set(ids)) == len(cands)
    assert [store.enqueue(exp, "knob", base, c, 99) for c in cands] == ids  # same rows
    got: list[tuple[str, int]] = []
    lock = threading.Lock()
    start = threading.Barrier(3)

    def claimer(name: str) -> None:
        s = open_store(db_url)
        try:
            start.wait()
            while (item := s.claim_queued(exp, name, lease_s=60)) is not None:
                with lock:
                    got.append((name, item.id))
        finally:
            s.close()

    threads = [threading.Thread(target=claimer, args=(f"c{i}",)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    claimed = sorted(i for _, i in got)
    assert claimed == sorted(ids)  # every row claimed, none twice
    state = store.queue_states([exp])[exp]
    assert state.counts == {"queued": 0, "claimed": len(ids), "done": 0}
    assert sorted(c.holder for c in state.claims) == sorted(n for n, _ in got)
    # the seed the first enqueue gave stays (it is the strategy's)
    with store.engine.connect() as conn:
        seeds = conn.execute(text("SELECT seed FROM comparison_queue ORDER BY id")).scalars().all()
    assert seeds == list(range(len(cands)))


@pg
@pytest.mark.parametrize("db_url", ["postgresql"], indirect=True)
def test_expired_claim_is_claimed_again_once(store: Store, experiment: Experiment) -> None:
    exp = _running(store, experiment)
    base, cand = experiment.baseline_config, _candidates(experiment)[0]
    item_id = store.enqueue(exp, "knob:cdp", base, cand, 7)
    first = store.claim_queued(exp, "dead", lease_s=60, prefer=item_id)
    assert first is not None and first.attempts == 1 and first.seed == 7
    half = store.start_queued(first, "dead")
    store.add_samples(half, sample_rows(6))
    assert store.claim_queued(exp, "other", lease_s=60) is None  # live claim: not claimable
    _expire(store, item_id)
    # a resume meanwhile does not touch a comparison a live claim measures; this one expired
    second = store.claim_queued(exp, "other", lease_s=60)
    assert second is not None and second.id == item_id and second.attempts == 2
    assert store.claim_queued(exp, "third", lease_s=60) is None
    statuses = {c.id: c.status for c in store.comparisons(exp)}
    assert statuses == {half: ComparisonStatus.ABORTED}  # the half-measured one, aborted
    rerun = store.start_queued(second, "other")
    # the presumed-dead claimer wakes up and finishes: not stored
    assert not store.finish_queued(item_id, "dead", half, comparison_result(base, cand))
    assert store.queued_result(item_id) is None
    result = comparison_result(base, cand, Decision.WORSE, -0.02)
    assert store.finish_queued(item_id, "other", rerun, result)
    assert store.queued_result(item_id) == result
    assert store.completed(exp) == [("knob:cdp", result)]
    assert store.queue_states([exp])[exp].counts == {"queued": 0, "claimed": 0, "done": 1}


@pg
@pytest.mark.parametrize("db_url", ["postgresql"], indirect=True)
def test_a_stop_requeues_and_resume_spares_live_claims(
    store: Store, experiment: Experiment
) -> None:
    exp = _running(store, experiment)
    base, cands = experiment.baseline_config, _candidates(experiment)
    a = store.enqueue(exp, "knob", base, cands[0], 1)
    b = store.enqueue(exp, "knob", base, cands[1], 2)
    ia = store.claim_queued(exp, "w1", lease_s=60, prefer=a)
    ib = store.claim_queued(exp, "w2", lease_s=60, prefer=b)
    assert ia is not None and ib is not None
    ca, cb = store.start_queued(ia, "w1"), store.start_queued(ib, "w2")
    _expire(store, b)  # w2 is dead, w1 alive
    assert store.resume(exp) == 1  # only the dead claimer's comparison is aborted
    assert {c.id: c.status for c in store.comparisons(exp)} == {
        ca: ComparisonStatus.RUNNING,
        cb: ComparisonStatus.ABORTED,
    }
    stopped = comparison_result(base, cands[0], Decision.ABORTED)
    assert not store.finish_queued(a, "w1", ca, stopped)  # a stop: back to the queue
    again = store.claim_queued(exp, "w3", lease_s=60, prefer=a)
    assert again is not None and again.id == a and again.attempts == 2
    assert store.beat_queued("w3", 60) == 1
    assert store.release_queued(exp, "w3") == 1
    # w2's expired claim stays until someone claims the row again
    assert store.queue_states([exp])[exp].counts == {"queued": 1, "claimed": 1, "done": 0}


@pg
@pytest.mark.parametrize("db_url", ["postgresql"], indirect=True)
def test_abort_releases_claims_and_is_final(store: Store, experiment: Experiment) -> None:
    exp = _running(store, experiment)
    base, cand = experiment.baseline_config, _candidates(experiment)[0]
    store.claim(exp, "ctl", "h", 1)
    item_id = store.enqueue(exp, "knob", base, cand, 1)
    item = store.claim_queued(exp, "w", lease_s=60)
    assert item is not None
    cmp_id = store.start_queued(item, "w")
    rec = store.abort_experiment(exp)
    assert rec.status is ExperimentStatus.ABORTED
    state = store.queue_states([exp])[exp]
    assert state.counts == {"queued": 1, "claimed": 0, "done": 0} and state.claims == ()
    assert state.controller is not None  # live: the controller releases it as it stops
    assert store.claim_queued(exp, "w2", lease_s=60) is None  # nobody claims an aborted one
    # the worker's late result is not stored
    assert not store.finish_queued(item_id, "w", cmp_id, comparison_result(base, cand))
    with pytest.raises(InvalidTransition, match=r"is already aborted: only a running"):
        store.abort_experiment(exp)
    # a dead controller's claim and running comparisons are released by the abort itself
    exp2 = _running(store, experiment)
    store.claim(exp2, "dead", "h", 2)
    left = store.start_comparison(exp2, "knob", base, cand)
    with store.engine.begin() as conn:
        conn.execute(
            text("UPDATE experiments SET claim_heartbeat = :t WHERE id = :i"),
            {"t": convert.now() - timedelta(seconds=300), "i": exp2},
        )
    store.abort_experiment(exp2, stale_s=60)
    assert store.queue_states([exp2])[exp2].controller is None
    assert [c.status for c in store.comparisons(exp2) if c.id == left] == [ComparisonStatus.ABORTED]
