"""What ``musku qsim run | curve`` show people (docs/qsim.md "Progress", "Tables and formats",
"Curve figure"): the engine's progress lines and the ETA made from them, CSV and JSON of every
table with their column names, the per-core detail opt-in, and the curve as PNG, SVG and a
self-contained HTML page (through the real CLI and engine)."""

from __future__ import annotations

import csv
import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from musku.qsim.engine import progress_fraction
from musku.qsim.progress import CurveProgress, Progress, eta_s
from tests.qsim.conftest import MM1

ROOT = Path(__file__).resolve().parents[2]
TWO_TIER = "experiments/qsim/2tier.toml"


def musku(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    e = dict(os.environ)
    e.pop("MUSKU_DEBUG", None)
    e.pop("MUSKU_QSIM_PROGRESS_AFTER_S", None)
    e.update(env or {})
    return subprocess.run(
        [sys.executable, "-m", "musku", *args],
        capture_output=True,
        text=True,
        timeout=600,
        env=e,
        cwd=ROOT,
    )


def one_error(p: subprocess.CompletedProcess[str], text: str, status: int = 3) -> None:
    lines = [ln for ln in p.stderr.splitlines() if ln.strip()]
    assert p.returncode == status, (p.returncode, p.stderr[-2000:])
    assert len(lines) == 1 and lines[0].startswith("musku: error: "), p.stderr[-2000:]
    assert text in lines[0], lines[0]


# ------------------------------------------------------------------ progress: the pieces


class Clock:
    """A clock the test moves by hand (the progress display reads it)."""

    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def test_engine_progress_line_parses() -> None:
    assert progress_fraction("progress 2.5 10 1000 0\n") == (0.25, "simulated 2.5 of 10 s")
    # a max_requests run: the larger of the two fractions
    assert progress_fraction("progress 1 1e6 500 1000")[0] == 0.5  # type: ignore[index]
    for other in ("musku_qsim: error: x", "progress 1 2", "progress a b c d", ""):
        assert progress_fraction(other) is None


@given(
    t=st.floats(0, 1e6),
    end=st.floats(1e-6, 1e6),
    done=st.integers(0, 10**9),
    most=st.integers(0, 10**9),
)
def test_progress_fraction_is_a_fraction(t: float, end: float, done: int, most: int) -> None:
    got = progress_fraction(f"progress {t!r} {end!r} {done} {most}")
    assert got is not None
    frac = got[0]
    assert 0.0 <= frac <= 1.0
    assert frac >= min(1.0, t / end) - 1e-12
    if most:
        assert frac >= min(1.0, done / most) - 1e-12


@given(elapsed=st.floats(0.001, 1e5), fraction=st.floats(1e-6, 1.0))
def test_eta_scales_the_elapsed_time(elapsed: float, fraction: float) -> None:
    left = eta_s(elapsed, fraction)
    assert left is not None and left >= 0
    # what is left goes at the speed of what is done: left / (1 - f) == elapsed / f
    assert left * fraction == pytest.approx(elapsed * (1 - fraction), rel=1e-9, abs=1e-9)


def test_eta_unknown_before_anything_is_done() -> None:
    assert eta_s(5.0, 0.0) is None


def test_plain_progress_waits_then_prints_every_few_seconds() -> None:
    clock, out = Clock(), io.StringIO()
    p = Progress("qsim run m.toml", stream=out, tty=False, after_s=2.0, every_s=5.0, clock=clock)
    clock.t += 1.0
    p.update(0.1, "simulated 1 of 10 s")
    assert out.getvalue() == ""  # a run under 2 s shows nothing
    clock.t += 1.5  # 2.5 s in, a quarter done: 7.5 s left
    p.update(0.25, "simulated 2.5 of 10 s")
    assert out.getvalue() == (
        "qsim run m.toml: 25 % (simulated 2.5 of 10 s), 2 s elapsed, ETA 8 s\n"
    )
    clock.t += 2.0
    p.update(0.4, "")
    assert p.lines == 1  # not again before every_s
    clock.t += 3.5
    p.update(0.2, "")  # a fraction never goes back
    assert p.lines == 2 and out.getvalue().splitlines()[-1].startswith("qsim run m.toml: 40 %")
    clock.t += 120
    p.update(0.5, "")
    assert "2 min 08 s elapsed, ETA 2 min 08 s" in out.getvalue().splitlines()[-1]


def test_quiet_progress_prints_nothing() -> None:
    clock, out = Clock(), io.StringIO()
    p = Progress("x", enabled=False, stream=out, tty=False, after_s=0, clock=clock)
    for k in range(1, 10):
        clock.t += 10
        p.update(k / 10)
    assert out.getvalue() == "" and p.lines == 0


def test_curve_progress_weighs_rates_by_their_requests() -> None:
    clock, out = Clock(), io.StringIO()
    sink = Progress("c", stream=out, tty=False, after_s=1e9, clock=clock)
    cp = CurveProgress(sink, [1000.0, 3000.0])
    cp.start(0)
    cp(1.0, "")
    assert sink.fraction == pytest.approx(0.25)  # the first rate is a quarter of the work
    cp.start(1)
    cp(0.5, "")
    assert sink.fraction == pytest.approx(0.25 + 0.75 * 0.5)
    assert sink.detail == "rate 2 of 2: 3000 req/s"


# ------------------------------------------------------------------ progress: engine and CLI


def test_engine_progress_lines_leave_the_result_unchanged(engine: str, tmp_path: Path) -> None:
    m = tmp_path / "mm1.toml"
    m.write_text(MM1.format(duration=3, qps=50000))
    doc = musku("qsim", "check", "--json", str(m))
    assert doc.returncode == 0, doc.stderr
    (tmp_path / "m.json").write_text(doc.stdout)
    plain = subprocess.run([engine, str(tmp_path / "m.json")], capture_output=True, timeout=300)
    prog = subprocess.run(
        [engine, str(tmp_path / "m.json"), "--progress=0.000001"], capture_output=True, timeout=300
    )
    assert plain.returncode == prog.returncode == 0
    assert plain.stderr == b""
    lines = prog.stderr.decode().splitlines()
    assert len(lines) >= 2  # 150,000 events: one look at the clock every 65,536
    fracs = [progress_fraction(ln) for ln in lines]
    assert all(f is not None for f in fracs)
    values = [f[0] for f in fracs if f is not None]
    assert values == sorted(values) and 0 < values[0] < 1
    a, b = json.loads(plain.stdout), json.loads(prog.stdout)
    for k in ("cpu_s", "peak_rss_kib"):
        a.pop(k), b.pop(k)
    assert a == b  # the same simulation, figure for figure
    bad = subprocess.run([engine, "-", "--progress=soon"], capture_output=True, timeout=30)
    assert bad.returncode == 2 and b"usage" in bad.stderr


def test_run_shows_progress_and_quiet_does_not(engine: str, tmp_path: Path) -> None:
    m = tmp_path / "mm1.toml"
    m.write_text(MM1.format(duration=3, qps=50000))
    now = {"MUSKU_QSIM_PROGRESS_AFTER_S": "0"}  # from the start: a run over 2 s, made short
    p = musku("qsim", "run", str(m), "--format", "json", env=now)
    assert p.returncode == 0, p.stderr
    lines = p.stderr.splitlines()
    assert lines and lines[0].startswith(f"qsim run {m}: ")
    assert " elapsed, ETA " in lines[0] and "simulated " in lines[0]
    assert json.loads(p.stdout)["completed"] > 100_000  # stdout holds the result alone
    q = musku("qsim", "run", str(m), "--format", "json", "-q", env=now)
    assert q.returncode == 0 and q.stderr == ""
    short = musku("qsim", "run", str(m), "--duration", "0.2")
    assert short.returncode == 0 and short.stderr == ""  # under 2 s: nothing
    bad = musku("qsim", "run", str(m), env={"MUSKU_QSIM_PROGRESS_AFTER_S": "-1"})
    one_error(bad, "MUSKU_QSIM_PROGRESS_AFTER_S")


def test_curve_progress_counts_rates(engine: str, tmp_path: Path) -> None:
    m = tmp_path / "mm1.toml"
    m.write_text(MM1.format(duration=1.5, qps=1000))
    p = musku("qsim", "curve", str(m), "--qps", "40000:80000:2", "--format", "csv",
              env={"MUSKU_QSIM_PROGRESS_AFTER_S": "0"})  # fmt: skip
    assert p.returncode == 0, p.stderr
    assert p.stderr.startswith(f"qsim curve {m}: ") and "(rate 1 of 2: 40000 req/s" in p.stderr


# ------------------------------------------------------------------ tables and formats


def test_run_tables_as_csv_and_json(engine: str, tmp_path: Path) -> None:
    base = ("qsim", "run", TWO_TIER, "--duration", "0.2", "--seed", "5")
    full = json.loads(musku(*base, "--format", "json").stdout)
    assert "cores" not in full and "threads" not in full  # per-core detail is opt-in
    assert {m["machine"] for m in full["machines"]} == {"front", "back"}
    detail = json.loads(musku(*base, "--json", "--per-core").stdout)
    assert len(detail["cores"]) == sum(m["cores"] for m in full["machines"]) and detail["threads"]
    for m in full["machines"]:
        mine = [c["util"] for c in detail["cores"] if c["machine"] == m["machine"]]
        assert m["max_util"] == max(mine) and m["mean_util"] == pytest.approx(sum(mine) / len(mine))

    as_csv = musku(*base, "--format", "csv", "--out", str(tmp_path / "s.csv"))
    assert (tmp_path / "s.csv").read_text() == as_csv.stdout
    services = list(csv.DictReader(io.StringIO(as_csv.stdout)))
    assert list(services[0]) == ["service", "visits", "mean_us", "p50_us", "p99_us", "thread_util"]
    # visits: nginx is visited twice a request (in front and on the way back), memcached once
    visits = {r["service"]: int(r["visits"]) for r in services}
    assert visits == {n: s["count"] for n, s in full["services"].items()}
    assert visits["nginx"] == pytest.approx(2 * visits["memcached"], rel=0.01)
    for table, header in (
        ("stages", ["service", "stage", "mean_queue", "max_queue"]),
        ("machines", ["machine", "cores", "mean_util", "max_util"]),
        ("cores", ["machine", "core", "util"]),
    ):
        rows = list(
            csv.reader(io.StringIO(musku(*base, "--format", "csv", "--table", table).stdout))
        )
        assert rows[0] == header and len(rows) > 1
        as_json = json.loads(musku(*base, "--format", "json", "--table", table).stdout)
        assert [list(r) for r in as_json][0] == header and len(as_json) == len(rows) - 1
    text = musku(*base).stdout
    assert " visits " in text and "requests ┃" not in text
    assert "--per-core for each" in text and "cores: front" not in text
    assert "cores: front" in musku(*base, "--per-core").stdout


@pytest.mark.parametrize(
    ("args", "text"),
    [
        (["--format", "xml"], "--format takes table, csv, json"),
        (["--table", "disks"], "--table takes services, stages, machines, cores, latency"),
    ],
)
def test_bad_format_or_table_is_one_line(args: list[str], text: str) -> None:
    one_error(musku("qsim", "run", TWO_TIER, *args), text)


def _curve(tmp_path: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    m = tmp_path / "mm1.toml"
    m.write_text(MM1.format(duration=0.4, qps=1000))
    # capacity 100,000 req/s: 30k, 60k, 90k stable, 120k saturates
    return musku("qsim", "curve", str(m), "--qps", "30000:150000:5", *extra)


def test_curve_table_csv_json_and_status_header(engine: str, tmp_path: Path) -> None:
    p = _curve(tmp_path, "--format", "csv", "-o", str(tmp_path / "c.csv"))
    assert p.returncode == 0, p.stderr
    assert (tmp_path / "c.csv").read_text() == p.stdout
    rows = list(csv.DictReader(io.StringIO(p.stdout)))
    assert list(rows[0]) == [
        "offered_qps", "completed_qps", "mean_us", "mean_lo_us", "mean_hi_us", "p50_us",
        "p50_lo_us", "p50_hi_us", "p90_us", "p90_lo_us", "p90_hi_us", "p99_us", "p99_lo_us",
        "p99_hi_us", "p999_us",
        "busiest_service", "busiest_util", "status",
    ]  # fmt: skip
    assert [r["status"] for r in rows] == ["stable", "stable", "stable", "saturated"]
    assert [float(r["offered_qps"]) for r in rows] == [30000, 60000, 90000, 120000]
    for r in rows[:3]:
        assert float(r["p50_lo_us"]) <= float(r["p50_us"]) <= float(r["p50_hi_us"])
        assert r["busiest_service"] == "server"
    assert [round(float(r["busiest_util"]), 1) for r in rows[:3]] == [0.3, 0.6, 0.9]
    res = json.loads(_curve(tmp_path, "--format", "json").stdout)
    assert res["points"][1]["services_util"]["server"] == pytest.approx(0.6, abs=0.05)
    table = _curve(tmp_path).stdout
    assert "status" in table and "SATURATED" in table and "stable" in table


def test_curve_figures(engine: str, tmp_path: Path) -> None:
    for name in ("c.png", "c.svg", "c.html"):
        p = _curve(tmp_path, "-q", "--format", "json", "-o", str(tmp_path / name))
        assert p.returncode == 0, p.stderr
    assert (tmp_path / "c.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    svg = (tmp_path / "c.svg").read_text()
    assert svg.lstrip().startswith("<?xml") and "<svg" in svg
    for text in ("p50", "p90", "p99", "saturated at 120000 req/s", "thread utilisation (%)"):
        assert text in svg, text  # text as text (svg.fonttype none)
    page = (tmp_path / "c.html").read_text()
    assert page.startswith("<!DOCTYPE html>") and "data:image/svg+xml;base64," in page
    assert "<script" not in page and "http://" not in page and "https://" not in page
    assert "<th>status</th>" in page and "saturated at 120000 req/s" in page
    # a bad -o costs nothing: refused before any simulation
    one_error(_curve(tmp_path, "-o", str(tmp_path)), "--out is a directory")


def test_an_engine_that_stops_reading_early_gives_its_own_error(engine: str) -> None:
    """The engine refuses a document at its first byte while 20 MB are still being written to
    it: the refusal comes back (status 3, its message), no broken pipe, no pipe left open."""
    from musku.qsim.engine import _run_engine

    code, out, err = _run_engine([engine, "-"], b"x" + b" " * 20_000_000, 120.0, None, lambda: None)
    assert code == 3 and out == b"" and "not JSON" in err


def test_run_on_a_terminal_draws_a_bar_with_an_eta(engine: str, tmp_path: Path) -> None:
    """Under a pseudo-terminal (stdout and stderr the terminal) the progress is rich's bar:
    the description, a percentage, the elapsed time and the ETA."""
    import pty
    import re
    import select

    m = tmp_path / "mm1.toml"
    m.write_text(MM1.format(duration=3, qps=50000))
    pid, fd = pty.fork()
    if pid == 0:  # the child: the CLI on the terminal
        os.environ["MUSKU_QSIM_PROGRESS_AFTER_S"] = "0"
        os.environ["COLUMNS"] = "140"
        os.chdir(ROOT)
        os.execv(sys.executable, [sys.executable, "-m", "musku", "qsim", "run", str(m), "--json"])
    out = b""
    while True:
        ready, _, _ = select.select([fd], [], [], 300)
        if not ready:
            break
        try:
            chunk = os.read(fd, 65536)
        except OSError:  # EIO: the child closed the terminal
            break
        if not chunk:
            break
        out += chunk
    os.close(fd)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    text = re.sub(r"\x1b\[[0-9;?]*[a-zA-Z]", "", out.decode(errors="replace"))
    bars = [ln for ln in text.replace("\r", "\n").splitlines() if f"qsim run {m}" in ln]
    assert bars and any(re.search(r"\d+%\s+\d:\d\d:\d\d ETA ", ln) for ln in bars), bars[:3]
    assert '"completed"' in text  # and the result after it
