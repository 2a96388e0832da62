"""Cases: MUL_MAT (every broadcast rule, every readable src0 type, F32/F16 src1, permuted,
transposed and row-strided views, the chunked big-weight path), MUL_MAT_ID, OUT_PROD.

Also `random_blocks`, an `init` for block types `quantize` cannot produce (K-quants, IQ types):
random bytes with sane fp16 scales, so every block dequantizes to finite values.
"""
from __future__ import annotations

import torch

import torchggml as ggml
from .values import randint, ggml_permute
from .table import CaseTable, NMSE_MUL_MAT
from ...types import type_traits

CASES = CaseTable()
case = CASES.case

T = ggml.Type

# every block type the quants can dequantize, besides the Q8 types ggml only uses for activations
BLOCK_TYPES = (T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0, T.Q2_K, T.Q3_K, T.Q4_K, T.Q5_K, T.Q6_K,
               T.IQ2_XXS, T.IQ2_XS, T.IQ2_S, T.IQ3_XXS, T.IQ3_S, T.IQ1_S, T.IQ1_M, T.IQ4_NL,
               T.IQ4_XS, T.TQ1_0, T.TQ2_0, T.MXFP4, T.NVFP4, T.Q1_0, T.Q2_0)

# byte offsets of the fp16 scale fields inside one block (the ggml block layouts)
_F16_FIELDS = {
    T.Q2_K: (80, 82), T.Q3_K: (108,), T.Q4_K: (0, 2), T.Q5_K: (0, 2), T.Q6_K: (208,),
    T.IQ2_XXS: (0,), T.IQ2_XS: (0,), T.IQ2_S: (0,), T.IQ3_XXS: (0,), T.IQ3_S: (0,),
    T.IQ1_S: (0,), T.IQ4_XS: (0,),
}
_IQ1_M_SCALES = 48  # IQ1_M spreads its fp16 scale over the top nibbles of 4 uint16 at this offset


def needs_random_blocks(type) -> bool:
    from ...quants import quantize_types
    return type_traits(type).is_quantized and type not in quantize_types()


def random_blocks(t, gen: torch.Generator) -> torch.Tensor:
    """An `init` entry for block types: uint8 blocks [ne3, ne2, ne1, row_bytes], random bits with
    fp16 scales in [0.005, 0.01) so the values stay finite and of moderate size."""
    tr = type_traits(t.type)
    n_blocks = t.ne[0] * t.ne[1] * t.ne[2] * t.ne[3] // tr.blck_size
    blocks = torch.randint(0, 256, (n_blocks, tr.type_size), generator=gen, dtype=torch.uint8)
    scales = (torch.rand(n_blocks, generator=gen) * 0.005 + 0.005).half()
    if t.type == T.IQ1_M:
        bits = scales.view(torch.int16).int() & 0xFFFF
        for j in range(4):  # nibble j of the scale goes to the top nibble of uint16 j
            hi = _IQ1_M_SCALES + 2 * j + 1
            blocks[:, hi] = (blocks[:, hi] & 0x0F) | (((bits >> (4 * j)) & 0xF) << 4).to(torch.uint8)
    else:
        for offset in _F16_FIELDS[t.type]:
            blocks[:, offset:offset + 2] = scales.view(torch.uint8).view(n_blocks, 2)
    return blocks.view(t.ne[3], t.ne[2], t.ne[1], -1)


def inits_for(types_by_input: dict) -> dict:
    """The `init` table giving random blocks to the inputs whose type quantize cannot produce."""
    return {i: random_blocks for i, type in types_by_input.items() if needs_random_blocks(type)}


# ---------------------------------------------------------------- MUL_MAT

def mul_mat_ref(a, b):
    """b @ a^T per matrix, a repeat-interleaved over dims 2 and 3 (torch dims 1 and 0)."""
    r2, r3 = b.shape[1] // a.shape[1], b.shape[0] // a.shape[0]
    a = a.repeat_interleave(r2, dim=1).repeat_interleave(r3, dim=0)
    return b @ a.transpose(-1, -2)


def _mul_mat_case(type_a, type_b, m, n, k, bs=(1, 1), nr=(1, 1)):
    def build(ctx):
        a = ggml.new_tensor_4d(ctx, type_a, k, m, bs[0], bs[1])
        b = ggml.new_tensor_4d(ctx, type_b, k, n, bs[0] * nr[0], bs[1] * nr[1])
        return ggml.mul_mat(ctx, a, b), [a, b]
    case("mul_mat", f"type_a={type_a.name},type_b={type_b.name},m={m},n={n},k={k},bs={list(bs)},nr={list(nr)}",
         build, mul_mat_ref, max_nmse=NMSE_MUL_MAT, init=inits_for({0: type_a}))


# core shapes: vectors, odd sizes, batches, broadcast over dim 2, dim 3 and both
for _ta in (T.F32, T.F16, T.BF16, T.Q4_0, T.Q8_0):
    for _tb in (T.F32, T.F16):
        for _m, _n, _k, _bs in [(16, 1, 64, (1, 1)), (7, 9, 96, (1, 1)), (8, 5, 64, (3, 2)), (4, 3, 32, (2, 1))]:
            for _nr in ((1, 1), (2, 1), (1, 2)):
                if _nr == (1, 1) or _bs != (1, 1):
                    _mul_mat_case(_ta, _tb, _m, _n, _k, _bs, _nr)
    _mul_mat_case(_ta, T.F32, 6, 4, 64, (2, 2), (2, 3))

# every block type: a vector product, a broadcast batch, and an F16 src1
for _ta in BLOCK_TYPES:
    _k = max(256, type_traits(_ta).blck_size)
    _mul_mat_case(_ta, T.F32, 16, 1, _k)
    _mul_mat_case(_ta, T.F32, 8, 5, 2 * _k, (2, 1), (2, 1))
    _mul_mat_case(_ta, T.F16, 4, 3, _k)

# weights big enough to be converted in chunks (more than CHUNK_VALUES values)
for _ta in (T.Q8_0, T.F16):
    _mul_mat_case(_ta, T.F32, 2304, 3, 2048)


def _permuted_case(type_a, type_b, per, m=6, n=5, k=64, bs=(2, 3)):
    """a and b created in permuted order, then ggml.permute'd back: strided views of both, as
    test-backend-ops builds them (dim 0 stays in place for block types)."""
    ne_a, ne_b = [k, m, bs[0], bs[1]], [k, n, bs[0], bs[1]]

    def build(ctx):
        def permuted(type, ne):
            stored = [ne[per[i]] for i in range(4)]  # permute puts stored dim i at per[i]
            t = ggml.new_tensor_4d(ctx, type, *stored)
            return t, ggml.permute(ctx, t, *per)
        a0, a = permuted(type_a, ne_a)
        b0, b = permuted(type_b, ne_b)
        return ggml.mul_mat(ctx, a, b), [a0, b0]
    case("mul_mat", f"type_a={type_a.name},type_b={type_b.name},permuted={list(per)}", build,
         lambda a0, b0: mul_mat_ref(ggml_permute(a0, per), ggml_permute(b0, per)),
         max_nmse=NMSE_MUL_MAT, init=inits_for({0: type_a}))


def _transposed_b_case(type_a, m=8, n=6, k=64):
    """b is the transpose of an [n, k] matrix: columns strided (nb0 > nb1)."""
    def build(ctx):
        a = ggml.new_tensor_2d(ctx, type_a, k, m)
        b0 = ggml.new_tensor_2d(ctx, T.F32, n, k)
        return ggml.mul_mat(ctx, a, ggml.transpose(ctx, b0)), [a, b0]
    case("mul_mat", f"type_a={type_a.name},type_b=F32,b=transposed view", build,
         lambda a, b0: mul_mat_ref(a, b0.transpose(-1, -2)), max_nmse=NMSE_MUL_MAT)


def _row_view_case(type_a, type_b, m=7, n=4, k=64, k_big=96):
    """a and b are views of the first k values of wider rows (row stride > row size)."""
    def build(ctx):
        a0 = ggml.new_tensor_3d(ctx, type_a, k_big, m, 2)
        b0 = ggml.new_tensor_3d(ctx, type_b, k_big, n, 4)
        a = ggml.view_3d(ctx, a0, k, m, 2, a0.nb[1], a0.nb[2], 0)
        b = ggml.view_3d(ctx, b0, k, n, 4, b0.nb[1], b0.nb[2], 0)
        return ggml.mul_mat(ctx, a, b), [a0, b0]
    case("mul_mat", f"type_a={type_a.name},type_b={type_b.name},k={k} views of rows of {k_big}", build,
         lambda a0, b0: mul_mat_ref(a0[..., :k], b0[..., :k]), max_nmse=NMSE_MUL_MAT)


for _ta in (T.F32, T.F16, T.Q4_0, T.Q4_K):
    for _per in ((0, 2, 1, 3), (0, 1, 3, 2), (0, 3, 2, 1)):
        _permuted_case(_ta, T.F32, _per, k=256 if _ta == T.Q4_K else 64)
_permuted_case(T.F16, T.F16, (0, 2, 1, 3))
for _ta in (T.F32, T.F16, T.Q8_0):
    _transposed_b_case(_ta)
    _row_view_case(_ta, T.F32)
_row_view_case(T.F32, T.F16)


# decode's attention over an F16 KV cache (the CPU's numba kernel): KQ reads K heads as views of
# the cache's rows, q permuted, heads shared by groups of q heads (GQA); KQV multiplies V^T
def _kq_decode_case(n_kv, head_dim, n_head, n_head_kv, n_ctx=200):
    def build(ctx):
        cache = ggml.new_tensor_2d(ctx, T.F16, head_dim * n_head_kv, n_ctx)
        k = ggml.view_3d(ctx, cache, head_dim, n_kv, n_head_kv, cache.nb[1], head_dim * 2, 0)
        q0 = ggml.new_tensor_3d(ctx, T.F32, head_dim, n_head, 1)
        return ggml.mul_mat(ctx, k, ggml.permute(ctx, q0, 0, 2, 1, 3)), [cache, q0]

    def ref(cache, q0):
        k = cache[0, 0, :n_kv].reshape(n_kv, n_head_kv, head_dim).permute(1, 0, 2).unsqueeze(0)
        return mul_mat_ref(k, ggml_permute(q0, (0, 2, 1, 3)))
    case("mul_mat", f"KQ decode,n_kv={n_kv},head_dim={head_dim},heads={n_head}/{n_head_kv}", build, ref,
         max_nmse=NMSE_MUL_MAT)


for _n_kv, _hd, _h, _hkv in [(168, 64, 16, 16), (37, 128, 8, 2), (5, 32, 4, 1)]:
    _kq_decode_case(_n_kv, _hd, _h, _hkv)
    _mul_mat_case(T.F16, T.F32, _hd, 1, _n_kv, (_hkv, 1), (_h // _hkv, 1))  # KQV: V^T [n_kv, hd] per head
_mul_mat_case(T.F16, T.F32, 32, 2, 40, (2, 2), (2, 3))  # two rows, broadcast over dims 2 and 3


# ---------------------------------------------------------------- MUL_MAT_ID

def mul_mat_id_ref(experts, b, ids):
    """out[t, e] = experts[ids[t, e]] @ b[t, e % b_used] (torch order)."""
    chosen = ids[0, 0]                                            # [n_tokens, n_used]
    n_used, b_used = chosen.shape[1], b.shape[2]
    rows = b[0][:, torch.arange(n_used) % b_used]                 # [n_tokens, n_used, k]
    mats = experts[0][chosen]                                     # [n_tokens, n_used, n, k]
    return torch.einsum("tunk,tuk->tun", mats, rows).unsqueeze(0)


def distinct_experts(n_expert: int):
    """An `init` entry for ids [n_used, n_tokens]: distinct experts per token, shuffled."""
    def make(t, gen):
        n_used, n_tokens = t.ne[0], t.ne[1]
        return torch.rand(n_tokens, n_expert, generator=gen).argsort(-1)[:, :n_used].reshape(1, 1, n_tokens, n_used)
    return make


def _mul_mat_id_case(type_a, type_b, n_expert, n_used, b_used, n_tokens, m=16, k=256):
    def build(ctx):
        experts = ggml.new_tensor_3d(ctx, type_a, k, m, n_expert)
        b = ggml.new_tensor_3d(ctx, type_b, k, b_used, n_tokens)
        ids = ggml.new_tensor_2d(ctx, T.I32, n_used, n_tokens)
        return ggml.mul_mat_id(ctx, experts, b, ids), [experts, b, ids]
    case("mul_mat_id", f"type_a={type_a.name},type_b={type_b.name},n_expert={n_expert},n_used={n_used},"
         f"b.ne1={b_used},n_tokens={n_tokens},m={m},k={k}", build, mul_mat_id_ref, max_nmse=NMSE_MUL_MAT,
         init={2: distinct_experts(n_expert), **inits_for({0: type_a})})


for _ta in (T.F32, T.F16, T.Q4_0, T.Q8_0, T.Q4_K, T.IQ2_XXS, T.MXFP4):
    for _n_tokens in (1, 7):
        _mul_mat_id_case(_ta, T.F32, 8, 2, 2, _n_tokens)
    _mul_mat_id_case(_ta, T.F32, 4, 2, 1, 5)  # b broadcast over the used experts
_mul_mat_id_case(T.F16, T.F16, 6, 3, 3, 4)
_mul_mat_id_case(T.Q4_0, T.F32, 4, 4, 4, 33, m=40, k=64)  # every expert used, many rows each


def _mul_mat_id_repeated_ids(ctx):
    """ids may repeat an expert within a token (upstream's CPU kernel allows it)."""
    experts = ggml.new_tensor_3d(ctx, T.F32, 32, 8, 3)
    b = ggml.new_tensor_3d(ctx, T.F32, 32, 4, 5)
    ids = ggml.new_tensor_2d(ctx, T.I32, 4, 5)
    return ggml.mul_mat_id(ctx, experts, b, ids), [experts, b, ids]


case("mul_mat_id", "repeated ids", _mul_mat_id_repeated_ids, mul_mat_id_ref, max_nmse=NMSE_MUL_MAT,
     init={2: randint(0, 3)})


# ---------------------------------------------------------------- OUT_PROD

def out_prod_ref(a, b):
    """out = b^T @ a per matrix (torch order [.., K, M] and [.., K, N]), a repeat-interleaved."""
    r2, r3 = b.shape[1] // a.shape[1], b.shape[0] // a.shape[0]
    a = a.repeat_interleave(r2, dim=1).repeat_interleave(r3, dim=0)
    return b.transpose(-1, -2) @ a


def _out_prod_case(type_a, m, n, k, bs=(1, 1), nr=(1, 1), transposed_b=False):
    def build(ctx):
        a = ggml.new_tensor_4d(ctx, type_a, m, k, bs[0], bs[1])
        if transposed_b:  # b as llama's training graphs pass it: a transposed view
            b0 = ggml.new_tensor_4d(ctx, T.F32, k, n, bs[0] * nr[0], bs[1] * nr[1])
            return ggml.out_prod(ctx, a, ggml.transpose(ctx, b0)), [a, b0]
        b = ggml.new_tensor_4d(ctx, T.F32, n, k, bs[0] * nr[0], bs[1] * nr[1])
        return ggml.out_prod(ctx, a, b), [a, b]
    ref = (lambda a, b0: out_prod_ref(a, b0.transpose(-1, -2))) if transposed_b else out_prod_ref
    case("out_prod", f"type_a={type_a.name},m={m},n={n},k={k},bs={list(bs)},nr={list(nr)}"
         + (",b=transposed view" if transposed_b else ""), build, ref, max_nmse=NMSE_MUL_MAT)


for _ta in (T.F32, T.F16, T.Q4_0, T.Q8_0):
    _out_prod_case(_ta, 32, 8, 16)
    _out_prod_case(_ta, 64, 5, 7, (2, 3))
    _out_prod_case(_ta, 32, 4, 9, (2, 1), (2, 2))
_out_prod_case(T.F32, 16, 6, 10, transposed_b=True)
