"""Chains in CUDA capture (issue 48), the parts that run without a GPU: the writer log fed as
the tracer feeds it (cached block table, memsets and copies, a fresh block as a launch's
output), the choice chain/bytes a session makes per region, and the confirmation step that
stores a failing chain's region as bytes (on the host backend)."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest

from conftest import CSRC
from kpair.backends import open_device
from kpair.backends.base import digest64
from kpair.capture.chains import PendingRegion, chain_regions
from kpair.capture.modules import Found
from kpair.capture.ranges import MemoryOp
from kpair.capture.regions import Block, BlockTable
from kpair.capture.tracer import feed_memory_op
from kpair.capture.writers import LaunchRecord, LiveBlocks, WriterLog
from kpair.regen import verify_capture
from kpair.replay import Replay, reproduce
from kpair.snapshot import Regen, Snapshot
from kpair.toolchain import compile_shared
from test_regen import SEED, _record, _splitmix, _tamper_seed

N_ = 1 << 20


def _blocks(*spans, state="active_allocated") -> BlockTable:
    return BlockTable(Block(a, n, a, n, "torch-block", state) for a, n in spans)


X, Y, Z, W = 0x10000000, 0x10100000, 0x10200000, 0x10300000
SPANS = [(X, N_), (Y, N_), (Z, N_), (W, N_)]


def _kernel(name: str, *pointers: int, scalar: int = 7) -> LaunchRecord:
    kernarg = b"".join(p.to_bytes(8, "little") for p in pointers) + scalar.to_bytes(8, "little")
    layout = tuple((8 * i, 8) for i in range(len(pointers) + 1))
    return LaunchRecord(name, code="0xc0de", kernarg=kernarg, grid=(4, 1, 1),
                        block=(128, 1, 1), kernel=1, layout=layout)


# ------------------------------------------------------------------ the log as fed


def test_live_blocks_refresh_only_on_a_miss_and_tell_which_blocks_appeared():
    log = WriterLog()
    tables = [_blocks((X, N_)), _blocks((X, N_), (Y, N_))]
    calls = []

    def source():
        calls.append(1)
        return tables[min(len(calls) - 1, 1)]

    live = LiveBlocks(source, log, driver_range=lambda a: (a, 1) if a >= X else None)
    assert live.find(X + 5).start == X and live.refreshes == 1
    assert live.find(X + 9).start == X and live.refreshes == 1   # cached: no snapshot
    assert live.find(0x20000) is None and live.refreshes == 1    # not device memory
    assert live.find(Y).start == Y and live.refreshes == 2       # a miss: one refresh
    # memory the driver knows outside the allocator's blocks: found once, then cached
    assert live.find(0x7F000000).source == "driver-range" and live.refreshes == 3
    assert live.find(0x7F000000).start == 0x7F000000 and live.refreshes == 3
    log.launch(_kernel("rand", X), {X}, guess=True)
    # X is freed and allocated again (seen free in a refresh): its writers are forgotten.
    tables[1] = _blocks((Y, N_))
    tables[1].blocks.append(Block(X, N_, X, N_, "torch-block", "inactive"))
    tables[1] = BlockTable(tables[1].blocks)
    live.refresh()
    assert log.writers(X) == [_kernel("rand", X)]
    tables[1] = _blocks((X, N_), (Y, N_))
    live.refresh()
    assert log.writers(X) == []


def test_a_fresh_block_is_what_an_out_of_place_launch_writes():
    log = WriterLog()
    log.launch(_kernel("rand", X), {X}, guess=True)
    log.launch(_kernel("rand", Y), {Y}, guess=True)
    log.launch(_kernel("add", X, Y, Z), {X, Y, Z}, guess=True)   # Z new: written, X Y read
    chains = log.chains({X, Y, Z})
    assert chains[Z].reads and set(chains[Z].reads) == {X, Y}
    assert [r.kernel_name for r in chains[Z].ops] == ["add"]
    log.launch(_kernel("mul_", X, Y), {X, Y}, guess=True)         # no fresh block: both
    assert log.chain(X) is None and log.chain(Y) is None and log.chain(Z) is None


def test_memsets_copies_and_host_copies_feed_the_log():
    log = WriterLog()
    live = LiveBlocks(lambda: _blocks(*SPANS), log)
    drange = lambda a: (a, 1) if a >= X else None  # noqa: E731
    feed_memory_op(log, live, MemoryOp("cuMemsetD32Async", "memset", X, 0, N_, 3, 4), drange)
    feed_memory_op(log, live, MemoryOp("cuMemcpyDtoD", "copy", Y, X, N_), drange)
    feed_memory_op(log, live, MemoryOp("cuMemcpyHtoD", "htod", Z, 0x1000, N_), drange)
    feed_memory_op(log, live, MemoryOp("cuMemcpy", "copy?", W, 0x1000, 64), drange)  # host
    chains = log.chains({X, Y, Z, W})
    assert set(chains) == {X, Y} and chains[Y].reads == (X,)
    assert dict(chains[X].ops[0].detail) == {"dst": X, "size": N_, "value": 3,
                                             "element_size": 4}
    feed_memory_op(log, live, MemoryOp("cuMemcpy2D", "unsupported"), drange)
    assert log.chains({X, Y}) == {}   # it may have written anything


def test_a_range_sees_the_log_as_it_was_when_it_began():
    log = WriterLog()
    log.launch(_kernel("rand", X), {X}, guess=True)
    upto = log.seq
    log.launch(_kernel("relu_", X), {X}, guess=True)   # inside the range: not a maker
    assert [r.kernel_name for r in log.chains({X}, upto=upto)[X].ops] == ["rand"]
    assert [r.kernel_name for r in log.chains({X})[X].ops] == ["rand", "relu_"]


# ------------------------------------------------------------------ the session's choice


class Registry:
    """Holds one code object with the kernels named in ``known``."""

    def __init__(self, known):
        self.known = known

    def find(self, name, handles=()):
        assert handles == (0xC0DE,)
        if name not in self.known:
            return None
        return Found(1, (CSRC / "regen_ops.c").read_bytes(), "module handle")


class Writer:
    def __init__(self):
        self.calls = []

    def chain(self, ops, sha256, size, *, reads=(), digests=(), digest64=None, digests64=()):
        self.calls.append((ops, sha256, size, tuple(reads)))
        self.digest64s = {**getattr(self, "digest64s", {}), sha256: digest64}
        return ("regen", sha256, tuple(reads))


def test_a_region_is_stored_as_its_chain_only_when_every_link_can_be_recorded(monkeypatch):
    monkeypatch.setattr("kpair.capture.chains.detect_format", lambda image: "elf-so")
    log = WriterLog()
    for k, name in ((X, "rand"), (Y, "full"), (W, "mystery")):
        log.launch(_kernel(name, k), {k}, guess=True)
    log.launch(_kernel("add", X, Y, Z), {X, Y, Z}, guess=True)
    log.launch(_kernel("scale", W), {W}, guess=True)   # in place on W
    pre = {k: bytes([i]) * N_ for i, k in enumerate((X, Y, Z, W))}
    cands = [PendingRegion(f"r{i}", k, pre[k]) for i, k in enumerate((X, Y, Z, W))]
    writer = Writer()
    got = chain_regions(log, log.seq, cands, _blocks(*SPANS), Registry({"rand", "full", "add"}),
                        writer.chain)
    # W's code object ("mystery") is unknown: W stays bytes; Z reads only X and Y.
    assert set(got) == {"r0", "r1", "r2"}
    assert got["r2"] == ("regen", hashlib.sha256(pre[Z]).hexdigest(), ("r0", "r1"))
    # Beside each sha256, the digest64 a replay checks on the device, of the same bytes.
    assert writer.digest64s[hashlib.sha256(pre[Z]).hexdigest()] == f"{digest64(pre[Z]):016x}"
    (ops, _, size, _), = [c for c in writer.calls if c[3]]
    assert size == N_ and ops[0].kernel_name == "add" and ops[0].launch.grid == (4, 1, 1)
    assert [p.kind for p in ops[0].params] == ["pointer", "pointer", "pointer", "bytes"]
    # A chain reading a region left as bytes goes too: without "full" neither Y nor Z.
    got = chain_regions(log, log.seq, cands, _blocks(*SPANS), Registry({"rand", "add"}),
                        Writer().chain)
    assert set(got) == {"r0"}
    # A region that is not exactly one block (a merged extent) is never a chain.
    got = chain_regions(log, log.seq, [PendingRegion("big", X, bytes(2 * N_))],
                        _blocks(*SPANS), Registry({"rand"}), Writer().chain)
    assert got == {}
    assert chain_regions(None, 0, cands, _blocks(*SPANS), Registry(set()), Writer().chain) == {}


# ------------------------------------------------------------------ confirmation


@pytest.fixture(scope="module")
def made(tmp_path_factory) -> dict:
    d = tmp_path_factory.mktemp("chains")
    lib = compile_shared(CSRC / "regen_ops.c", d / "ops.so", flags=("-O2", "-g"))
    snap, arrays = _record(lib, d / "snap")
    return {"snap": snap.root, "arrays": arrays}


def _capture_dir(made: dict, tmp_path: Path) -> Path:
    """A capture directory as `kpair capture` leaves it before confirmation: the snapshot,
    the captured bytes of each chained region in the pool, capture.json naming them."""
    out = tmp_path / "cap"
    shutil.copytree(made["snap"], out / "snap")
    (out / "blobs").mkdir()
    pending = {}
    for name in ("a", "b", "c"):
        data = made["arrays"][name].tobytes()
        digest = hashlib.sha256(data).hexdigest()
        (out / "blobs" / f"{digest}.raw").write_bytes(data)
        pending[name] = digest
    (out / "capture.json").write_text(json.dumps({
        "ranges": [{"name": "forward", "snapshot": "snap", "regenerated": 3,
                    "stored_bytes": 100, "chain_pre": pending}],
        "totals": {"stored_bytes": 100}}))
    return out


def test_confirmed_chains_stay_and_their_bytes_leave_the_pool(made, tmp_path):
    out = _capture_dir(made, tmp_path)
    tally = verify_capture(out, lambda: open_device("host"))
    assert tally == {"verified": 3, "stored_as_bytes": 0, "devices": 1}
    doc = json.loads((out / "capture.json").read_text())
    (rec,) = doc["ranges"]
    assert rec["regenerated"] == 3 and "chain_pre" not in rec and rec["stored_bytes"] == 100
    assert list((out / "blobs").iterdir()) == []   # nothing links them: dropped
    m = Snapshot.open(out / "snap").manifest
    assert all(isinstance(r.regen, Regen) for r in m.regions if r.name in "abc")


@pytest.mark.parametrize("budget, devices", [(8 << 30, 1), (1, 2)])
def test_one_device_confirms_snapshots_in_turn_up_to_a_budget(made, tmp_path, budget,
                                                               devices):
    out = _capture_dir(made, tmp_path)
    shutil.copytree(out / "snap", out / "snap2")
    doc = json.loads((out / "capture.json").read_text())
    doc["ranges"].append({**doc["ranges"][0], "name": "again", "snapshot": "snap2"})
    (out / "capture.json").write_text(json.dumps(doc))
    opened = []

    def factory():
        opened.append(1)
        return open_device("host")

    tally = verify_capture(out, factory, budget=budget)
    assert tally == {"verified": 6, "stored_as_bytes": 0, "devices": devices}
    assert len(opened) == devices


def test_a_chain_that_does_not_make_its_bytes_is_stored_as_bytes(made, tmp_path):
    out = _capture_dir(made, tmp_path)
    _tamper_seed(out / "snap")   # a's chain now makes other bytes; c's reads a
    tally = verify_capture(out, lambda: open_device("host"))
    # a mismatch closes the device (its state unknown): the second attempt opens another
    assert tally == {"verified": 1, "stored_as_bytes": 2, "devices": 2}
    snap = Snapshot.open(out / "snap")
    snap.verify()
    kinds = {r.name: r.regen is not None for r in snap.manifest.regions}
    assert kinds == {"a": False, "b": True, "c": False, "out1": False, "out2": False}
    (rec,) = json.loads((out / "capture.json").read_text())["ranges"]
    assert rec["regenerated"] == 1 and rec["stored_bytes"] == 100 + 2 * made["arrays"]["a"].nbytes
    # a's and c's bytes are linked into the snapshot; b's, confirmed, left the pool
    pooled = {p.name for p in (out / "blobs").iterdir()}
    assert len(pooled) == 2
    with open_device("host") as dev:
        replay = Replay(dev, snap)
        assert replay.pre["a"] == _splitmix(SEED, made["arrays"]["a"].size).tobytes()
        assert replay.pre["c"] == made["arrays"]["c"].tobytes()
    with open_device("host") as dev:
        rep = reproduce(dev, Snapshot.open(out / "snap"), 2)
    assert rep.status == "byte-exact"


# ------------------------------------------------------------------ a range session


def _traced(w, log, live, name: str, pointers: list[int], data: bytes) -> None:
    """A launch before the range as the tracer sees it: the session, then the writer log;
    ``data`` is what the kernel writes into its first pointer's block."""
    import ctypes

    from kpair.capture.launches import LaunchInfo
    from kpair.capture.session import KernelInfo

    values = [ctypes.c_uint64(p) for p in pointers] + [ctypes.c_uint64(1234)]
    array = (ctypes.c_void_p * len(values))(*[ctypes.addressof(v) for v in values])
    w.keep.append((values, array))
    info = LaunchInfo("cuLaunchKernel", 0x99, (2, 1, 1), (64, 1, 1), 0, 0x51,
                      ctypes.addressof(array), 0)
    kernel = KernelInfo(0x99, name, name, [(8 * i, 8) for i in range(len(values))], "test")
    w.correlation += 1
    w.session.launch_enter(info, kernel, w.correlation)
    log.feed(info, kernel, live, guess=True)
    w.session.launch_exit(w.correlation, 0)
    w.driver.poke(pointers[0], data)


@pytest.mark.parametrize("store_bytes", [False, True])
def test_a_range_stores_inputs_made_before_it_as_chains(tmp_path, store_bytes):
    from kpair.capture.summary import read_summary
    from test_range_capture import SIZE, W, World, X, Y, _forward

    log = WriterLog()
    w = World(tmp_path, writers=log, store_bytes=store_bytes)
    live = LiveBlocks(w.blocks, log, w.driver.address_range)
    _traced(w, log, live, "rand", [X], b"\x5a" * SIZE)
    _traced(w, log, live, "fill", [W], b"\x01" * SIZE)
    _forward(w, outputs=[(Y, SIZE)])   # reads x and w; y declared
    w.session.close(0)
    summary = read_summary(w.out)       # the new fields are valid capture.json
    (r,) = json.loads((w.out / "capture.json").read_text())["ranges"]
    snap = Snapshot.open(w.out / "fwd")
    m = snap.manifest
    regen = {r.address: r.regen for r in m.regions}
    if store_bytes:
        assert r["regenerated"] == 0 and "chain_pre" not in r
        assert all(g is None for g in regen.values())
        return
    assert r["regenerated"] == 2 and summary.ranges[0].regenerated == 2
    assert [op.label for op in regen[X].ops] == ["rand"] and regen[X].reads == ()
    assert [op.label for op in regen[W].ops] == ["fill"]
    assert regen[Y] is None                 # made by nothing the log saw: bytes
    assert regen[X].sha256 == hashlib.sha256(b"\x5a" * SIZE).hexdigest()
    x = m.region(next(r.name for r in m.regions if r.address == X))
    assert x.post_blob is None and x.role == "in"   # unchanged: no post blob either
    # the captured bytes wait in the pool, named in capture.json, until verified
    assert set(r["chain_pre"].values()) == {hashlib.sha256(b"\x5a" * SIZE).hexdigest(),
                                            hashlib.sha256(b"\x01" * SIZE).hexdigest()}
    assert all(list((w.out / "blobs").glob(f"{d}.*")) for d in r["chain_pre"].values())
    assert r["stored_bytes"] < 4 * SIZE


def test_a_dispatch_stores_a_region_an_earlier_launch_made_as_its_chain(tmp_path):
    from kpair.capture.filters import Filter
    from test_capture_cpu import MIB, SEG, HostArgs, add_launch, make_session

    log = WriterLog()
    session, driver = make_session(tmp_path, filter=Filter(None, 2, 1), writers=log)
    live = LiveBlocks(session.blocks, log, driver.address_range)
    # launch 1 (not captured): fills a's block alone; launch 2 (captured) reads a and b
    setup = HostArgs(("c_uint64", SEG), ("c_uint64", SEG), ("c_uint64", SEG), ("c_int32", 7))
    args = HostArgs(("c_uint64", SEG), ("c_uint64", SEG + 4096 + 64),
                    ("c_uint64", SEG + 64 * MIB), ("c_int32", 1024))
    for corr, a in ((1, setup), (2, args)):
        launch, kernel = add_launch(a)
        session.launch_enter(launch, kernel, corr)
        log.feed(launch, kernel, live, guess=True)     # as the tracer does, after the session
        if corr == 1:
            driver.write(SEG, b"\x07" * 4096)
        else:
            driver.write(SEG + 64 * MIB, b"\xAA" * 1024)
        session.launch_exit(corr, 0)
    summary = session.close(exit_status=0)
    (d,) = [x for x in summary["dispatches"] if x["status"] == "captured"]
    assert d["regenerated"] == 1 and list(d["chain_pre"]) == ["arg0"]
    snap = Snapshot.open(tmp_path / "cap" / d["snapshot"])
    m = snap.manifest
    a0 = m.regions[0]
    assert a0.regen is not None and a0.pre_blob is None and a0.post_blob is None
    assert a0.regen.sha256 == hashlib.sha256(b"\x07" * 4096).hexdigest()
    (op,) = a0.regen.ops
    assert op.code.kernel_name == "kp_add" and op.launch.grid == (4, 1, 1)
    assert [p.kind for p in op.kernarg.params] == ["pointer"] * 3 + ["bytes"]
    assert snap.read_blob(op.kernarg.blob)[:8] == SEG.to_bytes(8, "little")
    assert [r.regen is None for r in m.regions] == [False, True, True]   # host data: bytes
    assert snap.post(2) == b"\xAA" * 1024


def test_a_block_written_too_often_is_no_longer_followed():
    from kpair.capture.writers import MAX_WRITES

    log = WriterLog()
    log.launch(_kernel("rand", X), {X}, guess=True)
    for _ in range(MAX_WRITES):
        log.launch(_kernel("step_", X), {X}, guess=True)
    assert log.chain(X) is None and log.writers(X) == []
    log.appeared(X)
    log.launch(_kernel("rand", X), {X}, guess=True)
    assert [r.kernel_name for r in log.chain(X)] == ["rand"]


def test_the_tracer_feeds_launches_and_memsets_to_its_writer_log(tmp_path):
    """The tracer's callbacks, driven by hand: a launch filling a's block and a memset of b's
    block before the captured dispatch; both regions come out as chains, the kernel's code
    object found through its module handle."""
    import ctypes
    import threading

    from kpair.capture import cupti
    from kpair.capture.filters import Filter
    from kpair.capture.modules import ModuleRegistry
    from kpair.capture.regions import allocator_blocks
    from kpair.capture.session import CaptureSession
    from kpair.capture.tracer import Tracer
    from test_capture_cpu import CUBIN, MIB, SEG, FakeKernelDriver, HostArgs, torch_snapshot

    tracer = Tracer.__new__(Tracer)
    tracer.driver = FakeKernelDriver({SEG: 2 * MIB, SEG + 64 * MIB: 20 * MIB})
    tracer.registry, tracer.errors, tracer._kernels = ModuleRegistry(), [], {}
    tracer._tls, tracer._lock = threading.local(), threading.RLock()
    tracer.registry.add(42, CUBIN)
    tracer.registry.bind(0xC0DE, 42)
    blocks = BlockTable(allocator_blocks(torch_snapshot()))
    tracer.writers = WriterLog()
    tracer.live = LiveBlocks(lambda: blocks, tracer.writers, tracer.driver.address_range)
    tracer.session = CaptureSession(tmp_path / "cap", Filter(None, 2, 1),
                                    driver=tracer.driver, registry=tracer.registry,
                                    blocks=lambda: blocks, writers=tracer.writers)
    ok = ctypes.c_int(0)
    keep = []

    def launch(corr, *pointers):
        args = HostArgs(*[("c_uint64", p) for p in pointers], ("c_int32", 5))
        p = cupti.LaunchKernelParams(0xF00, 1, 1, 1, 32, 1, 1, 0, 0, args.address, None)
        data = cupti.CallbackData(callbackSite=cupti.API_ENTER,
                                  functionParams=ctypes.addressof(p),
                                  functionReturnValue=ctypes.addressof(ok), correlationId=corr)
        keep.append((args, p, data))
        tracer._on_callback(None, cupti.DOMAIN_DRIVER_API, 307, ctypes.addressof(data))
        return data

    def done(data):
        data.callbackSite = cupti.API_EXIT
        tracer._on_callback(None, cupti.DOMAIN_DRIVER_API, 307, ctypes.addressof(data))

    done(launch(1, SEG, SEG, SEG))                    # fills a (its block alone)
    tracer.driver.write(SEG, b"\x05" * 4096)
    memset = cupti.DataParams(SEG + 4096, 3, 8192, 0)  # cuMemsetD8Async over b's block
    data = cupti.CallbackData(callbackSite=cupti.API_ENTER,
                              functionParams=ctypes.addressof(memset))
    tracer._on_callback(None, cupti.DOMAIN_DRIVER_API, 216, ctypes.addressof(data))
    tracer.driver.write(SEG + 4096, b"\x03" * 8192)
    captured = launch(2, SEG, SEG + 4096, SEG + 64 * MIB)
    tracer.driver.write(SEG + 64 * MIB, b"\x08" * 1024)
    done(captured)
    assert tracer.errors == []
    summary = tracer.session.close()
    (d,) = [x for x in summary["dispatches"] if x["status"] == "captured"]
    assert d["regenerated"] == 2, d
    m = Snapshot.open(tmp_path / "cap" / d["snapshot"]).manifest
    a, b, c = m.regions
    assert a.regen.ops[0].code.kernel_name == "kp_add" and a.regen.ops[0].code.format == "cubin"
    assert (b.regen.ops[0].kind, b.regen.ops[0].value, b.regen.ops[0].size) == ("memset", 3,
                                                                                 8192)
    assert c.regen is None


def test_without_a_device_the_chains_stay_unconfirmed(made, tmp_path):
    from kpair.errors import BackendUnavailable
    from kpair.regen import NoDevice

    out = _capture_dir(made, tmp_path)
    before = (out / "snap" / "snapshot.json").read_text()

    def factory():
        raise BackendUnavailable("no CUDA driver here")

    with pytest.raises(NoDevice, match="no CUDA driver here"):
        verify_capture(out, factory)
    assert (out / "snap" / "snapshot.json").read_text() == before
    (rec,) = json.loads((out / "capture.json").read_text())["ranges"]
    assert len(rec["chain_pre"]) == 3 and len(list((out / "blobs").iterdir())) == 3


# ------------------------------------------------------------------ the command line


@pytest.mark.parametrize("options, verified", [((), True), (("--no-verify-chains",), False),
                                               (("--store-bytes",), False)])
def test_kpair_capture_verifies_stored_chains_unless_told_not_to(monkeypatch, tmp_path, capsys,
                                                                 options, verified):
    import kpair.cli.capture as cli
    import kpair.regen as regen
    from kpair.capture.workflow import CaptureOutcome
    from kpair.cli import main

    out = tmp_path / "o"
    out.mkdir()
    summary = {"ranges": [{"name": "r", "snapshot": "r", "chain_pre": {"x": "ab"}}]}
    (out / "capture.json").write_text(json.dumps(summary))
    seen = {}

    def capture_program(command, out_, **kw):
        seen.update(kw)
        return CaptureOutcome(out_, 0, summary)

    def verify(out_, factory):
        seen["verified"] = out_
        return {"verified": 1, "stored_as_bytes": 0, "devices": 1}

    monkeypatch.setattr(cli, "capture_program", capture_program)
    monkeypatch.setattr(regen, "verify_capture", verify)
    code = main(["capture", "-o", str(out), "--range", "r", *options, "--", "python", "p.py"])
    assert code == 0
    assert seen["store_bytes"] == ("--store-bytes" in options)
    assert ("verified" in seen) == verified
    err = capsys.readouterr().err
    assert ("1 regenerable region(s) verified" in err) == verified


def test_kpair_capture_without_a_device_to_verify_on_says_so_in_one_line(monkeypatch, tmp_path,
                                                                         capsys):
    import kpair.cli.capture as cli
    import kpair.regen as regen
    from kpair.capture.workflow import CaptureOutcome
    from kpair.cli import main
    from kpair.regen import NoDevice

    summary = {"dispatches": [{"snapshot": "d", "chain_pre": {"x": "ab"}}]}
    monkeypatch.setattr(cli, "capture_program",
                        lambda command, out, **kw: CaptureOutcome(out, 3, summary))

    def verify(out, factory):
        raise NoDevice("no device to regenerate the chains on: no driver")

    monkeypatch.setattr(regen, "verify_capture", verify)
    assert main(["capture", "-o", str(tmp_path / "o"), "--", "python", "p.py"]) == 3
    err = capsys.readouterr().err
    assert "could not be verified here" in err and "Traceback" not in err
