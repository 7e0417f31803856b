"""``director_validation.json``: the optimizer's own measurement of the candidate it chose.

The "Director" number of a release row (reference only; ``kpair.release.read_director``
reads its ``speedup``). ``kpair optimize`` writes it from the stage of its search that chose
the candidate (prune, or the last successive-halving rung): one short ABBA measurement in
the search's session, without the identical-binary control — how the choice was made, not
how it is judged (the Harness number is ``release add``'s full run). ``DirectorValidation``
is the typed record; ``docs/format.md`` is the contract.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from .._util import utc_now
from ..formats import Record, read, write

SCHEMA = "kpair.director_validation"
SCHEMA_VERSION = 1
FILE = "director_validation.json"


class DirectorValidation(Record, kw_only=True):
    """The chosen candidate and the measurement that chose it."""

    schema: Literal["kpair.director_validation"] = SCHEMA
    schema_version: Literal[1] = SCHEMA_VERSION
    speedup: float
    ci95: tuple[float, float]
    slot_bias: float
    blocks: int
    stopped_by: str
    reference_only: Literal[True] = True
    method: str
    options: dict[str, Any]
    candidate_sha256: str
    label: str
    strategy: str
    params: dict[str, Any] | None = None
    attempt: int
    confirmed_speedup: float | None = None
    confirmed_ci95: tuple[float, float] | None = None
    candidates: int
    written: str = ""

    @classmethod
    def read(cls, path: str | Path) -> DirectorValidation:
        return read(Path(path), cls, schema=SCHEMA, version=SCHEMA_VERSION)

    def write(self, path: str | Path) -> None:
        write(Path(path), self.replace(written=self.written or utc_now()))


METHOD = ("kpair optimize, the last stage before confirming (prune, or the last successive-"
          "halving rung): the candidate against ref in one evaluation session "
          "(same placed regions, cold cache, ABBA blocks, trust checks on, no identical-binary "
          "control); the short measurement the search chose by, reference only")

__all__ = ["DirectorValidation", "FILE", "METHOD", "SCHEMA"]
