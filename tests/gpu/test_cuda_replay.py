"""Byte-exact replay of nvcc-built kernels on a real GPU, end to end through pair harnesses."""

from __future__ import annotations

import pytest

from kpair.backends import open_device
from kpair.errors import AbiMismatch, ArchitectureMismatch, SymbolNotFound
from kpair.snapshot import Snapshot

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("case", ["elementwise", "reduction", "gemm_tiled", "bigsmem",
                                  "cluster"])
def test_replay_reproduces_the_captured_post_state_byte_exact(kit, evidence, case):
    snap = kit.case(case)
    result = kit.run(kit.pair(snap), **kit.quick)
    assert result["status"] == "pass", result.get("reason") or result.get("error")
    fidelity = result["replay"]["fidelity"]
    assert fidelity["passed"] and fidelity["mode"] == "byte-exact"
    assert result["correct"] is True and result["replay"]["mode"] == "captured"
    evidence(f"exact[{case}]", {"status": result["status"], "replay": result["replay"]["mode"],
                                "regions": len(fidelity["regions"]),
                                "launch": Snapshot.open(snap).manifest.launch.to_json()})


def test_driver_layout_matches_the_recorded_layout(kit):
    snap = Snapshot.open(kit.case("gemm_tiled", n=64))
    with open_device("cuda") as dev:
        k = dev.load(snap.code_object(), "gemm_tiled", fmt="cubin")
        assert k.param_layout() == [(p.offset, p.size) for p in snap.manifest.kernarg.params]


def test_ptx_and_fatbin_opts_replay_byte_exact(kit):
    snap = kit.case("elementwise", n=1 << 16)
    for kind in ("ptx", "fatbin"):
        result = kit.run(kit.pair(snap, opt=kit.build("elementwise", kind)), **kit.quick)
        assert result["status"] == "pass", (kind, result.get("error"))


def test_wrong_arch_and_missing_symbol_are_named(kit):
    other = "sm_80" if not kit.arch.startswith("sm_8") else "sm_90"
    with open_device("cuda") as dev:
        with pytest.raises(ArchitectureMismatch, match=other):
            dev.load(kit.build("elementwise", arch=other).read_bytes(), "axpy", fmt="cubin")
        with pytest.raises(SymbolNotFound, match="axpy_typo"):
            dev.load(kit.build("elementwise").read_bytes(), "axpy_typo", fmt="cubin")


def test_opt_with_another_abi_is_refused_at_pair_time(kit):
    snap = kit.case("gemm_tiled", n=64)
    with pytest.raises(AbiMismatch, match=r"\(24, 8\)"):   # `long M` where the dispatch has ints
        kit.pair(snap, opt=kit.build("gemm_abi"), opt_kernel="gemm_other_abi")


def test_trust_check_capabilities(kit):
    with open_device("cuda") as dev:
        m = dev.map([(0, 3 << 20)], relocate=True)
        ranges = dev.mapped_ranges()
        assert ranges and ranges[0][0] == m.delta and ranges[-1][1] >= m.delta + (3 << 20)
        dev.fill(m.delta + 8, 4096, 0x11223344)
        dev.fill(m.delta + 4106, 6, 0xAABBCCDD)
        got = dev.read(m.delta, 4112 + 8)
        assert got[8:4104] == bytes.fromhex("44332211") * 1024
        assert got[4106:4112] == bytes.fromhex("ddccbbaaddcc")
        dev.synchronize()
        assert dev.measure_bandwidth(256 << 20) > 1e11   # an H200 writes ~3-4 TB/s
