"""Host backends: the sweep drives any of them through :class:`musku.hosts.base.HostPair`;
each backend is one registered :class:`musku.hosts.backend.Backend`."""

from musku.hosts.base import Host, HostPair

__all__ = ["Host", "HostPair"]
