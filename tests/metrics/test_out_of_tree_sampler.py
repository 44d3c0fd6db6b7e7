"""A metric sampler from outside musku (tests/metrics/toysampler.py) plugs in with no edit to
musku: named as ``module:Class`` in a real agent's configuration, it is probed, started and
sampled on a fake host tree, and its figures land in the agent's spool rows; a host without
its source reports it unavailable; a bad target or option is one line (docs/architecture.md,
"Registries"; docs/agent.md, samplers)."""

from __future__ import annotations

from pathlib import Path

import pytest

from musku.agent.core import Agent
from musku.errors import InputError
from musku.hostfs import HostFS
from musku.metrics import SAMPLERS, load_sampler
from tests.agent.helpers import config
from tests.metrics.toysampler import FILE_NR, TARGET, FileHandles


def host(tmp_path: Path, allocated: int | None) -> Path:
    root = tmp_path / "host"
    root.mkdir()
    if allocated is not None:
        f = root / FILE_NR.lstrip("/")
        f.parent.mkdir(parents=True)
        f.write_text(f"{allocated}\t0\t9223372036854775807\n")
    return root


def test_an_agent_spools_what_an_out_of_tree_sampler_returns(tmp_path: Path) -> None:
    root = host(tmp_path, 4096)
    assert TARGET not in SAMPLERS.values()
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


def test_a_host_without_its_source_reports_it_unavailable(tmp_path: Path) -> None:
    host(tmp_path, None)
    agent = Agent(config(tmp_path, samplers={TARGET: {}}))
    try:
        agent.start_samplers()
        assert agent.samplers == []
        assert agent.op_status({})["samplers"] == {TARGET: f"unavailable: {FILE_NR} is missing"}
    finally:
        agent.close()


@pytest.mark.parametrize(
    ("name", "options", "message"),
    [
        ("tests.metrics.toysampler:Nope", {}, "has no 'Nope'"),
        ("tests.metrics.nomodule:FileHandles", {}, "cannot import"),
        ("tests.metrics.toysampler:FILE_NR", {}, "is not a musku.metrics.base.Sampler"),
        (TARGET, {"colour": 1}, "unknown option 'colour'"),
        (TARGET, {"scale": "2"}, "scale must be a number"),
    ],
)
def test_a_bad_sampler_is_one_line(
    tmp_path: Path, name: str, options: dict[str, object], message: str
) -> None:
    with pytest.raises(InputError) as info:
        load_sampler(name, HostFS(host(tmp_path, 1)), **options)
    assert message in info.value.one_line() and "\n" not in info.value.one_line()


def test_it_is_an_ordinary_sampler(tmp_path: Path) -> None:
    s = load_sampler(TARGET, HostFS(host(tmp_path, 7)))
    assert isinstance(s, FileHandles) and s.probe().supported
    s.start()
    assert s.sample() == {"open_files": 7.0}
