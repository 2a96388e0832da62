"""Cases: UNARY, every ggml_unary_op: F32/F16/BF16, contiguous, permuted rows, in-place, and a
wide input range where the op has tails worth checking. References are the formulas in float64.
"""
from __future__ import annotations

import math

import torch

import torchggml as ggml
from .values import T, FLOAT_TYPES, uniform, rounded, ggml_permute
from .table import CaseTable

CASES = CaseTable()
case = CASES.case

U = ggml.UnaryOp
SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)


def _gelu(x):
    return 0.5 * x * (1.0 + torch.tanh(SQRT_2_OVER_PI * x * (1.0 + 0.044715 * x * x)))


def _round_half_away(x):
    return torch.sign(x) * torch.floor(x.abs() + 0.5)


def _hardsigmoid(x):
    return torch.clamp((x + 3.0) / 6.0, 0.0, 1.0)


# op -> (float64 reference, exact?)
REFERENCES = {
    U.ABS: (torch.abs, True),
    U.SGN: (torch.sign, True),
    U.NEG: (torch.neg, True),
    U.STEP: (lambda x: (x > 0).double(), True),
    U.TANH: (torch.tanh, False),
    U.ELU: (lambda x: torch.where(x > 0, x, torch.expm1(x)), False),
    U.RELU: (lambda x: x.clamp(min=0), True),
    U.SIGMOID: (lambda x: 1.0 / (1.0 + torch.exp(-x)), False),
    U.GELU: (_gelu, False),
    U.GELU_QUICK: (lambda x: x / (1.0 + torch.exp(-1.702 * x)), False),
    U.SILU: (lambda x: x / (1.0 + torch.exp(-x)), False),
    U.HARDSWISH: (lambda x: x * _hardsigmoid(x), False),
    U.HARDSIGMOID: (_hardsigmoid, False),
    U.EXP: (torch.exp, False),
    U.GELU_ERF: (lambda x: 0.5 * x * (1.0 + torch.erf(x / math.sqrt(2.0))), False),
    U.FLOOR: (torch.floor, True),
    U.CEIL: (torch.ceil, True),
    U.ROUND: (_round_half_away, True),
    U.TRUNC: (torch.trunc, True),
    U.EXPM1: (torch.expm1, False),
    U.SOFTPLUS: (lambda x: torch.where(x > 20, x, torch.log1p(torch.exp(x))), False),
}

# rounding ops see many exact halves (multiples of 0.25 in [-4, 4]): round must take them away from 0
_QUARTERS = {0: lambda t, gen: torch.randint(-16, 17, tuple(reversed(t.ne)), generator=gen).double() / 4}
_ROUNDING = {U.FLOOR, U.CEIL, U.ROUND, U.TRUNC}


def _unary_cases(op, ref, exact):
    name = op.name.lower()
    build_fn = getattr(ggml, name)
    nmse = 0 if exact else 1e-7
    init = _QUARTERS if op in _ROUNDING else None
    for type in FLOAT_TYPES:
        def build(ctx, type=type):
            a = ggml.new_tensor_4d(ctx, type, 16, 5, 3, 2)
            return build_fn(ctx, a), [a]
        case(name, f"type={type.name}", build, lambda a, type=type: rounded(type, ref(a)),
             max_nmse=nmse, init=init)

    def build_permuted(ctx):
        # rows stay contiguous (ggml's requirement), dims 1 and 2 swap
        a = ggml.new_tensor_4d(ctx, T.F32, 12, 4, 5, 2)
        return build_fn(ctx, ggml.permute(ctx, a, 0, 2, 1, 3)), [a]
    case(name, "permuted rows", build_permuted, lambda a: ref(ggml_permute(a, (0, 2, 1, 3))),
         max_nmse=nmse, init=init)

    def build_inplace(ctx):
        a = ggml.new_tensor_2d(ctx, T.F32, 20, 6)
        return getattr(ggml, name + "_inplace")(ctx, ggml.dup(ctx, a)), [a]
    case(name, "inplace", build_inplace, ref, max_nmse=nmse, init=init)

    if op not in _ROUNDING:
        def build_wide(ctx):
            a = ggml.new_tensor_2d(ctx, T.F32, 64, 8)
            return build_fn(ctx, a), [a]
        # float32 math against float64 errs by ~1e-14 here: a bound tighter than the default
        # tells close formulas apart (ggml's tanh GELU from the erf one differs by ~1e-9)
        case(name, "range [-8, 8]", build_wide, ref, max_nmse=0 if exact else 1e-11,
             init={0: uniform(-8, 8)})


for _op, (_ref, _exact) in REFERENCES.items():
    _unary_cases(_op, _ref, _exact)


def _softplus(x):
    return x if x > 20 else math.log1p(math.exp(x))


def _xielu_ref(alpha_n, alpha_p, beta, eps):
    an, ap = beta + _softplus(alpha_n), _softplus(alpha_p)

    def ref(x):
        negative = (torch.expm1(torch.clamp(x, max=eps)) - x) * an + beta * x
        return torch.where(x > 0, ap * x * x + beta * x, negative)
    return ref


for _params in [(0.8, 0.8, 0.5, -1e-6), (-0.3, 1.5, 0.25, 0.1)]:
    for _type in (T.F32, T.F16):
        def _build_xielu(ctx, params=_params, type=_type):
            a = ggml.new_tensor_3d(ctx, type, 32, 4, 3)
            return ggml.xielu(ctx, a, *params), [a]
        case("xielu", f"type={_type.name},alpha_n,alpha_p,beta,eps={_params}", _build_xielu,
             lambda a, params=_params, type=_type: rounded(type, _xielu_ref(*params)(a)),
             init={0: uniform(-3, 3)})
