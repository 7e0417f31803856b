"""Snapshot format v1: one captured dispatch as a manifest plus verified, compressed blobs."""

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
    Param,
    Region,
    detect_format,
)
from .store import Snapshot, SnapshotWriter, sha256, write_json_atomic

__all__ = [
    "CODE_FORMATS", "DTYPE_HINTS", "PARAM_KINDS", "SCALAR_FORMATS", "SCHEMA_VERSION", "BlobRef",
    "CodeObject", "Kernarg", "Launch", "LaunchAttribute", "LaunchOverride",
    "Manifest", "Param", "Region",
    "Snapshot", "SnapshotWriter", "detect_format", "sha256", "write_json_atomic",
]
