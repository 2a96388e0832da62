"""Cases: SOFT_MAX (soft_max_ext: mask F16/F32 with broadcast and extra rows, scale, ALiBi,
sinks, causal masks, in-place) and FLASH_ATTN_EXT (GQA, K/V types, softcap, ALiBi, sinks,
permuted views as llama graphs build them, V a view of K, fully masked rows)."""
from __future__ import annotations

import math

import torch

import torchggml as ggml
from .values import uniform, ggml_permute
from .table import CaseTable, NMSE_MUL_MAT, NMSE_SOFT_MAX

CASES = CaseTable()
case = CASES.case

T = ggml.Type
NMSE_ATTENTION = NMSE_MUL_MAT


def alibi_slopes_ref(n_head: int, max_bias: float) -> torch.Tensor:
    if max_bias <= 0:
        return torch.ones(n_head, dtype=torch.float64)
    n_head_log2 = 2 ** math.floor(math.log2(n_head))
    m0 = 2.0 ** (-max_bias / n_head_log2)
    m1 = 2.0 ** (-(max_bias / 2.0) / n_head_log2)
    return torch.tensor([m0 ** (h + 1) if h < n_head_log2 else m1 ** (2 * (h - n_head_log2) + 1)
                         for h in range(n_head)], dtype=torch.float64)


def tiled_mask(mask, rows: int, ne3: int, n_head: int) -> torch.Tensor:
    """mask rows [0, rows), dims 0/1 (ggml 3/2) tiled to (ne3, n_head)."""
    m = mask[:, :, :rows]
    return m.repeat(ne3 // m.shape[0], n_head // m.shape[1], 1, 1)


def softmax_ref(logits, sinks=None):
    """Softmax over the last dim; sinks [n_head] join the denominator only. Rows with no finite
    logit and no sink give zeros (ggml's flash attention does that)."""
    if sinks is not None:
        sink_col = sinks.view(1, -1, 1, 1).expand(*logits.shape[:-1], 1)
        logits = torch.cat([logits, sink_col], -1)
    dead = torch.isinf(logits).all(-1, keepdim=True)
    probs = torch.softmax(torch.where(dead, torch.zeros_like(logits), logits), -1)
    probs = torch.where(dead, torch.zeros_like(probs), probs)
    return probs[..., :-1] if sinks is not None else probs


def causal_mask(n_kv: int, fully_masked_row: int | None = None):
    """An `init` entry for a mask [n_kv, rows, ...]: uniform [-1, 1] values, -inf for keys after
    the query (the last query sees every key); optionally one row masked entirely."""
    def make(t, gen):
        shape = tuple(reversed(t.ne))
        values = torch.rand(shape, generator=gen, dtype=torch.float64) * 2 - 1
        rows = torch.arange(shape[2]).view(-1, 1)
        keys = torch.arange(shape[3]).view(1, -1)
        values = values.masked_fill(keys > rows + (n_kv - shape[2]), -math.inf)
        if fully_masked_row is not None:
            values[:, :, fully_masked_row] = -math.inf
        return values
    return make


# ---------------------------------------------------------------- SOFT_MAX

def soft_max_ref(x, mask=None, sinks=None, scale=1.0, max_bias=0.0):
    ne3, n_head, rows = x.shape[0], x.shape[1], x.shape[2]
    logits = x * scale
    if mask is not None:
        logits = logits + alibi_slopes_ref(n_head, max_bias).view(1, -1, 1, 1) * tiled_mask(mask, rows, ne3, n_head)
    return softmax_ref(logits, sinks.reshape(-1) if sinks is not None else None)


def _soft_max_case(ne, mask_ne=None, mask_type=T.F32, scale=1.0, max_bias=0.0, sinks=False,
                   inplace=False, mask_init=None):
    def build(ctx):
        a = ggml.new_tensor(ctx, T.F32, ne)
        inputs = [a]
        mask = None
        if mask_ne is not None:
            mask = ggml.new_tensor(ctx, mask_type, mask_ne)
            inputs.append(mask)
        x = ggml.scale(ctx, a, 1.0) if inplace else a  # in-place on a computed tensor
        op = ggml.soft_max_ext_inplace if inplace else ggml.soft_max_ext
        out = op(ctx, x, mask, scale, max_bias)
        if sinks:
            s = ggml.new_tensor_1d(ctx, T.F32, ne[2])
            ggml.soft_max_add_sinks(out, s)
            inputs.append(s)
        return out, inputs

    def ref(*values):
        a, rest = values[0], list(values[1:])
        mask = rest.pop(0) if mask_ne is not None else None
        s = rest.pop(0) if sinks else None
        return soft_max_ref(a, mask, s, scale, max_bias)

    init = {}
    if mask_init is not None:
        init[1] = mask_init
    if sinks:
        init[1 + (mask_ne is not None)] = uniform(-4.0, 4.0)
    desc = (f"ne={ne},mask={mask_ne and mask_type.name}{mask_ne or ''},scale={scale},max_bias={max_bias}"
            f"{',sinks' if sinks else ''}{',inplace' if inplace else ''}{',causal' if mask_init else ''}")
    case("soft_max", desc, build, ref, max_nmse=NMSE_SOFT_MAX, init=init)


for _ne in ([16, 7, 4, 2], [1000, 3, 2, 1], [5, 1, 1, 1]):
    _soft_max_case(_ne)
    _soft_max_case(_ne, scale=0.25)
for _mt in (T.F32, T.F16):
    _soft_max_case([16, 7, 4, 2], [16, 7, 1, 1], _mt, scale=0.5)        # one mask for all heads
    _soft_max_case([16, 7, 4, 2], [16, 9, 4, 2], _mt)                   # more mask rows than a
    _soft_max_case([16, 7, 4, 2], [16, 7, 2, 1], _mt)                   # tiled over heads
    _soft_max_case([16, 7, 4, 2], [16, 7, 1, 2], _mt, max_bias=8.0)     # ALiBi, 4 heads
    _soft_max_case([16, 7, 5, 1], [16, 8, 1, 1], _mt, max_bias=8.0)     # ALiBi, 5 heads: m1 slopes too
    _soft_max_case([32, 6, 3, 1], [32, 6, 1, 1], _mt, scale=0.125, mask_init=causal_mask(32))
_soft_max_case([16, 7, 4, 2], sinks=True)
_soft_max_case([16, 7, 4, 2], [16, 7, 1, 1], T.F16, scale=0.5, sinks=True)
_soft_max_case([16, 7, 6, 1], [16, 7, 1, 1], T.F16, max_bias=4.0, sinks=True)
_soft_max_case([16, 7, 4, 2], [16, 7, 1, 1], T.F16, scale=0.5, inplace=True)


# ---------------------------------------------------------------- FLASH_ATTN_EXT

def flash_attn_ref(q, k, v, mask=None, sinks=None, scale=1.0, max_bias=0.0, softcap=0.0):
    """q [ne3, H, n_q, D], k [ne3, Hk, n_kv, D], v [ne3, Hv, n_kv, Dv] (torch order; q head h uses
    K/V head h // (H / Hk)) -> [ne3, n_q, H, Dv]: heads before tokens, as ggml's result."""
    ne3, n_head, n_q = q.shape[0], q.shape[1], q.shape[2]
    k = k.repeat_interleave(n_head // k.shape[1], dim=1)
    v = v.repeat_interleave(n_head // v.shape[1], dim=1)
    logits = (q @ k.transpose(-1, -2)) * scale
    if softcap != 0.0:
        logits = softcap * torch.tanh(logits / softcap)
    if mask is not None:
        logits = logits + alibi_slopes_ref(n_head, max_bias).view(1, -1, 1, 1) * tiled_mask(mask, n_q, ne3, n_head)
    probs = softmax_ref(logits, sinks.reshape(-1) if sinks is not None else None)
    return (probs @ v).permute(0, 2, 1, 3)


def _fa_case(d=64, dv=None, n_head=4, n_head_kv=None, n_kv=64, n_q=7, ne3=1, mask=True, mask_ne3=1,
             mask_rows=None, type_kv=T.F16, max_bias=0.0, softcap=0.0, sinks=False, mask_init=None,
             label=""):
    dv = dv or d
    n_head_kv = n_head_kv or n_head
    scale = 1.0 / math.sqrt(d)

    def build(ctx):
        q = ggml.new_tensor_4d(ctx, T.F32, d, n_q, n_head, ne3)
        k = ggml.new_tensor_4d(ctx, type_kv, d, n_kv, n_head_kv, ne3)
        v = ggml.new_tensor_4d(ctx, type_kv, dv, n_kv, n_head_kv, ne3)
        inputs = [q, k, v]
        m = None
        if mask:
            m = ggml.new_tensor_4d(ctx, T.F16, n_kv, mask_rows or n_q, 1, mask_ne3)
            inputs.append(m)
        out = ggml.flash_attn_ext(ctx, q, k, v, m, scale, max_bias, softcap)
        if sinks:
            s = ggml.new_tensor_1d(ctx, T.F32, n_head)
            ggml.flash_attn_ext_add_sinks(out, s)
            inputs.append(s)
        return out, inputs

    def ref(q, k, v, *rest):
        rest = list(rest)
        m = rest.pop(0) if mask else None
        s = rest.pop(0) if sinks else None
        return flash_attn_ref(q, k, v, m, s, scale, max_bias, softcap)

    init = {}
    if mask and mask_init is not None:
        init[3] = mask_init
    if sinks:
        init[3 + mask] = uniform(-10.0, 10.0)  # large enough to matter, as upstream tests them
    desc = (f"d={d},dv={dv},n_head={n_head},n_head_kv={n_head_kv},n_kv={n_kv},n_q={n_q},ne3={ne3},"
            f"mask={mask}{f'x{mask_ne3}' if mask else ''},type_kv={type_kv.name},max_bias={max_bias},"
            f"softcap={softcap}{',sinks' if sinks else ''}{label}")
    case("flash_attn_ext", desc, build, ref, max_nmse=NMSE_ATTENTION, init=init)


for _n_kv, _n_q in [(64, 1), (113, 7), (32, 32)]:
    for _gqa in (1, 4):
        _fa_case(n_kv=_n_kv, n_q=_n_q, n_head=4, n_head_kv=4 // _gqa)
_fa_case(mask=False)
_fa_case(n_q=5, mask_rows=16)                                   # mask padded past the queries
_fa_case(n_q=6, n_kv=40, mask_init=causal_mask(40), label=",causal")
_fa_case(n_q=6, n_kv=40, mask_init=causal_mask(40, fully_masked_row=2), label=",causal,row 2 fully masked")
_fa_case(ne3=2, mask_ne3=1)
_fa_case(ne3=2, mask_ne3=2, n_head=8, n_head_kv=2)
_fa_case(max_bias=8.0)
_fa_case(n_head=6, n_head_kv=3, max_bias=8.0)                    # ALiBi with a non power of 2
_fa_case(softcap=2.0)
_fa_case(sinks=True)
_fa_case(sinks=True, mask=False, n_head=8, n_head_kv=2)
_fa_case(sinks=True, n_q=6, n_kv=40, mask_init=causal_mask(40, fully_masked_row=0), label=",causal,row 0 fully masked")
_fa_case(d=192, dv=128, n_head=4, n_head_kv=1, n_kv=48, n_q=3)  # K and V head sizes differ
_fa_case(d=40, n_kv=20, n_q=3)                                  # a head size no kernel tiles evenly
for _type in (T.F32, T.BF16, T.Q8_0, T.Q4_0):
    _fa_case(type_kv=_type, n_head=8, n_head_kv=2, n_kv=96, n_q=4)


def _fa_llama_case(n_head, n_head_kv, n_q, n_kv, kv_size=128, d=64, type_kv=T.F16):
    """Views as llama.cpp builds them: q from a [d, n_head, n_q] projection permuted to
    [d, n_q, n_head]; K and V the first n_kv cells of a [d * n_head_kv, kv_size] cache, viewed as
    [d, n_head_kv, n_kv] and permuted to [d, n_kv, n_head_kv]."""
    scale = 1.0 / math.sqrt(d)

    def build(ctx):
        q_cur = ggml.new_tensor_3d(ctx, T.F32, d, n_head, n_q)
        k_cache = ggml.new_tensor_2d(ctx, type_kv, d * n_head_kv, kv_size)
        v_cache = ggml.new_tensor_2d(ctx, type_kv, d * n_head_kv, kv_size)
        mask = ggml.new_tensor_4d(ctx, T.F16, n_kv, n_q, 1, 1)

        def cells(cache):
            head_bytes = ggml.row_size(type_kv, d)
            return ggml.permute(ctx, ggml.view_3d(ctx, cache, d, n_head_kv, n_kv, head_bytes, cache.nb[1], 0), 0, 2, 1, 3)
        q = ggml.permute(ctx, q_cur, 0, 2, 1, 3)
        out = ggml.flash_attn_ext(ctx, q, cells(k_cache), cells(v_cache), mask, scale, 0.0, 0.0)
        return out, [q_cur, k_cache, v_cache, mask]

    def as_heads(cache):  # [1, 1, kv_size, d * n_head_kv] -> [1, n_head_kv, n_kv, d]
        return cache[0, 0, :n_kv].reshape(n_kv, n_head_kv, d).permute(1, 0, 2).unsqueeze(0)

    def ref(q_cur, k_cache, v_cache, mask):
        q = ggml_permute(q_cur, (0, 2, 1, 3))
        return flash_attn_ref(q, as_heads(k_cache), as_heads(v_cache), mask, None, scale)

    case("flash_attn_ext", f"llama views,n_head={n_head},n_head_kv={n_head_kv},n_q={n_q},n_kv={n_kv},"
         f"type_kv={type_kv.name}", build, ref, max_nmse=NMSE_ATTENTION, init={3: causal_mask(n_kv)})


_fa_llama_case(8, 8, 1, 37)
_fa_llama_case(8, 2, 9, 64)
_fa_llama_case(4, 1, 16, 96, type_kv=T.Q8_0)


def _fa_v_view_of_k(ctx):
    """V as a sub-view of K (MLA models): the first 48 values of every K row."""
    q = ggml.new_tensor_4d(ctx, T.F32, 64, 5, 4, 1)
    k = ggml.new_tensor_4d(ctx, T.F16, 64, 33, 1, 1)
    v = ggml.view_4d(ctx, k, 48, 33, 1, 1, k.nb[1], k.nb[2], k.nb[3], 0)
    mask = ggml.new_tensor_4d(ctx, T.F16, 33, 5, 1, 1)
    return ggml.flash_attn_ext(ctx, q, k, v, mask, 0.125, 0.0, 0.0), [q, k, mask]


case("flash_attn_ext", "v is a view of k", _fa_v_view_of_k,
     lambda q, k, mask: flash_attn_ref(q, k, k[..., :48], mask, None, 0.125), max_nmse=NMSE_ATTENTION)


# decode shapes: one query row per head over a causal F16 mask (the CPU's numba kernel), ALiBi and
# sinks on it, and a node past the kernel's size limit
_soft_max_case([168, 1, 16, 1], [168, 1, 1, 1], T.F16, scale=0.125, mask_init=causal_mask(168))
_soft_max_case([168, 1, 12, 1], [168, 1, 1, 1], T.F32, scale=0.125, max_bias=8.0, sinks=True)
_soft_max_case([1024, 64, 8, 1], [1024, 64, 1, 1], T.F16, scale=0.125, mask_init=causal_mask(1024))
