"""Validation policies: what a policy declares (``schema``, ``mutation``) and how opt is judged
against ref under it (``judge``)."""

from ..dtypes import DTYPES, FLOAT_DTYPES, decode, dtype_size
from .judge import RangeCheck, RegionVerdict, Verdict, check, check_region
from .mutation import METHODS, Mutation
from .schema import (
    CRITERIA,
    SCHEMA,
    SCHEMA_VERSION,
    Policy,
    PolicyDocument,
    Tolerance,
    load_policy,
    save_policy,
)

__all__ = [
    "CRITERIA", "DTYPES", "FLOAT_DTYPES", "METHODS", "SCHEMA", "SCHEMA_VERSION", "Mutation",
    "Policy", "PolicyDocument", "RangeCheck", "RegionVerdict", "Tolerance", "Verdict", "check",
    "check_region", "decode", "dtype_size", "load_policy", "save_policy",
]
