"""The candidate: an opt to judge against a harness's ref, one type through its life.

A ``Candidate`` is

- **proposed** by a strategy or an agent: a ``label`` and its provenance (``strategy``,
  ``source``, ``build`` command, ``params``; ``reorders_fp`` when it may add or multiply in
  another order than ref);
- **built**: a code object (``image`` bytes, ``format``, the ``kernel`` in it, the file
  ``binary`` it is kept in, a ``launch_override``) — or ``build_error``, why it could not be;
- **judged**: ``result``, the ``kpair.result.Result`` of one evaluation;
- **attempted**: ``attempt``, its number in a session's ``attempts.jsonl``, and ``step``, the
  search step that judged it (prune, rungN, confirm, baseline).

Each state is the one before with more fields set (``dataclasses.replace``). The worker
receives it as a ``kpair.protocol.Judge`` (``Judge.of(id, candidate)``, ``Judge.candidate()``)
and ``attempts.jsonl`` records it as a ``kpair.session.Attempt`` (``Attempt.of``); both are
formats made from and into this type, not other kinds of candidate.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .result import Result


@dataclass(frozen=True)
class Candidate:
    """An opt through its life (see the module docstring). ``plan``: a launch plan instead
    of a same-layout kernel, (Plan, ((bytes, format), ...) per launch, (layout, ...) per
    launch), checked against the range (``harness.load_plan``)."""

    image: bytes = b""
    kernel: str = ""
    format: str = ""
    launch_override: dict | None = None
    label: str = ""
    plan: tuple | None = None
    # proposed: where it came from
    binary: Path | None = None
    strategy: str | None = None
    source: str | None = None
    build: str | None = None
    params: dict[str, Any] = field(default_factory=dict)
    reorders_fp: bool = False
    build_error: str | None = None
    # judged, attempted
    result: Result | None = None
    attempt: int | None = None
    step: str | None = None

    @property
    def built(self) -> bool:
        """A code object to judge: its bytes, or the file holding them."""
        return self.build_error is None and (bool(self.image) or self.binary is not None)

    def code(self) -> bytes:
        """The code object's bytes (read from ``binary`` when only the file is known)."""
        if self.image or self.binary is None:
            return self.image
        return Path(self.binary).read_bytes()

    @property
    def speedup(self) -> float:
        """The judged speedup; 0.0 unless it passed with a measured speed."""
        r = self.result
        return r.speed.speedup if r is not None and r.status == "pass" and r.speed else 0.0

    @property
    def faster(self) -> bool:
        """Passed, and its reported interval lies above 1.0 (``release add``'s rule)."""
        r = self.result
        return r is not None and r.status == "pass" and r.speed is not None \
            and r.speed.reported_ci95[0] > 1.0


__all__ = ["Candidate"]
