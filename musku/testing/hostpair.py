"""The :class:`~musku.hosts.base.HostPair` contract: one suite every host backend passes.

Subclass :class:`HostPairContract` in a test module and give it three fixtures::

    from musku.testing.hostpair import HostPairContract

    class TestMyPair(HostPairContract):
        window_s = 0.2  # host seconds per window in the suite (keep it short for real hosts)

        @pytest.fixture
        def pair(self, tmp_path):  # an open pair at its baseline; closed by the fixture
            with open_my_pair(tmp_path) as p:
                yield p

        @pytest.fixture
        def target(self, pair):  # what the pair can apply, differing from the baseline
            return (Configuration.of(thp="never"), Configuration.of(thp="never"))

        @pytest.fixture
        def failing(self, pair):  # an apply that fails on ONE host only (None: skipped)
            return (Configuration.of(thp="never"), Configuration.of(shp=10**9))

What it checks (the promises of :class:`~musku.hosts.base.HostPair`):

- ``apply`` puts each host at its configuration (``Host.configuration()`` says so), returns
  the host seconds it took, and applying the same again changes nothing;
- ``apply`` is all-or-nothing: one that fails on one host raises a one-line
  :class:`~musku.errors.MuskuError` and leaves both hosts as they were, as far as
  ``Host.configuration()`` and :meth:`HostPairContract.observe` (the state below the
  interface, e.g. the bytes of a fake host tree) can tell; and ``configuration()`` tells the
  truth after any failure;
- ``restore`` puts both hosts back at their configurations of when the pair was opened;
- ``windows(s, n)`` returns what ``n`` calls of ``window(s)`` return: ``n`` pairs of samples
  of hosts ``(hosts[0], hosts[1])``, each ``s`` long, with the same metric names, at times
  that increase; ``windows(s, 0)`` is empty;
- ``now()`` never goes back, and a window moves it on by at least the window's length;
- ``describe()`` names the two hosts under ``"hosts"`` (as ``Host.name`` does), says its
  ``"backend"`` when :attr:`HostPairContract.backend` is set, and is JSON-serialisable
  (the results store keeps it).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any

import pytest

from musku.domain import Configuration, Sample
from musku.errors import MuskuError
from musku.hosts.base import HostPair

Configs = tuple[Configuration, Configuration]


def _configs(pair: HostPair) -> Configs:
    return (pair.hosts[0].configuration(), pair.hosts[1].configuration())


def _holds(pair: HostPair, target: Configs) -> bool:
    """Each host has every setting of its target (a backend may report more knobs)."""
    return all(
        host.configuration().get(knob) == value
        for host, cfg in zip(pair.hosts, target, strict=True)
        for knob, value in cfg.as_dict().items()
    )


class HostPairContract:
    """The shared suite; see the module's docstring. Override the fixtures ``pair``,
    ``target`` and (optionally) ``failing``, and the attributes below as needed."""

    window_s: float = 1.0
    """Host seconds of one window in the suite (wall seconds on real hosts: keep it short)."""

    backend: str | None = None
    """When set, ``describe()["backend"]`` must equal it."""

    duration_slack_s: float = 0.0
    """How much longer than asked a sample's ``duration`` may be (a real host's window is
    measured on the wall clock: on a busy machine it runs over a little)."""

    # ------------------------------------------------------------------ fixtures to override

    @pytest.fixture
    def pair(self) -> HostPair:
        """An open pair at its baseline, fresh for each test (yield it and close it)."""
        raise NotImplementedError("override the `pair` fixture: an open HostPair at baseline")

    @pytest.fixture
    def target(self, pair: HostPair) -> Configs:
        """Configurations the pair can apply, each differing from its host's baseline."""
        raise NotImplementedError("override the `target` fixture: (config A, config B)")

    @pytest.fixture
    def failing(self, pair: HostPair) -> Configs | None:
        """Configurations whose apply fails on one host only (None: the backend cannot fail,
        and the all-or-nothing tests are skipped)."""
        return None

    def observe(self, pair: HostPair) -> object:
        """The hosts' state below the interface, compared before/after a failed apply and a
        restore (e.g. the bytes of fake host trees). Default: nothing more than
        ``configuration()``."""
        return None

    # ------------------------------------------------------------------ the contract

    def test_apply_sets_each_host(self, pair: HostPair, target: Configs) -> None:
        assert not _holds(pair, target), "`target` must differ from the baseline"
        spent = pair.apply(target)
        assert isinstance(spent, float | int) and math.isfinite(spent) and spent >= 0
        assert _holds(pair, target)
        after, seen = _configs(pair), self.observe(pair)
        again = pair.apply(target)  # nothing differs: nothing changes
        assert math.isfinite(again) and again >= 0
        assert _configs(pair) == after and self.observe(pair) == seen

    def test_failed_apply_leaves_both_hosts(self, pair: HostPair, failing: Configs | None) -> None:
        if failing is None:
            pytest.skip("this backend has no apply that fails on one host")
        before, seen = _configs(pair), self.observe(pair)
        with pytest.raises(MuskuError) as err:
            pair.apply(failing)
        assert "\n" not in str(err.value), "a failed apply says why in one line"
        assert _configs(pair) == before
        assert self.observe(pair) == seen

    def test_failed_apply_after_apply_tells_the_truth(
        self, pair: HostPair, target: Configs, failing: Configs | None
    ) -> None:
        """After a failure the hosts are back where they were (at ``target``) or, if the
        backend rolls a failed experiment back to its baseline, both there; either way
        ``configuration()`` says which, and the state below the interface agrees."""
        if failing is None:
            pytest.skip("this backend has no apply that fails on one host")
        opened, opened_seen = _configs(pair), self.observe(pair)
        pair.apply(target)
        applied, applied_seen = _configs(pair), self.observe(pair)
        with pytest.raises(MuskuError):
            pair.apply(failing)
        now = _configs(pair), self.observe(pair)
        assert now in ((applied, applied_seen), (opened, opened_seen)), (
            "after a failed apply the pair reports "
            f"{[str(c) for c in now[0]]}, neither what was applied nor the baseline"
        )

    def test_restore_returns_to_the_originals(self, pair: HostPair, target: Configs) -> None:
        opened, seen = _configs(pair), self.observe(pair)
        pair.apply(target)
        pair.window(self.window_s)
        pair.restore()
        assert _configs(pair) == opened
        assert self.observe(pair) == seen
        pair.restore()  # twice is harmless
        assert _configs(pair) == opened

    def test_windows_equal_repeated_window(self, pair: HostPair, target: Configs) -> None:
        pair.apply(target)
        assert pair.windows(self.window_s, 0) == []
        batch = pair.windows(self.window_s, 3)
        single = [pair.window(self.window_s) for _ in range(3)]
        assert len(batch) == 3
        names = tuple(h.name for h in pair.hosts)
        keys: list[set[str]] = [set(), set()]
        for got in (batch, single):
            for ab in got:
                assert isinstance(ab, tuple) and len(ab) == 2
                for h, sample in enumerate(ab):
                    self._check_sample(sample, names[h])
                    keys[h] = keys[h] or set(sample.metrics)
                    assert set(sample.metrics) == keys[h], "metric names change between windows"
        for h in (0, 1):
            times = [ab[h].t for ab in batch + single]
            assert all(b > a for a, b in zip(times, times[1:], strict=False)), times

    def _check_sample(self, sample: Sample, host: str) -> None:
        assert isinstance(sample, Sample)
        assert sample.host == host
        assert math.isfinite(sample.t)
        eps = 1e-9 * self.window_s
        assert self.window_s - eps <= sample.duration <= self.window_s + self.duration_slack_s + eps

        assert isinstance(sample.metrics, Mapping) and sample.metrics
        for name, v in sample.metrics.items():
            assert isinstance(name, str) and isinstance(v, float | int), (name, v)
        assert isinstance(sample.valid, bool)

    def test_now_is_monotonic(self, pair: HostPair, target: Configs) -> None:
        seen = [pair.now()]
        assert math.isfinite(seen[0]) and seen[0] >= 0
        pair.apply(target)
        seen.append(pair.now())
        for n in (1, 2):
            start = pair.now()
            if n == 1:
                pair.window(self.window_s)
            else:
                pair.windows(self.window_s, n)
            seen.append(pair.now())
            assert seen[-1] - start >= n * self.window_s * (1 - 1e-9), "a window takes its time"
        pair.restore()
        seen.append(pair.now())
        assert all(b >= a for a, b in zip(seen, seen[1:], strict=False)), seen

    def test_describe(self, pair: HostPair) -> None:
        facts: Mapping[str, Any] = pair.describe()
        assert isinstance(facts, Mapping)
        hosts = facts["hosts"]
        assert list(hosts) == [h.name for h in pair.hosts]
        assert all(isinstance(n, str) and n for n in hosts) and hosts[0] != hosts[1]
        if self.backend is not None:
            assert facts.get("backend") == self.backend
        json.dumps(dict(facts))  # the results store keeps it as JSON
