"""Issue 33 item 5: a qsim model is read on the shared strict document base with the input caps.

Every value of the shipped models (experiments/qsim/*.toml) is replaced in turn by a value of a
wrong type (a number written as a string, a boolean for a number, a number for a name...): each
is refused, at the line of that value, in the shared layer's words (``must be int, not '7'``),
never coerced. Every number the schema takes is bounded on both sides (checked on the models
themselves, so a new unbounded field fails here), and a non-finite or huge number anywhere is
refused at its line (Hypothesis draws them).
"""

from __future__ import annotations

import math
import re
import tempfile
import types
import typing
from pathlib import Path

import pytest
from annotated_types import Ge, Gt, Le, Lt
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel

from musku.errors import InputError
from musku.inputfiles import MAX_LIST_ITEMS
from musku.qsim import model as qm
from musku.qsim.uqsim import convert, write_example

ROOT = Path(__file__).resolve().parents[2]


def _models() -> list[Path]:
    """The shipped model and the μqSim importer's output for each of its example kinds."""
    out = [ROOT / "experiments" / "qsim" / "2tier.toml"]
    folder = Path(_IMPORTED.name)
    for kind in ("2tier", "fanout", "features"):
        model = folder / f"uqsim-{kind}.toml"
        convert(write_example(folder / kind, kind, qps=1000, duration_s=1), model)
        out.append(model)
    return out


_IMPORTED = tempfile.TemporaryDirectory(prefix="musku-qsim-strict-")
SHIPPED = _models()

# ``key = value`` with a scalar or a one-line array as the value (inline tables included)
TOKEN = re.compile(
    r"(?P<key>[A-Za-z_]+) = (?P<val>-?[0-9][0-9_.eE+-]*|true|false|\"[^\"]*\"|\[[^\]\[]*\])"
)


def tokens(text: str) -> list[tuple[int, int, int, str]]:
    """(line number, start, end, value) of each value in the text (comment lines skipped)."""
    out = []
    offset = 0
    for number, line in enumerate(text.splitlines(keepends=True), start=1):
        if not line.lstrip().startswith("#"):
            for m in TOKEN.finditer(line):
                out.append((number, offset + m.start("val"), offset + m.end("val"), m["val"]))
        offset += len(line)
    return out


def wrong_types(value: str) -> list[str]:
    """Values of another TOML type than ``value`` (what a careless edit writes)."""
    if value in ("true", "false"):
        return ["1", f'"{value}"']
    if value.startswith('"'):
        return ["7", "true"]
    if value.startswith("["):
        return ["7", '"x"']
    return [f'"{value}"', "true", "[1]"]


def refusal(path: Path, text: str) -> InputError:
    path.write_text(text)
    with pytest.raises(InputError) as info:
        qm.parse(text, path)
    return info.value


def _cases() -> list[typing.Any]:
    """Each key of each kind of value once (the imported models repeat ``mean_us`` hundreds
    of times: the first of each is enough, and keeps the test cheap)."""
    seen: set[tuple[str, str, str]] = set()
    out = []
    for model in SHIPPED:
        text = model.read_text()
        for number, start, end, value in tokens(text):
            key = text[: start - 3].rsplit(None, 1)[-1].lstrip("{,")
            for bad in wrong_types(value):
                if (key, value[0], bad) not in seen:
                    seen.add((key, value[0], bad))
                    out.append(
                        pytest.param(
                            model, number, start, end, bad, id=f"{model.stem}:{number}:{key}={bad}"
                        )
                    )
    return out


CASES = _cases()


def test_the_shipped_models_load() -> None:
    assert len(SHIPPED) == 4
    for model in SHIPPED:
        assert qm.load(model).engine["services"]
    assert len(CASES) > 60  # the token pattern still finds the models' values


@pytest.mark.parametrize(("model", "number", "start", "end", "bad"), CASES)
def test_a_value_of_the_wrong_type_is_refused_at_its_line(
    tmp_path: Path, model: Path, number: int, start: int, end: int, bad: str
) -> None:
    text = model.read_text()
    path = tmp_path / "m.toml"
    e = refusal(path, text[:start] + bad + text[end:])
    assert e.where == f"{path}:{number}", e.one_line()
    # the shared wording (a type error) or a choice among names (a Literal field)
    assert "must be" in e.message or "Input should be" in e.message, e.one_line()


def test_the_shared_wording() -> None:
    text = (ROOT / "experiments" / "qsim" / "2tier.toml").read_text()
    path = Path("m.toml")
    for old, new, message in [
        ("seed = 1", 'seed = "7"', "run.seed: must be int, not '7'"),
        ("seed = 1", "seed = 7.0", "run.seed: must be int, not 7.0"),
        ("cores = 10", "cores = true", "machines[0].cores: must be int, not True"),
        ("latency_us = 65", 'latency_us = "65"', "network.latency_us: must be int or float"),
        ('name = "front"', "name = 1", "machines[0].name: must be str, not 1"),
        ('name = "front"\n', "", "machines[0]: needs 'name'"),
    ]:
        assert old in text, old
        with pytest.raises(InputError) as info:
            qm.parse(text.replace(old, new, 1), path)
        assert info.value.message == message or info.value.message.startswith(message), (
            info.value.one_line()
        )
        assert info.value.where is not None and info.value.where.startswith("m.toml:")
    flat = "network = 5\n" + text.replace("[network]\nlatency_us = 65\n", "")
    with pytest.raises(InputError) as info:
        qm.parse(flat, path)
    assert info.value.one_line() == "m.toml:1: network: must be a table"


def _numbers(model: type[BaseModel], at: str = "") -> list[tuple[str, typing.Any, list[object]]]:
    """(where, type, constraints) of every number the schema takes, nested models included."""
    out: list[tuple[str, typing.Any, list[object]]] = []

    def walk(where: str, tp: typing.Any, meta: list[object]) -> None:
        origin = typing.get_origin(tp)
        if origin is typing.Annotated:
            base, *extra = typing.get_args(tp)
            found: list[object] = []
            for x in extra:
                found.extend(getattr(x, "metadata", [x]))
            walk(where, base, meta + found)
        elif origin in (typing.Union, types.UnionType):
            for arg in typing.get_args(tp):
                walk(where, arg, meta)
        elif origin in (list, tuple):
            for i, arg in enumerate(typing.get_args(tp)):
                walk(f"{where}[{i}]", arg, [])
        elif isinstance(tp, type) and issubclass(tp, BaseModel):
            out.extend(_numbers(tp, where))
        elif tp in (int, float):
            out.append((where, tp, meta))

    for name, field in model.model_fields.items():
        walk(f"{at}.{name}" if at else name, field.annotation, list(field.metadata))
    return out


def test_every_number_is_bounded_on_both_sides() -> None:
    numbers = _numbers(qm.QsimModel)
    assert len(numbers) > 30  # the walk still reaches the nested models
    assert {"run.seed", "machines[0].cores", "services[0].stages[0].time.sigma"} <= {
        where for where, _, _ in numbers
    }
    for where, tp, meta in numbers:
        assert any(isinstance(m, Le | Lt) for m in meta), f"{where}: no upper bound"
        assert any(isinstance(m, Ge | Gt) for m in meta), f"{where}: no lower bound"
        for m in meta:  # the engine reads ints as int64
            bound = getattr(m, "le", None) or getattr(m, "lt", None)
            assert tp is float or bound is None or bound <= 2**63, f"{where}: {bound} over int64"


NUMBERS = [
    (model, number, start, end)
    for model in SHIPPED
    for number, start, end, value in tokens(model.read_text())
    if value[0] in "-0123456789"
]


def toml_float(x: float) -> str:
    if math.isnan(x):
        return "nan"
    if math.isinf(x):
        return "inf" if x > 0 else "-inf"
    return repr(x)


@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    at=st.sampled_from(NUMBERS),
    x=st.one_of(
        st.sampled_from([math.nan, math.inf, -math.inf]),
        st.floats(min_value=1.0000001e300, allow_infinity=False),
        st.floats(max_value=-1e-300, allow_infinity=False),
    ),
)
def test_a_huge_negative_or_non_finite_number_is_refused_at_its_line(
    tmp_path: Path, at: tuple[Path, int, int, int], x: float
) -> None:
    model, number, start, end = at
    text = model.read_text()
    path = tmp_path / "m.toml"
    e = refusal(path, text[:start] + toml_float(x) + text[end:])
    assert e.where == f"{path}:{number}", e.one_line()


def test_the_document_caps_hold(tmp_path: Path) -> None:
    """The caps of every input file: a list longer than the limit is refused before the
    schema sees it (a 10,001-name machine list would otherwise be walked entry by entry)."""
    text = (ROOT / "experiments" / "qsim" / "2tier.toml").read_text()
    names = ", ".join('"front"' for _ in range(MAX_LIST_ITEMS + 1))
    old = 'machines = ["back"]'
    assert old in text
    e = refusal(tmp_path / "m.toml", text.replace(old, f"machines = [{names}]", 1))
    assert str(MAX_LIST_ITEMS) in e.message.replace(",", ""), e.one_line()
