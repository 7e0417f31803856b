"""capture/writers.py: the per-block writer log of the CUDA tracer and its chain rule (pure,
no GPU): which blocks are regenerable, and the launches that make them."""

from __future__ import annotations

from kpair.capture.writers import Chain, LaunchRecord, WriterLog


def op(name: str, **kw) -> LaunchRecord:
    return LaunchRecord(name, code="mod0", kernarg=name.encode(), **kw)


RNG, FILL, AXPBY, SCALE = op("philox"), op("fill"), op("axpby"), op("scale")


def test_a_generator_and_a_fill_root_chains_and_an_elementwise_op_extends_them():
    log = WriterLog()
    log.launch(RNG, hits={"x"}, wrote={"x"})
    log.launch(FILL, hits={"y"}, wrote={"y"})
    log.launch(AXPBY, hits={"z", "x", "y"}, wrote={"z"})
    assert log.chain("x") == [RNG] and log.chain("y") == [FILL]
    assert log.chain("z") == [AXPBY]
    chains = log.chains({"x", "y", "z"})
    assert chains["z"] == Chain((AXPBY,), ("x", "y")) and chains["x"].reads == ()
    # Within a snapshot that lacks y, z's chain would read outside it: not regenerable.
    assert set(log.chains({"x", "z"})) == {"x"}


def test_in_place_updates_extend_the_chain_in_order():
    log = WriterLog()
    log.launch(FILL, hits={"g"})            # wrote not known: every block it hit
    log.launch(SCALE, hits={"g"}, wrote={"g"})
    assert log.chain("g") == [FILL, SCALE]
    assert log.writers("g") == [FILL, SCALE]


def test_host_data_roots_stay_bytes():
    log = WriterLog()
    log.host_write("h")                     # cudaMemcpy from the host
    log.launch(SCALE, hits={"h"}, wrote={"h"})
    log.launch(AXPBY, hits={"d", "h"}, wrote={"d"})
    assert log.chain("h") is None and log.chain("d") is None
    assert log.chain("never-written") is None


def test_a_launch_writing_two_blocks_is_no_link():
    log = WriterLog()
    log.launch(op("split"), hits={"a", "b"})   # writes both (not told otherwise)
    assert log.chain("a") is None and log.chain("b") is None


def test_an_input_changed_after_it_was_read_breaks_the_chain():
    log = WriterLog()
    log.launch(RNG, hits={"x"}, wrote={"x"})
    log.launch(AXPBY, hits={"z", "x"}, wrote={"z"})
    log.launch(SCALE, hits={"x"}, wrote={"x"})   # x is no longer what z was made from
    assert log.chain("x") == [RNG, SCALE] and log.chain("z") is None


def test_a_reallocated_block_forgets_its_writers_and_its_readers_break():
    log = WriterLog()
    log.launch(RNG, hits={"x"}, wrote={"x"})
    log.launch(AXPBY, hits={"z", "x"}, wrote={"z"})
    log.appeared("x")                            # freed and handed out again
    assert log.chain("x") is None and log.writers("x") == []
    assert log.chain("z") is None                # it read the old x
    log.launch(FILL, hits={"x"}, wrote={"x"})
    assert log.chain("x") == [FILL]


def test_memset_and_copy_operations():
    log = WriterLog()
    memset = LaunchRecord("memset", kind="memset", detail=(("size", 64), ("value", 0)))
    copy = LaunchRecord("copy", kind="copy", detail=(("size", 64),))
    log.launch(memset, hits={"m"}, wrote={"m"})
    log.launch(copy, hits={"c", "m"}, wrote={"c"})
    assert log.chains({"m", "c"})["c"] == Chain((copy,), ("m",))
    assert log.chain("c", within={"c"}) is None


def test_blocks_made_from_each_other_are_no_chain():
    log = WriterLog()
    log.launch(op("a_from_b"), hits={"a", "b"}, wrote={"a"})
    log.launch(op("b_from_a"), hits={"b", "a"}, wrote={"b"})
    # a was made from a b that b_from_a overwrote since; b is made from that a.
    assert log.chain("a") is None and log.chain("b") is None


def test_feed_reads_a_traced_launch_and_its_blocks():
    """What the tracer hands over at a launch's entry: the kernarg rebuilt from kernelParams,
    its pointer words narrowed to allocator blocks (keyed by start)."""
    import ctypes

    from kpair.capture.launches import LaunchInfo
    from kpair.capture.regions import Block, BlockTable
    from kpair.capture.session import KernelInfo

    x, y = 0x7F00_0000_1000, 0x7F00_0000_9000
    values = [ctypes.c_uint64(x + 256), ctypes.c_uint64(y), ctypes.c_int32(5)]
    params = (ctypes.c_void_p * 3)(*[ctypes.addressof(v) for v in values])
    launch = LaunchInfo("cuLaunchKernel", 0x11, (4, 1, 1), (128, 1, 1), 0, 0,
                        ctypes.addressof(params), 0)
    info = KernelInfo(0x11, "axpy", "axpy", [(0, 8), (8, 8), (16, 4)], "driver", (0xABC,))
    blocks = BlockTable([Block(x, 4096, x, 1 << 21, "torch-block"),
                         Block(y, 4096, y, 1 << 21, "torch-block")])
    log = WriterLog()
    log.launch(FILL, hits={y}, wrote={y})   # y made first: x's launch reads it
    log.feed(launch, info, blocks, wrote={x})
    (record,) = log.chain(x)
    assert record.kernel_name == "axpy" and record.code == "0xabc" and record.kernel == 0x11
    assert record.kernarg[:8] == (x + 256).to_bytes(8, "little") and len(record.kernarg) == 20
    assert record.grid == (4, 1, 1) and record.block == (128, 1, 1)
    assert log.chains({x, y})[x].reads == (y,)
    assert log.chains({x}) == {}             # a snapshot without y: x reads outside it
    # A launch whose arguments cannot be read (no layout) may have written anything.
    log.feed(launch, KernelInfo(0x12, "opaque", "opaque", None, "none"), blocks)
    assert log.chain(x) is None
