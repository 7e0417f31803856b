"""``kpair mcp``: kpair as the environment of a kernel-editing agent, over the Model Context
Protocol (the official ``mcp`` Python SDK; ``pip install 'kpair[mcp]'``).

``workspace`` holds what the tools do (operators of a work directory, their persistent
evaluation sessions, candidates and winners) and imports no SDK; ``build`` turns a candidate
of any form into a code object with ref's ABI; ``plans`` builds a submitted launch plan's code
objects and checks the plan against the range, and describes a range; ``server`` registers the
tools on an SDK server (stdio or streamable HTTP) and turns kpair's errors into MCP tool errors.
"""

INSTALL_HINT = "pip install 'kpair[mcp]'"

#: The quick measurement's defaults (``kpair mcp --quick-*``): as ``kpair optimize``'s prune
#: stage, shorter still — a ~10 us kernel is judged in well under a second.
QUICK_MAX_BLOCKS = 16
QUICK_TIME_CAP_S = 0.15
QUICK_REPLICATES = 1
