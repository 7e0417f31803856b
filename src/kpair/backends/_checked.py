"""One checked-call wrapper for a vendor binding module (cuda-bindings' driver, hip-python's
runtime): ``calls("cuMemAlloc", size)`` returns the call's values and raises
``DriverError(call, error name, explanation)`` on failure.

Both bindings return a tuple per call, the status first and the C out-parameters after it
(hip-python sometimes a bare status). A backend subclasses ``CheckedCalls`` with its
success code and its own lookup of an error's name and text (``error_name``).
"""

from __future__ import annotations

from ..errors import DriverError


class CheckedCalls:
    """Checked access to ``module``: ``calls(name, *args)`` returns the call's values (None,
    one value, or a tuple of them) when its status is ``success``; otherwise raises
    ``error(name + context, status)``."""

    def __init__(self, module, success):
        self.mod = module
        self.success = success

    def __call__(self, name: str, *args: object, context: str = ""):
        out = getattr(self.mod, name)(*args)
        if not isinstance(out, tuple):
            out = (out,)
        if out[0] != self.success:
            raise self.error(f"{name}{context}", out[0])
        return out[1] if len(out) == 2 else (out[1:] if len(out) > 2 else None)

    def quiet(self, name: str, *args: object) -> object:
        """Call without raising (cleanup after a sticky error); returns the status."""
        try:
            out = getattr(self.mod, name)(*args)
            return out[0] if isinstance(out, tuple) else out
        except Exception as e:  # noqa: BLE001 - cleanup must never mask the original error
            return e

    def error_name(self, err) -> tuple[str, str]:
        """(name, explanation) of status ``err``: the binding's own lookups."""
        raise NotImplementedError

    def error(self, call: str, err) -> DriverError:
        name, text = self.error_name(err)
        return DriverError(call, name, text)


__all__ = ["CheckedCalls"]
