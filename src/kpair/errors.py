"""One exception hierarchy for everything kpair refuses to do.

A correctness mismatch is *not* an exception: it is a verdict inside ``result.json``.
Exceptions are for input kpair cannot trust (bad files, wrong architecture, missing
symbols) and for the machinery failing (driver errors, crashed or hung workers).
Every message names what is wrong and, where possible, where (file, field, offset).

Exit codes (the one table; README "Exit codes" documents it for users): 0 pass / success,
1 incorrect (a correctness verdict, or a release refusing an operator), 2 usage (the command
line, or an output path that cannot or may not be written), 3 bad input file (missing,
unreadable, malformed or tampered with: snapshot, harness, policy, code object), 4 backend,
architecture, symbol or ABI, 5 runtime failure (driver error, crash, timeout, a write that
failed midway), 130 interrupted (SIGINT), 143 terminated (SIGTERM).
"""

from __future__ import annotations


class KpairError(Exception):
    """Base of every error kpair raises on purpose. ``exit_code`` is what the CLI returns."""

    exit_code = 2


class UsageError(KpairError):
    """The command line or API call itself is wrong (missing option, bad value)."""

    exit_code = 2


class OutputError(UsageError):
    """An output path that cannot or may not be written: a directory, a special file (a
    device, a FIFO), a path whose folder cannot be written, or a file that exists (it is
    replaced only with ``--force``). Raised before anything is written."""

    exit_code = 2


class WriteFailed(KpairError):
    """Writing an output failed midway (disk full, I/O error); nothing half-written is left."""

    exit_code = 5


class FormatError(KpairError):
    """A file kpair reads (manifest, policy, harness, index) is malformed or fails verification.

    ``field`` names the offending field as a dotted path (``regions[2].pre.sha256``) when known.
    """

    exit_code = 3

    def __init__(self, message: str, *, path: object = None, field: str | None = None):
        where = []
        if path is not None:
            where.append(str(path))
        if field:
            where.append(f"field {field}")
        super().__init__(f"{': '.join(where)}: {message}" if where else message)
        self.path = path
        self.field = field


class InputError(FormatError):
    """An input file or directory named on the command line (or to an API call) is missing,
    unreadable or not the kind of file expected (a code object, a candidate, a policy)."""


class SnapshotFormatError(FormatError):
    """A snapshot directory or one of its blobs is malformed, truncated or tampered with."""


class IncompleteSnapshot(SnapshotFormatError):
    """A snapshot whose capture left out memory the kernel can reach (``complete: false``):
    it cannot be replayed, so every verb that would place it refuses it, naming what is
    missing and the capture flag that keeps it."""


class PolicyError(FormatError):
    """A validation policy is malformed or does not fit the snapshot it is applied to."""


class HarnessError(FormatError):
    """A pair harness is incomplete or its inputs do not match their recorded sha256."""


class BackendUnavailable(KpairError):
    """A backend's driver or Python bindings are missing. The message carries the install hint."""

    exit_code = 4


class ArchitectureMismatch(KpairError):
    """A code object was built for another architecture than the device that should run it."""

    exit_code = 4


class SymbolNotFound(KpairError):
    """A kernel name is not present in the code object it should come from."""

    exit_code = 4


class AbiMismatch(KpairError):
    """The ref and opt kernels (or the snapshot) disagree on the kernel argument layout."""

    exit_code = 4


class DriverError(KpairError):
    """A driver call failed. Carries the call, the driver's error name and its explanation."""

    exit_code = 5

    def __init__(self, call: str, code: str, explanation: str = ""):
        text = f"{call} failed: {code}"
        if explanation:
            text += f" ({explanation})"
        super().__init__(text)
        self.call = call
        self.code = code
        self.explanation = explanation


class PlacementError(KpairError):
    """Captured regions could not be placed, neither at their addresses nor relocated."""

    exit_code = 5


class WorkerFailed(KpairError):
    """An isolated worker process crashed, was killed by a signal or timed out."""

    exit_code = 5


class Interrupted(KeyboardInterrupt):
    """SIGTERM, turned into an exception so that it unwinds like Ctrl-C (``with`` blocks
    remove their temporary directories and kill their workers); the CLI exits 143."""

    exit_code = 143
