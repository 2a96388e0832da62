"""Element-wise ops: binary with broadcast, scale, clamp, math, unary and GLU families."""
from __future__ import annotations

from ..enums import Op, UnaryOp, GluOp
from math import exp as _exp, log1p as _log1p

from ..tensor import (Tensor, can_repeat, can_repeat_rows, are_same_shape, is_contiguous_rows,
                      set_op_params_f32, is_padded_1d, is_contiguous_1)
from ..types import Type, is_quantized
from ._common import new_op, same_as, require




# ---------------------------------------------------------------- binary (b broadcast to a)

def _binary(ctx, op: Op, a: Tensor, b: Tensor, inplace: bool) -> Tensor:
    require(can_repeat(b, a), op.name.lower(), "b must broadcast to a (a.ne[i] % b.ne[i] == 0)", a, b)
    return same_as(ctx, op, a, [a, b], inplace=inplace)


def add(ctx, a, b):
    return _binary(ctx, Op.ADD, a, b, False)


def add_inplace(ctx, a, b):
    return _binary(ctx, Op.ADD, a, b, True)


def sub(ctx, a, b):
    return _binary(ctx, Op.SUB, a, b, False)


def sub_inplace(ctx, a, b):
    return _binary(ctx, Op.SUB, a, b, True)


def mul(ctx, a, b):
    return _binary(ctx, Op.MUL, a, b, False)


def mul_inplace(ctx, a, b):
    return _binary(ctx, Op.MUL, a, b, True)


def div(ctx, a, b):
    return _binary(ctx, Op.DIV, a, b, False)


def div_inplace(ctx, a, b):
    return _binary(ctx, Op.DIV, a, b, True)


def add_cast(ctx, a, b, type):
    """a + b stored as `type` (b broadcast over rows of equal length)."""
    require(can_repeat_rows(b, a), "add_cast", "b must broadcast to a with the same ne[0]", a, b)
    require(is_quantized(a.type) or a.type in (Type.F16, Type.BF16), "add_cast",
            "a must be F16, BF16 or a block type", a)
    return new_op(ctx, Op.ADD, type, a.ne, [a, b])


def _add1(ctx, a, b, inplace):
    require(b.ne == [1, 1, 1, 1], "add1", "b must be a scalar", a, b)
    require(is_padded_1d(a), "add1", "a must have contiguous elements and packed dims 2, 3", a)
    return same_as(ctx, Op.ADD1, a, [a, b], inplace=inplace)


def add1(ctx, a, b):
    """a + the scalar b."""
    return _add1(ctx, a, b, False)


def add1_inplace(ctx, a, b):
    return _add1(ctx, a, b, True)


def add_id(ctx, a: Tensor, b: Tensor, ids: Tensor) -> Tensor:
    """a[:, i, j] + b[:, ids[i, j]] (per-expert biases in mixture-of-experts graphs)."""
    require(a.ne[0] == b.ne[0], "add_id", "a.ne[0] != b.ne[0]", a, b)
    require(a.ne[1] == ids.ne[0] and a.ne[2] == ids.ne[1], "add_id", "ids must be [a.ne[1], a.ne[2]]", a, ids)
    require(ids.type == Type.I32, "add_id", "ids must be I32", ids)
    return same_as(ctx, Op.ADD_ID, a, [a, b, ids])


# ---------------------------------------------------------------- scale, clamp, math

def _scale(ctx, a, s: float, b: float, inplace: bool):
    require(is_padded_1d(a), "scale", "a must have contiguous elements and packed dims 2, 3", a)
    return same_as(ctx, Op.SCALE, a, [a], [float(s), float(b)], inplace=inplace)


def scale(ctx, a, s: float):
    return _scale(ctx, a, s, 0.0, False)


def scale_inplace(ctx, a, s: float):
    return _scale(ctx, a, s, 0.0, True)


def scale_bias(ctx, a, s: float, b: float):
    """a * s + b."""
    return _scale(ctx, a, s, b, False)


def scale_bias_inplace(ctx, a, s: float, b: float):
    return _scale(ctx, a, s, b, True)


def clamp(ctx, a, min: float, max: float):
    """Values clamped to [min, max]. As in ggml the result is a view of a (computed in place)."""
    return same_as(ctx, Op.CLAMP, a, [a], [float(min), float(max)], inplace=True)


def _math(op: Op):
    def build(ctx, a):
        return same_as(ctx, op, a, [a])
    def build_inplace(ctx, a):
        return same_as(ctx, op, a, [a], inplace=True)
    build.__name__ = op.name.lower()
    build.__doc__ = f"ggml_{op.name.lower()}: element-wise {op.name.lower()}."
    build_inplace.__name__ = op.name.lower() + "_inplace"
    return build, build_inplace


sqr, sqr_inplace = _math(Op.SQR)
sqrt, sqrt_inplace = _math(Op.SQRT)
log, log_inplace = _math(Op.LOG)
sin, sin_inplace = _math(Op.SIN)
cos, cos_inplace = _math(Op.COS)


def leaky_relu(ctx, a, negative_slope: float, inplace: bool = False):
    return same_as(ctx, Op.LEAKY_RELU, a, [a], [float(negative_slope)], inplace=inplace)


# ---------------------------------------------------------------- unary

def _unary_impl(ctx, a: Tensor, op: UnaryOp, inplace: bool) -> Tensor:
    op = UnaryOp(op)
    require(is_contiguous_rows(a), f"unary({op.name.lower()})", "rows must be contiguous", a)
    return same_as(ctx, Op.UNARY, a, [a], [int(op)], inplace=inplace)


def unary(ctx, a: Tensor, op: UnaryOp) -> Tensor:
    return _unary_impl(ctx, a, op, False)


def unary_inplace(ctx, a: Tensor, op: UnaryOp) -> Tensor:
    return _unary_impl(ctx, a, op, True)


def _unary(op: UnaryOp):
    def build(ctx, a):
        return unary(ctx, a, op)
    def build_inplace(ctx, a):
        return unary_inplace(ctx, a, op)
    build.__name__ = op.name.lower()
    build_inplace.__name__ = op.name.lower() + "_inplace"
    return build, build_inplace


abs, abs_inplace = _unary(UnaryOp.ABS)
sgn, sgn_inplace = _unary(UnaryOp.SGN)
neg, neg_inplace = _unary(UnaryOp.NEG)
step, step_inplace = _unary(UnaryOp.STEP)
tanh, tanh_inplace = _unary(UnaryOp.TANH)
elu, elu_inplace = _unary(UnaryOp.ELU)
relu, relu_inplace = _unary(UnaryOp.RELU)
sigmoid, sigmoid_inplace = _unary(UnaryOp.SIGMOID)
gelu, gelu_inplace = _unary(UnaryOp.GELU)
gelu_erf, gelu_erf_inplace = _unary(UnaryOp.GELU_ERF)
gelu_quick, gelu_quick_inplace = _unary(UnaryOp.GELU_QUICK)
silu, silu_inplace = _unary(UnaryOp.SILU)
hardswish, hardswish_inplace = _unary(UnaryOp.HARDSWISH)
hardsigmoid, hardsigmoid_inplace = _unary(UnaryOp.HARDSIGMOID)
exp, exp_inplace = _unary(UnaryOp.EXP)
floor, floor_inplace = _unary(UnaryOp.FLOOR)
ceil, ceil_inplace = _unary(UnaryOp.CEIL)
round, round_inplace = _unary(UnaryOp.ROUND)
trunc, trunc_inplace = _unary(UnaryOp.TRUNC)
expm1, expm1_inplace = _unary(UnaryOp.EXPM1)
softplus, softplus_inplace = _unary(UnaryOp.SOFTPLUS)


def _softplus(x: float) -> float:
    return x if x > 20.0 else _log1p(_exp(x))


def xielu(ctx, a: Tensor, alpha_n: float, alpha_p: float, beta: float, eps: float) -> Tensor:
    """xIELU: x > 0: alpha_p' x^2 + beta x; else (expm1(min(x, eps)) - x) alpha_n' + beta x,
    with alpha_p' = softplus(alpha_p) and alpha_n' = beta + softplus(alpha_n) stored in op params 1..4."""
    t = unary(ctx, a, UnaryOp.XIELU)
    for i, v in enumerate((beta + _softplus(alpha_n), _softplus(alpha_p), beta, eps), start=1):
        set_op_params_f32(t, i, v)
    return t


# ---------------------------------------------------------------- GLU: fused (one tensor, halves) and split

def _glu_impl(ctx, a: Tensor, b: Tensor | None, op: GluOp, swapped: bool) -> Tensor:
    op = GluOp(op)
    name = f"glu({op.name.lower()})"
    require(is_contiguous_1(a), name, "a needs contiguous rows and packed dims 2, 3", a)
    if b is not None:
        require(is_contiguous_1(b), name, "b needs contiguous rows and packed dims 2, 3", b)
        require(are_same_shape(a, b), name, "a and b must have the same shape", a, b)
        require(a.type == b.type, name, "a and b must have the same type", a, b)
    ne = list(a.ne) if b is not None else [a.ne[0] // 2, a.ne[1], a.ne[2], a.ne[3]]
    return new_op(ctx, Op.GLU, a.type, ne, [a, b], [int(op), int(bool(swapped))])


def glu(ctx, a: Tensor, op: GluOp, swapped: bool = False) -> Tensor:
    """Fused GLU: each row of a holds [x | gate] halves of a.ne0 // 2 (swapped: [gate | x]);
    result act(x) * gate with ne0 = a.ne0 // 2."""
    return _glu_impl(ctx, a, None, op, swapped)


def glu_split(ctx, a: Tensor, b: Tensor, op: GluOp) -> Tensor:
    """Split GLU: act(a) * b (a is the activated half, b the gate)."""
    return _glu_impl(ctx, a, b, op, False)


def _glu(op: GluOp):
    def fused(ctx, a):
        return glu(ctx, a, op, False)
    def fused_swapped(ctx, a):
        return glu(ctx, a, op, True)
    def split(ctx, a, b):
        return glu_split(ctx, a, b, op)
    return fused, fused_swapped, split


reglu, reglu_swapped, reglu_split = _glu(GluOp.REGLU)
geglu, geglu_swapped, geglu_split = _glu(GluOp.GEGLU)
swiglu, swiglu_swapped, swiglu_split = _glu(GluOp.SWIGLU)
geglu_erf, geglu_erf_swapped, geglu_erf_split = _glu(GluOp.GEGLU_ERF)
geglu_quick, geglu_quick_swapped, geglu_quick_split = _glu(GluOp.GEGLU_QUICK)


def swiglu_oai(ctx, a: Tensor, b: Tensor | None, alpha: float, limit: float) -> Tensor:
    """gpt-oss's clamped SwiGLU: x = min(a, limit); g = clamp(b, -limit, limit);
    out = x * sigmoid(alpha * x) * (g + 1). With b None, a's rows hold [x | g] halves."""
    t = _glu_impl(ctx, a, b, GluOp.SWIGLU_OAI, False)
    set_op_params_f32(t, 2, alpha)
    set_op_params_f32(t, 3, limit)
    return t


# every public op function defined here (several come from factories, e.g. the unary family)
__all__ = [name for name, fn in list(globals().items())
           if not name.startswith("_") and callable(fn) and getattr(fn, "__module__", None) == __name__]
