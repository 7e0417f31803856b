"""Beyond one device: harnesses spread over every GPU of a host, or over a Ray cluster.

``devices`` reads ``--gpus all|0,1,...`` / ``--workers N`` into device ordinals per backend;
``pool`` is the per-device worker pool of one host (one task in flight per device, results
in completion order, a device's fault costs only its task); ``jobs`` holds the harness job,
the local runner and the resume rule; ``evaluate`` deals an evaluation session's candidates
out to one ``Session`` per device; ``ray`` runs harness jobs as Ray tasks (imported lazily;
``pip install 'kpair[ray]'``). ``kpair.release.store.verify_release`` takes a runner from here.
"""

from .devices import parse_gpus, resolve_devices
from .jobs import JOURNAL, HarnessJob, Journal, finished, run_job, run_local
from .pool import DevicePool, Done, Task

__all__ = ["DevicePool", "Done", "HarnessJob", "JOURNAL", "Journal", "Task", "finished",
           "parse_gpus", "resolve_devices", "run_job", "run_local"]
