"""``musku sweep --take-over-agents`` reaches the agent pairs as an explicit option (``[hosts]
take_over`` of the agent backend, set by :meth:`Backend.taking_over`), not a module global."""

from __future__ import annotations

from pathlib import Path

import pytest

from musku.errors import InputError
from musku.experiment import Experiment, load_experiment
from musku.hosts.backend import backend_of
from musku.schema.hosts import AgentOptions, parse_options

ROOT = Path(__file__).resolve().parents[2]

EXP = """\
[experiment]
name = "take-over"
[service]
name = "web"
knobs = ["thp"]
[platform]
catalog = "skylake18"
[hosts]
backend = "agent"
hosts = ["web-1", "web-2"]
{extra}
"""


def _experiment(tmp_path: Path, extra: str = "") -> Experiment:
    path = tmp_path / "exp.toml"
    path.write_text(EXP.format(extra=extra))
    return load_experiment(path)


def test_the_agent_backend_sets_take_over(tmp_path: Path) -> None:
    exp = _experiment(tmp_path)
    assert parse_options(AgentOptions, exp.hosts.options).take_over is False
    taken = backend_of(exp).taking_over(exp)
    assert parse_options(AgentOptions, taken.hosts.options).take_over is True
    assert "take_over" not in exp.hosts.options  # the loaded experiment is not changed
    assert taken.hosts.options["hosts"] == exp.hosts.options["hosts"]


def test_a_backend_without_leases_is_unchanged() -> None:
    exp = load_experiment(ROOT / "experiments" / "web-broadwell.toml")
    assert backend_of(exp).taking_over(exp) is exp


def test_take_over_in_the_file_is_a_strict_bool(tmp_path: Path) -> None:
    exp = _experiment(tmp_path, "take_over = true")
    assert parse_options(AgentOptions, exp.hosts.options).take_over is True
    with pytest.raises(InputError, match="take_over"):
        _experiment(tmp_path, 'take_over = "yes"')
