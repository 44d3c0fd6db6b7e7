"""Contract suites for plugin and backend authors, run with pytest (docs/testing.md).

- :mod:`musku.testing.knobs`: :class:`~musku.testing.knobs.KnobContract`, the knob contract
  on fake host trees built with :mod:`musku.testing.fakehost` (kernel rules faked at the
  interface; MSR devices are sparse files);
- :mod:`musku.testing.storage`: :class:`~musku.testing.storage.StorageContract`, the results
  store contract, on SQLite and on a real throwaway PostgreSQL
  (:mod:`musku.testing.postgres`, a pytest plugin);
- :mod:`musku.testing.hostpair`: :class:`~musku.testing.hostpair.HostPairContract`, the
  host-backend contract (all-or-nothing apply, restore, windows, now, describe).
- :mod:`musku.testing.samplers`: :class:`~musku.testing.samplers.SamplerContract`, the
  metric-sampler contract (typed probe, "not supported here" as a typed refusal, a real agent
  spooling its figures, finite samples, restart).

Each suite is a class: subclass it in a test module and override its factory fixture. The
modules import pytest; nothing else in musku imports them.
"""
