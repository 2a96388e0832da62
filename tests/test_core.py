"""The core API: types, tensors and views, names and flags, layout predicates, graph building,
zero-copy torch interop, tensor data in and out, and clear errors for bad input."""
from __future__ import annotations

import gguf
import numpy as np
import pytest
import torch

import torchggml as ggml
from torchggml.enums import Op
from torchggml.storage import UnallocatedTensorError

T = ggml.Type
F = ggml.TensorFlag


def meta_ctx():
    return ggml.init(no_alloc=True)


@pytest.fixture
def ctx():
    c = ggml.init(mem_size=1 << 20)
    yield c
    ggml.free(c)


@pytest.fixture(scope="module")
def cpu():
    return ggml.backend_cpu_init()


# ---------------------------------------------------------------- types

# gguf's table still lists Q8_1 with float32 d and s (4 + 4 + 32 bytes); ggml's block_q8_1 holds
# two halves (2 + 2 + 32 = 36), which is what ggml uses
_GGUF_STALE = {T.Q8_1: (32, 36)}
# types newer than the installed gguf: (block, bytes) from ggml-common.h's block_q2_0 {half d; uint8 qs[16]}
_NOT_IN_GGUF = {T.Q2_0: (64, 18)}


@pytest.mark.parametrize("type", list(T), ids=lambda t: t.name)
def test_type_sizes_match_gguf(type):
    if type in _NOT_IN_GGUF and int(type) not in set(gguf.GGMLQuantizationType):
        assert (ggml.blck_size(type), ggml.type_size(type)) == _NOT_IN_GGUF[type]
        return
    expected = _GGUF_STALE.get(type) or gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType(int(type))]
    assert (ggml.blck_size(type), ggml.type_size(type)) == expected
    assert ggml.type_name(type).upper() == gguf.GGMLQuantizationType(int(type)).name
    assert ggml.is_quantized(type) == (expected[0] > 1)


@pytest.mark.parametrize("type", list(T), ids=lambda t: t.name)
def test_row_size(type):
    bs, ts = ggml.blck_size(type), ggml.type_size(type)
    assert ggml.row_size(type, 4 * bs) == 4 * ts
    if bs > 1:
        with pytest.raises(ValueError, match="block size"):
            ggml.row_size(type, bs + 1)


@pytest.mark.parametrize("type, dtype", [(T.F32, torch.float32), (T.F16, torch.float16), (T.BF16, torch.bfloat16),
                                         (T.F64, torch.float64), (T.I8, torch.int8), (T.I16, torch.int16),
                                         (T.I32, torch.int32), (T.I64, torch.int64)])
def test_plain_type_dtypes(type, dtype):
    assert ggml.type_to_dtype(type) == dtype
    assert ggml.dtype_to_type(dtype) == type


def test_block_types_have_no_dtype():
    with pytest.raises(TypeError, match="q4_0 is a block type"):
        ggml.type_to_dtype(T.Q4_0)


def _nbytes_formula(t):
    """ggml's nbytes: ne0*nb0/block + sum((ne[i]-1)*nb[i], i>=1); block size 1: type_size + sum((ne[i]-1)*nb[i])."""
    bs = ggml.blck_size(t.type)
    if bs == 1:
        return ggml.type_size(t.type) + sum((t.ne[i] - 1) * t.nb[i] for i in range(4))
    return t.ne[0] * t.nb[0] // bs + sum((t.ne[i] - 1) * t.nb[i] for i in range(1, 4))


def _make(kind):
    """(tensor, expected nbytes) for a contiguous tensor, a permutation and views."""
    c = meta_ctx()
    a = ggml.new_tensor_4d(c, T.F32, 8, 6, 4, 3)
    q = ggml.new_tensor_2d(c, T.Q4_0, 64, 5)
    return {
        "contiguous F32": (a, 8 * 6 * 4 * 3 * 4),
        "contiguous Q4_0": (q, 5 * 2 * 18),
        "transposed": (ggml.transpose(c, a), 8 * 6 * 4 * 3 * 4),
        "permuted": (ggml.permute(c, a, 3, 1, 0, 2), 8 * 6 * 4 * 3 * 4),
        "view_2d strided rows": (ggml.view_2d(c, a, 5, 3, 2 * 32, 0), 5 * 4 + 2 * 64),
        "view_1d": (ggml.view_1d(c, a, 7, 12), 28),
        "Q4_0 rows view": (ggml.view_2d(c, q, 64, 2, 2 * q.nb[1], q.nb[1]), 36 + 72),
        "empty": (ggml.new_tensor_2d(c, T.F32, 0, 4), 0),
    }[kind]


@pytest.mark.parametrize("kind", ["contiguous F32", "contiguous Q4_0", "transposed", "permuted",
                                  "view_2d strided rows", "view_1d", "Q4_0 rows view", "empty"])
def test_nbytes(kind):
    t, expected = _make(kind)
    assert ggml.nbytes(t) == expected
    if expected:
        assert ggml.nbytes(t) == _nbytes_formula(t)


def test_nelements_nrows():
    c = meta_ctx()
    t = ggml.new_tensor_4d(c, T.F16, 5, 4, 3, 2)
    assert ggml.nelements(t) == 120 and ggml.nrows(t) == 24 and ggml.n_dims(t) == 4
    assert ggml.n_dims(ggml.new_tensor_2d(c, T.F16, 5, 1)) == 1


# ---------------------------------------------------------------- tensor creation and views

@pytest.mark.parametrize("ne", [[7], [7, 3], [7, 3, 2], [7, 3, 2, 5]])
def test_new_tensor_nd(ne):
    c = meta_ctx()
    t = getattr(ggml, f"new_tensor_{len(ne)}d")(c, T.F16, *ne)
    full = ne + [1] * (4 - len(ne))
    assert t.ne == full
    assert t.nb == [2, 14, 14 * full[1], 14 * full[1] * full[2]]
    assert t.op == Op.NONE and t.view_src is None and t.data is None
    assert ggml.get_first_tensor(c) is t


def test_new_tensor_block_type_strides():
    t = ggml.new_tensor_3d(meta_ctx(), T.Q8_0, 64, 3, 2)
    assert t.nb == [34, 68, 204, 408]


@pytest.mark.parametrize("ne, match", [([1, 2, 3, 4, 5], "1 to 4"), ([4, -1], "negative"),
                                       ([33, 2], "block size")])
def test_new_tensor_rejects_bad_shapes(ne, match):
    type = T.Q4_0 if match == "block size" else T.F32
    with pytest.raises(ValueError, match=match):
        ggml.new_tensor(meta_ctx(), type, ne)


def test_dup_tensor_and_view_tensor(ctx):
    a = ggml.transpose(ctx, ggml.new_tensor_2d(ctx, T.F32, 4, 3))
    d = ggml.dup_tensor(ctx, a)
    assert d.type == a.type and d.ne == a.ne and ggml.is_contiguous(d) and d.view_src is None
    assert d.data != a.data
    root = ggml.set_name(ggml.new_tensor_2d(ctx, T.F32, 4, 3), "x")
    v = ggml.view_tensor(ctx, root)
    assert v.view_src is root and v.view_offs == 0 and v.nb == root.nb and v.data == root.data
    assert ggml.get_name(v) == "x (view)"


def test_views_of_views_fold_to_the_root(ctx):
    root = ggml.new_tensor_2d(ctx, T.F32, 16, 8)
    v1 = ggml.view_2d(ctx, root, 16, 4, root.nb[1], 2 * root.nb[1])
    v2 = ggml.view_1d(ctx, v1, 8, 12)
    v3 = ggml.transpose(ctx, ggml.reshape_2d(ctx, v2, 4, 2))
    assert v1.view_src is root and v2.view_src is root and v3.view_src is root
    assert v2.view_offs == 2 * 64 + 12 and v3.view_offs == v2.view_offs
    assert v2.data == root.data + v2.view_offs
    assert v2.src[0] is v1 and v2.op == Op.VIEW  # the graph edge stays the direct source


def test_view_op_params_hold_the_offset():
    c = meta_ctx()
    v = ggml.view_1d(c, ggml.new_tensor_1d(c, T.F32, 64), 8, 40)
    assert (ggml.get_op_params_i32(v, 0), ggml.get_op_params_i32(v, 1)) == (40, 0)
    p = ggml.permute(c, ggml.new_tensor_3d(c, T.F32, 2, 3, 4), 2, 0, 1, 3)
    assert [ggml.get_op_params_i32(p, i) for i in range(4)] == [2, 0, 1, 3]
    assert p.ne == [3, 4, 2, 1]


@pytest.mark.parametrize("builder, name", [
    (lambda c, a: ggml.transpose(c, a), "a (transposed)"),
    (lambda c, a: ggml.permute(c, a, 1, 0, 2, 3), "a (permuted)"),
    (lambda c, a: ggml.reshape_1d(c, a, 12), "a (reshaped)"),
    (lambda c, a: ggml.view_1d(c, a, 3, 0), "a (view)"),
    (lambda c, a: ggml.cont(c, a), "a (cont)"),
    (lambda c, a: ggml.cpy(c, a, ggml.new_tensor_2d(c, T.F16, 4, 3)), "a (copy)"),
    (lambda c, a: ggml.cpy(c, a, ggml.set_name(ggml.new_tensor_2d(c, T.F16, 4, 3), "b")), "b (copy of a)"),
])
def test_derived_names(builder, name):
    c = meta_ctx()
    a = ggml.set_name(ggml.new_tensor_2d(c, T.F32, 4, 3), "a")
    assert ggml.get_name(builder(c, a)) == name


# ---------------------------------------------------------------- what the op builders return

def _built(make):
    c = meta_ctx()
    a = ggml.new_tensor_3d(c, T.F16, 8, 3, 2)
    return make(c, a), a


@pytest.mark.parametrize("make, type, ne, params", [
    (lambda c, a: ggml.sum(c, a), T.F16, [1, 1, 1, 1], []),
    (lambda c, a: ggml.sum_rows(c, a), T.F16, [1, 3, 2, 1], []),
    (lambda c, a: ggml.mean(c, a), T.F32, [1, 3, 2, 1], []),
    (lambda c, a: ggml.argmax(c, ggml.view_2d(c, a, 8, 6, a.nb[1], 0)), T.I32, [6, 1, 1, 1], []),
    (lambda c, a: ggml.count_equal(c, a, a), T.I64, [1, 1, 1, 1], []),
    (lambda c, a: ggml.argsort(c, a, ggml.SortOrder.DESC), T.I32, [8, 3, 2, 1], [1]),
    (lambda c, a: ggml.top_k(c, a, 3), T.I32, [3, 3, 2, 1], []),
    (lambda c, a: ggml.swiglu(c, a), T.F16, [4, 3, 2, 1], [int(ggml.GluOp.SWIGLU), 0]),
    (lambda c, a: ggml.geglu_swapped(c, a), T.F16, [4, 3, 2, 1], [int(ggml.GluOp.GEGLU), 1]),
    (lambda c, a: ggml.gelu(c, a), T.F16, [8, 3, 2, 1], [int(ggml.UnaryOp.GELU)]),
    (lambda c, a: ggml.concat(c, a, a, 2), T.F16, [8, 3, 4, 1], [2]),
    (lambda c, a: ggml.repeat_4d(c, a, 16, 3, 4, 2), T.F16, [16, 3, 4, 2], []),
    (lambda c, a: ggml.pad_ext(c, a, 1, 2, 0, 1, 3, 0, 0, 1), T.F16, [11, 4, 5, 2], [1, 2, 0, 1, 3, 0, 0, 1, 0]),
    (lambda c, a: ggml.pad_circular(c, a, 1, 2), T.F16, [9, 5, 2, 1], [0, 1, 0, 2, 0, 0, 0, 0, 1]),
    (lambda c, a: ggml.arange(c, 0.0, 1.0, 0.1), T.F32, [10, 1, 1, 1], []),  # ceilf(1 / 0.1f) in float32
    (lambda c, a: ggml.diag_mask_inf(c, a, 2), T.F16, [8, 3, 2, 1], [2]),
    (lambda c, a: ggml.cast(c, a, T.BF16), T.BF16, [8, 3, 2, 1], []),
])
def test_builder_results(make, type, ne, params):
    t, _ = _built(make)
    assert t.type == type and t.ne == ne
    assert [ggml.get_op_params_i32(t, i) for i in range(len(params))] == params


@pytest.mark.parametrize("make", [
    lambda c, a: ggml.add_inplace(c, a, a),
    lambda c, a: ggml.scale_inplace(c, a, 2.0),
    lambda c, a: ggml.silu_inplace(c, a),
    lambda c, a: ggml.sqr_inplace(c, a),
    lambda c, a: ggml.clamp(c, a, -1.0, 1.0),  # ggml's clamp is always in place
    lambda c, a: ggml.diag_mask_inf_inplace(c, a, 0),
    lambda c, a: ggml.leaky_relu(c, a, 0.1, True),
])
def test_inplace_builders_return_views_of_their_source(make):
    t, a = _built(make)
    assert t.view_src is a and t.view_offs == 0 and t.src[0] is a


def test_float_op_params_are_stored_as_float32_bits():
    t, _ = _built(lambda c, a: ggml.swiglu_oai(c, a, a, 1.702, 7.0))
    assert ggml.get_op_params_f32(t, 2) == np.float32(1.702) and ggml.get_op_params_f32(t, 3) == 7.0
    s, _ = _built(lambda c, a: ggml.scale_bias(c, a, 0.5, -1.25))
    assert (ggml.get_op_params_f32(s, 0), ggml.get_op_params_f32(s, 1)) == (0.5, -1.25)


# ---------------------------------------------------------------- names and flags

def test_names():
    c = meta_ctx()
    t = ggml.new_tensor_1d(c, T.F32, 4)
    assert ggml.get_name(ggml.set_name(t, "x" * 100)) == "x" * 63  # GGML_MAX_NAME - 1
    assert ggml.get_name(ggml.format_name(t, "blk.%d.%s", 3, "attn_q")) == "blk.3.attn_q"
    assert ggml.get_tensor(c, "blk.3.attn_q") is t


def test_flags():
    c = meta_ctx()
    a = ggml.new_tensor_2d(c, T.F32, 8, 4)
    v = ggml.view_2d(c, ggml.view_tensor(c, a), 8, 2, a.nb[1], 0)
    ggml.set_output(v)
    assert v.flags & F.OUTPUT and a.flags & F.OUTPUT  # the view's root is kept too
    b = ggml.new_tensor_1d(c, T.F32, 4)
    ggml.set_input(b)
    ggml.set_param(b)
    assert b.flags == F.INPUT | F.PARAM
    with pytest.raises(ValueError, match="not a leaf"):
        ggml.set_param(ggml.sqr(c, b))


# ---------------------------------------------------------------- layout predicates

def _layouts():
    c = meta_ctx()
    a = ggml.new_tensor_3d(c, T.F32, 4, 3, 2)
    return {
        "contiguous": a,
        "transposed": ggml.transpose(c, a),
        "permuted 0213": ggml.permute(c, a, 0, 2, 1, 3),
        "view strided rows": ggml.view_2d(c, a, 2, 3, a.nb[1], 0),
        "view prefix": ggml.view_1d(c, a, 5, 0),
        "reshape": ggml.reshape_2d(c, a, 6, 4),
    }


@pytest.mark.parametrize("kind, contiguous, transposed, permuted", [
    ("contiguous", True, False, False),
    ("transposed", False, True, True),
    ("permuted 0213", False, False, True),
    ("view strided rows", False, False, False),
    ("view prefix", True, False, False),
    ("reshape", True, False, False),
])
def test_layout_predicates(kind, contiguous, transposed, permuted):
    t = _layouts()[kind]
    assert ggml.is_contiguous(t) == contiguous
    assert ggml.is_transposed(t) == transposed
    assert ggml.is_permuted(t) == permuted


def test_same_shape_and_layout():
    c = meta_ctx()
    a = ggml.new_tensor_2d(c, T.F32, 4, 4)
    b = ggml.new_tensor_2d(c, T.F32, 4, 4)
    assert ggml.are_same_shape(a, b) and ggml.are_same_layout(a, b)
    t = ggml.transpose(c, a)
    assert ggml.are_same_shape(a, t) and not ggml.are_same_layout(a, t)
    h = ggml.new_tensor_2d(c, T.F16, 4, 4)
    assert ggml.are_same_shape(a, h) and not ggml.are_same_layout(a, h)
    assert not ggml.are_same_shape(a, ggml.new_tensor_2d(c, T.F32, 4, 2))


# ---------------------------------------------------------------- graphs

def _diamond(c):
    """out = add(mul(a, b), sqr(c)) with named leafs."""
    a, b, d = (ggml.set_name(ggml.new_tensor_1d(c, T.F32, 4), n) for n in "abc")
    m = ggml.set_name(ggml.mul(c, a, b), "m")
    s = ggml.set_name(ggml.sqr(c, d), "s")
    return ggml.set_name(ggml.add(c, m, s), "out"), (a, b, d, m, s)


def test_build_forward_expand_is_post_order_left_to_right():
    c = meta_ctx()
    out, (a, b, d, m, s) = _diamond(c)
    g = ggml.new_graph(c)
    ggml.build_forward_expand(g, out)
    assert g.nodes == [m, s, out] and g.leafs == [a, b, d]
    assert ggml.graph_n_nodes(g) == 3
    assert all(n.flags & F.COMPUTE for n in g.nodes)
    assert not any(leaf.flags & F.COMPUTE for leaf in g.leafs)


def test_graph_names_unnamed_leafs_and_keeps_params_as_nodes():
    c = meta_ctx()
    x = ggml.new_tensor_1d(c, T.F32, 4)
    w = ggml.new_tensor_1d(c, T.F32, 4)
    ggml.set_param(w)
    g = ggml.new_graph(c)
    ggml.build_forward_expand(g, ggml.mul(c, x, w))
    assert g.leafs == [x] and ggml.get_name(x) == "leaf_0"
    assert g.nodes[0] is w  # a PARAM leaf is a node, as in ggml


def test_views_are_graph_nodes():
    c = meta_ctx()
    a = ggml.new_tensor_2d(c, T.F32, 4, 3)
    t = ggml.transpose(c, a)
    out = ggml.cont(c, t)
    g = ggml.new_graph(c)
    ggml.build_forward_expand(g, out)
    assert g.nodes == [t, out] and g.leafs == [a]


def test_graph_uid_changes_only_when_nodes_are_added():
    c = meta_ctx()
    out, (a, b, d, m, s) = _diamond(c)
    g = ggml.new_graph(c)
    ggml.build_forward_expand(g, m)
    uid = g.uid
    ggml.build_forward_expand(g, m)
    assert g.uid == uid
    ggml.build_forward_expand(g, out)
    assert g.uid != uid and g.nodes == [m, s, out]
    assert ggml.graph_view(g, 0, 2).uid not in (0, g.uid)


def test_graph_access():
    c = meta_ctx()
    out, (a, b, d, m, s) = _diamond(c)
    g = ggml.new_graph_custom(c, 16)
    ggml.build_forward_expand(g, out)
    assert ggml.graph_node(g, -1) is out and ggml.graph_node(g, 0) is m and ggml.graph_node(g, -3) is m
    with pytest.raises(IndexError, match="out of range"):
        ggml.graph_node(g, 3)
    v = ggml.graph_view(g, 1, 3)
    assert v.nodes == [s, out] and v.leafs == [] and ggml.graph_n_nodes(v) == 2
    assert ggml.graph_get_tensor(g, "s") is s and ggml.graph_get_tensor(g, "b") is b
    assert ggml.graph_get_tensor(g, "nope") is None
    assert ggml.graph_size(g) == 16


def test_graph_overflow_is_an_error():
    c = meta_ctx()
    t = ggml.new_tensor_1d(c, T.F32, 4)
    for _ in range(5):
        t = ggml.sqr(c, t)
    g = ggml.new_graph_custom(c, 4)
    with pytest.raises(RuntimeError, match="graph is full"):
        ggml.build_forward_expand(g, t)


# ---------------------------------------------------------------- torch interop

def test_to_torch_is_zero_copy_both_ways(ctx):
    t = ggml.new_tensor_2d(ctx, T.F32, 4, 3)
    x = ggml.to_torch(t)
    assert x.shape == (3, 4) and x.dtype == torch.float32
    x.copy_(torch.arange(12.0).reshape(3, 4))
    assert torch.equal(ggml.backend_tensor_get(t), torch.arange(12.0).reshape(3, 4))
    ggml.backend_tensor_set(t, torch.full((3, 4), 7.0))
    assert torch.equal(x, torch.full((3, 4), 7.0))
    xt = ggml.to_torch(ggml.transpose(ctx, t))
    assert xt.shape == (4, 3) and xt.data_ptr() == x.data_ptr() and torch.equal(xt, x.t())


def test_from_torch_of_a_transposed_tensor():
    c = meta_ctx()
    x = torch.arange(12.0).reshape(3, 4).t()  # shape (4, 3), strides (1, 4)
    t = ggml.from_torch(c, x)
    assert t.type == T.F32 and t.ne == [3, 4, 1, 1] and t.nb[:2] == [16, 4]
    assert ggml.is_transposed(t) and t.data == x.data_ptr()
    y = ggml.to_torch(t)
    assert torch.equal(y, x)
    y[0, 0] = -1.0
    assert x[0, 0] == -1.0


def test_compute_from_torch_inputs_into_a_torch_output(cpu):
    c = meta_ctx()
    xa, xb = torch.randn(5, 8), torch.randn(8, 5)
    out_t = torch.zeros(5, 8, dtype=torch.float16)
    a, b, out = ggml.from_torch(c, xa), ggml.from_torch(c, xb.t()), ggml.from_torch(c, out_t)
    result = ggml.cpy(c, ggml.mul(c, ggml.add(c, a, b), a), out)
    g = ggml.new_graph(c)
    ggml.build_forward_expand(g, result)
    buffer = ggml.backend_alloc_ctx_tensors(c, cpu)  # the add and mul results only
    assert ggml.backend_graph_compute(cpu, g) == ggml.Status.SUCCESS
    torch.testing.assert_close(out_t, ((xa + xb.t()) * xa).half())
    ggml.backend_buffer_free(buffer)


def test_to_torch_of_a_block_type_needs_raw(ctx):
    q = ggml.set_name(ggml.new_tensor_2d(ctx, T.Q4_0, 64, 2), "weights")
    with pytest.raises(TypeError, match="weights.*raw=True"):
        ggml.to_torch(q)
    raw = ggml.to_torch(q, raw=True)
    assert raw.dtype == torch.uint8 and raw.shape == (2, 36)


# ---------------------------------------------------------------- tensor data in and out

@pytest.mark.parametrize("kind", ["torch", "numpy", "bytes", "bytearray"])
def test_tensor_set_get_from_any_source(ctx, kind):
    t = ggml.new_tensor_1d(ctx, T.I32, 6)
    values = np.arange(6, dtype=np.int32) * 3
    data = {"torch": torch.from_numpy(values), "numpy": values, "bytes": values.tobytes(),
            "bytearray": bytearray(values.tobytes())}[kind]
    ggml.backend_tensor_set(t, data)
    assert ggml.backend_tensor_get(t).tolist() == values.tolist()
    out = np.zeros(6, dtype=np.int32)
    ggml.backend_tensor_get(t, out)
    assert out.tolist() == values.tolist()


def test_tensor_partial_ranges_and_memset(ctx):
    t = ggml.new_tensor_1d(ctx, T.F32, 8)
    ggml.backend_tensor_set(t, torch.zeros(8))
    ggml.backend_tensor_set(t, np.array([1.5, 2.5], dtype=np.float32), offset=8)
    assert ggml.backend_tensor_get(t).tolist() == [0, 0, 1.5, 2.5, 0, 0, 0, 0]
    part = ggml.backend_tensor_get(t, offset=8, size=8)
    assert part.dtype == torch.uint8 and part.view(torch.float32).tolist() == [1.5, 2.5]
    ggml.backend_tensor_set(t, torch.full((8,), 9.0), offset=24, size=4)  # only the first value
    assert ggml.backend_tensor_get(t).tolist() == [0, 0, 1.5, 2.5, 0, 0, 9, 0]
    ggml.backend_tensor_memset(t, 0xFF, offset=28, size=4)
    assert torch.isnan(ggml.backend_tensor_get(t)[7])
    ggml.backend_tensor_memset(t, 0)
    assert ggml.backend_tensor_get(t).tolist() == [0] * 8


# ---------------------------------------------------------------- bad input

@pytest.mark.parametrize("build, match", [
    (lambda c, a, b: ggml.add(c, a, b), "add: b must broadcast"),
    (lambda c, a, b: ggml.mul(c, b, a), "mul: b must broadcast"),
    (lambda c, a, b: ggml.mul_mat(c, a, b), "mul_mat"),
    (lambda c, a, b: ggml.concat(c, a, b, 0), r"concat: ne\[1\] differs"),
    (lambda c, a, b: ggml.glu_split(c, a, b, ggml.GluOp.SWIGLU), "same shape"),
    (lambda c, a, b: ggml.cpy(c, a, b), "cpy: element counts differ"),
    (lambda c, a, b: ggml.reshape_2d(c, a, 5, 5), "reshape: element count"),
    (lambda c, a, b: ggml.count_equal(c, a, b), "count_equal"),
    (lambda c, a, b: ggml.repeat(c, a, b), "repeat"),
    (lambda c, a, b: ggml.top_k(c, a, 9), "top_k: k=9"),
])
def test_mismatched_shapes_name_the_op_and_tensors(build, match):
    c = meta_ctx()
    a = ggml.set_name(ggml.new_tensor_2d(c, T.F32, 8, 3), "lhs")
    b = ggml.set_name(ggml.new_tensor_2d(c, T.F32, 6, 5), "rhs")
    with pytest.raises(ValueError, match=match) as err:
        build(c, a, b)
    assert "lhs" in str(err.value)


@pytest.mark.parametrize("make", [
    lambda c, a: ggml.view_1d(c, a, 13, 0),
    lambda c, a: ggml.view_1d(c, a, 4, 40),
    lambda c, a: ggml.view_2d(c, a, 4, 3, 20, 0),
    lambda c, a: ggml.view_1d(c, ggml.view_1d(c, a, 6, 24), 2, 20),
])
def test_view_out_of_bounds(make):
    c = meta_ctx()
    a = ggml.set_name(ggml.new_tensor_2d(c, T.F32, 4, 3), "src")
    with pytest.raises(ValueError, match="view out of bounds.*'src'"):
        make(c, a)


def test_tensor_set_past_the_end(ctx):
    t = ggml.set_name(ggml.new_tensor_1d(ctx, T.F32, 4), "small")
    with pytest.raises(IndexError, match="past the end of tensor 'small'"):
        ggml.backend_tensor_set(t, torch.zeros(5))
    with pytest.raises(IndexError, match="small"):
        ggml.backend_tensor_set(t, torch.zeros(2), offset=12)
    with pytest.raises(IndexError, match="small"):
        ggml.backend_tensor_get(t, offset=8, size=16)


def test_computing_an_unallocated_graph(cpu):
    c = meta_ctx()
    a = ggml.set_name(ggml.new_tensor_1d(c, T.F32, 4), "input_a")
    g = ggml.new_graph(c)
    ggml.build_forward_expand(g, ggml.set_name(ggml.sqr(c, a), "squares"))
    # the graph check names the first tensor without memory (ValueError); a kernel reaching one
    # raises UnallocatedTensorError: either way the tensor and its op are named
    with pytest.raises((UnallocatedTensorError, ValueError), match="tensor '(squares|input_a)' .*no memory"):
        ggml.backend_graph_compute(cpu, g)
    with pytest.raises(UnallocatedTensorError, match="tensor 'input_a' .*no memory"):
        ggml.to_torch(a)


@pytest.mark.parametrize("build, op", [
    (lambda c: ggml.relu(c, ggml.new_tensor_1d(c, T.I32, 4)), "UNARY"),
    (lambda c: ggml.sqrt(c, ggml.new_tensor_1d(c, T.I16, 4)), "SQRT"),
    (lambda c: ggml.cpy(c, ggml.new_tensor_1d(c, T.F32, 256), ggml.new_tensor_1d(c, T.IQ2_XXS, 256)), "CPY"),
    (lambda c: ggml.cpy(c, ggml.new_tensor_1d(c, T.I32, 4), ggml.new_tensor_1d(c, T.F16, 4)), "CPY"),
    (lambda c: ggml.repeat(c, ggml.new_tensor_1d(c, T.Q4_0, 32), ggml.new_tensor_2d(c, T.Q4_0, 32, 2)), "REPEAT"),
])
def test_unsupported_op_names_op_and_device(cpu, build, op):
    c = ggml.init(mem_size=1 << 16)
    out = build(c)
    assert not ggml.backend_supports_op(cpu, out)
    g = ggml.new_graph(c)
    ggml.build_forward_expand(g, out)
    with pytest.raises(ggml.UnsupportedOpError, match=f"op {op} is not supported on CPU"):
        ggml.backend_graph_compute(cpu, g)


def test_a_graph_with_a_cycle_is_refused_naming_the_tensor():
    ctx = ggml.init(no_alloc=True)
    a = ggml.new_tensor_1d(ctx, T.F32, 4)
    b = ggml.set_name(ggml.add(ctx, a, a), "b")
    c = ggml.set_name(ggml.mul(ctx, b, b), "c")
    b.src[1] = c  # edited by hand: c -> b -> c
    with pytest.raises(ValueError, match=r"cycle: tensor 'c'.*depends on itself"):
        ggml.build_forward_expand(ggml.new_graph(ctx), c)
