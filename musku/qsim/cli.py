"""``musku qsim run | curve | check | import-uqsim | predict`` (docs/qsim.md).

Exit statuses (docs/cli.md): 3 a bad model (with ``file:line``), a bad ``--out``, or a model
that needs more than the engine's CPU or memory budget; 4 the engine is not built. Names from
the model (services, stages, machines, paths) are printed as text: rich markup in them is shown,
never interpreted.
"""

from __future__ import annotations

import json
import math
import os
import stat
import sys
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from musku.errors import InputError
from musku.qsim.output import (
    RUN_TABLES,
    check_format,
    machines,
    run_table,
    table_json,
    to_csv,
    without_detail,
)

if TYPE_CHECKING:
    from musku.qsim.engine import Limits

MAX_CURVE_STEPS = 1000
"""Most rates one ``qsim curve`` runs."""

app = typer.Typer(help="Queueing-network simulation of microservice graphs.", no_args_is_help=True)

ModelArg = Annotated[
    Path, typer.Argument(help="Model file (TOML, docs/qsim.md).", show_default=False)
]
QpsOpt = Annotated[
    float | None, typer.Option("--qps", help="Open-loop rate (overrides the model).")
]
DurationOpt = Annotated[
    float | None, typer.Option("--duration", help="Simulated seconds (overrides [run]).")
]
SeedOpt = Annotated[int | None, typer.Option("--seed", help="Run seed (overrides [run]).")]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print JSON instead of tables.")]
FormatOpt = Annotated[
    str,
    typer.Option(
        "--format", help="table, csv or json (csv: one table, --table; json: the whole result)."
    ),
]
QuietOpt = Annotated[
    bool, typer.Option("--quiet", "-q", help="No progress on stderr (shown for runs over 2 s).")
]
PerCoreOpt = Annotated[
    bool,
    typer.Option("--per-core", help="Per-core and per-thread detail (tables and JSON)."),
]
OutOpt = Annotated[
    Path | None,
    typer.Option(
        "--out",
        help="Also write the result here: a name ending .csv gets the table (--table), any "
        "other the JSON (a new or regular file; - stdout).",
    ),
]
CpuOpt = Annotated[
    float | None,
    typer.Option(
        "--cpu-limit",
        help="CPU seconds the engine may spend in all (default 600; $MUSKU_QSIM_CPU_S).",
        show_default=False,
    ),
]
MemOpt = Annotated[
    int | None,
    typer.Option(
        "--memory-limit",
        help="MiB of memory per engine run (default 2048; $MUSKU_QSIM_MEMORY_MIB).",
        show_default=False,
    ),
]


def check_out(out: Path | None) -> None:
    """Refuse an output path that is not a new path or a regular file (a directory, a device,
    a FIFO, a socket, a symbolic link) before any work is done."""
    if out is None or str(out) == "-":
        return
    where = str(out)
    if "\0" in where:
        raise InputError("--out: the file name holds a NUL character", where=repr(where))
    try:
        st = os.lstat(out)
    except FileNotFoundError:
        parent = out.parent
        if not parent.is_dir():
            raise InputError("--out: no such directory", where=str(parent)) from None
        return
    except OSError as e:
        raise InputError(f"--out: {e.strerror}", where=where) from None
    if stat.S_ISLNK(st.st_mode):
        raise InputError("--out is a symbolic link: name the file itself", where=where)
    if stat.S_ISDIR(st.st_mode):
        raise InputError("--out is a directory: name a file", where=where)
    if not stat.S_ISREG(st.st_mode):
        raise InputError("--out is not a regular file (a device, FIFO or socket)", where=where)


def write_out(out: Path, text: str | bytes) -> None:
    """``text`` to ``out`` atomically (musku/outputs.py: a temporary file beside it, renamed
    over it), or to stdout for ``-``."""
    from musku import outputs

    check_out(out)
    outputs.write_bytes(out, text.encode("utf-8") if isinstance(text, str) else text)


class _Bar:
    """The rich progress bar of a qsim run on a terminal (musku/qsim/progress.py decides when)."""

    def __init__(self, stream: Any, title: str) -> None:
        from rich.console import Console
        from rich.progress import (
            BarColumn,
            Progress,
            TaskProgressColumn,
            TextColumn,
            TimeElapsedColumn,
            TimeRemainingColumn,
        )

        self._p = Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            TaskProgressColumn(),
            TimeElapsedColumn(),
            TextColumn("ETA"),
            TimeRemainingColumn(),
            console=Console(file=stream, highlight=False, emoji=False),
            transient=True,
        )
        self._p.start()
        self._task = self._p.add_task(_e(title), total=1.0)

    def update(self, fraction: float, description: str) -> None:
        self._p.update(self._task, completed=fraction, description=_e(description))

    def stop(self) -> None:
        self._p.stop()


def _progress(title: str, quiet: bool) -> Any:
    from musku.qsim.progress import Progress, after_s_from_env

    return Progress(
        f"qsim {title}", enabled=not quiet, bar_factory=_Bar, after_s=after_s_from_env()
    )


def _limits(cpu_limit: float | None, memory_limit: int | None) -> Limits:
    from musku.qsim.engine import Limits

    return Limits.from_env(cpu_limit, memory_limit)


def _e(text: Any) -> str:
    """A name from the model, as text in rich markup."""
    from rich.markup import escape

    return escape(str(text))


def _console() -> Any:
    from rich.console import Console

    return Console(highlight=False, emoji=False, width=None if sys.stdout.isatty() else 160)


def _us(x: float) -> str:
    return f"{x / 1000:.2f} ms" if x >= 1000 else f"{x:.1f} us"


def _print_run(result: dict[str, Any], title: str, per_core: bool) -> None:
    from rich.table import Table

    con = _console()
    lat = result["latency"]
    con.print(
        f"[bold]{_e(title)}[/]: {result['throughput_qps']:.0f} req/s completed "
        f"(offered {result['offered_qps']:.0f}), {lat['count']} requests measured over "
        f"{result['measured_s']:.2f} s; end-to-end mean {_us(lat['mean_us'])}, "
        f"p50 {_us(lat['p50_us'])}, p99 {_us(lat['p99_us'])}, p99.9 {_us(lat['p999_us'])}"
    )
    ci = lat.get("ci", {})
    given = [
        f"{k[:-3]} {_us(ci[k][0])}-{_us(ci[k][1])}"
        for k in ("mean_us", "p50_us", "p99_us")
        if k in ci
    ]
    if given:
        con.print(f"95 % batch-means intervals ({ci['batches']} batches): " + ", ".join(given))
    if result["saturated"]:
        con.print(f"[bold red]SATURATED[/]: {_e(result['stop_reason'])}")
    else:
        con.print("saturated: no (the backlog does not grow over the measured window)")
    t = Table(title="per service (time at the service, from arrival to the node's last stage)")
    for col in ("service", "visits", "mean", "p50", "p99", "thread util"):
        t.add_column(col, justify="left" if col == "service" else "right")
    for name, s in result["services"].items():
        t.add_row(_e(name), str(s["count"]), _us(s["mean_us"]), _us(s["p50_us"]), _us(s["p99_us"]),
                  f"{s['thread_util'] * 100:.1f} %")  # fmt: skip
    con.print(t)
    q = Table(title="queues (all instances)")
    for col in ("service", "stage", "mean length", "max length"):
        q.add_column(col, justify="left" if col in ("service", "stage") else "right")
    for s in result["stages"]:
        q.add_row(_e(s["service"]), _e(s["stage"]), f"{s['mean_queue']:.2f}", str(s["max_queue"]))
    con.print(q)
    if per_core:
        per_machine: dict[str, list[float]] = {}
        for c in result["cores"]:
            per_machine.setdefault(c["machine"], []).append(c["util"])
        con.print(
            "cores: "
            + "; ".join(
                f"{_e(m)} " + " ".join(f"{u * 100:.0f}" for u in us) + " %"
                for m, us in per_machine.items()
            )
        )
    else:
        con.print(
            "cores (mean / busiest, --per-core for each): "
            + "; ".join(
                f"{_e(m['machine'])} {m['mean_util'] * 100:.0f} / {m['max_util'] * 100:.0f} % "
                f"of {m['cores']}"
                for m in machines(result)
            )
        )
    con.print(
        f"[dim]{result['events']} events, {result['jobs_run']} jobs in {result['cpu_s']:.2f} CPU-s[/]"
    )


@app.command("check")
def check(model: ModelArg, json_out: JsonOpt = False) -> None:
    """Validate a model; print its normalised engine document with --json."""
    from musku.qsim.model import load

    loaded = load(model)
    if json_out:
        sys.stdout.write(json.dumps(loaded.engine, indent=2) + "\n")
    else:
        m = loaded.model
        typer.echo(
            f"{model}: ok ({len(m.machines)} machines, {len(m.services)} services, "
            f"{sum(len(p.nodes) for p in m.paths)} path nodes)"
        )


@app.command("run")
def run(
    model: ModelArg,
    qps: QpsOpt = None,
    duration: DurationOpt = None,
    seed: SeedOpt = None,
    out: OutOpt = None,
    json_out: JsonOpt = False,
    fmt: FormatOpt = "table",
    table: Annotated[
        str | None,
        typer.Option(
            "--table",
            help="One table for --format csv (default services) or json (default: the whole "
            "result): " + ", ".join(RUN_TABLES) + ".",
            show_default=False,
        ),
    ] = None,
    per_core: PerCoreOpt = False,
    quiet: QuietOpt = False,
    cpu_limit: CpuOpt = None,
    memory_limit: MemOpt = None,
) -> None:
    """Simulate a model: latency percentiles, throughput, utilisation and queue lengths."""
    from musku.qsim.engine import simulate
    from musku.qsim.model import load
    from musku.qsim.overrides import with_overrides

    fmt = check_format(fmt, json_out)
    if table is not None and table not in RUN_TABLES:
        raise InputError(f"--table takes {', '.join(RUN_TABLES)}, not {table!r}")
    limits = _limits(cpu_limit, memory_limit)
    check_out(out)
    loaded = load(model)
    doc = with_overrides(loaded.engine, qps=qps, duration_s=duration, seed=seed)
    with _progress(f"run {model}", quiet) as prog:
        # -q: no --progress for the engine either (an engine built before it still runs)
        result = simulate(doc, limits=limits, on_progress=prog.update if prog.enabled else None)
    result["model"] = str(model)
    result["seed"] = doc["seed"]
    shown = result if per_core else without_detail(result)
    if out is not None and str(out).lower().endswith(".csv"):
        write_out(out, to_csv(*run_table(result, table or "services")))
    elif out is not None:
        write_out(out, json.dumps(shown, indent=2) + "\n")
    if fmt == "json" and table is not None:
        sys.stdout.write(table_json(*run_table(result, table)))
    elif fmt == "json":
        sys.stdout.write(json.dumps(shown, indent=2) + "\n")
    elif fmt == "csv":
        sys.stdout.write(to_csv(*run_table(result, table or "services")))
    else:
        _print_run(result, str(model), per_core)
    if result["saturated"] and fmt != "table":
        # stdout holds the document alone; the verdict is in it ("saturated": true) and here
        typer.echo(f"qsim run: saturated: {result['stop_reason']}", err=True)


def parse_range(text: str) -> list[float]:
    """``A:B:STEPS`` -> STEPS evenly spaced rates from A to B."""
    import math

    try:
        a, b, n = text.split(":")
        lo, hi, steps = float(a), float(b), int(n)
        if not (math.isfinite(lo) and math.isfinite(hi)):
            raise ValueError(text)
    except ValueError:
        raise InputError(f"--qps takes A:B:STEPS (e.g. 1000:20000:10), not {text!r}") from None
    if not (0 < lo <= hi) or steps < 1 or (steps == 1 and lo != hi):
        raise InputError(f"--qps {text}: need 0 < A <= B and STEPS >= 1 (1 only when A = B)")
    if steps > MAX_CURVE_STEPS:
        raise InputError(f"--qps {text}: at most {MAX_CURVE_STEPS} steps")
    return [lo + (hi - lo) * i / max(1, steps - 1) for i in range(steps)]


def falls_behind(result: dict[str, Any], qps: float) -> bool:
    """Fewer requests completed than offered, by more than 4 standard deviations of a Poisson
    count over the window (and at least 1 %): the backlog grows."""
    import math

    n = max(1.0, qps * result["measured_s"])
    return bool(result["throughput_qps"] < qps * (1 - max(0.01, 4 / math.sqrt(n))))


def curve_points(
    doc: dict[str, Any],
    rates: list[float],
    limits: Limits | None = None,
    progress: Any = None,
) -> dict[str, Any]:
    """Run the model at each rate until it saturates; the curve and the saturation point.
    Every run spends the one CPU budget (``limits``). ``progress``: a
    :class:`musku.qsim.progress.CurveProgress` (or None)."""
    from musku.qsim.engine import Limits, simulate
    from musku.qsim.overrides import with_overrides

    lim = limits if limits is not None else Limits.from_env()
    points = []
    saturation: dict[str, Any] | None = None
    for i, qps in enumerate(rates):
        if progress is not None:
            progress.start(i)
        r = simulate(with_overrides(doc, qps=qps), limits=lim, on_progress=progress)
        sat = bool(r["saturated"])  # the engine's rule, the same as `run` (docs/qsim.md "Overload")
        points.append(
            {
                "qps": qps,
                "throughput_qps": r["throughput_qps"],
                "latency": r["latency"],
                "services_util": {n: s["thread_util"] for n, s in r["services"].items()},
                "machines_util": {m["machine"]: m["mean_util"] for m in machines(r)},
                "saturated": sat,
                "stop_reason": r["stop_reason"],
            }
        )
        if sat:
            prev = points[-2]["qps"] if len(points) > 1 else None
            saturation = {
                "first_saturated_qps": qps,
                "last_stable_qps": prev,
                "max_throughput_qps": max(p["throughput_qps"] for p in points),
                "reason": r["stop_reason"],
            }
            break
    return {"points": points, "saturation": saturation}


CURVE_PERCENTILES = ("p50", "p90", "p99")


def curve_table(res: dict[str, Any]) -> tuple[list[str], list[list[Any]]]:
    """The curve as (header, rows) of plain values: each percentile with its 95 % interval
    (empty where the engine gives none), the busiest service's thread utilisation, status."""
    header = ["offered_qps", "completed_qps", "mean_us", "mean_lo_us", "mean_hi_us"]
    for q in CURVE_PERCENTILES:
        header += [f"{q}_us", f"{q}_lo_us", f"{q}_hi_us"]
    header += ["p999_us", "busiest_service", "busiest_util", "status"]
    rows = []
    for p in res["points"]:
        lat = p["latency"]
        ci = lat.get("ci", {})
        row: list[Any] = [
            p["qps"],
            p["throughput_qps"],
            lat["mean_us"],
            *ci.get("mean_us", ("", "")),
        ]
        for q in CURVE_PERCENTILES:
            lo, hi = ci.get(f"{q}_us", ("", ""))
            row += [lat[f"{q}_us"], lo, hi]
        util = p.get("services_util", {})
        busiest = max(util, key=lambda n: util[n]) if util else ""
        row += [lat["p999_us"], busiest, util.get(busiest, ""),
                "saturated" if p["saturated"] else "stable"]  # fmt: skip
        rows.append(row)
    return header, rows


def _ci(lat: dict[str, Any], key: str) -> str:
    got = lat.get("ci", {}).get(key)
    return _us(lat[key]) + (f" [{_us(got[0])}, {_us(got[1])}]" if got else "")


@app.command("curve")
def curve(
    model: ModelArg,
    qps: Annotated[
        str, typer.Option("--qps", help="A:B:STEPS open-loop rates.", show_default=False)
    ],
    duration: DurationOpt = None,
    seed: SeedOpt = None,
    out: Annotated[
        Path | None,
        typer.Option(
            "--out",
            "-o",
            help="Also write the curve here, in the form its name ends with: .png, .svg or "
            ".html (a figure; the HTML self-contained), .csv (the table), else JSON "
            "(a new or regular file; - stdout).",
        ),
    ] = None,
    json_out: JsonOpt = False,
    fmt: FormatOpt = "table",
    quiet: QuietOpt = False,
    cpu_limit: CpuOpt = None,
    memory_limit: MemOpt = None,
) -> None:
    """Load-latency curve; stops at the first saturated rate and says so."""
    from musku.qsim.model import load
    from musku.qsim.overrides import with_overrides
    from musku.qsim.progress import CurveProgress

    fmt = check_format(fmt, json_out)
    rates = parse_range(qps)
    limits = _limits(cpu_limit, memory_limit)
    check_out(out)
    loaded = load(model)
    doc = with_overrides(loaded.engine, duration_s=duration, seed=seed)
    if doc["client"]["kind"] != "open":
        raise InputError("a load-latency curve needs an open-loop client", where=str(model))
    with _progress(f"curve {model}", quiet) as prog:
        res = curve_points(doc, rates, limits, CurveProgress(prog, rates) if prog.enabled else None)
    res["model"] = str(model)
    if out is not None:
        write_curve(out, res)
    if fmt == "json":
        sys.stdout.write(json.dumps(res, indent=2) + "\n")
        return
    if fmt == "csv":
        sys.stdout.write(to_csv(*curve_table(res)))
        return
    from rich.table import Table

    t = Table(title=f"load-latency curve of {_e(model)} (95 % intervals in brackets)")
    header, rows = curve_rows(res)
    for col in header:
        t.add_column(col, justify="left" if col == "busiest" else "right")
    for row in rows:
        t.add_row(*(_e(c) for c in row[:-1]), "SATURATED" if row[-1] == "saturated" else "stable")
    con = _console()
    con.print(t)
    s = res["saturation"]
    if s is None:
        con.print(f"not saturated up to {rates[-1]:.0f} req/s")
    else:
        below = f" (stable at {s['last_stable_qps']:.0f})" if s["last_stable_qps"] else ""
        con.print(
            f"[bold]saturation[/] at {s['first_saturated_qps']:.0f} req/s offered{below}: "
            f"{_e(s['reason'])}; max completed {s['max_throughput_qps']:.0f} req/s"
        )


def write_curve(out: Path, res: dict[str, Any]) -> None:
    """``-o``: a figure (.png, .svg), a page (.html), the table (.csv) or JSON."""
    from musku.qsim.figure import curve_figure, curve_html, figure_format, render

    kind = figure_format(str(out))
    if kind == "html":
        write_out(out, curve_html(res, *curve_rows(res)))
    elif kind is not None:
        write_out(out, render(curve_figure(res), kind))
    elif str(out).lower().endswith(".csv"):
        write_out(out, to_csv(*curve_table(res)))
    else:
        write_out(out, json.dumps(res, indent=2) + "\n")


def curve_rows(res: dict[str, Any]) -> tuple[list[str], list[list[str]]]:
    """The curve's table as people read it (the terminal's and the HTML page's)."""
    header = ["offered (req/s)", "completed (req/s)", "mean [95 %]", "p50 [95 %]", "p90 [95 %]",
              "p99 [95 %]", "p99.9", "busiest", "status"]  # fmt: skip
    rows = []
    for p in res["points"]:
        lat = p["latency"]
        util = p.get("services_util", {})
        busiest = max(util, key=lambda n: util[n]) if util else ""
        rows.append([f"{p['qps']:.0f}", f"{p['throughput_qps']:.0f}", _ci(lat, "mean_us"),
                     _ci(lat, "p50_us"), _ci(lat, "p90_us"), _ci(lat, "p99_us"),
                     _us(lat["p999_us"]), f"{busiest} {util[busiest] * 100:.0f} %" if busiest else "",
                     "saturated" if p["saturated"] else "stable"])  # fmt: skip
    return header, rows


@app.command("import-uqsim")
def import_uqsim(
    directory: Annotated[
        Path, typer.Argument(help="μqSim architecture dir (its json/ folder or its parent).")
    ],
    out: Annotated[Path, typer.Option("--out", "-o", help="Model file to write (TOML).")],
    qps: Annotated[
        float | None, typer.Option("--qps", help="Open-loop rate (default: client.json's).")
    ] = None,
    connections: Annotated[
        int, typer.Option("--connections", help="Client connections (μqSim's numConn argument).")
    ] = 100,
    client_latency_us: Annotated[
        float,
        typer.Option("--client-latency-us", help="Client -> entry hop (μqSim's netLat argument)."),
    ] = 0.065,
) -> None:
    """Convert a μqSim architecture directory into a qsim model file."""
    from musku.qsim.uqsim import convert

    check_out(out)
    notes = convert(
        directory, out, qps=qps, connections=connections, client_latency_us=client_latency_us
    )
    from musku.qsim.model import load

    load(out)  # the converted model must validate
    for n in notes:
        typer.echo(f"note: {n}")
    typer.echo(f"wrote {out}")


@app.command("profile")
def profile(
    service: Annotated[
        str, typer.Argument(help="setalgebra, hdsearch or recommend.", show_default=False)
    ],
    out: Annotated[Path, typer.Option("--out", "-o", help="Model file to write (TOML).")],
    qps: Annotated[float, typer.Option("--qps", help="The low open-loop rate measured.")] = 100.0,
    qps_high: Annotated[
        float | None,
        typer.Option("--qps-high", help="The second rate (default: half a core's worth)."),
    ] = None,
    nice: Annotated[
        int, typer.Option("--nice", help="Nice value of the servers' threads (-20..19).")
    ] = 0,
    deep_users: Annotated[
        int,
        typer.Option(
            "--deep-users",
            min=0,
            help="Users of a third, closed-loop window (deep queues) for the per-wake-up "
            "cost; 0: none.",
        ),
    ] = 32,
    duration: Annotated[float, typer.Option("--duration", help="Seconds measured.")] = 10.0,
    shards: Annotated[int, typer.Option(min=1, help="Leaves.")] = 2,
    threading_: Annotated[
        str, typer.Option("--threading", help="Mid-tier threading model (a -block one).")
    ] = "async-dispatch-block",
    pollers: Annotated[int, typer.Option(min=1, help="Mid-tier poller threads.")] = 1,
    workers: Annotated[int, typer.Option(min=1, help="Mid-tier worker threads.")] = 2,
    responders: Annotated[int, typer.Option(min=0, help="Mid-tier response threads.")] = 1,
    server_cpus: Annotated[str, typer.Option(help="Pin the servers to these CPUs.")] = "0",
    loadgen_cpus: Annotated[str, typer.Option(help="Pin the load generator.")] = "1",
    opt: Annotated[
        list[str] | None, typer.Option("--opt", help="Service option KEY=VALUE (repeatable).")
    ] = None,
    data_dir: Annotated[Path | None, typer.Option(help="Service data cache.")] = None,
    json_out: JsonOpt = False,
) -> None:
    """Measure a μSuite service's deployment at a low load and write a qsim model of it."""
    import tempfile

    from musku.qsim.profile import measure, profile_json, write_model
    from musku.services import deployments, runtime

    check_out(out)
    data_opts = deployments.parse_opts(service, list(opt or []))
    if not duration > 0:
        raise InputError(f"--duration must be positive, not {duration}")
    cpus = runtime.parse_cpus(server_cpus)
    with tempfile.TemporaryDirectory(prefix="musku-qsim-profile-") as td:
        prof = measure(
            service,
            workdir=Path(td),
            data_dir=data_dir or runtime.default_data_dir(),
            qps=qps,
            duration_s=duration,
            shards=shards,
            threading=threading_,
            pollers=pollers,
            workers=workers,
            responders=responders,
            server_cpus=cpus,
            loadgen_cpus=runtime.parse_cpus(loadgen_cpus),
            data_opts=data_opts,
            qps_high=qps_high,
            nice=nice,
            deep_users=deep_users,
        )
    fit = write_model(prof, out)
    doc = profile_json(prof, fit)
    doc["model"] = str(out)
    if json_out:
        sys.stdout.write(json.dumps(doc, indent=2) + "\n")
        return
    c = prof.client
    typer.echo(
        f"{service} at {qps:g} QPS: client mean {c['mean_us']:.0f} us, p50 {c['p50_us']:.0f} us, "
        f"p99 {c['p99_us']:.0f} us; CPU per request: mid-tier "
        f"{prof.midtier.cpu_per_request_us:.0f} us, leaves "
        + ", ".join(f"{t.cpu_per_request_us:.0f}" for t in prof.leaves)
        + " us"
    )
    typer.echo(
        f"stages (us): leaf rpc {fit.leaf_rpc_us:.1f} + handle {fit.leaf_handle_us:.1f}; "
        f"mid-tier recv {fit.mid_recv_us:.1f}, process {fit.mid_process_us:.1f}, reply "
        f"{fit.mid_reply_us:.1f}, finalize {fit.mid_finalize_us:.1f} (CPU per request at "
        f"{prof.qps_high:.0f} QPS {prof.cpu_per_request_high_us:.0f} us; fixed while loaded "
        f"{fit.fixed_cpu_share * 100:.1f} % of a core); hops: leaf "
        f"{fit.leaf_hop_us:.1f}, client {fit.client_hop_us:.1f}"
    )
    if fit.mid_per_switch_us or fit.leaf_per_switch_us:
        typer.echo(
            f"per wake-up (context switch): mid-tier {fit.mid_per_switch_us:.1f} us x "
            f"{fit.mid_switches_per_request:.2f} per request at {qps:g} QPS, leaf "
            f"{fit.leaf_per_switch_us:.1f} us x {fit.leaf_switches_per_request:.2f}; "
            "paid once per batch (wake stages)"
        )
    if prof.background_cpu_pct is not None:
        typer.echo(f"other processes kept the server CPUs {prof.background_cpu_pct:.0f} % busy")
    for n in prof.notes:
        typer.echo(f"note: {n}")
    typer.echo(f"wrote {out}")


@app.command("predict")
def predict_cmd(
    experiment: Annotated[
        Path, typer.Argument(help="Experiment file (docs/experiment.md).", show_default=False)
    ],
    model: Annotated[
        Path | None,
        typer.Option(
            "--model",
            help="qsim model (default: the experiment's [predict] model, else its qsim "
            "backend's [hosts] model).",
            show_default=False,
        ),
    ] = None,
    db: Annotated[
        str | None,
        typer.Option(
            "--db",
            envvar="MUSKU_DB",
            help="Results DB whose latest sweep of the experiment is shown beside the "
            "prediction (default: musku's own; none there: the prediction alone).",
            show_default=False,
        ),
    ] = None,
    json_out: JsonOpt = False,
    fmt: FormatOpt = "table",
    quiet: QuietOpt = False,
    cpu_limit: CpuOpt = None,
    memory_limit: MemOpt = None,
) -> None:
    """Predict each knob setting's effect on capacity, p50 and p99 at the experiment's load,
    beside what its sweep measured (docs/qsim.md "Predicting a sweep")."""
    from musku.errors import DatabaseError
    from musku.experiment import load_experiment
    from musku.qsim.predict import CSV_HEADER, NOT_EXPRESSIBLE, beside, csv_rows, predict

    fmt = check_format(fmt, json_out)
    limits = _limits(cpu_limit, memory_limit)
    exp = load_experiment(experiment)
    with _progress(f"predict {experiment}", quiet) as prog:

        def step(done: int, total: int) -> None:
            prog.update(done / total, f"run {done} of {total}")

        pred = predict(exp, model=model, limits=limits, on_progress=step if prog.enabled else None)
    from musku.storage import open_store  # lazy: SQLAlchemy only here

    try:
        store = open_store(db, read_only=True)
    except DatabaseError as exc:
        if db is not None:
            raise
        pred = replace(pred, sweep_note=f"no sweep to compare with: {exc.message}")
    else:
        try:
            pred = beside(pred, exp, store)
        finally:
            store.close()
    if fmt == "json":
        from musku.strict_json import dumps  # non-finite (a saturated gain) as null

        sys.stdout.write(dumps(pred.to_dict(), indent=2) + "\n")
    elif fmt == "csv":
        sys.stdout.write(to_csv(CSV_HEADER, csv_rows(pred)))
    else:
        _print_prediction(pred)
    mute = sorted({r.knob for r in pred.rows if r.note == NOT_EXPRESSIBLE})
    if mute and fmt != "table":  # the table says it on each row
        typer.echo(f"qsim predict: not expressible in the model: {', '.join(mute)}", err=True)
    sat = pred.saturated
    if sat:
        names = ", ".join(f"{r.knob}={r.setting}" for r in sat)
        typer.echo(
            f"qsim predict: {len(sat)} setting(s) saturate the model at {pred.qps:,.0f} req/s "
            f"(latency not predicted): {names}",
            err=True,
        )


def _pct(x: float) -> str:
    return f"{x * 100:+.1f}" if math.isfinite(x) else ("+inf" if x > 0 else "-inf")


def _eff(e: Any) -> str:
    if e is None:
        return ""
    if not math.isfinite(e.value):
        return "unbounded (saturated)"
    return f"{_pct(e.value)} [{_pct(e.lo)}, {_pct(e.hi)}] %"


def _measured(m: Any) -> str:
    if m is None:
        return ""
    if not (math.isfinite(m.ci_low) and math.isfinite(m.ci_high)):
        return f"{m.decision} (no interval)"
    return f"{_pct(m.estimate)} [{_pct(m.ci_low)}, {_pct(m.ci_high)}] % {m.decision}"


def _print_prediction(pred: Any) -> None:
    from rich.table import Table

    from musku.qsim.predict import status

    base = pred.base
    title = (
        f"{_e(pred.experiment)}: predicted by {_e(pred.model)} ({_e(pred.source)}) at "
        f"{pred.qps:,.0f} req/s, {len(pred.seeds)} seeds x {pred.duration_s:g} s; effects "
        "against the baseline, 95 % intervals over the seeds"
    )
    t = Table(title=title)
    for col in ("knob", "setting", "capacity req/s", "p50", "p99", f"gain in {pred.metric}",
                "measured", "agrees"):  # fmt: skip
        t.add_column(col, justify="left" if col in ("knob", "agrees") else "right")
    for r in pred.rows:
        got = _e(_measured(r.measured))
        if not r.means:
            t.add_row(_e(r.knob), _e(r.setting), _e(status(r)), "", "", "", got, "")
            continue

        def cell(figure: str, text: str, r: Any = r) -> str:
            e = r.effects.get(figure)
            return text if e is None else f"{text}\n{_eff(e)}"

        sat = r.saturated
        t.add_row(
            _e(r.knob),
            _e(r.setting) + ("\n(baseline)" if r.baseline else ""),
            cell("capacity_qps", f"{r.means['capacity_qps']:,.0f}"),
            cell("p50_us", "SATURATED" if sat else _us(r.means["p50_us"])),
            cell("p99_us", "SATURATED" if sat else _us(r.means["p99_us"])),
            _eff(r.gain),
            got,
            _e(r.agreement),
        )
    con = _console()
    con.print(t)
    con.print(
        f"baseline: capacity {base['capacity_qps']:,.0f} req/s, p50 {_us(base['p50_us'])}, "
        f"p99 {_us(base['p99_us'])}; {_e(pred.sweep_note or 'no results DB read')}"
    )
    if pred.figure is None:
        con.print(f"{_e(pred.metric)} is not a predicted figure: gains are the capacity's")
