"""``musku qsim curve -o curve.html`` in a real headless Chromium (Debian's chromium, driven as
tests/report/test_browser.py drives it): the page loads with no console error, exception or
fetch, its figure decodes at a readable size, and its table holds every rate with a status."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.qsim.conftest import MM1
from tests.report.browser import Chromium, find_chromium

ROOT = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.slow, pytest.mark.services]

CHECK = """
(async () => {
  const img = document.querySelector('figure#curve img');
  const ok = await img.decode().then(() => true, () => false);
  return {
    title: document.title,
    decoded: ok,
    width: img.naturalWidth,
    height: img.naturalHeight,
    header: [...document.querySelectorAll('#points th')].map(t => t.textContent),
    status: [...document.querySelectorAll('#points tbody tr')].map(r => r.lastChild.textContent),
    meta: document.querySelector('.meta').textContent,
    resources: performance.getEntriesByType('resource').length,
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


def test_curve_page_in_chromium(engine: str, chromium: str, tmp_path: Path) -> None:
    model = tmp_path / "mm1.toml"
    model.write_text(MM1.format(duration=0.4, qps=1000))
    page = tmp_path / "curve.html"
    p = subprocess.run(
        [sys.executable, "-m", "musku", "qsim", "curve", str(model), "--qps", "30000:150000:5",
         "-q", "-o", str(page)],
        capture_output=True, text=True, timeout=600, cwd=ROOT,
    )  # fmt: skip
    assert p.returncode == 0, p.stderr
    with Chromium(chromium) as browser:
        browser.open(page.resolve().as_uri())
        got = browser.evaluate(CHECK)
        errors = browser.errors()
        browser.screenshot(tmp_path / "curve.png", width=1000, height=1100)
    assert errors == [], errors
    assert got["title"] == f"musku qsim curve: {model}"
    assert got["decoded"] and got["width"] >= 500 and got["height"] >= 400, got
    assert got["header"][-1] == "status" and got["header"][0] == "offered (req/s)"
    assert got["status"] == ["stable", "stable", "stable", "saturated"]
    assert "saturated at 120000 req/s" in got["meta"]
    assert got["resources"] == 0  # self-contained: nothing fetched
    shot = (tmp_path / "curve.png").read_bytes()
    assert shot[:8] == b"\x89PNG\r\n\x1a\n" and len(shot) > 20_000
