"""Convolutions: IM2COL (1-D, 2-D, 3-D) and its backward, COL2IM_1D, the direct CONV_2D, CONV_3D,
CONV_2D_DW, CONV_TRANSPOSE_1D/2D, and ggml's composite builders (conv_1d, conv_2d, ... through
im2col and mul_mat, exactly as ggml.c composes them).

Layouts are ggml's (ne order, innermost first): a kernel is [KW, KH, IC, OC], an image
[W, H, C, N], a 1-D kernel [K, IC, OC] and a 1-D signal [L, IC, N]."""
from __future__ import annotations

from ..enums import Op
from ..tensor import Tensor, is_contiguous, is_contiguous_channels, is_matrix
from ..types import Type
from ._common import new_op, require
from .matmul import mul_mat
from .views import cont, permute, reshape_2d, reshape_3d, reshape_4d


def _conv_output_size(ins: int, ks: int, s: int, p: int, d: int) -> int:
    """Output length of a convolution: (ins + 2p - d(ks - 1) - 1) // s + 1 (C's truncating division)."""
    return _cdiv(ins + 2 * p - d * (ks - 1) - 1, s) + 1


def _cdiv(a: int, b: int) -> int:
    """C's integer division (truncates toward zero)."""
    q = abs(a) // abs(b)
    return q if (a >= 0) == (b > 0) else -q


def _im2col_type(a: Tensor) -> Type:
    """The im2col buffer type the composite builders use: F32 for BF16 kernels, else F16."""
    return Type.F32 if a.type == Type.BF16 else Type.F16


def im2col(ctx, a: Tensor, b: Tensor, s0: int, s1: int, p0: int, p1: int, d0: int, d1: int,
           is_2D: bool, dst_type) -> Tensor:
    """b's patches as rows: 2-D [IC*KH*KW, OW, OH, N]; 1-D [IC*K, OW, N] (kernel a gives the sizes)."""
    if is_2D:
        require(a.ne[2] == b.ne[2], "im2col", "kernel a.ne[2] (IC) must equal b.ne[2]", a, b)
    else:
        require(b.ne[1] == a.ne[1], "im2col", "1-D: kernel a.ne[1] (IC) must equal b.ne[1]", a, b)
        require(b.ne[3] == 1, "im2col", "1-D: b.ne[3] must be 1", b)
    oh = _conv_output_size(b.ne[1], a.ne[1], s1, p1, d1) if is_2D else 0
    ow = _conv_output_size(b.ne[0], a.ne[0], s0, p0, d0)
    require((not is_2D or oh > 0) and ow > 0, "im2col", "b too small compared to a", a, b)
    ne = [a.ne[2] * a.ne[1] * a.ne[0], ow, oh, b.ne[3]] if is_2D else [a.ne[1] * a.ne[0], ow, b.ne[2], 1]
    return new_op(ctx, Op.IM2COL, dst_type, ne, [a, b], [s0, s1, p0, p1, d0, d1, int(bool(is_2D))])


def im2col_back(ctx, a: Tensor, b: Tensor, ne, s0: int, s1: int, p0: int, p1: int, d0: int, d1: int,
                is_2D: bool) -> Tensor:
    """The gradient of im2col's input (shape `ne`). a is the gradient of im2col's output and b the
    kernel: ggml.h's comments name them the other way round, but ggml's backward pass and its CPU
    kernel use this order."""
    ne = [int(n) for n in ne]
    require(len(ne) == 4, "im2col_back", f"ne must have 4 dims (got {ne})", a, b)
    return new_op(ctx, Op.IM2COL_BACK, Type.F32, ne, [a, b], [s0, s1, p0, p1, d0, d1, int(bool(is_2D))])


def im2col_3d(ctx, a: Tensor, b: Tensor, IC: int, s0: int, s1: int, s2: int, p0: int, p1: int, p2: int,
              d0: int, d1: int, d2: int, dst_type) -> Tensor:
    """a [KW, KH, KD, OC*IC], b [W, H, D, N*IC] -> [IC*KD*KH*KW, OW, OH, N*OD]."""
    require(IC > 0, "im2col_3d", f"IC must be positive (got {IC})", b)
    n = b.ne[3] // IC  # as ggml: channels past N*IC are not read; N = 0 gives an empty result
    od = _conv_output_size(b.ne[2], a.ne[2], s2, p2, d2)
    oh = _conv_output_size(b.ne[1], a.ne[1], s1, p1, d1)
    ow = _conv_output_size(b.ne[0], a.ne[0], s0, p0, d0)
    require(od > 0 and oh > 0 and ow > 0, "im2col_3d", "b too small compared to a", a, b)
    ne = [a.ne[0] * a.ne[1] * a.ne[2] * IC, ow, oh, od * n]
    return new_op(ctx, Op.IM2COL_3D, dst_type, ne, [a, b], [s0, s1, s2, p0, p1, p2, d0, d1, d2, int(IC)])


def col2im_1d(ctx, a: Tensor, s0: int, oc: int, p0: int) -> Tensor:
    """Scatter-add columns a [K*OC, T_in] (row oc*K + k) into a signal [T_out, OC],
    T_out = (T_in - 1)*s0 + K - 2*p0 (a transposed 1-D convolution's second half)."""
    require(is_matrix(a), "col2im_1d", "a must be a matrix", a)
    require(is_contiguous(a), "col2im_1d", "a must be contiguous", a)
    require(a.type in (Type.F32, Type.F16, Type.BF16), "col2im_1d", "a must be F32, F16 or BF16", a)
    require(s0 > 0 and oc > 0 and p0 >= 0, "col2im_1d", f"need s0 > 0, oc > 0, p0 >= 0 (got {s0}, {oc}, {p0})", a)
    k = a.ne[0] // oc
    t_out = (a.ne[1] - 1) * s0 + k - 2 * p0
    require(a.ne[0] == k * oc, "col2im_1d", f"a.ne[0] must be a multiple of oc={oc}", a)
    require(k > 0 and t_out > 0, "col2im_1d", f"empty result (K={k}, T_out={t_out})", a)
    return new_op(ctx, Op.COL2IM_1D, a.type, [t_out, oc], [a], [s0, oc, p0])


# ---------------------------------------------------------------- composites over im2col + mul_mat

def conv_1d(ctx, a: Tensor, b: Tensor, s0: int, p0: int, d0: int) -> Tensor:
    """a [K, IC, OC], b [L, IC, N] -> [OL, OC, N]."""
    cols = im2col(ctx, a, b, s0, 0, p0, 0, d0, 0, False, _im2col_type(a))        # [IC*K, OL, N]
    result = mul_mat(ctx, reshape_2d(ctx, cols, cols.ne[0], cols.ne[2] * cols.ne[1]),
                     reshape_2d(ctx, a, a.ne[0] * a.ne[1], a.ne[2]))             # [N*OL, OC]
    return reshape_3d(ctx, result, cols.ne[1], a.ne[2], cols.ne[2])


def conv_1d_ph(ctx, a: Tensor, b: Tensor, s: int, d: int) -> Tensor:
    """conv_1d with half padding (a.ne[0] // 2)."""
    return conv_1d(ctx, a, b, s, a.ne[0] // 2, d)


def conv_1d_dw(ctx, a: Tensor, b: Tensor, s0: int, p0: int, d0: int) -> Tensor:
    """Depthwise 1-D convolution: a [K, 1, C], b [L, C, N]."""
    new_b = reshape_4d(ctx, b, b.ne[0], 1, b.ne[1], b.ne[2])
    cols = im2col(ctx, a, new_b, s0, 0, p0, 0, d0, 0, False, _im2col_type(a))
    result = mul_mat(ctx, cols, a)
    return reshape_3d(ctx, result, result.ne[0], result.ne[2], 1)


def conv_1d_dw_ph(ctx, a: Tensor, b: Tensor, s0: int, d0: int) -> Tensor:
    return conv_1d_dw(ctx, a, b, s0, a.ne[0] // 2, d0)


def conv_2d(ctx, a: Tensor, b: Tensor, s0: int, s1: int, p0: int, p1: int, d0: int, d1: int) -> Tensor:
    """a [KW, KH, IC, OC], b [W, H, IC, N] -> [OW, OH, OC, N]."""
    cols = im2col(ctx, a, b, s0, s1, p0, p1, d0, d1, True, _im2col_type(a))     # [IC*KH*KW, OW, OH, N]
    result = mul_mat(ctx, reshape_2d(ctx, cols, cols.ne[0], cols.ne[3] * cols.ne[2] * cols.ne[1]),
                     reshape_2d(ctx, a, a.ne[0] * a.ne[1] * a.ne[2], a.ne[3]))  # [N*OH*OW, OC]
    result = reshape_4d(ctx, result, cols.ne[1], cols.ne[2], cols.ne[3], a.ne[3])
    return cont(ctx, permute(ctx, result, 0, 1, 3, 2))


def conv_2d_sk_p0(ctx, a: Tensor, b: Tensor) -> Tensor:
    """Stride = kernel size, no padding (patch embedding)."""
    return conv_2d(ctx, a, b, a.ne[0], a.ne[1], 0, 0, 1, 1)


def conv_2d_s1_ph(ctx, a: Tensor, b: Tensor) -> Tensor:
    """Stride 1, half padding."""
    return conv_2d(ctx, a, b, 1, 1, a.ne[0] // 2, a.ne[1] // 2, 1, 1)


def conv_2d_dw(ctx, a: Tensor, b: Tensor, s0: int, s1: int, p0: int, p1: int, d0: int, d1: int) -> Tensor:
    """Depthwise 2-D convolution through im2col: a [KW, KH, 1, C], b [W, H, C, N]."""
    new_a = reshape_4d(ctx, a, a.ne[0], a.ne[1], 1, a.ne[2] * a.ne[3])
    cols = im2col(ctx, new_a, reshape_4d(ctx, b, b.ne[0], b.ne[1], 1, b.ne[2] * b.ne[3]),
                  s0, s1, p0, p1, d0, d1, True, _im2col_type(a))                 # [KH*KW, OW, OH, N*C]
    new_b = reshape_4d(ctx, cols, cols.ne[0], cols.ne[2] * cols.ne[1], b.ne[2], b.ne[3])
    new_a = reshape_4d(ctx, new_a, new_a.ne[0] * new_a.ne[1], new_a.ne[2], new_a.ne[3], 1)
    result = mul_mat(ctx, new_a, new_b)
    return reshape_4d(ctx, result, cols.ne[1], cols.ne[2], b.ne[2], b.ne[3])


def conv_3d(ctx, a: Tensor, b: Tensor, IC: int, s0: int, s1: int, s2: int, p0: int, p1: int, p2: int,
            d0: int, d1: int, d2: int) -> Tensor:
    """a [KW, KH, KD, OC*IC], b [W, H, D, N*IC] -> [OW, OH, OD, N*OC] through im2col_3d."""
    cols = im2col_3d(ctx, a, b, IC, s0, s1, s2, p0, p1, p2, d0, d1, d2, _im2col_type(a))
    oc = a.ne[3] // IC
    n = b.ne[3] // IC
    result = mul_mat(ctx, reshape_2d(ctx, cols, cols.ne[0], cols.ne[3] * cols.ne[2] * cols.ne[1]),
                     reshape_2d(ctx, a, a.ne[0] * a.ne[1] * a.ne[2] * IC, oc))
    od = cols.ne[3] // n
    result = reshape_4d(ctx, result, cols.ne[1] * cols.ne[2], od, n, oc)
    result = cont(ctx, permute(ctx, result, 0, 1, 3, 2))
    return reshape_4d(ctx, result, cols.ne[1], cols.ne[2], od, oc * n)


# ---------------------------------------------------------------- direct convolutions

def conv_2d_direct(ctx, a: Tensor, b: Tensor, s0: int, s1: int, p0: int, p1: int, d0: int, d1: int) -> Tensor:
    """CONV_2D: a [KW, KH, IC, OC], b [W, H, IC, N] -> [OW, OH, OC, N] of b's type."""
    require(a.ne[2] == b.ne[2], "conv_2d_direct", "kernel a.ne[2] (IC) must equal b.ne[2]", a, b)
    ne = [_conv_output_size(b.ne[0], a.ne[0], s0, p0, d0), _conv_output_size(b.ne[1], a.ne[1], s1, p1, d1),
          a.ne[3], b.ne[3]]
    require(ne[0] > 0 and ne[1] > 0, "conv_2d_direct", "b too small compared to a", a, b)
    return new_op(ctx, Op.CONV_2D, b.type, ne, [a, b], [s0, s1, p0, p1, d0, d1])


def conv_3d_direct(ctx, a: Tensor, b: Tensor, s0: int, s1: int, s2: int, p0: int, p1: int, p2: int,
                   d0: int, d1: int, d2: int, n_channels: int, n_batch: int, n_channels_out: int) -> Tensor:
    """CONV_3D: a [KW, KH, KD, IC*OC], b [W, H, D, IC*N] -> F32 [OW, OH, OD, OC*N]."""
    c, n, oc = int(n_channels), int(n_batch), int(n_channels_out)
    require(a.ne[3] == c * oc, "conv_3d_direct", f"a.ne[3] must be n_channels*n_channels_out = {c * oc}", a)
    require(b.ne[3] == c * n, "conv_3d_direct", f"b.ne[3] must be n_channels*n_batch = {c * n}", b)
    ne = [_conv_output_size(b.ne[0], a.ne[0], s0, p0, d0), _conv_output_size(b.ne[1], a.ne[1], s1, p1, d1),
          _conv_output_size(b.ne[2], a.ne[2], s2, p2, d2), oc * n]
    require(min(ne) > 0, "conv_3d_direct", "b too small compared to a", a, b)
    return new_op(ctx, Op.CONV_3D, Type.F32, ne, [a, b], [s0, s1, s2, p0, p1, p2, d0, d1, d2, c, n, oc])


def conv_2d_dw_direct(ctx, a: Tensor, b: Tensor, stride0: int, stride1: int, pad0: int, pad1: int,
                      dilation0: int, dilation1: int) -> Tensor:
    """CONV_2D_DW: a [KW, KH, 1, C], b [W, H, C, N] -> [OW, OH, C, N]. A channels-innermost b
    (CWHN memory) gives a result in the same memory order, as in ggml."""
    require(a.ne[2] == 1, "conv_2d_dw_direct", "kernel a.ne[2] must be 1", a)
    require(a.ne[3] == b.ne[2], "conv_2d_dw_direct", "kernel a.ne[3] (C) must equal b.ne[2]", a, b)
    ne = [_conv_output_size(b.ne[0], a.ne[0], stride0, pad0, dilation0),
          _conv_output_size(b.ne[1], a.ne[1], stride1, pad1, dilation1), b.ne[2], b.ne[3]]
    require(ne[0] > 0 and ne[1] > 0, "conv_2d_dw_direct", "b too small compared to a", a, b)
    result = new_op(ctx, Op.CONV_2D_DW, b.type, ne, [a, b], [stride0, stride1, pad0, pad1, dilation0, dilation1])
    if is_contiguous_channels(b):
        size = result.nb[0]
        result.nb[0] = result.ne[2] * size
        result.nb[1] = result.ne[0] * result.nb[0]
        result.nb[2] = size
    return result


def conv_transpose_1d(ctx, a: Tensor, b: Tensor, s0: int, p0: int, d0: int) -> Tensor:
    """a [K, OC, IC], b [L, IC] -> F32 [(L - 1)*s0 + K, OC]; ggml supports p0 = 0 and d0 = 1 only."""
    require(is_matrix(b), "conv_transpose_1d", "b must be a matrix", b)
    require(a.ne[2] == b.ne[1], "conv_transpose_1d", "kernel a.ne[2] (IC) must equal b.ne[1]", a, b)
    require(a.ne[3] == 1, "conv_transpose_1d", "a.ne[3] must be 1", a)
    require(p0 == 0 and d0 == 1, "conv_transpose_1d", f"only p0 == 0 and d0 == 1 (got {p0}, {d0})", a, b)
    ne = [(b.ne[0] - 1) * s0 + a.ne[0], a.ne[1], b.ne[2], 1]
    return new_op(ctx, Op.CONV_TRANSPOSE_1D, Type.F32, ne, [a, b], [s0, p0, d0])


def conv_transpose_2d_p0(ctx, a: Tensor, b: Tensor, stride: int) -> Tensor:
    """a [KW, KH, OC, IC], b [W, H, IC, N] -> F32 [(W - 1)*stride + KW, (H - 1)*stride + KH, OC, N]."""
    require(a.ne[3] == b.ne[2], "conv_transpose_2d_p0", "kernel a.ne[3] (IC) must equal b.ne[2]", a, b)
    ne = [(b.ne[0] - 1) * stride + a.ne[0], (b.ne[1] - 1) * stride + a.ne[1], a.ne[2], b.ne[3]]
    return new_op(ctx, Op.CONV_TRANSPOSE_2D, Type.F32, ne, [a, b], [stride])


__all__ = [name for name, fn in list(globals().items())
           if not name.startswith("_") and callable(fn) and getattr(fn, "__module__", None) == __name__]
