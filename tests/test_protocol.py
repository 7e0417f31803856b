"""The worker protocol (``kpair.protocol``): typed messages both ways, the signed framing, and
what the parent's reader drops."""

from __future__ import annotations

import hashlib
import hmac
import json
import secrets

import pytest

from kpair.errors import FormatError
from kpair.pipeline import Candidate, RunOptions
from kpair.protocol import (
    KEY_BYTES,
    InvalidLine,
    Judge,
    Reader,
    Ready,
    ReproductionMessage,
    Stage,
    VerdictMessage,
    decode_request,
    encode_request,
    options_arg,
    read_options,
    read_result,
    sign,
)
from kpair.replay import Reproduction as ReproductionReport
from kpair.result import error_result


@pytest.fixture
def key() -> bytes:
    return secrets.token_bytes(KEY_BYTES)


def test_a_judge_request_round_trips_with_its_image_in_base64():
    judge = Judge(7, b"\x7fELF\x00\xff", "kp_matmul", "elf", {"grid": [1, 1, 1]}, "cand")
    line = encode_request(judge)
    assert line.endswith(b"\n") and b"\n" not in line[:-1]
    body = json.loads(line)
    assert body["type"] == "judge" and body["image"] == "f0VMRgD/"
    assert decode_request(line) == judge
    assert judge.candidate() == Candidate(b"\x7fELF\x00\xff", "kp_matmul", "elf",
                                          {"grid": [1, 1, 1]}, "cand")


def test_signed_reports_come_back_typed_in_order_across_chunks(key, tmp_path):
    result = error_result(tmp_path, "boom", stage="ref")
    lines = (sign(key, Stage("ref")) + sign(key, Ready.of(None))
             + sign(key, VerdictMessage.of(result, b"\x00\x01", 3)))
    reader = Reader(key)
    got = []
    for i in range(0, len(lines), 7):  # a pipe delivers any split
        got += reader.feed(lines[i:i + 7])
    assert got[:2] == [Stage("ref"), Ready(None)]
    verdict = got[2]
    assert isinstance(verdict, VerdictMessage)
    assert verdict.id == 3 and verdict.samples == b"\x00\x01"
    assert read_result(verdict.result) == result
    assert reader.forged == 0


def test_unsigned_forged_and_oversized_lines_are_dropped_and_counted(key, tmp_path):
    reader = Reader(key, limit=4096)
    forged = json.dumps({"type": "verdict", "id": None, "result": {}}).encode()
    other = sign(secrets.token_bytes(KEY_BYTES), Ready.of(None))
    assert reader.feed(b"hello\n" + b"0" * 64 + b" " + forged + b"\n" + other) == []
    assert reader.forged == 3
    assert reader.feed(b"x" * 5000) == [] and reader.forged == 4  # no newline, too long
    assert reader.feed(sign(key, Stage("opt"))) == [Stage("opt")]


def test_a_signed_line_that_is_no_message_is_invalid_never_a_verdict(key):
    body = b'{"type": "verdict", "result": "pass"}'
    line = hmac.new(key, body, hashlib.sha256).hexdigest().encode() + b" " + body + b"\n"
    (got,) = Reader(key).feed(line)
    assert isinstance(got, InvalidLine) and "result" in got.why


def test_an_invalid_result_in_a_verdict_is_refused_by_the_strict_reader(tmp_path):
    bad = error_result(tmp_path, "boom").to_json() | {"status": "pass"}
    with pytest.raises(FormatError):
        read_result(bad)


def test_options_and_reproductions_travel_as_they_are(tmp_path):
    options = RunOptions(device=1, skip_checks=("differential",), time_cap_s=0.5)
    assert read_options(options_arg(options)) == options
    report = ReproductionReport(snapshot=str(tmp_path), kernel="k", runs=3,
                                status="byte-exact")
    assert ReproductionMessage.of(report).read() == report
