"""Convolutions: IM2COL (F.unfold), IM2COL_BACK and COL2IM_1D (F.fold), IM2COL_3D, and the direct
CONV_2D, CONV_2D_DW, CONV_3D, CONV_TRANSPOSE_1D/2D (torch's convolutions). Float32 compute.

ggml's composite builders (conv_1d, conv_2d, ...) reach the CPU's matmul path through IM2COL +
MUL_MAT; the direct ops use torch's convolution kernels (oneDNN on the CPU, cuDNN on CUDA)."""
from __future__ import annotations

import torch.nn.functional as F

from ...enums import Op
from ...types import Type
from .table import KernelTable
from .common import as_float, write, all_float, is_float

KERNELS = KernelTable("conv")


def _float_srcs(node, n: int = 2) -> bool:
    return all_float(node, n)


def _params(node, n: int) -> list[int]:
    return [node.op_params[i] for i in range(n)]


# ---------------------------------------------------------------- im2col and its adjoints

def _im2col_geometry(node, kernel, image_ne):
    """(kernel (kh, kw), stride, padding, dilation, is_2D) of an IM2COL/IM2COL_BACK node; 1-D as
    2-D with height 1."""
    s0, s1, p0, p1, d0, d1, is_2d = _params(node, 7)
    if is_2d:
        return (kernel.ne[1], kernel.ne[0]), (s1, s0), (p1, p0), (d1, d0), True
    return (1, kernel.ne[0]), (1, s0), (0, p0), (1, d0), False


def _window_pads(sizes, ks, ss, ps, ds, outs) -> list[int]:
    """F.pad widths (last dim first) giving exactly `outs` windows over dims of `sizes`
    (outermost first): p before, and after as far as the last window reaches (negative: cropped).
    ggml sizes outputs with C's truncating division, so a window may start in the padding and
    run past it, which torch's own padding refuses."""
    widths = []
    for n, k, s, p, d, o in zip(sizes, ks, ss, ps, ds, outs):
        widths.append((p, (o - 1) * s + d * (k - 1) + 1 - n - p))
    return [w for pair in reversed(widths) for w in pair]


def _padded_windows(x, ks, ss, ps, ds, outs):
    """x (spatial dims last, outermost first) padded by p before and cut to the span of exactly
    `outs` windows: _window_pads as zero padding and a slice (F.pad's negative widths cannot cut
    more than the unpadded length, as a window past a short dim asks)."""
    n = len(ks)
    pads = _window_pads(x.shape[-n:], ks, ss, ps, ds, outs)
    x = F.pad(x, [max(w, 0) for w in pads])
    spans = [(o - 1) * s + d * (k - 1) + 1 for k, s, d, o in zip(ks, ss, ds, outs)]
    return x[(..., *(slice(0, span) for span in spans))]


@KERNELS.register(Op.IM2COL, supports=lambda n: is_float(n) and is_float(n.src[1]))
def im2col(node):
    """[N, IC, IH, IW] -> [N, OH, OW, IC*KH*KW] (2-D); [N, IC, IW] -> [N, OW, IC*K] (1-D)."""
    a, b = node.src[0], node.src[1]
    k, s, p, d, is_2d = _im2col_geometry(node, a, b.ne)
    x = as_float(b)                                    # [N, IC, IH, IW] or [1, N, IC, IW]
    if not is_2d:
        x = x[0].unsqueeze(2)                          # [N, IC, 1, IW]
    outs = (node.ne[2], node.ne[1]) if is_2d else (1, node.ne[1])
    x = _padded_windows(x, k, s, p, d, outs)
    cols = F.unfold(x, k, dilation=d, stride=s)        # [N, IC*KH*KW, OH*OW]
    write(node, cols.transpose(1, 2).reshape(node.ne[3], node.ne[2], node.ne[1], node.ne[0]))


@KERNELS.register(Op.IM2COL_BACK, supports=lambda n: n.type == Type.F32 and is_float(n.src[0]))
def im2col_back(node):
    """The adjoint of IM2COL: each column value added back to the image position it came from.
    src[0] is im2col's output gradient, src[1] the kernel (ggml's order)."""
    grad, kernel = node.src[0], node.src[1]
    k, s, p, d, is_2d = _im2col_geometry(node, kernel, node.ne)
    g = as_float(grad)                                 # [N, OH, OW, IC*KH*KW] or [1, N, OW, IC*K]
    if is_2d:
        n, ih, iw = node.ne[3], node.ne[1], node.ne[0]
    else:
        n, ih, iw = node.ne[2], 1, node.ne[0]
    cols = g.reshape(n, -1, g.shape[-1]).transpose(1, 2)     # [N, IC*KH*KW, OH*OW]
    outs = (grad.ne[2], grad.ne[1]) if is_2d else (1, grad.ne[1])
    pads = _window_pads((ih, iw), k, s, p, d, outs)
    padded = (ih + pads[2] + pads[3], iw + pads[0] + pads[1])
    image = F.fold(cols, padded, k, dilation=d, stride=s)       # the padded image's gradient
    write(node, F.pad(image, [-w for w in pads]).reshape(tuple(reversed(node.ne))))


@KERNELS.register(Op.COL2IM_1D, supports=lambda n: _float_srcs(n, 1))
def col2im_1d(node):
    """Columns [T_in, OC*K] (row oc*K + k) scatter-added into [OC, T_out], p0 cropped each side."""
    s0, oc, p0 = _params(node, 3)
    cols = as_float(node.src[0])[0, 0]                 # [T_in, OC*K]
    t_in, k = cols.shape[0], cols.shape[1] // oc
    full = (t_in - 1) * s0 + k
    signal = F.fold(cols.t().unsqueeze(0), (1, full), (1, k), stride=(1, s0))   # [1, OC, 1, full]
    write(node, signal[0, :, 0, p0:full - p0])


@KERNELS.register(Op.IM2COL_3D, supports=lambda n: is_float(n) and is_float(n.src[1]))
def im2col_3d(node):
    """[N*IC, ID, IH, IW] -> [N*OD, OH, OW, IC*KD*KH*KW]."""
    s0, s1, s2, p0, p1, p2, d0, d1, d2, ic = _params(node, 10)
    a, b = node.src[0], node.src[1]
    kd, kh, kw = a.ne[2], a.ne[1], a.ne[0]
    n = b.ne[3] // ic
    x = as_float(b).reshape(n, ic, b.ne[2], b.ne[1], b.ne[0])
    od, oh, ow = node.ne[3] // n, node.ne[2], node.ne[1]
    x = _padded_windows(x, (kd, kh, kw), (s2, s1, s0), (p2, p1, p0), (d2, d1, d0), (od, oh, ow))
    # windows: [N, IC, OD, OH, OW, KD, KH, KW] over the dilated kernel extent, then every d-th tap
    win = (x.unfold(2, d2 * (kd - 1) + 1, s2).unfold(3, d1 * (kh - 1) + 1, s1).unfold(4, d0 * (kw - 1) + 1, s0))
    win = win[..., ::d2, ::d1, ::d0]
    cols = win.permute(0, 2, 3, 4, 1, 5, 6, 7)         # [N, OD, OH, OW, IC, KD, KH, KW]
    write(node, cols.reshape(n * od, oh, ow, -1))


# ---------------------------------------------------------------- direct convolutions

def _kernel_input(node):
    """The kernel as float32 and the input, rounded to F16 when the kernel is F16 (ggml's direct
    kernels multiply in the kernel's type)."""
    w, x = as_float(node.src[0]), as_float(node.src[1])
    if node.src[0].type == Type.F16:
        x = x.half().float()
    return w, x


def _conv_padded(node, x, kernel, stride, pad, dilation):
    """x padded so a convolution without padding gives exactly the node's outputs (ggml's sizes;
    spatial dims are the last len(stride) of x, outermost first)."""
    n = len(stride)
    outs = [node.ne[i] for i in reversed(range(n))]
    return _padded_windows(x, kernel, stride, pad, dilation, outs)


@KERNELS.register(Op.CONV_2D, supports=_float_srcs)
def conv_2d(node):
    """a [OC, IC, KH, KW] over b [N, IC, H, W]."""
    s0, s1, p0, p1, d0, d1 = _params(node, 6)
    w, x = _kernel_input(node)
    x = _conv_padded(node, x, w.shape[-2:], (s1, s0), (p1, p0), (d1, d0))
    write(node, F.conv2d(x, w, stride=(s1, s0), dilation=(d1, d0)))


@KERNELS.register(Op.CONV_2D_DW, supports=_float_srcs)
def conv_2d_dw(node):
    """Depthwise: a [C, 1, KH, KW] over b [N, C, H, W] (any memory order: views carry the strides)."""
    s0, s1, p0, p1, d0, d1 = _params(node, 6)
    w, x = as_float(node.src[0]), as_float(node.src[1])
    x = _conv_padded(node, x, w.shape[-2:], (s1, s0), (p1, p0), (d1, d0))
    write(node, F.conv2d(x, w, stride=(s1, s0), dilation=(d1, d0), groups=x.shape[1]))


@KERNELS.register(Op.CONV_3D, supports=_float_srcs)
def conv_3d(node):
    """a [OC*IC, KD, KH, KW] over b [N*IC, D, H, W] -> [N*OC, OD, OH, OW]."""
    s0, s1, s2, p0, p1, p2, d0, d1, d2, c, n, oc = _params(node, 12)
    a, b = node.src[0], node.src[1]
    w, x = _kernel_input(node)
    w = w.reshape(oc, c, a.ne[2], a.ne[1], a.ne[0])
    x = x.reshape(n, c, b.ne[2], b.ne[1], b.ne[0])
    x = _conv_padded(node, x, w.shape[-3:], (s2, s1, s0), (p2, p1, p0), (d2, d1, d0))
    y = F.conv3d(x, w, stride=(s2, s1, s0), dilation=(d2, d1, d0))
    write(node, y.reshape(n * oc, *y.shape[2:]))


@KERNELS.register(Op.CONV_TRANSPOSE_1D, supports=_float_srcs)
def conv_transpose_1d(node):
    """a [IC, OC, K] over b [IC, L] -> [OC, (L - 1)*s0 + K]."""
    s0 = node.op_params[0]
    w, x = _kernel_input(node)
    y = F.conv_transpose1d(x[0], w[0], stride=s0)      # x[0]: [N(=1), IC, L]
    write(node, y)


@KERNELS.register(Op.CONV_TRANSPOSE_2D, supports=_float_srcs)
def conv_transpose_2d(node):
    """a [IC, OC, KH, KW] over b [N, IC, H, W] -> [N, OC, OH, OW] (stride op_params[0], no padding)."""
    stride = node.op_params[0]
    w, x = _kernel_input(node)
    write(node, F.conv_transpose2d(x, w, stride=stride))
