"""The op case table: OpCase, a family's CaseTable (`case()` adds one), upstream's thresholds."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

# upstream's default normalized-MSE thresholds
NMSE_DEFAULT = 1e-7
NMSE_MUL_MAT = 5e-4
NMSE_SOFT_MAX = 1e-6


@dataclass
class OpCase:
    """One op test. `build(ctx)` returns (output, inputs): input tensors are the roots it created
    (views inside build are fine). `reference(*values)` gets the inputs' values as float64 torch
    tensors in torch order (4-D [ne3, ne2, ne1, ne0]; block types dequantized; integer types as
    int64) and returns the expected output, broadcastable to the output's 4-D shape.
    `init` maps an input's index to a function (tensor, generator) -> torch values for it.
    max_nmse 0 means the output must be exact."""
    op: str
    desc: str
    build: Callable
    reference: Callable | None
    max_nmse: float = NMSE_DEFAULT
    init: dict = field(default_factory=dict)

    @property
    def name(self) -> str:
        return f"{self.op}({self.desc})"


class CaseTable(list):
    """One family's cases, in the order `case` adds them."""

    def case(self, op: str, desc: str, build, reference, max_nmse: float = NMSE_DEFAULT,
             init=None) -> OpCase:
        c = OpCase(op, desc, build, reference, max_nmse, init or {})
        self.append(c)
        return c
