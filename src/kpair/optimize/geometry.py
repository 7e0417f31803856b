"""Launch geometry a kernel declares it can take: ``// kpair:`` lines in its source.

A CUDA kernel whose launch shape may change says so next to its code, for example::

    // kpair: kernel=kp_sigmoid block=128,256,512 grid=ceil(n/bx)
    // kpair: kernel=kp_tile block=32x8,16x16 grid=(ceil(cols/bx), ceil(rows/by))

``block`` lists the shapes to try (``X`` or ``XxY`` or ``XxYxZ``); ``grid`` is an arithmetic
expression (the rest of the line) over the block's ``bx, by, bz`` (``block`` = ``bx``) and
the kernel's scalar parameters by their snapshot names, with ``ceil``, ``floor``, ``cdiv``,
``min`` and ``max``; ``/`` divides exactly. Nothing is guessed: a kernel without such a line
keeps its captured geometry, and a declaration whose grid does not reproduce the captured
grid at the captured block is refused for that dispatch (it does not describe it).
"""

from __future__ import annotations

import ast
import math
import re
import struct
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path

from ..errors import UsageError
from ..snapshot import SCALAR_FORMATS

_LINE = re.compile(r"//\s*kpair:\s*(.*)$")
_FUNCS = {"ceil": math.ceil, "floor": math.floor, "min": min, "max": max,
          "cdiv": lambda a, b: -(-Fraction(a) // Fraction(b))}


@dataclass(frozen=True)
class Geometry:
    """One ``// kpair:`` declaration: the block shapes to try and the grid they need."""

    kernel: str
    blocks: tuple[tuple[int, int, int], ...]
    grid: str

    def grid_for(self, block: tuple[int, int, int], scalars: dict[str, int | float]
                 ) -> tuple[int, int, int]:
        names = {**scalars, "bx": block[0], "by": block[1], "bz": block[2], "block": block[0]}
        value = evaluate(self.grid, names)
        dims = list(value) if isinstance(value, tuple) else [value]
        if not 1 <= len(dims) <= 3:
            raise UsageError(f"grid={self.grid!r} must give 1 to 3 dimensions")
        out = []
        for d in dims:
            if Fraction(d).denominator != 1 or d < 1:
                raise UsageError(f"grid={self.grid!r} gives {d}, not a positive integer")
            out.append(int(d))
        return tuple(out + [1] * (3 - len(out)))  # type: ignore[return-value]


def _block(text: str) -> tuple[int, int, int]:
    try:
        dims = [int(x) for x in text.lower().split("x")]
    except ValueError:
        raise UsageError(f"block shape {text!r} is not X, XxY or XxYxZ") from None
    if not 1 <= len(dims) <= 3 or any(d < 1 for d in dims):
        raise UsageError(f"block shape {text!r} is not X, XxY or XxYxZ")
    return tuple(dims + [1] * (3 - len(dims)))  # type: ignore[return-value]


def parse_geometry(source: str | Path, kernel: str) -> Geometry | None:
    """The declaration for ``kernel`` in a source text or file (None when there is none)."""
    text = source.read_text() if isinstance(source, Path) else source
    for line in text.splitlines():
        m = _LINE.search(line)
        if not m:
            continue
        body = m.group(1)
        head, sep, grid = body.partition("grid=")
        fields = dict(w.split("=", 1) for w in head.split() if "=" in w)
        if fields.get("kernel", kernel) != kernel:
            continue
        if not sep or "block" not in fields:
            raise UsageError(f"'// kpair: {body}' needs block=... and grid=...")
        blocks = tuple(_block(b) for b in fields["block"].split(",") if b)
        evaluate(grid.strip(), None)  # syntax checked now, not per dispatch
        return Geometry(kernel, blocks, grid.strip())
    return None


def evaluate(expr: str, names: dict | None):
    """Arithmetic only: numbers, names, + - * / // % **, the functions above, tuples.
    With ``names`` None the expression is only checked."""
    try:
        tree = ast.parse(expr, mode="eval")
    except SyntaxError as e:
        raise UsageError(f"grid={expr!r} is not an expression: {e.msg}") from None

    def ev(node):
        if isinstance(node, ast.Expression):
            return ev(node.body)
        if isinstance(node, ast.Tuple):
            return tuple(ev(e) for e in node.elts)
        if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) \
                and not isinstance(node.value, bool):
            return Fraction(node.value)
        if isinstance(node, ast.Name):
            if names is None:
                return Fraction(1)
            if node.id not in names:
                raise UsageError(f"grid={expr!r}: unknown name {node.id!r} (known: "
                                 f"{', '.join(sorted(names))})")
            return Fraction(names[node.id])
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
            v = ev(node.operand)
            return -v if isinstance(node.op, ast.USub) else v
        if isinstance(node, ast.BinOp):
            a, b = ev(node.left), ev(node.right)
            ops = {ast.Add: lambda: a + b, ast.Sub: lambda: a - b, ast.Mult: lambda: a * b,
                   ast.Div: lambda: a / b, ast.FloorDiv: lambda: a // b,
                   ast.Mod: lambda: a % b, ast.Pow: lambda: a ** int(b)}
            if type(node.op) in ops:
                if isinstance(node.op, (ast.Div, ast.FloorDiv, ast.Mod)) and b == 0:
                    raise UsageError(f"grid={expr!r} divides by zero")
                return ops[type(node.op)]()
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) \
                and node.func.id in _FUNCS and not node.keywords:
            return Fraction(_FUNCS[node.func.id](*(ev(a) for a in node.args)))
        raise UsageError(f"grid={expr!r}: only arithmetic, names and "
                         f"{', '.join(_FUNCS)} are allowed")

    return ev(tree)


def scalar_params(manifest, kernarg: bytes) -> dict[str, int | float]:
    """The captured kernarg's scalar parameters by name (pointers and raw bytes left out)."""

    out = {}
    for p in manifest.kernarg.params:
        fmt = SCALAR_FORMATS.get(p.kind)
        if fmt is not None and p.name.isidentifier():
            out[p.name] = struct.unpack_from(fmt, kernarg, p.offset)[0]
    return out


def launch_options(geometry: Geometry, manifest, kernarg: bytes
                   ) -> tuple[list[dict | None], str | None]:
    """Launch overrides to try (None: the captured launch), or ([None], why not)."""
    scalars = scalar_params(manifest, kernarg)
    launch = manifest.launch
    captured_block = tuple(launch.block)
    try:
        again = geometry.grid_for(captured_block, scalars)  # type: ignore[arg-type]
    except UsageError as e:
        return [None], str(e)
    if again != tuple(launch.grid):
        return [None], (f"grid={geometry.grid!r} gives {list(again)} at the captured block "
                        f"{list(captured_block)}, but the dispatch was launched with grid "
                        f"{list(launch.grid)}: the declaration does not describe it")
    out: list[dict | None] = [None]
    for block in geometry.blocks:
        if block == captured_block:
            continue
        out.append({"grid": list(geometry.grid_for(block, scalars)), "block": list(block)})
    return out, None
