"""The plain output of ``musku qsim run``: its tables as rows and its CSV/JSON text.

Free of typer and rich, so the quick path (:mod:`musku.qsim.quick`) prints exactly what the
full command prints without loading either.
"""

from __future__ import annotations

import csv
import io
import json

from musku.errors import InputError

TYPE_CHECKING = False  # not typing's: the qsim quick path never imports typing
if TYPE_CHECKING:
    from typing import Any

FORMATS = ("table", "csv", "json")
RUN_TABLES = ("services", "stages", "machines", "cores", "latency")


def check_format(fmt: str, json_out: bool) -> str:
    """``--format`` (``--json`` is ``--format json``)."""
    if json_out:
        return "json"
    if fmt not in FORMATS:
        raise InputError(f"--format takes {', '.join(FORMATS)}, not {fmt!r}")
    return fmt


def to_csv(header: list[str], rows: list[list[Any]]) -> str:
    """RFC 4180 CSV with a header line (numbers as Python prints them: full precision)."""
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(header)
    w.writerows(rows)
    return buf.getvalue()


def table_json(header: list[str], rows: list[list[Any]]) -> str:
    return json.dumps([dict(zip(header, r, strict=True)) for r in rows], indent=2) + "\n"


def run_table(result: dict[str, Any], which: str) -> tuple[list[str], list[list[Any]]]:
    """One of a run's tables as (header, rows) of plain values (``--format csv|json --table``).
    ``visits`` counts the service's visits (a request that calls it twice counts two)."""
    if which == "services":
        return ["service", "visits", "mean_us", "p50_us", "p99_us", "thread_util"], [
            [name, s["count"], s["mean_us"], s["p50_us"], s["p99_us"], s["thread_util"]]
            for name, s in result["services"].items()
        ]
    if which == "latency":
        lat = result["latency"]
        ci = lat.get("ci", {})
        return ["figure", "value_us", "lo_us", "hi_us"], [
            [k[:-3], lat[k], *ci.get(k, ("", ""))]
            for k in ("mean_us", "p50_us", "p90_us", "p99_us", "p999_us", "max_us")
        ]
    if which == "stages":
        return ["service", "stage", "mean_queue", "max_queue"], [
            [s["service"], s["stage"], s["mean_queue"], s["max_queue"]] for s in result["stages"]
        ]
    if which == "machines":
        return ["machine", "cores", "mean_util", "max_util"], [
            [m["machine"], m["cores"], m["mean_util"], m["max_util"]] for m in machines(result)
        ]
    return ["machine", "core", "util"], [
        [c["machine"], c["core"], c["util"]] for c in result["cores"]
    ]


def machines(result: dict[str, Any]) -> list[dict[str, Any]]:
    """Per machine: its cores' mean and highest utilisation (the default instead of the
    per-core dump, which ``--per-core`` asks for)."""
    per: dict[str, list[float]] = {}
    for c in result["cores"]:
        per.setdefault(c["machine"], []).append(c["util"])
    return [
        {"machine": m, "cores": len(us), "mean_util": sum(us) / len(us), "max_util": max(us)}
        for m, us in per.items()
    ]


def without_detail(result: dict[str, Any]) -> dict[str, Any]:
    """The result without its per-core and per-thread lists (``--per-core`` keeps them);
    per-machine figures instead."""
    out = {k: v for k, v in result.items() if k not in ("cores", "threads")}
    out["machines"] = machines(result)
    return out
