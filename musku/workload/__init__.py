"""A real CPU/memory workload for local runs (until the C++ μSuite services are configured).

Random 8-byte reads over a large anonymous arena (``arena_mib``): with 4 KiB pages nearly every
access misses the TLB and walks the page table; with transparent huge pages (``thp=always``, or
``madvise`` with ``--madvise``) or with static huge pages (a ``MAP_HUGETLB`` region carved from
the reserved pool, when ``nr_hugepages`` > 0) the walks shrink. So its throughput (``ops``,
accesses per second) responds to the THP and SHP knobs the way a memory-bound service does.

The workload watches the THP mode and the huge page pool (through :class:`~musku.hostfs.HostFS`)
and rebuilds its arena when either changes, so a measurement window after a switch sees the new
setting rather than khugepaged's progress. It keeps a ``musku-stats/1`` stats file (see
:mod:`musku.metrics.service`): cumulative ``ops`` and ``requests`` (batches) and a cumulative
histogram of batch latencies.

Run: ``python -m musku.workload --stats /run/musku/workload.json --arena-mib 256``.
"""

from musku.workload.core import Workload, WorkloadOptions

__all__ = ["Workload", "WorkloadOptions"]
