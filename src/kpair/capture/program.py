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
import sys

from ..errors import KpairError
from .child import exit_status, run_program  # noqa: F401  (the runner's API, kept here too)

ENV = "KPAIR_CAPTURE"


def main() -> int:
    settings = json.loads(os.environ.pop(ENV, "{}") or "{}")
    argv = sys.argv[1:]
    if sys.path and sys.path[0] in ("", os.getcwd()):
        sys.path.pop(0)  # `python -m` put the cwd first; the program's own rule follows
    try:
        # inside the try: capture that cannot even import must not run the program
        from . import finish_session, start_range_session, start_session

        if settings.get("ranges"):
            session = start_range_session(
                settings.get("out", "kpair-capture"), settings["ranges"],
                nth=settings.get("nth", 1),
                max_region_bytes=settings.get("max_region_bytes", 2 << 30),
                command=settings.get("command") or argv,
                store_bytes=settings.get("store_bytes", False),
                post_digest_over=settings.get("post_digest_over"))
        else:
            session = start_session(
                settings.get("out", "kpair-capture"), kernel=settings.get("kernel"),
                nth=settings.get("nth", 1), max=settings.get("max", 1),
                distinct=settings.get("distinct", False),
                max_region_bytes=settings.get("max_region_bytes", 2 << 30),
                command=settings.get("command") or argv, names=settings.get("names"),
                profile=settings.get("profile"),
                store_bytes=settings.get("store_bytes", False),
                post_digest_over=settings.get("post_digest_over"))
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
