"""Model files: typed validation with file:line errors, graph checks, normalisation."""

from __future__ import annotations

from pathlib import Path

import pytest

from musku.errors import InputError
from musku.qsim.model import load, read_histogram, with_overrides
from musku.schema.tomlpos import Positions
from tests.qsim.conftest import MM1

ROOT = Path(__file__).resolve().parents[2]

FANOUT = """\
[[machines]]
name = "m"
cores = 8
irq_cores = 2

[[services]]
name = "front"
threads = 2
  [[services.stages]]
  name = "split"
  time = { dist = "const", mean_us = 5 }
  [[services.stages]]
  name = "merge"
  time = { dist = "const", mean_us = 3 }

[[services]]
name = "leaf"
execution = "simple"
instances = 4
  [[services.stages]]
  name = "work"
  time = { dist = "exp", mean_us = 100 }

[[paths]]
  [[paths.nodes]]
  name = "a"
  service = "front"
  stages = ["split"]
  children = ["b"]
  [[paths.nodes]]
  name = "b"
  service = "leaf"
  copies = 4
  children = ["c"]
  [[paths.nodes]]
  name = "c"
  service = "front"
  stages = ["merge"]
  gather = true

[client]
qps = 100
"""


NAME_C = 'name = "c"'


def write(tmp_path: Path, text: str, name: str = "m.toml") -> Path:
    p = tmp_path / name
    p.write_text(text)
    return p


def error_of(path: Path) -> InputError:
    with pytest.raises(InputError) as ei:
        load(path)
    return ei.value


def line_of(text: str, needle: str, nth: int = 1) -> int:
    hits = [i for i, ln in enumerate(text.splitlines(), start=1) if needle in ln]
    return hits[nth - 1]


def test_shipped_example_loads() -> None:
    loaded = load(ROOT / "experiments" / "qsim" / "2tier.toml")
    doc = loaded.engine
    assert [s["name"] for s in doc["services"]] == ["nginx", "memcached"]
    # interrupt cores are kept free: nginx's 8 threads get cores 2..9 of the front machine
    assert doc["services"][0]["instances"][0]["cores"] == list(range(2, 10))
    nodes = doc["paths"][0]["nodes"]
    assert [n["service"] for n in nodes] == [0, 1, 0]
    assert nodes[2]["stages"] == [0, 1]


def test_fanout_normalised(tmp_path: Path) -> None:
    doc = load(write(tmp_path, FANOUT)).engine
    a, b, c = doc["paths"][0]["nodes"]
    assert (a["children"], b["copies"], b["children"]) == ([1], 4, [2])
    assert c["join"] == 4 and c["stages"] == [1]
    assert doc["services"][0]["instances"][0]["cores"] == [2, 3]


def test_topological_order_any_listing(tmp_path: Path) -> None:
    text = FANOUT.replace('  [[paths.nodes]]\n  name = "a"', '  [[paths.nodes]]\n  name = "a"', 1)
    # list the fan-in first: the normaliser sorts nodes from the root
    parts = text.split("  [[paths.nodes]]\n")
    reordered = parts[0] + "  [[paths.nodes]]\n" + parts[3].split("\n[client]")[0] + "\n"
    reordered += "  [[paths.nodes]]\n" + parts[1] + "  [[paths.nodes]]\n" + parts[2]
    reordered += "\n[client]" + parts[3].split("\n[client]")[1]
    doc = load(write(tmp_path, reordered)).engine
    assert [n["copies"] for n in doc["paths"][0]["nodes"]] == [1, 4, 1]


@pytest.mark.parametrize(
    ("old", "new", "needle", "message"),
    [
        ("cores = 8", "cores = 0", "cores = 0", "greater than or equal to 1"),
        ("qps = 100", "qps = -5", "qps = -5", "greater than 0"),
        ("mean_us = 100 }", "mean_us = 0, sigma = -1 }", "sigma = -1", "greater than 0"),
        (
            'service = "leaf"',
            'service = "leaves"',
            'service = "leaves"',
            "unknown service 'leaves'",
        ),
        ('stages = ["merge"]', 'stages = ["mix"]', 'stages = ["mix"]', "has no stage 'mix'"),
        ('children = ["c"]', 'children = ["a"]', 'name = "a"', "cycle"),
        ('children = ["c"]', 'children = ["z"]', 'children = ["z"]', "unknown child node 'z'"),
        ('dist = "exp"', 'dist = "weibull"', 'dist = "weibull"', "'exp', 'const'"),
        ("threads = 2", "threads = 7", "threads = 7", "wants 7 cores"),
        ("gather = true", "gather = true\ncolour = 1", "colour = 1", "unknown key 'colour'"),
    ],
)
def test_bad_input_has_file_and_line(
    tmp_path: Path, old: str, new: str, needle: str, message: str
) -> None:
    assert old in FANOUT
    text = FANOUT.replace(old, new, 1)
    path = write(tmp_path, text)
    e = error_of(path)
    assert message in e.message, e.one_line()
    assert e.where == f"{path}:{line_of(text, needle)}", e.one_line()


def test_cycle_without_root(tmp_path: Path) -> None:
    text = FANOUT.replace(
        '  name = "c"\n  service = "front"', '  name = "c"\n  service = "front"\n  children = ["a"]'
    )
    text = text.replace("gather = true", "")
    e = error_of(write(tmp_path, text))
    assert "no root node" in e.message and "cycle" in e.message


def test_fan_in_that_can_never_complete(tmp_path: Path) -> None:
    text = FANOUT.replace(
        '  stages = ["split"]\n  children = ["b"]',
        '  stages = ["split"]\n  children = ["b", "c"]\n  branch = "one"\n  child_weights = [1, 1]',
    )
    path = write(tmp_path, text)
    e = error_of(path)
    assert "fan-in 'c' can never complete" in e.message
    assert e.where == f"{path}:{line_of(text, NAME_C)}"


def test_histogram_files(tmp_path: Path) -> None:
    (tmp_path / "ok.csv").write_text("# value_us,weight\n5,3\n25,1\n\n")
    assert read_histogram(tmp_path / "ok.csv") == [(5.0, 3.0), (25.0, 1.0)]
    text = FANOUT.replace(
        '{ dist = "exp", mean_us = 100 }', '{ dist = "empirical", file = "h.csv" }'
    )
    (tmp_path / "h.csv").write_text("5,1\n25,1\n")
    doc = load(write(tmp_path, text)).engine
    assert doc["services"][1]["stages"][0]["mean_us"] == 15.0
    (tmp_path / "h.csv").write_text("5,1\nfive,2\n")
    e = error_of(write(tmp_path, text))
    assert "h.csv:2" in e.message and e.where == f"{tmp_path / 'm.toml'}:{line_of(text, 'h.csv')}"
    (tmp_path / "h.csv").write_text("# nothing\n")
    assert "empty histogram" in error_of(write(tmp_path, text)).message
    (tmp_path / "h.csv").unlink()
    assert "cannot read histogram" in error_of(write(tmp_path, text)).message


def test_toml_syntax_error_line(tmp_path: Path) -> None:
    text = MM1.format(duration=1, qps=10).replace("cores = 1", "cores = = 1")
    path = write(tmp_path, text)
    assert error_of(path).where == f"{path}:{line_of(text, 'cores = = 1')}"


def test_positions_arrays_of_tables() -> None:
    pos = Positions(FANOUT)
    assert pos.line(("services", 1, "stages", 0, "time", "mean_us")) == line_of(
        FANOUT, "mean_us = 100"
    )
    assert pos.line(("paths", 0, "nodes", 2, "gather")) == line_of(FANOUT, "gather")
    assert pos.line(("client", "qps")) == line_of(FANOUT, "qps = 100")


def test_overrides(tmp_path: Path) -> None:
    doc = load(write(tmp_path, MM1.format(duration=2, qps=10))).engine
    out = with_overrides(doc, qps=500, duration_s=4, seed=9)
    assert out["client"]["epochs"] == [{"end_s": 8, "qps": 500}]
    assert (out["duration_s"], out["seed"]) == (4, 9)
    assert doc["client"]["epochs"][0]["qps"] == 10  # the original is unchanged
    with pytest.raises(InputError):
        with_overrides(doc, qps=0)
