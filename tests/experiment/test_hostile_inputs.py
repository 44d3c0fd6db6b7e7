"""Hostile input files (issue 18): what ``musku sweep`` refuses, ``musku check`` refuses too,
with one line and exit 3; nothing ends as an internal error (exit 1), runs unbounded, or
reads without a limit."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from musku.agent.config import load_config
from musku.errors import InputError
from musku.experiment import load_experiment, load_platform
from musku.inputfiles import MAX_FILE_BYTES, read_text
from musku.schema.document import line_of
from musku.sim.model import SimModel
from tests.cli.test_exit_codes import musku, one_error_line
from tests.fixtures.toy import EXPERIMENT, MODEL

ROOT = Path(__file__).resolve().parents[2]
SKY = (ROOT / "knobs" / "skylake18.toml").read_text()
VM = (ROOT / "knobs" / "firecracker-vm.toml").read_text()
BASE = EXPERIMENT.format(name="hostile", mode="independent")


def slowdown() -> float:
    """Time budgets scale on a loaded machine (MUSKU_TEST_SLOWDOWN, default 1)."""
    return float(os.environ.get("MUSKU_TEST_SLOWDOWN", "1"))


@pytest.fixture
def work(tmp_path: Path) -> Path:
    (tmp_path / "toy-model.toml").write_text(MODEL)
    return tmp_path


def _exp(work: Path, text: str, name: str = "exp.toml") -> Path:
    p = work / name
    p.write_text(text)
    return p


EXPERIMENTS = [
    ("warmup_s = 30", "warmup_s = inf", r"\[statistics\] warmup_s must be at most 86400"),
    ("sample_interval_s = 1", "sample_interval_s = inf", "sample_interval_s must be in"),
    ("sample_interval_s = 1", "sample_interval_s = nan", "sample_interval_s must be > 0"),
    ("max = 0.05", "max = nan", "limit must be a finite number"),
    ("max = 0.05", "max = inf", "limit must be a finite number"),
    ("seed = 7", "seed = -1", r"\[statistics\] seed must be >= 0"),
    ("seed = 7", "seed = 9223372036854775808", "integer out of range"),
    (
        'name = "hostile"',
        'name = "hostile"\nowner = "me"',
        r"\[experiment\] has unknown key 'owner'",
    ),
    ('name = "hostile"', f'name = "{"n" * 201}"', "name is 201 characters long"),
    ('name = "hostile"', 'name = "  "', "name must not be empty"),
    ('model = "toy-model.toml"', 'model = "toy-model.toml"\nspeed = 2', "unknown option 'speed'"),
    ('model = "toy-model.toml"', 'model = "toy-model.toml"\nnoise_scale = nan', "noise_scale"),
    ('thp = "madvise"', 'thp = "madvise"\ncore_count = 2.0e0', None),  # fine: 2.0 is 2
    ("seed = 7", "seed = " + "9" * 4500, "malformed TOML: Exceeds the limit"),
]


@pytest.mark.parametrize(("old", "new", "needle"), EXPERIMENTS)
def test_experiment_check_refuses_what_sweep_refuses(
    work: Path, old: str, new: str, needle: str | None
) -> None:
    assert old in BASE
    path = _exp(work, BASE.replace(old, new, 1))
    if needle is None:
        load_experiment(path)
        return
    with pytest.raises(InputError, match=needle):
        load_experiment(path)


def test_threading_loads_must_be_finite(work: Path) -> None:
    with pytest.raises(InputError, match=r"\[threading\] loads must be a list of numbers"):
        load_experiment(_exp(work, BASE + "\n[threading]\nloads = [inf]\n"))


def test_unknown_agent_host_options_are_refused_without_connecting(work: Path) -> None:
    agent = BASE.replace('backend = "sim"\nmodel = "toy-model.toml"', 'backend = "agent"')
    with pytest.raises(InputError, match="needs hosts"):
        load_experiment(_exp(work, agent))
    two = agent + 'hosts = ["a", "b"]\n'
    assert load_experiment(_exp(work, two)).hosts.options["hosts"] == ["a", "b"]
    with pytest.raises(InputError, match="unknown option 'model' for the agent backend"):
        load_experiment(_exp(work, two + 'model = "x"\n'))
    with pytest.raises(InputError, match=r"ssh_port"):
        load_experiment(_exp(work, two + 'ssh_port = "22"\n'))
    with pytest.raises(InputError, match="longer than 255"):
        load_experiment(_exp(work, two.replace('"a"', '"' + "a" * 256 + '"')))


CATALOGS = [
    (SKY, "settings = [1.6, 1.7", "settings = [nan, 1.7", "core_freq nan is not a frequency"),
    (SKY, "settings = [1.6, 1.7", "settings = [-1.6, 1.7", "core_freq -1.6 is not a frequency"),
    (VM, "settings = [1, 2]", "settings = [0, 1, 2]", r"core_count 0 is not in 1..2"),
    (VM, "settings = [1, 2]", "settings = [1, 2, 3]", r"core_count 3 is not in 1..2"),
    (VM, "settings = [1, 2]", 'settings = [1, 2]\nreboot = "yes"', "reboot must be true or false"),
    (SKY, 'settings = "splits"', 'settings = "splits"\nways = nan', "ways must be an integer"),
    (SKY, 'settings = "splits"', 'settings = "splits"\nways = 1e12', "ways must be an integer"),
    (SKY, 'settings = "splits"', 'settings = "splits"\nways = 1000000000', "ways must be"),
    (SKY, "llc_ways = 11", "llc_ways = 1000000000", r"llc_ways must be in 0..64"),
    (SKY, 'settings = "splits"', 'settings = ["off", "12:0"]', "each need 1 or more ways"),
    (SKY, 'settings = "splits"', 'settings = ["off", "7:5"]', "does not split the LLC's 11 ways"),
    (SKY, 'settings = "splits"', 'settings = ["off", "\u0666:\u0665"]', "cdp takes 'off'"),
    (SKY, "cores = 18", "cores = 0", r"cores must be in 1..4096"),
    (SKY, 'name = "skylake18"', f'name = "{"p" * 101}"', "name is 101 characters long"),
]


@pytest.mark.parametrize(("base", "old", "new", "needle"), CATALOGS)
def test_bad_catalogs_are_refused(
    tmp_path: Path, base: str, old: str, new: str, needle: str
) -> None:
    assert old in base
    p = tmp_path / "cat.toml"
    p.write_text(base.replace(old, new, 1))
    started = time.perf_counter()
    with pytest.raises(InputError, match=needle) as exc:
        load_platform(p)
    assert time.perf_counter() - started < 2.0 * slowdown()
    assert exc.value.where is not None and exc.value.where.startswith(str(p))


def test_non_ascii_digits_in_a_cdp_value_are_refused(work: Path) -> None:
    text = BASE.replace('catalog = "firecracker-vm"', 'catalog = "skylake18"')
    text = text.replace('knobs = ["core_count", "thp", "shp"]', 'knobs = ["cdp"]')
    text = text.replace('thp = "madvise"\nshp = 0', 'cdp = "\u0666:\u0665"')
    with pytest.raises(InputError, match=r"\[production\] cdp takes 'off'"):
        load_experiment(_exp(work, text))
    load_experiment(_exp(work, text.replace("\u0666:\u0665", "6:5")))


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("x = " + "[" * 500 + "]" * 500, "nested deeper than 32 levels"),
        ("x = " + "{a = " * 500 + "1" + "}" * 500, "nested deeper than 32 levels"),
        (".".join(["a"] * 50_000) + " = 1", "a key nested deeper than 32 levels"),
        ("x = 1\n[" + ".".join(["t"] * 40) + "]\n", "a key nested deeper than 32 levels"),
        ('"' + "k" * 300 + '" = 1', "a key longer than 200 characters"),
        ("x = [" + "1, " * 10_001 + "]", "a list of 10,001 items"),
    ],
)
def test_document_limits_are_clean_errors(work: Path, text: str, needle: str) -> None:
    started = time.perf_counter()
    with pytest.raises(InputError, match=needle):
        load_experiment(_exp(work, text + "\n" + BASE))
    assert time.perf_counter() - started < 2.0 * slowdown()


def test_line_lookup_is_linear_on_a_pathological_line(work: Path) -> None:
    """A line of '[' and spaces made the old regex cubic: a 4 KB file took about a minute."""
    line = "[" + " " * 4000 + "x"
    started = time.perf_counter()
    assert line_of(f'd = """\n{line}\n"""\n', "absent", "nowhere") is None
    text = BASE.replace("description", "d") + f'\n[service.x]\nnote = """\n{line}\n"""\n'
    with pytest.raises(InputError, match="unknown key 'x'"):
        load_experiment(_exp(work, text.replace("uses_shp = true", "uses_shp = true")))
    assert time.perf_counter() - started < 1.0 * slowdown()  # the regex: minutes
    assert line_of('[a]\nk = 1\n[ b ]\n"k" = 2\n', "k", "b") == 4


@pytest.mark.parametrize("target", ["/dev/zero", "fifo", "dir", "big"])
def test_input_files_are_capped_regular_files(work: Path, target: str) -> None:
    path = work / "input.toml"
    if target == "fifo":
        os.mkfifo(path)  # no writer: opening it must not wait
    elif target == "dir":
        path.mkdir()
    elif target == "big":
        path.write_text("# " + "x" * MAX_FILE_BYTES + "\n")
    else:
        path.symlink_to(target)
    needle = {"big": "over the 1 MiB limit", "dir": "is a directory"}.get(
        target, "not a regular file"
    )
    for read in (read_text, load_experiment, load_platform, SimModel.load, load_config):
        with pytest.raises(InputError, match=needle):
            read(path)  # type: ignore[operator]
    model = BASE.replace('model = "toy-model.toml"', f'model = "{path}"')
    proc = musku("check", str(_exp(work, model)))
    assert proc.returncode == 3 and needle in one_error_line(proc)


def test_names_the_kernel_refuses_are_input_errors(work: Path) -> None:
    long = "m" * 300
    for old, new in (
        ('model = "toy-model.toml"', f'model = "{long}.toml"'),
        ('catalog = "firecracker-vm"', f'catalog = "{long}"'),
        ('catalog = "firecracker-vm"', f'catalog = "{long}.toml"'),
    ):
        proc = musku("check", str(_exp(work, BASE.replace(old, new))))
        assert proc.returncode == 3, proc.stderr
        one_error_line(proc)
    with pytest.raises(InputError, match="file name too long"):
        read_text(work / (long + ".toml"))
    with pytest.raises(InputError, match="NUL"):
        read_text(work / "a\0b.toml")
    proc = musku("check", str(_exp(work, BASE.replace("toy-model.toml", "nul\\u0000byte"))))
    assert proc.returncode == 3 and "model must be a file name" in one_error_line(proc)


def test_exhaustive_over_the_limit_check_refuses_and_sweep_writes_nothing(work: Path) -> None:
    """Issue 22, rough edge 7: check said OK, sweep refused and left a failed experiment."""
    text = (ROOT / "experiments" / "sim" / "web-skylake18.toml").read_text()
    exp = (ROOT / "experiments" / "web-skylake.toml").read_text()
    (work / "sim").mkdir()
    (work / "sim" / "web-skylake18.toml").write_text(text)
    path = _exp(work, exp.replace('mode = "independent"', 'mode = "exhaustive"'))
    assert 'mode = "exhaustive"' in path.read_text()
    check = musku("check", str(path))
    assert check.returncode == 3
    line = one_error_line(check)
    assert "would compare 363,825 configurations (limit 512)" in line
    db = work / "results.db"
    sweep = musku("sweep", str(path), "--db", f"sqlite:///{db}", "-q")
    assert sweep.returncode == 3 and one_error_line(sweep) == line
    assert not db.exists()  # nothing written: not even an empty database


def test_markup_in_a_name_is_text(work: Path) -> None:
    path = _exp(work, BASE.replace('name = "hostile"', 'name = "x[/bold]y"'))
    proc = musku("check", str(path))
    assert proc.returncode == 0, proc.stderr
    assert "x[/bold]y" in proc.stdout


@pytest.mark.slow
def test_a_sweep_named_with_markup_runs_and_reads_back(work: Path) -> None:
    text = BASE.replace('name = "hostile"', 'name = "[/]"').replace(
        "sample_cap = 20000", "sample_cap = 300"
    )
    path = _exp(work, text)
    db = f"sqlite:///{work}/r.db"
    proc = musku("sweep", str(path), "--db", db)
    assert proc.returncode == 0, proc.stderr
    assert "[/]" in proc.stdout
    proc = musku("results", "--db", db)
    assert proc.returncode == 0, proc.stderr
    assert "[/]" in proc.stdout
    exps: list[dict[str, Any]] = json.loads(musku("results", "--db", db, "--json").stdout)
    proc = musku("results", str(exps[0]["id"]), "--db", db)
    assert proc.returncode == 0 and "[/]" in proc.stdout, proc.stderr
    proc = musku("sku", "show", "--db", db)
    assert proc.returncode == 0, proc.stderr


def test_agent_config_is_capped(tmp_path: Path) -> None:
    p = tmp_path / "agent.toml"
    p.write_text("x = " + "[" * 500 + "]" * 500 + "\n")
    with pytest.raises(InputError, match="nested deeper"):
        load_config(p)
    assert sys.getrecursionlimit() >= 1000  # unchanged: the limit is musku's, not Python's


def test_a_negative_seed_on_the_command_line_is_bad_input(work: Path) -> None:
    path = _exp(work, BASE)
    db = work / "r.db"
    proc = musku("sweep", str(path), "--db", f"sqlite:///{db}", "--seed", "-1")
    assert proc.returncode == 3 and "--seed must be in 0.." in one_error_line(proc)
    assert not db.exists()


@pytest.mark.parametrize(
    ("line", "needle"),
    [
        ("allowed_uids = [true]", "allowed_uids"),
        ("allowed_uids = [4294967295]", "allowed_uids"),
        ('tcp_listen = "h:99999"\ntoken_file = "t"', "tcp_listen must be 'host:port'"),
        ('tcp_listen = "h:' + "9" * 5000 + '"\ntoken_file = "t"', "tcp_listen must be"),
        ('state_dir = "a\\u0000b"', "state_dir must be a path"),
        ("spool_max_rows = 9223372036854775807", "spool_max_rows must be at most"),
        ("sample_interval_s = nan", "sample_interval_s must be between"),
    ],
)
def test_bad_agent_configs_are_one_clean_error(tmp_path: Path, line: str, needle: str) -> None:
    p = tmp_path / "agent.toml"
    p.write_text(f"[agent]\n{line}\n")
    with pytest.raises(InputError, match=needle):
        load_config(p)


def test_a_sweep_refused_for_its_model_writes_nothing(work: Path) -> None:
    path = _exp(work, BASE.replace('model = "toy-model.toml"', 'model = "absent.toml"'))
    db = work / "r.db"
    check = musku("check", str(path))
    sweep = musku("sweep", str(path), "--db", f"sqlite:///{db}")
    assert check.returncode == sweep.returncode == 3
    assert one_error_line(check) == one_error_line(sweep)
    assert "absent.toml: no such file" in one_error_line(sweep)
    assert not db.exists()
