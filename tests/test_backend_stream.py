"""The GPU stream device shared by the cuda and hip backends (``kpair.backends._stream``):
every role it calls is named by both vendor adapters, and the device roles of ``base``."""

from __future__ import annotations

import ast
import inspect

import pytest

from kpair.backends import _stream, base
from kpair.backends._checked import STREAM_CALLS, CheckedCalls
from kpair.backends._cuda_driver import Driver
from kpair.backends._hip_runtime import Runtime
from kpair.backends.cuda import CudaDevice
from kpair.backends.hip import HipDevice
from kpair.errors import BackendUnavailable, DriverError

#: Roles only a gated device calls (HIP has no stream memory operations: never gated).
GATE_ROLES = {"wait_value32", "write_value32"}


def _roles_called() -> set[str]:
    """The first string argument of every ``api(...)``, ``api.quiet(...)``, ``q(...)`` and
    ``self.api(...)`` call in _stream.py."""
    tree = ast.parse(inspect.getsource(_stream))
    called = set()
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call) or not node.args:
            continue
        f = node.func
        name = f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", "")
        if name in ("api", "quiet", "q") and isinstance(node.args[0], ast.Constant):
            called.add(node.args[0].value)
    return called


def test_every_role_the_stream_device_calls_is_named_by_both_adapters():
    called = _roles_called()
    assert {"sync", "alloc", "htod_async", "dtoh", "event_elapsed", "mem_map"} <= called
    assert called | {"init"} == set(STREAM_CALLS)      # no role left unused
    assert set(Driver.ROLES) == set(STREAM_CALLS)
    assert called - GATE_ROLES <= set(Runtime.ROLES)
    assert set(Driver.ROLES) - set(Runtime.ROLES) == GATE_ROLES
    assert all(n.startswith("cu") for n in Driver.ROLES.values())
    assert all(n.startswith("hip") for n in Runtime.ROLES.values())


class _Vendor:
    """A binding whose calls return (status, value) and record what was called."""

    def __init__(self, fail: str = ""):
        self.called: list[str] = []
        self.fail = fail

    def __getattr__(self, name):
        def call(*args):
            self.called.append(name)
            return (7 if name == self.fail else 0, len(args))
        return call


class _Calls(CheckedCalls):
    ROLES = {"alloc": "vendorMalloc", "init": "vendorInit"}

    def error_name(self, err):
        return f"E{err}", "explained"


def test_a_role_runs_the_vendor_call_and_errors_name_the_vendor_call():
    vendor = _Vendor(fail="vendorMalloc")
    calls = _Calls(vendor, 0)
    assert calls("vendorOther", 1, 2) == 2            # a vendor name is called as it is
    with pytest.raises(DriverError) as e:
        calls("alloc", 64)
    assert e.value.call == "vendorMalloc" and e.value.code == "E7"
    assert calls.quiet("alloc", 64) == 7 and vendor.called[-1] == "vendorMalloc"


def test_init_driver_says_what_is_missing_or_refused():
    class Broken(_Vendor):
        def vendorInit(self, flags):
            raise RuntimeError("cannot dlopen libvendor.so")

    with pytest.raises(BackendUnavailable, match="no vendor driver: cannot dlopen"):
        _stream.init_driver(_Calls(Broken(), 0), "no vendor driver")
    with pytest.raises(BackendUnavailable, match=r"vendorInit failed: E7 \(explained\); look"):
        _stream.init_driver(_Calls(_Vendor(fail="vendorInit"), 0), "none", "; look")


def test_device_is_its_four_roles_and_both_gpus_share_the_stream_device():
    assert issubclass(base.Device, (base.DeviceFacts, base.Code, base.Memory, base.Launcher))
    for role, some in ((base.DeviceFacts, "environment"), (base.Code, "load"),
                       (base.Memory, "read"), (base.Launcher, "timed_launch")):
        assert some in role.__abstractmethods__
    assert issubclass(CudaDevice, _stream.StreamDevice)
    assert issubclass(HipDevice, _stream.StreamDevice)
    # what the two used to write twice is defined once
    for method in ("read", "write", "patch", "stage", "flush_cache", "fill", "_timed",
                   "measure_bandwidth", "close", "_map_span"):
        assert method not in vars(HipDevice), method
    assert "read" not in vars(CudaDevice) and "close" not in vars(CudaDevice)
