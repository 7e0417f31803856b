"""``RunOptions``: how to run a harness (device, measurement, checks, worker time limit).

Its own module, below everything that runs a harness: most of kpair wants these options and
nothing else of ``kpair.pipeline`` (which re-exports the class)."""

from __future__ import annotations

from dataclasses import dataclass

from .errors import UsageError
from .trust.findings import CHECKS


@dataclass(frozen=True)
class RunOptions:
    """How to run a harness. Measurement defaults come from harness.json's ``measure``.

    ``device`` is the backend's device ordinal (``--device N``; cuda and hip: the GPU as the
    driver numbers the visible ones; host: a worker slot, recorded only). None means 0 unless
    ``device_options`` names one.

    ``timeout_s`` bounds a worker's whole run (seconds); None (the default) derives the hang
    limit from ref's own time instead (``kpair.isolation.hang_limit``)."""

    device_options: dict | None = None
    device: int | None = None
    relocate: bool = False
    cache: str = "cold"
    aa: bool = False
    min_blocks: int | None = None
    max_blocks: int | None = None
    rel_ci: float | None = None
    time_cap_s: float | None = None
    seed: int | None = None
    replicates: int = 6
    max_replicates: int | None = None
    timeout_s: float | None = None
    control: bool = True
    checks: bool = True
    skip_checks: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "skip_checks", tuple(self.skip_checks))
        unknown = [c for c in self.skip_checks if c not in CHECKS]
        if unknown:
            raise UsageError(f"unknown check {unknown[0]!r} (one of {', '.join(CHECKS)})")
        for name, value in (("replicates", self.replicates),
                            ("max_replicates", self.max_replicates)):
            if (value is not None or name == "replicates") and (
                    isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 64):
                raise UsageError(f"{name} must be an integer in [1, 64], not {value!r}")
        if self.timeout_s is not None and (isinstance(self.timeout_s, bool) or not isinstance(
                self.timeout_s, (int, float)) or not 0 < self.timeout_s < float("inf")):
            raise UsageError(f"timeout must be a positive number of seconds, not "
                             f"{self.timeout_s!r}")
        if self.cache not in ("cold", "warm"):
            raise UsageError(f"cache must be 'cold' or 'warm', not {self.cache!r}")
        check_measure_options(self)
        if self.device is not None and (isinstance(self.device, bool)
                                        or not isinstance(self.device, int) or self.device < 0):
            raise UsageError(f"device must be an ordinal >= 0, not {self.device!r}")
        named = (self.device_options or {}).get("device")
        if self.device is not None and named is not None and named != self.device:
            raise UsageError(f"device {self.device} and device_options device {named} disagree")

    @property
    def ordinal(self) -> int:
        """The device ordinal this run opens (0 unless chosen)."""
        if self.device is not None:
            return self.device
        return int((self.device_options or {}).get("device", 0))

    def to_json(self) -> dict:
        return {k: list(v) if isinstance(v, tuple) else v for k, v in self.__dict__.items()
                if v is not None}

    @classmethod
    def from_json(cls, obj: dict) -> RunOptions:
        return cls(**obj)


def check_measure_options(o: RunOptions) -> None:
    """Refuse measurement options no run could use, when they are made: a usage error
    before any worker starts and before any file is written."""
    for name, value, low in (("min_blocks", o.min_blocks, 4), ("max_blocks", o.max_blocks, 4)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)
                                  or value < low):
            raise UsageError(f"{name} must be an integer >= {low}, not {value!r}")
    if o.min_blocks is not None and o.max_blocks is not None and o.min_blocks > o.max_blocks:
        raise UsageError(f"min_blocks {o.min_blocks} is above max_blocks {o.max_blocks}")
    for name, value in (("rel_ci", o.rel_ci), ("time_cap_s", o.time_cap_s),
                        ("timeout_s", o.timeout_s)):
        if value is not None and not (isinstance(value, (int, float)) and 0 < value < 1e9):
            raise UsageError(f"{name} must be a positive number of "
                             f"{'seconds' if name != 'rel_ci' else 'relative width'}, "
                             f"not {value!r}")


__all__ = ["RunOptions", "check_measure_options"]
