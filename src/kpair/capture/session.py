"""A capture session: launches in, snapshot directories and ``capture.json`` out.

Lifetime: ``CaptureSession(out, filter, driver=..., registry=...)`` creates the (empty)
output directory; the tracer feeds it every launch at entry (``launch_enter``) and exit
(``launch_exit``); ``close()`` writes the final summary. At entry of a launch the filter
selects, the session synchronises the context, rebuilds the kernarg, finds the regions the
kernarg points into and reads their pre-state; at exit it synchronises again, reads the
post-state and writes the snapshot (``<out>/<nnnn>_<kernel>/``). ``capture.json`` is rewritten
after every dispatch, so a program that crashes keeps what was captured.

The driver and the module registry are passed in: on a GPU they are ``CudaDriver`` and the
tracer's registry; tests give a driver that serves memory from a dict.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from msgspec import UNSET

from .. import __version__
from .._util import human_bytes, utc_now
from ..errors import UsageError
from ..formats import convert
from ..snapshot import (
    CodeObject,
    Kernarg,
    Launch,
    Manifest,
    OmittedRegion,
    Param,
    detect_format,
    write_json_atomic,
)
from .blobpool import BlobPool
from .chains import PendingRegion, chain_regions, stored_region
from .filters import Filter
from .launches import KernargError, LaunchInfo, kernarg_bytes
from .modules import ModuleRegistry
from .names import short_name
from .regions import BlockTable, PlannedRegion, plan_regions, pointer_params, pointer_words
from .regions import segment_bytes as segments_of
from .summary import SUMMARY, CaptureFilter, CaptureSummary, Dispatch, ProfileUse, Totals
from .writers import WriterLog

DEFAULT_MAX_REGION_BYTES = 2 << 30


@dataclass(frozen=True)
class KernelInfo:
    """What the driver says about a launched function (resolved once per handle)."""

    handle: int
    name: str
    demangled: str
    layout: list[tuple[int, int]] | None
    layout_source: str
    module_handles: tuple[int | None, ...] = ()


@dataclass
class _Pending:
    """A dispatch between entry and exit: everything but the post-state."""

    index: int
    launch: LaunchInfo
    kernel: KernelInfo
    record: dict
    image: bytes = b""
    format: str = ""
    kernarg: bytes = b""
    params: tuple[Param, ...] = ()
    regions: list[PlannedRegion] = field(default_factory=list)
    pre: list[bytes] = field(default_factory=list)
    started: float = 0.0
    provenance: dict = field(default_factory=dict)
    upto: int = 0              # the writer log's seq before this launch
    table: BlockTable | None = None


class CaptureSession:
    #: A written region larger than this many bytes keeps its post-state as digests only
    #: (``kpair.capture.chains.stored_region``; None: as bytes). ``start_session`` sets it.
    post_digest_over: int | None = None

    def __init__(self, out: str | os.PathLike, filter: Filter, *, driver, registry:
                 ModuleRegistry, blocks: Callable[[], BlockTable] | None = None,
                 max_region_bytes: int = DEFAULT_MAX_REGION_BYTES,
                 command: list[str] | None = None,
                 environment: Callable[[], dict] | None = None,
                 metadata: Callable[[int, str], dict | None] | None = None,
                 level: int = 1, profile: ProfileUse | None = None,
                 writers: WriterLog | None = None, store_bytes: bool = False):
        self.out = Path(out)
        if self.out.exists() and (not self.out.is_dir() or any(self.out.iterdir())):
            raise UsageError(f"{self.out} exists and is not empty; capture writes into a new "
                             "or empty directory")
        self.out.mkdir(parents=True, exist_ok=True)
        self.filter, self.driver, self.registry = filter, driver, registry
        self.blocks = blocks or (lambda: BlockTable())
        self.max_region_bytes = max_region_bytes
        self.command = list(command if command is not None else sys.argv)
        self.extra_environment = environment
        self.metadata = metadata
        self.profile = profile
        #: The tracer's writer log (None: every region is stored as bytes), and
        #: ``--store-bytes``: chains are never stored.
        self.writers = None if store_bytes else writers
        self.store_bytes = store_bytes
        self.pool = BlobPool(self.out / "blobs", level=level)
        self.records: list[dict] = []
        self.seen: Counter[str] = Counter()
        self.launches = 0
        self.skipped: Counter[str] = Counter()
        self.notes: list[str] = []
        self.exit_status: int | None = None
        self._pending: dict[tuple[int, int], _Pending] = {}
        self._environment: dict | None = None
        self._lock = threading.RLock()
        self._started, self._t0 = utc_now(), time.monotonic()
        self.closed = False
        self.write_summary()

    # ---------------------------------------------------------------- the callbacks

    def launch_enter(self, launch: LaunchInfo, kernel: KernelInfo, correlation: int) -> None:
        with self._lock:
            self.launches += 1
            self.seen[kernel.name] += 1
            if self.closed or not self.filter.consider(kernel.name, kernel.demangled):
                return
            index = len(self.records) + 1
            record = {"index": index, "status": "capturing", "kernel": kernel.name,
                      "demangled": kernel.demangled, "launch_index": self.launches,
                      "api": launch.api, "grid": list(launch.grid),
                      "block": list(launch.block),
                      "dynamic_shared_bytes": launch.dynamic_shared_bytes,
                      "attributes": [a.name for a in launch.attributes],
                      "stream": hex(launch.stream)}
            self.records.append(record)
            p = _Pending(index, launch, kernel, record, started=time.monotonic())
            try:
                self._enter(p)
            except _Skip as e:
                self._fail(p, str(e))
                return
            except Exception as e:  # a bug here must not take the user's program down
                self._fail(p, f"internal error while capturing: {e!r}")
                return
            self._pending[(threading.get_ident(), correlation)] = p

    def launch_exit(self, correlation: int, status: int) -> None:
        with self._lock:
            p = self._pending.pop((threading.get_ident(), correlation), None)
            if p is None:
                return
            try:
                self._exit(p, status)
            except _Skip as e:
                self._fail(p, str(e))
            except Exception as e:  # a bug here must not take the user's program down
                self._fail(p, f"internal error while capturing: {e!r}")

    # ---------------------------------------------------------------- capture steps

    def _enter(self, p: _Pending) -> None:
        k, launch = p.kernel, p.launch
        if launch.stream and self.driver.stream_capturing(launch.stream):
            raise _Skip("the stream is being captured into a CUDA graph: synchronising "
                        "would break the capture, so this dispatch was left alone")
        found = self.registry.find(k.name, k.module_handles)
        if found is None:
            raise _Skip(
                "no loaded code object holds this kernel: its module was loaded before capture "
                "was installed, or was not reported under lazy loading (install capture before "
                "CUDA initialises, with CUDA_MODULE_LOADING=EAGER; `kpair capture` does both)")
        try:
            fmt = detect_format(found.image)
        except Exception as e:  # an unknown image format skips this dispatch only
            raise _Skip(f"the code object holding it is in an unknown format ({e})") from None
        try:
            blob, layout, how = kernarg_bytes(launch, k.layout)
        except KernargError as e:
            raise _Skip(str(e)) from None
        code = self.driver.synchronize()
        if code:
            raise _Skip(f"cuCtxSynchronize before the launch failed: "
                        f"{self.driver.error_name(code)}")
        p.table = self.blocks()
        p.upto = self.writers.seq if self.writers is not None else 0
        regions = plan_regions(pointer_words(blob, layout), p.table,
                               self.driver.address_range)
        kept, omitted = [], []
        for r in regions:
            if r.size > self.max_region_bytes:
                omitted.append({"name": r.name, "address": hex(r.start), "size": r.size,
                                "reason": f"larger than the per-region cap of "
                                          f"{human_bytes(self.max_region_bytes)}"})
                continue
            try:
                p.pre.append(bytes(self.driver.read(r.start, r.size)))
            except Exception as e:  # an unreadable region is reported, not fatal
                omitted.append({"name": r.name, "address": hex(r.start), "size": r.size,
                                "reason": f"could not be read: {e}"})
                continue
            kept.append(r)
        for o in omitted:
            print(f"kpair capture: dispatch {p.index} ({short_name(k.demangled)}): region "
                  f"{o['name']} at {o['address']} ({human_bytes(o['size'])}) left out: "
                  f"{o['reason']}"
                  "; the snapshot is marked incomplete", file=sys.stderr)
        pointers = pointer_params(kept, layout)
        p.params = tuple(Param(o, s, "pointer" if i in pointers else "bytes", f"arg{i}")
                         for i, (o, s) in enumerate(layout))
        p.kernarg, p.regions = blob, kept
        p.image, p.format = found.image, fmt
        p.record.update({"regions": len(kept), "omitted_regions": omitted,
                         "region_bytes": sum(r.size for r in kept),
                         "segment_bytes": segments_of(kept),
                         "code_object_match": found.how})
        p.provenance = {
            "captured_by": f"kpair {__version__} capture", "command": self.command,
            "time": utc_now(), "api": launch.api, "stream": hex(launch.stream),
            "kernel_demangled": k.demangled, "launch_index": p.record["launch_index"],
            "module_id": found.module_id, "code_object_match": found.how,
            "kernarg_from": how, "layout_from": k.layout_source,
            "regions": [{"name": r.name, "address": hex(r.start), "size": r.size,
                         "source": r.source, "segment_address": hex(r.segment_start),
                         "segment_size": r.segment_size,
                         "kernarg_words": [w.offset for w in r.words]} for r in kept],
            "omitted_regions": omitted}
        if self.metadata is not None:
            meta = self.metadata(k.handle, k.name)
            if meta:
                p.provenance["triton"] = meta
                p.record["triton_metadata"] = sorted(meta)

    def _exit(self, p: _Pending, status: int) -> None:
        if status:
            raise _Skip(f"the launch itself failed: {self.driver.error_name(status)}")
        code = self.driver.synchronize()
        if code:
            raise _Skip(f"the kernel failed: {self.driver.error_name(code)} (cuCtxSynchronize "
                        "after the launch)")
        post = []
        for r in p.regions:
            try:
                post.append(bytes(self.driver.read(r.start, r.size)))
            except Exception as e:
                raise _Skip(f"post-state of region {r.name} could not be read: {e}") from None
        name = f"{p.index:04d}_{short_name(p.kernel.demangled)}"
        writer = self.pool.writer(self.out / name)
        chains = chain_regions(self.writers, p.upto,
                               [PendingRegion(r.name, r.start, pre)
                                for r, pre in zip(p.regions, p.pre, strict=True)],
                               p.table or BlockTable(), self.registry, writer.chain)
        regions = tuple(stored_region(writer, r.name, r.start, pre, after, chains.get(r.name),
                                      post_digest_over=self.post_digest_over)
                        for r, pre, after in zip(p.regions, p.pre, post, strict=True))
        pending = self.keep_pending(chains, {r.name: pre for r, pre in zip(p.regions, p.pre,
                                                                          strict=True)})
        code_obj = CodeObject(writer.put(p.image), p.format, p.kernel.name)
        launch = Launch(p.launch.grid, p.launch.block, p.launch.dynamic_shared_bytes,
                        p.launch.attributes)
        complete = not p.record["omitted_regions"]
        omitted = tuple(OmittedRegion(o["name"], int(o["address"], 16), o["size"], o["reason"],
                                      self.max_region_bytes)
                        for o in p.record["omitted_regions"])
        env = self.environment()
        manifest = Manifest(backend="cuda", arch=env.get("arch", "unknown"), code=code_obj,
                            launch=launch, kernarg=Kernarg(writer.put(p.kernarg), p.params),
                            regions=regions, environment=env, provenance=p.provenance,
                            complete=complete, omitted_regions=omitted or UNSET)
        writer.finish(manifest)
        p.record.update({"status": "captured", "snapshot": name, "complete": complete,
                         "state_bytes": 2 * p.record["region_bytes"],
                         "code_object_bytes": len(p.image),
                         "stored_bytes": writer.new_bytes,
                         "deduped_bytes": writer.deduped_bytes,
                         "regenerated": len(chains),
                         "capture_s": round(time.monotonic() - p.started, 4)})
        if pending:
            p.record["chain_pre"] = pending
        self.write_summary()

    def keep_pending(self, chains: dict, pres: dict[str, bytes]) -> dict[str, str]:
        """The captured bytes of each region stored as a chain, kept in the pool until the
        chain is verified (``kpair.capture.chains.verify``): region name -> sha256."""
        return {name: self.pool.add(pres[name])[0] for name in chains}

    def _fail(self, p: _Pending, reason: str) -> None:
        p.record.update({"status": "failed", "reason": reason})
        print(f"kpair capture: dispatch {p.index} ({short_name(p.kernel.demangled)}) not "
              f"captured: {reason}", file=sys.stderr)
        self.write_summary()

    # ---------------------------------------------------------------- summary

    def environment(self) -> dict:
        if self._environment is None:
            env: dict = {"backend": "cuda"}
            device = self.driver.current_device()
            if device is not None:
                env.update(self.driver.device_facts(device))
            if self.extra_environment is not None:
                env.update(self.extra_environment())
            env["module_loading"] = os.environ.get("CUDA_MODULE_LOADING", "LAZY (default)")
            self._environment = env
        return self._environment

    def summary_record(self) -> CaptureSummary:
        """``capture.json`` as it stands now; every dispatch so far is checked against the
        format here, since the capture steps fill them in piece by piece."""
        captured = [r for r in self.records if r["status"] == "captured"]
        totals = {key: sum(r.get(key, 0) for r in captured)
                  for key in ("region_bytes", "segment_bytes", "state_bytes", "stored_bytes",
                              "deduped_bytes")}
        return CaptureSummary(
            kpair_version=__version__, command=list(self.command), started=self._started,
            wall_s=round(time.monotonic() - self._t0, 3), exit_status=self.exit_status,
            filter=convert(self.filter.to_json(), CaptureFilter, field="filter"),
            max_region_bytes=self.max_region_bytes, environment=self._environment or {},
            launches_seen=self.launches, distinct_kernels_seen=len(self.seen),
            matched=self.filter.matches, captured=len(captured),
            failed=sum(r["status"] == "failed" for r in self.records),
            modules_loaded=len(self.registry.images), module_bytes=self.registry.total_bytes,
            totals=Totals(**totals, pool_bytes=self.pool.stored_bytes), notes=list(self.notes),
            dispatches=[convert(r, Dispatch, field=f"dispatches[{i}]")
                        for i, r in enumerate(self.records)],
            kernels_seen=dict(self.seen.most_common()),
            profile=self.profile if self.profile is not None else UNSET)

    def summary(self) -> dict:
        return self.summary_record().to_json()

    def write_summary(self) -> dict:
        summary = self.summary()
        write_json_atomic(self.out / SUMMARY, summary)
        return summary

    def close(self, exit_status: int | None = None) -> dict:
        with self._lock:
            self.closed = True
            for p in self._pending.values():  # launches whose exit never came
                p.record.update({"status": "failed", "reason": "the launch never returned"})
            self._pending.clear()
            self.exit_status = exit_status
            if self.filter.matches == 0:
                what = f"no launch matched --kernel {self.filter.kernel!r}" \
                    if self.filter.kernel else "no kernel launch was seen"
                if self.filter.names is not None:
                    what = "no launch of the chosen kernels was seen"
                self.notes.append(f"{what} ({self.launches} launches of {len(self.seen)} "
                                  "distinct kernels seen)")
            elif self.filter.names is not None and self.filter.distinct:
                missing = set(self.filter.names) - self.filter.seen_names()
                if missing:
                    self.notes.append(f"{len(missing)} of the {len(self.filter.names)} chosen "
                                      "kernels were not launched in this run: "
                                      + ", ".join(sorted(missing)))
            elif self.filter.matches < self.filter.nth:
                self.notes.append(f"only {self.filter.matches} launches matched; --nth "
                                  f"{self.filter.nth} was never reached")
            return self.write_summary()  # what the file says, to the last wall_s


class _Skip(Exception):
    """This dispatch cannot be captured; the reason goes into capture.json."""
