"""Live progress of long commands: one reporter per process, fed from anywhere below it.

A command installs a *reporter* for its whole run (``using``); the code below it reports into
whichever reporter is current, through four functions, without knowing who watches:

    task(what, k, n)     a unit of work starts in this thread (harness k of n, candidate k):
                         a context manager; tasks nest ("operator 2/3 > candidate 5")
    stage(name)          the current task enters a stage (a pipeline stage, "build host-c")
    measuring(meter)     ABBA blocks so far, the interval so far and an ETA (a ``Meter``)
    note(line)           a line to keep (a finished item's verdict)

A *lane* is what one thread is doing: its stack of tasks, its stage and its latest meter
(several lanes at once when a pool runs one harness per device). Reporters:

- ``Silent``: the default, so a library caller sees nothing it did not ask for;
- ``Lines``: plain lines, for logs and CI (stderr is no terminal): a line at every task and
  stage, and a *heartbeat* that prints each lane's status again whenever that lane printed
  nothing for ``interval`` seconds, so a long single step (a 30 s timing phase, a child
  capture) is never silent for long;
- ``Live``: a rich live display on a terminal, one redrawn line per lane with a spinner, the
  stage, the meter and the time in the stage; kept lines print above it;
- in a worker process, ``kpair.isolation``'s channel reporter sends stages and meters to
  the parent, whose reporter shows them.

``for_command`` picks one: ``--quiet`` or ``KPAIR_PROGRESS=off`` silence it,
``KPAIR_PROGRESS=plain`` forces plain lines, ``KPAIR_PROGRESS_INTERVAL`` sets the heartbeat
(seconds, default 3). Progress never goes to stdout: ``--json`` output stays one document.
"""

from __future__ import annotations

import contextlib
import math
import os
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TextIO

#: Seconds of silence after which a plain-line reporter repeats a lane's status.
INTERVAL_S = 3.0
#: A task's name is cut to this many characters (from the left: a path keeps its file name).
TITLE_CHARS = 48


# --------------------------------------------------------------------------- what is said


@dataclass(frozen=True)
class Meter:
    """How far an ABBA measurement is: ``blocks`` timed in ``what`` (e.g. "replicate 2/4")
    after ``elapsed_s``, the speedup and its 95% interval so far (None until the first
    analysis), the CI's relative half-width against its ``target``, and an ETA."""

    what: str
    blocks: int
    elapsed_s: float
    speedup: float | None = None
    ci95: tuple[float, float] | None = None
    rel_ci: float | None = None
    target: float | None = None
    eta_s: float | None = None

    def describe(self) -> str:
        parts = [f"{self.what}, {self.blocks} blocks" if self.what else f"{self.blocks} blocks"]
        if _finite(self.eta_s):  # before the numbers: on a narrow terminal it stays in view
            parts.append(f"ETA {_duration(self.eta_s)}")
        if _finite(self.speedup):
            ci = f" [{self.ci95[0]:.3f}, {self.ci95[1]:.3f}]" if self.ci95 and all(
                _finite(x) for x in self.ci95) else ""
            parts.append(f"{self.speedup:.3f}x{ci}")
        if _finite(self.rel_ci):
            goal = f" (target {_percent(self.target)})" if _finite(self.target) else ""
            parts.append(f"\u00b1{_percent(self.rel_ci)}{goal}")
        return ", ".join(parts)


def eta_s(*, blocks: int, elapsed_s: float, rel_ci: float | None, target: float,
          min_blocks: int, max_blocks: int, time_cap_s: float) -> float | None:
    """Seconds left before a stopping rule ends a measurement (None before any block).

    The rule stops at the first of: the CI half-width at ``target`` (after ``min_blocks``),
    ``max_blocks``, or ``time_cap_s``. A half-width shrinks as 1/sqrt(blocks), so the blocks
    the CI still needs are about blocks * (rel_ci / target)^2; blocks come at the rate seen
    so far."""
    if blocks <= 0 or elapsed_s <= 0:
        return None
    per_block = elapsed_s / blocks
    left = [max(0.0, time_cap_s - elapsed_s), max(0, max_blocks - blocks) * per_block]
    if rel_ci is not None and math.isfinite(rel_ci) and target > 0:
        need = max(min_blocks, math.ceil(blocks * (rel_ci / target) ** 2))
        left.append(max(0, need - blocks) * per_block)
    return min(left)


# --------------------------------------------------------------------------- lanes


@dataclass
class Lane:
    """What one thread is doing: its tasks (outermost first), stage and latest meter."""

    tasks: list[str] = field(default_factory=list)
    stage: str | None = None
    stage_started: float = field(default_factory=time.monotonic)
    meter: Meter | None = None
    said: float = field(default_factory=time.monotonic)   # when a line last spoke of it
    shown: str | None = None                               # the stage a line last named

    def status(self, now: float) -> str:
        """``tasks: stage - meter (time in stage)``, the parts there are."""
        head = " > ".join(self.tasks)
        body = " - ".join(x for x in (self.stage, self.meter and self.meter.describe()) if x)
        text = ": ".join(x for x in (head, body) if x) or "working"
        clock = _duration(now - self.stage_started)
        return f"{text} ({clock} in stage)" if self.stage else f"{text} ({clock})"


class Reporter:
    """The lanes of one process; subclasses say how (and whether) they are shown."""

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._lanes: dict[int, Lane] = {}
        self._idle = Lane()  # stands for the command while no thread has reported anything

    def _lane(self) -> Lane:
        with self._lock:
            return self._lanes.setdefault(threading.get_ident(), Lane())

    def enter(self, title: str) -> None:
        with self._lock:
            lane = self._lane()
            lane.tasks.append(_printable(title))
            lane.stage, lane.meter, lane.stage_started = None, None, time.monotonic()
            self._said(lane, " > ".join(lane.tasks))

    def leave(self) -> None:
        with self._lock:
            lane = self._lane()
            if lane.tasks:
                lane.tasks.pop()
            lane.stage, lane.meter, lane.stage_started = None, None, time.monotonic()
            if not lane.tasks:
                self._lanes.pop(threading.get_ident(), None)

    def stage(self, name: str) -> None:
        with self._lock:
            lane = self._lane()
            name = _printable(name)
            if name == lane.stage:
                return
            lane.stage, lane.meter, lane.stage_started = name, None, time.monotonic()

    def measuring(self, meter: Meter) -> None:
        with self._lock:
            self._lane().meter = meter

    def note(self, line: str) -> None:
        """A line to keep."""

    def close(self) -> None:
        """Stop showing (the command is over)."""

    def _said(self, lane: Lane, line: str) -> None:
        """A task started: shown at once where the reporter shows lines."""


class Silent(Reporter):
    """Shows nothing (library use, ``--quiet``)."""


class Lines(Reporter):
    """Plain lines on ``stream``, each ``<prog>: <status>``: a task as it starts, a stage
    once it has lasted ``announce`` seconds (a log need not list the many stages that take
    milliseconds), and a heartbeat thread that repeats a lane's status after ``interval``
    seconds without a line about it."""

    def __init__(self, prog: str, stream: TextIO, interval: float = INTERVAL_S):
        super().__init__()
        self.prog, self.stream, self.interval = prog, stream, interval
        self.announce = min(1.0, interval / 3)
        self._stop = threading.Event()
        self._beat = threading.Thread(target=self._heartbeat, daemon=True,
                                      name="kpair-progress")
        self._beat.start()

    def note(self, line: str) -> None:
        with self._lock:
            self._write(_printable(line, keep_newlines=True))

    def close(self) -> None:
        self._stop.set()
        self._beat.join(timeout=1.0)

    def _said(self, lane: Lane, line: str) -> None:
        lane.said = time.monotonic()
        self._write(f"{self.prog}: {line}")

    def _write(self, line: str) -> None:
        with contextlib.suppress(OSError, ValueError):  # a closed stream ends progress only
            self.stream.write(line + "\n")
            self.stream.flush()

    def _heartbeat(self) -> None:
        while not self._stop.wait(min(0.25, self.interval / 4)):
            self.beat(time.monotonic())

    def beat(self, now: float) -> None:
        """Name each lane's stage once it has lasted ``announce`` seconds, and repeat the
        status of every lane silent for ``interval`` seconds. The root lane (a thread with
        no task) speaks only when no task lane is running."""
        with self._lock:
            lanes = list(self._lanes.values())
            busy = [lane for lane in lanes if lane.tasks]
            for lane in busy or lanes or [self._idle]:
                settled = now - lane.stage_started >= self.announce
                new = lane.stage is not None and lane.stage != lane.shown and settled
                # A stage that has just begun is named once it settles (at most `announce`
                # later), not as "0.0 s in stage".
                silent = now - lane.said >= self.interval + (0 if settled else self.announce)
                if new or silent:
                    lane.shown = lane.stage
                    self._said(lane, lane.status(now))


class Live(Reporter):
    """A rich live display on a terminal (``stream``): one line per lane, redrawn several
    times a second; notes, and stdout when it is the same terminal, print above it."""

    def __init__(self, prog: str, stream: TextIO):
        from rich.console import Console
        from rich.live import Live as RichLive

        super().__init__()
        self.prog = prog
        self.console = Console(file=stream, stderr=True, highlight=False)
        out_tty = _isatty(sys.stdout)
        self.live = RichLive(get_renderable=self._render, console=self.console,
                             refresh_per_second=8, transient=True,
                             redirect_stdout=out_tty, redirect_stderr=True)
        self.live.start()

    def note(self, line: str) -> None:
        from rich.text import Text

        self.console.print(Text(_printable(line, keep_newlines=True)))

    def close(self) -> None:
        self.live.stop()

    def _render(self):
        from rich.spinner import Spinner
        from rich.table import Table
        from rich.text import Text

        now = time.monotonic()
        with self._lock:
            lanes = [lane for lane in self._lanes.values() if lane.tasks] or \
                list(self._lanes.values()) or [self._idle]
            rows = [lane.status(now) for lane in lanes]
        grid = Table.grid(padding=(0, 1))
        for row in rows:
            grid.add_row(Spinner("dots", style="cyan"), Text(self.prog, style="bold"),
                         Text(row, no_wrap=True, overflow="ellipsis"))
        return grid


# --------------------------------------------------------------------------- the current one

_current: Reporter = Silent()


def current() -> Reporter:
    return _current


@contextlib.contextmanager
def using(reporter: Reporter) -> Iterator[Reporter]:
    """Make ``reporter`` the current one for the length of the block (then close it)."""
    global _current
    before, _current = _current, reporter
    try:
        yield reporter
    finally:
        _current = before
        reporter.close()


def for_command(prog: str, *, quiet: bool = False, stream: TextIO | None = None) -> Reporter:
    """The reporter a command shows its progress with, on ``stream`` (stderr): see the
    module docstring for the choice and the variables that change it."""
    stream = stream or sys.stderr
    mode = os.environ.get("KPAIR_PROGRESS", "").strip().lower()
    if quiet or mode in ("off", "0", "no", "quiet"):
        return Silent()
    try:
        interval = float(os.environ.get("KPAIR_PROGRESS_INTERVAL", INTERVAL_S))
    except ValueError:
        interval = INTERVAL_S
    if not (math.isfinite(interval) and interval > 0):
        interval = INTERVAL_S
    terminal = _isatty(stream) and os.environ.get("TERM") != "dumb"
    if mode != "plain" and (mode == "live" or terminal):
        try:
            return Live(prog, stream)
        except ImportError:
            pass  # rich is missing: plain lines need nothing
    return Lines(prog, stream, interval)


@contextlib.contextmanager
def task(what: str, k: int | None = None, n: int | None = None) -> Iterator[None]:
    """A unit of work in this thread: ``[k/n] what`` (or ``[k] what``, or ``what``); a long
    ``what`` (a path) keeps its end, the part that tells items apart."""
    what = str(what)
    if len(what) > TITLE_CHARS:
        what = "\u2026" + what[-(TITLE_CHARS - 1):]
    title = f"[{k}/{n}] {what}" if k is not None and n is not None else \
        f"[{k}] {what}" if k is not None else what
    reporter = _current
    reporter.enter(title)
    try:
        yield
    finally:
        reporter.leave()


def stage(name: str) -> None:
    _current.stage(name)


def measuring(meter: Meter) -> None:
    _current.measuring(meter)


def note(line: str) -> None:
    _current.note(line)


# --------------------------------------------------------------------------- helpers


def _finite(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def _percent(x: float) -> str:
    return f"{100 * x:.3g}%"


def _duration(s: float) -> str:
    s = max(0.0, s)
    if s < 10:
        return f"{s:.1f} s"
    if s < 120:
        return f"{s:.0f} s"
    return f"{int(s // 60)} min {int(s % 60):02d} s"


def _printable(text: str, *, limit: int = 200, keep_newlines: bool = False) -> str:
    """``text`` without control characters (a stage name or label must not drive the
    terminal), cut to ``limit`` characters per line."""
    lines = str(text).split("\n") if keep_newlines else [str(text)]
    out = ["".join(c if c.isprintable() else "?" for c in line)[:limit] for line in lines]
    return "\n".join(out)


def _isatty(stream) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError, OSError):
        return False


__all__ = ["INTERVAL_S", "Lines", "Live", "Meter", "Reporter", "Silent", "current", "eta_s",
           "for_command", "measuring", "note", "stage", "task", "using"]
