"""``profile.json``: which kernels take a program's GPU time, as one typed record.

Main abstractions: ``KernelTimes`` (kernel durations per name, fed with activity records as
they arrive), ``Profile`` (the file: per kernel launches, total, median, min and max time and
share of all kernel time, most expensive first), ``top`` (the K kernels ``capture --top``
takes) and ``format_table`` (the table ``kpair profile`` prints). All pure: the CUPTI side is
``activity``, the process side ``profiler``. ``read_profile`` is the strict reader;
``docs/format.md`` describes the fields; ``docs/schemas/profile.schema.json`` is generated.
"""

from __future__ import annotations

import re
import statistics
import threading
from array import array
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Annotated, Any, Literal

import msgspec

from ..errors import UsageError
from ..formats import Record, read
from .activity import KernelRecord
from .names import demangle

SCHEMA = "kpair.profile"
SCHEMA_VERSION = 1
PROFILE = "profile.json"
#: How the times were taken (the one method so far).
METHOD = "cupti-activity:concurrent_kernel"

Count = Annotated[int, msgspec.Meta(ge=0)]
Positive = Annotated[int, msgspec.Meta(ge=1)]
Share = Annotated[float, msgspec.Meta(ge=0.0, le=1.0)]


class KernelTime(Record):
    """One kernel (by mangled name) over the whole run; times in GPU nanoseconds."""

    name: str
    demangled: str
    launches: Positive
    total_ns: Count
    median_ns: float
    min_ns: Count
    max_ns: Count
    share: Share


class Profile(Record, kw_only=True, tag_field="schema", tag=SCHEMA):
    """The whole ``profile.json``."""

    schema_version: Literal[1] = SCHEMA_VERSION
    kpair_version: str
    command: list[str]
    started: str
    wall_s: float
    exit_status: int | None
    method: str
    environment: dict[str, Any]
    launches: Count
    kernel_time_ns: Count
    incomplete_records: Count
    dropped_records: Count
    notes: list[str]
    kernels: list[KernelTime]


def read_profile(path: str | Path) -> Profile:
    """The ``profile.json`` at ``path`` (or in the directory ``path``), validated."""
    path = Path(path)
    if path.is_dir():
        path = path / PROFILE
    return read(path, Profile, schema=SCHEMA, version=SCHEMA_VERSION)


class KernelTimes:
    """Durations per kernel name. ``add_records`` is the activity sink: it runs on CUPTI's
    buffer thread while the program runs, so it only appends."""

    def __init__(self):
        self.incomplete = 0
        self._durations: dict[str, array] = {}
        self._lock = threading.Lock()

    def add(self, name: str, duration_ns: int) -> None:
        with self._lock:
            times = self._durations.get(name)
            if times is None:
                times = self._durations[name] = array("q")
            times.append(duration_ns)

    def add_records(self, records: Iterable[KernelRecord], name_of: Callable[[int], str]
                    ) -> None:
        for r in records:
            if r.complete:
                self.add(name_of(r.name_address), r.duration)
            else:
                with self._lock:
                    self.incomplete += 1

    def kernels(self) -> list[KernelTime]:
        """Every kernel seen, most total time first (ties by name, so the order is stable)."""
        with self._lock:
            items = [(name, sorted(times)) for name, times in self._durations.items()]
        grand = sum(sum(times) for _, times in items)
        out = [KernelTime(name=name, demangled=demangle(name), launches=len(times),
                          total_ns=sum(times), median_ns=float(statistics.median(times)),
                          min_ns=times[0], max_ns=times[-1],
                          share=sum(times) / grand if grand else 0.0)
               for name, times in items]
        out.sort(key=lambda k: (-k.total_ns, k.name))
        return out


def top(profile: Profile, k: int, kernel: str | None = None) -> list[KernelTime]:
    """The ``k`` kernels with the most total time; only those whose mangled or demangled name
    matches the regular expression ``kernel`` when it is given."""
    if k < 1:
        raise UsageError(f"--top must be 1 or more, got {k}")
    try:
        pattern = re.compile(kernel) if kernel else None
    except re.error as e:
        raise UsageError(f"--kernel {kernel!r} is not a valid regular expression: {e}"
                         ) from None
    chosen = [t for t in profile.kernels
              if pattern is None or pattern.search(t.demangled) or pattern.search(t.name)]
    return chosen[:k]


def _duration(ns: float) -> str:
    if ns >= 1e9:
        return f"{ns / 1e9:.2f} s"
    if ns >= 1e6:
        return f"{ns / 1e6:.2f} ms"
    return f"{ns / 1e3:.1f} µs"


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[:limit - 1] + "…"


def format_table(profile: Profile, n: int = 20, width: int = 100) -> str:
    """The ``n`` most expensive kernels as a table for people, and what the rest add up to."""
    rows = [f"{'#':>3} {'share':>6} {'total':>10} {'launches':>8} {'median':>10} "
            f"{'max':>10}  kernel"]
    for i, t in enumerate(profile.kernels[:n], 1):
        rows.append(f"{i:>3} {t.share:>6.1%} {_duration(t.total_ns):>10} {t.launches:>8} "
                    f"{_duration(t.median_ns):>10} {_duration(t.max_ns):>10}  "
                    f"{_cut(t.demangled, width)}")
    rest = profile.kernels[n:]
    if rest:
        share = sum(t.share for t in rest)
        rows.append(f"    ({len(rest)} more kernels: {share:.1%} of kernel time)")
    rows.append(f"kernel time {_duration(profile.kernel_time_ns)} in {profile.launches} "
                f"launches of {len(profile.kernels)} kernels; program wall time "
                f"{profile.wall_s:.2f} s, exit status {profile.exit_status}")
    rows += [f"note: {note}" for note in profile.notes]
    return "\n".join(rows)
