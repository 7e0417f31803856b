"""AQL kernel dispatch packets: what AMD capture reads from each dispatch (pure).

Every kernel launch on ROCm ends as a 64-byte ``hsa_kernel_dispatch_packet_t`` written to an
HSA queue (HIP, PyTorch, rocBLAS and Triton alike). ``DispatchPacket.parse`` decodes one; with
the kernel's metadata (``kpair.amd.codeobject``) it gives the snapshot's ``Launch`` (grid in
workgroups, dynamic LDS) and kernarg layout. Reading packets off a live queue (rocprofiler-sdk
dispatch tracing, or a ``HSA_TOOLS_LIB`` queue interceptor) needs ROCm and is not built:
docs/evidence/amd.md, "Capture on AMD".
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from ..errors import FormatError
from ..snapshot import Launch, Param
from .codeobject import KernelMeta

PACKET_SIZE = 64
#: header, setup, workgroup_size_x/y/z, reserved0, grid_size_x/y/z, private_segment_size,
#: group_segment_size, kernel_object, kernarg_address, reserved2, completion_signal.
_LAYOUT = struct.Struct("<HHHHHHIIIIIQQQQ")
HSA_PACKET_TYPE_KERNEL_DISPATCH = 2
#: Argument value kinds that hold a device address (the snapshot's "pointer" parameters).
POINTER_KINDS = ("global_buffer", "dynamic_shared_pointer", "image", "sampler", "pipe",
                 "queue")


@dataclass(frozen=True)
class DispatchPacket:
    """One decoded dispatch: sizes in work-items as the packet holds them, and addresses."""

    dimensions: int
    workgroup_size: tuple[int, int, int]
    grid_size: tuple[int, int, int]
    private_segment_size: int
    group_segment_size: int
    kernel_object: int
    kernarg_address: int
    completion_signal: int

    @classmethod
    def parse(cls, data: bytes) -> DispatchPacket:
        if len(data) != PACKET_SIZE:
            raise FormatError(f"an AQL packet is {PACKET_SIZE} bytes, got {len(data)}")
        (header, setup, wx, wy, wz, _, gx, gy, gz, private, group, kernel_object, kernarg,
         _, signal) = _LAYOUT.unpack(data)
        kind = header & 0xFF
        if kind != HSA_PACKET_TYPE_KERNEL_DISPATCH:
            raise FormatError(f"AQL packet type {kind} is not a kernel dispatch "
                              f"({HSA_PACKET_TYPE_KERNEL_DISPATCH})", field="header")
        dims = setup & 0x3
        if not 1 <= dims <= 3:
            raise FormatError(f"dispatch dimensions {dims} not in 1..3", field="setup")
        wg, grid = [wx, wy, wz], [gx, gy, gz]
        for i in range(dims, 3):  # unused dimensions must be 1 (the HSA spec)
            wg[i], grid[i] = wg[i] or 1, grid[i] or 1
        for name, values in (("workgroup_size", wg), ("grid_size", grid)):
            if any(v < 1 for v in values):
                raise FormatError(f"a {name} of 0 in a used dimension: {values}", field=name)
        if not kernel_object or not kernarg:
            raise FormatError("a dispatch without a kernel object or kernarg address",
                              field="kernel_object" if not kernel_object else "kernarg_address")
        return cls(dims, tuple(wg), tuple(grid), private, group, kernel_object, kernarg,
                   signal)

    def launch(self, kernel: KernelMeta) -> Launch:
        """The snapshot's launch: grid in workgroups (rounded up: AQL grids count work-items
        and may end in a partial workgroup), block = workgroup, dynamic LDS = the packet's
        group segment minus the kernel's fixed LDS."""
        dynamic = self.group_segment_size - kernel.group_segment_fixed_size
        if dynamic < 0:
            raise FormatError(f"group_segment_size {self.group_segment_size} is less than "
                              f"kernel {kernel.name!r}'s fixed LDS "
                              f"{kernel.group_segment_fixed_size}", field="group_segment_size")
        grid = tuple(-(-g // w) for g, w in zip(self.grid_size, self.workgroup_size,
                                                strict=True))
        return Launch(grid, self.workgroup_size, dynamic)


def kernarg_params(kernel: KernelMeta) -> tuple[Param, ...]:
    """The snapshot's parameter layout: the kernel's explicit arguments (hidden ones are the
    runtime's, see docs/evidence/amd.md); device addresses as "pointer", the rest as bytes."""
    return tuple(Param(a.offset, a.size, "pointer" if a.value_kind in POINTER_KINDS and
                       a.size == 8 else "bytes", a.name)
                 for a in kernel.explicit)


def packet_bytes(*, workgroup_size: tuple[int, int, int], grid_size: tuple[int, int, int],
                 kernel_object: int, kernarg_address: int, group_segment_size: int = 0,
                 private_segment_size: int = 0, dimensions: int = 3,
                 completion_signal: int = 0) -> bytes:
    """A dispatch packet as a queue holds it (the inverse of ``parse``; for tests and tools)."""
    header = HSA_PACKET_TYPE_KERNEL_DISPATCH  # barrier and fence bits are the queue's business
    return _LAYOUT.pack(header, dimensions, *workgroup_size, 0, *grid_size,
                        private_segment_size, group_segment_size, kernel_object,
                        kernarg_address, 0, completion_signal)
