"""The isolated worker: ``python -m kpair.worker HARNESS --result R --stage S ...``.

Runs ``kpair.run.execute`` and writes its result to R. Expected failures (bad input, driver
errors) become an ``error`` result with the exception's exit code; a crash leaves no R, and
the parent reads the last stage written to S to say where it happened.
"""

from __future__ import annotations

import argparse
import json
import sys
import traceback
from pathlib import Path

from .errors import KpairError
from .run import RunOptions, error_result, execute
from .snapshot import write_json_atomic


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m kpair.worker")
    p.add_argument("harness", type=Path)
    p.add_argument("--result", type=Path, required=True)
    p.add_argument("--stage", type=Path, required=True)
    p.add_argument("--samples", type=Path)
    p.add_argument("--options", default="{}")
    args = p.parse_args(argv)
    current = {"stage": None}

    def stage(name: str) -> None:
        current["stage"] = name
        args.stage.write_text(name)  # read by the parent if this process dies

    partial: dict = {}
    try:
        result = execute(args.harness, RunOptions.from_json(json.loads(args.options)),
                         stage=stage, samples_path=args.samples, result=partial)
    except KpairError as e:
        result = error_result(args.harness, e, stage=current["stage"], partial=partial)
        result["error"]["exit_code"] = e.exit_code
    except Exception as e:  # noqa: BLE001 - an unexpected bug still must not claim a verdict
        result = error_result(args.harness, f"{type(e).__name__}: {e}",
                              stage=current["stage"], kind="InternalError", partial=partial)
        result["error"]["traceback"] = traceback.format_exc()
    write_json_atomic(args.result, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
