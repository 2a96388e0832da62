"""Element-wise ops: binary with broadcast, scale, clamp, math, unary and GLU families."""
from __future__ import annotations

from ..enums import Op, UnaryOp, GluOp
from ..tensor import Tensor, can_repeat, are_same_shape, is_contiguous_rows
from ..types import Type
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
    """a + b stored as `type`."""
    require(can_repeat(b, a), "add_cast", "b must broadcast to a", a, b)
    return new_op(ctx, Op.ADD, type, a.ne, [a, b])


def add1(ctx, a, b):
    """a + the scalar b."""
    require(b.ne == [1, 1, 1, 1], "add1", "b must be a scalar", a, b)
    return same_as(ctx, Op.ADD1, a, [a, b])


def add_id(ctx, a: Tensor, b: Tensor, ids: Tensor) -> Tensor:
    """a[:, i, j] + b[:, ids[i, j]] (per-expert biases in mixture-of-experts graphs)."""
    require(a.ne[0] == b.ne[0], "add_id", "a.ne[0] != b.ne[0]", a, b)
    require(a.ne[1] == ids.ne[0] and a.ne[2] == ids.ne[1], "add_id", "ids must be [a.ne[1], a.ne[2]]", a, ids)
    require(ids.type == Type.I32, "add_id", "ids must be I32", ids)
    return same_as(ctx, Op.ADD_ID, a, [a, b, ids])


# ---------------------------------------------------------------- scale, clamp, math

def scale(ctx, a, s: float):
    return same_as(ctx, Op.SCALE, a, [a], [float(s), 0.0])


def scale_inplace(ctx, a, s: float):
    return same_as(ctx, Op.SCALE, a, [a], [float(s), 0.0], inplace=True)


def scale_bias(ctx, a, s: float, b: float):
    """a * s + b."""
    return same_as(ctx, Op.SCALE, a, [a], [float(s), float(b)])


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

def unary(ctx, a: Tensor, op: UnaryOp) -> Tensor:
    require(is_contiguous_rows(a), "unary", "rows must be contiguous", a)
    return same_as(ctx, Op.UNARY, a, [a], [int(UnaryOp(op))])


def unary_inplace(ctx, a: Tensor, op: UnaryOp) -> Tensor:
    return same_as(ctx, Op.UNARY, a, [a], [int(UnaryOp(op))], inplace=True)


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


# ---------------------------------------------------------------- GLU: fused (one tensor, halves) and split

def glu(ctx, a: Tensor, op: GluOp, swapped: bool = False) -> Tensor:
    """Fused GLU: a's rows hold [x | gate] halves (swapped: [gate | x]); result ne0 = a.ne0 / 2."""
    require(a.ne[0] % 2 == 0, "glu", "a.ne[0] must be even for a fused GLU", a)
    ne = [a.ne[0] // 2, a.ne[1], a.ne[2], a.ne[3]]
    return new_op(ctx, Op.GLU, a.type, ne, [a], [int(GluOp(op)), int(swapped)])


def glu_split(ctx, a: Tensor, b: Tensor, op: GluOp) -> Tensor:
    """Split GLU: act(a) * b (a is the activated half, b the gate)."""
    require(are_same_shape(a, b), "glu_split", "a and b must have the same shape", a, b)
    require(a.type == b.type, "glu_split", "a and b must have the same type", a, b)
    return new_op(ctx, Op.GLU, a.type, a.ne, [a, b], [int(GluOp(op)), 0])


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


def swiglu_oai(ctx, a: Tensor, b: Tensor, alpha: float, limit: float) -> Tensor:
    """gpt-oss's clamped SwiGLU: x = min(a, limit); g = clamp(b, -limit, limit);
    out = x * sigmoid(alpha * x) * (g + 1)."""
    t = glu_split(ctx, a, b, GluOp.SWIGLU_OAI)
    from ..tensor import set_op_params_f32
    set_op_params_f32(t, 2, alpha)
    set_op_params_f32(t, 3, limit)
    return t
