"""``kpair mcp``: kpair as the environment of a kernel-editing agent, over the Model Context
Protocol (the official ``mcp`` Python SDK; ``pip install 'kpair[mcp]'``).

``workspace`` holds what the tools do (operators of a work directory, their persistent
evaluation sessions, candidates and winners) and imports no SDK; ``build`` turns a candidate
of any form into a code object with ref's ABI; ``server`` registers the tools on an SDK
server (stdio or streamable HTTP) and turns kpair's errors into MCP tool errors.
"""

INSTALL_HINT = "pip install 'kpair[mcp]'"
