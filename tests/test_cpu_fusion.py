"""The CPU's fused attention (devices/cpu/fusion.py): MUL_MAT(K, Q) -> SOFT_MAX -> MUL_MAT(
CONT(V^T), .) of a decode step or a prompt becomes one call, equal to float64 attention, and
fuses only when no one else reads its intermediate results."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import torchggml as ggml
from torchggml.devices.kernels import member_calls

pytest.importorskip("numba")

T = ggml.Type


def attention_graph(n_tok=1, n_head=8, n_head_kv=2, d=64, n_kv=48, mask_type=T.F32, k_type=T.F16,
                    max_bias=0.0, sinks=False, extra_reader=False, kq_output=False, kqv_reader=False):
    """(graph, inputs {name: tensor}, out, buffer): a decode step's attention as the model builder
    writes it, allocated by the graph allocator (which reuses freed memory, as in a model)."""
    ctx = ggml.init(mem_size=1 << 22, no_alloc=True)
    kc = ggml.new_tensor_3d(ctx, k_type, d, n_kv, n_head_kv)
    vc = ggml.new_tensor_3d(ctx, T.F16, d, n_kv, n_head_kv)
    q0 = ggml.new_tensor_3d(ctx, T.F32, d, n_head, n_tok)
    mask = ggml.new_tensor_2d(ctx, mask_type, n_kv, n_tok)
    inputs = dict(k=kc, v=vc, q=q0, mask=mask)
    for t in inputs.values():
        ggml.set_input(t)
    q = ggml.permute(ctx, ggml.scale(ctx, q0, 1.0), 0, 2, 1, 3)    # [d, n_tok, n_head], computed
    kq = ggml.mul_mat(ctx, kc, q)
    if kq_output:
        ggml.set_output(kq)
    probs = ggml.soft_max_ext(ctx, kq, mask, 1.0 / math.sqrt(d), max_bias)
    if sinks:
        s = ggml.new_tensor_1d(ctx, T.F32, n_head)
        ggml.set_input(s)
        inputs["sinks"] = s
        ggml.soft_max_add_sinks(probs, s)
    v_t = ggml.cont(ctx, ggml.permute(ctx, vc, 1, 0, 2, 3))
    kqv = ggml.mul_mat(ctx, v_t, probs)
    out = ggml.cont_2d(ctx, ggml.permute(ctx, kqv, 0, 2, 1, 3), d * n_head, n_tok)
    if extra_reader:  # the scores read again elsewhere: kq has two readers
        out = ggml.add(ctx, out, ggml.sum(ctx, kq))
    if kqv_reader:  # the attention's rows read again: their CONT stays a call
        out = ggml.add(ctx, out, ggml.sum(ctx, kqv))
    ggml.set_output(out)
    graph = ggml.new_graph(ctx)
    ggml.build_forward_expand(graph, out)
    galloc = ggml.gallocr_new(ggml.backend_cpu_buffer_type())
    assert ggml.gallocr_alloc_graph(galloc, graph)
    return graph, inputs, out, galloc


def fill(inputs, n_tok, n_kv, seed=0, hidden_row=None, hole=False):
    """Random inputs and a causal mask (hidden_row: a row that sees no cell; hole: cells 10-13 hidden)."""
    gen = torch.Generator().manual_seed(seed)
    values = {}
    for name, t in inputs.items():
        ne = [t.ne[i] for i in range(4)]
        x = torch.randn(ne[3], ne[2], ne[1], ne[0], generator=gen)
        if name == "mask":  # each row sees the first cells up to its position, as a causal mask
            x = torch.zeros_like(x)
            for r in range(ne[1]):
                x[..., r, n_kv - n_tok + r + 1:] = -math.inf
                x[..., r, :3] = -math.inf  # and some cells in front hidden (another sequence's)
            if hidden_row is not None:
                x[..., hidden_row, :] = -math.inf
            if hole:
                x[..., 10:14] = -math.inf  # cells inside the seen ones hidden (a sliding window's, a sequence's)
        values[name] = x
        dtype = {T.F16: torch.float16, T.F32: torch.float32}[t.type]
        ggml.backend_tensor_set(t, x.to(dtype).contiguous())
    return values


def reference(values, n_head, n_head_kv, scale, sinks=None, slopes=None):
    k = values["k"][0].half().double()      # [n_head_kv, n_kv, d]
    v = values["v"][0].half().double()
    q = values["q"][0].double().transpose(0, 1)  # [n_head, n_tok, d]
    group = n_head // n_head_kv
    k, v = k.repeat_interleave(group, 0), v.repeat_interleave(group, 0)
    mask = values["mask"][0, 0].double()
    scores = scale * q @ k.transpose(1, 2) + mask
    probs = torch.softmax(scores, dim=-1).nan_to_num()  # a row that sees no cell: 0, as ggml's
    out = probs @ v                          # [n_head, n_tok, d]
    return out.transpose(0, 1).reshape(out.shape[1], -1)


def run(graph, out, monkeypatch, fused: bool):
    """(calls in the CPU's plan, the output) with the numba layer and fusion on or off."""
    monkeypatch.setenv("TORCHGGML_CPU_FAST_OPS", "1" if fused else "0")
    backend = ggml.backend_cpu_init()
    plan = ggml.backend_graph_plan_create(backend, graph)
    assert ggml.backend_graph_plan_compute(backend, plan) == ggml.Status.SUCCESS
    return len(member_calls(plan.calls)), torch.as_tensor(ggml.backend_tensor_get(out)).double()


# (case, options): decode and a few rows, GQA and not, F16 and F32 masks; prompts (the prompt
# attention: blocks of rows and a remainder, a row that sees no cell)
FUSED = [
    ("decode-gqa", dict(n_tok=1, n_head=8, n_head_kv=2)),
    ("decode-mha", dict(n_tok=1, n_head=4, n_head_kv=4)),
    ("rows-4", dict(n_tok=4, n_head=8, n_head_kv=2, n_kv=40)),
    ("f16-mask", dict(n_tok=2, mask_type=T.F16)),
    ("head-80", dict(n_tok=1, n_head=2, n_head_kv=1, d=80)),
    ("gqa-8", dict(n_tok=1, n_head=32, n_head_kv=4)),       # runs of heads spanning K/V heads
    ("mqa-rows-3", dict(n_tok=3, n_head=12, n_head_kv=1)),
    ("odd-heads", dict(n_tok=2, n_head=7, n_head_kv=7, n_kv=33)),  # heads not a multiple of the threads
    ("rows-5", dict(n_tok=5, n_kv=40)),
    ("decode-rows-read-twice", dict(n_tok=1, kqv_reader=True)),
    ("prompt-gqa", dict(n_tok=37, n_head=9, n_head_kv=3, n_kv=64)),
    ("prompt-f16-mask", dict(n_tok=32, n_head=4, n_head_kv=1, n_kv=40, mask_type=T.F16)),
    ("prompt-hidden-row", dict(n_tok=20, n_head=4, n_head_kv=2, n_kv=24, hidden_row=7)),
    ("prompt-head-80", dict(n_tok=9, n_head=2, n_head_kv=1, d=80)),  # V's columns not whole tiles (AVX-512)
    # the decode kernel walks only the cells between the first and last seen ones
    ("decode-sees-none", dict(n_tok=1, hidden_row=0)),
    ("decode-hole", dict(n_tok=1, hole=True)),
    ("rows-hole", dict(n_tok=3, n_kv=40, hole=True)),
]


@pytest.mark.parametrize("options", [c[1] for c in FUSED], ids=[c[0] for c in FUSED])
def test_fused_attention_equals_float64(options, monkeypatch):
    options = dict(options)
    hidden_row, hole = options.pop("hidden_row", None), options.pop("hole", False)
    graph, inputs, out, _galloc = attention_graph(**options)
    n_tok, n_kv = options.get("n_tok", 1), options.get("n_kv", 48)
    values = fill(inputs, n_tok, n_kv, hidden_row=hidden_row, hole=hole)
    n_fused, fused = run(graph, out, monkeypatch, True)
    fill(inputs, n_tok, n_kv, hidden_row=hidden_row, hole=hole)  # the allocator reuses the inputs' memory once they are read
    n_plain, plain = run(graph, out, monkeypatch, False)
    # KQ's, softmax's and V^T's calls dropped, and a token's CONT(PERMUTE(KQV)) (the heads side by side)
    assert n_fused == n_plain - (4 if n_tok == 1 and not options.get("kqv_reader") else 3)
    want = reference(values, options.get("n_head", 8), options.get("n_head_kv", 2), 1.0 / math.sqrt(options.get("d", 64)))
    if options.get("kqv_reader"):  # out + sum(kqv) = want + the sum of want
        want = want + want.sum()
    torch.testing.assert_close(fused.reshape(want.shape), want, rtol=1e-5, atol=1e-5)
    # the unfused nodes (the torch kernels here) may round to F16 on the way: looser
    torch.testing.assert_close(plain.reshape(want.shape), want, rtol=1e-3, atol=1e-3)


# (case, options): what the fused kernel does not take, or a result someone else reads
NOT_FUSED = [
    ("sinks", dict(sinks=True)),
    ("alibi", dict(max_bias=8.0)),
    ("scores-read-twice", dict(extra_reader=True)),
    ("scores-an-output", dict(kq_output=True)),
    ("f32-k", dict(k_type=T.F32)),
]


@pytest.mark.parametrize("options", [c[1] for c in NOT_FUSED], ids=[c[0] for c in NOT_FUSED])
def test_attention_not_fused(options, monkeypatch):
    graph, inputs, out, _galloc = attention_graph(**options)
    fill(inputs, options.get("n_tok", 1), options.get("n_kv", 48))
    n_fast, fast = run(graph, out, monkeypatch, True)
    fill(inputs, options.get("n_tok", 1), options.get("n_kv", 48))
    n_plain, plain = run(graph, out, monkeypatch, False)
    assert n_fast == n_plain
    torch.testing.assert_close(fast, plain, rtol=1e-5, atol=1e-5)


def test_a_split_view_counts_readers_in_the_whole_graph():
    """graph_view keeps its parent: a reader outside the view (another split) still counts."""
    from torchggml.devices.cpu.fusion import use_counts
    graph, _inputs, _out, _galloc = attention_graph(extra_reader=True)
    kq = next(n for n in graph.nodes if n.op == ggml.Op.MUL_MAT and n.src[0].type == T.F16)
    i = graph.nodes.index(kq)
    view = ggml.graph_view(graph, 0, i + 3)
    assert view.parent is graph and ggml.graph_view(view, 0, 2).parent is graph
    assert use_counts(view.nodes)[id(kq)] == 1 and use_counts(view.parent.nodes)[id(kq)] == 2


def _products_graph(types, n=64, k=512, m=20):
    """(graph, x, weights, outputs, buffers): products of each weight type with the same
    computed rows (scale(x), as a layer's Q, K and V of its normed input), each an output."""
    wctx, ctx = ggml.init(mem_size=1 << 20, no_alloc=True), ggml.init(mem_size=1 << 20, no_alloc=True)
    weights = [ggml.new_tensor_2d(wctx, t, k, n) for t in types]
    x = ggml.new_tensor_2d(ctx, T.F32, k, m)
    rows = ggml.scale(ctx, x, 0.5)
    outs = [ggml.mul_mat(ctx, w, rows) for w in weights]
    graph = ggml.new_graph(ctx)
    for o in outs:
        ggml.build_forward_expand(graph, o)
    bufs = [ggml.backend_alloc_ctx_tensors_from_buft(c, ggml.backend_cpu_buffer_type()) for c in (wctx, ctx)]
    return graph, x, weights, outs, bufs


# (weight types of products of the same rows, which of their calls round the rows): the kinds
# whose activations round alike share one rounding (IQ4_NL's; Q4_K's, Q8_K per 256), a kind that
# rounds otherwise rounds its own (Q4_0: Q8_0 per 32 as IQ4_NL, but another zero point)
SHARED = [((T.IQ4_NL, T.IQ4_NL, T.IQ4_NL), [True, False, False]),
          ((T.IQ4_NL, T.Q4_0, T.IQ4_NL), [True, True, False]),
          ((T.Q4_K, T.Q4_K), [True, False]),
          ((T.Q8_0,), [True])]


@pytest.mark.parametrize("types,rounds", SHARED, ids=["-".join(t.name for t in c[0]) for c in SHARED])
def test_products_of_the_same_rows_share_their_rounding(types, rounds, monkeypatch):
    """A prompt's int8 GEMMs of the same rows (bound_int8_gemm) round them once, at the first,
    and give the bits each product gives with its own rounding."""
    from test_cpu_quant import _needs_int8_gemm, random_blocks
    _needs_int8_gemm()
    graph, x, weights, outs, _keep = _products_graph(types)
    for i, (t, w) in enumerate(zip(types, weights)):
        ggml.backend_tensor_set(w, random_blocks(t, w.ne[1], w.ne[0], seed=i).numpy())
    ggml.backend_tensor_set(x, torch.randn(x.ne[1], x.ne[0], generator=torch.Generator().manual_seed(1)))
    backend = ggml.backend_cpu_init()
    got = []
    for fused in (True, False):  # fusion on, then off (the products alone)
        monkeypatch.setenv("TORCHGGML_CPU_FAST_OPS", "1" if fused else "0")
        plan = ggml.backend_graph_plan_create(backend, graph)
        assert ggml.backend_graph_plan_compute(backend, plan) == ggml.Status.SUCCESS
        got.append([torch.as_tensor(ggml.backend_tensor_get(o)).clone() for o in outs])
        if fused:
            gemms = [fn for fn, _ in member_calls(plan.calls) if getattr(fn, "kernel", None) is not None
                     and fn.kernel.__name__ == "rows_block_gemm"]
            assert [not fn.args[-1] for fn in gemms] == rounds
    for ours, alone in zip(*got):
        assert torch.equal(ours, alone)


# (case, rows, row length, weight rows, NORM or RMS_NORM, the output over the input)
NORM_MUL = [
    ("rms-decode", 1, 576, 1, True, False),
    ("norm-decode", 1, 640, 1, False, False),
    ("rms-rows-tiled-weight", 3, 64, 1, True, False),
    ("rms-weight-per-row", 2, 40, 2, True, False),
    ("rms-in-place", 2, 96, 1, True, True),
]


@pytest.mark.parametrize("rows,n,w_rows,rms,in_place", [c[1:] for c in NORM_MUL], ids=[c[0] for c in NORM_MUL])
def test_norm_mul_gives_the_bits_of_its_two_calls(rows, n, w_rows, rms, in_place):
    """op_kernels.norm_mul (RMS_NORM / NORM -> MUL by the weight) rounds as row_norm's call then
    binary's MUL do."""
    from torchggml.devices.cpu.jit.loader import op_kernels
    ops = op_kernels()
    gen = np.random.default_rng(rows * n)
    x = (gen.standard_normal((1, 1, rows, n)) * 3).astype(np.float32)
    w = gen.standard_normal((1, 1, w_rows, n)).astype(np.float32)
    normed, want = np.empty_like(x), np.empty_like(x)
    ops.row_norm(x, normed, np.float32(1e-5), rms)
    ops.binary(normed, w, want, 2)
    out = x.copy() if in_place else np.empty_like(x)
    ops.norm_mul(out if in_place else x, w, out, np.float32(1e-5), rms)
    assert np.array_equal(out, want)


def _norm_mul_graph(n_tok, weight_rows=1, norm_output=False, other_reader=False):
    ctx = ggml.init(mem_size=1 << 20, no_alloc=True)
    x = ggml.new_tensor_2d(ctx, T.F32, 64, n_tok)
    w = ggml.new_tensor_2d(ctx, T.F32, 64, weight_rows)
    for t in (x, w):
        ggml.set_input(t)
    normed = ggml.rms_norm(ctx, ggml.scale(ctx, x, 2.0), 1e-6)
    if norm_output:
        ggml.set_output(normed)
    out = ggml.mul(ctx, normed, w)
    if other_reader:
        out = ggml.add(ctx, out, normed)
    ggml.set_output(out)
    graph = ggml.new_graph(ctx)
    ggml.build_forward_expand(graph, out)
    galloc = ggml.gallocr_new(ggml.backend_cpu_buffer_type())
    assert ggml.gallocr_alloc_graph(galloc, graph)
    return graph, x, w, out, galloc


# (case, options, whether the norm and its MUL become one call)
NORM_MUL_GRAPHS = [
    ("decode", dict(n_tok=1), True),
    ("rows-4", dict(n_tok=4), True),
    ("norm-an-output", dict(n_tok=1, norm_output=True), False),
    ("norm-read-twice", dict(n_tok=1, other_reader=True), False),
]


@pytest.mark.parametrize("options,fuses", [c[1:] for c in NORM_MUL_GRAPHS], ids=[c[0] for c in NORM_MUL_GRAPHS])
def test_a_norm_and_its_weight_fuse_only_when_the_norm_is_private(options, fuses, monkeypatch):
    graph, x, w, out, _galloc = _norm_mul_graph(**options)
    gen = torch.Generator().manual_seed(3)
    values = [torch.randn(x.ne[1], x.ne[0], generator=gen), torch.randn(w.ne[1], w.ne[0], generator=gen)]

    def compute(fast):
        for t, v in zip((x, w), values):
            ggml.backend_tensor_set(t, v)
        return run(graph, out, monkeypatch, fast)
    n_fast, fast = compute(True)
    n_plain, plain = compute(False)
    assert n_fast == n_plain - (1 if fuses else 0)
    xs = 2.0 * values[0].double()
    want = xs / torch.sqrt((xs * xs).mean(-1, keepdim=True) + 1e-6) * values[1].double()
    if options.get("other_reader"):
        want = want + xs / torch.sqrt((xs * xs).mean(-1, keepdim=True) + 1e-6)
    torch.testing.assert_close(fast.reshape(want.shape), want, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(plain.reshape(want.shape), want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("rows,n,w_rows,rms", [(1, 576, 1, True), (3, 64, 1, False), (2, 40, 2, True)])
def test_add_norm_mul_gives_the_bits_of_its_calls(rows, n, w_rows, rms):
    """op_kernels.add_norm_mul (the residual's ADD, then norm_mul of the sum) rounds as binary's
    ADD call then norm_mul do, and writes the sum too."""
    from torchggml.devices.cpu.jit.loader import op_kernels
    ops = op_kernels()
    gen = np.random.default_rng(rows + n)
    a, b = ((gen.standard_normal((1, 1, rows, n)) * 3).astype(np.float32) for _ in range(2))
    w = gen.standard_normal((1, 1, w_rows, n)).astype(np.float32)
    total, want = np.empty_like(a), np.empty_like(a)
    ops.binary(a, b, total, 0)
    ops.norm_mul(total, w, want, np.float32(1e-5), rms)
    got_total, got = np.empty_like(a), np.empty_like(a)
    ops.add_norm_mul(a, b, got_total, w, got, np.float32(1e-5), rms)
    assert np.array_equal(got_total, total) and np.array_equal(got, want)


@pytest.mark.parametrize("rows,fuses", [(1, True), (3, False)])
def test_a_residual_add_and_the_next_norm_fuse_keeping_the_sum(rows, fuses, monkeypatch):
    """x + y -> RMS_NORM -> MUL(w), the sum read again (a residual stream): one add_norm_mul
    call for the three, both the sum and the normed rows as the unfused nodes give them; rows
    whose output the allocator put over an operand (the scaled x, freed by the ADD) stay two
    calls, but for one row (read whole before it is written)."""
    ctx = ggml.init(mem_size=1 << 20, no_alloc=True)
    x, y, w = ggml.new_tensor_2d(ctx, T.F32, 64, rows), ggml.new_tensor_2d(ctx, T.F32, 64, rows), ggml.new_tensor_1d(ctx, T.F32, 64)
    for t in (x, y, w):
        ggml.set_input(t)
    total = ggml.add(ctx, ggml.scale(ctx, x, 1.0), y)
    out = ggml.add(ctx, ggml.mul(ctx, ggml.rms_norm(ctx, total, 1e-6), w), total)
    ggml.set_output(out)
    graph = ggml.new_graph(ctx)
    ggml.build_forward_expand(graph, out)
    galloc = ggml.gallocr_new(ggml.backend_cpu_buffer_type())
    assert ggml.gallocr_alloc_graph(galloc, graph)
    gen = torch.Generator().manual_seed(5)
    values = [torch.randn(rows, 64, generator=gen) for _ in range(2)] + [torch.randn(64, generator=gen)]

    def compute(fast):
        for t, v in zip((x, y, w), values):
            ggml.backend_tensor_set(t, v)
        return run(graph, out, monkeypatch, fast)
    n_fast, fast = compute(True)
    n_plain, plain = compute(False)
    assert n_fast == n_plain - (2 if fuses else 1)
    s = values[0].double() + values[1].double()
    want = s / torch.sqrt((s * s).mean(-1, keepdim=True) + 1e-6) * values[2].double() + s
    torch.testing.assert_close(fast.reshape(want.shape), want, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(plain.reshape(want.shape), want, rtol=1e-5, atol=1e-5)
