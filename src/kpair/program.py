"""Programs: a sequence of launches run, timed and judged as one kernel.

A range snapshot's ref is its captured operations in order; a launch plan's opt is the plan's
launches in order. Both become a ``Program``: a ``Kernel`` holding its steps (each a loaded
kernel, its launch geometry, its kernarg built for the placed regions, its parameter layout)
and the scratch spans it uses. ``ProgramDevice`` wraps a device so that everything above it
(``Replay``, the trust checks, the meter) launches a Program exactly as it launches one
kernel:

- ``launch``: scratch poisoned (a fresh random word each execution), then every step in
  order, each waiting for the one before (``synchronize``);
- ``timed_launch``: scratch poisoned outside the timing; on a device with
  ``timed_sequence`` (CUDA) one event pair around every step enqueued in order on its
  stream, memsets and copies included; elsewhere the sum of every step's time: a kernel
  step's own timed launch (on the host: each executor's CPU time), a memset or
  device-to-device copy (``MemsetStep``, ``CopyStep``: a range's captured ones, a plan's)
  by the wall clock from the step before it finished to its own end (the device
  synchronized on both sides). Every step counts: a candidate doing its work in a copy is
  not timed as free, and ref's range and opt's plan are timed alike;
- after either, outside the timing, the Program's ``dead`` spans zeroed: bytes of a range's
  written regions that nothing reads after it (``Manifest.dead``), ref's and opt's alike;
- ``refused_calls``, ``code_digest``, ``unload``: over every step's kernel.

The pre-state is restored once before the sequence (``Replay`` does it), never between steps.
A plain kernel goes straight through to the wrapped device.
"""

from __future__ import annotations

import random
import time
from collections.abc import Sequence
from dataclasses import dataclass

from .backends import Device, Kernel
from .snapshot import Launch, Param

_RNG = random.SystemRandom()


@dataclass(frozen=True)
class Step:
    kernel: Kernel
    launch: Launch
    kernarg: bytes
    params: tuple[Param, ...]


@dataclass(frozen=True)
class MemsetStep:
    """``size`` bytes at ``address`` set to ``value`` in ``element_size``-byte elements."""

    address: int
    size: int
    value: int
    element_size: int

    @property
    def word(self) -> int:
        """The little-endian 32-bit word whose repetition is the memset (``Device.fill``)."""
        if self.element_size == 1:
            return self.value * 0x01010101
        if self.element_size == 2:
            return self.value | self.value << 16
        return self.value


@dataclass(frozen=True)
class CopyStep:
    """``size`` bytes copied from ``src`` to ``dst`` on the device."""

    dst: int
    src: int
    size: int


def data_step(op, delta: int) -> MemsetStep | CopyStep:
    """The step of a range's memset or copy operation (``snapshot.Op``), its captured
    addresses moved by ``delta`` as the replay placed the regions."""
    if op.kind == "memset":
        return MemsetStep(op.dst + delta, op.size, op.value, op.element_size)
    if op.kind == "copy":
        return CopyStep(op.dst + delta, op.src + delta, op.size)
    raise ValueError(f"not a memset or copy operation: {op.kind}")


class Program(Kernel):
    """Steps launched as a unit; ``scratch``: (address, size) spans poisoned before each
    execution."""

    def __init__(self, name: str, steps: Sequence[Step | MemsetStep | CopyStep],
                 scratch: Sequence[tuple[int, int]], dead: Sequence[tuple[int, int]] = ()):
        if not steps:
            raise ValueError("a program has at least one step")
        self.name, self.steps, self.scratch = name, tuple(steps), tuple(scratch)
        #: (address, size) spans zeroed after every execution, outside any timing.
        self.dead = tuple(dead)

    @property
    def kernels(self) -> list[Kernel]:
        """Each loaded kernel once, in order of first use."""
        return list({id(s.kernel): s.kernel for s in self.steps
                     if isinstance(s, Step)}.values())

    def param_layout(self) -> None:
        return None   # each step was checked against its own layout when it was built


class ProgramDevice:
    """A device that also launches Programs; every other call goes to the wrapped one."""

    def __init__(self, inner):
        self._inner = inner
        #: Wall seconds spent in memset and copy steps: added to a window clock that is not
        #: the wall clock (host: executors' CPU time), so the window covers what the timer
        #: counts of them.
        self._data_s = 0.0
        clock = getattr(type(inner), "window_clock", None)
        self._wall_window = clock is None or clock is Device.window_clock

    def __getattr__(self, name: str):
        return getattr(self._inner, name)

    @property
    def inner(self):
        return self._inner

    def _poison(self, program: Program) -> None:
        for address, size in program.scratch:
            self._inner.fill(address, size, _RNG.getrandbits(32))

    def window_clock(self) -> float:
        clock = self._inner.window_clock()
        return clock if self._wall_window else clock + self._data_s

    def _clear_dead(self, program: Program) -> None:
        for address, size in program.dead:
            self._inner.fill(address, size, 0)

    def _data(self, step: MemsetStep | CopyStep) -> None:
        """A memset (``fill`` with the element repeated) or a device-to-device copy (the
        device's ``copy`` where it has one, else a read and a write)."""
        t0 = time.perf_counter()
        try:
            self._data_step(step)
        finally:
            self._data_s += time.perf_counter() - t0

    def _data_step(self, step: MemsetStep | CopyStep) -> None:
        if isinstance(step, MemsetStep):
            self._inner.fill(step.address, step.size, step.word)
            return
        copy = getattr(self._inner, "copy", None)
        if copy is not None:
            copy(step.dst, step.src, step.size)
        else:
            self._inner.write(step.dst, self._inner.read(step.src, step.size))

    def launch(self, kernel: Kernel, launch: Launch, kernarg: bytes,
               params: Sequence[Param]) -> None:
        if not isinstance(kernel, Program):
            return self._inner.launch(kernel, launch, kernarg, params)
        self._poison(kernel)
        for i, s in enumerate(kernel.steps):
            if i:
                self._inner.synchronize()
            if isinstance(s, Step):
                self._inner.launch(s.kernel, s.launch, s.kernarg, s.params)
            else:
                self._data(s)
        self._clear_dead(kernel)
        return None

    def timed_launch(self, kernel: Kernel, launch: Launch, kernarg: bytes,
                     params: Sequence[Param]) -> float:
        if not isinstance(kernel, Program):
            return self._inner.timed_launch(kernel, launch, kernarg, params)
        self._poison(kernel)
        sequence = getattr(self._inner, "timed_sequence", None)
        if sequence is not None and len(kernel.steps) > 1:   # one event pair, one stream
            t = sequence([
                ("kernel", s.kernel, s.launch, s.kernarg, s.params) if isinstance(s, Step)
                else ("memset", s.address, s.size, s.word) if isinstance(s, MemsetStep)
                else ("copy", s.dst, s.src, s.size) for s in kernel.steps])
        else:
            t = self._timed_steps(kernel)
        self._clear_dead(kernel)
        return t

    def _timed_steps(self, program: Program) -> float:
        """Each step timed on its own, the device synchronized between them: their sum."""
        total = 0.0
        for i, s in enumerate(program.steps):
            if i:
                self._inner.synchronize()
            if isinstance(s, Step):
                total += self._inner.timed_launch(s.kernel, s.launch, s.kernarg, s.params)
            else:
                total += self._timed_data(s, synced=bool(i))
        return total

    def _timed_data(self, step: MemsetStep | CopyStep, *, synced: bool) -> float:
        """A memset's or copy's wall time, the device idle before it and after it."""
        if not synced:
            self._inner.synchronize()
        t0 = time.perf_counter()
        try:
            self._data_step(step)
            self._inner.synchronize()
        finally:
            dt = time.perf_counter() - t0
            self._data_s += dt
        return dt

    def refused_calls(self, kernel: Kernel) -> dict | None:
        if not isinstance(kernel, Program):
            return self._inner.refused_calls(kernel)
        parts = [self._inner.refused_calls(k) for k in kernel.kernels]
        if any(p is None for p in parts):
            return None
        calls: dict[str, int] = {}
        for p in parts:
            for name, n in p.get("calls", {}).items():
                calls[name] = calls.get(name, 0) + n
        return {"count": sum(p.get("count", 0) for p in parts),
                "at_load": sum(p.get("at_load", 0) for p in parts), "calls": calls}

    def code_digest(self, kernel: Kernel) -> str | None:
        if not isinstance(kernel, Program):
            return self._inner.code_digest(kernel)
        parts = [self._inner.code_digest(k) for k in kernel.kernels]
        return None if any(p is None for p in parts) else "+".join(parts)

    def unload(self, kernel: Kernel) -> None:
        if not isinstance(kernel, Program):
            return self._inner.unload(kernel)
        for k in kernel.kernels:
            self._inner.unload(k)
        return None

    def __enter__(self) -> ProgramDevice:
        return self

    def __exit__(self, *exc: object) -> None:
        self._inner.close()


def host_layout(image: bytes, symbol: str) -> list[Param] | None:
    """The parameter layout of the host function ``symbol`` from its DWARF (``-g``), packed
    as the kernarg packs it (each parameter at the next multiple of its size), or None when
    the object declares none (stripped). The kind comes from the C type: a pointer, a float
    (f32/f64) or an integer of its size, unsigned where the type name says so."""
    from .elfabi import declared_params

    declared = declared_params(image, symbol, "plan")
    if declared.params is None:
        return None
    out, offset = [], 0
    for d in declared.params:
        if d.kind == "pointer":
            kind = "pointer"
        elif d.kind in ("float", "double"):
            kind = "f32" if d.kind == "float" else "f64"
        elif d.kind.startswith("int"):
            bits = int(d.kind[3:]) * 8
            unsigned = any(w in d.ctype for w in ("unsigned", "uint", "size_t")) \
                and "ssize_t" not in d.ctype
            kind = f"{'u' if unsigned else 'i'}{bits}"
        else:
            return None   # a struct by value: no layout known
        size = 8 if kind == "pointer" else int(kind[1:]) // 8
        offset = -(-offset // size) * size
        out.append(Param(offset, size, kind, d.name))
        offset += size
    return out
