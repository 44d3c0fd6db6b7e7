"""The CLI's rough edges of issue 22, each fixed and held by a test that failed before."""

from __future__ import annotations

import io
import math
import re
import shutil
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console
from typer.testing import CliRunner

from musku.cli import app
from musku.domain import ComparisonResult, Decision
from musku.storage import open_store
from musku.strict_json import dumps, loads_strict
from tests.cli.test_exit_codes import musku

runner = CliRunner()


def cli(*args: str, columns: int | None = None) -> Any:
    env = {"COLUMNS": str(columns)} if columns else {}
    result = runner.invoke(app, list(args), env=env)
    assert result.exit_code == 0, result.output
    return result


@pytest.fixture(scope="module")
def guardrail_db(
    toy_db: tuple[str, Path], tmp_path_factory: pytest.TempPathFactory
) -> tuple[str, int]:
    """A copy of the toy DB plus an abtest run whose decision has an unbounded interval
    (guardrail); the session's toy DB itself stays one finished sweep for the other modules."""
    src, exp = toy_db
    d = tmp_path_factory.mktemp("guardrail")
    shutil.copy(src.removeprefix("sqlite:///"), d / "results.db")
    url = f"sqlite:///{d}/results.db"
    result = runner.invoke(app, ["abtest", str(exp), "--set", "core_count=1", "--db", url, "-q"])
    assert result.exit_code == 0, result.output
    with open_store(url) as store:
        rec = store.find_experiment("toy")
        assert rec is not None
        comps = store.comparisons(rec.id)
        assert comps[-1].result is not None
        # what the driver records when a guardrail breaks before the rule has an interval
        r = _result(decision=Decision.GUARDRAIL, ci_low=-math.inf, ci_high=math.inf, estimate=-0.4)
        cmp_id = store.start_comparison(rec.id, "abtest", r.baseline, r.candidate)
        store.finish_comparison(cmp_id, r)
    return url, rec.id


# 1 ---------------------------------------------------------------- strict JSON


def test_strict_json_encodes_non_finite_as_null() -> None:
    text = dumps({"lo": -math.inf, "hi": math.inf, "est": math.nan, "xs": (1.5, math.nan)})
    assert loads_strict(text) == {"lo": None, "hi": None, "est": None, "xs": [1.5, None]}
    with pytest.raises(ValueError, match="not strict JSON"):
        loads_strict('{"x": -Infinity}')


def test_every_read_command_json_is_strict(guardrail_db: tuple[str, int]) -> None:
    url, _ = guardrail_db
    got = loads_strict(cli("results", "toy", "--db", url, "--json").stdout)
    decisions = [c["result"]["decision"] for c in got["comparisons"] if c["result"]]
    assert "guardrail" in decisions
    unbounded = [c["result"] for c in got["comparisons"] if c["result"]["ci_high"] is None]
    assert unbounded and unbounded[0]["ci_low"] is None  # -inf and +inf: null
    for args in (
        ("results",),
        ("sku", "show"),
        ("sku", "show", "1"),
    ):
        loads_strict(cli(*args, "--db", url, "--json").stdout)
    loads_strict(cli("platforms", "--json").stdout)


def test_abtest_json_with_a_guardrail_is_strict(toy_db: tuple[str, Path], tmp_path: Path) -> None:
    _, exp = toy_db
    out = cli(
        "abtest", str(exp), "--set", "core_count=1", "--db", f"sqlite:///{tmp_path}/a.db", "--json"
    )
    data = loads_strict(out.stdout)
    assert data["decision"] == "guardrail"


def test_abtest_json_of_an_unbounded_interval(capsys: pytest.CaptureFixture[str]) -> None:
    from musku.cli import _print_json
    from musku.sweep.jsonforms import result_dict

    _print_json(result_dict(_result(decision=Decision.GUARDRAIL, ci_low=-math.inf)))
    data = loads_strict(capsys.readouterr().out)
    assert data["ci_low"] is None and data["ci_high"] == 0.095


# 2 ---------------------------------------------------------------- started column


def test_results_lists_when_each_experiment_started(toy_db: tuple[str, Path]) -> None:
    url, _ = toy_db
    out = cli("results", "--db", url, columns=200).stdout
    row = next(line for line in out.splitlines() if " toy " in line)
    assert re.search(r"\d{4}-\d{2}-\d{2} \d{2}:\d{2}", row), out


# 3 ---------------------------------------------------------------- widths


@pytest.mark.parametrize("columns", [60, 80, 120])
def test_piped_tables_honour_columns(toy_db: tuple[str, Path], columns: int) -> None:
    url, _ = toy_db
    for args in (("results",), ("results", "toy"), ("sku", "show")):
        out = cli(*args, "--db", url, columns=columns).stdout
        widest = max(len(line) for line in out.splitlines())
        assert widest <= columns, f"{args}: {widest} > {columns}\n{out}"


def test_sku_list_never_truncates_configurations(toy_db: tuple[str, Path]) -> None:
    url, _ = toy_db
    with open_store(url) as store:
        sku = store.softskus()[0].sku
    for columns in (80, 60, 200):
        out = cli("sku", "show", "--db", url, columns=columns).stdout
        assert "…" not in out, out
        for token in str(sku.configuration).split():
            assert token in out, (columns, out)
        _intervals_whole(out)


def _intervals_whole(text: str) -> None:
    for line in text.splitlines():
        assert line.count("[") == line.count("]"), f"interval split across lines:\n{text}"


REASON = (
    "decided before crossover: interval [-6.56 %, -0.46 %] excludes 0 even allowing ±1.00 % "
    "host bias, after 270 samples; no crossover: estimate includes the host bias, assumed "
    "within ±1.00 %"
)


@pytest.mark.parametrize("width", [30, 50, 80])
def test_wrapping_never_splits_an_interval(width: int) -> None:
    from musku.display import wrap_atomic

    lines = wrap_atomic(REASON, width)
    assert " ".join(" ".join(lines).split()) == " ".join(REASON.split())
    _intervals_whole("\n".join(lines))
    assert all(len(line) <= width for line in lines if "[" not in line or len(line) <= width)
    assert any("±1.00 %" in line for line in lines)  # a number keeps its unit


def _result(**kw: Any) -> ComparisonResult:
    from musku.domain import Configuration

    base = Configuration.of({"thp": "madvise", "cdp": "off"})
    fields: dict[str, Any] = {
        "baseline": base,
        "candidate": base.with_("cdp", "6:5"),
        "decision": Decision.BETTER,
        "estimate": 0.0467,
        "ci_low": 0.0006,
        "ci_high": 0.095,
        "samples": 140,
        "host_time_s": 1234.0,
        "reason": REASON,
    }
    fields.update(kw)
    return ComparisonResult(**fields)


def test_result_and_final_progress_lines_wrap_between_words() -> None:
    from musku.display import LiveProgress, print_result

    buf = io.StringIO()
    con = Console(file=buf, width=60, highlight=False)
    print_result(con, _result())
    with LiveProgress(enabled=True, console=con) as progress:
        progress.comparison_finished("knob:cdp", _result(), cached=False)
    out = buf.getvalue()
    assert max(len(line) for line in out.splitlines()) <= 60, out
    _intervals_whole(out)
    assert "[+0.06, +9.50] %" in out


# 4 ---------------------------------------------------------------- sku diff


def test_sku_diff_columns_all_have_headers(toy_db: tuple[str, Path]) -> None:
    url, _ = toy_db
    out = cli("sku", "diff", "1", "1", "--db", url, columns=120).stdout
    header = next(line for line in out.splitlines() if "knob" in line)
    cells = [c.strip() for c in re.split(r"[┃│]", header)[1:-1]]
    assert len(cells) == 4 and all(cells), header
    assert "same" in out


# 5 ---------------------------------------------------------------- <bool>


@pytest.mark.parametrize("command", [["results"], ["sweep"], ["sku", "show"], ["knobs", "probe"]])
def test_flags_show_no_placeholder(command: list[str]) -> None:
    out = cli(*command, "--help", columns=120).stdout
    assert "--json" in out
    assert "<bool>" not in out


# 6 ---------------------------------------------------------------- abtest mode


def test_abtest_runs_are_listed_as_abtest(guardrail_db: tuple[str, int]) -> None:
    url, exp_id = guardrail_db
    exps = {e["id"]: e for e in loads_strict(cli("results", "--db", url, "--json").stdout)}
    assert exps[exp_id]["mode"] == "abtest"
    assert [e["mode"] for e in exps.values() if e["id"] != exp_id] == ["independent"]


# 8 ---------------------------------------------------------------- switchback wording


def test_switchback_reasons_speak_of_arms_not_hosts() -> None:
    from musku.abtest import run_comparison
    from tests.abtest.fakes import A, B, FakePair, freq_level
    from tests.abtest.test_driver import SPEC, calibrated

    class OneHost(FakePair):  # type: ignore[misc]
        def describe(self) -> dict[str, Any]:
            return {"hosts": ["local/A", "local/B"], "design": "switchback"}

    # the early path needs a calibration (issue 19) and decides a large effect before the swap
    one = OneHost(freq_level(0.1), seed=20)
    early = run_comparison(one, A, B, SPEC, seed=20, memory=calibrated(one, 0.01))
    crossed = run_comparison(
        OneHost(seed=2, bias=0.02), A, A, SPEC, seed=2, rule_options={"max_host_bias": 0.03}
    )
    assert "arms swapped roles" in early.reason and "arm bias" in early.reason
    assert "arm 1 vs arm 0 bias" in crossed.reason
    for r in (early, crossed):
        assert "host" not in r.reason and "crossover" not in r.reason, r.reason
    # two hosts keep the two-host words
    two = run_comparison(FakePair(seed=2, bias=0.02), A, A, SPEC, seed=2)
    assert "host bias" in two.reason


# 9 ---------------------------------------------------------------- knobs probe SHP


def test_probe_json_gives_shp_its_range(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from musku.hostfs import HostFS
    from musku.knobs.cli import app as knobs_app
    from musku.testing.fakehost import MSR_STRIDE, intel_host

    intel_host(tmp_path)
    monkeypatch.setattr(HostFS, "_msr_offset", lambda self, reg: reg * MSR_STRIDE)
    result = runner.invoke(knobs_app, ["probe", "--json", "--root", str(tmp_path)])
    assert result.exit_code == 0, result.output
    shp = loads_strict(result.stdout)["knobs"]["shp"]
    assert shp["supported"]
    assert shp["settings"] != []
    low, high = shp["settings_range"]
    assert low == 0 and high == shp["details"]["max_pages"] > 0
    table = runner.invoke(knobs_app, ["probe", "--root", str(tmp_path)], env={"COLUMNS": "200"})
    assert f"0..{high}" in table.stdout


def test_check_prints_settings_as_the_sweep_does() -> None:
    """Issue 32: `check` printed `production=2.2` where the sweep says `2.2GHz`."""
    proc = musku("check", "experiments/web-skylake.toml")
    assert proc.returncode == 0, proc.stderr
    assert "production=2.2GHz" in proc.stdout and "production=1.8GHz" in proc.stdout
    assert "production=200" in proc.stdout and "production=off" in proc.stdout
