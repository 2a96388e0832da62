"""Matrix products: mul_mat (with ggml's broadcast), mul_mat_id (mixture of experts), out_prod."""
from __future__ import annotations

from ..enums import Op, Prec
from ..tensor import Tensor, get_op_params_i32, is_transposed, set_op_params_i32
from ..types import Type
from ._common import new_op, require

__all__ = ["mul_mat", "mul_mat_set_prec", "mul_mat_set_separate_rows", "mul_mat_separate_rows", "mul_mat_id",
           "out_prod"]

# op_params[1] of MUL_MAT and MUL_MAT_ID: b's rows are separate sequences' tokens (not ggml's)
SEPARATE_ROWS_PARAM = 1


def mul_mat(ctx, a: Tensor, b: Tensor) -> Tensor:
    """a [K, N, ne2, ne3] x b [K, M, ne2*r2, ne3*r3] -> F32 [N, M, b.ne2, b.ne3]: each row of the
    result is b_row @ a^T. a is broadcast over dims 2 and 3 by repeat-interleave (consecutive b
    matrices share one a matrix, as query heads share a KV head)."""
    require(a.ne[0] == b.ne[0], "mul_mat", "a.ne[0] != b.ne[0] (inner dimensions differ)", a, b)
    require(b.ne[2] % a.ne[2] == 0 and b.ne[3] % a.ne[3] == 0, "mul_mat",
            "b.ne[2] and b.ne[3] must be multiples of a's (broadcast)", a, b)
    require(not is_transposed(a), "mul_mat", "a must not be transposed", a)
    return new_op(ctx, Op.MUL_MAT, Type.F32, [a.ne[1], b.ne[1], b.ne[2], b.ne[3]], [a, b])


def mul_mat_set_prec(a: Tensor, prec: Prec) -> None:
    """Ask for F32 accumulation on backends that would otherwise use less (a is the mul_mat node)."""
    require(a.op == Op.MUL_MAT, "mul_mat_set_prec", "a must be a mul_mat node", a)
    set_op_params_i32(a, 0, int(Prec(prec)))


def mul_mat_set_separate_rows(a: Tensor) -> None:
    """Mark a MUL_MAT or MUL_MAT_ID node whose rows of b are tokens of separate sequences (a
    batched decode step, one token a sequence): a backend may then multiply each row as it would
    multiply that row alone, so each sequence's result equals its own decode step, where a
    micro-batch of one sequence's tokens (a prompt) may take another product."""
    require(a.op in (Op.MUL_MAT, Op.MUL_MAT_ID), "mul_mat_set_separate_rows", "a must be a mul_mat or mul_mat_id node",
            a)
    set_op_params_i32(a, SEPARATE_ROWS_PARAM, 1)


def mul_mat_separate_rows(a: Tensor) -> bool:
    """Whether mul_mat_set_separate_rows marked the node."""
    return a.op in (Op.MUL_MAT, Op.MUL_MAT_ID) and get_op_params_i32(a, SEPARATE_ROWS_PARAM) == 1


def mul_mat_id(ctx, as_: Tensor, b: Tensor, ids: Tensor) -> Tensor:
    """Per token, products with the experts `ids` selects.
    as_ [K, N, n_expert], b [K, n_used or 1, n_tokens], ids I32 [n_used, n_tokens]
    -> F32 [N, n_used, n_tokens]."""
    require(not is_transposed(as_), "mul_mat_id", "experts must not be transposed", as_)
    require(ids.type == Type.I32, "mul_mat_id", "ids must be I32", ids)
    require(as_.ne[3] == 1 and b.ne[3] == 1, "mul_mat_id", "as and b must be 3-D", as_, b)
    require(ids.ne[2] == 1 and ids.ne[3] == 1, "mul_mat_id", "ids must be 2-D", ids)
    require(ids.ne[1] == b.ne[2], "mul_mat_id", "ids.ne[1] must equal b.ne[2] (tokens)", ids, b)
    require(as_.ne[0] == b.ne[0], "mul_mat_id", "as.ne[0] != b.ne[0]", as_, b)
    require(ids.ne[0] % b.ne[1] == 0, "mul_mat_id", "ids.ne[0] must be a multiple of b.ne[1]", ids, b)
    return new_op(ctx, Op.MUL_MAT_ID, Type.F32, [as_.ne[1], ids.ne[0], b.ne[2], 1], [as_, b, ids])


def out_prod(ctx, a: Tensor, b: Tensor) -> Tensor:
    """a [M, K] (x) b [N, K] -> F32 [M, N, b.ne2, b.ne3]: sum over k of a[:, k] outer b[:, k];
    a is broadcast over dims 2 and 3 by repeat-interleave, as in mul_mat."""
    require(a.ne[1] == b.ne[1], "out_prod", "a.ne[1] != b.ne[1]", a, b)
    require(not is_transposed(a), "out_prod", "a must not be transposed", a)
    require(b.ne[2] % a.ne[2] == 0 and b.ne[3] % a.ne[3] == 0, "out_prod", "broadcast mismatch", a, b)
    return new_op(ctx, Op.OUT_PROD, Type.F32, [a.ne[0], b.ne[0], b.ne[2], b.ne[3]], [a, b])
