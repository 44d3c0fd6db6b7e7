"""bench/qsim_validate.py's rounds: the intervals over rounds, the goals' verdicts, the summary
of synthetic rounds whose errors are known, and (slow, the built services) a tiny real run with
--rounds 2 through the whole plumbing (profile, closed loop, open-loop points, model)."""

from __future__ import annotations

import importlib.util
import json
import math
import os
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
BUILD = Path(os.environ.get("MUSKU_SERVICES_BUILD", ROOT / "services/build"))


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    spec = importlib.util.spec_from_file_location("qsim_validate", ROOT / "bench/qsim_validate.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules["qsim_validate"] = mod
    spec.loader.exec_module(mod)
    return mod


def test_interval_is_median_and_t_interval(bench: ModuleType) -> None:
    med, lo, hi = bench.interval([1.0, 2.0, 6.0])
    # mean 3, sd sqrt(7), t(0.975, 2) = 4.3027
    half = 4.302653 * math.sqrt(7) / math.sqrt(3)
    assert med == 2.0 and lo == pytest.approx(3 - half, rel=1e-5)
    assert hi == pytest.approx(3 + half, rel=1e-5)
    assert bench.interval([5.0]) == (5.0, 5.0, 5.0)
    assert bench.interval([float("nan"), 4.0, 6.0])[0] == 5.0  # a saturated point left out
    assert all(math.isnan(x) for x in bench.interval([float("nan")]))


def test_verdicts(bench: ModuleType) -> None:
    assert bench.verdict((3.0, -5.0, 9.0), 10.0) == "met"
    assert bench.verdict((30.0, 12.0, 40.0), 10.0) == "NOT met"
    assert bench.verdict((-30.0, -40.0, -11.0), 10.0) == "NOT met"
    assert bench.verdict((8.0, -2.0, 14.0), 10.0) == "undecided"


def _round(k: float, sat_model: bool = False) -> dict[str, Any]:
    # real p50 1 ms and p99 4 ms at every load; the model k x those; saturation 1000 vs 900
    pts = []
    for f in (0.1, 0.4, 0.7, 1.0):
        nan = sat_model and f >= 0.7
        pts.append({"fraction": f, "qps": 1000 * f, "real_p50_us": 1000.0, "real_p99_us": 4000.0,
                    "model_p50_us": float("nan") if nan else 1000.0 * k,
                    "model_p99_us": float("nan") if nan else 4000.0 * k,
                    "whole_p50_us": 1000.0, "whole_p99_us": 4000.0, "model_saturated": nan,
                    "errors": 0})  # fmt: skip
    return {"share_got": 0.5, "real_saturation": 1000.0, "model_saturation": 900.0 * k,
            "whole_saturation": 1050.0, "real_cpu_us": 400.0, "model_cpu_us": 440.0,
            "fit_cpu_us": 420.0, "switches_mid": 1.5, "switches_leaf": 0.3,
            "switches_low_mid": 9.0, "switches_low_leaf": 2.0, "model_wakeups_per_visit": 0.4,
            "points": pts}  # fmt: skip


def test_summary_of_known_rounds(bench: ModuleType, capsys: pytest.CaptureFixture[str]) -> None:
    s = bench.summarise("svc", [_round(1.1), _round(1.2, sat_model=True), _round(1.3)])
    assert s["rounds"] == 3 and s["share_got"][0] == pytest.approx(50.0)
    assert s["cpu_err"] == pytest.approx((10.0, 10.0, 10.0))
    assert s["whole_saturation_err"][0] == pytest.approx(5.0)
    # per-round saturation errors -1, +8, +17 %: median +8
    assert s["saturation_err"][0] == pytest.approx(8.0)
    assert s["wakeup_ratio"]["mid"][0] == pytest.approx(1.5 / 9.0)
    p10, _, p70, _ = s["points"]
    assert p10["err_p50"][0] == pytest.approx(20.0) and p10["err_p99"][0] == pytest.approx(20.0)
    assert p10["err_p50"][1] < 20.0 < p10["err_p50"][2]
    # the round whose model saturated at 70 % is left out of that point's errors
    assert p70["model_saturated_rounds"] == 1
    assert p70["err_p50"][0] == pytest.approx(20.0)  # rounds +10 and +30
    bench.print_summary(s)
    out = capsys.readouterr().out
    assert "svc: 3 rounds" in out and "model saturated in 1/3" in out
    # below 80 %: p50 errors +10..+30 % against a 15 % goal
    share = next(line for line in out.splitlines() if "model on the capacity got:" in line)
    assert "p50 worst +20.0" in share and "goal 15: undecided" in share
    whole = next(line for line in out.splitlines() if "model on a whole core:" in line)
    assert "p50 worst +0.0 [+0.0, +0.0] % (goal 15: met)" in whole


def test_bad_rounds_is_a_usage_error(bench: ModuleType, capsys: pytest.CaptureFixture[str]) -> None:
    assert bench.main(["--rounds", "0"]) == 2
    assert "--rounds must be positive" in capsys.readouterr().err


@pytest.mark.services
@pytest.mark.slow
def test_tiny_real_run_with_rounds(
    bench: ModuleType, engine: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    if not (BUILD / "setalgebra" / "setalgebra_midtier").is_file():
        pytest.skip(f"services not built under {BUILD}")
    out = tmp_path / "v.json"
    rc = bench.main(["--services", "setalgebra", "--rounds", "2", "--quick", "--duration", "1",
                     "--profile-s", "1", "--nice", "10", "--users", "8", "--json", str(out)])  # fmt: skip
    assert rc == 0
    (s,) = json.loads(out.read_text())
    assert s["rounds"] == 2 and len(s["per_round"]) == 2
    for r in s["per_round"]:
        assert 0 < r["share_got"] <= 1 and r["real_saturation"] > 0 and r["real_cpu_us"] > 0
        assert [p["fraction"] for p in r["points"]] == [0.1, 0.4, 0.7, 1.0]
        assert len(r["profile_points"]) == 3 and r["profile_points"][2]["deep"]
        assert all(p["real_p50_us"] > 0 for p in r["points"])
    assert "setalgebra: 2 rounds" in capsys.readouterr().out
