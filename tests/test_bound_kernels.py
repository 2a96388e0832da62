"""Bound kernels bind views, never values.

Every case is a small graph, allocated with gallocr (so in-place reuse happens as in model
graphs). A graph plan is compiled with one set of input values and computed; then every input
(activations, weights, positions, ids, masks, caches) gets new values and the plan computes
again. Its output must equal, bit for bit, a fresh backend_graph_compute of the new values
(compiled anew), and differ from the first output. A binder that reshaped, copied, converted or
dequantized an input at bind time, or read positions or ids then, fails here. The compiled calls
of the ops a case names must be bound calls (the binder did not fall back to the generic kernel).

The second test runs the same check over the op case table (tests/test_ops.py's cases) for the
ops that bind, with the cases' own input initialisers.
"""
from __future__ import annotations

import math
import zlib
from dataclasses import dataclass, field
from typing import Callable

import pytest
import torch

import torchggml as ggml
from torchggml.devices.kernels import member_calls
from torchggml.enums import Op
from torchggml.test_ops.runner import all_cases, fill_input, random_values
from torchggml.devices.cpu import CPU_KERNELS
from torchggml.devices.kernels import attention as attention_kernels, matmul as matmul_kernels

T = ggml.Type
R = ggml.RopeType


@dataclass
class GraphCase:
    """build(ctx) -> (output, inputs); `init` maps an input's index to (tensor, generator) ->
    values (default: uniform in [-1, 1]); `bound` are the ops whose calls must be bound;
    `patch` sets module attributes while the case runs (small chunk sizes)."""
    name: str
    build: Callable
    bound: tuple = ()
    init: dict = field(default_factory=dict)
    patch: tuple = ()


CASES: list[GraphCase] = []


def graph_case(name, bound, init=None, patch=()):
    def deco(build):
        CASES.append(GraphCase(name, build, tuple(bound), init or {}, patch))
        return build
    return deco


# ---------------------------------------------------------------- input initialisers

def shape_of(t) -> tuple:
    return tuple(reversed(t.ne))


def ints(lo: int, hi: int):
    return lambda t, gen: torch.randint(lo, hi, shape_of(t), generator=gen)


def uniform(lo: float, hi: float):
    return lambda t, gen: torch.rand(shape_of(t), generator=gen) * (hi - lo) + lo


def distinct_rows(n_rows: int):
    """Row indices without repeats in each [.., :] row (a scatter with repeats has no order)."""
    def make(t, gen):
        shape = shape_of(t)
        flat = [torch.randperm(n_rows, generator=gen)[:shape[-1]] for _ in range(math.prod(shape[:-1]))]
        return torch.stack(flat).view(shape)
    return make


def some_inf(t, gen):
    """A mask: uniform values with about a third of them -inf."""
    values = torch.rand(shape_of(t), generator=gen) * 2 - 1
    return values.masked_fill(torch.rand(shape_of(t), generator=gen) < 0.3, -math.inf)


def new(ctx, type, *ne):
    return ggml.new_tensor(ctx, type, list(ne))


# ---------------------------------------------------------------- norms, scale, unary, glu

@graph_case("rms_norm * weight", [Op.MUL])  # one norm_mul call, at the MUL (fusion.py)
def _(ctx):
    x, w = new(ctx, T.F32, 32, 4, 3), new(ctx, T.F32, 32)
    return ggml.mul(ctx, ggml.rms_norm(ctx, x, 1e-5), w), [x, w]


@graph_case("rms_norm in place on a computed tensor", [Op.RMS_NORM, Op.SCALE])
def _(ctx):
    x = new(ctx, T.F32, 32, 5)
    return ggml.rms_norm_inplace(ctx, ggml.scale(ctx, x, 2.0), 1e-6), [x]


@graph_case("rms_norm F16", [Op.RMS_NORM])
def _(ctx):
    x = new(ctx, T.F16, 32, 5)
    return ggml.rms_norm(ctx, x, 1e-5), [x]


@graph_case("norm of permuted rows", [Op.NORM])
def _(ctx):
    x = new(ctx, T.F32, 6, 16, 3)
    return ggml.norm(ctx, ggml.permute(ctx, x, 1, 0, 2, 3), 1e-5), [x]


@graph_case("scale", [Op.SCALE])
def _(ctx):
    x = new(ctx, T.F32, 16, 3)
    return ggml.scale(ctx, x, 0.5), [x]


@graph_case("scale_bias F32 and F16", [Op.SCALE])
def _(ctx):
    x, h = new(ctx, T.F32, 16, 3), new(ctx, T.F16, 16, 3)
    h_scaled = ggml.cpy(ctx, ggml.scale_bias(ctx, h, -2.0, 1.0), new(ctx, T.F32, 16, 3))
    return ggml.add(ctx, ggml.scale_bias(ctx, x, 0.5, 0.25), h_scaled), [x, h]


def _unary_case(name: str):
    @graph_case(f"unary {name}", [Op.UNARY])
    def _(ctx):
        x = new(ctx, T.F32, 16, 3)
        return getattr(ggml, name)(ctx, x), [x]


for _name in ("silu", "gelu", "gelu_erf", "gelu_quick", "relu", "tanh", "sigmoid", "exp", "neg", "abs", "sgn",
              "elu", "hardswish", "floor"):
    _unary_case(_name)


@graph_case("unary sigmoid of permuted rows, silu F16, tanh in place", [Op.UNARY])
def _(ctx):
    x, h = new(ctx, T.F32, 8, 3, 2), new(ctx, T.F16, 8, 2, 3)
    y = ggml.sigmoid(ctx, ggml.permute(ctx, x, 0, 2, 1, 3))  # [8, 2, 3], rows 8 apart
    z = ggml.cpy(ctx, ggml.silu(ctx, h), new(ctx, T.F32, 8, 2, 3))
    return ggml.tanh_inplace(ctx, ggml.add(ctx, y, z)), [x, h]


@graph_case("swiglu fused and swapped", [Op.GLU])
def _(ctx):
    x = new(ctx, T.F32, 32, 3)
    return ggml.add(ctx, ggml.swiglu(ctx, x), ggml.swiglu_swapped(ctx, x)), [x]


@graph_case("swiglu split, geglu split (F16)", [Op.GLU])
def _(ctx):
    g, u, h = new(ctx, T.F32, 16, 3), new(ctx, T.F32, 16, 3), new(ctx, T.F16, 16, 3)
    gg = ggml.cpy(ctx, ggml.geglu_split(ctx, h, h), new(ctx, T.F32, 16, 3))
    return ggml.add(ctx, ggml.swiglu_split(ctx, g, u), gg), [g, u, h]


@graph_case("swiglu_oai split, geglu_erf fused odd row", [Op.GLU])
def _(ctx):
    g, u, x = new(ctx, T.F32, 16, 3), new(ctx, T.F32, 16, 3), new(ctx, T.F32, 33, 3)
    return ggml.add(ctx, ggml.swiglu_oai(ctx, g, u, 1.702, 0.7), ggml.geglu_erf(ctx, x)), [g, u, x]


# ---------------------------------------------------------------- mul_mat

def _mul_mat_case(a_type, a_ne, b_ne, b_type=T.F32, permute_b=False, label="", patch=()):
    @graph_case(f"mul_mat {a_type.name} a{list(a_ne)} x b{list(b_ne)}{label}", [Op.MUL_MAT], patch=patch)
    def _(ctx):
        a = new(ctx, a_type, *a_ne)
        if permute_b:  # b given as [k, b2, m] and permuted to [k, m, b2]: rows are not contiguous
            b0 = new(ctx, b_type, b_ne[0], b_ne[2], b_ne[1], *b_ne[3:])
            b = ggml.permute(ctx, b0, 0, 2, 1, 3)
        else:
            b0 = b = new(ctx, b_type, *b_ne)
        return ggml.mul_mat(ctx, a, b), [a, b0]


_mul_mat_case(T.F32, (32, 16), (32, 3))
_mul_mat_case(T.F16, (32, 16), (32, 3))
_mul_mat_case(T.BF16, (32, 16), (32, 1))
_mul_mat_case(T.F32, (32, 16), (32, 3), b_type=T.F16)
_mul_mat_case(T.Q8_0, (32, 16), (32, 3))
_mul_mat_case(T.Q4_0, (64, 4), (64, 2))
_mul_mat_case(T.F16, (32, 16), (32, 3), label=", weight converted in chunks",
              patch=((matmul_kernels, "CHUNK_VALUES", 96),))
_mul_mat_case(T.F32, (32, 16), (32, 3, 4), permute_b=True, label=", b permuted")
_mul_mat_case(T.F32, (32, 8, 2), (32, 3, 4), label=", GQA broadcast")
_mul_mat_case(T.F16, (32, 8, 2), (32, 3, 4), permute_b=True, label=", GQA broadcast, b permuted")
_mul_mat_case(T.F32, (32, 8, 2, 2), (32, 3, 4, 4), label=", broadcast over dims 2 and 3")
_mul_mat_case(T.F32, (32, 8, 1, 2), (32, 3, 2, 4), label=", broadcast over dims 2 and 3")


@graph_case("mul_mat of F16 cache views (attention scores and values)", [Op.MUL_MAT, Op.SOFT_MAX, Op.CONT],
            init={2: some_inf})
def _(ctx):
    d, n_head, n_head_kv, n_q, n_kv = 16, 4, 2, 3, 8
    q_cur, cache, mask = new(ctx, T.F32, d, n_head, n_q), new(ctx, T.F16, d * n_head_kv, 12), new(ctx, T.F16, n_kv, n_q)
    cells = ggml.view_3d(ctx, cache, d, n_kv, n_head_kv, cache.nb[1], ggml.row_size(T.F16, d), 0)
    q = ggml.permute(ctx, q_cur, 0, 2, 1, 3)
    kq = ggml.soft_max_ext(ctx, ggml.mul_mat(ctx, cells, q), mask, 0.25, 0.0)
    v_t = ggml.cont(ctx, ggml.permute(ctx, cells, 1, 0, 2, 3))
    return ggml.mul_mat(ctx, v_t, kq), [q_cur, cache, mask]



# ---------------------------------------------------------------- soft_max

@graph_case("soft_max_ext, F16 mask for all heads", [Op.SOFT_MAX], init={1: some_inf})
def _(ctx):
    x, mask = new(ctx, T.F32, 16, 3, 4), new(ctx, T.F16, 16, 5)
    return ggml.soft_max_ext(ctx, x, mask, 0.5, 0.0), [x, mask]


@graph_case("soft_max_ext, mask tiled over heads, ALiBi, sinks", [Op.SOFT_MAX], init={1: some_inf, 2: uniform(-4, 4)})
def _(ctx):
    x, mask, sinks = new(ctx, T.F32, 16, 3, 4, 2), new(ctx, T.F32, 16, 3, 2, 1), new(ctx, T.F32, 4)
    out = ggml.soft_max_ext(ctx, x, mask, 1.0, 8.0)
    ggml.soft_max_add_sinks(out, sinks)
    return out, [x, mask, sinks]


@graph_case("soft_max in place on a computed tensor", [Op.SOFT_MAX])
def _(ctx):
    x = new(ctx, T.F32, 16, 3)
    return ggml.soft_max_inplace(ctx, ggml.scale(ctx, x, 3.0)), [x]


# ---------------------------------------------------------------- rope

def _rope_case(mode, ne, n_dims, type=T.F32, factors=False, yarn=False, sections=None, n_offs=0, inplace=False):
    multi = bool(mode & R.MROPE)
    init = {1: ints(0, 5000)}
    if factors:
        init[2] = uniform(0.5, 2.0)
    label = (f"rope mode={mode} {type.name} ne={list(ne)} n_dims={n_dims}{' factors' if factors else ''}"
             f"{' yarn' if yarn else ''}{f' sections={sections}' if sections else ''}"
             f"{f' n_offs={n_offs}' if n_offs else ''}{' in place' if inplace else ''}")

    @graph_case(label, [Op.ROPE], init=init)
    def _(ctx):
        x = new(ctx, type, *ne)
        pos = new(ctx, T.I32, ne[2] * (4 if multi else 1))
        ff = new(ctx, T.F32, n_dims if mode == R.VISION else n_dims // 2) if factors else None
        a = ggml.scale(ctx, x, 1.0) if inplace else x
        fs, ef = (0.25, 1.0) if yarn else (1.0, 0.0)
        if multi:
            out = ggml.rope_multi(ctx, a, pos, ff, n_dims, list(sections), mode, 4096, 10000.0, fs, ef, 1.0, 32.0, 1.0,
                                  inplace=inplace)
        else:
            out = ggml.rope_ext(ctx, a, pos, ff, n_dims, mode, 4096, 10000.0, fs, ef, 1.0, 32.0, 1.0, inplace=inplace)
        if n_offs:
            ggml.rope_set_offset(out, n_offs)
        return out, [x, pos] + ([ff] if factors else [])


_rope_case(R.NORMAL, (16, 4, 3), 16)
_rope_case(R.NEOX, (16, 4, 3), 16)
_rope_case(R.NEOX, (16, 4, 3), 16, type=T.F16)
_rope_case(R.NORMAL, (32, 2, 3), 16, factors=True, yarn=True)
_rope_case(R.NEOX, (32, 2, 3, 2), 8, n_offs=8)
_rope_case(R.NEOX, (16, 4, 3), 16, inplace=True)
_rope_case(R.NORMAL, (32, 2, 3), 16, n_offs=16, inplace=True)
_rope_case(R.MROPE, (32, 2, 3), 32, sections=(4, 6, 6, 0), factors=True)
_rope_case(ggml.ROPE_TYPE_IMROPE, (32, 2, 3), 24, sections=(4, 4, 4, 0))
_rope_case(R.VISION, (32, 2, 3), 16, sections=(8, 8, 0, 0))


# ---------------------------------------------------------------- copies

@graph_case("cpy F32 -> F16 and back", [Op.CPY])
def _(ctx):
    x = new(ctx, T.F32, 16, 3)
    return ggml.cpy(ctx, ggml.cpy(ctx, x, new(ctx, T.F16, 16, 3)), new(ctx, T.F32, 16, 3)), [x]


@graph_case("cont of a permuted tensor, cont_2d reshapes", [Op.CONT])
def _(ctx):
    x, y = new(ctx, T.F32, 4, 6, 3), new(ctx, T.F32, 8, 3, 2)
    a = ggml.cont(ctx, ggml.permute(ctx, x, 1, 0, 2, 3))             # [6, 4, 3]
    b = ggml.cont_2d(ctx, ggml.permute(ctx, x, 0, 2, 1, 3), 12, 6)    # reshaping a permuted view copies
    c = ggml.cont_2d(ctx, y, 16, 3)                                    # a contiguous source: a view reshape
    flat = [ggml.reshape_1d(ctx, t, ggml.nelements(t)) for t in (a, b, c)]
    return ggml.concat(ctx, ggml.concat(ctx, flat[0], flat[1], 0), flat[2], 0), [x, y]


@graph_case("dup F16 -> BF16, cpy I32 -> F32, cont of Q8_0 rows", [Op.DUP, Op.CPY, Op.CONT],
            init={1: ints(-1000, 1000)})
def _(ctx):
    h, i, q, b = new(ctx, T.F16, 16, 3), new(ctx, T.I32, 16, 3), new(ctx, T.Q8_0, 32, 6), new(ctx, T.F32, 32, 2)
    bf = ggml.dup(ctx, ggml.cpy(ctx, h, new(ctx, T.BF16, 16, 3)))
    mixed = ggml.add(ctx, ggml.cpy(ctx, bf, new(ctx, T.F32, 16, 3)), ggml.cpy(ctx, i, new(ctx, T.F32, 16, 3)))
    q_rows = ggml.cont(ctx, ggml.view_2d(ctx, q, 32, 3, q.nb[1] * 2, 0))  # every other row: block bytes
    products = ggml.mul_mat(ctx, q_rows, b)
    return ggml.concat(ctx, ggml.reshape_1d(ctx, mixed, 48), ggml.reshape_1d(ctx, products, 6), 0), [h, i, q, b]


@graph_case("cpy F32 -> Q8_0 (generic path) and back", [])
def _(ctx):
    x = new(ctx, T.F32, 32, 3)
    return ggml.cpy(ctx, ggml.cpy(ctx, x, new(ctx, T.Q8_0, 32, 3)), new(ctx, T.F32, 32, 3)), [x]


# ---------------------------------------------------------------- get_rows, set_rows

def _get_rows_case(type, ne, n_ids):
    init = {1: ints(0, ne[1])}
    if type == T.I32:
        init[0] = ints(-1000, 1000)

    @graph_case(f"get_rows {type.name} {list(ne)} x {n_ids}", [Op.GET_ROWS], init=init)
    def _(ctx):
        a = new(ctx, type, *ne)
        ids = new(ctx, T.I32, n_ids, *ne[2:])
        return ggml.get_rows(ctx, a, ids), [a, ids]


_get_rows_case(T.F32, (16, 10), 4)
_get_rows_case(T.F16, (16, 10), 4)
_get_rows_case(T.Q4_0, (32, 10), 3)
_get_rows_case(T.F32, (8, 10, 3), 4)
_get_rows_case(T.I32, (8, 10), 5)


def _set_rows_case(dst_type, ne, n, idx_type=T.I64, c_ne=(1, 1)):
    @graph_case(f"set_rows {dst_type.name} {list(ne)} <- {n} rows, {idx_type.name} ids {list(c_ne)}", [Op.SET_ROWS],
                init={2: distinct_rows(ne[1])})
    def _(ctx):
        cache, b = new(ctx, dst_type, *ne), new(ctx, T.F32, ne[0], n, *ne[2:])
        c = new(ctx, idx_type, n, *c_ne)
        return ggml.set_rows(ctx, cache, b, c), [cache, b, c]


_set_rows_case(T.F16, (16, 12), 3)
_set_rows_case(T.F32, (16, 12), 2, T.I32)
_set_rows_case(T.BF16, (8, 10, 4, 2), 3, c_ne=(2, 1))  # ids tiled over dims 2 and 3
_set_rows_case(T.Q8_0, (32, 6), 2)


# ---------------------------------------------------------------- flash_attn_ext

def _fa_case(n_head=4, n_head_kv=2, n_q=3, n_kv=16, d=16, type_kv=T.F16, max_bias=0.0, softcap=0.0, sinks=False,
             mask=True, patch=(), label=""):
    init = {3: some_inf} if mask else {}
    if sinks:
        init[3 + mask] = uniform(-4, 4)

    @graph_case(f"flash_attn_ext {type_kv.name} heads {n_head}/{n_head_kv} n_q={n_q} n_kv={n_kv}"
                f"{f' max_bias={max_bias}' if max_bias else ''}{f' softcap={softcap}' if softcap else ''}"
                f"{' sinks' if sinks else ''}{'' if mask else ' no mask'}{label}", [Op.FLASH_ATTN_EXT], init=init,
                patch=patch)
    def _(ctx):
        q_cur = new(ctx, T.F32, d, n_head, n_q)
        k, v = new(ctx, type_kv, d, n_kv, n_head_kv), new(ctx, type_kv, d, n_kv, n_head_kv)
        m = new(ctx, T.F16, n_kv, n_q) if mask else None
        out = ggml.flash_attn_ext(ctx, ggml.permute(ctx, q_cur, 0, 2, 1, 3), k, v, m, d ** -0.5, max_bias, softcap)
        inputs = [q_cur, k, v] + ([m] if mask else [])
        if sinks:
            s = new(ctx, T.F32, n_head)
            ggml.flash_attn_ext_add_sinks(out, s)
            inputs.append(s)
        return out, inputs


_fa_case()
_fa_case(n_q=1, n_kv=64, n_head=8, n_head_kv=2)
_fa_case(max_bias=8.0, sinks=True)
_fa_case(softcap=2.0, mask=False)
_fa_case(type_kv=T.Q8_0, d=32)
_fa_case(n_q=5, label=", queries in chunks", patch=((attention_kernels, "SCORE_CHUNK", 64),))


# ---------------------------------------------------------------- a llama block

@graph_case("llama block: get_rows, rms_norm, mul_mat, rope, set_rows into an F16 cache, flash_attn_ext, swiglu",
            [Op.GET_ROWS, Op.RMS_NORM, Op.MUL_MAT, Op.ROPE, Op.SET_ROWS, Op.FLASH_ATTN_EXT, Op.GLU],
            init={1: ints(0, 20), 2: ints(0, 1000), 3: distinct_rows(8), 4: some_inf})
def _(ctx):
    dim, hd, n_head, n_head_kv, n_tokens, n_ctx = 32, 8, 4, 2, 2, 8
    embd, tokens, pos = new(ctx, T.F16, dim, 20), new(ctx, T.I32, n_tokens), new(ctx, T.I32, n_tokens)
    kv_idx, mask = new(ctx, T.I64, n_tokens), new(ctx, T.F16, n_ctx, n_tokens)
    wq, wk, wo = new(ctx, T.F32, dim, dim), new(ctx, T.Q8_0, dim, hd * n_head_kv), new(ctx, T.F16, dim, dim)
    gate, up, norm_w = new(ctx, T.F32, dim, 48), new(ctx, T.F32, dim, 48), new(ctx, T.F32, dim)
    k_cache = new(ctx, T.F16, hd * n_head_kv, n_ctx)
    x = ggml.get_rows(ctx, embd, tokens)
    h = ggml.mul(ctx, ggml.rms_norm(ctx, x, 1e-5), norm_w)
    rope = lambda t: ggml.rope_ext(ctx, t, pos, None, hd, R.NEOX, 4096, 1e4, 1.0, 0.0, 1.0, 32.0, 1.0)  # noqa: E731
    q = rope(ggml.reshape_3d(ctx, ggml.mul_mat(ctx, wq, h), hd, n_head, n_tokens))
    k = rope(ggml.reshape_3d(ctx, ggml.mul_mat(ctx, wk, h), hd, n_head_kv, n_tokens))
    written = ggml.set_rows(ctx, k_cache, ggml.reshape_2d(ctx, k, hd * n_head_kv, n_tokens), kv_idx)
    cells = ggml.view_3d(ctx, written, hd, n_ctx, n_head_kv, written.nb[1], ggml.row_size(T.F16, hd), 0)
    attn = ggml.flash_attn_ext(ctx, ggml.permute(ctx, q, 0, 2, 1, 3), cells, cells, mask, hd ** -0.5, 0.0, 0.0)
    x = ggml.add(ctx, x, ggml.mul_mat(ctx, wo, ggml.reshape_2d(ctx, attn, dim, n_tokens)))
    ffn = ggml.swiglu_split(ctx, ggml.mul_mat(ctx, gate, x), ggml.mul_mat(ctx, up, x))
    return ggml.concat(ctx, x, ffn, 0), [embd, tokens, pos, kv_idx, mask, wq, wk, wo, gate, up, norm_w, k_cache]


# ---------------------------------------------------------------- the check

def _fill(inputs, init: dict, seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    for i, t in enumerate(inputs):
        make = init.get(i)
        fill_input(t, make(t, gen) if make else random_values(t, gen))


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and torch.equal(a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8))


def check_plan_reads_current_inputs(build, init: dict, bound_ops, seed: int, must_change: bool = True) -> None:
    backend = ggml.backend_cpu_init()
    ctx = ggml.init(no_alloc=True)
    out, inputs = build(ctx)
    for t in inputs:
        ggml.set_input(t)
    ggml.set_output(out)
    graph = ggml.new_graph_custom(ctx, 512)
    ggml.build_forward_expand(graph, out)
    galloc = ggml.gallocr_new(ggml.backend_cpu_buffer_type())
    assert ggml.gallocr_alloc_graph(galloc, graph)

    _fill(inputs, init, seed)
    plan = ggml.backend_graph_plan_create(backend, graph)
    calls = member_calls(plan.calls)  # a native run's calls one by one
    for fn, node in calls:
        if node.op in bound_ops:
            assert fn is not CPU_KERNELS.kernel(node, "CPU"), f"{node.op.name} {node.describe()} was not bound"
    assert not bound_ops or any(node.op in bound_ops for _, node in calls)
    ggml.backend_graph_plan_compute(backend, plan)
    first = ggml.backend_tensor_get(out)

    _fill(inputs, init, seed + 1)  # every input changes: activations, weights, positions, ids, masks
    ggml.backend_graph_plan_compute(backend, plan)
    planned = ggml.backend_tensor_get(out)
    _fill(inputs, init, seed + 1)  # again: in-place ops may have overwritten inputs
    ggml.backend_graph_compute(backend, graph)
    fresh = ggml.backend_tensor_get(out)
    ggml.backend_graph_plan_free(backend, plan)

    assert _same_bits(planned, fresh), "the plan's output is not the fresh compute's: a value was bound"
    if must_change:
        assert not _same_bits(first, planned), "new inputs did not change the output: the case checks nothing"


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_plan_reads_current_inputs(case, monkeypatch):
    for module, name, value in case.patch:
        monkeypatch.setattr(module, name, value)
    check_plan_reads_current_inputs(case.build, case.init, case.bound, zlib.crc32(case.name.encode()))


# the op table's cases of the ops that bind (their inits keep ids and positions valid; a few
# outputs do not depend on the values, e.g. norm of one-element rows)
BINDING_OPS = {"rms_norm", "norm", "mul_mat", "unary", "glu", "scale", "soft_max", "rope", "cpy", "cont", "dup",
               "get_rows", "set_rows", "flash_attn_ext"}
OP_CASES = [c for c in all_cases() if c.op.lower() in BINDING_OPS]


@pytest.mark.parametrize("case", OP_CASES, ids=[c.name for c in OP_CASES])
def test_op_case_plan_reads_current_inputs(case):
    check_plan_reads_current_inputs(case.build, case.init, (), zlib.crc32(case.name.encode()), must_change=False)
