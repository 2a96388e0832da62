"""Cases: REPEAT, CONCAT (every dim, non-contiguous inputs), PAD (end, both sides, circular),
ARANGE, DIAG_MASK_INF and DIAG_MASK_ZERO. All exact but the arange with an inexact step."""
from __future__ import annotations

import numpy as np
import torch

import torchggml as ggml
from .values import T, randint, ggml_permute
from .table import CaseTable

CASES = CaseTable()
case = CASES.case

_INT_INIT = {0: randint(-100, 100), 1: randint(-100, 100)}


def _init_for(type):
    return _INT_INIT if type == T.I32 else None


# ---------------------------------------------------------------- REPEAT

for _type in (T.F32, T.F16, T.I32):
    for _ne_a, _reps in [([3, 2, 1, 1], [2, 2, 3, 2]), ([4, 1, 2, 1], [2, 3, 1, 2]), ([5, 3, 2, 2], [1, 1, 1, 1]),
                         ([1, 1, 1, 1], [7, 3, 2, 1])]:
        def _build_repeat(ctx, type=_type, ne_a=_ne_a, reps=_reps):
            a = ggml.new_tensor(ctx, type, ne_a)
            b = ggml.new_tensor(ctx, type, [n * r for n, r in zip(ne_a, reps)])
            return ggml.repeat(ctx, a, b), [a]
        case("repeat", f"type={_type.name},ne_a={_ne_a},reps={_reps}", _build_repeat,
             lambda a, reps=_reps: a.repeat(*reversed(reps)), max_nmse=0, init=_init_for(_type))


def _build_repeat_transposed(ctx):
    a = ggml.new_tensor_2d(ctx, T.F32, 3, 4)
    return ggml.repeat_4d(ctx, ggml.transpose(ctx, a), 8, 6, 2, 1), [a]


case("repeat", "repeat_4d of a transposed source", _build_repeat_transposed,
     lambda a: a.transpose(-1, -2).repeat(1, 2, 2, 2), max_nmse=0)


# ---------------------------------------------------------------- CONCAT

_NE = [6, 5, 4, 3]
for _dim in range(4):
    for _type in (T.F32, T.F16, T.I32):
        def _build_concat(ctx, dim=_dim, type=_type):
            ne_b = list(_NE)
            ne_b[dim] = 2
            a = ggml.new_tensor(ctx, type, _NE)
            b = ggml.new_tensor(ctx, type, ne_b)
            return ggml.concat(ctx, a, b, dim), [a, b]
        case("concat", f"dim={_dim},type={_type.name}", _build_concat,
             lambda a, b, dim=_dim: torch.cat([a, b], dim=3 - dim), max_nmse=0, init=_init_for(_type))

    def _build_concat_noncont(ctx, dim=_dim):
        # a transposed, b permuted: both non-contiguous views with the same logical shape rules
        ne = [5, 6, 4, 3]
        a = ggml.new_tensor(ctx, T.F32, ne)                       # transposed -> [6, 5, 4, 3]
        ne_b = [6, 5, 4, 3]
        ne_b[dim] = 2
        b_root = ggml.new_tensor(ctx, T.F32, [ne_b[2], ne_b[0], ne_b[1], ne_b[3]])
        b = ggml.permute(ctx, b_root, 2, 0, 1, 3)                 # -> ne_b
        return ggml.concat(ctx, ggml.transpose(ctx, a), b, dim), [a, b_root]
    case("concat", f"dim={_dim},non-contiguous a and b", _build_concat_noncont,
         lambda a, b, dim=_dim: torch.cat([a.transpose(-1, -2), ggml_permute(b, (2, 0, 1, 3))], dim=3 - dim),
         max_nmse=0)


# ---------------------------------------------------------------- PAD

def _np_pad(x, pads, mode):
    """pads (lp0, rp0, ..., lp3, rp3) over ggml dims, applied with numpy over torch dims."""
    widths = [(pads[2 * d], pads[2 * d + 1]) for d in reversed(range(4))]
    return torch.from_numpy(np.pad(x.numpy(), widths, mode=mode))


for _type in (T.F32, T.F16, T.I32):
    def _build_pad(ctx, type=_type):
        a = ggml.new_tensor_3d(ctx, type, 7, 5, 3)
        return ggml.pad(ctx, a, 3, 2, 1, 2), [a]
    case("pad", f"end,type={_type.name}", _build_pad, lambda a: _np_pad(a, [0, 3, 0, 2, 0, 1, 0, 2], "constant"),
         max_nmse=0, init=_init_for(_type))

for _pads in [(1, 2, 0, 3, 2, 0, 1, 1), (0, 0, 4, 0, 0, 0, 0, 0), (3, 3, 1, 1, 1, 1, 0, 0)]:
    def _build_pad_ext(ctx, pads=_pads):
        a = ggml.new_tensor_4d(ctx, T.F32, 6, 4, 3, 2)
        return ggml.pad_ext(ctx, a, *pads), [a]
    case("pad", f"pad_ext{_pads}", _build_pad_ext, lambda a, pads=_pads: _np_pad(a, pads, "constant"), max_nmse=0)

    def _build_pad_circular(ctx, pads=_pads):
        a = ggml.new_tensor_4d(ctx, T.F32, 6, 4, 3, 2)
        return ggml.pad_ext_circular(ctx, a, *pads), [a]
    case("pad", f"circular{_pads}", _build_pad_circular, lambda a, pads=_pads: _np_pad(a, pads, "wrap"), max_nmse=0)


def _build_pad_transposed(ctx):
    a = ggml.new_tensor_2d(ctx, T.F32, 5, 8)
    return ggml.pad_ext(ctx, ggml.transpose(ctx, a), 1, 2, 2, 1, 0, 1, 0, 0), [a]


case("pad", "transposed source", _build_pad_transposed,
     lambda a: _np_pad(a.transpose(-1, -2).contiguous(), [1, 2, 2, 1, 0, 1, 0, 0], "constant"), max_nmse=0)


# ---------------------------------------------------------------- ARANGE (no inputs)

def _arange_ref(start, stop, step):
    """start + step * i over float32-rounded parameters (ggml keeps them as float32)."""
    start, step = float(np.float32(start)), float(np.float32(step))
    n = int(np.ceil((np.float32(stop) - np.float32(start)) / np.float32(step)))
    return lambda: start + step * torch.arange(n, dtype=torch.float64)


for _start, _stop, _step, _exact in [(0, 10, 1, True), (0.5, 8, 0.25, True), (-3, 3, 0.5, True),
                                     (-1.3, 2.9, 0.1, False), (0, 1, 0.1, False)]:
    def _build_arange(ctx, start=_start, stop=_stop, step=_step):
        return ggml.arange(ctx, start, stop, step), []
    case("arange", f"start={_start},stop={_stop},step={_step}", _build_arange,
         _arange_ref(_start, _stop, _step), max_nmse=0 if _exact else 1e-7)


# ---------------------------------------------------------------- DIAG_MASK_INF / ZERO

def _diag_mask_ref(n_past, value):
    def ref(a):
        i0 = torch.arange(a.shape[-1])
        i1 = torch.arange(a.shape[-2])
        return a.masked_fill(i0[None, :] > n_past + i1[:, None], value)
    return ref


for _name, _value in [("diag_mask_inf", float("-inf")), ("diag_mask_zero", 0.0)]:
    for _type in (T.F32, T.F16):
        for _ne, _n_past in [([8, 8, 3, 1], 0), ([10, 6, 2, 2], 3), ([5, 9, 1, 1], 0)]:
            def _build_mask(ctx, name=_name, type=_type, ne=_ne, n_past=_n_past):
                a = ggml.new_tensor(ctx, type, ne)
                return getattr(ggml, name)(ctx, a, n_past), [a]
            case(_name, f"type={_type.name},ne={_ne},n_past={_n_past}", _build_mask,
                 _diag_mask_ref(_n_past, _value), max_nmse=0)

    def _build_mask_inplace(ctx, name=_name):
        a = ggml.new_tensor_3d(ctx, T.F32, 6, 6, 2)
        return getattr(ggml, name + "_inplace")(ctx, ggml.dup(ctx, a), 1), [a]
    case(_name, "inplace", _build_mask_inplace, _diag_mask_ref(1, _value), max_nmse=0)
