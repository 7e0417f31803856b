"""``kpair mcp WORKDIR``: serve a work directory to an agent over MCP (stdio or HTTP)."""

from __future__ import annotations

import argparse
from pathlib import Path

from ..errors import UsageError
from ..mcp import QUICK_MAX_BLOCKS, QUICK_REPLICATES, QUICK_TIME_CAP_S
from ..mcp.workspace import Workspace
from ..optimize.workbench import quick_options
from .base import BLOCKS, REPLICATES, SECONDS, Command, integer
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
        p.add_argument("--port", type=integer(0, 65535), default=8000,
                       help="HTTP port (default 8000)")
        add_run_arguments(p)
        q = p.add_argument_group(
            "quick measurement", "submissions are judged quick unless the agent asks for "
            "full=true: every trust check, with a short measurement; the options above make "
            "the full one (full=true, and publish)")
        q.add_argument("--quick-max-blocks", type=BLOCKS, default=QUICK_MAX_BLOCKS, metavar="N",
                       help=f"ABBA blocks at most (default {QUICK_MAX_BLOCKS})")
        q.add_argument("--quick-time-cap", type=SECONDS, default=QUICK_TIME_CAP_S, metavar="S",
                       help=f"seconds of ABBA timing at most (default {QUICK_TIME_CAP_S:g})")
        q.add_argument("--quick-replicates", type=REPLICATES, default=QUICK_REPLICATES, metavar="N",
                       help=f"replicates (default {QUICK_REPLICATES})")
        q.add_argument("--no-quick", action="store_true",
                       help="judge every submission with the full measurement")

    def run(self, args: argparse.Namespace) -> int:
        from ..mcp.server import _sdk, serve  # lazy: the MCP SDK (vendor)

        _sdk()  # the install hint before anything else
        if not args.workdir.is_dir():
            raise UsageError(f"work directory {args.workdir} does not exist")
        full = options_from_args(args)
        if not args.no_quick and (args.quick_max_blocks < 4 or args.quick_time_cap <= 0
                                  or not 1 <= args.quick_replicates <= 64):
            raise UsageError("--quick-max-blocks must be >= 4, --quick-time-cap > 0 and "
                             "--quick-replicates in [1, 64]")
        quick = None if args.no_quick else quick_options(
            full, max_blocks=args.quick_max_blocks, time_cap_s=args.quick_time_cap,
            replicates=args.quick_replicates)
        ws = Workspace(args.workdir, full, quick=quick)
        serve(ws, "stdio" if args.transport == "stdio" else "http", host=args.host,
              port=args.port)
        return 0
