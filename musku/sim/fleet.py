"""A simulated fleet: ``[hosts] fleet = N`` hosts of one model, paired (docs/fleet.md).

Each host ``h`` has a fixed bias ``b_h`` drawn from the seed exactly as a multi-arm group draws
its hosts' biases (:class:`musku.sim.group.SimGroup`: ``Normal(0, bias_sd)`` clipped to
+-5 %, ``bias_sd`` defaulting to the model's ``|host_bias|``), so a pool and a group of the same
seed and size have the same hosts. Hosts ``2p`` and ``2p + 1`` form pair ``p`` (an odd
fleet's last host idles). Pair ``p`` is a :class:`musku.sim.pair.SimPair` whose relative bias
is ``(1 + b_{2p+1}) / (1 + b_{2p}) - 1`` and whose noise and live load (the model's partial
sharing between the pair's two hosts: ``host_correlation``, ``sensitivity_spread``,
``share_sigma``) come from a seed derived from the sweep's seed and ``p``: pairs behind
different load balancers, independent of each other and of the order they run in.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from musku.hosts.pool import HostPool, derive_seed, form_pairs
from musku.sim.group import SimGroup
from musku.sim.pair import SimPair, pair_setup

if TYPE_CHECKING:
    from musku.experiment import Experiment


def host_names(n: int) -> list[str]:
    width = max(3, len(str(n - 1)))
    return [f"sim-{i:0{width}d}" for i in range(n)]


def fleet_biases(model: object, n: int, seed: int, bias_sd: float | None) -> list[float]:
    """Each host's relative bias: the multi-arm group's draw (one distribution for both)."""
    group = SimGroup(model, n, seed=seed, bias_sd=bias_sd)  # type: ignore[arg-type]
    return [float(b) for b in group.bias]


def open_fleet(experiment: Experiment, seed: int = 0) -> HostPool:
    """The experiment's ``fleet`` as a pool of simulated pairs (no fleet: one pair)."""
    setup = pair_setup(experiment)
    n = setup.options.fleet
    if n is None:
        return HostPool([setup.pair(seed)], [(0, 1)], ["sim-a", "sim-b"])
    names = host_names(n)
    biases = fleet_biases(setup.model, n, seed, setup.options.bias_sd)
    groups, _idle = form_pairs(names)
    pairs: list[SimPair] = []
    for p, (i, j) in enumerate(groups):
        rel = (1.0 + biases[j]) / (1.0 + biases[i]) - 1.0
        pairs.append(setup.pair(derive_seed(seed, "pair", p), rel, (names[i], names[j])))
    return HostPool(pairs, groups, names, biases=biases)
