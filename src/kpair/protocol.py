"""The worker protocol, both directions: every message as a typed struct, and the framing.

A worker (``kpair.isolation``) and its parent talk over three channels:

- **handshake** (parent → worker, stdin): ``KEY_BYTES`` raw random bytes, the key that signs
  everything the worker sends back, then the run's ``RunOptions`` as one JSON line
  (``options_arg`` / ``read_options``): never on the command line, which every process on
  the machine can read (the check seed is among them).
- **requests** (parent → worker, stdin after the key; a session worker only): one ``Judge``
  per line, plain JSON (``encode_request`` / ``decode_request``). The worker trusts its
  parent, so these lines are not signed.
- **reports** (worker → parent, a pipe of their own): ``Stage`` as the worker enters each
  stage and ``Tick`` as a measurement goes (for the parent's progress display, and as a
  sign of life for its hang limit); ``Ready`` once the harness is set up (with the Result
  that ends the run there, if any); then a ``VerdictMessage`` per candidate — or, for
  ``kpair replay``, one ``ReproductionMessage``. Each line is ``<hmac-sha256 hex> <json>``, signed
  with the key (``Channel.send``); the parent's ``Reader`` drops (and counts) every line that
  does not verify, so bytes a candidate writes to any descriptor it finds cannot pass for
  kpair's, and drops a line longer than ``MAX_LINE`` unread.

The messages are tagged (``{"type": "verdict", ...}``); bytes (a code object, the raw
samples) are written as base64 by msgspec itself. Results travel as JSON objects and are read
with ``Result.from_json`` (``read_result``), the same strict reader as ``result.json``'s:
a message that is well-formed but carries an invalid Result is still refused.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
from pathlib import Path
from typing import Any

import msgspec

from .errors import KpairError
from .formats import convert, to_builtins
from .pipeline import Candidate, RunOptions
from .progress import Meter
from .replay import Reproduction as ReproductionReport
from .result import Result

#: Bytes of the key the parent writes first on the worker's stdin.
KEY_BYTES = 32
#: The longest report line read: a result with every mismatch listed stays far below this.
MAX_LINE = 256 << 20


class Message(msgspec.Struct, frozen=True, forbid_unknown_fields=True, tag_field="type"):
    """Base of the protocol's messages."""


# ------------------------------------------------------------------ parent → worker


class Judge(Message, tag="judge"):
    """A candidate for a session worker: a code object (``image``), the kernel in it, its
    format, an optional launch override and a label for people; ``id`` comes back in the
    ``VerdictMessage``. A launch plan (format ``plan``: ``image`` holds the plan file) also
    sends the plan's path (``plan``): the worker reads it, with its code objects beside it,
    and checks it against the harness's range (``kpair.harness.load_plan``)."""

    id: int
    image: bytes
    kernel: str
    format: str
    launch_override: dict[str, Any] | None = None
    label: str = ""
    plan: str | None = None

    @classmethod
    def of(cls, id: int, candidate: Candidate) -> Judge:
        """The request that sends ``candidate`` (built: bytes, kernel, format) as ``id``."""
        plan = str(candidate.binary) if candidate.format == "plan" and candidate.binary \
            else None
        return cls(id, candidate.code(), candidate.kernel, candidate.format,
                   candidate.launch_override, candidate.label, plan)

    def candidate(self) -> Candidate:
        return Candidate(self.image, self.kernel, self.format, self.launch_override,
                         self.label, binary=Path(self.plan) if self.plan else None)


# ------------------------------------------------------------------ worker → parent


class Stage(Message, tag="stage"):
    """The worker enters stage ``name`` (named in the error if it dies there)."""

    name: str


class Tick(Message, tag="tick"):
    """How far a measurement in the current stage is (``kpair.progress.Meter``): shown by
    the parent, never part of a verdict."""

    meter: Meter


class Ready(Message, tag="ready"):
    """Setup is done: ``failed`` is the Result that ends the run there (the baseline itself
    failed a check, or setup raised), None when candidates can be judged."""

    failed: dict[str, Any] | None = None

    @classmethod
    def of(cls, failed: Result | None) -> Ready:
        return cls(failed.to_json() if failed is not None else None)


class VerdictMessage(Message, tag="verdict"):
    """One candidate judged: its ``id`` (None: the harness's own opt, ``kpair run``), the
    Result and, when speed was measured, the raw samples (the bytes of ``samples.npz``)."""

    id: int | None
    result: dict[str, Any]
    samples: bytes | None = None

    @classmethod
    def of(cls, result: Result, samples: bytes | None, id: int | None = None) -> VerdictMessage:
        return cls(id, result.to_json(), samples)


class ReproductionMessage(Message, tag="reproduction"):
    """``kpair replay``'s answer: a ``kpair.replay.Reproduction`` as JSON."""

    report: dict[str, Any]

    @classmethod
    def of(cls, report: ReproductionReport) -> ReproductionMessage:
        return cls(to_builtins(report))

    def read(self) -> ReproductionReport:
        """The report, validated (FormatError naming the field)."""
        return convert(self.report, ReproductionReport, path="worker message")


#: Everything a worker may send.
WorkerMessage = Stage | Tick | Ready | VerdictMessage | ReproductionMessage


class InvalidLine(msgspec.Struct, frozen=True):
    """A signed line that is not a message of this protocol (``why``): never a verdict."""

    why: str


def read_result(obj: dict[str, Any]) -> Result:
    """A Result from a message, read strictly (FormatError naming the field)."""
    return Result.from_json(obj, path="worker message")


# ------------------------------------------------------------------ framing

_encoder = msgspec.json.Encoder()
_reports = msgspec.json.Decoder(WorkerMessage)
_requests = msgspec.json.Decoder(Judge)


def options_arg(options: RunOptions) -> str:
    """``RunOptions`` as the worker's ``--options`` argument."""
    return json.dumps(options.to_json())


def read_options(text: str) -> RunOptions:
    return RunOptions.from_json(json.loads(text))


def encode_request(judge: Judge) -> bytes:
    """One request line for a session worker's stdin."""
    return _encoder.encode(judge) + b"\n"


def decode_request(line: bytes) -> Judge:
    return _requests.decode(line)


def sign(key: bytes, message: WorkerMessage) -> bytes:
    """One signed report line: ``<hmac-sha256 hex> <json>\\n``."""
    body = _encoder.encode(message)
    return hmac.new(key, body, hashlib.sha256).hexdigest().encode() + b" " + body + b"\n"


class Channel:
    """The worker's end of the report channel: a descriptor of its own, every line signed."""

    def __init__(self, fd: int, key: bytes):
        self.key = key
        self.file = os.fdopen(fd, "wb", buffering=0)

    def send(self, message: WorkerMessage) -> None:
        self.file.write(sign(self.key, message))


class Reader:
    """The parent's end of the report channel: bytes in, verified messages out.

    A line whose signature does not verify is dropped and counted (``forged``), as is a
    line longer than ``limit``; a signed line that does not decode as a ``WorkerMessage`` comes out
    as ``InvalidLine``."""

    def __init__(self, key: bytes, *, limit: int = MAX_LINE):
        self.key, self.limit = key, limit
        self.forged = 0
        self._buf = b""

    def feed(self, chunk: bytes) -> list[WorkerMessage | InvalidLine]:
        self._buf += chunk
        if len(self._buf) > self.limit:
            self._buf = b""
            self.forged += 1
            return []
        *lines, self._buf = self._buf.split(b"\n")
        out: list[WorkerMessage | InvalidLine] = []
        for line in lines:
            mac, _, body = line.partition(b" ")
            want = hmac.new(self.key, body, hashlib.sha256).hexdigest().encode()
            if not hmac.compare_digest(mac, want):
                self.forged += 1
                continue
            try:
                out.append(_reports.decode(body))
            except (msgspec.DecodeError, KpairError, ValueError) as e:
                out.append(InvalidLine(str(e)))
        return out


__all__ = ["KEY_BYTES", "MAX_LINE", "Channel", "InvalidLine", "Judge", "Message", "Ready",
           "Reader", "WorkerMessage", "ReproductionMessage", "Stage", "Tick", "VerdictMessage",
           "decode_request", "encode_request", "options_arg", "read_options", "read_result", "sign"]
