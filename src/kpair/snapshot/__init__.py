"""Snapshot format v1: one captured dispatch as a manifest plus verified, compressed blobs."""

from .completeness import describe_left_out, left_out, require_complete
from .model import (
    CODE_FORMATS,
    DTYPE_HINTS,
    PARAM_KINDS,
    SCALAR_FORMATS,
    SCHEMA_VERSION,
    BlobRef,
    CodeObject,
    Kernarg,
    Launch,
    LaunchAttribute,
    LaunchOverride,
    Manifest,
    OmittedRegion,
    Op,
    Param,
    Region,
    ScratchRegion,
    detect_format,
)
from .store import Snapshot, SnapshotWriter, sha256, write_json_atomic

__all__ = [
    "CODE_FORMATS", "DTYPE_HINTS", "PARAM_KINDS", "SCALAR_FORMATS", "SCHEMA_VERSION", "BlobRef",
    "CodeObject", "Kernarg", "Launch", "LaunchAttribute", "LaunchOverride",
    "Manifest", "OmittedRegion", "Op", "Param", "Region", "ScratchRegion",
    "Snapshot", "SnapshotWriter", "describe_left_out", "detect_format", "left_out",
    "require_complete", "sha256", "write_json_atomic",
]
