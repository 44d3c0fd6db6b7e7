"""Static huge pages: the persistent huge page pool (``nr_hugepages``).

The value is the number of pages of the configured size (option ``page_size``: ``"2M"``, the
default, or ``"1G"`` where ``hugepages-1048576kB`` exists). The kernel may grant fewer pages
than asked (fragmented or insufficient memory): ``apply`` reads the pool back and raises
:class:`~musku.knobs.base.Shortfall` carrying the number actually granted; the host is then at
that number (roll back, or accept it). Values needing more memory than ``MemTotal`` are refused
before anything is written.
"""

from __future__ import annotations

from musku.domain import Value
from musku.hostfs import HUGEPAGES_DIR
from musku.knob_spec import Kind, KnobSpec
from musku.knobs.base import InvalidSetting, KnobBase, Shortfall, Snapshot, Support, Write
from musku.knobs.helpers import opt_str

PAGE_SIZES_KB = {"2M": 2048, "1G": 1048576}


MAX_SHP = 1 << 24
"""Most static huge pages a setting may reserve."""
READ_TRIES = 20
"""Reads of the pool's two counters before taking a moving pair as it is (pages being freed)."""

SPEC = KnobSpec(
    name="shp",
    fake_kernel="musku.testing.kernel.shp:RULES",
    kind=Kind.COUNT,
    order=70,
    description="static 2 MiB huge pages reserved, 0 = none",
    high=MAX_SHP,
    service_flag="uses_shp",
)


class ShpKnob(KnobBase):
    name = "shp"
    spec = SPEC

    @property
    def page_kb(self) -> int:
        size = opt_str(self.options, "page_size", "2M")
        if size not in PAGE_SIZES_KB:
            raise InvalidSetting(f"shp: page_size must be one of {', '.join(PAGE_SIZES_KB)}")
        return PAGE_SIZES_KB[size]

    @property
    def pool(self) -> str:
        return f"{HUGEPAGES_DIR}/hugepages-{self.page_kb}kB/nr_hugepages"

    def probe(self) -> Support:
        if not self.fs.exists(HUGEPAGES_DIR):
            return Support(False, "no hugetlbfs support (kernel built without CONFIG_HUGETLBFS)")
        if not self.fs.exists(self.pool):
            sizes = [d.removeprefix("hugepages-") for d in self.fs.listdir(HUGEPAGES_DIR)]
            return Support(
                False, f"no {self.page_kb} kB huge pages on this host (has {', '.join(sizes)})"
            )
        return Support(
            True,
            backend="sysfs",
            details={"page_kb": self.page_kb, "max_pages": self.max_pages(), "pool": self.pool},
            settings_range=(0, self.max_pages()),
        )

    def max_pages(self) -> int:
        total_kb = self.fs.meminfo().get("MemTotal", 0)
        return total_kb // self.page_kb

    def read(self) -> Value:
        """The persistent pool: ``nr_hugepages`` less ``surplus_hugepages``. Shrinking the pool
        below the pages a process still maps turns those into surplus pages, counted in
        ``nr_hugepages`` until the process lets them go; the pool itself is at the new size.

        The two counters are two files the kernel changes together as each surplus page is
        freed; read one after the other, a free can fall between them (surplus 64 read, then
        ``nr_hugepages`` 0: a pool of -64, seen on a real switchback). So ``nr_hugepages`` is
        read before and after the surplus, again until it did not move; never below 0."""
        surplus_file = self.pool.replace("/nr_hugepages", "/surplus_hugepages")
        if not self.fs.exists(surplus_file):
            return self.fs.read_int(self.pool)
        nr = self.fs.read_int(self.pool)
        surplus = 0
        for _ in range(READ_TRIES):
            surplus = self.fs.read_int(surplus_file)
            again = self.fs.read_int(self.pool)
            if again == nr:
                break
            nr = again
        return max(0, nr - surplus)

    def validate(self, value: Value) -> Value:
        if isinstance(value, bool) or not isinstance(value, int):
            raise InvalidSetting(f"shp: takes a page count, not {value!r}")
        if value < 0:
            raise InvalidSetting(f"shp: page count must be >= 0, not {value}")
        limit = self.max_pages()
        if value > limit:
            raise InvalidSetting(
                f"shp: {value} pages of {self.page_kb} kB exceed this host's memory "
                f"(at most {limit})"
            )
        return value

    def plan(self, value: Value) -> list[Write]:
        if self.read() == value:
            return []
        return [Write(self.pool, str(value).encode())]

    def snapshot(self) -> Snapshot:
        """The persistent pool as the kernel prints it: while surplus pages are still mapped,
        the raw ``nr_hugepages`` counts them too, and writing that back would make them
        persistent."""
        return Snapshot(self.name, ((self.pool, f"{self.read()}\n".encode()),))

    def apply(self, value: Value, *, dry_run: bool = False) -> list[Write]:
        writes = super().apply(value, dry_run=dry_run)
        if not dry_run and writes:
            granted = self.read()
            if granted != value:
                raise Shortfall(
                    f"shp: asked for {value} huge pages of {self.page_kb} kB, "
                    f"the kernel granted {granted}",
                    requested=value,
                    granted=granted,
                )
        return writes
