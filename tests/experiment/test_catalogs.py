"""Platform catalogs in knobs/: the SoftSKU paper's Table 1 platforms, an AMD server, this VM."""

from __future__ import annotations

from pathlib import Path

import pytest

from musku.domain import KNOBS, Configuration
from musku.errors import InputError
from musku.experiment import available_platforms, load_platform


@pytest.mark.parametrize(
    ("name", "cores", "ways"),
    [("skylake18", 18, 11), ("skylake20", 20, 11), ("broadwell16", 16, 12)],
)
def test_paper_platforms_match_table_1(name: str, cores: int, ways: int) -> None:
    p = load_platform(name)
    assert (p.cores, p.llc_ways, p.vendor) == (cores, ways, "intel")
    assert set(p.settings) == set(KNOBS)
    # CDP splits run from {1 data, N-1 code} to {N-1 data, 1 code}, plus off
    assert p.settings["cdp"][0] == "off"
    assert p.settings["cdp"][1] == f"1:{ways - 1}"
    assert p.settings["cdp"][-1] == f"{ways - 1}:1"
    assert len(p.settings["cdp"]) == ways
    assert max(p.settings["core_count"]) == cores
    assert set(p.settings["prefetch"]) == {"all_on", "all_off", "dcu_dcuip", "dcu", "l2hw_dcu"}
    # stock: max frequencies, all cores, no CDP, prefetchers on, THP always, no SHP
    assert p.stock == Configuration.of(
        core_freq=max(p.settings["core_freq"]),
        uncore_freq=max(p.settings["uncore_freq"]),
        core_count=cores,
        cdp="off",
        prefetch="all_on",
        thp="always",
        shp=0,
    )
    assert p.reboot_knobs == {"core_count"}


def test_amd_and_vm_catalogs() -> None:
    amd = load_platform("zen3-epyc64")
    assert amd.vendor == "amd" and "cdp" not in amd.settings
    vm = load_platform("firecracker-vm")
    assert set(vm.settings) == {"core_count", "thp", "shp", "swappiness"}  # + a sysfs line
    assert vm.reboot_knobs == frozenset()  # live core count on the VM
    assert {"skylake18", "skylake20", "broadwell16", "zen3-epyc64", "firecracker-vm"} <= set(
        available_platforms()
    )


def test_unknown_platform_lists_the_known_ones() -> None:
    with pytest.raises(InputError, match="unknown platform 'nehalem4'.*skylake18"):
        load_platform("nehalem4")


def _catalog(tmp_path: Path, body: str) -> Path:
    p = tmp_path / "x.toml"
    p.write_text(body)
    return p


BASE = """
[platform]
name = "x"
cores = 4
llc_ways = 4
[knobs.thp]
settings = ["always", "madvise", "never"]
[stock]
thp = "always"
"""


def test_catalog_errors_name_file_and_line(tmp_path: Path) -> None:
    ok = load_platform(_catalog(tmp_path, BASE))
    assert ok.settings["thp"] == ("always", "madvise", "never")
    with pytest.raises(InputError) as e:
        load_platform(_catalog(tmp_path, BASE.replace("[knobs.thp]", "[knobs.turbo_boost]")))
    assert "unknown knob 'turbo_boost'" in str(e.value) and "x.toml:6" in str(e.value)
    with pytest.raises(InputError, match=r"x.toml:9: \[stock\] thp = 'sometimes' is not in"):
        load_platform(_catalog(tmp_path, BASE.replace('thp = "always"', 'thp = "sometimes"')))
    with pytest.raises(InputError, match="lists a setting twice"):
        load_platform(_catalog(tmp_path, BASE.replace('"never"]', '"never", "never"]')))
