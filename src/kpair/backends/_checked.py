"""One checked-call wrapper for a vendor binding module (cuda-bindings' driver, hip-python's
runtime): ``calls("cuMemAlloc", size)`` returns the call's values and raises
``DriverError(call, error name, explanation)`` on failure.

Both bindings return a tuple per call, the status first and the C out-parameters after it
(hip-python sometimes a bare status). A backend subclasses ``CheckedCalls`` with its
success code, its own lookup of an error's name and text (``error_name``), and ``ROLES``:
the vendor's name for each call the shared GPU stream device makes (``_stream.StreamDevice``
calls ``api("sync", stream)``; CUDA runs ``cuStreamSynchronize``, HIP
``hipStreamSynchronize``; ``STREAM_CALLS`` lists them side by side). A vendor name is
called as it is, and errors always name the vendor's call.
"""

from __future__ import annotations

from ..errors import DriverError

#: The calls the shared GPU stream device (``_stream.StreamDevice``) makes, by role: the CUDA
#: driver's call and the HIP runtime's (None: the vendor has none; HIP timing runs ungated).
STREAM_CALLS: dict[str, tuple[str, str | None]] = {
    "init": ("cuInit", "hipInit"),
    "device_count": ("cuDeviceGetCount", "hipGetDeviceCount"),
    "sync": ("cuStreamSynchronize", "hipStreamSynchronize"),
    "sync_all": ("cuCtxSynchronize", "hipDeviceSynchronize"),
    "alloc": ("cuMemAlloc", "hipMalloc"),
    "free": ("cuMemFree", "hipFree"),
    "htod_async": ("cuMemcpyHtoDAsync", "hipMemcpyHtoDAsync"),
    "dtoh": ("cuMemcpyDtoH", "hipMemcpyDtoH"),
    "dtod_async": ("cuMemcpyDtoDAsync", "hipMemcpyDtoDAsync"),
    "memset32_async": ("cuMemsetD32Async", "hipMemsetD32Async"),
    "memset8_async": ("cuMemsetD8Async", "hipMemsetD8Async"),
    "event_record": ("cuEventRecord", "hipEventRecord"),
    "event_sync": ("cuEventSynchronize", "hipEventSynchronize"),
    "event_elapsed": ("cuEventElapsedTime", "hipEventElapsedTime"),
    "event_destroy": ("cuEventDestroy", "hipEventDestroy"),
    "stream_destroy": ("cuStreamDestroy", "hipStreamDestroy"),
    "module_unload": ("cuModuleUnload", "hipModuleUnload"),
    "address_reserve": ("cuMemAddressReserve", "hipMemAddressReserve"),
    "address_free": ("cuMemAddressFree", "hipMemAddressFree"),
    "mem_create": ("cuMemCreate", "hipMemCreate"),
    "mem_map": ("cuMemMap", "hipMemMap"),
    "mem_unmap": ("cuMemUnmap", "hipMemUnmap"),
    "mem_set_access": ("cuMemSetAccess", "hipMemSetAccess"),
    "mem_release": ("cuMemRelease", "hipMemRelease"),
    "wait_value32": ("cuStreamWaitValue32", None),     # the timing gate
    "write_value32": ("cuStreamWriteValue32", None),
}
VENDORS = ("cuda", "hip")


def stream_roles(vendor: str) -> dict[str, str]:
    """``STREAM_CALLS`` for one vendor (``cuda`` or ``hip``): role -> its call."""
    at = VENDORS.index(vendor)
    return {role: names[at] for role, names in STREAM_CALLS.items() if names[at]}


class CheckedCalls:
    """Checked access to ``module``: ``calls(name, *args)`` returns the call's values (None,
    one value, or a tuple of them) when its status is ``success``; otherwise raises
    ``error(name + context, status)``. ``name`` is a vendor call or a role of ``ROLES``."""

    #: role -> the vendor's call (``stream_roles``).
    ROLES: dict[str, str] = {}

    def __init__(self, module, success):
        self.mod = module
        self.success = success

    def __call__(self, name: str, *args: object, context: str = ""):
        name = self.ROLES.get(name, name)
        out = getattr(self.mod, name)(*args)
        if not isinstance(out, tuple):
            out = (out,)
        if out[0] != self.success:
            raise self.error(f"{name}{context}", out[0])
        return out[1] if len(out) == 2 else (out[1:] if len(out) > 2 else None)

    def quiet(self, name: str, *args: object) -> object:
        """Call without raising (cleanup after a sticky error); returns the status."""
        name = self.ROLES.get(name, name)
        try:
            out = getattr(self.mod, name)(*args)
            return out[0] if isinstance(out, tuple) else out
        except Exception as e:  # noqa: BLE001 - cleanup must never mask the original error
            return e

    @staticmethod
    def access(desc):
        """The descriptors argument of the set-access call (``mem_set_access``) for one
        descriptor: a list of them, as ``cuMemSetAccess`` takes it."""
        return [desc]

    @staticmethod
    def host(data):
        """Host bytes as the host-to-device copy (``htod_async``) takes them: any buffer, as
        it is, as ``cuMemcpyHtoDAsync`` takes them."""
        return data

    def error_name(self, err) -> tuple[str, str]:
        """(name, explanation) of status ``err``: the binding's own lookups."""
        raise NotImplementedError

    def error(self, call: str, err) -> DriverError:
        name, text = self.error_name(err)
        return DriverError(call, name, text)


__all__ = ["STREAM_CALLS", "CheckedCalls", "stream_roles"]
