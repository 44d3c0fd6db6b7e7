"""The report of the shipped Web/Skylake sweep (experiments/web-skylake.toml on simulated
hosts) in a real headless Chromium: it loads without console errors or exceptions, with every
knob's figure decoded, the soft SKU and host-time figures, and every comparison's figure."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from musku import __version__
from musku.report import data as report_data
from musku.report.html import write_report
from musku.storage import open_store

from .browser import Chromium, find_chromium

pytestmark = pytest.mark.slow

KNOBS = ["core_freq", "uncore_freq", "core_count", "cdp", "prefetch", "thp", "shp"]

CHECK = """
(async () => {
  for (const d of document.querySelectorAll('details')) d.open = true;
  const imgs = [...document.images];
  for (const i of imgs) i.loading = 'eager';
  const decoded = await Promise.all(imgs.map(i => i.decode().then(() => true, () => false)));
  return {
    title: document.title,
    knobs: [...document.querySelectorAll('figure.knob')].map(f => ({
      knob: f.dataset.knob,
      width: f.querySelector('img').naturalWidth,
      height: f.querySelector('img').naturalHeight,
    })),
    images: imgs.length,
    broken: imgs.filter((i, k) => !decoded[k] || i.naturalWidth === 0).map(i => i.alt),
    comparisons: document.querySelectorAll('details.cmp figure.comparison img').length,
    softsku: !!document.querySelector('#fig-softsku img'),
    hostTime: !!document.querySelector('#fig-host-time img'),
  };
})()
"""


@pytest.fixture(scope="module")
def chromium() -> str:
    exe = find_chromium()
    if exe is None:
        if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
            pytest.fail("CI=true but chromium is missing (scripts/setup installs it)")
        pytest.skip("chromium not installed (apt-get install chromium)")
    return exe


def test_web_skylake_report_in_chromium(web_db: str, chromium: str, tmp_path: Path) -> None:
    with open_store(web_db) as store:
        data = report_data.load(store, "web-skylake")
    out = write_report([data], tmp_path / "report.html", version=__version__)
    n_series = len(data.series)
    with Chromium(chromium) as browser:
        browser.open(out.resolve().as_uri())
        got = browser.evaluate(CHECK)
        errors = browser.errors()
        browser.screenshot(tmp_path / "report.png")
    assert errors == [], errors
    assert got["title"].startswith("musku report: web-skylake")
    assert [k["knob"] for k in got["knobs"]] == KNOBS
    assert all(k["width"] > 300 and k["height"] > 150 for k in got["knobs"]), got["knobs"]
    assert got["broken"] == []
    assert got["softsku"] and got["hostTime"]
    assert got["comparisons"] == n_series == len(data.comparisons) >= 30
    shot = (tmp_path / "report.png").read_bytes()
    assert shot[:8] == b"\x89PNG\r\n\x1a\n" and len(shot) > 20_000
