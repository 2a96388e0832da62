"""Cases: convolutions against torch.nn.functional in float64. IM2COL (1-D, 2-D; F32/F16 columns),
IM2COL_BACK (against autograd through F.unfold), IM2COL_3D, COL2IM_1D (against the scatter-add
formula), the composite builders (conv_1d, conv_1d_ph, conv_1d_dw, conv_2d, conv_2d_sk_p0,
conv_2d_s1_ph, conv_2d_dw, conv_3d), the direct CONV_2D, CONV_2D_DW (WHCN and CWHN memory),
CONV_3D, and CONV_TRANSPOSE_1D/2D.

The composites store im2col's columns as F16 (F32 for BF16 kernels), so their references take
the image rounded to F16 first; the direct kernels with F16 weights round the image too."""
from __future__ import annotations

import torch
import torch.nn.functional as F

import torchggml as ggml
from .values import T
from .table import CaseTable

CASES = CaseTable()
case = CASES.case

# products of F16-rounded values summed in float32: a bound well below the matmul threshold
NMSE_CONV = 1e-6


def _f16(x):
    return x.half().double()


# ---------------------------------------------------------------- IM2COL

def _im2col_ref(k_hw, s, p, d, is_2d):
    """torch order [N, OH, OW, IC*KH*KW] (2-D) or [1, N, OW, IC*K] (1-D) from F.unfold."""
    def ref(a, b):
        x = b if is_2d else b[0].unsqueeze(2)
        cols = F.unfold(x, k_hw, dilation=d, padding=p, stride=s).transpose(1, 2)
        n = x.shape[0]
        if is_2d:
            oh = (x.shape[2] + 2 * p[0] - d[0] * (k_hw[0] - 1) - 1) // s[0] + 1
            return cols.reshape(n, oh, -1, cols.shape[-1])
        return cols.reshape(1, n, -1, cols.shape[-1])
    return ref


for _dst in (T.F32, T.F16):
    for _ne_a, _ne_b, _s, _p, _d in [([3, 3, 4, 2], [10, 9, 4, 2], (1, 1), (1, 1), (1, 1)),
                                     ([3, 2, 3, 5], [11, 8, 3, 1], (2, 1), (0, 1), (1, 2)),
                                     ([2, 2, 2, 1], [8, 8, 2, 3], (2, 2), (0, 0), (1, 1))]:
        def _build_im2col(ctx, ne_a=_ne_a, ne_b=_ne_b, s=_s, p=_p, d=_d, dst=_dst):
            a = ggml.new_tensor(ctx, T.F16, ne_a)
            b = ggml.new_tensor(ctx, T.F32, ne_b)
            return ggml.im2col(ctx, a, b, s[0], s[1], p[0], p[1], d[0], d[1], True, dst), [a, b]
        case("im2col", f"2D,dst={_dst.name},a={_ne_a},b={_ne_b},s={_s},p={_p},d={_d}", _build_im2col,
             _im2col_ref((_ne_a[1], _ne_a[0]), _s[::-1], _p[::-1], _d[::-1], True)
             if _dst == T.F32 else
             lambda a, b, r=_im2col_ref((_ne_a[1], _ne_a[0]), _s[::-1], _p[::-1], _d[::-1], True): _f16(r(a, b)),
             max_nmse=0)

    for _k, _ic, _l, _n, _s, _p, _d in [(3, 4, 16, 2, 1, 1, 1), (5, 2, 20, 1, 2, 2, 2)]:
        def _build_im2col_1d(ctx, k=_k, ic=_ic, l=_l, n=_n, s=_s, p=_p, d=_d, dst=_dst):
            a = ggml.new_tensor_3d(ctx, T.F16, k, ic, 3)
            b = ggml.new_tensor_3d(ctx, T.F32, l, ic, n)
            return ggml.im2col(ctx, a, b, s, 0, p, 0, d, 0, False, dst), [a, b]
        _r = _im2col_ref((1, _k), (1, _s), (0, _p), (1, _d), False)
        case("im2col", f"1D,dst={_dst.name},k={_k},ic={_ic},l={_l},n={_n},s={_s},p={_p},d={_d}", _build_im2col_1d,
             _r if _dst == T.F32 else (lambda a, b, r=_r: _f16(r(a, b))), max_nmse=0)


# ---------------------------------------------------------------- IM2COL_BACK (autograd through F.unfold)

def _im2col_back_ref(ne_img, k_hw, s, p, d, is_2d):
    def ref(grad, kernel):
        img_shape = tuple(reversed(ne_img))
        x = torch.zeros(img_shape if is_2d else (img_shape[1], img_shape[2], 1, img_shape[3]),
                        dtype=torch.float64, requires_grad=True)
        cols = F.unfold(x, k_hw, dilation=d, padding=p, stride=s)          # [N, C*K, L]
        g = grad.reshape(x.shape[0], -1, grad.shape[-1]).transpose(1, 2)
        (gx,) = torch.autograd.grad(cols, x, g)
        return gx.reshape(img_shape)
    return ref


for _ne_img, _ne_k, _s, _p, _d, _2d in [([9, 8, 3, 2], [3, 3, 3, 4], (1, 1), (1, 1), (1, 1), True),
                                        ([10, 7, 2, 1], [3, 2, 2, 1], (2, 2), (1, 0), (1, 2), True),
                                        ([16, 3, 2, 1], [3, 3, 1, 1], (2, 1), (1, 0), (2, 1), False)]:
    def _build_im2col_back(ctx, ne_img=_ne_img, ne_k=_ne_k, s=_s, p=_p, d=_d, is_2d=_2d):
        kernel = ggml.new_tensor(ctx, T.F32, ne_k)
        img = ggml.new_tensor(ctx, T.F32, ne_img)
        cols = ggml.im2col(ctx, kernel, img, s[0], s[1], p[0], p[1], d[0], d[1], is_2d, T.F32)
        grad = ggml.new_tensor(ctx, T.F32, cols.ne)
        return ggml.im2col_back(ctx, grad, kernel, ne_img, s[0], s[1], p[0], p[1], d[0], d[1], is_2d), [grad, kernel]
    _khw = (_ne_k[1], _ne_k[0]) if _2d else (1, _ne_k[0])
    _geo = (_s[::-1], _p[::-1], _d[::-1]) if _2d else ((1, _s[0]), (0, _p[0]), (1, _d[0]))
    case("im2col_back", f"{'2D' if _2d else '1D'},img={_ne_img},k={_ne_k},s={_s},p={_p},d={_d}",
         _build_im2col_back, _im2col_back_ref(_ne_img, _khw, *_geo, _2d), max_nmse=1e-12)


# ---------------------------------------------------------------- COL2IM_1D (the scatter-add formula)

def _col2im_ref(s0, oc, p0):
    def ref(a):
        cols = a[0, 0]                                     # [T_in, K*OC], column oc*K + k
        t_in, k = cols.shape[0], cols.shape[1] // oc
        t_out = (t_in - 1) * s0 + k - 2 * p0
        out = torch.zeros(oc, t_out, dtype=torch.float64)
        for c in range(oc):
            for t in range(t_in):
                for j in range(k):
                    pos = t * s0 + j - p0
                    if 0 <= pos < t_out:
                        out[c, pos] += cols[t, c * k + j]
        return out
    return ref


for _type in (T.F32, T.F16):
    for _k, _oc, _t, _s0, _p0 in [(4, 3, 7, 2, 1), (5, 1, 9, 1, 0), (6, 2, 5, 3, 2)]:
        def _build_col2im(ctx, k=_k, oc=_oc, t=_t, s0=_s0, p0=_p0, type=_type):
            a = ggml.new_tensor_2d(ctx, type, k * oc, t)
            return ggml.col2im_1d(ctx, a, s0, oc, p0), [a]
        case("col2im_1d", f"type={_type.name},K={_k},OC={_oc},T={_t},s0={_s0},p0={_p0}", _build_col2im,
             (lambda a, r=_col2im_ref(_s0, _oc, _p0): r(a)) if _type == T.F32 else
             (lambda a, r=_col2im_ref(_s0, _oc, _p0): _f16(r(a))), max_nmse=1e-12 if _type == T.F32 else 1e-6)


# ---------------------------------------------------------------- composite convolutions (im2col + mul_mat)

def _conv_1d_layout(y):
    """ggml's conv_1d result memory: mul_mat gives [N*OL, OC] and conv_1d reshapes it to
    [OL, OC, N] without a permute, so for N > 1 the memory holds (oc, n, ol) under the labels
    (n, oc, ol). y is torch's [N, OC, OL]."""
    return y.transpose(0, 1).reshape(y.shape).unsqueeze(0)


for _ktype in (T.F16, T.F32):
    for _k, _ic, _oc, _l, _n, _s, _p, _d in [(3, 4, 5, 20, 2, 1, 1, 1), (5, 3, 2, 17, 1, 2, 2, 1),
                                             (3, 2, 4, 16, 1, 1, 2, 2)]:
        def _build_conv_1d(ctx, k=_k, ic=_ic, oc=_oc, l=_l, n=_n, s=_s, p=_p, d=_d, ktype=_ktype):
            a = ggml.new_tensor_3d(ctx, ktype, k, ic, oc)
            b = ggml.new_tensor_3d(ctx, T.F32, l, ic, n)
            return ggml.conv_1d(ctx, a, b, s, p, d), [a, b]
        case("conv_1d", f"kernel={_ktype.name},k={_k},ic={_ic},oc={_oc},l={_l},n={_n},s={_s},p={_p},d={_d}",
             _build_conv_1d, lambda a, b, s=_s, p=_p, d=_d: _conv_1d_layout(
                 F.conv1d(_f16(b[0]), a[0], stride=s, padding=p, dilation=d)),
             max_nmse=NMSE_CONV)


def _build_conv_1d_ph(ctx):
    a = ggml.new_tensor_3d(ctx, T.F16, 5, 3, 4)
    b = ggml.new_tensor_3d(ctx, T.F32, 18, 3, 1)
    return ggml.conv_1d_ph(ctx, a, b, 1, 1), [a, b]


case("conv_1d", "conv_1d_ph k=5", _build_conv_1d_ph,
     lambda a, b: F.conv1d(_f16(b[0]), a[0], padding=2).unsqueeze(0), max_nmse=NMSE_CONV)

for _k, _c, _l, _s, _p, _d in [(3, 4, 16, 1, 1, 1), (5, 3, 20, 2, 2, 1)]:
    def _build_conv_1d_dw(ctx, k=_k, c=_c, l=_l, s=_s, p=_p, d=_d):
        a = ggml.new_tensor_3d(ctx, T.F16, k, 1, c)
        b = ggml.new_tensor_2d(ctx, T.F32, l, c)
        return ggml.conv_1d_dw(ctx, a, b, s, p, d), [a, b]
    case("conv_1d_dw", f"k={_k},c={_c},l={_l},s={_s},p={_p},d={_d}", _build_conv_1d_dw,
         lambda a, b, s=_s, p=_p, d=_d, c=_c: F.conv1d(_f16(b[0, 0]).unsqueeze(0), a[0], stride=s, padding=p,
                                                       dilation=d, groups=c),
         max_nmse=NMSE_CONV)

# (kernel [KW, KH, IC, OC], image [W, H, IC, N], stride, padding, dilation)
_CONV_2D = [([3, 3, 4, 6], [12, 10, 4, 2], (1, 1), (1, 1), (1, 1)),
            ([3, 2, 3, 4], [13, 9, 3, 1], (2, 1), (0, 1), (1, 2)),
            ([4, 4, 3, 8], [16, 16, 3, 1], (4, 4), (0, 0), (1, 1))]

for _ktype in (T.F16, T.F32, T.BF16):
    for _ne_a, _ne_b, _s, _p, _d in _CONV_2D:
        def _build_conv_2d(ctx, ne_a=_ne_a, ne_b=_ne_b, s=_s, p=_p, d=_d, ktype=_ktype):
            a = ggml.new_tensor(ctx, ktype, ne_a)
            b = ggml.new_tensor(ctx, T.F32, ne_b)
            return ggml.conv_2d(ctx, a, b, s[0], s[1], p[0], p[1], d[0], d[1]), [a, b]
        # BF16 kernels keep F32 columns: no rounding of the image
        _img = (lambda x: x) if _ktype == T.BF16 else _f16
        case("conv_2d", f"kernel={_ktype.name},a={_ne_a},b={_ne_b},s={_s},p={_p},d={_d}", _build_conv_2d,
             lambda a, b, s=_s, p=_p, d=_d, img=_img: F.conv2d(img(b), a, stride=s[::-1], padding=p[::-1],
                                                               dilation=d[::-1]),
             max_nmse=NMSE_CONV)


def _build_conv_2d_sk_p0(ctx):
    a = ggml.new_tensor_4d(ctx, T.F16, 4, 4, 3, 8)
    b = ggml.new_tensor_4d(ctx, T.F32, 16, 12, 3, 1)
    return ggml.conv_2d_sk_p0(ctx, a, b), [a, b]


case("conv_2d", "conv_2d_sk_p0 (patch embedding)", _build_conv_2d_sk_p0,
     lambda a, b: F.conv2d(_f16(b), a, stride=4), max_nmse=NMSE_CONV)


def _build_conv_2d_s1_ph(ctx):
    a = ggml.new_tensor_4d(ctx, T.F16, 3, 3, 4, 4)
    b = ggml.new_tensor_4d(ctx, T.F32, 9, 8, 4, 1)
    return ggml.conv_2d_s1_ph(ctx, a, b), [a, b]


case("conv_2d", "conv_2d_s1_ph", _build_conv_2d_s1_ph, lambda a, b: F.conv2d(_f16(b), a, padding=1),
     max_nmse=NMSE_CONV)

for _ne_a, _ne_b, _s, _p, _d in [([3, 3, 1, 4], [10, 9, 4, 2], (1, 1), (1, 1), (1, 1)),
                                 ([5, 3, 1, 3], [12, 11, 3, 1], (2, 1), (2, 0), (1, 2))]:
    def _build_conv_2d_dw(ctx, ne_a=_ne_a, ne_b=_ne_b, s=_s, p=_p, d=_d):
        a = ggml.new_tensor(ctx, T.F16, ne_a)
        b = ggml.new_tensor(ctx, T.F32, ne_b)
        return ggml.conv_2d_dw(ctx, a, b, s[0], s[1], p[0], p[1], d[0], d[1]), [a, b]
    case("conv_2d_dw", f"im2col,a={_ne_a},b={_ne_b},s={_s},p={_p},d={_d}", _build_conv_2d_dw,
         lambda a, b, s=_s, p=_p, d=_d: F.conv2d(_f16(b), a, stride=s[::-1], padding=p[::-1], dilation=d[::-1],
                                                 groups=b.shape[1]),
         max_nmse=NMSE_CONV)

    for _cwhn in (False, True):
        def _build_conv_2d_dw_direct(ctx, ne_a=_ne_a, ne_b=_ne_b, s=_s, p=_p, d=_d, cwhn=_cwhn):
            if not cwhn:
                a = ggml.new_tensor(ctx, T.F32, ne_a)
                b = ggml.new_tensor(ctx, T.F32, ne_b)
                return ggml.conv_2d_dw_direct(ctx, a, b, s[0], s[1], p[0], p[1], d[0], d[1]), [a, b]
            # channels innermost in memory: tensors [C, W, H, N] permuted to [W, H, C, N]
            a_mem = ggml.new_tensor_4d(ctx, T.F32, ne_a[3], ne_a[0], ne_a[1], 1)
            b_mem = ggml.new_tensor_4d(ctx, T.F32, ne_b[2], ne_b[0], ne_b[1], ne_b[3])
            a = ggml.permute(ctx, a_mem, 3, 0, 1, 2)
            b = ggml.permute(ctx, b_mem, 2, 0, 1, 3)
            return ggml.conv_2d_dw_direct(ctx, a, b, s[0], s[1], p[0], p[1], d[0], d[1]), [a_mem, b_mem]

        def _dw_ref(a, b, s=_s, p=_p, d=_d, cwhn=_cwhn):
            if cwhn:   # memory [N, H, W, C] / [1, KH, KW, C] -> torch's [N, C, H, W] / [C, 1, KH, KW]
                b = b.permute(0, 3, 1, 2)
                a = a.permute(3, 0, 1, 2)
            return F.conv2d(b, a, stride=s[::-1], padding=p[::-1], dilation=d[::-1], groups=b.shape[1])
        case("conv_2d_dw", f"direct,{'CWHN' if _cwhn else 'WHCN'},a={_ne_a},b={_ne_b},s={_s},p={_p},d={_d}",
             _build_conv_2d_dw_direct, _dw_ref, max_nmse=1e-12)

for _ktype in (T.F32, T.F16):
    for _ne_a, _ne_b, _s, _p, _d in _CONV_2D[:2]:
        def _build_conv_2d_direct(ctx, ne_a=_ne_a, ne_b=_ne_b, s=_s, p=_p, d=_d, ktype=_ktype):
            a = ggml.new_tensor(ctx, ktype, ne_a)
            b = ggml.new_tensor(ctx, T.F32, ne_b)
            return ggml.conv_2d_direct(ctx, a, b, s[0], s[1], p[0], p[1], d[0], d[1]), [a, b]
        _img = _f16 if _ktype == T.F16 else (lambda x: x)
        case("conv_2d_direct", f"kernel={_ktype.name},a={_ne_a},b={_ne_b},s={_s},p={_p},d={_d}",
             _build_conv_2d_direct,
             lambda a, b, s=_s, p=_p, d=_d, img=_img: F.conv2d(img(b), a, stride=s[::-1], padding=p[::-1],
                                                               dilation=d[::-1]),
             max_nmse=NMSE_CONV if _ktype == T.F16 else 1e-12)


# ---------------------------------------------------------------- 3-D

def _conv3d_ref(ic, oc, n, s, p, d, round_image):
    """a [OC*IC, KD, KH, KW], b [N*IC, D, H, W] (torch order) -> [N*OC, OD, OH, OW]."""
    def ref(a, b):
        w = a.reshape(oc, ic, *a.shape[1:])
        x = b.reshape(n, ic, *b.shape[1:])
        x = _f16(x) if round_image else x
        y = F.conv3d(x, w, stride=s[::-1], padding=p[::-1], dilation=d[::-1])
        return y.reshape(n * oc, *y.shape[2:])
    return ref


# (KW, KH, KD), (W, H, D), IC, OC, N, stride, padding, dilation
_CONV_3D = [((3, 3, 3), (8, 7, 6), 2, 3, 2, (1, 1, 1), (1, 1, 1), (1, 1, 1)),
            ((2, 3, 2), (9, 8, 7), 3, 2, 1, (2, 1, 2), (0, 1, 1), (1, 2, 1))]

for _k, _img_size, _ic, _oc, _n, _s, _p, _d in _CONV_3D:
    def _build_conv_3d(ctx, k=_k, img=_img_size, ic=_ic, oc=_oc, n=_n, s=_s, p=_p, d=_d):
        a = ggml.new_tensor_4d(ctx, T.F16, *k, oc * ic)
        b = ggml.new_tensor_4d(ctx, T.F32, *img, n * ic)
        return ggml.conv_3d(ctx, a, b, ic, *s, *p, *d), [a, b]
    case("conv_3d", f"im2col_3d,k={_k},img={_img_size},ic={_ic},oc={_oc},n={_n},s={_s},p={_p},d={_d}",
         _build_conv_3d, _conv3d_ref(_ic, _oc, _n, _s, _p, _d, True), max_nmse=NMSE_CONV)

    def _build_conv_3d_direct(ctx, k=_k, img=_img_size, ic=_ic, oc=_oc, n=_n, s=_s, p=_p, d=_d):
        a = ggml.new_tensor_4d(ctx, T.F32, *k, oc * ic)
        b = ggml.new_tensor_4d(ctx, T.F32, *img, n * ic)
        return ggml.conv_3d_direct(ctx, a, b, *s, *p, *d, ic, n, oc), [a, b]
    case("conv_3d_direct", f"k={_k},img={_img_size},ic={_ic},oc={_oc},n={_n},s={_s},p={_p},d={_d}",
         _build_conv_3d_direct, _conv3d_ref(_ic, _oc, _n, _s, _p, _d, False), max_nmse=1e-12)


# ---------------------------------------------------------------- transposed convolutions

for _ktype in (T.F32, T.F16):
    for _k, _oc, _ic, _l, _s in [(3, 4, 5, 10, 1), (4, 2, 3, 7, 2), (5, 3, 2, 6, 3)]:
        def _build_conv_transpose_1d(ctx, k=_k, oc=_oc, ic=_ic, l=_l, s=_s, ktype=_ktype):
            a = ggml.new_tensor_3d(ctx, ktype, k, oc, ic)
            b = ggml.new_tensor_2d(ctx, T.F32, l, ic)
            return ggml.conv_transpose_1d(ctx, a, b, s, 0, 1), [a, b]
        _img = _f16 if _ktype == T.F16 else (lambda x: x)
        case("conv_transpose_1d", f"kernel={_ktype.name},k={_k},oc={_oc},ic={_ic},l={_l},s={_s}",
             _build_conv_transpose_1d,
             lambda a, b, s=_s, img=_img: F.conv_transpose1d(img(b[0]), a[0], stride=s),
             max_nmse=NMSE_CONV if _ktype == T.F16 else 1e-12)

    for _ne_a, _ne_b, _stride in [([3, 3, 4, 5], [6, 5, 5, 1], 2), ([2, 2, 3, 2], [7, 4, 2, 1], 2),
                                  ([4, 3, 2, 3], [5, 6, 3, 2], 1)]:
        def _build_conv_transpose_2d(ctx, ne_a=_ne_a, ne_b=_ne_b, stride=_stride, ktype=_ktype):
            a = ggml.new_tensor(ctx, ktype, ne_a)
            b = ggml.new_tensor(ctx, T.F32, ne_b)
            return ggml.conv_transpose_2d_p0(ctx, a, b, stride), [a, b]
        _img = _f16 if _ktype == T.F16 else (lambda x: x)
        case("conv_transpose_2d", f"kernel={_ktype.name},a={_ne_a},b={_ne_b},stride={_stride}",
             _build_conv_transpose_2d,
             lambda a, b, stride=_stride, img=_img: F.conv_transpose2d(img(b), a, stride=stride),
             max_nmse=NMSE_CONV if _ktype == T.F16 else 1e-12)
