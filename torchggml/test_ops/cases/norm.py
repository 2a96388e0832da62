"""Cases: NORM, RMS_NORM, L2_NORM, GROUP_NORM: shapes, eps, permuted and row-strided sources,
in-place, F16."""
from __future__ import annotations

import math

import torch

import torchggml as ggml
from .values import rounded, ggml_permute, uniform
from .table import CaseTable

CASES = CaseTable()
case = CASES.case

T = ggml.Type


def norm_ref(x, eps):
    centered = x - x.mean(-1, keepdim=True)
    return centered / torch.sqrt((centered * centered).mean(-1, keepdim=True) + eps)


def rms_norm_ref(x, eps):
    return x / torch.sqrt((x * x).mean(-1, keepdim=True) + eps)


def l2_norm_ref(x, eps):
    return x / torch.clamp_min(torch.linalg.vector_norm(x, dim=-1, keepdim=True), eps)


def group_norm_ref(x, n_groups, eps):
    """Channels (torch dim 1) in groups of ceil(ne2 / n_groups); each group normalised over all
    its values, separately per batch (torch dim 0)."""
    per_group = math.ceil(x.shape[1] / n_groups)
    out = torch.empty_like(x)
    for start in range(0, x.shape[1], per_group):
        g = x[:, start:start + per_group]
        mean = g.mean((1, 2, 3), keepdim=True)
        var = ((g - mean) ** 2).mean((1, 2, 3), keepdim=True)
        out[:, start:start + per_group] = (g - mean) / torch.sqrt(var + eps)
    return out


ROW_NORMS = {"norm": (ggml.norm, ggml.norm_inplace, norm_ref),
             "rms_norm": (ggml.rms_norm, ggml.rms_norm_inplace, rms_norm_ref),
             "l2_norm": (ggml.l2_norm, ggml.l2_norm_inplace, l2_norm_ref)}


def _row_norm_cases(name, op, op_inplace, ref):
    default_eps = 1e-12 if name == "l2_norm" else 1e-6
    for ne in ([64, 5, 4, 3], [257, 3, 1, 1], [1, 4, 2, 1]):
        for eps in (default_eps, 1e-2):
            def build(ctx, ne=ne, eps=eps):
                a = ggml.new_tensor(ctx, T.F32, ne)
                return op(ctx, a, eps), [a]
            case(name, f"ne={ne},eps={eps}", build, lambda x, eps=eps: ref(x, eps))

    def build_permuted(ctx):  # rows strided, as after permute(0, 2, 1, 3) of heads and tokens
        a0 = ggml.new_tensor_4d(ctx, T.F32, 32, 6, 5, 2)
        return op(ctx, ggml.permute(ctx, a0, 0, 2, 1, 3), default_eps), [a0]
    case(name, "permuted (0,2,1,3)", build_permuted,
         lambda x: ref(ggml_permute(x, (0, 2, 1, 3)), default_eps))

    def build_row_view(ctx):  # the first 48 values of 64-wide rows (a view of a fused tensor)
        a0 = ggml.new_tensor_3d(ctx, T.F32, 64, 7, 3)
        return op(ctx, ggml.view_3d(ctx, a0, 48, 7, 3, a0.nb[1], a0.nb[2], 16 * 4), default_eps), [a0]
    case(name, "rows of a wider tensor", build_row_view, lambda x: ref(x[..., 16:], default_eps))

    def build_transposed(ctx):  # elements strided too (nb0 > nb1): ggml's slow path
        a0 = ggml.new_tensor_2d(ctx, T.F32, 9, 40)
        return op(ctx, ggml.transpose(ctx, a0), default_eps), [a0]
    case(name, "transposed", build_transposed, lambda x: ref(x.transpose(-1, -2), default_eps))

    def build_inplace(ctx):
        a = ggml.new_tensor_2d(ctx, T.F32, 96, 4)
        return op_inplace(ctx, ggml.scale(ctx, a, 2.0), default_eps), [a]
    case(name, "inplace", build_inplace, lambda x: ref(2.0 * x, default_eps))

    def build_f16(ctx):
        a = ggml.new_tensor_2d(ctx, T.F16, 128, 6)
        return op(ctx, a, default_eps), [a]
    case(name, "type=F16", build_f16, lambda x: rounded(T.F16, ref(x, default_eps)), max_nmse=1e-6)


for _name, (_op, _op_inplace, _ref) in ROW_NORMS.items():
    _row_norm_cases(_name, _op, _op_inplace, _ref)


def _l2_norm_zero_rows(ctx):  # all-zero rows: x / max(0, eps) = 0, never NaN
    a = ggml.new_tensor_2d(ctx, T.F32, 16, 3)
    return ggml.l2_norm(ctx, a, 1e-12), [a]


case("l2_norm", "zero rows", _l2_norm_zero_rows, lambda x: l2_norm_ref(x, 1e-12),
     init={0: lambda t, g: torch.zeros(3, 16)})


for _ne, _groups in [([8, 4, 12, 2], 4), ([6, 5, 10, 2], 4), ([16, 16, 32, 1], 32), ([5, 3, 7, 1], 1),
                     ([4, 4, 6, 1], 4)]:
    def _build_group_norm(ctx, ne=_ne, groups=_groups):
        a = ggml.new_tensor(ctx, T.F32, ne)
        return ggml.group_norm(ctx, a, groups, 1e-6), [a]
    case("group_norm", f"ne={_ne},n_groups={_groups}", _build_group_norm,
         lambda x, groups=_groups: group_norm_ref(x, groups, 1e-6))


def _build_group_norm_permuted(ctx):
    a0 = ggml.new_tensor_4d(ctx, T.F32, 8, 6, 5, 2)
    return ggml.group_norm(ctx, ggml.permute(ctx, a0, 0, 2, 1, 3), 3, 1e-5), [a0]


case("group_norm", "permuted (0,2,1,3)", _build_group_norm_permuted,
     lambda x: group_norm_ref(ggml_permute(x, (0, 2, 1, 3)), 3, 1e-5))


# decode shapes (one token's row: the CPU's numba kernels) and a node past their size limit
for _name in ("norm", "rms_norm"):
    _op, _, _ref = ROW_NORMS[_name]
    for _ne in ([1024, 1, 1, 1], [1024, 300, 1, 1]):
        def _build_decode(ctx, op=_op, ne=_ne):
            a = ggml.new_tensor(ctx, T.F32, ne)
            return op(ctx, a, 1e-5), [a]
        case(_name, f"decode,ne={_ne}", _build_decode, lambda x, ref=_ref: ref(x, 1e-5),
             init={0: uniform(-3, 3)})
