"""``capture.json``: what a capture session saw and wrote, as one typed record.

``CaptureSummary`` is the file; ``Dispatch`` is one selected launch in it, from the moment
it was selected (``status`` ``capturing``) to its snapshot (``captured``) or the reason it
has none (``failed``). The session keeps its dispatches as it goes and builds the record
each time it rewrites the file, so a field it writes that the format does not define fails
in the tests, not in a reader's hands. ``read_summary`` is the strict reader.
``docs/format.md`` describes the fields; ``docs/schemas/capture.schema.json`` is generated.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal

import msgspec
from msgspec import UNSET, UnsetType

from ..formats import Address, Record, read
from ..snapshot.model import OmittedRegion

SCHEMA = "kpair.capture"
SCHEMA_VERSION = 1
SUMMARY = "capture.json"

Count = Annotated[int, msgspec.Meta(ge=0)]
Positive = Annotated[int, msgspec.Meta(ge=1)]


class CaptureFilter(Record):
    """Which launches the session selects (``capture.filters.Filter``'s settings)."""

    kernel: str | None
    nth: Positive
    max: Positive | None
    distinct: bool
    names: list[str] | UnsetType = UNSET


class ProfiledKernel(Record):
    """One kernel ``--top`` chose, as the profile measured it."""

    rank: Positive
    name: str
    demangled: str
    launches: Positive
    total_ns: Count
    share: Annotated[float, msgspec.Meta(ge=0.0, le=1.0)]


class ProfileUse(Record):
    """The profile ``capture --top`` chose its kernels from: the file (beside capture.json),
    its sha256, how the choice was made and the kernels chosen, most expensive first."""

    file: str
    sha256: Annotated[str, msgspec.Meta(pattern="^[0-9a-f]{64}$")]
    top: Positive
    kernel: str | None
    exit_status: int | None
    kernel_time_ns: Count
    chosen: list[ProfiledKernel]


class Dispatch(Record):
    """One selected launch. The fields after ``stream`` appear as capture gets that far."""

    index: Positive
    status: Literal["capturing", "captured", "failed"]
    kernel: str
    demangled: str
    launch_index: Positive
    api: str
    grid: list[int]
    block: list[int]
    dynamic_shared_bytes: Count
    attributes: list[str]
    stream: Address
    regions: Count | UnsetType = UNSET
    omitted_regions: list[OmittedRegion] | UnsetType = UNSET
    region_bytes: Count | UnsetType = UNSET
    segment_bytes: Count | UnsetType = UNSET
    code_object_match: str | UnsetType = UNSET
    triton_metadata: list[str] | UnsetType = UNSET
    snapshot: str | UnsetType = UNSET
    complete: bool | UnsetType = UNSET
    state_bytes: Count | UnsetType = UNSET
    code_object_bytes: Count | UnsetType = UNSET
    stored_bytes: Count | UnsetType = UNSET
    deduped_bytes: Count | UnsetType = UNSET
    capture_s: float | UnsetType = UNSET
    reason: str | UnsetType = UNSET
    #: regions stored as chains (regenerable) instead of bytes
    regenerated: Count | UnsetType = UNSET
    #: region -> sha256 of its captured bytes, kept in the pool until its chain is verified
    chain_pre: dict[str, str] | UnsetType = UNSET


class RangeRecord(Record):
    """One range ``--range`` asked for: ``waiting`` (not opened yet), ``capturing``,
    ``captured`` (its snapshot directory ``snapshot``), ``refused`` (``reason``: an operation
    the snapshot cannot replay, the size cap, ...) or ``not-seen`` (never opened, or not
    ``occurrence`` times). ``source``: ``nvtx`` or ``mark`` (``kpair.mark``)."""

    name: str
    status: Literal["waiting", "capturing", "captured", "refused", "not-seen"]
    occurrence: Positive
    source: Literal["nvtx", "mark"] | UnsetType = UNSET
    reason: str | UnsetType = UNSET
    snapshot: str | UnsetType = UNSET
    ops: Count | UnsetType = UNSET
    kernels: Count | UnsetType = UNSET
    memsets: Count | UnsetType = UNSET
    copies: Count | UnsetType = UNSET
    streams: Count | UnsetType = UNSET
    regions: Count | UnsetType = UNSET
    scratch: Count | UnsetType = UNSET
    roles: dict[str, int] | UnsetType = UNSET
    region_bytes: Count | UnsetType = UNSET
    scratch_bytes: Count | UnsetType = UNSET
    state_bytes: Count | UnsetType = UNSET
    stored_bytes: Count | UnsetType = UNSET
    deduped_bytes: Count | UnsetType = UNSET
    capture_s: float | UnsetType = UNSET
    notes: list[str] | UnsetType = UNSET
    regenerated: Count | UnsetType = UNSET
    chain_pre: dict[str, str] | UnsetType = UNSET


class Totals(Record):
    """Sums over the captured dispatches, and the compressed bytes of the shared pool."""

    region_bytes: Count
    segment_bytes: Count
    state_bytes: Count
    stored_bytes: Count
    deduped_bytes: Count
    pool_bytes: Count


class CaptureSummary(Record, kw_only=True, tag_field="schema", tag=SCHEMA):
    """The whole ``capture.json``."""

    schema_version: Literal[1] = SCHEMA_VERSION
    kpair_version: str
    command: list[str]
    started: str
    wall_s: float
    exit_status: int | None
    filter: CaptureFilter
    max_region_bytes: Positive
    environment: dict[str, Any]
    launches_seen: Count
    distinct_kernels_seen: Count
    matched: Count
    captured: Count
    failed: Count
    modules_loaded: Count
    module_bytes: Count
    totals: Totals
    notes: list[str]
    dispatches: list[Dispatch]
    kernels_seen: dict[str, int]
    profile: ProfileUse | UnsetType = UNSET
    #: ``--range`` captures: one record per range asked for (``captured``/``failed`` then
    #: count ranges, not dispatches).
    ranges: list[RangeRecord] | UnsetType = UNSET


def read_summary(path: str | Path) -> CaptureSummary:
    """The ``capture.json`` at ``path`` (or in the capture directory ``path``), validated."""
    path = Path(path)
    if path.is_dir():
        path = path / SUMMARY
    return read(path, CaptureSummary, schema=SCHEMA, version=SCHEMA_VERSION)
