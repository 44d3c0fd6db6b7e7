"""Simulated host pairs: a documented model file's response plus paper-like noise.

``SimModel`` (model files, docs/sim.md), ``SimPair`` (a :class:`musku.hosts.base.HostPair`
on a virtual clock) and ``open_pair`` (the ``sim`` backend factory).
"""

from musku.sim.model import METRICS, SimModel
from musku.sim.pair import SimPair, WindowArrays, open_pair

__all__ = ["METRICS", "SimModel", "SimPair", "WindowArrays", "open_pair"]
