"""Cases: SQR, SQRT, LOG, SIN, COS, SCALE (with bias), CLAMP, LEAKY_RELU: F32/F16/BF16,
non-contiguous sources where the builder takes them, and in-place forms."""
from __future__ import annotations

import torch

import torchggml as ggml
from .values import T, FLOAT_TYPES, uniform, rounded
from .table import CaseTable

CASES = CaseTable()
case = CASES.case

# op -> (float64 reference, input range)
_MATH = {
    "sqr": (lambda x: x * x, (-1, 1)),
    "sqrt": (torch.sqrt, (0, 2)),
    "log": (torch.log, (0.05, 3)),
    "sin": (torch.sin, (-6.3, 6.3)),
    "cos": (torch.cos, (-6.3, 6.3)),
}


def _math_cases(name, ref, lo, hi):
    fn = getattr(ggml, name)
    init = {0: uniform(lo, hi)}
    for type in FLOAT_TYPES:
        def build(ctx, type=type):
            a = ggml.new_tensor_4d(ctx, type, 16, 5, 3, 2)
            return fn(ctx, a), [a]
        case(name, f"type={type.name}", build, lambda a, type=type: rounded(type, ref(a)), init=init)

    def build_transposed(ctx):
        a = ggml.new_tensor_3d(ctx, T.F32, 7, 9, 2)
        return fn(ctx, ggml.transpose(ctx, a)), [a]
    case(name, "transposed", build_transposed, lambda a: ref(a.transpose(-1, -2)), init=init)

    def build_inplace(ctx):
        a = ggml.new_tensor_2d(ctx, T.F32, 20, 6)
        return getattr(ggml, name + "_inplace")(ctx, ggml.dup(ctx, a)), [a]
    case(name, "inplace", build_inplace, ref, init=init)


for _name, (_ref, (_lo, _hi)) in _MATH.items():
    _math_cases(_name, _ref, _lo, _hi)


# ---------------------------------------------------------------- SCALE

for _type in FLOAT_TYPES:
    for _s, _b in [(0.37, 0.0), (1.5, -0.25)]:
        def _build_scale(ctx, type=_type, s=_s, b=_b):
            a = ggml.new_tensor_4d(ctx, type, 16, 5, 3, 2)
            return (ggml.scale(ctx, a, s) if b == 0 else ggml.scale_bias(ctx, a, s, b)), [a]
        case("scale", f"type={_type.name},s={_s},b={_b}", _build_scale,
             lambda a, type=_type, s=_s, b=_b: rounded(type, a * s + b))


def _build_scale_strided(ctx):
    # rows of a view are strided (ggml takes "padded 1d" tensors: only the rows may be spaced)
    big = ggml.new_tensor_2d(ctx, T.F32, 20, 6)
    return ggml.scale(ctx, ggml.view_2d(ctx, big, 16, 6, big.nb[1], 0), -2.0), [big]


def _build_scale_inplace(ctx):
    a = ggml.new_tensor_2d(ctx, T.F32, 16, 6)
    return ggml.scale_bias_inplace(ctx, ggml.dup(ctx, a), 0.5, 1.0), [a]


case("scale", "strided rows", _build_scale_strided, lambda big: big[..., :16] * -2.0)
case("scale", "inplace", _build_scale_inplace, lambda a: a * 0.5 + 1.0)


# ---------------------------------------------------------------- CLAMP (a view of its source in ggml)

def _clamp_ref(lo, hi):
    # ggml's order: max(min(x, hi), lo), so lo wins when lo > hi
    return lambda a: torch.maximum(torch.minimum(a, torch.tensor(hi, dtype=a.dtype)),
                                   torch.tensor(lo, dtype=a.dtype))


for _type in FLOAT_TYPES:
    for _lo, _hi in [(-0.5, 0.25), (0.5, -0.5)]:
        def _build_clamp(ctx, type=_type, lo=_lo, hi=_hi):
            a = ggml.new_tensor_3d(ctx, type, 16, 5, 3)
            # clamp writes into its source: give it a copy so the input stays readable
            return ggml.clamp(ctx, ggml.dup(ctx, a), lo, hi), [a]
        case("clamp", f"type={_type.name},min={_lo},max={_hi}", _build_clamp,
             lambda a, type=_type, lo=_lo, hi=_hi: rounded(type, _clamp_ref(lo, hi)(a)), max_nmse=0)


# ---------------------------------------------------------------- LEAKY_RELU

for _type in FLOAT_TYPES:
    def _build_leaky(ctx, type=_type):
        a = ggml.new_tensor_3d(ctx, type, 16, 5, 3)
        return ggml.leaky_relu(ctx, a, 0.1, False), [a]
    case("leaky_relu", f"type={_type.name}", _build_leaky,
         lambda a, type=_type: rounded(type, torch.where(a > 0, a, 0.1 * a)))


def _build_leaky_inplace(ctx):
    a = ggml.new_tensor_2d(ctx, T.F32, 16, 6)
    return ggml.leaky_relu(ctx, ggml.dup(ctx, a), 0.01, True), [a]


case("leaky_relu", "inplace", _build_leaky_inplace, lambda a: torch.where(a > 0, a, 0.01 * a))
