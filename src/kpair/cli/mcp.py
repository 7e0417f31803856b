"""``kpair mcp WORKDIR``: serve a work directory to an agent over MCP (stdio or HTTP)."""

from __future__ import annotations

import argparse
from pathlib import Path

from .base import Command
from .run import add_run_arguments, options_from_args


class McpCmd(Command):
    """Serve a work directory's operators to a kernel-editing agent over the Model Context
    Protocol: list, describe, submit candidates (judged in persistent sessions, recorded in
    attempts.jsonl), publish winners, capture programs. Needs pip install 'kpair[mcp]'."""

    name = "mcp"
    help = "serve a work directory to an agent over MCP (stdio or streamable HTTP)"

    @classmethod
    def add_arguments(cls, p: argparse.ArgumentParser) -> None:
        p.add_argument("workdir", type=Path, help="directory of snapshots and harnesses "
                       "(captures go there too); kpair writes under WORKDIR/mcp/")
        p.add_argument("--transport", choices=("stdio", "http"), default="stdio",
                       help="stdio (default; the agent starts kpair) or streamable HTTP")
        p.add_argument("--host", default="127.0.0.1", help="HTTP address (default 127.0.0.1)")
        p.add_argument("--port", type=int, default=8000, help="HTTP port (default 8000)")
        add_run_arguments(p)

    def run(self, args: argparse.Namespace) -> int:
        from ..errors import UsageError
        from ..mcp.server import _sdk, serve
        from ..mcp.workspace import Workspace

        _sdk()  # the install hint before anything else
        if not args.workdir.is_dir():
            raise UsageError(f"work directory {args.workdir} does not exist")
        ws = Workspace(args.workdir, options_from_args(args))
        serve(ws, "stdio" if args.transport == "stdio" else "http", host=args.host,
              port=args.port)
        return 0
