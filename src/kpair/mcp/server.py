"""The MCP server: ``Workspace`` methods as tools on the SDK's ``MCPServer``.

Tools: ``profile``, ``capture``, ``list_operators``, ``describe_operator``,
``submit_candidate``, ``publish``. A ``KpairError`` becomes an MCP tool error (``is_error``)
whose text is kpair's own message, prefixed ``kpair:``; anything else is the SDK's generic
tool error (and its traceback goes to stderr, never to the stdio channel).
"""

from __future__ import annotations

import functools
import json
from typing import Any

from ..errors import BackendUnavailable, KpairError
from . import INSTALL_HINT
from .workspace import FORMS, Workspace


def _sdk():
    try:
        from mcp.server.mcpserver import MCPServer
        from mcp.server.mcpserver.exceptions import ToolError
    except ImportError:
        raise BackendUnavailable(f"kpair mcp needs the MCP Python SDK (2.x): {INSTALL_HINT}"
                                 ) from None
    return MCPServer, ToolError


INSTRUCTIONS = """kpair judges GPU (or host) kernels on real captured dispatches.
Loop: list_operators -> describe_operator (launch, regions ref reads/writes, policy, ref's
code as Triton/PTX/SASS/asm, ref's time, speed of light; a range's live-in, live-out and
scratch regions and its operations) -> submit_candidate (any form, or a launch plan; the
verdict is kpair's: PASS with a speedup and CI, or FAIL naming the trust check; quick by
default, full=true for the full measurement) -> publish a passing, faster candidate into a
release (it is measured in full again first). Every submission is recorded in attempts.jsonl."""


def build_server(ws: Workspace, *, host: str = "127.0.0.1", port: int = 8000):
    MCPServer, ToolError = _sdk()
    server = MCPServer("kpair", instructions=INSTRUCTIONS)

    def tool(fn):
        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            try:
                return fn(*args, **kwargs)
            except KpairError as e:
                raise ToolError(f"kpair: {e}") from None

        return server.tool()(wrapper)

    @tool
    def list_operators() -> list[dict[str, Any]]:
        """The operators of the work directory: every captured snapshot and every harness,
        with kernel, backend, architecture, launch geometry and region bytes."""
        return ws.list()

    @tool
    def describe_operator(operator: str, measure: bool = True, include_code: bool = True,
                          max_chars: int = 200_000) -> dict[str, Any]:
        """One operator: launch, kernarg parameters (offset, size), regions with sizes and
        whether ref reads or writes them, the validation policy, ref's code (Triton source,
        PTX, SASS, AMDGPU assembly where available), ref's measured time and its speed of
        light; for a range, 'range': its live-in, live-out (with declared output spans) and
        scratch regions (name, address, offset, size, role, dtype where recorded) and its
        operations (kind, kernel). measure=True measures ref once (it also sets the session
        up)."""
        return ws.describe(operator, measure=measure, code=include_code, max_chars=max_chars)

    @tool
    def submit_candidate(operator: str, form: str, code: str | dict[str, Any] | None = None,
                         path: str | None = None, kernel: str | None = None,
                         ptxas_options: list[str] | None = None,
                         config: dict[str, Any] | None = None,
                         launch_override: dict[str, Any] | None = None,
                         label: str | None = None, full: bool = False,
                         objects: dict[str, dict[str, Any]] | None = None) -> dict[str, Any]:
        """Judge a candidate against ref in the operator's persistent session with every
        trust check (a cheat fails either way), recorded in attempts.jsonl. By default a
        quick, exploratory measurement (one replicate, few ABBA blocks, a short time cap, no
        identical-binary control; 'judged': 'quick'); full=true gives the full replicated
        measurement, the verdict `kpair evaluate` gives (publish always runs it again).
        form: """ + "; ".join(f"{k}: {v}" for k, v in FORMS.items()) + """.
        code: the candidate's text (base64 for form=binary), or path: a file on the server.
        ptxas_options (ptx), config (triton: num_warps, num_stages, maxnreg, constants),
        launch_override (grid, block, dynamic_shared_bytes) are optional. The parameter list
        must match ref's (offsets and sizes), or nothing runs. form=plan: code is
        opt.plan.json (its JSON text or the object: launches of kernels with their own
        signatures, each parameter bound to a region of the range, a declared scratch buffer
        or a typed scalar) and
        objects maps each code object a launch names to {"form": binary|c|cuda|ptx|triton,
        "code" or "path"} (triton: also constants, num_warps, num_stages, signature); the
        plan is checked against the range and each code object's own parameter layout, and
        a bad one is refused naming the launch and the parameter before anything runs."""
        if isinstance(code, dict):   # the SDK reads a JSON object's text as the object
            code = json.dumps(code)
        return ws.submit(operator, form, code=code, path=path, kernel=kernel,
                         ptxas_options=ptxas_options, config=config,
                         launch_override=launch_override, label=label, full=full,
                         objects=objects)

    @tool
    def publish(operator: str, attempt: int, release: str, level: int | None = None,
                name: str | None = None, replace: bool = False,
                allow_slower: bool = False) -> dict[str, Any]:
        """`kpair release add` of a passing attempt: a harness of ref and that candidate is
        run again in full and published only if it passes and its speedup CI lies above 1."""
        return ws.publish(operator, attempt, release, level=level, name=name, replace=replace,
                          allow_slower=allow_slower)

    @tool
    def capture(command: list[str], out: str, top: int | None = 5,
                kernel: str | None = None, timeout_s: float | None = 900) -> dict[str, Any]:
        """`kpair capture --top K -o OUT -- COMMAND` (CUDA): profile the program, capture the
        first dispatch of its K most expensive kernels into OUT (inside the work directory);
        the new snapshots become operators. Stopped after timeout_s seconds (what was
        captured by then is kept)."""
        return ws.capture(command, out=out, top=top, kernel=kernel, timeout_s=timeout_s)

    @tool
    def profile(command: list[str], out: str, top: int = 20) -> dict[str, Any]:
        """`kpair profile -o OUT -- COMMAND` (CUDA): the program's kernels ranked by GPU
        time."""
        return ws.profile(command, out=out, top=top)

    return server


def serve(ws: Workspace, transport: str = "stdio", *, host: str = "127.0.0.1",
          port: int = 8000) -> None:
    server = build_server(ws)
    try:
        if transport == "stdio":
            server.run("stdio")
        else:
            server.run("streamable-http", host=host, port=port)
    finally:
        ws.close()
