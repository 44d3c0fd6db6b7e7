import sys

if sys.argv[1:2] == ["rpc"]:  # fast path: no typer import for the controller's SSH requests
    from musku.agent.rpc import main as rpc_main

    sys.exit(rpc_main(sys.argv[2:]))

from musku.agent.cli import main  # noqa: E402

main()
