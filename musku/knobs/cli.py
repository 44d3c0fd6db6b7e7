"""``musku knobs``: what this host's knobs can do (read-only).

    musku knobs probe [--json] [--root PATH]

Lists each knob as supported (backend, current value, settings) or the reason why not
(no msr device, msr.allow_writes off, no resctrl, no CDP, HWP on, no cpufreq...).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from musku.errors import InputError, MuskuError

app = typer.Typer(help="Knob plugins on this host.", no_args_is_help=True)


@app.callback()
def _group() -> None:
    """Knob plugins on this host."""


def _fail(exc: MuskuError) -> None:
    typer.echo(f"musku: error: {exc.one_line()}", err=True)
    raise typer.Exit(int(exc.status))


@app.command()
def probe(
    as_json: Annotated[bool, typer.Option("--json", help="Machine-readable output.")] = False,
    root: Annotated[
        Path, typer.Option("--root", help="Host root (a captured tree, or / for this host).")
    ] = Path("/"),
) -> None:
    """Probe every knob: supported and how, or why not."""
    from musku.hostfs import HostFS
    from musku.knobs import knob_names, load_knob
    from musku.knobs.base import Support

    if not root.is_dir():
        _fail(InputError(f"--root {root}: not a directory"))
    fs = HostFS(root, read_only=True)  # a probe never changes the host
    rows: dict[str, dict[str, object]] = {}
    for name in knob_names():  # the built-ins and any registered out-of-tree knob
        current: object = None
        try:
            knob = load_knob(name, fs)
            support = knob.probe()
            if support.supported:
                try:
                    current = knob.read()
                except MuskuError as exc:
                    current = f"unreadable: {exc.one_line()}"
        except MuskuError as exc:
            support = Support(False, exc.one_line())
        except OSError as exc:
            support = Support(False, str(exc))
        rows[name] = {
            "supported": support.supported,
            "reason": support.reason,
            "backend": support.backend,
            "current": current,
            # a list of settings, or null with settings_range [min, max] (SHP's page count)
            "settings": (
                list(support.settings)
                if support.settings or support.settings_range is None
                else None
            ),
            "settings_range": (
                list(support.settings_range) if support.settings_range is not None else None
            ),
            "reboot": support.reboot,
            "details": support.details,
        }
    if as_json:
        from musku.strict_json import finite  # NaN/inf -> null

        out = finite({"root": str(fs.root), "knobs": rows})
        typer.echo(json.dumps(out, indent=2, allow_nan=False))
        return
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"knobs on {fs.root}")
    for col in ("knob", "supported", "backend", "current", "settings / reason"):
        table.add_column(col)
    for name, r in rows.items():
        if r["supported"]:
            settings = r["settings"] or []
            assert isinstance(settings, list)
            span = r["settings_range"]
            if isinstance(span, list):
                settings = [f"{span[0]}..{span[1]}"]
            extra = ", ".join(str(s) for s in settings) or ", ".join(
                f"{k}={v}"
                for k, v in dict(r["details"]).items()  # type: ignore[call-overload]
            )
            if r["reboot"]:
                extra = "(reboot) " + extra
            table.add_row(name, "yes", str(r["backend"]), str(r["current"]), extra)
        else:
            table.add_row(name, "no", "", "", str(r["reason"]))
    Console(emoji=False).print(table)


if __name__ == "__main__":
    app()
