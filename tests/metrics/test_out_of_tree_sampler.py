"""A metric sampler from outside musku (tests/metrics/toysampler.py) plugs in with no edit to
musku: it passes the sampler contract (:class:`musku.testing.samplers.SamplerContract`), named
as ``module:Class`` in a real agent's configuration it is probed, started and sampled on a fake
host tree and its figures land in the agent's spool rows; registered
(``SAMPLERS.register``) or shipped as a ``musku.samplers`` entry point, its short name works;
a host without its source reports it unavailable. Plug-ins that take a built-in's name, lack
a method or are not samplers (tests/metrics/badsamplers.py) are one line naming them, exit 3,
when ``musku agent run`` loads its configuration (docs/architecture.md, "Registries";
docs/agent.md, samplers)."""

from __future__ import annotations

import itertools
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from musku.agent.core import Agent
from musku.errors import InputError
from musku.hostfs import HostFS
from musku.metrics import SAMPLERS, check_samplers, load_sampler
from musku.registry import PluginError
from musku.testing.samplers import SamplerCase, SamplerContract
from tests.agent.helpers import config
from tests.metrics.toysampler import FILE_NR, TARGET, FileHandles

ROOT = Path(__file__).resolve().parents[2]


def host(tmp_path: Path, allocated: int | None) -> Path:
    root = tmp_path / "host"
    root.mkdir()
    if allocated is not None:
        f = root / FILE_NR.lstrip("/")
        f.parent.mkdir(parents=True)
        f.write_text(f"{allocated}\t0\t9223372036854775807\n")
    return root


@pytest.fixture(autouse=True)
def forget_the_toy() -> Iterator[None]:
    """Each test starts with the built-in samplers alone (a resolved target registers its
    short name for the rest of the process)."""
    yield
    for name in ("file_handles", "handles"):
        if name in SAMPLERS.names():
            SAMPLERS.unregister(name)


class TestToySampler(SamplerContract):
    @pytest.fixture(params=["present", "missing"])
    def case(self, request: pytest.FixtureRequest, tmp_path: Path) -> SamplerCase:
        if request.param == "missing":
            return SamplerCase(TARGET, HostFS(host(tmp_path, None)), supported=False)
        root = host(tmp_path, 100)
        counts = itertools.count(200, 100)

        def advance() -> None:
            (root / FILE_NR.lstrip("/")).write_text(f"{next(counts)}\t0\t100\n")

        return SamplerCase(TARGET, HostFS(root), {"scale": 2}, supported=True, advance=advance)


def test_an_agent_spools_what_an_out_of_tree_sampler_returns(tmp_path: Path) -> None:
    root = host(tmp_path, 4096)
    assert "file_handles" not in SAMPLERS.names()
    agent = Agent(config(tmp_path, samplers={TARGET: {"scale": 2}}))
    try:
        agent.start_samplers()
        assert agent.op_status({})["samplers"] == {
            TARGET: "procfs"
        }  # what `musku agent status` shows
        (root / FILE_NR.lstrip("/")).write_text("5000\t0\t100\n")
        agent.sample_once()
        rows, _ = agent.spool.collect(0)
        assert [r.metrics for r in rows] == [{"open_files": 10000.0}]
    finally:
        agent.close()
    assert SAMPLERS.get("file_handles") is FileHandles  # its short name works from now on


def test_registered_its_short_name_works(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="unknown metric sampler 'file_handles'"):
        load_sampler("file_handles", HostFS(host(tmp_path, 3)))
    assert SAMPLERS.register(TARGET) is FileHandles
    assert SAMPLERS.register(TARGET) is FileHandles  # twice: harmless
    assert SAMPLERS.names()[:4] == ["perf", "psutil", "service", "rapl"]
    assert "file_handles" in SAMPLERS.names()
    s = load_sampler("file_handles", HostFS(tmp_path / "host"))
    s.start()
    assert s.sample() == {"open_files": 3.0}


def test_an_installed_entry_point_registers_a_sampler(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A distribution declaring ``[musku.samplers] file_handles = "module:Class"`` (a real
    dist-info directory on sys.path, found by importlib.metadata)."""
    dist = tmp_path / "toysamplers-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: toysamplers\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text(f"[musku.samplers]\nfile_handles = {TARGET}\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(SAMPLERS, "_entry_points_read", False)
    assert SAMPLERS.names()[-1] == "file_handles"
    check_samplers(["perf", "file_handles"])
    assert load_sampler("file_handles", HostFS(host(tmp_path, 9))).probe().supported


def test_an_entry_point_under_another_name_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    dist = tmp_path / "misnamed-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: misnamed\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text(f"[musku.samplers]\nhandles = {TARGET}\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(SAMPLERS, "_entry_points_read", False)
    with pytest.raises(PluginError, match="is named 'file_handles', registered as 'handles'"):
        check_samplers(["handles"])


def test_a_host_without_its_source_reports_it_unavailable(tmp_path: Path) -> None:
    host(tmp_path, None)
    agent = Agent(config(tmp_path, samplers={TARGET: {}}))
    try:
        agent.start_samplers()
        assert agent.samplers == []
        assert agent.op_status({})["samplers"] == {TARGET: f"unavailable: {FILE_NR} is missing"}
    finally:
        agent.close()


BAD = [
    ("tests.metrics.toysampler:Nope", "has no 'Nope'"),
    ("tests.metrics.nomodule:FileHandles", "cannot import"),
    ("tests.metrics.toysampler:FILE_NR", "is not a musku.metrics.base.Sampler"),
    ("tests.metrics.badsamplers:NotASampler", "is not a musku.metrics.base.Sampler"),
    ("tests.metrics.badsamplers:Twice", "registers the name 'perf' twice"),
    ("tests.metrics.badsamplers:NoSample", "lacks required method(s): sample"),
]


@pytest.mark.parametrize(("name", "message"), BAD)
def test_a_bad_plugin_is_one_line(tmp_path: Path, name: str, message: str) -> None:
    with pytest.raises(InputError) as info:
        check_samplers([name])
    line = info.value.one_line()
    assert message in line and name in line and "\n" not in line, line
    assert info.value.status == 3


@pytest.mark.parametrize(
    ("name", "options", "message"),
    [
        (TARGET, {"colour": 1}, "unknown option 'colour'"),
        (TARGET, {"scale": "2"}, "scale must be a number"),
        ("tests.metrics.badsamplers:Exploding", {}, "constructor failed: ZeroDivisionError"),
    ],
)
def test_bad_options_are_one_line(
    tmp_path: Path, name: str, options: dict[str, object], message: str
) -> None:
    with pytest.raises(InputError) as info:
        load_sampler(name, HostFS(host(tmp_path, 1)), **options)
    assert message in info.value.one_line() and "\n" not in info.value.one_line()


@pytest.mark.parametrize(
    ("name", "message", "options"),
    [
        (*BAD[3], ""),
        (*BAD[4], ""),
        (*BAD[5], ""),
        (TARGET, "unknown option 'colour'", "colour = 1\n"),
        ("service", "needs stats_file", ""),
    ],
    ids=["not-a-sampler", "twice", "no-sample", "bad-option", "service-without-file"],
)
def test_musku_agent_run_refuses_a_bad_plugin_at_load(
    tmp_path: Path, name: str, message: str, options: str
) -> None:
    """The real command: exit 3 and one line naming the plug-in (or the option it refused),
    before the agent locks its state or touches the host (no state directory, no socket)."""
    root = host(tmp_path, 1)
    cfg = tmp_path / "agent.toml"
    cfg.write_text(
        f'[agent]\nroot = "{root}"\nstate_dir = "{tmp_path / "state"}"\n'
        f'socket = "{tmp_path / "agent.sock"}"\n[samplers."{name}"]\n{options}'
    )
    env = dict(os.environ)
    env.pop("MUSKU_DEBUG", None)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    proc = subprocess.run(
        [sys.executable, "-m", "musku", "agent", "run", "--config", str(cfg)],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
        cwd=tmp_path,
    )
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert proc.returncode == 3 and len(lines) == 1, proc.stderr
    assert message in lines[0] and "Traceback" not in proc.stderr
    if not options and ":" in name:  # a refused plug-in is named; an option, by its sampler
        assert name in lines[0], lines[0]
    assert not (tmp_path / "state").exists() and not (tmp_path / "agent.sock").exists()


def test_it_is_an_ordinary_sampler(tmp_path: Path) -> None:
    s = load_sampler(TARGET, HostFS(host(tmp_path, 7)))
    assert isinstance(s, FileHandles) and s.probe().supported
    s.start()
    assert s.sample() == {"open_files": 7.0}
