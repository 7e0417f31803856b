"""AMDGPU target IDs: ``gfx942``, ``gfx942:sramecc+:xnack-``, ``amdgcn-amd-amdhsa--gfx90a``.

A target ID is a processor plus optional feature settings. A code object built with a
feature left out ("any") runs whatever the device's setting is; one built with ``xnack+``
runs only where XNACK is on. That is the loader's rule, and ``incompatibility`` applies it
before the runtime does, so the user gets the reason instead of a bare load error.
"""

from __future__ import annotations

from dataclasses import dataclass, field

_TRIPLE = "amdgcn-amd-amdhsa--"


@dataclass(frozen=True)
class TargetId:
    processor: str
    #: feature name → True (``+``) or False (``-``); absent means "any".
    features: dict[str, bool] = field(default_factory=dict)

    @classmethod
    def parse(cls, text: str) -> TargetId:
        text = text.strip()
        if text.startswith(_TRIPLE):
            text = text[len(_TRIPLE):]
        processor, *settings = text.split(":")
        features = {}
        for s in settings:
            if s[-1:] in "+-" and len(s) > 1:
                features[s[:-1]] = s.endswith("+")
        return cls(processor, features)

    def __str__(self) -> str:
        return ":".join([self.processor, *(f"{k}{'+' if v else '-'}"
                                           for k, v in sorted(self.features.items()))])


def incompatibility(code: TargetId, device: TargetId) -> str | None:
    """Why code built for ``code`` cannot run on ``device``, or None if it can."""
    if code.processor != device.processor:
        return f"built for {code.processor}, the device is {device.processor}"
    for name, wanted in sorted(code.features.items()):
        have = device.features.get(name)
        if have is not None and have != wanted:
            return (f"built with {name}{'+' if wanted else '-'}, the device runs with "
                    f"{name}{'+' if have else '-'}")
    return None
