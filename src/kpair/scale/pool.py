"""A per-device worker pool on one host: ``DevicePool(devices).run(tasks, open_worker)``.

One thread per device, each with one task in flight at a time; the task itself runs in an
isolated worker process (``kpair.isolation``), so a kernel that faults, hangs or kills its
process costs that task an ``error`` verdict and its device goes on with the next. A task is
either pinned to a device (``Task.device``; ``verify --each`` runs a harness on every device)
or taken by whichever device is free first. ``run`` yields each ``Done`` in completion order
in the calling thread, so every file of the batch (results, the index, ``attempts.jsonl``)
is written by one thread of the parent.

Lifetimes: ``open_worker(device)`` is entered once per device thread (a context manager that
gives the callable running one task: a plain function for ``verify``, a ``Session`` for
``evaluate``) and left when that device has no task left. Closing the iterator early (an
exception, Ctrl-C) stops the threads from taking new tasks; the isolated workers of tasks in
flight die with the process (``PR_SET_PDEATHSIG``).
"""

from __future__ import annotations

import contextlib
import queue
import threading
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from ..errors import UsageError


@dataclass(frozen=True)
class Task:
    """One unit of work: ``key`` names it for people, ``payload`` is what the worker gets,
    ``device`` pins it (None: any device)."""

    key: str
    payload: Any
    device: int | None = None


@dataclass(frozen=True)
class Done:
    """A finished task: where it ran, and its value, or the exception its worker raised."""

    task: Task
    device: int
    value: Any = None
    error: BaseException | None = None


OpenWorker = Callable[[int], contextlib.AbstractContextManager[Callable[[Any], Any]]]


class DevicePool:
    """One worker per device, one task in flight per worker (see the module docstring)."""

    def __init__(self, devices: Iterable[int]):
        self.devices = tuple(devices)
        if not self.devices:
            raise UsageError("a device pool needs at least one device")
        if len(set(self.devices)) != len(self.devices):
            raise UsageError(f"devices named twice: {self.devices}")

    def run(self, tasks: Iterable[Task], open_worker: OpenWorker) -> Iterator[Done]:
        """Run every task; yield each as it finishes (completion order). ``tasks`` is read
        lazily, as devices become free, so it may be a stream (``evaluate --jsonl``)."""
        source = iter(tasks)
        pinned: dict[int, deque[Task]] = {d: deque() for d in self.devices}
        dead: set[int] = set()
        lock, stop = threading.Lock(), threading.Event()
        done: queue.Queue[Done | int] = queue.Queue()  # an int: that device's thread ended

        def take(device: int) -> Task | None:
            with lock:
                if stop.is_set():
                    return None
                if pinned[device]:
                    return pinned[device].popleft()
                for t in source:  # the next task this device may run; others' are queued
                    if t.device is None or t.device == device:
                        return t
                    if t.device in pinned and t.device not in dead:
                        pinned[t.device].append(t)
                    else:
                        why = "did not start" if t.device in dead else "is not in the pool"
                        done.put(Done(t, device, error=UsageError(
                            f"task {t.key} is pinned to device {t.device}, which {why}")))
                return None

        def serve(device: int) -> None:
            try:
                with open_worker(device) as work:
                    while (task := take(device)) is not None:
                        try:
                            done.put(Done(task, device, value=work(task.payload)))
                        except Exception as e:  # noqa: BLE001 - that task's error only
                            done.put(Done(task, device, error=e))
            except BaseException as e:  # noqa: BLE001 - the device's worker did not open
                with lock:  # its own tasks are errors; the others go on elsewhere
                    dead.add(device)
                    orphans = list(pinned[device])
                    pinned[device].clear()
                for t in orphans:
                    done.put(Done(t, device, error=e))
            finally:
                done.put(device)

        for d in self.devices:
            threading.Thread(target=serve, args=(d,), daemon=True,
                             name=f"kpair-device-{d}").start()
        try:
            ended = 0
            while ended < len(self.devices):
                item = done.get()
                if isinstance(item, Done):
                    yield item
                else:
                    ended += 1
            while not done.empty():
                item = done.get()
                if isinstance(item, Done):
                    yield item
            # Every device failed to start: what is left could not run anywhere.
            for t in source:
                yield Done(t, t.device if t.device is not None else self.devices[0],
                           error=UsageError("no device of the pool could start"))
        finally:
            stop.set()


__all__ = ["DevicePool", "Done", "OpenWorker", "Task"]
