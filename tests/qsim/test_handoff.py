"""A batching stage's `handoff` (docs/qsim.md "Queue kinds"): μqSim's order for a finished batch's
jobs at the next stage, through the model file and the real engine, on a model whose latencies
follow from the order alone."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from musku.errors import InputError
from musku.qsim.engine import simulate
from musku.qsim.model import load

ROOT = Path(__file__).resolve().parents[2]

# Four closed-loop users, no think time, one thread: an epoll stage (1 us) then a processing
# stage (10 us). A thread drains its later stage first, so a user whose request finishes the
# last of a batch comes back just as the next batch is taken: each cycle (31 us) serves the
# three others, and the mean is 4 x 31 / 3 us (Little). In batch order they are served in
# arrival order: the one that waited a whole cycle 42 us, the others 41 us. In μqSim's order a
# batch [a, b, c] is served a, c, b: 42, 31 and 51 us (worked through in qsim_test.cc).
MODEL = """\
[run]
duration_s = 0.02
warmup_s = 0.001

[[machines]]
name = "m"
cores = 1

[[services]]
name = "web"
execution = "simple"
connections = 4

  [[services.stages]]
  name = "poll"
  queue = "epoll"
  {handoff}
  time = {{ dist = "const", mean_us = 1 }}

  [[services.stages]]
  name = "work"
  time = {{ dist = "const", mean_us = 10 }}

[[paths]]
  [[paths.nodes]]
  name = "only"
  service = "web"

[client]
kind = "closed"
users = 4
think_us = 0
connections = 4
"""


@pytest.mark.services
@pytest.mark.parametrize(
    ("line", "worst_us", "p90_us"),
    [("", 42.0, 42.0), ('handoff = "in_order"', 42.0, 42.0), ('handoff = "uqsim"', 51.0, 51.0)],
)
def test_handoff_order_sets_the_tail_not_the_mean(
    engine: str, tmp_path: Path, line: str, worst_us: float, p90_us: float
) -> None:
    path = tmp_path / "m.toml"
    path.write_text(MODEL.format(handoff=line))
    lat = simulate(load(path).engine)["latency"]
    assert lat["mean_us"] == pytest.approx(4 * 31 / 3, abs=0.1)
    assert lat["max_us"] == pytest.approx(worst_us, abs=0.1)
    assert lat["p90_us"] == pytest.approx(p90_us, abs=0.1)


def test_unknown_handoff_is_refused_with_its_line(tmp_path: Path) -> None:
    path = tmp_path / "m.toml"
    path.write_text(MODEL.format(handoff='handoff = "lifo"'))
    with pytest.raises(InputError) as ei:
        load(path)
    assert ei.value.where is not None and ei.value.where.endswith("m.toml:17")  # the handoff line
    p = subprocess.run([sys.executable, "-m", "musku", "qsim", "check", str(path)],
                       capture_output=True, text=True, timeout=120, cwd=ROOT)  # fmt: skip
    assert p.returncode == 3
    assert "handoff" in p.stderr and "Traceback" not in p.stderr
