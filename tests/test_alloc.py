"""Memory planning: tallocr and gallocr (upstream ggml-alloc.c semantics).

Planning tests need no kernels; the compute-equality tests use only ops that have reference
kernels (TORCH_KERNELS.entries), so they grow as kernels are added.
"""
from __future__ import annotations

import random

import pytest
import torch

import torchggml as ggml
from torchggml import alloc as A  # the planner's internals (_DynAlloc)
from torchggml.enums import Op
from torchggml.storage import TorchBufferType
from torchggml.devices.kernels import TORCH_KERNELS

F32, F16 = ggml.Type.F32, ggml.Type.F16
NE = [8, 4]                      # the shape of every element-wise tensor below
T_BYTES = 8 * 4 * 4              # its size (a multiple of every alignment used here)


def cpu_buft():
    return ggml.backend_cpu_buffer_type()


def new_ctx():
    return ggml.init(no_alloc=True)


def new_input(ctx, name, ne=NE, type=F32):
    t = ggml.new_tensor(ctx, type, list(ne))
    ggml.set_name(t, name)
    ggml.set_input(t)
    return t


def graph_of(*outs):
    g = ggml.new_graph()
    for t in outs:
        ggml.build_forward_expand(g, t)
    return g


def offset(t):
    return t.data - t.buffer.get_base()


@pytest.fixture(scope="module")
def weights():
    """Pre-allocated tensors (as model weights are): W [8, 8], w [8, 4], d [8, 4] in [1, 2],
    s a scalar."""
    ctx = new_ctx()
    ws = {name: ggml.set_name(ggml.new_tensor(ctx, F32, ne), name)
          for name, ne in [("W", [8, 8]), ("w", NE), ("d", NE), ("s", [1])]}
    buffer = ggml.backend_alloc_ctx_tensors_from_buft(ctx, cpu_buft())
    gen = torch.Generator().manual_seed(0)
    for name, t in ws.items():
        lo, hi = (1.0, 2.0) if name == "d" else (-0.5, 0.5)
        ggml.backend_tensor_set(t, torch.rand(t.shape, generator=gen) * (hi - lo) + lo)
    ws["_keep"] = (ctx, buffer)
    return ws


# ---------------------------------------------------------------- the liveness checker

def _root(t):
    return t.view_src if t.view_src is not None else t


def live_ranges(graph):
    """{id(root): (root, first, last)}: a tensor's memory must stay intact from the node that
    produces it (-1 for leafs and inputs) to the last node that reads or writes it (directly or
    through a view); outputs forever."""
    first, last, roots = {}, {}, {}
    for leaf in graph.leafs:
        roots[id(_root(leaf))] = _root(leaf)
        first[id(_root(leaf))] = -1
    for i, node in enumerate(graph.nodes):
        r = _root(node)
        roots.setdefault(id(r), r)
        first.setdefault(id(r), -1 if node.flags & ggml.TensorFlag.INPUT else i)
        if node.view_src is not None:
            last[id(r)] = i  # a view node with an op (cpy, *_inplace) writes into its source
        for src in node.src:
            if src is not None:
                rs = _root(src)
                roots.setdefault(id(rs), rs)
                first.setdefault(id(rs), -1)
                last[id(rs)] = i
    inf = len(graph.nodes) + 1
    return {k: (r, first[k], inf if r.flags & ggml.TensorFlag.OUTPUT else max(last.get(k, first[k]), first[k]))
            for k, r in roots.items()}


def _reuses_in_place(graph, a, b, a_last, b_first):
    """b took over a's memory as upstream allows: an in-place op whose source a dies at b."""
    if b_first < 0 or a_last != b_first:
        return False
    node = graph.nodes[b_first]
    return node is b and ggml.op_can_inplace(node.op) and any(s is a for s in node.src) and a.data == b.data


def assert_no_live_overlap(graph):
    """No two tensors that are live at the same time share a byte, except in-place reuse."""
    ranges = [v for v in live_ranges(graph).values() if v[0].buffer is not None]
    for i, (a, a_first, a_last) in enumerate(ranges):
        a_size = a.buffer.buft.get_alloc_size(a)
        for b, b_first, b_last in ranges[i + 1:]:
            if a.buffer is not b.buffer or max(a_first, b_first) > min(a_last, b_last):
                continue
            b_size = b.buffer.buft.get_alloc_size(b)
            if a_size == 0 or b_size == 0 or a.data + a_size <= b.data or b.data + b_size <= a.data:
                continue
            (x, x_last), (y, y_first) = ((a, a_last), (b, b_first)) if a_first <= b_first else ((b, b_last), (a, a_first))
            assert _reuses_in_place(graph, x, y, x_last, y_first), (
                f"{x.describe()} [{offset(x)}, +{x.buffer.buft.get_alloc_size(x)}) live {a_first}..{a_last} "
                f"overlaps {y.describe()} [{offset(y)}, +{y.buffer.buft.get_alloc_size(y)}) live {b_first}..{b_last}")


def assert_allocated_and_aligned(graph, alignment):
    for t in list(graph.leafs) + list(graph.nodes):
        assert t.data is not None and t.buffer is not None, f"{t.describe()} was not allocated"
        if t.view_src is None:
            assert offset(t) % alignment == 0, f"{t.describe()} at offset {offset(t)} is not {alignment}-aligned"
            assert t.data % min(alignment, 64) == 0  # torch storages are 64-byte aligned
        else:
            assert t.data == t.view_src.data + t.view_offs


def shares(node, parent):
    return node.buffer is parent.buffer and node.data == parent.data


# ---------------------------------------------------------------- the dynamic allocator
# steps: ("alloc", name, size, (chunk, offset) expected) or ("free", name); then each chunk's max size

DYN_CASES = {
    "best_fit_merge_and_tail": (32, None, [
        ("alloc", "a", 64, (0, 0)), ("alloc", "b", 32, (0, 64)), ("alloc", "c", 128, (0, 96)),
        ("alloc", "d", 32, (0, 224)), ("free", "a"), ("free", "c"),
        ("alloc", "e", 64, (0, 0)),     # the smallest block that fits, not the last
        ("alloc", "f", 40, (0, 96)),    # padded to 64
        ("free", "b"),                  # [64, 96) stands alone
        ("alloc", "g", 128, (0, 256)),  # nothing else fits: the tail grows the buffer
        ("free", "f"),                  # merges on both sides: [64, 224)
        ("alloc", "h", 160, (0, 64)),
    ], [384]),
    "equal_blocks_take_the_later": (32, None, [
        ("alloc", "a", 64, (0, 0)), ("alloc", "b", 32, (0, 64)), ("alloc", "c", 64, (0, 96)),
        ("alloc", "d", 32, (0, 160)), ("free", "a"), ("free", "c"),
        ("alloc", "e", 64, (0, 96)),
    ], [192]),
    "chunks_when_max_size_is_reached": (32, 256, [
        ("alloc", "a", 200, (0, 0)),
        ("alloc", "b", 100, (1, 0)),    # 224 + 128 > 256: a second chunk
        ("alloc", "c", 50, (1, 128)),   # both tails fit: the one that grows its chunk least
        ("alloc", "d", 32, (0, 224)),   # ties keep the first chunk
        ("alloc", "e", 1000, (2, 0)),   # larger than the max: a chunk of its own
        ("free", "b"),
        ("alloc", "f", 96, (1, 0)),     # a free block before a tail is preferred
    ], [256, 192, 1024]),
    "tail_that_grows_least": (32, 256, [
        ("alloc", "a", 64, (0, 0)), ("alloc", "b", 224, (1, 0)), ("free", "b"),
        ("alloc", "c", 64, (1, 0)),     # chunk 1 holds it without growing, chunk 0 would grow
    ], [64, 224]),
}


@pytest.mark.parametrize("name", DYN_CASES)
def test_dyn_alloc(name):
    alignment, max_size, steps, max_sizes = DYN_CASES[name]
    dyn = A._DynAlloc(alignment, max_size or ggml.BufferType.get_max_size(None))
    placed = {}
    ctx = new_ctx()
    for step in steps:
        if step[0] == "alloc":
            _, key, size, expected = step
            placed[key] = (dyn.alloc(size, ggml.new_tensor_1d(ctx, ggml.Type.I8, size)), size)
            assert placed[key][0] == expected, f"{key}: {placed[key][0]} != {expected}"
        else:
            dyn.free(*placed.pop(step[1]))
    assert [dyn.max_size(c) for c in range(len(dyn.chunks))] == max_sizes


# ---------------------------------------------------------------- in-place reuse: where upstream allows it and nowhere else
# each case builds a graph and returns (graph, [(node, parent, shared?)])

def case_chain(ctx, w):
    x, y = new_input(ctx, "x"), new_input(ctx, "y")
    a = ggml.add(ctx, x, y)
    s = ggml.scale(ctx, a, 2.0)
    t = ggml.add(ctx, s, w["w"])
    return graph_of(t), [(a, x, True), (s, a, True), (t, s, True)]


def case_unary(ctx, w):
    a = ggml.add(ctx, new_input(ctx, "x"), new_input(ctx, "y"))
    u = ggml.silu(ctx, a)
    r = ggml.rms_norm(ctx, u, 1e-6)
    return graph_of(r), [(u, a, True), (r, u, True)]


def case_parent_output(ctx, w):
    a = ggml.add(ctx, new_input(ctx, "x"), new_input(ctx, "y"))
    ggml.set_output(a)
    s = ggml.scale(ctx, a, 2.0)
    return graph_of(s), [(s, a, False)]


def case_parent_has_another_consumer(ctx, w):
    a = ggml.add(ctx, new_input(ctx, "x"), new_input(ctx, "y"))
    s = ggml.scale(ctx, a, 2.0)
    m = ggml.mul(ctx, a, s)  # a's last consumer may take its memory
    return graph_of(m), [(s, a, False), (m, a, True)]


def case_parent_view_still_used(ctx, w):
    a = ggml.add(ctx, new_input(ctx, "x"), new_input(ctx, "y"))
    r = ggml.reshape_1d(ctx, a, 32)
    g = graph_of(r)  # r runs first: a has one consumer left (s) but a live view
    s = ggml.scale(ctx, a, 2.0)
    f = ggml.add(ctx, s, ggml.reshape_2d(ctx, ggml.cont(ctx, r), 8, 4))
    ggml.build_forward_expand(g, f)
    return g, [(s, a, False)]


def case_different_type(ctx, w):
    a = ggml.add(ctx, new_input(ctx, "x", type=F16), new_input(ctx, "y", type=F16))
    c = ggml.add_cast(ctx, a, w["w"], F32)  # an F16 parent, an F32 node
    return graph_of(c), [(c, a, False)]


def case_mul_mat(ctx, w):
    a = ggml.add(ctx, new_input(ctx, "x"), new_input(ctx, "y"))
    m = ggml.mul_mat(ctx, w["W"], a)  # same layout as a, but mul_mat reads a while writing
    return graph_of(m), [(m, a, False)]


def case_cont(ctx, w):
    a = ggml.add(ctx, new_input(ctx, "x"), new_input(ctx, "y"))
    c = ggml.cont(ctx, a)
    return graph_of(c), [(c, a, False)]


def case_weight_parent(ctx, w):
    s = ggml.scale(ctx, w["w"], 2.0)
    return graph_of(s), [(s, w["w"], False)]


def case_view_parent(ctx, w):
    a = ggml.add(ctx, new_input(ctx, "x"), new_input(ctx, "y"))
    v = ggml.reshape_2d(ctx, a, 8, 4)
    s = ggml.scale(ctx, v, 2.0)  # views are never planned here, so never reused (as upstream)
    return graph_of(s), [(s, a, False), (s, v, False)]


def case_second_source(ctx, w):
    a = ggml.add(ctx, new_input(ctx, "x"), new_input(ctx, "y"))
    m = ggml.mul(ctx, w["w"], a)  # src0 is a weight, src1 may be reused
    return graph_of(m), [(m, a, True)]


def case_broadcast_source(ctx, w):
    b = ggml.add(ctx, new_input(ctx, "x", [8, 2]), new_input(ctx, "y", [8, 2]))
    m = ggml.mul(ctx, w["w"], b)  # b is broadcast: a different layout
    return graph_of(m), [(m, b, False)]


def case_input_leaf(ctx, w):
    x = new_input(ctx, "x")
    s = ggml.scale(ctx, x, 2.0)  # upstream lets an input's last consumer overwrite it
    return graph_of(s), [(s, x, True)]


INPLACE_CASES = [case_chain, case_unary, case_parent_output, case_parent_has_another_consumer,
                 case_parent_view_still_used, case_different_type, case_mul_mat, case_cont,
                 case_weight_parent, case_view_parent, case_second_source, case_broadcast_source,
                 case_input_leaf]


@pytest.mark.parametrize("case", INPLACE_CASES, ids=lambda c: c.__name__[5:])
def test_inplace_reuse(case, weights):
    ctx = new_ctx()
    graph, expectations = case(ctx, weights)
    galloc = ggml.gallocr_new(cpu_buft())
    assert ggml.gallocr_alloc_graph(galloc, graph)
    for node, parent, shared in expectations:
        assert shares(node, parent) == shared, \
            f"{node.describe()} {'should' if shared else 'must not'} share {parent.describe()}'s memory"
    assert_no_live_overlap(graph)
    assert_allocated_and_aligned(graph, cpu_buft().get_alignment())


# ---------------------------------------------------------------- planned size is the high-water mark

def chain_elementwise(ctx, w, n):
    t = new_input(ctx, "x")
    for i in range(n):
        t = ggml.add(ctx, t, w["w"]) if i % 2 else ggml.mul(ctx, t, w["d"])
    return t


def chain_cont(ctx, w, n):
    t = new_input(ctx, "x")
    for _ in range(n):
        t = ggml.cont(ctx, t)
    return t


def chain_mul_mat(ctx, w, n):
    t = new_input(ctx, "x")
    for _ in range(n):
        t = ggml.mul_mat(ctx, w["W"], t)
    return t


def chain_outputs(ctx, w, n):
    """Every 10th node is an output: outputs stay, the rest ping-pongs."""
    t = new_input(ctx, "x")
    for i in range(n):
        t = ggml.cont(ctx, t)
        if i % 10 == 9:
            ggml.set_output(t)
    return t


@pytest.mark.parametrize("build, n, tensors", [
    (chain_elementwise, 40, 1),  # every node takes over its parent's memory (the input's too)
    (chain_cont, 40, 2),         # no in-place: two buffers ping-pong
    (chain_mul_mat, 40, 2),
    (chain_outputs, 40, 2 + 3),  # outputs 9, 19, 29 kept apart from the pair (39 is one of it)
], ids=lambda v: getattr(v, "__name__", str(v)))
def test_planned_size_is_high_water_mark(build, n, tensors, weights):
    ctx = new_ctx()
    graph = graph_of(build(ctx, weights, n))
    galloc = ggml.gallocr_new(cpu_buft())
    assert ggml.gallocr_reserve(galloc, graph)
    assert ggml.gallocr_get_buffer_size(galloc, 0) == tensors * T_BYTES
    assert ggml.gallocr_reserve_n_size(galloc, graph) == [tensors * T_BYTES]
    assert ggml.gallocr_alloc_graph(galloc, graph)
    assert_no_live_overlap(graph)


def test_outputs_keep_their_memory(weights):
    ctx = new_ctx()
    t = new_input(ctx, "x")
    nodes = []
    for i in range(12):
        t = ggml.cont(ctx, t) if i % 3 else ggml.scale(ctx, t, 0.5)
        nodes.append(t)
    out = nodes[4]
    ggml.set_output(out)
    graph = graph_of(t)
    galloc = ggml.gallocr_new(cpu_buft())
    assert ggml.gallocr_alloc_graph(galloc, graph)
    lo, hi = out.data, out.data + T_BYTES
    for later in nodes[5:]:
        assert later.data + T_BYTES <= lo or later.data >= hi, f"{later.describe()} overwrites the output"


def test_inputs_get_memory_before_any_node(weights):
    """A graph without leafs (a graph_view, as the scheduler's splits are): inputs reached only
    as sources are still allocated before the first node, apart from everything."""
    ctx = new_ctx()
    x, y = new_input(ctx, "x"), new_input(ctx, "y")
    t = ggml.cont(ctx, x)
    t = ggml.cont(ctx, ggml.cont(ctx, t))
    t = ggml.add(ctx, t, y)  # y's first use comes after memory was freed
    full = graph_of(t)
    graph = ggml.graph_view(full, 0, len(full.nodes))
    assert not graph.leafs
    galloc = ggml.gallocr_new(cpu_buft())
    assert ggml.gallocr_alloc_graph(galloc, graph)
    assert_no_live_overlap(graph)
    assert {offset(x), offset(y)} == {0, T_BYTES}


# ---------------------------------------------------------------- random graphs

def _pick(rng, pool, recent=6):
    return rng.choice(pool[-recent:] if rng.random() < 0.7 else pool)


def _binary(fn):
    def build(ctx, rng, pool, w):
        return fn(ctx, _pick(rng, pool), _pick(rng, pool + [w["w"]]))
    return build


def _view_half(ctx, rng, pool, w):
    b = _pick(rng, pool)
    half = ggml.view_2d(ctx, b, 8, 2, b.nb[1], rng.choice([0, 2]) * b.nb[1])
    return ggml.add(ctx, _pick(rng, pool), half)


def _reshape_round_trip(ctx, rng, pool, w):
    a = ggml.reshape_2d(ctx, ggml.reshape_1d(ctx, _pick(rng, pool), 32), 8, 4)
    return ggml.mul(ctx, a, _pick(rng, pool))


def _cpy(ctx, rng, pool, w):
    dst = ggml.set_name(ggml.new_tensor(ctx, F32, NE), f"dst{len(pool)}")
    return ggml.cpy(ctx, _pick(rng, pool), dst)


def _add_inplace(ctx, rng, pool, w):
    a = _pick(rng, pool)
    if a.view_src is not None or a.flags & ggml.TensorFlag.INPUT:
        return None
    return ggml.add_inplace(ctx, a, w["w"])


# (name, op needing a kernel, builder)
RANDOM_OPS = [
    ("add", Op.ADD, _binary(ggml.add)),
    ("sub", Op.SUB, _binary(ggml.sub)),
    ("mul", Op.MUL, _binary(ggml.mul)),
    ("div", Op.DIV, lambda ctx, rng, pool, w: ggml.div(ctx, _pick(rng, pool), w["d"])),
    ("add1", Op.ADD1, lambda ctx, rng, pool, w: ggml.add1(ctx, _pick(rng, pool), w["s"])),
    ("mul_mat", Op.MUL_MAT, lambda ctx, rng, pool, w: ggml.mul_mat(ctx, w["W"], _pick(rng, pool))),
    ("cont_t", Op.CONT, lambda ctx, rng, pool, w: ggml.cont_2d(ctx, ggml.transpose(ctx, _pick(rng, pool)), 8, 4)),
    ("view_half", Op.ADD, _view_half),
    ("reshape", Op.MUL, _reshape_round_trip),
    ("cpy", Op.CPY, _cpy),
    ("add_inplace", Op.ADD, _add_inplace),
    ("scale", Op.SCALE, lambda ctx, rng, pool, w: ggml.scale(ctx, _pick(rng, pool), 0.5)),
    ("silu", Op.UNARY, lambda ctx, rng, pool, w: ggml.silu(ctx, _pick(rng, pool))),
    ("sqr", Op.SQR, lambda ctx, rng, pool, w: ggml.sqr(ctx, _pick(rng, pool))),
    ("soft_max", Op.SOFT_MAX, lambda ctx, rng, pool, w: ggml.soft_max(ctx, _pick(rng, pool))),
    ("rms_norm", Op.RMS_NORM, lambda ctx, rng, pool, w: ggml.rms_norm(ctx, _pick(rng, pool), 1e-6)),
]


def random_graph(ctx, w, seed, ops, n_nodes=40):
    """A random graph over [8, 4] F32 tensors; returns (graph, inputs, outputs)."""
    rng = random.Random(seed)
    inputs = [new_input(ctx, f"in{i}") for i in range(rng.randint(1, 3))]
    pool, outputs = list(inputs), []
    graph = ggml.new_graph()
    for _ in range(n_nodes):
        t = rng.choice(ops)[2](ctx, rng, pool, w)
        if t is None:
            continue
        ggml.build_forward_expand(graph, t)
        pool.append(t)
        if rng.random() < 0.15:
            ggml.set_output(t)
            outputs.append(t)
    ggml.set_output(pool[-1])
    outputs.append(pool[-1])
    return graph, [t for t in inputs if id(t) in graph.visited], outputs


@pytest.mark.parametrize("seed", range(12))
@pytest.mark.parametrize("alignment", [32, 128])
def test_random_graphs_plan_without_overlap(seed, alignment, weights):
    buft = TorchBufferType(f"CPU_align{alignment}", None, "cpu", host=True, alignment=alignment)
    graph, _, _ = random_graph(new_ctx(), weights, seed, RANDOM_OPS)
    galloc = ggml.gallocr_new(buft)
    assert ggml.gallocr_alloc_graph(galloc, graph)
    assert_no_live_overlap(graph)
    assert_allocated_and_aligned(graph, alignment)
    assert all(t.buffer.usage == ggml.BufferUsage.COMPUTE for t in graph.nodes if t.buffer.buft is buft)


def _compute(graph_builder, use_gallocr, input_seed):
    ctx = new_ctx()
    graph, inputs, outputs = graph_builder(ctx)
    backend = ggml.backend_cpu_init()
    if use_gallocr:
        galloc = ggml.gallocr_new(cpu_buft())
        assert ggml.gallocr_alloc_graph(galloc, graph)
    else:
        ggml.backend_alloc_ctx_tensors(ctx, backend)
    gen = torch.Generator().manual_seed(input_seed)
    for t in inputs:
        ggml.backend_tensor_set(t, torch.rand(t.shape, generator=gen) * 2 - 1)
    assert ggml.backend_graph_compute(backend, graph) == ggml.Status.SUCCESS
    return [ggml.backend_tensor_get(t) for t in outputs]


COMPUTE_OPS = [op for op in RANDOM_OPS if op[1] in TORCH_KERNELS.entries]


@pytest.mark.parametrize("seed", range(8))
def test_random_graphs_compute_same_as_separate_memory(seed, weights):
    build = lambda ctx: random_graph(ctx, weights, 100 + seed, COMPUTE_OPS)  # noqa: E731
    planned = _compute(build, use_gallocr=True, input_seed=seed)
    separate = _compute(build, use_gallocr=False, input_seed=seed)
    for p, s in zip(planned, separate):
        torch.testing.assert_close(p, s, rtol=1e-6, atol=1e-6)


# ---------------------------------------------------------------- reserve, re-reserve, reuse

def cont_chain_graph(ne0, n):
    ctx = new_ctx()
    t = new_input(ctx, "x", [ne0])
    for _ in range(n):
        t = ggml.cont(ctx, t)
    return graph_of(t), ctx


def test_bigger_graph_grows_the_buffer_and_smaller_reuses_it():
    galloc = ggml.gallocr_new(cpu_buft())
    small, _ = cont_chain_graph(64, 4)
    assert ggml.gallocr_reserve(galloc, small)
    assert ggml.gallocr_get_buffer_size(galloc, 0) == 2 * 64 * 4

    big, _ = cont_chain_graph(256, 6)  # more nodes and bigger ones: re-reserved automatically
    assert ggml.gallocr_alloc_graph(galloc, big)
    assert ggml.gallocr_get_buffer_size(galloc, 0) == 2 * 256 * 4
    buffer = big.nodes[0].buffer

    same_count, _ = cont_chain_graph(512, 6)  # same node count, bigger tensors: re-reserved
    assert ggml.gallocr_alloc_graph(galloc, same_count)
    assert ggml.gallocr_get_buffer_size(galloc, 0) == 2 * 512 * 4
    buffer = same_count.nodes[0].buffer
    assert buffer is not big.nodes[0].buffer

    for smaller in (cont_chain_graph(64, 3)[0], cont_chain_graph(128, 6)[0]):
        assert ggml.gallocr_alloc_graph(galloc, smaller)
        assert ggml.gallocr_get_buffer_size(galloc, 0) == 2 * 512 * 4
        assert all(t.buffer is buffer for t in smaller.nodes), "a smaller graph must not reallocate"
        assert_no_live_overlap(smaller)


def test_reserve_does_not_touch_the_graph():
    graph, _ = cont_chain_graph(64, 4)
    galloc = ggml.gallocr_new(cpu_buft())
    assert ggml.gallocr_reserve(galloc, graph)
    assert all(t.data is None and t.buffer is None for t in graph.nodes + graph.leafs)


def test_multi_buffer_graph_needs_an_explicit_reserve():
    b0 = TorchBufferType("CPU_a", None, "cpu", host=True)
    b1 = TorchBufferType("CPU_b", None, "cpu", host=True)
    galloc = ggml.gallocr_new_n([b0, b1])
    small, _ = cont_chain_graph(64, 4)
    ids = [i % 2 for i in range(len(small.nodes))]
    assert ggml.gallocr_reserve_n(galloc, small, ids, [0] * len(small.leafs))
    big, _ = cont_chain_graph(64, 6)
    assert not ggml.gallocr_alloc_graph(galloc, big)  # as upstream: cannot re-plan several buffers alone
    ids = [i % 2 for i in range(len(big.nodes))]
    assert ggml.gallocr_reserve_n(galloc, big, ids, [1] * len(big.leafs))
    assert ggml.gallocr_alloc_graph(galloc, big)
    for node, b in zip(big.nodes, ids):
        assert node.buffer.buft is (b0, b1)[b]
    assert big.leafs[0].buffer.buft is b1
    # buffer 1: the input, then odd nodes ping-pong with the even ones in buffer 0, so one
    # tensor at a time; buffer 0 keeps the 2 tensors the first plan gave it (buffers never shrink)
    assert ggml.gallocr_get_buffer_size(galloc, 0) == 2 * 64 * 4
    assert ggml.gallocr_get_buffer_size(galloc, 1) == 64 * 4
    assert_no_live_overlap(big)


def test_same_buffer_type_twice_shares_one_buffer():
    buft = cpu_buft()
    galloc = ggml.gallocr_new_n([buft, buft])
    graph, _ = cont_chain_graph(64, 6)
    ids = [i % 2 for i in range(len(graph.nodes))]
    assert ggml.gallocr_reserve_n(galloc, graph, ids, [0] * len(graph.leafs))
    assert ggml.gallocr_alloc_graph(galloc, graph)
    assert ggml.gallocr_get_buffer_size(galloc, 0) == 2 * 64 * 4
    assert ggml.gallocr_get_buffer_size(galloc, 1) == 0  # counted once
    assert len({id(t.buffer) for t in graph.nodes}) == 1
    assert_no_live_overlap(graph)


class FailingBufferType(TorchBufferType):
    def alloc_buffer(self, size):
        raise MemoryError(f"{self.name}: out of memory for {size} bytes")


def test_failed_buffer_allocation_returns_false():
    galloc = ggml.gallocr_new(FailingBufferType("CPU_full", None, "cpu", host=True))
    graph, _ = cont_chain_graph(64, 2)
    assert not ggml.gallocr_reserve(galloc, graph)
    assert not ggml.gallocr_alloc_graph(galloc, graph)
    assert ggml.gallocr_get_buffer_size(galloc, 0) == 0
    with pytest.raises(IndexError, match="buffer id 1"):
        ggml.gallocr_get_buffer_size(galloc, 1)


def test_free_then_reuse():
    galloc = ggml.gallocr_new(cpu_buft())
    graph, _ = cont_chain_graph(64, 3)
    assert ggml.gallocr_alloc_graph(galloc, graph)
    buffer = graph.nodes[0].buffer
    ggml.gallocr_free(galloc)
    assert buffer.freed and ggml.gallocr_get_buffer_size(galloc, 0) == 0
    graph, _ = cont_chain_graph(64, 3)
    assert ggml.gallocr_alloc_graph(galloc, graph)  # plans again from nothing
    assert ggml.gallocr_get_buffer_size(galloc, 0) == 2 * 64 * 4


@pytest.mark.parametrize("node_ids, leaf_ids, match", [
    ([0], None, "node_buffer_ids has 1 entries"),
    (None, [2], r"leaf_buffer_ids\[0\] = 2"),
])
def test_reserve_n_checks_buffer_ids(node_ids, leaf_ids, match):
    graph, _ = cont_chain_graph(64, 2)
    with pytest.raises(ValueError, match=match):
        ggml.gallocr_reserve_n(ggml.gallocr_new(cpu_buft()), graph, node_ids, leaf_ids)


# ---------------------------------------------------------------- buffer types with a max size: chunks

class SmallMaxBufferType(TorchBufferType):
    def __init__(self, max_size):
        super().__init__(f"CPU_max{max_size}", None, "cpu", host=True)
        self.max_size = max_size

    def get_max_size(self):
        return self.max_size


def wide_graph(ctx, n_inputs, ne0, big=None):
    """n inputs all live at once, summed; optionally one tensor of `big` elements."""
    ins = [new_input(ctx, f"in{i}", [ne0]) for i in range(n_inputs)]
    t = ins[0]
    for x in ins[1:]:
        t = ggml.add(ctx, t, x)
    outs = [t]
    if big is not None:
        xb = new_input(ctx, "big", [big])
        outs.append(ggml.add(ctx, xb, xb))
        ins.append(xb)
    for o in outs:
        ggml.set_output(o)
    return graph_of(*outs), ins, outs


def test_max_size_splits_into_chunks():
    buft = SmallMaxBufferType(512)
    ctx = new_ctx()
    graph, ins, outs = wide_graph(ctx, 8, 32, big=512)  # 8 x 128 bytes, and one of 2048 bytes
    galloc = ggml.gallocr_new(buft)
    assert ggml.gallocr_alloc_graph(galloc, graph)
    buffers = {id(t.buffer): t.buffer for t in graph.nodes + graph.leafs}
    assert len(buffers) >= 3
    assert all(b.size <= 512 or b.size == 2048 for b in buffers.values())
    assert ggml.gallocr_get_buffer_size(galloc, 0) == sum(b.size for b in buffers.values())
    assert_no_live_overlap(graph)
    assert_allocated_and_aligned(graph, buft.get_alignment())

    # and it computes: the sum of the inputs
    backend = ggml.backend_cpu_init()
    xs = [torch.rand(32) for _ in range(8)] + [torch.rand(512)]
    for t, x in zip(ins, xs):
        ggml.backend_tensor_set(t, x)
    assert ggml.backend_graph_compute(backend, graph) == ggml.Status.SUCCESS
    torch.testing.assert_close(ggml.backend_tensor_get(outs[0]).reshape(-1), sum(xs[:8]))
    torch.testing.assert_close(ggml.backend_tensor_get(outs[1]).reshape(-1), 2 * xs[8])


# ---------------------------------------------------------------- tallocr

def test_tallocr_places_linearly_and_fails_clearly():
    buffer = cpu_buft().alloc_buffer(256)
    talloc = ggml.tallocr_new(buffer)
    ctx = new_ctx()
    ts = [ggml.set_name(ggml.new_tensor_1d(ctx, F32, 25), f"t{i}") for i in range(3)]  # 100 bytes each
    assert ggml.tallocr_alloc(talloc, ts[0]) == ggml.Status.SUCCESS
    assert ggml.tallocr_alloc(talloc, ts[1]) == ggml.Status.SUCCESS
    assert [offset(t) for t in ts[:2]] == [0, 128]
    with pytest.raises(MemoryError, match=r"buffer CPU \(256 bytes\).*'t2'.*needs 128 bytes, 0 available"):
        ggml.tallocr_alloc(talloc, ts[2])
    assert ts[2].data is None


def test_alloc_ctx_tensors_places_views_and_skips_allocated(weights):
    ctx = new_ctx()
    a = ggml.new_tensor_2d(ctx, F32, 8, 4)
    v = ggml.view_1d(ctx, a, 8, 32)
    b = ggml.new_tensor_1d(ctx, F16, 3)
    wv = ggml.view_1d(ctx, weights["w"], 4, 0)  # a view of an allocated tensor already has memory
    assert ggml.backend_alloc_ctx_tensors_from_buft_size(ctx, cpu_buft()) == 128 + 32
    buffer = ggml.backend_alloc_ctx_tensors_from_buft(ctx, cpu_buft())
    assert buffer.size == 160
    assert (offset(a), offset(b)) == (0, 128)
    assert v.data == a.data + 32 and v.buffer is buffer
    assert wv.data == weights["w"].data
