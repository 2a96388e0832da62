"""Cases: ADD, SUB, MUL, DIV (every broadcast, F32/F16/BF16, mixed types, non-contiguous a and b,
in-place), ADD on a block-type a, ADD1, ADD_ID.
"""
from __future__ import annotations

import torch

import torchggml as ggml
from .values import T, FLOAT_TYPES, uniform, randint, rounded, ggml_permute, tile, quantized_roundtrip
from .table import CaseTable

CASES = CaseTable()
case = CASES.case

# ---------------------------------------------------------------- ADD, SUB, MUL, DIV

_REF = {"add": torch.add, "sub": torch.sub, "mul": torch.mul, "div": torch.div}
_POSITIVE_B = {1: uniform(0.5, 1.5)}  # divisors away from zero

# b broadcast to a by tiling: same shape, every dim alone at 1, all at 1, and true tiling
_BROADCASTS = [
    ([32, 4, 3, 2], [32, 4, 3, 2]),
    ([32, 4, 3, 2], [1, 4, 3, 2]),
    ([32, 4, 3, 2], [32, 1, 3, 2]),
    ([32, 4, 3, 2], [32, 4, 1, 2]),
    ([32, 4, 3, 2], [32, 4, 3, 1]),
    ([32, 4, 3, 2], [1, 1, 1, 1]),
    ([32, 4, 3, 2], [16, 2, 3, 1]),
    ([33, 5, 1, 1], [1, 5, 1, 1]),
    ([1024, 1, 1, 1], [1024, 1, 1, 1]),  # decode's residual add / norm weight (CPU: numba)
    ([1024, 16, 1, 1], [1024, 1, 1, 1]),  # a micro-batch's rows (CPU: torch, past numba's limit)
]


def _binary_cases(name, ref):
    init = _POSITIVE_B if name == "div" else None
    fn = getattr(ggml, name)
    for type in FLOAT_TYPES:
        for ne_a, ne_b in _BROADCASTS:
            def build(ctx, type=type, ne_a=ne_a, ne_b=ne_b):
                a = ggml.new_tensor(ctx, type, ne_a)
                b = ggml.new_tensor(ctx, type, ne_b)
                return fn(ctx, a, b), [a, b]
            case(name, f"type={type.name},ne_a={ne_a},ne_b={ne_b}", build,
                 lambda a, b, type=type: rounded(type, ref(a, tile(b, a))), init=init)

    # mixed types as ggml's CPU backend takes them: F16/BF16 a with an F32 b
    for type in (T.F16, T.BF16):
        def build_mixed(ctx, type=type):
            a = ggml.new_tensor_3d(ctx, type, 16, 5, 3)
            b = ggml.new_tensor_3d(ctx, T.F32, 16, 5, 1)
            return fn(ctx, a, b), [a, b]
        case(name, f"type_a={type.name},type_b=F32", build_mixed,
             lambda a, b, type=type: rounded(type, ref(a, tile(b, a))), init=init)

    def build_b_transposed(ctx):
        a = ggml.new_tensor_3d(ctx, T.F32, 8, 6, 4)
        b = ggml.new_tensor_3d(ctx, T.F32, 6, 8, 4)
        return fn(ctx, a, ggml.transpose(ctx, b)), [a, b]
    case(name, "non-contiguous b", build_b_transposed,
         lambda a, b: ref(a, b.transpose(-1, -2)), init=init)

    def build_a_permuted(ctx):
        a = ggml.new_tensor_4d(ctx, T.F32, 4, 3, 8, 2)
        b = ggml.new_tensor_4d(ctx, T.F32, 3, 1, 4, 2)
        return fn(ctx, ggml.permute(ctx, a, 2, 0, 1, 3), b), [a, b]
    case(name, "non-contiguous a, broadcast b", build_a_permuted,
         lambda a, b: ref(ggml_permute(a, (2, 0, 1, 3)), tile(b, ggml_permute(a, (2, 0, 1, 3)))),
         init=init)

    def build_inplace(ctx):
        a = ggml.new_tensor_3d(ctx, T.F32, 16, 5, 3)
        b = ggml.new_tensor_3d(ctx, T.F32, 16, 1, 3)
        # an in-place op overwrites its first source: give it a copy so the input stays readable
        return getattr(ggml, name + "_inplace")(ctx, ggml.dup(ctx, a), b), [a, b]
    case(name, "inplace", build_inplace, lambda a, b: ref(a, tile(b, a)), init=init)


for _name, _ref in _REF.items():
    _binary_cases(_name, _ref)


def _quantized_add_cases():
    for qtype in (T.Q8_0, T.Q4_0):
        def build_to_f32(ctx, qtype=qtype):
            a = ggml.new_tensor_2d(ctx, qtype, 64, 3)
            b = ggml.new_tensor_2d(ctx, T.F32, 64, 3)
            return ggml.add_cast(ctx, a, b, T.F32), [a, b]
        case("add", f"type_a={qtype.name},type_b=F32,out=F32", build_to_f32, torch.add)

        def build_requantized(ctx, qtype=qtype):
            a = ggml.new_tensor_2d(ctx, qtype, 64, 3)
            b = ggml.new_tensor_2d(ctx, T.F32, 64, 1)
            return ggml.add(ctx, a, b), [a, b]
        # ggml adds into dequantized rows and quantizes the sums again: the bytes must match gguf's
        case("add", f"type_a={qtype.name},type_b=F32,out={qtype.name}", build_requantized,
             lambda a, b, qtype=qtype: quantized_roundtrip(qtype, a + b), max_nmse=0)


_quantized_add_cases()


# ---------------------------------------------------------------- ADD1, ADD_ID

for _type in (T.F32, T.F16, T.BF16):
    def _build_add1(ctx, type=_type):
        a = ggml.new_tensor_3d(ctx, type, 16, 5, 3)
        b = ggml.new_tensor_1d(ctx, type, 1)
        return ggml.add1(ctx, a, b), [a, b]
    case("add1", f"type={_type.name}", _build_add1, lambda a, b, type=_type: rounded(type, a + b))


def _build_add1_inplace(ctx):
    a = ggml.new_tensor_2d(ctx, T.F32, 10, 4)
    b = ggml.new_tensor_1d(ctx, T.F32, 1)
    return ggml.add1_inplace(ctx, ggml.dup(ctx, a), b), [a, b]


case("add1", "inplace", _build_add1_inplace, lambda a, b: a + b)


def _add_id_ref(a, b, ids):
    """a[:, i1, i2] + b[:, ids[i1, i2]] in torch order: b's rows gathered by the ids."""
    return a + b[0, 0][ids[0, 0]]


for _ne0, _n_used, _n_tokens, _n_expert in [(16, 2, 5, 4), (32, 4, 3, 8), (7, 1, 6, 3)]:
    def _build_add_id(ctx, ne0=_ne0, n_used=_n_used, n_tokens=_n_tokens, n_expert=_n_expert):
        a = ggml.new_tensor_3d(ctx, T.F32, ne0, n_used, n_tokens)
        b = ggml.new_tensor_2d(ctx, T.F32, ne0, n_expert)
        ids = ggml.new_tensor_2d(ctx, T.I32, n_used, n_tokens)
        return ggml.add_id(ctx, a, b, ids), [a, b, ids]
    case("add_id", f"ne0={_ne0},n_used={_n_used},n_tokens={_n_tokens},n_expert={_n_expert}",
         _build_add_id, _add_id_ref, init={2: randint(0, _n_expert)})


def _build_add_id_strided(ctx):
    # a's rows strided (a view of every other row of a bigger tensor), as mul_mat_id outputs are
    big = ggml.new_tensor_3d(ctx, T.F32, 16, 6, 4)
    a = ggml.view_3d(ctx, big, 16, 3, 4, big.nb[1] * 2, big.nb[2], 0)
    b = ggml.new_tensor_2d(ctx, T.F32, 16, 5)
    ids = ggml.new_tensor_2d(ctx, T.I32, 3, 4)
    return ggml.add_id(ctx, a, b, ids), [big, b, ids]


case("add_id", "strided rows of a", _build_add_id_strided,
     lambda big, b, ids: _add_id_ref(big[:, :, ::2, :], b, ids), init={2: randint(0, 5)})

