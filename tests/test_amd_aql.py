"""AQL dispatch packets decoded into a snapshot's launch and kernarg layout, with the kernel
metadata of real gfx942 code objects built by clang."""

from __future__ import annotations

import pytest

from amd_kit import build, needs_llvm
from kpair.amd.aql import DispatchPacket, kernarg_params, packet_bytes
from kpair.amd.codeobject import read_code_object
from kpair.errors import FormatError


@pytest.fixture(scope="module")
def kernels(tmp_path_factory):
    d = tmp_path_factory.mktemp("aql")
    return {k.name: k for src in ("elementwise", "lds")
            for k in read_code_object(build(src, d).read_bytes()).kernels}


@needs_llvm
def test_a_packet_gives_the_launch_and_the_layout(kernels):
    k = next(k for k in kernels.values() if k.group_segment_fixed_size > 0)
    raw = packet_bytes(workgroup_size=(256, 1, 1), grid_size=(1000, 1, 1), dimensions=1,
                       kernel_object=0x7F0000001000, kernarg_address=0x7F0000200000,
                       group_segment_size=k.group_segment_fixed_size + 512)
    p = DispatchPacket.parse(raw)
    launch = p.launch(k)
    assert launch.grid == (4, 1, 1) and launch.block == (256, 1, 1)  # 1000 items: 4 groups
    assert launch.dynamic_shared_bytes == 512
    assert (p.kernel_object, p.kernarg_address) == (0x7F0000001000, 0x7F0000200000)
    params = kernarg_params(k)
    assert [(q.offset, q.size) for q in params] == k.param_layout()
    assert {q.kind for q in params} <= {"pointer", "bytes"}
    assert any(q.kind == "pointer" for q in params)
    assert all(not a.hidden for a in k.explicit) and len(params) == len(k.explicit)


@needs_llvm
@pytest.mark.parametrize(("change", "field"), [
    ({"group_segment_size": 0}, "group_segment_size"),
    ({"kernel_object": 0}, "kernel_object"),
    ({"grid_size": (0, 1, 1)}, "grid_size"),
])
def test_a_bad_packet_is_refused_naming_the_field(kernels, change, field):
    k = next(k for k in kernels.values() if k.group_segment_fixed_size > 0)
    args = {"workgroup_size": (64, 1, 1), "grid_size": (64, 1, 1),
            "kernel_object": 0x1000, "kernarg_address": 0x2000,
            "group_segment_size": k.group_segment_fixed_size, **change}
    with pytest.raises(FormatError) as e:
        DispatchPacket.parse(packet_bytes(**args)).launch(k)
    assert e.value.field == field


def test_packet_size_and_type_are_checked():
    with pytest.raises(FormatError, match="64 bytes"):
        DispatchPacket.parse(b"\0" * 63)
    barrier = bytearray(packet_bytes(workgroup_size=(1, 1, 1), grid_size=(1, 1, 1),
                                     kernel_object=1, kernarg_address=1))
    barrier[0] = 3  # HSA_PACKET_TYPE_BARRIER_AND
    with pytest.raises(FormatError, match="not a kernel dispatch"):
        DispatchPacket.parse(bytes(barrier))
