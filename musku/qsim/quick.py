"""``musku qsim run`` for scripts, without the CLI's start-up.

A script, a curve or a sweep that runs many small simulations pays the CLI's start-up per run:
typer, every sub-command's module and the model's pydantic validation cost ~0.8 CPU-s where a
small simulation costs a few hundredths. :func:`run` serves the scripted form of the command,
``musku qsim run MODEL [--qps Q] [--duration S] [--seed N] (--json | --format json|csv)
[--table T] [-q]``, straight from :mod:`musku.entry`: the model's engine document comes from
:mod:`musku.qsim.modelcache`, the output from :mod:`musku.qsim.output`, the same functions the
full command uses, so stdout, stderr and the exit status are the same byte for byte
(tests/qsim/test_quick.py compares them). Anything else (tables for people, ``--out``,
``--per-core``, limits, ``--help``, an option it does not know or a value it cannot parse)
returns None and the full command runs, with its own usage errors.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from musku.errors import InputError
from musku.qsim.engine import Limits, simulate
from musku.qsim.modelcache import engine_document
from musku.qsim.output import RUN_TABLES, run_table, table_json, to_csv, without_detail
from musku.qsim.overrides import with_overrides
from musku.qsim.progress import Progress, after_s_from_env

TYPE_CHECKING = False  # not typing's: the qsim quick path never imports typing
if TYPE_CHECKING:
    from typing import Any

VALUED = {"--qps": "qps", "--duration": "duration", "--seed": "seed", "--format": "fmt",
          "--table": "table"}  # fmt: skip
FLAGS = {"--json": "json", "-q": "quiet", "--quiet": "quiet"}


def parse(args: list[str]) -> dict[str, Any] | None:
    """The options of a scripted run, or None when the full command must handle ``args``."""
    opts: dict[str, Any] = {}
    model: str | None = None
    it = iter(args)
    for a in it:
        if a in FLAGS:
            opts[FLAGS[a]] = True
            continue
        name, eq, value = a.partition("=")
        if name in VALUED:
            if not eq:
                got = next(it, None)
                if got is None:
                    return None
                value = got
            if VALUED[name] in opts:
                return None  # repeated: the full command decides what that means
            opts[VALUED[name]] = value
            continue
        if a.startswith("-") or model is not None or a == "":
            return None
        model = a
    if model is None:
        return None
    try:
        for k in ("qps", "duration"):
            if k in opts:
                opts[k] = float(opts[k])
        if "seed" in opts:
            opts["seed"] = int(opts["seed"])
    except ValueError:
        return None
    fmt = "json" if opts.get("json") else opts.get("fmt", "table")
    if fmt not in ("json", "csv"):
        return None  # tables for people (rich), or a bad --format: the full command
    opts["fmt"] = fmt
    opts["model"] = model
    return opts


def run(opts: dict[str, Any]) -> int:
    """Run ``musku qsim run`` with the options :func:`parse` gave; its exit status."""
    table = opts.get("table")
    if table is not None and table not in RUN_TABLES:
        raise InputError(f"--table takes {', '.join(RUN_TABLES)}, not {table!r}")
    limits = Limits.from_env()
    model = opts["model"]
    doc = with_overrides(
        engine_document(model),
        qps=opts.get("qps"),
        duration_s=opts.get("duration"),
        seed=opts.get("seed"),
    )
    prog = Progress(
        f"qsim run {model}",
        enabled=not opts.get("quiet"),
        bar_factory=_bar,
        after_s=after_s_from_env(),
    )
    with prog:
        result = simulate(doc, limits=limits, on_progress=prog.update if prog.enabled else None)
    result["model"] = str(Path(model))  # as the full command's Path argument prints it
    result["seed"] = doc["seed"]
    if opts["fmt"] == "json" and table is not None:
        sys.stdout.write(table_json(*run_table(result, table)))
    elif opts["fmt"] == "json":
        sys.stdout.write(json.dumps(without_detail(result), indent=2) + "\n")
    else:
        sys.stdout.write(to_csv(*run_table(result, table or "services")))
    if result["saturated"]:
        sys.stdout.flush()
        sys.stderr.write(f"qsim run: saturated: {result['stop_reason']}\n")
    return 0


def _bar(stream: Any, title: str) -> Any:
    from musku.qsim.cli import _Bar  # lazy: rich and typer only for a bar on a terminal

    return _Bar(stream, title)
