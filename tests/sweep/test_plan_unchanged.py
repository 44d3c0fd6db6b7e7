"""``musku sweep --dry-run`` prints what it printed before the planner moved from
musku/report/dryrun.py to musku/sweep/plan.py and each backend and strategy contributed its
own part (issue 33): the JSON of every shipped experiment, as captured at 60e89d1 in
tests/sweep/dryrun_before/, is reproduced exactly (the local backend's host probe is this
machine's, so its ``hosts`` are compared by shape only). One figure has changed on purpose
since: a pool's host-clock estimate (``host_time.clock_s``), which the scheduler's cost model
now computes with comparisons on several pairs at once (issue 31); it is checked to be no
longer than before. And one text: the mode advice quotes the figures measured since (issue 31
item 6: multiarm with the guarded probe and replicated squares); its text is checked to name
the same faster mode and the pool, and everything else is still compared exactly."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from musku.experiment import load_experiment
from musku.sweep.plan import dry_run

ROOT = Path(__file__).resolve().parents[2]
BEFORE = Path(__file__).with_name("dryrun_before")


@pytest.mark.parametrize("name", sorted(p.stem for p in BEFORE.glob("*.json")))
def test_dry_run_output_is_unchanged(name: str) -> None:
    before = json.loads((BEFORE / f"{name}.json").read_text())
    after = json.loads(json.dumps(dry_run(load_experiment(ROOT / "experiments" / f"{name}.toml"))))
    if after["hosts"]["backend"] == "local":
        assert [h["name"] for h in after["hosts"]["hosts"]] == ["local"]
        assert set(after["hosts"]["hosts"][0]["knobs"]) == set(before["hosts"]["hosts"][0]["knobs"])
        before.pop("hosts")
        after.pop("hosts")
    if after.get("pool") and "clock_s" in before.get("host_time", {}):
        # pooled comparisons and side-by-side scans can only shorten the estimated clock
        assert 0 < after["host_time"].pop("clock_s") <= before["host_time"].pop("clock_s")
    advice_before, advice_after = before.get("mode_advice"), after.get("mode_advice")
    if advice_before and advice_after:
        was, now = advice_before.pop("text"), advice_after.pop("text")
        head = f"{advice_before['faster']} expected faster on {advice_before['hosts']} hosts"
        assert was.startswith(head) == now.startswith(head), (was, now)
    assert after == before
