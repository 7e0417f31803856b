"""``python -m kpair.capture.program (SCRIPT | -m MODULE | -c CODE) [ARGS...]``: run a Python
program with capture installed before its first line, as ``python`` itself would run it.

``kpair capture`` starts this in a child process with the session's settings in the
``KPAIR_CAPTURE`` environment variable (JSON); the variable is removed before the program
runs, so processes the program starts are not captured. The program's own exit status is
this process's exit status; ``capture.json`` is final when it ends (and is rewritten after
every dispatch, so a crash keeps what was captured).
"""

from __future__ import annotations

import json
import os
import runpy
import sys
import traceback

ENV = "KPAIR_CAPTURE"


def exit_status(e: SystemExit) -> int:
    """The status ``python`` would exit with for ``SystemExit(e.code)``."""
    code = e.code
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    print(code, file=sys.stderr)
    return 1


def run_program(argv: list[str]) -> int:
    """Run ``argv`` (``SCRIPT ARGS``, ``-m MODULE ARGS`` or ``-c CODE ARGS``) as __main__."""
    if not argv:
        raise SystemExit("kpair.capture.program: no program given")
    try:
        if argv[0] == "-c":
            if len(argv) < 2:
                raise SystemExit("kpair.capture.program: -c needs a code string")
            sys.argv = ["-c", *argv[2:]]
            sys.path.insert(0, "")
            code = compile(argv[1], "<string>", "exec")
            exec(code, {"__name__": "__main__", "__builtins__": __builtins__})
        elif argv[0] == "-m":
            if len(argv) < 2:
                raise SystemExit("kpair.capture.program: -m needs a module name")
            sys.argv = [argv[1], *argv[2:]]
            sys.path.insert(0, os.getcwd())
            runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
        else:
            script = argv[0]
            sys.argv = list(argv)
            sys.path.insert(0, os.path.dirname(os.path.abspath(script)))
            runpy.run_path(script, run_name="__main__")
    except SystemExit as e:
        return exit_status(e)
    except KeyboardInterrupt:
        traceback.print_exc()
        return 130
    except BaseException:
        traceback.print_exc()
        return 1
    return 0


def main() -> int:
    from ..errors import KpairError

    settings = json.loads(os.environ.pop(ENV, "{}") or "{}")
    argv = sys.argv[1:]
    if sys.path and sys.path[0] in ("", os.getcwd()):
        sys.path.pop(0)  # `python -m` put the cwd first; the program's own rule follows
    try:
        from . import finish_session, start_session

        session = start_session(settings.get("out", "kpair-capture"),
                                kernel=settings.get("kernel"), nth=settings.get("nth", 1),
                                max=settings.get("max", 1),
                                distinct=settings.get("distinct", False),
                                max_region_bytes=settings.get("max_region_bytes", 2 << 30),
                                command=settings.get("command") or argv)
    except KpairError as e:
        print(f"kpair capture: {e}", file=sys.stderr)
        return e.exit_code
    except Exception as e:  # capture that cannot start must not run the program uncaptured
        print(f"kpair capture: capture could not start: {e!r}", file=sys.stderr)
        return 5
    status = run_program(argv)
    try:
        finish_session(session, status)
    except Exception as e:  # the program's status matters more than a summary write
        print(f"kpair capture: could not finish capture.json: {e!r}", file=sys.stderr)
    return status


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.exit(code)
