"""Experiment claims (issue 20 item 3, revision 0005) on SQLite and a real PostgreSQL: one
controller holds an experiment; another is refused with one line naming it while its heartbeat
is fresh and takes a stale claim over atomically; the old holder then knows it lost it."""

from __future__ import annotations

from datetime import timedelta

import pytest
from sqlalchemy import select, update

from musku.experiment import Experiment
from musku.storage import convert
from musku.storage.models import ExperimentRow
from musku.storage.store import ClaimHeld, Store

A, B = "alice@h1:11:aaaa", "bob@h2:22:bbbb"


def _age(store: Store, exp_id: int, seconds: float) -> None:
    with store.engine.begin() as conn:
        conn.execute(
            update(ExperimentRow)
            .where(ExperimentRow.id == exp_id)
            .values(claim_heartbeat=convert.now() - timedelta(seconds=seconds))
        )


def _holder(store: Store, exp_id: int) -> str | None:
    with store.engine.connect() as conn:
        return conn.execute(
            select(ExperimentRow.claim_controller).where(ExperimentRow.id == exp_id)
        ).scalar_one()


def test_claim_refused_while_fresh_taken_over_when_stale(
    store: Store, experiment: Experiment
) -> None:
    exp_id = store.create_experiment(experiment)
    store.claim(exp_id, A, "h1", 11, stale_s=60)
    store.claim(exp_id, A, "h1", 11, stale_s=60)  # its own: again is fine
    _age(store, exp_id, 30)
    with pytest.raises(ClaimHeld) as info:
        store.claim(exp_id, B, "h2", 22, stale_s=60)
    msg = info.value.one_line()
    assert msg.startswith(f"experiment {exp_id} is held by controller {A} on host h1 (pid 11)")
    assert "heartbeat 30s ago" in msg and info.value.status == 5
    assert store.heartbeat(exp_id, A)
    _age(store, exp_id, 61)  # the holder stopped beating: stale
    store.claim(exp_id, B, "h2", 22, stale_s=60)
    assert _holder(store, exp_id) == B
    assert not store.heartbeat(exp_id, A)  # A learns it lost the claim
    store.release(exp_id, A)  # ...and its release leaves B's claim alone
    assert _holder(store, exp_id) == B
    store.release(exp_id, B)
    assert _holder(store, exp_id) is None
    store.claim(exp_id, A, "h1", 11, stale_s=60)  # unclaimed again: free to take
