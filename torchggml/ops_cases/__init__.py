"""The op case table (test-backend-ops' cases), one module per op family.

table.py holds the table and `case()`; values.py the helpers the families share. Importing a
family module adds its cases; `all_cases()` imports them all."""
from __future__ import annotations

import importlib

from .table import CASES, OpCase

FAMILIES = ("attention", "binary", "copy", "glu", "math", "matmul", "norm", "reduce", "rope",
            "rows", "shape", "unary")


def all_cases() -> list[OpCase]:
    """Every case of every family, in family order."""
    for family in FAMILIES:
        importlib.import_module(f"{__name__}.{family}")
    return CASES
