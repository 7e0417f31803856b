"""Releases: many pair harnesses, their provenance, and one index that a third party re-checks.

Layout (contract in ``docs/format.md``)::

    <root>/index.json                  the index (schema kpair.release_index v4)
    <root>/level<N>/<op>/harness/      a pair harness (+ result.json once verified)
    <root>/level<N>/<op>/provenance/   optimizer records, optional: director_validation.json,
                                       attempts.jsonl, ...
    <root>/excluded/level<N>/<op>/     what ``release add`` refused: the result.json that
                                       refused it (+ provenance); the harness is not published

``index`` is the typed index format (``Index``, ``Row``, ``Summary``) and the pure row and
summary arithmetic; ``store`` holds the writers (``verify_release``, ``add_operator``) and the
lock they share; ``tournament`` judges every producer's candidate for an operator the same
way and publishes the best correct one (``Contest``, ``Entrant``, ``run_contests``).
"""

from .index import (
    DIRECTOR_NOTE,
    INDEX,
    SLOT_BIAS_BAND,
    CorrectnessMode,
    Director,
    HarnessSpeed,
    Index,
    Row,
    Summary,
    build_index,
    check_key,
    correctness_mode,
    load_index,
    operator_row,
    read_director,
    rule_text,
    summarize,
)
from .store import (
    AddOutcome,
    add_operator,
    discover,
    locked,
    not_faster,
    refuse_operator,
    sweep_stale_staging,
    verify_release,
)
from .tournament import Contest, Entrant, Outcome, run_contests

__all__ = ["AddOutcome", "Contest", "CorrectnessMode", "DIRECTOR_NOTE", "Director", "Entrant",
           "HarnessSpeed", "Outcome", "run_contests",
           "INDEX", "Index", "Row", "SLOT_BIAS_BAND", "Summary", "add_operator", "build_index",
           "check_key", "correctness_mode", "discover", "load_index", "locked", "not_faster",
           "operator_row", "read_director", "refuse_operator", "rule_text", "summarize",
           "sweep_stale_staging", "verify_release"]
