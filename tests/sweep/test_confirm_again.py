"""A confirmation that measured nothing (``inconclusive`` with no sample: its warm-up did not
end within the tester's cap) is no evidence either way: the runner measures it once more
(``Runner._again``) instead of dropping the leader on it (docs/design.md, the futility stop)."""

from __future__ import annotations

from pathlib import Path

from musku.domain import ComparisonResult, Decision
from musku.sweep.runner import Runner
from musku.sweep.sweep import open_pair
from tests.sweep.test_walks import _experiment


def _result(exp: object, decision: Decision, samples: int) -> ComparisonResult:
    base = exp.baseline_config  # type: ignore[attr-defined]
    return ComparisonResult(
        baseline=base,
        candidate=base.with_("shp", 128),
        decision=decision,
        estimate=0.0,
        ci_low=-1.0,
        ci_high=1.0,
        samples=samples,
        host_time_s=3600.0,
        reason="the warm-up did not end within the cap; nothing measured",
    )


def test_an_empty_confirmation_is_measured_again_and_others_are_kept(tmp_path: Path) -> None:
    exp = _experiment(tmp_path, 2)
    pair = open_pair(exp, seed=5)
    try:
        runner = Runner(exp, pair, seed=5)
        empty = _result(exp, Decision.INCONCLUSIVE, 0)
        again = runner._again("knob:shp", empty)
        # measured anew: a real comparison of the same two configurations, with samples
        assert again is not empty and again.samples > 0
        assert (again.baseline, again.candidate) == (empty.baseline, empty.candidate)
        assert again.decision is Decision.BETTER  # the toy's shp=128 is +2 %
        # evidence either way is kept as it is: an inconclusive that measured, any decision
        for kept in (_result(exp, Decision.INCONCLUSIVE, 400), _result(exp, Decision.WORSE, 0)):
            assert runner._again("knob:shp", kept) is kept
    finally:
        pair.close()
