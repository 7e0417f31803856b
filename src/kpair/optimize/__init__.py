"""Built-in optimizers around evaluation sessions: from captured dispatches to a release.

``workbench``  what ``optimize`` and ``mcp`` share: operators, the base harness, the quick
               measurement, building candidates (``kpair.candidate.Candidate``)
``strategy``   what a strategy is (``Strategy``, ``Context``, ``KernelSource``)
``strategies`` the built-in ones, one module each: ``host-c``, ``cuda-source``, ``triton``
``geometry``   launch shapes a kernel declares it can take (``// kpair: block=... grid=...``)
``search``     cheap first: prune in one session, confirm the best few, pick the winner
``director``   ``director_validation.json``: the optimizer's own measurement of its choice
``program``    the flow per operator: capture, harnesses, search, publish or refuse, report
``request``    ``kpair optimize`` as one call: ``optimize_release(release, OptimizeTarget(...))``;
               ``optimize_range(ref, [RangeCandidate(producer, snap), ...], release)`` for a
               range and its captured candidates (``strategies.captured``)
``ranges``     ``range_candidates.json``: every candidate of a range's search and its fate
"""

from .director import DirectorValidation
from .program import OptimizeOptions, optimize
from .request import (
    OptimizeSummary,
    OptimizeTarget,
    RangeCandidate,
    measurement_options,
    optimize_range,
    optimize_release,
)
from .search import SearchOutcome, search
from .strategies import STRATEGIES
from .strategy import Context, KernelSource, Strategy
from .workbench import (
    Operator,
    operator_from_harness,
    operator_from_snapshot,
    operators_from_capture,
)

__all__ = ["Context", "DirectorValidation", "KernelSource", "OptimizeOptions", "OptimizeSummary",
           "OptimizeTarget", "Operator", "RangeCandidate", "optimize_range",
           "STRATEGIES", "SearchOutcome", "Strategy", "operator_from_harness",
           "operator_from_snapshot", "operators_from_capture", "optimize", "optimize_release",
           "measurement_options", "search"]
