"""The experiment file's ``[threading]`` table and the sim model's ``[threading]``: parsed with
their defaults; every bad input is one line naming file:line (exit code 3 from the CLI)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from musku.cotune_spec import DEFAULT_LOADS, MODELS
from musku.errors import InputError
from musku.experiment import load_experiment
from musku.sim import SimModel
from musku.sweep import open_pair

ROOT = Path(__file__).resolve().parents[2]
SIM_MODEL = ROOT / "experiments" / "sim" / "midtier-skylake18.toml"

BASE = f"""\
[experiment]
name = "t"

[service]
name = "setalgebra"
knobs = ["core_count", "thp"]

[platform]
catalog = "skylake18"

[platform.settings]
core_count = [10, 12, 14, 16, 18]

[hosts]
backend = "sim"
model = "{SIM_MODEL}"
"""


def write(tmp: Path, threading: str, base: str = BASE) -> Path:
    p = tmp / "exp.toml"
    p.write_text(base + "\n[threading]\n" + threading)
    return p


def line_of(path: Path, needle: str) -> int:
    return next(i for i, ln in enumerate(path.read_text().splitlines(), 1) if needle in ln)


def test_defaults_and_cotune_switch(tmp_path: Path) -> None:
    exp = load_experiment(write(tmp_path, "cotune = true\n"))
    assert exp.cotune is not None
    assert exp.cotune.service == "setalgebra" and exp.cotune.loads == DEFAULT_LOADS
    assert exp.cotune.models == MODELS and exp.cotune.workers == (1, 2)
    off = load_experiment(write(tmp_path, 'loads = [50, 500]\nservice = "sa"\n'))
    assert off.threading is not None and off.cotune is None  # parsed, but off
    assert off.threading.spec.loads == (50.0, 500.0) and off.threading.spec.service == "sa"
    assert load_experiment(write(tmp_path, "")).cotune is None  # an empty [threading]


@pytest.mark.parametrize(
    ("body", "bad_line", "match"),
    [
        ('cotune = true\nmodels = ["async-dispatch-spin"]\n', "models", "unknown threading model"),
        ("cotune = true\nworkers = [0, 2]\n", "workers", r"workers must be .* 1\.\.64"),
        ("cotune = true\nworkers = [100]\n", "workers", r"workers must be .* 1\.\.64"),
        ("cotune = true\nworkers = [1.5]\n", "workers", "workers must be a list of integers"),
        ("cotune = true\nloads = []\n", "loads", "loads must be a non-empty"),
        ("cotune = true\nloads = [100, -5]\n", "loads", "positive QPS"),
        ('cotune = "yes"\n', "cotune", "cotune must be bool"),
        ("cotune = true\nturbo = 1\n", "turbo", "unknown key 'turbo'"),
        ("cotune = true\nduration_s = 0\n", "duration_s", "duration_s must be > 0"),
        ('cotune = true\nadmin = "midtier"\n', "admin", "admin must be 'host:port'"),
        ('admin = "h:1"\nadmin_port_file = "/p"\n', "admin_port_file", "not both"),
        ('service = ""\n', "service", "must not be empty"),
    ],
)
def test_bad_threading_tables_are_one_line_with_file_and_line(
    tmp_path: Path, body: str, bad_line: str, match: str
) -> None:
    path = write(tmp_path, body)
    with pytest.raises(InputError, match=match) as exc:
        load_experiment(path)
    msg = exc.value.one_line()
    assert "\n" not in msg
    assert msg.startswith(f"{path}:{line_of(path, bad_line + ' =')}: [threading]"), msg


def test_real_hosts_need_the_midtier_admin_address(tmp_path: Path) -> None:
    base = BASE.replace('backend = "sim"', 'backend = "agent"\nhosts = ["a", "b"]')
    base = base.replace(f'model = "{SIM_MODEL}"\n', "")
    path = write(tmp_path, "cotune = true\n", base)
    with pytest.raises(InputError, match="needs admin") as exc:
        load_experiment(path)
    assert exc.value.where == f"{path}:{line_of(path, 'cotune =')}"
    ok = write(tmp_path, 'cotune = true\nadmin_port_file = "/run/sa/midtier.port"\n', base)
    assert load_experiment(ok).cotune.admin_port_file == "/run/sa/midtier.port"  # type: ignore[union-attr]
    # or each agent host names its own mid-tier in [hosts] (both must)
    one = 'hosts = [{name = "a", host = "a", midtier_admin = "10.0.0.1:50051"}, "b"]'
    both = 'hosts = [{name = "a", host = "a", midtier_admin = "10.0.0.1:50051"}, ' \
           '{name = "b", host = "b", midtier_admin_port_file = "/run/sa/mid.port"}]'  # fmt: skip
    with pytest.raises(InputError, match="needs admin"):
        load_experiment(write(tmp_path, "cotune = true\n", base.replace('hosts = ["a", "b"]', one)))
    per_host = write(tmp_path, "cotune = true\n", base.replace('hosts = ["a", "b"]', both))
    assert load_experiment(per_host).cotune.admin == ""  # type: ignore[union-attr]


def without_threading(tmp: Path) -> Path:
    text = SIM_MODEL.read_text()
    model = tmp / "plain.toml"
    model.write_text(text[: text.index("\n[threading]\n")] + text[text.index("\n[noise]\n") :])
    return model


def test_cotune_needs_a_sim_model_with_threading(tmp_path: Path) -> None:
    base = BASE.replace(str(SIM_MODEL), str(without_threading(tmp_path)))
    exp = load_experiment(write(tmp_path, "cotune = true\n", base))
    with pytest.raises(InputError, match=r"no \[threading\] section"):
        open_pair(exp)


def test_the_cli_reports_a_bad_threading_table_with_exit_code_3(tmp_path: Path) -> None:
    path = write(tmp_path, 'cotune = true\nmodels = ["nope"]\n')
    cp = subprocess.run([sys.executable, "-m", "musku", "check", str(path)],
                        capture_output=True, text=True, timeout=60)  # fmt: skip
    assert cp.returncode == 3
    assert cp.stderr.strip().count("\n") == 0 and "Traceback" not in cp.stderr
    assert f"{path}:{line_of(path, 'models =')}" in cp.stderr and "'nope'" in cp.stderr


MODEL_BAD = [
    ('best = "async-dispatch-spin"\n', "best =", "is not a threading model"),
    (
        'best = "sync-inline-block"\nmismatch = 0.95\n',
        "mismatch =",
        r"mismatch must be in \[0, 0\.9\)",
    ),
    ('best = "sync-inline-block"\nfoo = 1\n', "foo =", "unknown key 'foo'"),
    ('initial = "x"\nbest = "sync-inline-block"\n', "initial =", "is not a threading model"),
    (
        'best = "sync-inline-block"\n[[threading.rules]]\nwhen = { core_count = [3] }\n'
        'best = "sync-inline-poll"\n',
        "[[threading.rules]]",
        "3 is not a valid core_count setting|not modelled",
    ),
    (
        'best = "sync-inline-block"\n[[threading.rules]]\nwhen = { cdp = "6:5" }\n'
        'best = "sync-inline-poll"\n',
        "[[threading.rules]]",
        "knob 'cdp' that the model does not have",
    ),
]


@pytest.mark.parametrize(("section", "bad_line", "match"), MODEL_BAD)
def test_bad_sim_model_threading_sections(
    tmp_path: Path, section: str, bad_line: str, match: str
) -> None:
    text = SIM_MODEL.read_text()
    start = text.index("\n[threading]\n") + 1
    end = text.index("\n[noise]\n") + 1
    model = tmp_path / "m.toml"
    model.write_text(text[:start] + "[threading]\n" + section + "\n" + text[end:])
    with pytest.raises(InputError, match=match) as exc:
        SimModel.load(model)
    assert exc.value.where == f"{model}:{line_of(model, bad_line)}"


def test_sim_model_threading_best_per_configuration() -> None:
    m = SimModel.load(SIM_MODEL)
    assert m.threading is not None
    ref = m.reference_config
    assert ref is not None
    assert m.best_threading(ref) == "async-dispatch-poll"
    c14 = ref.with_("core_count", 14)
    assert m.best_threading(c14) == "async-dispatch-block"
    assert m.threading_factor(c14, "async-dispatch-block") == (1.0, 1.0)
    assert m.threading_factor(c14, "async-dispatch-poll") == pytest.approx((0.965, 1.12))


def test_check_says_whether_and_how_threading_is_co_tuned(tmp_path: Path) -> None:
    import json

    path = write(tmp_path, 'cotune = true\nloads = [100, 1000]\nmodels = ["sync-inline-block", '
                 '"async-dispatch-block"]\nworkers = [1, 2]\n')  # fmt: skip
    cp = subprocess.run([sys.executable, "-m", "musku", "check", "--json", str(path)],
                        capture_output=True, text=True, timeout=60)  # fmt: skip
    assert cp.returncode == 0, cp.stderr
    th = json.loads(cp.stdout)["threading"]
    assert th["cotune"] is True and th["loads"] == [100.0, 1000.0]
    assert len(th["candidates"]) == 3  # sync-inline-block, async-dispatch-block x 2 worker sizes
    cp = subprocess.run([sys.executable, "-m", "musku", "check", str(path)],
                        capture_output=True, text=True, timeout=60)  # fmt: skip
    assert "threading co-tuned per configuration: setalgebra mid-tier, 6 training points" in (
        cp.stdout
    )
    off = write(tmp_path, "cotune = false\n")
    cp = subprocess.run([sys.executable, "-m", "musku", "check", "--json", str(off)],
                        capture_output=True, text=True, timeout=60)  # fmt: skip
    assert json.loads(cp.stdout)["threading"] is None
