"""The op case table (test-backend-ops' cases), one module per op family.

table.py holds OpCase and CaseTable; values.py the helpers the families share. Each family
module fills its own CASES; `all_cases()` lists every family's, in FAMILIES order."""
from __future__ import annotations

from . import attention, binary, copy, glu, math, matmul, norm, reduce, rope, rows, shape, unary
from . import conv, deepseek, image, regions
from . import recurrent
from .table import OpCase

FAMILIES = (attention, binary, copy, glu, math, matmul, norm, reduce, rope, rows, shape, unary)
FAMILIES += (conv, deepseek, image, regions)
FAMILIES += (recurrent,)


def all_cases() -> list[OpCase]:
    """Every case of every family."""
    return [c for family in FAMILIES for c in family.CASES]
