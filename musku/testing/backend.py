"""The :class:`~musku.hosts.backend.Backend` contract: one suite every host backend passes,
built-in or out of tree (the pair it opens passes :class:`~musku.testing.hostpair.HostPairContract`
on its own).

Subclass :class:`BackendContract` in a test module and give it two fixtures::

    from musku.testing.backend import BackendContract

    class TestMyBackend(BackendContract):
        name = "mine"  # as registered (or "package.module:attr")

        @pytest.fixture
        def experiment(self, tmp_path):  # an Experiment whose [hosts] names the backend
            return load_experiment(write_experiment(tmp_path))

        @pytest.fixture
        def configs(self, experiment):  # configurations its hosts can take
            return [experiment.baseline_config]

Set ``opens = False`` when the hosts cannot be opened here (the suite then checks the
registration, the options model, the capabilities, the planner's answers and the refusals).

What it checks:

- the name resolves through :data:`musku.registry.BACKENDS` to the object, whose ``name`` it
  is, with every method of :data:`musku.hosts.backend.REQUIRED` and boolean capabilities;
- its options model (if any) is a :class:`~musku.schema.hosts.HostOptions` whose ``BACKEND``
  is the name, prints as a JSON Schema, and accepts the experiment's ``[hosts]``;
- ``check_files`` accepts the experiment; ``prior`` is None or a finite positive noise;
  ``window_s`` is at least the sample interval; ``check`` answers
  ``{"backend": name, "ok": bool, "hosts": [...]}`` and is JSON-serialisable;
- ``pool_names`` is None or two or more distinct names, and ``pools`` says it can have them;
- without ``groups`` / ``deploys``, ``open_group`` / ``open_fleet`` refuse with one line
  (:class:`~musku.errors.InputError`, exit 3), never something else;
- (``opens``) ``open_pair`` gives a :class:`~musku.hosts.base.HostPair` of two named hosts;
  ``open_pool`` a pool whose pairs are the pool's names paired in order; with ``deploys``,
  ``open_fleet`` a :class:`~musku.hosts.backend.Fleet` naming the pool's hosts.
"""

from __future__ import annotations

import json
import math
from typing import Any

import pytest

from musku.domain import Configuration
from musku.errors import InputError
from musku.hosts.backend import REQUIRED, Backend, Fleet, Prior, backend_of
from musku.hosts.base import HostPair
from musku.hosts.pool import HostPool, Unreachable
from musku.registry import BACKENDS, CAPABILITIES
from musku.schema import json_schema
from musku.schema.hosts import HostOptions, parse_options


class BackendContract:
    """Override :attr:`name` and the ``experiment`` and ``configs`` fixtures."""

    name: str = ""
    opens: bool = True
    seed: int = 3

    @pytest.fixture
    def experiment(self) -> Any:
        raise NotImplementedError("give an experiment whose [hosts] names the backend")

    @pytest.fixture
    def configs(self, experiment: Any) -> list[Configuration]:
        return [experiment.baseline_config]

    @pytest.fixture
    def backend(self, experiment: Any) -> Backend:
        got = BACKENDS.get(self.name)
        assert backend_of(experiment) is got, "the experiment names another backend"
        return backend_of(experiment)

    # ------------------------------------------------------------------ registration

    def test_registered_under_its_name(self, backend: Backend) -> None:
        assert isinstance(backend.name, str) and backend.name and ":" not in backend.name
        assert BACKENDS.get(backend.name) is backend
        assert backend.name in BACKENDS.names()
        for method in REQUIRED:
            assert callable(getattr(backend, method)), method
        for cap in CAPABILITIES:
            assert isinstance(getattr(backend, cap), bool), cap

    def test_options_model(self, backend: Backend, experiment: Any) -> None:
        model = backend.options
        if model is None:
            return
        assert issubclass(model, HostOptions) and backend.name == model.BACKEND
        schema = json_schema(f"hosts-{backend.name}")
        assert schema["type"] == "object"
        json.dumps(schema)
        opts = parse_options(model, experiment.hosts.options, str(experiment.path))
        assert opts.backend == backend.name
        with pytest.raises(InputError):
            parse_options(model, {**experiment.hosts.options, "no_such_option_": 1})

    # ------------------------------------------------------------------ planning

    def test_plans_without_opening(
        self, backend: Backend, experiment: Any, configs: list[Configuration]
    ) -> None:
        backend.check_files(experiment)
        prior = backend.prior(experiment)
        if prior is not None:
            assert isinstance(prior, Prior)
            assert math.isfinite(prior.noise_sd) and prior.noise_sd > 0 and prior.noise_source
            for s in (prior.apply_s, prior.reboot_s):
                assert s is None or (math.isfinite(s) and s >= 0)
        interval = float(experiment.stats.sample_interval_s)
        assert backend.window_s(experiment, interval) >= interval
        names = backend.pool_names(experiment)
        if names is not None:
            assert backend.pools and len(names) >= 2 and len(set(names)) == len(names)

    def test_dry_run_check(
        self, backend: Backend, experiment: Any, configs: list[Configuration]
    ) -> None:
        got = backend.check(experiment, configs)
        json.dumps(got)
        assert got["backend"] == backend.name
        assert isinstance(got["ok"], bool) and isinstance(got["hosts"], list)
        for row in got["hosts"]:
            assert isinstance(row["name"], str) and isinstance(row["ok"], bool)
        if not got["ok"]:
            assert got.get("error") or any(not r["ok"] for r in got["hosts"])

    def test_what_it_cannot_do_is_one_line(self, backend: Backend, experiment: Any) -> None:
        if not backend.deploys:
            with pytest.raises(InputError):
                backend.open_fleet(experiment, seed=self.seed, state={})
        if not backend.groups:
            pool = HostPool([Unreachable("a", "b")], [(0, 1)], ["a", "b"])
            with pytest.raises(InputError):
                backend.open_group(experiment, pool, self.seed)

    # ------------------------------------------------------------------ opening

    def test_open_pair_and_pool(self, backend: Backend, experiment: Any) -> None:
        if not self.opens:
            pytest.skip("the hosts cannot be opened here")
        pair = backend.open_pair(experiment, seed=self.seed)
        try:
            assert isinstance(pair, HostPair) and len(pair.hosts) == 2
            assert all(isinstance(h.name, str) and h.name for h in pair.hosts)
            json.dumps(dict(pair.describe()))
        finally:
            pair.close()
        pool = backend.open_pool(experiment, seed=self.seed)
        try:
            assert isinstance(pool, HostPool) and len(pool) >= 1
            names = backend.pool_names(experiment)
            if names is None:
                assert len(pool) == 1
            else:
                assert pool.names == names and len(pool) == len(names) // 2
                assert pool.groups == [(i, i + 1) for i in range(0, len(names) - 1, 2)]
        finally:
            pool.close()

    def test_open_fleet(self, backend: Backend, experiment: Any) -> None:
        if not (self.opens and backend.deploys):
            pytest.skip("no fleet here")
        fleet = backend.open_fleet(experiment, seed=self.seed, state={})
        try:
            assert isinstance(fleet, Fleet) and len(fleet.names) >= 2
            names = backend.pool_names(experiment)
            if names is not None:
                assert fleet.names == names
        finally:
            fleet.close()


__all__ = ["BackendContract"]
