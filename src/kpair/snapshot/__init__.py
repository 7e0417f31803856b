"""Snapshot format v2 (v1 read as well): one captured dispatch as a manifest plus verified,
compressed blobs; a region's pre-state may be a chain that regenerates it."""

from .completeness import describe_left_out, left_out, require_complete
from .model import (
    CODE_FORMATS,
    DTYPE_HINTS,
    PARAM_KINDS,
    SCALAR_FORMATS,
    SCHEMA_VERSION,
    SCHEMA_VERSIONS,
    BlobRef,
    CodeObject,
    DeadSpan,
    Kernarg,
    Launch,
    LaunchAttribute,
    LaunchOverride,
    Manifest,
    OmittedRegion,
    Op,
    OutputSpan,
    Param,
    Regen,
    Region,
    ScratchRegion,
    StateDigest,
    detect_format,
)
from .store import ChainOp, Snapshot, SnapshotWriter, sha256, write_json_atomic

__all__ = [
    "CODE_FORMATS", "DTYPE_HINTS", "PARAM_KINDS", "SCALAR_FORMATS", "SCHEMA_VERSION",
    "SCHEMA_VERSIONS",
    "BlobRef", "ChainOp", "CodeObject", "DeadSpan", "Kernarg", "Launch", "LaunchAttribute",
    "LaunchOverride",
    "Manifest", "OmittedRegion", "Op", "OutputSpan", "Param", "Regen", "Region", "ScratchRegion",
    "Snapshot", "StateDigest", "SnapshotWriter", "describe_left_out", "detect_format", "left_out",
    "require_complete", "sha256", "write_json_atomic",
]
