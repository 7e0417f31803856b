"""Which devices a batch runs on: ``--gpus all|0,1,...`` and ``--workers N``, per backend.

``parse_gpus`` reads the option (pure); ``resolve_devices`` turns it into ordinals for one
backend, asking the backend how many devices this process sees only for ``all``. On the host
backend there is one device, and ``--workers N`` gives a pool N worker slots (ordinals
0..N-1) that share its CPUs: that is how the pool is exercised without a GPU.
"""

from __future__ import annotations

import re

from ..backends import device_count
from ..errors import UsageError

ALL = "all"


def parse_gpus(spec: str) -> tuple[int, ...] | str:
    """``"all"``, or the distinct ordinals of ``"0,1,3"`` in the order given."""
    spec = spec.strip()
    if spec == ALL:
        return ALL
    if not re.fullmatch(r"\d+(,\d+)*", spec):
        raise UsageError(f"--gpus takes 'all' or ordinals like 0,1,3, not {spec!r}")
    ordinals = tuple(int(x) for x in spec.split(","))
    if len(set(ordinals)) != len(ordinals):
        raise UsageError(f"--gpus {spec}: an ordinal is named twice")
    return ordinals


def resolve_devices(backend: str, gpus: str | None = None, workers: int | None = None
                    ) -> tuple[int, ...]:
    """The ordinals a pool of ``backend`` runs on, one worker each.

    ``gpus`` (the raw option) names GPUs; ``workers`` names host worker slots. Neither: the
    single device 0 (a serial run)."""
    if workers is not None:
        if backend != "host":
            raise UsageError(f"--workers is for the host backend; a {backend} release takes "
                             "--gpus all|0,1,...")
        if workers < 1:
            raise UsageError(f"--workers must be >= 1, not {workers}")
        if gpus is not None:
            raise UsageError("give --gpus or --workers, not both")
        return tuple(range(workers))
    if gpus is None:
        return (0,)
    chosen = parse_gpus(gpus)

    count = device_count(backend)
    if chosen == ALL:
        if count < 1:
            raise UsageError(f"--gpus all: no {backend} device is visible")
        return tuple(range(count))
    missing = [o for o in chosen if o >= count]
    if missing:
        more = "; for several host worker slots use --workers N" if backend == "host" else ""
        raise UsageError(f"--gpus {gpus}: {backend} device {missing[0]} does not exist "
                         f"({count} visible){more}")
    return chosen


__all__ = ["ALL", "parse_gpus", "resolve_devices"]
