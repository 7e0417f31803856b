"""Placement through a GPU virtual-memory API, shared by the cuda and hip backends.

One reservation spans every captured range, 1 GiB-aligned, asked for at the captured base
(granted exactly on the H200: DESIGN.md); refused or forced (``relocate``), it is taken
anywhere and every range moves by one delta. Each span of the plan (``plan_span``) is then
backed by fresh physical memory, zeroed so guard bytes are defined. A backend supplies the
three primitives: ``_vmm_reserve(size, align, address)``, ``_vmm_free(base, size)`` and
``_map_span(address, size)``, and keeps ``granularity``, ``_reservations``, ``_span``,
``_delta``; the API's name for messages is ``_VMM_API``.
"""

from __future__ import annotations

from collections.abc import Sequence

from ..errors import DriverError, PlacementError
from ._cuda_driver import GIB, SpanPlan, plan_span
from .base import Mapping


class SpanPlacement:
    _VMM_API = "the driver"

    def _place_span(self, ranges: Sequence[tuple[int, int]], relocate: bool) -> Mapping:
        """Map ``ranges``; a refused reservation raises DriverError (the caller may fall
        back), a refused backing is a PlacementError."""
        plan = plan_span(ranges, self.granularity)
        if relocate:
            got = self._reserve(plan, 0)
            if got == plan.base:  # handed the captured address anyway: take another one
                again = self._reserve(plan, 0)
                self._release_reservation(got)
                got = again
            reason = "forced"
        else:
            try:
                got = self._reserve(plan, plan.base)
            except DriverError:
                got = self._reserve(plan, 0)
            reason = (f"{self._VMM_API} granted {hex(got)} for the requested {hex(plan.base)}"
                      if got != plan.base else None)
        delta = got - plan.base
        try:
            for lo, hi in plan.spans:
                self._map_span(lo + delta, hi - lo)
        except DriverError as e:
            raise PlacementError(f"cannot back the captured ranges with {plan.mapped_bytes} "
                                 f"bytes of device memory: {e}") from None
        self._span, self._delta = (min(r[0] for r in ranges), max(r[1] for r in ranges)), delta
        detail = {"reserved": hex(got), "reserved_bytes": plan.size, "spans": len(plan.spans),
                  "mapped_bytes": plan.mapped_bytes, "granularity": self.granularity}
        if not delta:
            return Mapping("captured", 0, detail)
        return Mapping("relocated", delta, {**detail, "reason": reason})

    def _reserve(self, plan: SpanPlan, address: int) -> int:
        got = int(self._vmm_reserve(plan.size, GIB, address))
        self._reservations.append((got, plan.size))
        if got % GIB:
            raise PlacementError(f"{self._VMM_API} reserved {hex(got)}, not aligned to the "
                                 "1 GiB that was asked for")
        return got

    def _release_reservation(self, address: int) -> None:
        for i, (base, size) in enumerate(self._reservations):
            if base == address:
                self._vmm_free(base, size)
                del self._reservations[i]
                return
