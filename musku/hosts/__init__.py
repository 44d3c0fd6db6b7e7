"""Host backends: the sweep drives any of them through :class:`musku.hosts.base.HostPair`."""

from musku.hosts.base import BACKENDS, Host, HostPair

__all__ = ["BACKENDS", "Host", "HostPair"]
