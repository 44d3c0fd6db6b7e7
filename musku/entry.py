"""The ``musku`` command's entry point: the two hot paths that skip the CLI's start-up, then
the typer app (:mod:`musku.cli`).

- ``musku agent rpc``: the controller's SSH hot path (:mod:`musku.agent.rpc`);
- ``musku qsim run`` in its scripted form (:mod:`musku.qsim.quick`).

Every path maps errors the same way (:func:`musku.errors.guarded`): musku's errors are one line with their
exit status (docs/cli.md), an interrupt is 130, anything else is an internal error (exit 1)
with how to get its traceback.
"""

from __future__ import annotations

import sys

from musku.errors import guarded

TYPE_CHECKING = False  # not typing's: the qsim quick path never imports typing
if TYPE_CHECKING:
    from typing import NoReturn


def main(argv: list[str] | None = None) -> NoReturn:
    """Console-script entry (``musku``, ``python -m musku``)."""
    args = sys.argv[1:] if argv is None else argv
    if args[:2] == ["agent", "rpc"]:
        from musku.agent.rpc import main as rpc_main  # lazy: this path loads nothing else

        sys.exit(rpc_main(args[2:]))
    if args[:2] == ["qsim", "run"]:
        from musku.qsim.quick import parse, run

        opts = parse(args[2:])
        if opts is not None:
            guarded(lambda: run(opts))
    from musku.cli import main as cli_main

    cli_main(argv)
    sys.exit(0)
