"""The metric-sampler contract: one suite every sampler passes, built in or out of tree.

A sampler (:class:`musku.metrics.base.Sampler`, registered in :data:`musku.metrics.SAMPLERS`
or named ``"package.module:Class"``) goes ``probe -> start -> sample()* -> close``. Subclass
:class:`SamplerContract` and give it a ``case`` fixture, a :class:`SamplerCase` naming the
sampler, the host it reads (a :class:`~musku.hostfs.HostFS`: the real ``/`` or a fake tree)
and its options::

    from musku.hostfs import HostFS
    from musku.testing.samplers import SamplerCase, SamplerContract

    class TestMySampler(SamplerContract):
        @pytest.fixture
        def case(self, tmp_path):
            return SamplerCase("mypkg.samplers:Queues", HostFS("/"), {"device": "eth0"})

"Not supported here" is a typed refusal, not a failure: a sampler whose source this host
lacks (RAPL in a VM, perf events without a PMU or permission) must say so from ``probe`` (a
:class:`~musku.knobs.base.Support` with a one-line reason, never an exception), and a real
agent then reports it ``unavailable: <reason>`` and samples without it; the suite checks that
and skips what needs the source. ``supported`` pins the answer where the test knows it (a
fake tree with or without the file); ``None`` accepts whatever this machine says.
``advance`` makes the source move between two samples (a service's stats file rewritten);
the default waits a little, which is enough for rates over time.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from musku.agent.config import AgentConfig
from musku.agent.core import Agent
from musku.hostfs import HostFS
from musku.knobs.base import Support
from musku.metrics import SAMPLERS, load_sampler, sampler_class
from musku.metrics.base import Sampler


def _pause() -> None:
    time.sleep(0.05)


@dataclass
class SamplerCase:
    """One sampler on one host. ``sampler``: a registered name or ``"module:Class"``;
    ``options``: its ``[samplers.NAME]`` table; ``supported``: what ``probe`` must answer
    (None: whatever this host says); ``advance``: called between two samples."""

    sampler: str
    fs: HostFS
    options: dict[str, object] = field(default_factory=dict)
    supported: bool | None = None
    advance: Callable[[], None] = _pause

    def load(self) -> Sampler:
        """A fresh sampler on the host (no state shared with an earlier one)."""
        return load_sampler(self.sampler, self.fs, **self.options)


def _one_line(text: str) -> bool:
    return bool(text.strip()) and "\n" not in text


class SamplerContract:
    """The shared sampler suite; override the ``case`` fixture (see the module's docstring)."""

    @pytest.fixture
    def case(self) -> SamplerCase:
        raise NotImplementedError("override the `case` fixture: a SamplerCase")

    @staticmethod
    def _supported(case: SamplerCase) -> Sampler:
        s = case.load()
        support = s.probe()
        if not support.supported:
            pytest.skip(f"{case.sampler} is not supported here: {support.reason}")
        return s

    def test_it_is_registered(self, case: SamplerCase) -> None:
        cls = sampler_class(case.sampler)
        assert issubclass(cls, Sampler) and isinstance(case.load(), cls)
        assert isinstance(cls.name, str) and cls.name and ":" not in cls.name
        assert SAMPLERS.get(cls.name) is cls  # once resolved, its short name works too

    def test_probe_is_a_typed_answer(self, case: SamplerCase) -> None:
        s = case.load()
        first, second = s.probe(), s.probe()
        assert isinstance(first, Support) and isinstance(second, Support)
        assert first.supported == second.supported, "probe changed its mind on the same host"
        if case.supported is not None:
            assert first.supported == case.supported, f"{case.sampler}: {first.reason}"
        if first.supported:
            assert isinstance(first.backend, str)
        else:
            assert _one_line(first.reason), f"unsupported without a one-line reason: {first!r}"
        s.close()  # closing a sampler never started is harmless

    def test_an_agent_reports_what_it_found(self, case: SamplerCase, tmp_path: Path) -> None:
        """A real agent with this sampler configured: started and spooled where supported,
        ``unavailable: <reason>`` where not, never a crash."""
        support = case.load().probe()
        cfg = AgentConfig(
            root=str(case.fs.root),
            state_dir=tmp_path / "agent-state",
            socket=tmp_path / "agent.sock",
            samplers={case.sampler: dict(case.options)},
        )
        agent = Agent(cfg, fs=case.fs)
        try:
            agent.start_samplers()
            shown = agent.op_status({})["samplers"][case.sampler]
            if not support.supported:
                assert agent.samplers == []
                assert shown == f"unavailable: {support.reason}"
                return
            assert len(agent.samplers) == 1 and shown and not shown.startswith("unavailable")
            case.advance()
            agent.sample_once()
            rows, _ = agent.spool.collect(0)
            assert len(rows) == 1
            _check_figures(rows[0].metrics)
        finally:
            agent.close()

    def test_samples_are_finite_rates(self, case: SamplerCase) -> None:
        s = self._supported(case)
        try:
            s.start()
            for _ in range(2):
                case.advance()
                _check_figures(s.sample())
        finally:
            s.close()

    def test_it_samples_after_a_restart(self, case: SamplerCase) -> None:
        """The agent starts its samplers again after a restart of sampling: ``start`` on a
        sampler that ran (and was closed) works; ``close`` twice is harmless."""
        s = self._supported(case)
        s.start()
        case.advance()
        s.sample()
        s.close()
        s.close()
        s.start()
        case.advance()
        try:
            _check_figures(s.sample())
        finally:
            s.close()


def _check_figures(figures: object) -> None:
    assert isinstance(figures, dict), f"sample() returned {type(figures).__name__}, not a dict"
    for key, value in figures.items():
        assert isinstance(key, str) and key, f"metric name {key!r}"
        assert isinstance(value, int | float) and not isinstance(value, bool), (key, value)
        assert math.isfinite(value), f"{key} = {value}"
