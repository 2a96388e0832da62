"""Cases: GLU in fused (row halves, optionally swapped) and split forms for every ggml_glu_op,
F32/F16/BF16, strided rows, an odd fused row (its last column unused), and swiglu_oai's clamps."""
from __future__ import annotations

import torch

import torchggml as ggml
from .values import T, FLOAT_TYPES, uniform, rounded
from .table import CaseTable
from .unary import REFERENCES

CASES = CaseTable()
case = CASES.case

U = ggml.UnaryOp

# op name -> float64 activation of x; the result is act(x) * gate
ACTIVATIONS = {
    "reglu": REFERENCES[U.RELU][0],
    "geglu": REFERENCES[U.GELU][0],
    "swiglu": REFERENCES[U.SILU][0],
    "geglu_erf": REFERENCES[U.GELU_ERF][0],
    "geglu_quick": REFERENCES[U.GELU_QUICK][0],
}


def _fused_ref(act, swapped=False):
    def ref(a):
        n = a.shape[-1] // 2
        x, g = a[..., :n], a[..., n:2 * n]
        if swapped:
            x, g = g, x
        return act(x) * g
    return ref


def _glu_cases(name, act):
    fused, swapped, split = (getattr(ggml, name), getattr(ggml, name + "_swapped"),
                             getattr(ggml, name + "_split"))
    for type in FLOAT_TYPES:
        def build_fused(ctx, type=type):
            a = ggml.new_tensor_3d(ctx, type, 32, 5, 3)
            return fused(ctx, a), [a]
        case(name, f"fused,type={type.name}", build_fused,
             lambda a, type=type: rounded(type, _fused_ref(act)(a)))

        def build_split(ctx, type=type):
            a = ggml.new_tensor_3d(ctx, type, 16, 5, 3)
            b = ggml.new_tensor_3d(ctx, type, 16, 5, 3)
            return split(ctx, a, b), [a, b]
        case(name, f"split,type={type.name}", build_split,
             lambda a, b, type=type: rounded(type, act(a) * b))

    def build_swapped(ctx):
        a = ggml.new_tensor_3d(ctx, T.F32, 32, 5, 3)
        return swapped(ctx, a), [a]
    case(name, "fused,swapped", build_swapped, _fused_ref(act, swapped=True))

    def build_strided(ctx):
        # every row of `a` is the first 32 of 40 columns: strided rows, dims 2 and 3 packed
        big = ggml.new_tensor_3d(ctx, T.F32, 40, 5, 3)
        a = ggml.view_3d(ctx, big, 32, 5, 3, big.nb[1], big.nb[2], 0)
        return fused(ctx, a), [big]
    case(name, "fused,strided rows", build_strided, lambda big: _fused_ref(act)(big[..., :32]))

    def build_odd(ctx):
        a = ggml.new_tensor_2d(ctx, T.F32, 33, 4)
        return fused(ctx, a), [a]
    case(name, "fused,odd ne0=33", build_odd, _fused_ref(act), init={0: uniform(-4, 4)})


for _name, _act in ACTIVATIONS.items():
    _glu_cases(_name, _act)


def _swiglu_oai_ref(alpha, limit):
    def ref(x, g):
        x = x.clamp(max=limit)
        g = g.clamp(-limit, limit)
        return x / (1.0 + torch.exp(-alpha * x)) * (g + 1.0)
    return ref


for _alpha, _limit in [(1.702, 7.0), (1.0, 2.5)]:
    _ref = _swiglu_oai_ref(_alpha, _limit)
    for _type in (T.F32, T.F16):
        def _build_oai_split(ctx, alpha=_alpha, limit=_limit, type=_type):
            a = ggml.new_tensor_3d(ctx, type, 16, 5, 3)
            b = ggml.new_tensor_3d(ctx, type, 16, 5, 3)
            return ggml.swiglu_oai(ctx, a, b, alpha, limit), [a, b]
        # inputs beyond +-limit exercise both clamps
        case("swiglu_oai", f"split,type={_type.name},alpha={_alpha},limit={_limit}", _build_oai_split,
             lambda a, b, ref=_ref, type=_type: rounded(type, ref(a, b)),
             init={0: uniform(-10, 10), 1: uniform(-10, 10)})

    def _build_oai_fused(ctx, alpha=_alpha, limit=_limit):
        a = ggml.new_tensor_3d(ctx, T.F32, 32, 5, 3)
        return ggml.swiglu_oai(ctx, a, None, alpha, limit), [a]
    case("swiglu_oai", f"fused,alpha={_alpha},limit={_limit}", _build_oai_fused,
         lambda a, ref=_ref: ref(a[..., :16], a[..., 16:]), init={0: uniform(-10, 10)})



def _build_swiglu_decode(ctx):  # one token's FFN row (the CPU's numba kernel), wide inputs
    a = ggml.new_tensor_1d(ctx, T.F32, 2816)
    b = ggml.new_tensor_1d(ctx, T.F32, 2816)
    return ggml.swiglu_split(ctx, a, b), [a, b]


case("swiglu", "split,decode ne0=2816", _build_swiglu_decode, lambda a, b: ACTIVATIONS["swiglu"](a) * b,
     init={0: uniform(-20, 20), 1: uniform(-2, 2)})
