"""Running a user's Python program in a child process with a kpair bootstrap before its first
line: ``python [options] -m kpair.capture.<runner> prog.py ARGS``.

Used by ``kpair capture`` (runner ``program``: capture installed) and ``kpair profile``
(runner ``profile``: kernel timing). The runner's settings travel as JSON in one environment
variable, which the runner removes before the program starts, so processes the program
starts run unobserved. The child's exit status is the program's own.
"""

from __future__ import annotations

import json
import os
import re
import runpy
import subprocess
import sys
import traceback
from dataclasses import dataclass
from pathlib import Path

from .._util import kill_group
from ..errors import UsageError

#: Interpreter options that take a value (``python -X dev prog.py``).
_OPTIONS_WITH_VALUE = {"-X", "-W", "--check-hash-based-pycs"}


def is_python(word: str) -> bool:
    name = os.path.basename(word)
    return bool(re.fullmatch(r"python[\d.]*", name)) or (
        os.path.isabs(word) and os.path.realpath(word) == os.path.realpath(sys.executable))


def child_command(command: list[str], runner: str = "kpair.capture.program",
                  usage: str = "kpair capture -o DIR") -> list[str]:
    """The command with ``-m RUNNER`` inserted after the interpreter's options.

    ``python -u prog.py a`` → ``python -u -m kpair.capture.program prog.py a``; the program part
    (script, ``-m module`` or ``-c code``) and its arguments are passed on untouched.
    """
    if not command:
        raise UsageError(f"no command given: {usage} -- python prog.py ARGS...")
    if not is_python(command[0]):
        tool = " ".join(usage.split()[:2])
        raise UsageError(f"{tool} runs Python programs: the command must start "
                         f"with a Python interpreter (python, python3, ...), not "
                         f"{command[0]!r}. For other programs, use kpair.capture from inside")
    i = 1
    while i < len(command):
        word = command[i]
        if word in ("-m", "-c") or not word.startswith("-") or word == "-":
            break
        if word == "--":
            i += 1
            break
        i += 2 if word in _OPTIONS_WITH_VALUE else 1
    if i >= len(command):
        raise UsageError("the Python command names no program (a script, -m MODULE or -c CODE)")
    return [*command[:i], "-m", runner, *command[i:]]


def child_environment(variable: str, settings: dict, module_loading: str | None = None,
                      base: dict | None = None) -> dict:
    """``base`` (default this process's environment) plus the runner's settings;
    ``CUDA_MODULE_LOADING`` set when ``module_loading`` is given (left as the user has it
    otherwise)."""
    env = dict(os.environ if base is None else base)
    env[variable] = json.dumps(settings)
    if module_loading is not None:
        env["CUDA_MODULE_LOADING"] = module_loading.upper()
    # The child may be another interpreter: make this kpair importable there too.
    here = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (env.get("PYTHONPATH"), here) if p)
    return env


def status_of(returncode: int) -> int:
    """A child's status as a shell reports it: 128 + signal number when it was killed."""
    return 128 - returncode if returncode < 0 else returncode


@dataclass(frozen=True)
class ChildRun:
    """How a runner child ended: its status as a shell reports it, and whether it was
    stopped at its time limit (its whole process group killed)."""

    status: int
    timed_out: bool = False


def run_child(argv: list[str], env: dict, *, stdout=None, stderr=None, cwd=None,
              timeout_s: float | None = None) -> ChildRun:
    """Run a runner child (``child_command``'s argv) to its end. ``stdout``/``stderr``: where
    its output goes (a descriptor or file; None: inherited). With ``timeout_s`` the child
    starts its own process group, killed whole when the time is up (or when this process
    is interrupted while waiting)."""
    if timeout_s is None:
        proc = subprocess.run(argv, env=env, stdout=stdout, stderr=stderr, cwd=cwd)
        return ChildRun(status_of(proc.returncode))
    child = subprocess.Popen(argv, env=env, stdout=stdout, stderr=stderr, cwd=cwd,
                             stdin=subprocess.DEVNULL, start_new_session=True)
    try:
        return ChildRun(status_of(child.wait(timeout=max(timeout_s, 0.0))))
    except subprocess.TimeoutExpired:
        kill_group(child)
        return ChildRun(status_of(-9), timed_out=True)
    except BaseException:
        kill_group(child)
        raise


def strip_separator(command: list[str]) -> list[str]:
    """argparse's REMAINDER keeps a leading ``--``; the program starts after it."""
    return list(command[1:] if command and command[0] == "--" else command)


# ---------------------------------------------------------------- inside the child

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
        raise SystemExit("kpair runner: no program given")
    try:
        if argv[0] == "-c":
            if len(argv) < 2:
                raise SystemExit("kpair runner: -c needs a code string")
            sys.argv = ["-c", *argv[2:]]
            sys.path.insert(0, "")
            code = compile(argv[1], "<string>", "exec")
            exec(code, {"__name__": "__main__", "__builtins__": __builtins__})
        elif argv[0] == "-m":
            if len(argv) < 2:
                raise SystemExit("kpair runner: -m needs a module name")
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
