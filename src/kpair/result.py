"""``result.json``: the verdict of one harness run, as a typed record with one strict reader.

``Result`` is what every writer produces (the run pipeline, the isolated runner, a release's
batch) and what every reader consumes (release rows, the report, ``kpair inspect``); its parts
are ``Correctness``, ``Speed``, ``Checks``, ``TrustEntry``, ``Side`` and ``ErrorInfo``.
``Result.read(path)`` validates a file against the contract (``docs/format.md``,
``docs/schemas/result.schema.json``) and names the failing field.

Invariants every Result holds (checked on construction): ``correct`` is true only for
``pass``; a ``pass`` has a policy verdict and a speed; a ``fail`` has a verdict and no speed;
an ``error`` has an ``error`` and claims nothing.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import msgspec

from . import __version__
from ._util import utc_now
from .errors import FormatError, WorkerFailed
from .formats import Record, check_version, convert, read, write
from .sol import SpeedOfLight

SCHEMA = "kpair.result"
SCHEMA_VERSION = 1
STATUSES = ("pass", "fail", "error")
EXIT_PASS, EXIT_FAIL = 0, 1

Status = Literal["pass", "fail", "error"]


class Side(Record):
    """One kernel of the pair as it ran: its name and the binary it came from."""

    kernel: str
    binary: str


class ErrorInfo(Record, omit_defaults=True):
    """Why no verdict was reached: the error's type, message, the stage it happened in."""

    type: str
    message: str
    stage: str | None = None
    exit_code: int | None = None
    traceback: str | None = None


class Correctness(Record, omit_defaults=True):
    """The policy verdict of opt (``regions``: one judged region each, see docs/format.md);
    ``failed_check`` names the trust check that failed the run, if one did."""

    passed: bool
    mode: str
    regions: list[dict[str, Any]]
    policy: dict[str, Any]
    summary: str = ""
    failed_check: str | None = None


class Systematic(Record):
    """The identical-binary control: ref against a separately loaded copy of ref, placed and
    launched as opt is. ``bound`` (>= 1) is how far from 1.0 its interval reaches; it widens
    the speedup interval into ``Speed.combined_ci95``."""

    control: str
    speedup: float
    ci95: tuple[float, float]
    slot_bias: float
    blocks: int
    bound: float


class Replicate(Record, omit_defaults=True):
    """One replicate of a speed measurement: its own ABBA run on fresh loads of both kernels."""

    speedup: float
    ci95: tuple[float, float]
    slot_bias: float
    blocks: int
    stopped_by: str


class Speed(Record, omit_defaults=True):
    """The ABBA measurement (``kpair.measure``) and how it was taken. With the identical-binary
    control (the default), ``systematic`` and ``combined_ci95`` say how much of the interval a
    difference between two loads of the same code could explain, and ``difference`` is the
    verdict read from the combined interval: "faster", "slower" or "none".

    Measured in ``replicates`` (the default), ``speedup`` and ``ci95`` are the replicate-level
    estimate and its 95% re-run interval (``interval`` says "re-run"): where another run's point
    lands; ``mean_ci95`` is the confidence interval of the speedup itself. The pooled blocks
    give ``slot_bias``, ``fwd``, ``rev`` and the counts."""

    mode: str
    speedup: float
    ci95: tuple[float, float]
    slot_bias: float
    slot_bias_ci95: tuple[float, float]
    fwd: float
    rev: float
    blocks: int
    forward_blocks: int
    reverse_blocks: int
    stopped_by: str
    rel_ci_halfwidth: float
    seed: int
    n_boot: int
    debug_only: dict[str, Any]
    samples_file: str | None = None
    samples_sha256: str | None = None
    cache: str | None = None
    clocks_mhz: dict[str, Any] | None = None
    aa_control: Speed | None = None
    systematic: Systematic | None = None
    combined_ci95: tuple[float, float] | None = None
    difference: str | None = None
    interval: str | None = None
    mean_ci95: tuple[float, float] | None = None
    replicate_sd_log: float | None = None
    run_offset_ns: float | None = None
    run_rel_sd_log: float | None = None
    cpu_wait: float | None = None
    run_sd_log: float | None = None
    location: str | None = None
    replicates: list[Replicate] | None = None

    @property
    def reported_ci95(self) -> tuple[float, float]:
        """The interval a verdict is read from: the combined one when there is one."""
        return self.combined_ci95 if self.combined_ci95 is not None else self.ci95


class Checks(Record, omit_defaults=True):
    """Whether the trust checks ran, which were skipped, and the seed of their randomness."""

    enabled: bool
    skipped: list[str] | None = None
    seed: int | None = None


class TrustEntry(Record, omit_defaults=True):
    """One trust check's outcome: ``passed`` None means not judged (skipped, warning)."""

    ran: bool
    passed: bool | None
    finding: dict[str, Any]
    reason: str | None = None


class Result(Record, omit_defaults=True, kw_only=True):
    """The whole file. Fields that may be absent are omitted when None; ``correct``,
    ``correctness`` and ``speed`` are always written (null when there is none). Build one
    with ``Result.make``, which fills in the format and version."""

    schema: Literal["kpair.result"]
    schema_version: Literal[1]
    kpair_version: str
    harness: str
    started: str
    status: Status
    correct: bool | None
    correctness: Correctness | None
    speed: Speed | None
    error: ErrorInfo | None = None
    environment: dict[str, Any] | None = None
    replay: dict[str, Any] | None = None
    sandbox: dict[str, Any] | None = None
    inputs_digest: str | None = None
    ref: Side | None = None
    opt: Side | None = None
    checks: Checks | None = None
    trust: dict[str, TrustEntry] | None = None
    warnings: list[str] | None = None
    stage_s: dict[str, float] | None = None
    wall_s: float | None = None
    log: str | None = None
    sol: SpeedOfLight | None = None

    def __post_init__(self) -> None:
        if self.correct is not (True if self.status == "pass" else
                                False if self.status == "fail" else None):
            raise ValueError(f"status {self.status!r} does not allow correct={self.correct!r}")
        if self.status == "pass" and (self.speed is None or self.correctness is None):
            raise ValueError("a pass needs a correctness verdict and a speed")
        if self.status == "fail" and (self.speed is not None or self.correctness is None):
            raise ValueError("a fail has a correctness verdict and no speed")
        if self.status == "error" and self.error is None:
            raise ValueError("an error result must say what the error was")

    @classmethod
    def make(cls, *, status: Status, correctness: Correctness | None = None,
             speed: Speed | None = None, **fields: Any) -> Result:
        correct = True if status == "pass" else False if status == "fail" else None
        return cls(schema=SCHEMA, schema_version=SCHEMA_VERSION, kpair_version=__version__,
                   status=status, correct=correct, correctness=correctness, speed=speed,
                   **fields)

    # ------------------------------------------------------------ reading and writing

    @classmethod
    def from_json(cls, obj: Any, *, path: object = None) -> Result:
        check_version(obj, SCHEMA, SCHEMA_VERSION, path=path)
        return convert(obj, cls, path=path)

    @classmethod
    def read(cls, path: str | Path) -> Result:
        return read(Path(path), cls, schema=SCHEMA, version=SCHEMA_VERSION)

    def write(self, path: str | Path, *, replace: bool = True) -> None:
        """Write atomically (a temporary file, then a rename); over an existing file only
        with ``replace``."""
        write(Path(path), self, replace=replace)

    # ------------------------------------------------------------ for people and shells

    @property
    def exit_code(self) -> int:
        if self.status == "pass":
            return EXIT_PASS
        if self.status == "fail":
            return EXIT_FAIL
        return (self.error.exit_code if self.error and self.error.exit_code
                else WorkerFailed.exit_code)

    @property
    def reason(self) -> str | None:
        """Why this run did not pass, in one line (None for a pass)."""
        if self.status == "pass":
            return None
        if self.status == "fail":
            return (self.correctness.summary if self.correctness else "") or "opt is incorrect"
        err = self.error
        stage = f" (stage {err.stage})" if err.stage else ""
        return f"{err.type}{stage}: {err.message}"

    def summary(self) -> str:
        """One line: the verdict the seed's users expect to read."""
        if self.status == "error":
            return f"ERROR ({self.error.type}): {self.error.message}"
        corr = self.correctness
        if self.status == "fail":
            text = corr.summary or "opt is incorrect"
            return text if text.startswith("FAIL") else f"FAIL: {text}"
        s = self.speed
        lo, hi = s.reported_ci95
        which = "CI" if s.combined_ci95 is None else \
            f"CI with systematic +-{(s.systematic.bound - 1) * 100:.2f}%"
        if s.difference == "none":
            verdict = f"no measurable difference ({s.speedup:.3f}x)"
        else:
            verdict = f"{s.speedup:.3f}x " + ("slower" if s.difference == "slower" or
                                              (s.difference is None and s.speedup < 1)
                                              else "faster")
        line = (f"PASS: {corr.mode}, {verdict}, slot bias {s.slot_bias:.4f}, "
                f"{which} [{lo:.3f}, {hi:.3f}] ({s.blocks} blocks, stopped by "
                f"{s.stopped_by}; replay {(self.replay or {}).get('mode')})")
        if self.trust:
            passed = [t for t in self.trust.values() if t.passed is True]
            line += f"; {len(passed)} trust checks passed"
        for w in self.warnings or []:
            line += f"; WARNING {w}"
        return line


def error_result(harness: str | Path, error: BaseException | str, *, stage: str | None = None,
                 kind: str | None = None, exit_code: int | None = None,
                 facts: dict[str, Any] | None = None, traceback: str | None = None) -> Result:
    """An ``error`` Result: never claims correctness, says what failed and where. ``facts``
    (started, environment, replay, inputs_digest, ref, opt, stage_s) keep what was learnt
    before the error."""
    if exit_code is None and isinstance(error, BaseException):
        exit_code = getattr(error, "exit_code", None)
    info = ErrorInfo(type=kind or type(error).__name__, message=str(error), stage=stage,
                     exit_code=exit_code)
    if traceback:
        info = msgspec.structs.replace(info, traceback=traceback)
    keep = {k: v for k, v in (facts or {}).items()
            if k in ("started", "environment", "replay", "sandbox", "inputs_digest", "ref",
                     "opt", "stage_s") and v is not None}
    keep.setdefault("started", utc_now())
    return Result.make(harness=str(harness), status="error", error=info, **keep)


def read_result(path: str | Path) -> Result | None:
    """The result at ``path``, None when there is none; FormatError names a bad field."""
    path = Path(path)
    if not path.exists():
        return None
    return Result.read(path)


__all__ = ["Checks", "Correctness", "ErrorInfo", "FormatError", "Result", "STATUSES", "Side",
           "Speed", "Systematic", "TrustEntry", "error_result", "read_result"]
