"""What the hip backend hands the HIP runtime: checked calls and the kernarg buffer.

``Runtime`` wraps hip-python's ``hip`` module (imported lazily, by ``load_hip``) so every
call is checked: a failure becomes ``DriverError(call, hipErrorName, explanation)``.
hip-python returns a tuple per call with the ``hipError_t`` first and drops C out-parameters
into the rest of the tuple, as cuda-bindings does.

``KernargBuffer`` is the ``extra`` array of ``hipModuleLaunchKernel``:
``[HIP_LAUNCH_PARAM_BUFFER_POINTER (1), buffer, HIP_LAUNCH_PARAM_BUFFER_SIZE (2), &size,
HIP_LAUNCH_PARAM_END (3)]`` (HIP ends the list with 3 where CUDA uses 0), passed as an int
address, which hip-python accepts for a pointer argument.
"""

from __future__ import annotations

import ctypes

from ..errors import BackendUnavailable
from ._checked import CheckedCalls, stream_roles

INSTALL_HINT = "pip install 'kpair[hip]'"
BUFFER_POINTER, BUFFER_SIZE, END = 1, 2, 3


def load_hip():
    """Import hip-python's ``hip`` module; BackendUnavailable with the install hint if absent."""
    try:
        from hip import hip
    except ImportError as e:
        raise BackendUnavailable(
            f"the hip backend needs AMD's hip-python, which cannot be imported ({e}): "
            f"{INSTALL_HINT} (its version must match the ROCm install's first three "
            "numbers, e.g. hip-python~=6.2.0 for ROCm 6.2)") from None
    return hip


def _text(value: object) -> str:
    """hip-python hands C strings back as bytes, sometimes inside a 1-tuple."""
    if isinstance(value, tuple):
        value = value[-1] if value else ""
    if isinstance(value, (bytes, bytearray)):
        return value.split(b"\0", 1)[0].decode(errors="replace")
    return "" if value is None else str(value)


class Runtime(CheckedCalls):
    """Checked access: ``rt("hipMalloc", size)`` returns the call's values."""

    ROLES = stream_roles("hip")

    def __init__(self, module):
        super().__init__(module, module.hipError_t.hipSuccess)

    @staticmethod
    def access(desc):
        """``hipMemSetAccess``'s descriptors argument: the one descriptor."""
        return desc

    @staticmethod
    def host(data):
        """Host bytes as ``hipMemcpyHtoDAsync`` takes them: a ``bytes`` object."""
        return bytes(data)

    def error_name(self, err) -> tuple[str, str]:
        name = getattr(err, "name", None) or f"hipError_t {int(err)}"
        try:
            name = _text(self.mod.hipGetErrorName(err)) or name
            text = _text(self.mod.hipGetErrorString(err))
        except Exception:  # noqa: BLE001 - an unknown code still gets reported
            text = ""
        return name, text


class KernargBuffer:
    """The captured kernarg bytes in host memory and the ``extra`` array pointing at them.

    ``address`` is what ``hipModuleLaunchKernel`` takes as ``extra``; the runtime copies
    ``size`` bytes from the buffer into the dispatch's kernarg segment. Keep the object
    alive until the launch call returns.
    """

    def __init__(self, kernarg: bytes):
        self.size = len(kernarg)
        self.blob = ctypes.create_string_buffer(bytes(kernarg), max(self.size, 1))
        self._size = ctypes.c_size_t(self.size)
        self._extra = (ctypes.c_void_p * 5)(BUFFER_POINTER, ctypes.addressof(self.blob),
                                            BUFFER_SIZE, ctypes.addressof(self._size), END)
        self.address = ctypes.addressof(self._extra)
