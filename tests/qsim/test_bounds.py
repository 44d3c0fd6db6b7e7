"""Issue 29, item 5: qsim inputs are bounded like every other input, and the engine runs under
a CPU and memory budget. Each test is one reproducer of the issue, through the real CLI (a
subprocess: the exit status and the one line a user sees) and the real engine where it runs."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from musku.qsim.model import load
from tests.qsim.conftest import MM1
from tests.timing import scaled

ROOT = Path(__file__).resolve().parents[2]


class qm:  # noqa: N801 - the engine's limits (services/qsim/src/model.cc), written out
    MAX_CORES = 4096
    MAX_THREADS = 1 << 20
    MAX_CONNECTIONS = 1 << 20
    MAX_BATCH = 1 << 30
    MAX_COPIES = 1 << 20
    MAX_CLIENT_CONNECTIONS = 1 << 24
    MAX_USERS = 1 << 24


def test_the_model_has_the_engine_limits() -> None:
    """The numbers in musku/qsim/model.py are the engine's: read from its source."""
    import re

    from musku.qsim import model as m

    src = (ROOT / "services" / "qsim" / "src" / "model.cc").read_text()

    def hi(key: str, nth: int = 0) -> int:
        found = re.findall(r'Int\([^;]*?"' + key + r'",[^;]*?, ([0-9]+|1 << [0-9]+)\)', src)
        return int(eval(found[nth]))  # noqa: S307 - "1 << 20" from the engine's source

    assert hi("cores") == m.MAX_CORES == qm.MAX_CORES
    assert hi("threads") == m.MAX_THREADS == qm.MAX_THREADS
    assert hi("connections", 0) == m.MAX_CONNECTIONS == qm.MAX_CONNECTIONS
    assert hi("connections", 1) == m.MAX_CLIENT_CONNECTIONS == qm.MAX_CLIENT_CONNECTIONS
    assert hi("copies") == m.MAX_COPIES == qm.MAX_COPIES
    assert hi("users") == m.MAX_USERS == qm.MAX_USERS
    assert hi("join") == m.MAX_JOIN and hi("pool") == m.MAX_POOL
    assert "int hi = 1 << 30" in src and m.MAX_BATCH == 1 << 30  # batch: Int's default bound


def musku(*args: str, cwd: Path = ROOT, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    env.pop("MUSKU_DEBUG", None)
    return subprocess.run(
        [sys.executable, "-m", "musku", *args],
        capture_output=True,
        text=True,
        timeout=scaled(timeout),
        env=env,
        cwd=cwd,
    )


def refused(p: subprocess.CompletedProcess[str], text: str, status: int = 3) -> str:
    """The command failed with ``status`` and exactly one ``musku: error:`` line holding
    ``text``; that line."""
    lines = [ln for ln in p.stderr.splitlines() if ln.strip()]
    assert p.returncode == status, (p.returncode, p.stderr[-2000:])
    assert len(lines) == 1 and lines[0].startswith("musku: error: "), p.stderr[-2000:]
    assert text in lines[0], lines[0]
    return lines[0]


def model(tmp_path: Path, text: str, name: str = "m.toml") -> Path:
    p = tmp_path / name
    p.write_text(text)
    return p


MM1_OK = MM1.format(duration=0.2, qps=1000)


# ------------------------------------------------------------------ the document layer


def test_deeply_nested_array_is_one_line(tmp_path: Path) -> None:
    text = MM1_OK + "\n[extra]\nx = " + "[" * 5000 + "]" * 5000 + "\n"
    refused(musku("qsim", "check", str(model(tmp_path, text))), "nested deeper than 32")


def test_a_model_over_one_mib_is_refused(tmp_path: Path) -> None:
    text = MM1_OK + "\n# " + "x" * (2 << 20) + "\n"
    refused(musku("qsim", "check", str(model(tmp_path, text))), "over the 1 MiB limit")


def test_a_device_or_fifo_as_the_model_is_refused(tmp_path: Path) -> None:
    refused(musku("qsim", "check", "/dev/zero"), "not a regular file")
    fifo = tmp_path / "m.fifo"
    os.mkfifo(fifo)
    refused(musku("qsim", "check", str(fifo)), "not a regular file")


def test_strings_are_not_numbers(tmp_path: Path) -> None:
    p = model(tmp_path, MM1_OK.replace("seed = 3", 'seed = "7"'))
    line = refused(musku("qsim", "check", str(p)), "run.seed")
    assert f"{p}:4:" in line
    p = model(tmp_path, MM1_OK.replace("cores = 1", "cores = true"))
    refused(musku("qsim", "check", str(p)), "machines[0].cores")


@pytest.mark.parametrize(
    ("old", "new", "where"),
    [
        ("cores = 1", f"cores = {qm.MAX_CORES + 1}", "machines[0].cores"),
        ('name = "work"', f'name = "work"\n  batch = {qm.MAX_BATCH + 1}', "stages[0].batch"),
        ('execution = "simple"', f"connections = {qm.MAX_CONNECTIONS + 1}", "connections"),
        ('name = "only"', f'name = "only"\n  copies = {qm.MAX_COPIES + 1}', "nodes[0].copies"),
        ("qps = 1000", f"qps = 1000\nconnections = {qm.MAX_CLIENT_CONNECTIONS + 1}", "client"),
        ("qps = 1000", f'kind = "closed"\nusers = {qm.MAX_USERS + 1}', "client.users"),
        ('execution = "simple"', f"threads = {qm.MAX_THREADS + 1}", "services[0].threads"),
    ],
)
def test_check_refuses_what_the_engine_refuses(
    tmp_path: Path, old: str, new: str, where: str
) -> None:
    assert old in MM1_OK
    p = model(tmp_path, MM1_OK.replace(old, new, 1))
    refused(musku("qsim", "check", str(p)), where)


@pytest.mark.parametrize(
    ("old", "new"),
    [
        ("cores = 1", f"cores = {qm.MAX_CORES}"),
        ('name = "work"', f'name = "work"\n  batch = {qm.MAX_BATCH}'),
        ('execution = "simple"', f'execution = "simple"\nconnections = {qm.MAX_CONNECTIONS}'),
        ('name = "only"', f'name = "only"\n  copies = {qm.MAX_COPIES}'),
        ("qps = 1000", f"qps = 1000\nconnections = {qm.MAX_CLIENT_CONNECTIONS}"),
    ],
)
def test_the_engine_runs_what_check_accepts_at_the_limits(
    engine: str, tmp_path: Path, old: str, new: str
) -> None:
    """check <=> run: a model at each limit passes check and the engine takes it."""
    text = MM1.format(duration=0.002, qps=1).replace("warmup_s = 0.05", "warmup_s = 0")
    p = model(tmp_path, text.replace(old, new, 1))
    assert musku("qsim", "check", str(p)).returncode == 0
    doc = load(p).engine
    r = subprocess.run([engine, "-"], input=json.dumps(doc), capture_output=True, text=True,
                       timeout=scaled(60))  # fmt: skip
    assert r.returncode == 0, r.stderr


def test_a_copies_chain_over_the_engine_join_limit(tmp_path: Path) -> None:
    chain = MM1_OK.replace('  name = "only"\n  service = "server"\n', "")
    nodes = "".join(
        f'  [[paths.nodes]]\n  name = "n{i}"\n  service = "server"\n  copies = 2048\n'
        + (f'  children = ["n{i + 1}"]\n' if i < 2 else "")
        for i in range(3)
    )
    chain = chain.replace("[[paths]]\n  [[paths.nodes]]\n", "[[paths]]\n" + nodes)
    refused(musku("qsim", "check", str(model(tmp_path, chain))), "times per request")


def test_huge_instances_and_durations_end_at_check(tmp_path: Path) -> None:
    started = time.monotonic()
    p = model(tmp_path, MM1_OK.replace('execution = "simple"', "instances = 100000000"))
    refused(musku("qsim", "check", str(p)), "services[0].instances")
    p = model(tmp_path, MM1_OK.replace("duration_s = 0.2", "duration_s = 1e15"))
    refused(musku("qsim", "check", str(p)), "run.duration_s")
    assert time.monotonic() - started < scaled(60)


def test_engine_state_is_bounded(tmp_path: Path) -> None:
    text = MM1_OK.replace('execution = "simple"', "instances = 10000\nconnections = 10000")
    text = text.replace('name = "work"', 'name = "work"\n  queue = "epoll"')
    refused(musku("qsim", "check", str(model(tmp_path, text))), "threads, connection queues")


@pytest.mark.parametrize(
    ("args", "text"),
    [
        (["--duration", "1e12"], "--duration must be > 0 and at most"),
        (["--duration", "nan"], "--duration must be > 0"),
        (["--duration", "inf"], "--duration must be > 0"),
        (["--qps", "nan"], "--qps must be > 0"),
        (["--seed", "-1"], "--seed must be in"),
        (["--cpu-limit", "0"], "--cpu-limit must be in"),
        (["--memory-limit", "1"], "--memory-limit must be in"),
    ],
)
def test_run_options_bounded_before_the_engine(tmp_path: Path, args: list[str], text: str) -> None:
    refused(musku("qsim", "run", str(model(tmp_path, MM1_OK)), *args), text)


def test_curve_steps_bounded(tmp_path: Path) -> None:
    started = time.monotonic()
    p = model(tmp_path, MM1_OK)
    refused(musku("qsim", "curve", str(p), "--qps", "1:2:1000000000"), "at most 1000 steps")
    refused(musku("qsim", "curve", str(p), "--qps", "1:inf:3"), "A:B:STEPS")
    assert time.monotonic() - started < scaled(60)


# ------------------------------------------------------------------ histograms


def _empirical(tmp_path: Path, file: str) -> Path:
    text = MM1_OK.replace(
        '{ dist = "exp", mean_us = 10 }', f'{{ dist = "empirical", file = "{file}" }}'
    )
    d = tmp_path / "models"
    d.mkdir(exist_ok=True)
    return model(d, text)


SECRET = "TOPSECRET-first-line,0"


def test_histogram_outside_the_model_folder_is_refused_unread(tmp_path: Path) -> None:
    (tmp_path / "secret.csv").write_text(SECRET + "\n")
    for name in ("../secret.csv", str(tmp_path / "secret.csv"), "../../../../etc/shadow"):
        p = _empirical(tmp_path, name)
        line = refused(musku("qsim", "check", str(p)), "not beneath the model's folder")
        assert "TOPSECRET" not in line
    # a symbolic link inside the folder pointing out of it: refused too
    (tmp_path / "models" / "link.csv").symlink_to(tmp_path / "secret.csv")
    line = refused(musku("qsim", "check", str(_empirical(tmp_path, "link.csv"))), "not beneath")
    assert "TOPSECRET" not in line


def test_histogram_errors_never_echo_contents(tmp_path: Path) -> None:
    p = _empirical(tmp_path, "h.csv")
    (tmp_path / "models" / "h.csv").write_text("5,1\n" + SECRET.replace(",0", ",x") + "\n")
    line = refused(musku("qsim", "check", str(p)), "h.csv:2")
    assert "TOPSECRET" not in line


def test_histogram_devices_fifos_and_big_files(tmp_path: Path) -> None:
    p = _empirical(tmp_path, "/dev/zero")
    refused(musku("qsim", "check", str(p)), "not beneath")
    d = tmp_path / "models"
    os.mkfifo(d / "fifo.csv")
    refused(musku("qsim", "check", str(_empirical(tmp_path, "fifo.csv"))), "not a regular file")
    (d / "zero.csv").symlink_to("/dev/zero")
    refused(musku("qsim", "check", str(_empirical(tmp_path, "zero.csv"))), "not beneath")
    (d / "big.csv").write_text("1,1\n" * (600 << 10))
    refused(musku("qsim", "check", str(_empirical(tmp_path, "big.csv"))), "1 MiB limit")


# ------------------------------------------------------------------ output and printing


def test_out_a_directory_fifo_or_symlink_is_one_line(tmp_path: Path) -> None:
    p = model(tmp_path, MM1_OK)
    refused(musku("qsim", "run", str(p), "--out", str(tmp_path)), "--out is a directory")
    fifo = tmp_path / "out.fifo"
    os.mkfifo(fifo)
    refused(musku("qsim", "run", str(p), "--out", str(fifo)), "not a regular file")
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)  # untouched
    link = tmp_path / "out.json"
    link.symlink_to(tmp_path / "elsewhere.json")
    refused(musku("qsim", "curve", str(p), "--qps", "1:2:2", "--out", str(link)), "symbolic link")
    assert not (tmp_path / "elsewhere.json").exists()
    refused(musku("qsim", "run", str(p), "--out", str(tmp_path / "no" / "r.json")), "no such")


def test_markup_in_names_is_printed_as_text(engine: str, tmp_path: Path) -> None:
    text = (
        MM1_OK.replace('name = "server"', 'name = "srv[/bold]x"')
        .replace('service = "server"', 'service = "srv[/bold]x"')
        .replace('name = "work"', 'name = "[red]w[/]"')
        .replace('name = "m"', 'name = "m[/]"')
    )
    p = model(tmp_path, text)
    assert musku("qsim", "check", str(p)).returncode == 0
    r = musku("qsim", "run", str(p))
    assert r.returncode == 0, r.stderr
    assert "srv[/bold]x" in r.stdout and "[red]w[/]" in r.stdout and "m[/]" in r.stdout
    out = tmp_path / "r.json"
    r = musku("qsim", "run", str(p), "--out", str(out), "--json")
    assert r.returncode == 0 and json.loads(out.read_text())["services"].keys() == {"srv[/bold]x"}


# ------------------------------------------------------------------ the engine's budget


def test_engine_cpu_budget(engine: str, tmp_path: Path) -> None:
    text = MM1.format(duration=100_000, qps=50_000).replace("mean_us = 10", "mean_us = 1")
    p = model(tmp_path, text)
    started = time.monotonic()
    # -q: a run over 2 s of wall time (a busy machine) would show progress lines before the error
    refused(musku("qsim", "run", str(p), "--cpu-limit", "1", "-q"), "CPU-second budget")
    assert time.monotonic() - started < scaled(120)
    refused(
        musku("qsim", "curve", str(p), "--qps", "1000:2000:5", "--cpu-limit", "1", "-q"),
        "CPU-second budget",
    )


def test_engine_memory_budget(engine: str, tmp_path: Path) -> None:
    text = MM1_OK.replace('execution = "simple"', "threads = 1048576\ncores_per_instance = 1")
    text = text.replace('name = "server"', 'name = "server"\ninstances = 8')
    p = model(tmp_path, text)
    refused(musku("qsim", "run", str(p), "--memory-limit", "64"), "MiB of memory")


def test_a_service_with_fewer_connections_than_the_client(engine: str, tmp_path: Path) -> None:
    """Found by bench/fuzz.py (seed 29, model #697): an epoll stage of a service with fewer
    connections than the client indexed its sub-queues by the client's connection, past their
    end, and the engine died of SIGSEGV. A job's connection is the client's modulo the
    service's (docs/qsim.md)."""
    text = MM1.format(duration=0.2, qps=20_000).replace(
        'execution = "simple"', 'execution = "threads"\nthreads = 1\nconnections = 2'
    )
    text = text.replace('name = "work"', 'name = "work"\n  queue = "epoll"\n  batch = 8')
    text = text.replace("qps = 20000", "qps = 20000\nconnections = 16")
    r = musku("qsim", "run", str(model(tmp_path, text)), "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["latency"]["count"] > 100
