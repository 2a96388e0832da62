"""Row gather and scatter: get_rows, set_rows."""
from __future__ import annotations

from ..context import view_tensor
from ..enums import Op
from ..tensor import Tensor, is_contiguous_rows
from ..types import Type
from ._common import new_op, require

__all__ = ["get_rows", "set_rows"]


def get_rows(ctx, a: Tensor, b: Tensor) -> Tensor:
    """Rows b (I32 [n, a.ne2, a.ne3]) of a (any type, dequantized) -> F32 [a.ne0, n, a.ne2, a.ne3]
    (I32 stays I32): result[:, i, j, k] = a[:, b[i, j, k], j, k]."""
    require(b.type == Type.I32, "get_rows", "row ids must be I32", b)
    require(a.ne[2] == b.ne[1] and a.ne[3] == b.ne[2] and b.ne[3] == 1, "get_rows",
            "ids must be [n, a.ne[2], a.ne[3]]", a, b)
    type = Type.I32 if a.type == Type.I32 else Type.F32
    return new_op(ctx, Op.GET_ROWS, type, [a.ne[0], b.ne[0], b.ne[1], b.ne[2]], [a, b])


def set_rows(ctx, a: Tensor, b: Tensor, c: Tensor) -> Tensor:
    """Write the rows of b (F32/F16 [a.ne0, n, a.ne2, a.ne3]) into a at row indices c
    (I64/I32 [n, ne2', ne3'], tiled over b's dims 2 and 3: b index j uses c index j % c.ne1),
    converting to a's type (e.g. F16 or Q8_0 KV caches). The result is a view of a."""
    require(a.ne[0] == b.ne[0], "set_rows", "a.ne[0] != b.ne[0]", a, b)
    require(a.ne[2] == b.ne[2] and a.ne[3] == b.ne[3], "set_rows", "a and b differ in dims 2, 3", a, b)
    require(b.ne[1] == c.ne[0], "set_rows", "one index per row of b", b, c)
    require(b.ne[2] % c.ne[1] == 0 and b.ne[3] % c.ne[2] == 0 and c.ne[3] == 1, "set_rows",
            "indices must broadcast over b's dims 2 and 3", b, c)
    require(b.type in (Type.F32, Type.F16), "set_rows", "b must be F32 or F16", b)
    require(c.type in (Type.I64, Type.I32), "set_rows", "indices must be I64 or I32", c)
    require(is_contiguous_rows(a) and is_contiguous_rows(b), "set_rows", "rows of a and b must be contiguous", a, b)
    t = view_tensor(ctx, a)
    t.op = Op.SET_ROWS
    t.src[0] = b
    t.src[1] = c
    t.src[2] = a  # as upstream: the destination is also a source (for schedulers and allocators)
    return t
