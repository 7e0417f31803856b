"""Code objects seen by capture, and which one holds a launched kernel.

CUPTI's MODULE_LOADED callback delivers each module's image (a cubin, or another format the
driver was given) with a numeric module id. ``ModuleRegistry`` keeps those images and answers
"which image holds kernel X": exactly, when the launch's function handle leads back to the
``CUmodule``/``CUlibrary`` whose load was watched; otherwise by the kernel's symbol name in
the images' ELF symbol tables (built lazily, once per image, on the first question).
"""

from __future__ import annotations

import struct
import threading
from dataclasses import dataclass

_SHT_SYMTAB, _STT_FUNC = 2, 2


def elf_function_names(image: bytes) -> set[str] | None:
    """Names of the function symbols of a 64-bit little-endian ELF image; None if not ELF."""
    if len(image) < 64 or image[:4] != b"\x7fELF" or image[4] != 2 or image[5] != 1:
        return None
    shoff, = struct.unpack_from("<Q", image, 0x28)
    shentsize, shnum = struct.unpack_from("<HH", image, 0x3A)
    if shentsize < 64 or shoff + shnum * shentsize > len(image):
        return None
    sections = [struct.unpack_from("<IIQQQQIIQQ", image, shoff + i * shentsize)
                for i in range(shnum)]
    names: set[str] = set()
    for _, sh_type, _, _, offset, size, link, _, _, entsize in sections:
        if sh_type != _SHT_SYMTAB or link >= shnum or entsize < 24:
            continue
        str_off, str_size = sections[link][4], sections[link][5]
        strtab = image[str_off:str_off + str_size]
        for pos in range(offset, min(offset + size, len(image)) - 23, entsize):
            st_name, st_info = struct.unpack_from("<IB", image, pos)
            if st_info & 0xF != _STT_FUNC or not st_name:
                continue
            end = strtab.find(b"\0", st_name)
            if end > st_name:
                names.add(strtab[st_name:end].decode(errors="replace"))
    return names


@dataclass(frozen=True)
class Found:
    """The image holding a kernel: module id, bytes and how it was matched (for provenance)."""

    module_id: int
    image: bytes
    how: str


class ModuleRegistry:
    """Images by module id, the handles bound to them, and a lazy name index."""

    def __init__(self):
        self.images: dict[int, bytes] = {}
        self.handles: dict[int, int] = {}
        self._order: list[int] = []
        self._names: dict[str, list[int]] = {}
        self._unindexed: list[int] = []
        self._raw: list[int] = []  # images that are not ELF: searched byte-wise
        self._lock = threading.RLock()  # loads and launches come from several threads

    @property
    def total_bytes(self) -> int:
        return sum(len(v) for v in self.images.values())

    def add(self, module_id: int, image: bytes) -> None:
        with self._lock:
            if module_id in self.images:
                self._order.remove(module_id)
            self.images[module_id] = image
            self._order.append(module_id)
            self._unindexed.append(module_id)

    def bind(self, handle: int, module_id: int) -> None:
        """``handle`` (a CUmodule or CUlibrary) was created by the load that delivered it."""
        with self._lock:
            self.handles[handle] = module_id

    def _index(self) -> None:
        pending, self._unindexed = self._unindexed, []
        for mid in pending:
            names = elf_function_names(self.images[mid])
            if names is None:
                self._raw.append(mid)
                continue
            for name in names:
                self._names.setdefault(name, []).append(mid)

    def _holds(self, mid: int, name: str) -> bool:
        image = self.images.get(mid)
        if image is None:
            return False
        names = elf_function_names(image)
        if names is not None:
            return name in names
        return name.encode() + b"\0" in image

    def find(self, name: str, handles: tuple[int | None, ...] = ()) -> Found | None:
        """The image holding kernel ``name``; ``handles`` are the module/library handles the
        driver gave for the launched function, tried first (they are exact)."""
        with self._lock:
            return self._find(name, handles)

    def _find(self, name: str, handles: tuple[int | None, ...]) -> Found | None:
        for h in handles:
            mid = self.handles.get(h) if h else None
            if mid is not None and self._holds(mid, name):
                return Found(mid, self.images[mid], "module handle")
        self._index()
        candidates = [m for m in self._names.get(name, []) if m in self.images]
        candidates += [m for m in self._raw if m in self.images and
                       name.encode() + b"\0" in self.images[m]]
        if not candidates:
            return None
        # The same symbol in several images is usually one template instantiated in several
        # translation units; distinct bytes make it a guess, and provenance says so.
        latest = max(candidates, key=self._order.index)
        distinct = {self.images[m] for m in candidates}
        how = "symbol name"
        if len(distinct) > 1:
            how = (f"symbol name (ambiguous: {len(distinct)} different images hold it; "
                   "the latest loaded was taken)")
        return Found(latest, self.images[latest], how)
