"""Resume is idempotent at every kill point (issue 29 item 4): a real `musku sweep` process
SIGKILLed at a chosen moment -- as a validation starts, during its first window, when one or
both validations are finished, right after the soft SKU is stored -- then `musku sweep
--resume`, leaves exactly one soft SKU with exactly two validations (production, stock), each
naming a finished comparison, and one done experiment. Before the fix a kill after the soft
SKU was stored gave two identical soft SKUs and four validations.

The kill is a real SIGKILL of the real CLI process, sent by itself from a wrapper around one
Store method (the wrapper lives in this test's driver script, not in musku)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import create_engine, text, update

from musku.storage import convert
from musku.storage.models import ExperimentRow
from tests.timing import scaled

ROOT = Path(__file__).resolve().parents[2]

DRIVER = r"""
import os, signal, sys
from musku.storage import store as S

point = sys.argv[1]
seen = {"validate_started": 0, "validate_finished": 0, "validate_ids": set()}

def kill():
    os.kill(os.getpid(), signal.SIGKILL)

def wrap(name, after):
    orig = getattr(S.Store, name)
    def f(self, *a, **k):
        r = orig(self, *a, **k)
        after(self, r, *a, **k)
        return r
    setattr(S.Store, name, f)

def on_start(self, cmp_id, exp_id, purpose, *a, **k):
    if purpose.startswith("validate:"):
        seen["validate_ids"].add(cmp_id)
        seen["validate_started"] += 1
        if point == "validate-start":
            kill()

def on_samples(self, r, cmp_id, rows, *a, **k):
    if point == "validate-window" and cmp_id in seen["validate_ids"]:
        kill()

def on_finish(self, r, cmp_id, *a, **k):
    if cmp_id in seen["validate_ids"]:
        seen["validate_finished"] += 1
        if point == "validate-one-done" and seen["validate_finished"] == 1:
            kill()
        if point == "validate-both-done" and seen["validate_finished"] == 2:
            kill()

def on_sku(self, r, exp_id, *a, **k):
    if point == "sku-saved":
        kill()
    if point == "abort-after-sku":  # the operator's abort lands just after the soft SKU
        import subprocess
        url = self.engine.url.render_as_string(hide_password=False)
        p = subprocess.run([sys.executable, "-m", "musku", "abort", str(exp_id), "--db", url],
                           capture_output=True, text=True)
        with open(os.environ["ABORT_LOG"], "w") as f:
            f.write(f"{p.returncode}\n{p.stderr}")

orig_save = S.Store.save_softsku
def save_first_aborted(self, exp_id, *a, **k):
    if point == "abort-before-sku":  # the operator's abort lands just before the soft SKU
        other = S.open_store(self.engine.url.render_as_string(hide_password=False))
        other.abort_experiment(exp_id, stale_s=600)
        other.close()
    return orig_save(self, exp_id, *a, **k)
S.Store.save_softsku = save_first_aborted

wrap("start_comparison", on_start)
wrap("add_samples", on_samples)
wrap("finish_comparison", on_finish)
wrap("save_softsku", on_sku)

from musku.cli import main
main(sys.argv[2:])
"""

POINTS = ["validate-start", "validate-window", "validate-one-done", "validate-both-done",
          "sku-saved"]  # fmt: skip


def _run(
    args: list[str], point: str | None = None, abort_log: Path | None = None
) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "MUSKU_DEBUG"}
    env["PYTHONPATH"] = str(ROOT)
    env["ABORT_LOG"] = str(abort_log or "/dev/null")
    cmd = [sys.executable, "-c", DRIVER, point or "none", *args]
    return subprocess.run(
        cmd, capture_output=True, text=True, cwd=ROOT, env=env, timeout=scaled(600)
    )


def _rows(url: str) -> dict[str, Any]:
    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            q = lambda sql: conn.execute(text(sql)).all()  # noqa: E731
            return {
                "experiments": q("SELECT id, status FROM experiments"),
                "skus": q("SELECT id, configuration_id FROM soft_skus"),
                "validations": q(
                    "SELECT v.soft_sku_id, v.against, c.status, c.purpose FROM validations v "
                    "JOIN comparisons c ON c.id = v.comparison_id ORDER BY v.against"
                ),
                "finished_validate": q(
                    "SELECT purpose, count(*) FROM comparisons WHERE purpose LIKE 'validate:%' "
                    "AND status = 'finished' GROUP BY purpose ORDER BY purpose"
                ),
            }
    finally:
        engine.dispose()


def _age_claim(url: str) -> None:
    """As if the killed controller had died a while ago (its heartbeat is stale)."""
    engine = create_engine(url)
    with engine.begin() as conn:
        conn.execute(
            update(ExperimentRow).values(claim_heartbeat=convert.now() - timedelta(seconds=300))
        )
    engine.dispose()


@pytest.mark.timeout(900)
@pytest.mark.parametrize("point", POINTS)
def test_kill_then_resume_leaves_one_soft_sku_with_two_validations(
    toy: Any, tmp_path: Path, point: str
) -> None:
    exp = toy("independent", name=f"kill-{point}")
    # production apart from stock, so the soft SKU has two validations of its own
    text = exp.read_text()
    assert '[production]\nthp = "madvise"\nshp = 0' in text
    exp.write_text(text.replace('[production]\nthp = "madvise"\nshp = 0',
                                '[production]\nthp = "madvise"\nshp = 64'))  # fmt: skip
    url = f"sqlite:///{tmp_path}/results.db"
    first = _run(["sweep", str(exp), "--db", url, "--json", "-q"], point)
    assert first.returncode == -signal.SIGKILL, (first.returncode, first.stderr[-2000:])
    _age_claim(url)
    second = _run(["sweep", str(exp), "--db", url, "--json", "-q", "--resume"])
    assert second.returncode == 0, second.stderr[-2000:]
    report = json.loads(second.stdout)
    rows = _rows(url)
    assert [s for _, s in rows["experiments"]] == ["done"]
    assert report["experiment_id"] == rows["experiments"][0][0]
    assert len(rows["skus"]) == 1, rows
    sku_id = rows["skus"][0][0]
    assert rows["validations"] == [
        (sku_id, "production", "finished", "validate:production"),
        (sku_id, "stock", "finished", "validate:stock"),
    ], rows
    # each validation measured to its end once: a comparison cut by the kill is aborted
    assert rows["finished_validate"] == [("validate:production", 1), ("validate:stock", 1)]
    assert report["soft_sku"] is not None


@pytest.mark.timeout(600)
def test_abort_just_before_the_soft_sku_wins_cleanly(toy: Any, tmp_path: Path) -> None:
    exp = toy("independent", name="abort-before")
    url = f"sqlite:///{tmp_path}/results.db"
    proc = _run(["sweep", str(exp), "--db", url, "--json", "-q"], "abort-before-sku")
    assert proc.returncode == 130, proc.stderr[-2000:]
    assert "was aborted (musku abort) after its last comparison: no soft SKU stored" in proc.stderr
    rows = _rows(url)
    assert [s for _, s in rows["experiments"]] == ["aborted"]
    assert rows["skus"] == [] and rows["validations"] == []


@pytest.mark.timeout(600)
def test_abort_just_after_the_soft_sku_is_refused(toy: Any, tmp_path: Path) -> None:
    exp = toy("independent", name="abort-after")
    url = f"sqlite:///{tmp_path}/results.db"
    log = tmp_path / "abort.log"
    proc = _run(["sweep", str(exp), "--db", url, "--json", "-q"], "abort-after-sku", log)
    assert proc.returncode == 0, proc.stderr[-2000:]
    code, err = log.read_text().split("\n", 1)
    assert code == "3", err
    assert "is already finished: its soft SKU" in err
    rows = _rows(url)
    assert [s for _, s in rows["experiments"]] == ["done"]
    assert len(rows["skus"]) == 1
