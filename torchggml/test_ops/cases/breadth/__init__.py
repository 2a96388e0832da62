"""test-backend-ops at upstream's breadth: case generators reproducing the op / type / shape /
parameter families of upstream's tests/test-backend-ops.cpp (make_test_cases_eval) for the ops
torchggml has, plus the fusion graphs upstream tests.

The families are generated on demand (`breadth_cases()`); `torchggml test-ops --full` and
TORCHGGML_TEST_OPS_FULL=1 run them all, the default run a representative sample
(`sample_cases`). A family of ops another module adds slots in: its generator checks the
builder exists (`common.has`) and adds nothing otherwise."""
from __future__ import annotations

import functools

from ..table import OpCase

FAMILY_MODULES = ("elementwise", "rows", "copy", "matmul", "softmax_rope", "attention", "reduce", "training",
                  "vision", "misc", "fusion")


@functools.lru_cache(maxsize=1)
def breadth_cases() -> tuple[OpCase, ...]:
    """Every generated case, family by family."""
    import importlib
    out = []
    for name in FAMILY_MODULES:
        out.extend(importlib.import_module(f"{__name__}.{name}").cases())
    return tuple(out)


def sample_cases(every: int = 60, max_values: int = 1 << 17) -> list[OpCase]:
    """A representative sample for CI: per op, among its cases whose tensors hold at most
    `max_values` values (checked on the built graph), the first and every `every`-th after it."""
    picked, seen = [], {}
    for c in breadth_cases():
        if _size(c) > max_values:
            continue
        i = seen.get(c.op, 0)
        seen[c.op] = i + 1
        if i % every == 0:
            picked.append(c)
    return picked


def _size(c: OpCase) -> int:
    """Values in the case's inputs and output."""
    from ....context import init, free
    ctx = init(no_alloc=True)
    try:
        out, inputs = c.build(ctx)
        return sum(t.ne[0] * t.ne[1] * t.ne[2] * t.ne[3] for t in (*inputs, out))
    finally:
        free(ctx)
