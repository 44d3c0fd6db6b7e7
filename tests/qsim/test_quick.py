"""``musku qsim run`` in its scripted form skips the CLI's start-up (musku/entry.py,
musku/qsim/quick.py) and takes the model's engine document from the cache
(musku/qsim/modelcache.py): what it prints, and when, must be exactly what the full command
prints, and a cached document must never outlive what it was built from."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from musku.qsim import modelcache
from musku.qsim.quick import parse
from tests.qsim.conftest import MM1

ROOT = Path(__file__).resolve().parents[2]
VOLATILE = ("cpu_s", "wall_s", "peak_rss_kib")


def _env(cache: Path, **more: str) -> dict[str, str]:
    keep = ("MUSKU_SERVICES_BUILD",)  # where the engine is built (a worktree may use another's)
    e = {k: v for k, v in os.environ.items() if not k.startswith("MUSKU_") or k in keep}
    e["MUSKU_CACHE_DIR"] = str(cache)
    e.update(more)
    return e


def quick(cache: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    """The ``musku`` command as installed (``python -m musku``: musku.entry)."""
    return subprocess.run([sys.executable, "-m", "musku", *args], capture_output=True, text=True,
                          timeout=600, env=_env(cache, **env), cwd=ROOT)  # fmt: skip


def full(cache: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """The typer app itself (musku.cli.main), which never takes the quick path."""
    code = "import sys; from musku.cli import main; main(sys.argv[1:])"
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True,
                          timeout=600, env=_env(cache), cwd=ROOT)  # fmt: skip


def _same_json(a: str, b: str) -> None:
    da, db = json.loads(a), json.loads(b)
    for k in VOLATILE:  # the engine's own CPU, wall time and memory differ run to run
        da.pop(k, None)
        db.pop(k, None)
    assert da == db


def _model(tmp_path: Path, duration: float = 0.2) -> Path:
    m = tmp_path / "mm1.toml"
    m.write_text(MM1.format(duration=duration, qps=50_000))
    return m


def test_json_csv_and_tables_match_the_full_command(engine: str, tmp_path: Path) -> None:
    m = str(_model(tmp_path))
    cache = tmp_path / "cache"
    for extra in ([], ["--seed", "5"], ["--qps=40000", "--duration", "0.1"]):
        a = quick(cache, "qsim", "run", m, "--json", "-q", *extra)
        b = full(cache, "qsim", "run", m, "--json", "-q", *extra)
        assert a.returncode == b.returncode == 0, (a.stderr, b.stderr)
        _same_json(a.stdout, b.stdout)
    assert len(list((cache / "qsim").glob("*.json"))) == 1  # one model text, one entry
    for table in ("services", "stages", "machines", "latency"):
        a = quick(cache, "qsim", "run", m, "--format", "csv", "--table", table, "-q")
        b = full(cache, "qsim", "run", m, "--format", "csv", "--table", table, "-q")
        assert a.returncode == b.returncode == 0
        assert a.stdout.splitlines()[0] == b.stdout.splitlines()[0]  # same columns
        assert len(a.stdout.splitlines()) == len(b.stdout.splitlines())


def test_a_saturated_run_says_so_on_stderr_like_the_full_command(
    engine: str, tmp_path: Path
) -> None:
    m = str(_model(tmp_path))
    cache = tmp_path / "cache"
    args = ("qsim", "run", m, "--qps", "150000", "--duration", "0.3", "--json", "-q")
    a, b = quick(cache, *args), full(cache, *args)
    assert a.returncode == b.returncode == 0
    assert json.loads(a.stdout)["saturated"] is True
    assert a.stderr == b.stderr and a.stderr.startswith("qsim run: saturated: ")


def test_bad_input_gets_the_full_commands_one_line(engine: str, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    m = str(_model(tmp_path))
    cases = [
        ("qsim", "run", str(tmp_path / "missing.toml"), "--json"),
        ("qsim", "run", m, "--json", "--qps", "-5"),
        ("qsim", "run", m, "--json", "--table", "nope"),
        ("qsim", "run", m, "--json", "--duration", "1e9"),
    ]
    bad = tmp_path / "bad.toml"
    bad.write_text(MM1.format(duration=0.2, qps=1).replace('dist = "exp"', 'dist = "nope"'))
    cases.append(("qsim", "run", str(bad), "--json"))
    for args in cases:
        a, b = quick(cache, *args), full(cache, *args)
        assert a.returncode == b.returncode == 3, (args, a.stderr, b.stderr)
        assert a.stderr == b.stderr and a.stderr.startswith("musku: error: "), args
        assert len(a.stderr.splitlines()) == 1
    entries = list((cache / "qsim").glob("*.json"))  # the good model's only: bad input is not kept
    assert [json.loads(e.read_text())["model"] for e in entries] == [os.path.realpath(m)]


def test_the_cache_follows_the_model_its_histograms_and_the_switch(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    os.environ["MUSKU_CACHE_DIR"] = str(cache)
    try:
        hist = tmp_path / "h.csv"
        hist.write_text("10,1\n20,1\n")
        m = tmp_path / "emp.toml"
        m.write_text(
            MM1.format(duration=0.2, qps=1000).replace(
                '{ dist = "exp", mean_us = 10 }', '{ dist = "empirical", file = "h.csv" }'
            )
        )
        first = modelcache.engine_document(m)
        entries = list((cache / "qsim").glob("*.json"))
        assert len(entries) == 1
        assert modelcache.engine_document(m) == first  # a hit
        hist.write_text("10,1\n40,1\n")  # the histogram changes: the entry is stale
        second = modelcache.engine_document(m)
        assert second != first
        entries[0].write_text("{not json")  # a corrupt entry is a miss, not an error
        assert modelcache.engine_document(m) == second
        os.environ["MUSKU_QSIM_CACHE"] = "0"
        assert modelcache.cache_dir() is None
        assert modelcache.engine_document(m) == second
    finally:
        os.environ.pop("MUSKU_CACHE_DIR", None)
        os.environ.pop("MUSKU_QSIM_CACHE", None)


def test_an_unwritable_cache_folder_only_costs_the_load(tmp_path: Path) -> None:
    if os.geteuid() == 0:
        blocked = tmp_path / "file-not-folder"
        blocked.write_text("x")  # root writes anywhere: a file where the folder should be
        cache = blocked
    else:
        cache = tmp_path / "ro"
        cache.mkdir(mode=0o500)
    os.environ["MUSKU_CACHE_DIR"] = str(cache)
    try:
        m = _model(tmp_path)
        from musku.qsim.model import load

        assert modelcache.engine_document(m) == load(m).engine
    finally:
        os.environ.pop("MUSKU_CACHE_DIR", None)


def test_only_the_scripted_form_takes_the_quick_path() -> None:
    assert parse(["m.toml", "--json"]) is not None
    assert parse(["m.toml", "--format=csv", "--table", "stages", "-q"]) is not None
    for args in (
        ["m.toml"],  # tables for people: rich, the full command
        ["m.toml", "--json", "--per-core"],
        ["m.toml", "--json", "--out", "x.json"],
        ["m.toml", "--json", "--qps", "lots"],  # the full command's usage error
        ["m.toml", "--json", "--seed", "1", "--seed", "2"],
        ["m.toml", "--json", "--help"],
        ["a.toml", "b.toml", "--json"],
        ["--json"],
        ["m.toml", "--json", "--qps"],
    ):
        assert parse(args) is None, args


@settings(max_examples=200, deadline=None)
@given(st.lists(st.sampled_from(["m.toml", "--json", "-q", "--qps", "1e3", "--seed", "7", "x",
                                 "--format", "csv", "json", "table", "--table", "--", ""]),
                max_size=8))  # fmt: skip
def test_parse_never_raises_and_keeps_one_model(args: list[str]) -> None:
    got = parse(args)
    if got is not None:
        assert got["fmt"] in ("json", "csv")
        assert isinstance(got["model"], str) and not got["model"].startswith("-")


COSTLY = {"typing", "dataclasses", "subprocess", "hashlib"}


@pytest.mark.parametrize("cached", [False, True])
def test_cli_start_up_is_small(engine: str, tmp_path: Path, cached: bool) -> None:
    """The point of it all, as a bound that a busy machine cannot break: the quick path loads
    neither typer nor pydantic on a cache hit (and pydantic only on a miss), and on a hit none
    of the standard library's costlier modules either (typing, dataclasses, subprocess,
    hashlib: ~0.06 CPU-s together, the difference between 0.16 and 0.1 CPU-s a run)."""
    m = str(_model(tmp_path))
    cache = tmp_path / "cache"
    if cached:
        quick(cache, "qsim", "run", m, "--json", "-q")
    code = (
        "import sys, runpy; sys.argv = ['musku', 'qsim', 'run', sys.argv[1], '--json', '-q']\n"
        "try:\n    runpy.run_module('musku', run_name='__main__')\n"
        "except SystemExit:\n    pass\n"
        "print('LOADED', 'typer' in sys.modules, 'pydantic' in sys.modules, file=sys.stderr)\n"
        "print('STDLIB', *sorted(m for m in COSTLY if m in sys.modules), file=sys.stderr)"
    ).replace("import sys, runpy;", f"import sys, runpy; COSTLY = {sorted(COSTLY)!r};")
    p = subprocess.run([sys.executable, "-c", code, m], capture_output=True, text=True,
                       timeout=600, env=_env(cache), cwd=ROOT)  # fmt: skip
    line = [ln for ln in p.stderr.splitlines() if ln.startswith("LOADED")][0]
    assert line == f"LOADED False {not cached}", p.stderr[-2000:]
    if cached:
        costly = [ln for ln in p.stderr.splitlines() if ln.startswith("STDLIB")][0]
        assert costly == "STDLIB", p.stderr[-2000:]
