"""Trust checks: what a verdict must survive (DESIGN.md, "Trust").

``findings`` judges what runs observed (pure: bytes and times in, ``Finding``s out);
``armor`` lays out and writes the guard canaries and the poison around launches; ``audit``
drives a checked run's extra launches through the replay and collects the findings. Importing
this package imports the pure part only.
"""

from .findings import CHECKS, Finding, OptRun, first_failure, skipped

__all__ = ["CHECKS", "Finding", "OptRun", "first_failure", "skipped"]
