"""The release writers: ``verify_release`` and ``add_operator``, under one lock.

``verify_release`` re-runs every published harness, each in its own worker process
(``kpair.isolation.run_isolated``), writes every result.json and then the index: the
published rows stay as they were, each gets a ``Verification`` of its re-run appended, and
the index one ``VerifyRun`` (an operator with no earlier row is published by the verify).
``add_operator`` stages a copy of the harness inside the root (``.add-<pid>-<random>``),
verifies the staged copy, and only on a pass that is a real gain (its speedup CI lies above
1.0, unless ``allow_slower``) moves it into place with one directory rename and rewrites the
index; anything else is recorded as refused under ``excluded/``. The index is always written
through a temporary file and a rename, and a failed index write moves the directories back, so
an interrupted command leaves the previous index and tree as they were.

Both writers hold an exclusive ``flock`` on ``<root>/.kpair-release.lock`` for their whole run:
two concurrent adds would otherwise each rewrite the index from the same old copy and lose one
operator. Staging directories carry their owner's pid; each writer removes those whose owner
is gone (a ``release add`` killed with SIGKILL cannot clean up after itself).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import shutil
import tempfile
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import msgspec

from .._util import check_output_dir, make_dirs, pid_alive, utc_now
from ..errors import FormatError, InputError, OutputError, UsageError
from ..harness import OUTPUTS
from ..options import RunOptions
from ..result import Result
from ..scale.jobs import HarnessJob, Journal, finished, run_job, run_local
from .index import (
    DEVICES,
    EXCLUDED,
    HARNESS,
    INDEX,
    PRODUCERS,
    PROVENANCE,
    VERIFY,
    HarnessSpeed,
    Index,
    Row,
    build_index,
    check_key,
    device_run,
    harness_speed,
    is_operator_name,
    latest,
    load_index,
    operator_row,
    ref_identity_of,
    rel_dir,
    sort_key,
    verified_row,
    verify_run,
    with_devices,
)

LOCK = ".kpair-release.lock"
STAGING_PREFIX = ".add-"
EXIT_REFUSED = 1

#: progress(done, total, "level1/op", row or None): None when an operator starts.
Progress = Callable[[int, int, str, "Row | None"], None]


@contextlib.contextmanager
def locked(root: Path) -> Iterator[None]:
    """Hold the release's writer lock, with this process's pid written in it.

    The ``flock`` is released by the kernel when its holder dies. A lock still held although
    the pid it names is gone (a child that inherited the descriptor outlived a killed
    writer) is taken over: the lock file is replaced by a fresh one. A lock file that is no
    longer the one at ``root/LOCK`` once locked (another writer replaced it meanwhile) is
    dropped and the new one taken."""
    path = root / LOCK
    for _ in range(8):
        fh = open(path, "a+")  # noqa: SIM115 - held for the whole block below
        try:
            try:
                fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                owner = _lock_owner(fh)
                if owner is None or pid_alive(owner):
                    who = f" (pid {owner})" if owner else ""
                    raise UsageError(f"another kpair command{who} is writing {root} (lock "
                                     f"{LOCK}); wait for it to finish") from None
                _replace_stale_lock(path, fh)  # its writer is gone: take it over
                continue
            if not _same_file(path, fh):
                continue  # replaced while we waited for it: lock the one in place
            fh.seek(0)
            fh.truncate()
            fh.write(f"{os.getpid()}\n")
            fh.flush()
            try:
                yield
            finally:
                with contextlib.suppress(OSError):
                    fh.truncate(0)
                    fh.flush()
                fcntl.flock(fh, fcntl.LOCK_UN)
            return
        finally:
            fh.close()
    raise UsageError(f"the lock {path} keeps changing hands; try again")


def _lock_owner(fh) -> int | None:
    """The pid a lock file names (None: none, or not a pid)."""
    with contextlib.suppress(OSError, ValueError):
        fh.seek(0)
        text = fh.read(32).strip()
        return int(text) if text.isdigit() and int(text) > 0 else None
    return None


def _same_file(path: Path, fh) -> bool:
    try:
        a, b = os.stat(path), os.fstat(fh.fileno())
    except OSError:
        return False
    return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)


def _replace_stale_lock(path: Path, fh) -> None:
    """Put a fresh lock file in place of ``fh`` (if it is still the one at ``path``)."""
    if _same_file(path, fh):
        with contextlib.suppress(OSError):
            os.unlink(path)


def lock_held(root: Path) -> bool:
    """Whether a live writer holds the release's lock (a lock whose holder died is free)."""
    path = root / LOCK
    try:
        fh = open(path)  # noqa: SIM115
    except OSError:
        return False
    with fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            owner = _lock_owner(fh)
            return owner is None or pid_alive(owner)
        fcntl.flock(fh, fcntl.LOCK_UN)
        return False


def check_empty_release_dir(root: str | os.PathLike) -> Path:
    """Refuse (``OutputError``, exit 2) an output for a new release that is not absent or
    empty. A folder holding nothing but a free release lock (and staging folders of dead
    writers), as an interrupted command leaves it, counts as empty."""

    root = check_output_dir(root)
    if not root.is_dir():
        return root
    left = [p for p in root.iterdir() if p.name != LOCK and not _stale_staging(p)]
    if left:
        raise OutputError(f"{root} exists and is not empty; give a new or empty directory "
                          "(nothing was written)")
    if lock_held(root):
        raise UsageError(f"another kpair command is writing {root} (lock {LOCK}); wait for "
                         "it to finish")
    return root


def _stale_staging(path: Path) -> bool:
    m = re.match(rf"{re.escape(STAGING_PREFIX)}(\d+)-", path.name)
    return bool(m) and path.is_dir() and not path.is_symlink() and not pid_alive(int(m.group(1)))


def sweep_stale_staging(root: Path) -> list[Path]:
    """Remove ``.add-<pid>-*`` directories whose owning process is gone. Called with the lock
    held, so no live writer of this release owns one it does not know about."""
    removed = []
    for path in root.glob(f"{STAGING_PREFIX}*"):
        m = re.match(rf"{re.escape(STAGING_PREFIX)}(\d+)-", path.name)
        if m and path.is_dir() and not path.is_symlink() and not pid_alive(int(m.group(1))):
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
    return removed


def discover(root: Path) -> list[tuple[int, str]]:
    """Every published operator: ``level<N>/<op>/harness/harness.json`` under ``root``."""
    found = []
    for level_dir in root.glob("level*"):
        m = re.fullmatch(r"level([1-9][0-9]*)", level_dir.name)
        if not m or not level_dir.is_dir():
            continue
        for op in level_dir.iterdir():
            if is_operator_name(op.name) and (op / HARNESS / "harness.json").is_file():
                found.append((int(m.group(1)), op.name))
    return sorted(found, key=lambda k: sort_key(*k))


def release_backend(root: Path) -> str:
    """The backend of a release's harnesses (a pool is of one kind of device): "host" for
    an empty release; UsageError when they mix backends."""
    backends = set()
    for level, name in discover(root) if root.is_dir() else []:
        try:
            spec = json.loads((root / f"level{level}" / name / HARNESS / "harness.json")
                              .read_text())
        except (OSError, ValueError):
            continue  # that harness's own run says what is wrong with it
        backends.add(spec.get("backend") if isinstance(spec, dict) else None)
    backends.discard(None)
    if len(backends) > 1:
        raise UsageError(f"{root} mixes backends {sorted(backends)}: verify each on its own "
                         "devices")
    return backends.pop() if backends else "host"


def _run_one(harness_dir: Path, options: RunOptions) -> Result:
    """run_isolated, and whatever goes wrong around the worker still becomes an error result."""
    return run_job(HarnessJob(str(harness_dir), harness_dir, harness_dir / "result.json"),
                   options, options.ordinal)


#: Runs harness jobs somewhere and yields ``(job, device, result)`` in completion order, each
#: result already written to ``job.out``: ``kpair.scale.run_local`` or ``kpair.scale.ray``.
Runner = Callable[[list[HarnessJob], RunOptions], Iterator[tuple[HarnessJob, int, Result]]]


def device_result_path(root: Path, level: int, name: str, device: int, primary: int,
                       run: int | None = None) -> Path:
    """Where ``verify`` keeps the result of one device. A published operator's re-run
    (``run``) goes to ``level<N>/<op>/verify/<run>/``, other devices of ``--each`` below it in
    ``devices/<d>/``: the publication's result.json is never overwritten. Without ``run`` (the
    verify publishes the operator) the primary device's is the harness's own result.json and
    every other device's is ``level<N>/<op>/devices/<d>/``."""
    op = root / rel_dir(level, name)
    base = op / VERIFY / str(run) if run is not None else None
    if device == primary:
        return (base or op / HARNESS) / "result.json"
    return (base or op) / DEVICES / str(device) / "result.json"


def verify_release(root: str | os.PathLike, options: RunOptions | None = None, *,
                   progress: Progress | None = None, devices: Sequence[int] | None = None,
                   each: bool = False, fresh: bool = False,
                   runner: Runner | None = None) -> Index:
    """Run every published harness in its own process, write each result.json, then the index.

    A row the previous index published is kept as it was (its figures are the publication)
    and the re-run is appended to it as a ``Verification`` (``index.verified_row``); the
    index gets one ``VerifyRun`` tallying them. An operator found on disk with no earlier row
    is published by this verify (its row made from the re-run, as ``release add`` would).

    ``devices`` (default: ``options.device``, or 0) is the pool the harnesses are spread over,
    one in flight per device; ``each`` runs every harness on every device instead, and the
    row carries ``per_device`` verdicts (a correctness verdict that differs between devices is
    an error row). ``runner`` runs the jobs elsewhere (``kpair.scale.ray``). A batch that was
    interrupted is resumed: results it finished are kept (the rule: ``kpair.scale.jobs``)
    unless ``fresh``. The index is written once, at the end.

    Refused pairs recorded by earlier adds are carried over (they have no harness to re-run),
    unless an operator of the same level and name has since been published.
    """
    root = Path(root)
    if not root.is_dir():
        raise UsageError(f"{root} is not a directory")
    options = options or RunOptions()
    devices = tuple(devices) if devices else (options.ordinal,)
    if runner is None:
        def runner(jobs, opts):
            return run_local(jobs, opts, devices)
    with locked(root):
        started = utc_now()
        sweep_stale_staging(root)
        old = load_index(root)
        ops = discover(root)
        if not ops and old is None:
            raise UsageError(f"no operators under {root} (expected "
                             "level<N>/<op>/harness/harness.json)")
        before = {r.key: r for r in (old.operators if old else [])}
        history = list(old.verifications) if old else []
        run = max((v.run for v in history), default=0) + 1

        def out(level: int, name: str, device: int) -> Path:
            return device_result_path(root, level, name, device, devices[0],
                                      run if (level, name) in before else None)

        jobs = [HarnessJob(key=rel_dir(level, name), harness=root / rel_dir(level, name) / HARNESS,
                           out=out(level, name, d), device=d)
                for level, name in ops for d in devices] if each else \
            [HarnessJob(key=rel_dir(level, name), harness=root / rel_dir(level, name) / HARNESS,
                        out=out(level, name, devices[0])) for level, name in ops]
        settings = {"options": {k: v for k, v in options.to_json().items() if k != "device"},
                    "each": list(devices) if each else None}
        journal, resuming = Journal.begin(root, settings, fresh=fresh)
        results: dict[tuple[str, int | None], Result] = {}
        todo = []
        for job in jobs:
            kept = finished(job, journal) if resuming else None
            if kept is None:
                todo.append(job)
            else:
                results[job.key, job.device] = kept
        label = (lambda job, d: f"{job.key} on device {d}") if len(devices) > 1 else \
            (lambda job, d: job.key)
        done = len(jobs) - len(todo)
        try:
            for job, device, result in runner(todo, options):
                results[job.key, job.device] = result
                done += 1
                if progress:
                    level, name = _key_of(job.key)
                    progress(done, len(jobs), label(job, device),
                             _row(root, level, name, {device: result}, (device,), out))
        except BaseException:   # interrupted: no empty folder of this run is left behind
            _prune_empty([job.out.parent for job in todo], root)
            raise
        reruns = [_row(root, level, name, {d: results[rel_dir(level, name), d] for d in devices}
                       if each else {devices[0]: results[rel_dir(level, name), None]},
                       devices if each else (devices[0],), out)
                  for level, name in ops]
        rows = [verified_row(before[r.key], r, run=run) if r.key in before else r
                for r in reruns]
        records = [latest(r, run) for r in rows if r.key in before]
        if records:  # with nothing published before, this verify is the publication
            history.append(verify_run(run, started, [v for v in records if v is not None],
                                      first_published=sum(r.key not in before for r in rows)))
        published = set(ops)
        refused = [r for r in (old.refused if old else []) if r.key not in published]
        index = build_index(rows, refused, history)
        index.write(root / INDEX)
        journal.end()
    return index


def _prune_empty(folders: Sequence[Path], root: Path) -> None:
    """Remove each folder, and then its parents below the operator's, where empty."""
    for folder in folders:
        while folder.parent != root and folder.parent.parent != root:   # keep level<N>/<op>
            try:
                folder.rmdir()
            except OSError:   # not empty, or gone
                break
            folder = folder.parent


def _key_of(key: str) -> tuple[int, str]:
    level, name = key.split("/", 1)
    return int(level.removeprefix("level")), name


def _row(root: Path, level: int, name: str, results: dict[int, Result],
         devices: tuple[int, ...], out: Callable[[int, str, int], Path]) -> Row:
    """The operator's row: from its one result, or (several devices) from the first device's,
    with every device's verdict side by side and a disagreement made an error. ``out``
    (level, name, device) is where each device's result was written."""
    op = root / rel_dir(level, name)
    prov = op / PROVENANCE
    row = operator_row(level, name, results[devices[0]], harness_dir=op / HARNESS,
                       provenance_dir=prov if prov.is_dir() else None)
    if row.paths.result is not None:
        row = row.replace(paths=row.paths.replace(
            result=out(level, name, devices[0]).relative_to(root).as_posix()))
    if len(devices) == 1:
        return row
    runs = [device_run(d, results[d], out(level, name, d).relative_to(root).as_posix())
            for d in devices]
    return with_devices(row, runs)


@dataclass(frozen=True)
class AddOutcome:
    """What ``add_operator`` did: ``added`` only on a pass that is a gain; ``row`` is the new
    index row (in ``operators`` if added, in ``refused`` if not)."""

    added: bool
    row: Row
    result: Result
    index: Index

    @property
    def exit_code(self) -> int:
        if self.added or self.result.status != "pass":
            return self.result.exit_code
        return EXIT_REFUSED  # correct, but not shown to be faster


def not_faster(speed: HarnessSpeed) -> str | None:
    """Why a measured pass is no gain (its speedup CI does not lie entirely above 1.0)."""
    lo, hi = speed.reported_ci95
    if lo > 1.0:
        return None
    return (f"not faster: speedup {speed.speedup:.3f}x, CI [{lo:.3f}, {hi:.3f}] does not "
            "lie above 1.0 (--allow-slower publishes it)")


def _copy_inputs(src: Path, dst: Path) -> None:
    # A harness's outputs are not inputs: the add re-verifies and writes its own.

    shutil.copytree(src, dst, symlinks=False, ignore=shutil.ignore_patterns(
        *OUTPUTS, "__pycache__", ".*"))


def add_operator(root: str | os.PathLike, harness: str | os.PathLike, *, level: int, name: str,
                 replace: bool = False, provenance: str | os.PathLike | None = None,
                 options: RunOptions | None = None, allow_slower: bool = False,
                 producer: str | None = None) -> AddOutcome:
    """Verify ``harness`` and publish it as ``level<N>/<name>`` only if it passes and its
    speedup CI lies above 1.0 (``allow_slower``: any pass). ``producer`` (one of
    ``index.PRODUCERS``): who made the candidate, kept in the published row's ``producer``
    as the tournament's winner row keeps it.

    Anything else is recorded in the index's ``refused`` list (with its result.json under
    ``excluded/``) and nothing is published. An operator already in the release is replaced
    only with ``replace=True``; a refused replacement leaves the published one in place. A
    harness whose ref identity (code sha256, kernel, launch) differs from the published
    operator's of that name is a different operator: refused (UsageError, before anything
    runs), with or without ``replace``; it is published under another name.
    """
    level, name = check_key(level, name)
    if producer is not None and producer not in PRODUCERS:
        raise UsageError(f"producer {producer!r} is not one of {', '.join(PRODUCERS)}")
    root, harness = Path(root), Path(harness)
    if not (harness / "harness.json").is_file():
        raise FormatError("no harness.json here: not a kpair harness", path=harness)
    prov_src = Path(provenance) if provenance is not None else None
    if prov_src is not None and not prov_src.is_dir():
        raise InputError(f"--provenance {prov_src}: " + (
            "not a directory" if prov_src.exists() else "no such directory"))
    make_dirs(root)  # refuses a file, a device, a folder that cannot be written
    options = options or RunOptions()
    key = rel_dir(level, name)
    with locked(root):
        sweep_stale_staging(root)
        old = load_index(root)
        old_ops, old_refused = (old.operators, old.refused) if old else ([], [])
        dest = root / key
        listed = [r for r in old_ops if r.key == (level, name)]
        _refuse_other_ref(key, harness, listed[0] if listed else None)
        if (dest.exists() or listed) and not replace:
            raise UsageError(f"{key} is already in the release; pass --replace to replace it")
        staging = Path(tempfile.mkdtemp(prefix=f"{STAGING_PREFIX}{os.getpid()}-", dir=root))
        try:
            staged = staging / "op"
            _copy_inputs(harness, staged / HARNESS)
            if prov_src is not None:
                shutil.copytree(prov_src, staged / PROVENANCE)
            prov = staged / PROVENANCE if prov_src is not None else None
            result = _run_one(staged / HARNESS, options)
            speed = harness_speed(result)
            why_not = None if allow_slower or speed is None else not_faster(speed)
            passed = result.status == "pass" and why_not is None
            row = operator_row(level, name, result, harness_dir=staged / HARNESS,
                               provenance_dir=prov, published=passed)
            if why_not:  # correct but no gain: refused, with its numbers and the reason
                row = msgspec.structs.replace(row, reason=why_not)
            others = [r for r in old_ops if r.key != (level, name)]
            refused = [r for r in old_refused if r.key != (level, name)]
            history = old.verifications if old else []
            if passed:
                if producer is not None:
                    row = row.replace(producer=producer)
                result = msgspec.structs.replace(result,
                                                 harness=str((dest / HARNESS).resolve()))
                result.write(staged / HARNESS / "result.json")
                _publish(root, staging, dest, build_index(others + [row], refused, history))
            else:
                kept = [r for r in old_ops if r.key == (level, name)]
                _record_exclusion(root, staging, root / EXCLUDED / key,
                                  build_index(others + kept, refused + [row], history))
            return AddOutcome(passed, row, result, load_index(root))
        finally:
            shutil.rmtree(staging, ignore_errors=True)


def _refuse_other_ref(key: str, harness: Path, published: Row | None) -> None:
    """A harness whose ref differs from the published operator's is another operator: its
    speedup is not a new measurement of the published one, so it never replaces it."""
    if published is None or published.ref_identity is None:
        return
    mine = ref_identity_of(harness)
    if mine is None:
        return  # the run says what is wrong with it
    differs = published.ref_identity.differences(mine)
    if differs:
        raise UsageError(
            f"{key} is published with another ref: {harness} is a different operator, not a "
            f"new measurement of it ({'; '.join(differs)}); add it under another --name")


def _swap_in(new: Path, dest: Path, trash: Path) -> tuple[bool, list[Path]]:
    """Move ``new`` to ``dest``, the previous ``dest`` (if any) to ``trash``: whether there was
    one, and the folders above ``dest`` made for it. Each step is one rename, so nothing is
    ever half copied in the tree."""
    made = [p for p in reversed(dest.parents) if not p.exists()]
    dest.parent.mkdir(parents=True, exist_ok=True)
    had_old = dest.exists()
    if had_old:
        os.replace(dest, trash)
    os.replace(new, dest)
    return had_old, made


def _swap_back(new: Path, dest: Path, trash: Path, swapped: tuple[bool, list[Path]]) -> None:
    """Undo ``_swap_in``: the tree as it was, the folders it made for ``dest`` removed too."""
    had_old, made = swapped
    os.replace(dest, new)
    if had_old:
        os.replace(trash, dest)
    for folder in reversed(made):
        with contextlib.suppress(OSError):
            folder.rmdir()


def _publish(root: Path, staging: Path, dest: Path, index: Index) -> None:
    swapped = _swap_in(staging / "op", dest, staging / "old")
    try:
        index.write(root / INDEX)
    except BaseException:
        # The index was not replaced: put the tree back the way that index describes it.
        _swap_back(staging / "op", dest, staging / "old", swapped)
        raise


def _record_exclusion(root: Path, staging: Path, dest: Path, index: Index) -> None:
    keep = staging / "excluded"
    keep.mkdir()
    with contextlib.suppress(FileNotFoundError):
        os.replace(staging / "op" / HARNESS / "result.json", keep / "result.json")
    if (staging / "op" / PROVENANCE).is_dir():
        os.replace(staging / "op" / PROVENANCE, keep / PROVENANCE)
    swapped = _swap_in(keep, dest, staging / "old-excluded")
    try:
        index.write(root / INDEX)
    except BaseException:
        _swap_back(keep, dest, staging / "old-excluded", swapped)
        raise


def refuse_operator(root: str | os.PathLike, harness: str | os.PathLike, *, level: int,
                    name: str, result: Result, reason: str,
                    provenance: str | os.PathLike | None = None) -> AddOutcome:
    """Record ``level<N>/<name>`` as refused without running it again: an optimizer that
    found nothing to publish says so here, with ``result`` (the run that showed it) and
    ``reason``. The row and ``excluded/`` entry are those ``add_operator`` writes for a pair
    it refuses; ``harness`` only supplies kernel names and the policy. A published operator
    of that name is never replaced by a refusal."""
    level, name = check_key(level, name)
    root, harness = Path(root), Path(harness)
    prov_src = Path(provenance) if provenance is not None else None
    make_dirs(root)
    key = rel_dir(level, name)
    with locked(root):
        sweep_stale_staging(root)
        old = load_index(root)
        old_ops, old_refused = (old.operators, old.refused) if old else ([], [])
        if any(r.key == (level, name) for r in old_ops):
            raise UsageError(f"{key} is published; a refusal does not replace it")
        staging = Path(tempfile.mkdtemp(prefix=f"{STAGING_PREFIX}{os.getpid()}-", dir=root))
        try:
            (staging / "op" / HARNESS).mkdir(parents=True)
            result.write(staging / "op" / HARNESS / "result.json")
            prov = None
            if prov_src is not None:
                prov = staging / "op" / PROVENANCE
                shutil.copytree(prov_src, prov)
            row = operator_row(level, name, result, harness_dir=harness, provenance_dir=prov,
                               published=False)
            row = msgspec.structs.replace(row, reason=reason, refused_by="optimizer")
            refused = [r for r in old_refused if r.key != (level, name)]
            _record_exclusion(root, staging, root / EXCLUDED / key,
                              build_index(old_ops, refused + [row],
                                          old.verifications if old else []))
            return AddOutcome(False, row, result, load_index(root))
        finally:
            shutil.rmtree(staging, ignore_errors=True)


__all__ = ["AddOutcome", "LOCK", "Runner", "add_operator", "check_empty_release_dir",
           "release_backend",
           "device_result_path", "discover", "lock_held", "locked", "not_faster",
           "refuse_operator", "sweep_stale_staging", "verify_release"]
