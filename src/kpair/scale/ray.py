"""The same harness jobs as Ray tasks: ``RayRunner(address)(jobs, options)``.

Each job is one task that takes one GPU (``num_gpus=1``; Ray sets ``CUDA_VISIBLE_DEVICES``,
so the harness opens device 0 of what it sees) or, for the host backend, one CPU. A task reads
the harness where it is when that path exists on its node with the same ``MANIFEST.sha256``
(shared storage), and otherwise unpacks the copy shipped with it (the harness's input files,
packed by the parent into Ray's object store and fetched only by a task that needs it). It runs
the harness in an isolated worker exactly as a local run does and returns the result, the
samples and the log; the parent writes them into the same files a local run writes. A task
whose process or node is lost is run again elsewhere (Ray's ``max_retries``): a job's files are
written once, by the parent, when its task returns, so a retry neither loses nor duplicates a
row. At most ``window`` tasks are in flight, which bounds what the parent has packed.

Ray is imported on first use; without it ``BackendUnavailable`` names the install command.
Every node must have kpair (and the backend's extra) installed in the Python Ray runs.
"""

from __future__ import annotations

import io
import json
import socket
import tarfile
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

from .._util import make_dirs, private_tempdir
from ..errors import BackendUnavailable, HarnessError
from ..harness import MANIFEST, OUTPUTS
from ..isolation import JudgedResult, beside, run_isolated, with_device_index
from ..options import RunOptions
from ..result import Result, error_result
from ..snapshot import sha256
from .jobs import HarnessJob

INSTALL_HINT = "pip install 'kpair[ray]'"
TASK_NAME = "kpair_verify"  # the process title of a Ray worker running one (ray::kpair_verify)


def load_ray():
    """Import Ray, or say how to install it."""
    try:
        import ray
    except ImportError as e:
        raise BackendUnavailable(f"--ray needs Ray, which cannot be imported ({e}): "
                                 f"{INSTALL_HINT}") from None
    return ray


def pack(harness: Path) -> bytes:
    """The harness's input files as an uncompressed tar (blobs are already zstd)."""

    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for path in sorted(harness.rglob("*")):
            rel = path.relative_to(harness)
            if path.is_file() and not path.is_symlink() and not (
                    len(rel.parts) == 1 and rel.name in OUTPUTS):
                tar.add(path, arcname=f"harness/{rel.as_posix()}", recursive=False)
    return buf.getvalue()


def unpack(data: bytes, into: Path) -> Path:
    """Unpack what ``pack`` made into ``into``; members must be plain files inside it."""
    with tarfile.open(fileobj=io.BytesIO(data), mode="r") as tar:
        for m in tar.getmembers():
            target = (into / m.name).resolve()
            if not m.isfile() or not target.is_relative_to(into.resolve()):
                raise HarnessError(f"shipped harness holds {m.name!r}: not a plain file inside")
        tar.extractall(into)  # noqa: S202 - every member checked above
    return into / "harness"


def run_task(harness: str, digest: str, shipped: list, options: dict) -> dict:
    """The body of one task, on whichever node Ray chose (see the module docstring)."""

    ray = load_ray()
    gpus = [int(g) for g in ray.get_gpu_ids()]
    where = {"node": socket.gethostname(), "gpu_ids": gpus}
    with private_tempdir("ray") as scratch:
        root = Path(harness)
        manifest = root / MANIFEST
        if not (manifest.is_file() and sha256(manifest.read_bytes()) == digest):
            if not shipped:
                raise HarnessError(f"{harness} is not on node {where['node']} and was not "
                                   "shipped (run without --no-ship)")
            root = unpack(ray.get(shipped[0]), scratch / "in")
            where["shipped"] = True
        out = scratch / "out" / "result.json"
        out.parent.mkdir()
        result = run_isolated(root, RunOptions.from_json(options), out=out)
        samples, log = beside(out)
        return {"result": result.to_json(), "where": where,
                "samples": samples.read_bytes() if samples.is_file() else None,
                "log": log.read_bytes() if log.is_file() else b""}


class RayRunner:
    """Run harness jobs as Ray tasks on the cluster at ``address`` (None: the one this process
    is connected to, ``RAY_ADDRESS``, or a new local one)."""

    def __init__(self, address: str | None = None, *, max_retries: int = 3,
                 window: int | None = None, ship: bool = True):
        self.address, self.max_retries, self.ship = address, max_retries, ship
        self.window = window

    def __call__(self, jobs: list[HarnessJob], options: RunOptions
                 ) -> Iterator[tuple[HarnessJob, int, Result]]:
        ray = load_ray()
        if not ray.is_initialized():
            ray.init(address=self.address, log_to_driver=False)
        task = ray.remote(_task)
        window = self.window or max(2, 2 * int(sum(ray.cluster_resources().get(k, 0)
                                                   for k in ("CPU", "GPU"))))
        options = replace(options, device=None, device_options={
            k: v for k, v in (options.device_options or {}).items() if k != "device"} or None)
        waiting, pending = list(jobs), {}
        while waiting or pending:
            while waiting and len(pending) < window:
                job = waiting.pop(0)
                pending[self._submit(ray, task, job, options)] = job
            ready, _ = ray.wait(list(pending), num_returns=1)
            job = pending.pop(ready[0])
            yield self._gather(ray, job, ready[0], options)

    def _submit(self, ray, task, job: HarnessJob, options: RunOptions):
        spec = json.loads((job.harness / "harness.json").read_text())
        need = {"num_cpus": 1} if spec.get("backend") == "host" else {"num_gpus": 1}
        digest = sha256((job.harness / MANIFEST).read_bytes())
        # In a list, so that Ray hands the task the reference, not the bytes: a task reading
        # shared storage never fetches them.
        shipped = [ray.put(pack(job.harness))] if self.ship else []
        return task.options(name=TASK_NAME, max_retries=self.max_retries,
                            retry_exceptions=False, **need).remote(
            str(job.harness.resolve()), digest, shipped, options.to_json())

    def _gather(self, ray, job: HarnessJob, ref, options: RunOptions
                ) -> tuple[HarnessJob, int, Result]:
        try:
            out = ray.get(ref)
            result = Result.from_json(out["result"], path=f"Ray task of {job.key}")
            where = out["where"]
            device = where["gpu_ids"][0] if where["gpu_ids"] else 0
            env = {**(result.environment or {}), "ray": where}
            result = result.replace(harness=str(job.harness.resolve()), environment=env)
            # Named as a local run names them (``isolation.beside``): r2.json beside
            # r2.samples.npz and r2.worker.log, so that every result has its own.
            result = JudgedResult(result, out["samples"]).write(job.out, log=out["log"])
        except Exception as e:  # noqa: BLE001 - a task that failed past its retries is a row
            device = 0
            result = error_result(job.harness, f"{type(e).__name__}: {e}", stage="ray",
                                  kind=type(e).__name__)
            result = result.replace(environment=with_device_index(None, options))
            make_dirs(job.out.parent)
            result.write(job.out)
        return job, device, result


def _task(harness: str, digest: str, shipped: list, options: dict) -> dict:
    return run_task(harness, digest, shipped, options)


__all__ = ["INSTALL_HINT", "RayRunner", "load_ray", "pack", "run_task", "unpack"]
