"""Element types: the one table of the dtypes kpair reads region bytes as.

Regions may declare a dtype hint (snapshot), tolerances and mutations declare the dtype of
their range (policy), and the trust checks decode values with it. All of them use these names
and this module's decoding: little-endian storage, bfloat16 kept as its uint16 bits.
"""

from __future__ import annotations

import numpy as np

#: Little-endian storage dtype of each dtype; bfloat16 is stored as its uint16 bits.
DTYPES: dict[str, str] = {
    "float16": "<f2", "bfloat16": "<u2", "float32": "<f4", "float64": "<f8",
    "int8": "i1", "int16": "<i2", "int32": "<i4", "int64": "<i8",
    "uint8": "u1", "uint16": "<u2", "uint32": "<u4", "uint64": "<u8",
}
FLOAT_DTYPES = ("float16", "bfloat16", "float32", "float64")
INT_DTYPES = tuple(d for d in DTYPES if d not in FLOAT_DTYPES)
#: What a snapshot region may declare: every dtype, and bool.
DTYPE_HINTS = (*DTYPES, "bool")
#: Machine epsilon of each float dtype (the default allowed bias; a floor for suggested rtol).
EPS = {"float16": 2.0 ** -10, "bfloat16": 2.0 ** -7, "float32": 2.0 ** -23,
       "float64": 2.0 ** -52}


def dtype_size(dtype: str) -> int:
    return np.dtype(DTYPES[dtype]).itemsize


def decode(data: bytes | np.ndarray, dtype: str) -> np.ndarray:
    """The values of little-endian ``data`` as float64 (bfloat16: its bits << 16 as float32)."""
    dt = DTYPES[dtype]
    raw = data.view(dt) if isinstance(data, np.ndarray) else np.frombuffer(data, dt)
    if dtype == "bfloat16":
        return (raw.astype(np.uint32) << 16).view(np.float32).astype(np.float64)
    return raw.astype(np.float64)


def encode(values: np.ndarray, dtype: str) -> bytes:
    """Little-endian bytes of ``values`` stored as ``dtype`` (bfloat16: float32 bits >> 16,
    rounded to nearest even)."""
    if dtype == "bfloat16":
        bits = np.asarray(values, np.float32).view(np.uint32).astype(np.uint64)
        bits = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
        return bits.astype("<u2").tobytes()
    return np.asarray(values).astype(DTYPES[dtype]).tobytes()
