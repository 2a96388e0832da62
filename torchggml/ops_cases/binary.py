"""Cases: ADD, SUB, MUL, DIV with broadcast and non-contiguous sources; MUL_MAT core shapes."""
from __future__ import annotations

import torch

import torchggml as ggml
from ..testing import case, NMSE_MUL_MAT

T = ggml.Type


def tile(b, like):
    return b.repeat(*[s // bs for s, bs in zip(like.shape, b.shape)])


_REF = {"add": torch.add, "sub": torch.sub, "mul": torch.mul, "div": torch.div}

for name, ref in _REF.items():
    for type in (T.F32, T.F16):
        for ne_a, ne_b in [([32, 4, 3, 2], [32, 4, 3, 2]), ([32, 4, 3, 2], [32, 1, 1, 1]),
                           ([32, 4, 3, 2], [16, 2, 3, 1]), ([33, 5, 1, 1], [1, 5, 1, 1])]:
            def build(ctx, name=name, type=type, ne_a=ne_a, ne_b=ne_b):
                a = ggml.new_tensor(ctx, type, ne_a)
                b = ggml.new_tensor(ctx, type, ne_b)
                return getattr(ggml, name)(ctx, a, b), [a, b]
            init = {1: (lambda t, g: torch.rand(tuple(reversed(t.ne)), generator=g) + 0.5)} if name == "div" else None
            case(name, f"type={type.name},ne_a={ne_a},ne_b={ne_b}", build,
                 lambda a, b, ref=ref: ref(a, tile(b, a)), init=init,
                 max_nmse=1e-7 if type == T.F32 else 1e-6)

    def build_permuted(ctx, name=name):
        a = ggml.new_tensor_3d(ctx, T.F32, 8, 6, 4)
        b = ggml.new_tensor_3d(ctx, T.F32, 6, 8, 4)
        return getattr(ggml, name)(ctx, a, ggml.transpose(ctx, b)), [a, b]
    case(name, "non-contiguous b", build_permuted, lambda a, b, ref=ref: ref(a, b.transpose(-1, -2)),
         init={1: (lambda t, g: torch.rand(tuple(reversed(t.ne)), generator=g) + 0.5)} if name == "div" else None)


def _mul_mat_ref(a, b):
    r2, r3 = b.shape[1] // a.shape[1], b.shape[0] // a.shape[0]
    a = a.repeat_interleave(r2, dim=1).repeat_interleave(r3, dim=0)
    return b @ a.transpose(-1, -2)


for type_a in (T.F32, T.F16, T.BF16, T.Q4_0, T.Q8_0):
    for type_b in (T.F32, T.F16):
        for m, n, k, bs in [(16, 1, 64, [1, 1]), (7, 9, 96, [1, 1]), (8, 5, 64, [3, 2]), (4, 3, 32, [2, 1])]:
            for r in ([1, 1], [2, 1], [1, 2]):
                if r != [1, 1] and bs == [1, 1]:
                    continue
                def build(ctx, type_a=type_a, type_b=type_b, m=m, n=n, k=k, bs=bs, r=r):
                    a = ggml.new_tensor_4d(ctx, type_a, k, m, bs[0], bs[1])
                    b = ggml.new_tensor_4d(ctx, type_b, k, n, bs[0] * r[0], bs[1] * r[1])
                    return ggml.mul_mat(ctx, a, b), [a, b]
                case("mul_mat", f"type_a={type_a.name},type_b={type_b.name},m={m},n={n},k={k},bs={bs},nr={r}",
                     build, _mul_mat_ref, max_nmse=NMSE_MUL_MAT)
