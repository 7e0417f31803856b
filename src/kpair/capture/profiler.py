"""Profiling a program's kernels: in this process (``KernelProfiler``), or a whole program in
a child process (``profile_program``; the child is
``python -m kpair.capture.profiler (SCRIPT | -m MODULE | -c CODE) [ARGS...]``).

Lifetime of a ``KernelProfiler``: ``start()`` before the program's first CUDA call enables
kernel activity records; ``finish()`` synchronises the current context (so the last kernels'
records are complete), flushes, disables and returns the ``Profile``. Nothing here asks for
eager module loading or subscribes to launch callbacks: the program's own settings and
launch path are left as they are, and CUPTI timestamps the kernels on the GPU.

The child reads its settings from ``KPAIR_PROFILE`` (JSON: ``out``, ``command``), removes
the variable before the program runs, exits with the program's status, and writes
``profile.json`` after the program returns (also when it raised or called ``sys.exit``;
not when it ended the process itself with ``os._exit`` or a signal).
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from pathlib import Path

from .. import __version__
from .._util import utc_now
from ..errors import KpairError, UsageError, WorkerFailed
from ..formats import write
from . import cupti
from .activity import KernelActivity
from .child import child_command, child_environment, run_child, run_program
from .cudadrv import CudaDriver
from .profile import METHOD, PROFILE, KernelTimes, Profile, read_profile, top
from .tracer import software_environment

ENV = "KPAIR_PROFILE"
RUNNER = "kpair.capture.profiler"


class KernelProfiler:
    """Kernel times of this process. ``driver`` and ``lib`` (a loaded ``Cupti``) are found
    and loaded when not given; tests give stand-ins."""

    def __init__(self, cupti_path: str | None = None, *, driver=None,
                 lib: cupti.Cupti | None = None):
        self.driver = driver or CudaDriver()
        if lib is None:
            version = self.driver.driver_version()
            lib = cupti.Cupti(cupti_path or cupti.find_cupti(version // 1000 if version else None))
        self.cupti_path = lib.path
        self.times = KernelTimes()
        self.activity = KernelActivity(lib, self.times.add_records)
        self.started, self._t0 = utc_now(), time.monotonic()

    def start(self) -> KernelProfiler:
        self.activity.start()
        self.started, self._t0 = utc_now(), time.monotonic()
        return self

    def finish(self, command: list[str], exit_status: int | None = None) -> Profile:
        wall = time.monotonic() - self._t0
        notes: list[str] = []
        code = self.driver.synchronize()
        if code not in (0, 3, 201):  # 3 not initialised, 201 no context: no CUDA work left
            notes.append(f"cuCtxSynchronize at the end returned {self.driver.error_name(code)}:"
                         " the last kernels may be missing or incomplete")
        self.activity.stop()
        kernels = self.times.kernels()
        launches = sum(k.launches for k in kernels)
        if not kernels:
            notes.append("no kernel ran on the GPU in this process (kernels of processes the "
                         "program started are not profiled)")
        if self.times.incomplete:
            notes.append(f"{self.times.incomplete} kernel records had no end time (still "
                         "running when the program ended) and are left out")
        if self.activity.dropped:
            notes.append(f"CUPTI dropped {self.activity.dropped} records (no buffer was "
                         "free): the counts and times are too low")
        notes += [f"internal error: {e}" for e in self.activity.errors]
        return Profile(kpair_version=__version__, command=list(command), started=self.started,
                       wall_s=round(wall, 3), exit_status=exit_status, method=METHOD,
                       environment=self.environment(), launches=launches,
                       kernel_time_ns=sum(k.total_ns for k in kernels),
                       incomplete_records=self.times.incomplete,
                       dropped_records=self.activity.dropped, notes=notes, kernels=kernels)

    def environment(self) -> dict:
        env: dict = {"backend": "cuda", "cupti": self.cupti_path,
                     "module_loading": os.environ.get("CUDA_MODULE_LOADING",
                                                      "LAZY (default)")}
        device = self.driver.current_device()
        if device is not None:
            env.update(self.driver.device_facts(device))
        env.update(software_environment())
        return env


# ---------------------------------------------------------------- the child

def main() -> int:
    settings = json.loads(os.environ.pop(ENV, "{}") or "{}")
    argv = sys.argv[1:]
    if sys.path and sys.path[0] in ("", os.getcwd()):
        sys.path.pop(0)  # `python -m` put the cwd first; the program's own rule follows
    try:
        profiler = KernelProfiler().start()
    except KpairError as e:
        print(f"kpair profile: {e}", file=sys.stderr)
        return e.exit_code
    except Exception as e:  # a profile that cannot start must not run the program unprofiled
        print(f"kpair profile: profiling could not start: {e!r}", file=sys.stderr)
        return 5
    status = run_program(argv)
    try:
        profile = profiler.finish(settings.get("command") or argv, status)
        write(Path(settings.get("out", PROFILE)), profile)
    except Exception as e:  # the program's status matters more than the profile
        print(f"kpair profile: could not write the profile: {e!r}", file=sys.stderr)
    return status


# ---------------------------------------------------------------- the parent

def run_profile(command: list[str], out: str | os.PathLike, *, stdout=None, stderr=None,
                cwd: str | os.PathLike | None = None, timeout_s: float | None = None
                ) -> tuple[int, Profile | None]:
    """Run ``command`` (``python ... prog.py ARGS``) under the profiler, writing ``out``;
    ``stdout``/``stderr``: where the program's output goes (a descriptor or file; None:
    inherited); ``timeout_s``: the child's whole process group is killed past it.

    Returns the program's exit status and the profile (None when the child wrote none: it
    could not start, or it died before the program returned)."""
    argv = child_command(command, runner=RUNNER, usage="kpair profile")
    out = Path(out).resolve()
    if out.exists():
        raise UsageError(f"{out} exists; kpair does not overwrite files (remove it or name "
                         "another with -o)")
    cupti.find_cupti()  # fail here, with the install hint, rather than inside the child
    env = child_environment(ENV, {"out": str(out), "command": list(command)})
    ended = run_child(argv, env, stdout=stdout, stderr=stderr, cwd=cwd, timeout_s=timeout_s)
    return ended.status, read_profile(out) if out.exists() else None


def profile_program(command: list[str], out: str | os.PathLike | None = None) -> Profile:
    """The ``Profile`` of a whole program run (written to ``out`` too when it is given);
    WorkerFailed when the profiling child wrote none."""
    with tempfile.TemporaryDirectory(prefix="kpair-profile-") as tmp:
        status, profile = run_profile(command, out or Path(tmp) / PROFILE)
    if profile is None:
        raise WorkerFailed(f"the profiling run ended with status {status} and wrote no "
                           "profile (its error is above)")
    return profile


def top_kernels(command: list[str], k: int, kernel: str | None = None) -> list[str]:
    """Mangled names of the ``k`` kernels that take most of ``command``'s GPU time (among
    those matching the regular expression ``kernel``), most expensive first."""
    return [t.name for t in top(profile_program(command), k, kernel)]


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.exit(code)
