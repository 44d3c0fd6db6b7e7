"""The knob contract: one suite every knob passes on fake host trees.

A knob (built-in, or a ``module:Class`` from a plugin) binds to a :class:`musku.hostfs.HostFS`
and goes ``probe -> read -> apply(dry_run) -> apply -> verify -> check -> rollback``. Subclass
:class:`KnobContract` and give it a ``case`` fixture, a :class:`KnobCase` naming the knob, the
fake host it runs on (:mod:`musku.testing.fakehost`), and two values::

    from musku.testing.fakehost import intel_host
    from musku.testing.knobs import KnobCase, KnobContract

    class TestMyKnob(KnobContract):
        @pytest.fixture
        def case(self, tmp_path):
            host = intel_host(tmp_path / "host")
            return KnobCase("mypkg.knobs:Governor", host, target="powersave", other="ondemand")

Parametrise the fixture (``@pytest.fixture(params=...)``) to run many knobs on many hosts.
A case with ``supported=False`` checks the unsupported path instead: ``probe`` says why, and
``apply`` raises :class:`~musku.errors.UnsupportedError` naming the knob, writing nothing.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

import pytest

from musku.errors import UnsupportedError
from musku.knobs import load_knob
from musku.knobs.base import Drift, Knob, Snapshot
from musku.testing.fakehost import FakeHost


@dataclass
class KnobCase:
    """One knob on one fake host.

    ``target``: a value the host is not at (what the suite applies); ``other``: another value,
    what "someone else" sets to test drift detection. ``options``: the knob's options (as
    ``load_knob(name, fs, **options)`` takes them)."""

    knob: str
    host: FakeHost
    target: Any
    other: Any = None
    supported: bool = True
    options: dict[str, object] = field(default_factory=dict)

    def load(self) -> Knob:
        """A fresh knob object on the host (no state shared with an earlier one)."""
        return load_knob(self.knob, self.host.fs(), **self.options)


def tree(host: FakeHost) -> dict[str, bytes | None]:
    """The host's files and directories, without the knobs' own ``.musku.bak`` saves."""
    return {p: b for p, b in host.tree().items() if not p.endswith(".musku.bak")}


def settle(host: FakeHost, knob: Knob) -> None:
    """Reboot-mode knobs take effect at the next boot: boot the fake host."""
    if knob.probe().reboot:
        host.reboot()


class KnobContract:
    """The shared knob suite; override the ``case`` fixture (see the module's docstring)."""

    @pytest.fixture
    def case(self) -> KnobCase:
        raise NotImplementedError("override the `case` fixture: a KnobCase")

    @staticmethod
    def _supported(case: KnobCase) -> Knob:
        if not case.supported:
            pytest.skip(f"{case.knob} is not supported on this host")
        return case.load()

    def test_unsupported_is_typed(self, case: KnobCase) -> None:
        if case.supported:
            assert case.load().probe().supported, f"{case.knob}: probe says unsupported"
            return
        k = case.load()
        support = k.probe()
        assert support.supported is False and support.reason
        before = tree(case.host)
        with pytest.raises(UnsupportedError, match=re.escape(k.name)):
            k.apply(case.target)
        assert tree(case.host) == before

    def test_dry_run_writes_nothing(self, case: KnobCase) -> None:
        k = self._supported(case)
        before = tree(case.host)
        writes = k.apply(case.target, dry_run=True)
        assert writes, "a change was expected"
        assert tree(case.host) == before
        assert not k.verify(case.target)

    def test_apply_verify_idempotent(self, case: KnobCase) -> None:
        k = self._supported(case)
        assert k.read() != case.target
        assert k.apply(case.target)
        settle(case.host, k)
        assert k.verify(case.target)
        assert k.read() == case.target
        after = tree(case.host)
        assert k.apply(case.target) == []  # idempotent: nothing left to write
        assert tree(case.host) == after
        # a fresh knob object on the same host agrees (no hidden in-memory state)
        assert case.load().verify(case.target)

    def test_outside_change_detected(self, case: KnobCase) -> None:
        k = self._supported(case)
        if case.other is None:
            pytest.skip("no `other` value given")
        k.apply(case.target)
        settle(case.host, k)
        assert k.verify(case.target)
        case.load().apply(case.other)  # someone else changes the knob
        assert not k.verify(case.target)
        with pytest.raises(Drift, match=re.escape(k.name)):
            k.check(case.target)

    def test_rollback_restores_bytes(self, case: KnobCase) -> None:
        k = self._supported(case)
        before = tree(case.host)
        snap = k.snapshot()
        k.apply(case.target)
        assert tree(case.host) != before
        # the snapshot survives persistence (the agent journals it as JSON)
        restored = Snapshot.from_json(snap.to_json())
        case.load().rollback(restored)
        assert tree(case.host) == before
        k.rollback(restored)  # rolling back again is harmless
        assert tree(case.host) == before
