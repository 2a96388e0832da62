"""The CPU device's fast kernels for small nodes (devices/cpu/fast_ops.py): which nodes they take,
that they fall back to the torch kernels for the rest, their errors, and the coalesced views of
copies. Their values are checked by test_ops.py's cases against float64 references; the cases
below make sure those cases do run the fast kernels."""
import numpy as np
import pytest
import torch

import torchggml as ggml
from torchggml.enums import Op
from torchggml.test_ops.runner import all_cases, prepared_case, check_case_against_reference
from torchggml.devices.cpu import CPU_KERNELS
from torchggml.devices.cpu import fast_ops
from torchggml.devices.cpu.kernels import LAYERS
from torchggml.devices.cpu.jit.loader import BoundKernel
from torchggml.devices.kernels import TORCH_KERNELS

pytest.importorskip("numba")

CASES = {c.name: c for c in all_cases()}
# the numba layer of each op that has one (the CPU table's first layer for those ops)
FAST_BINDS = {op: layer.bind for op, layers in LAYERS.items() for layer in layers if layer.kind == "numba"}


@pytest.fixture(scope="module")
def cpu():
    return ggml.backend_cpu_init()


def _op_node(case, graph):
    return next(n for n in reversed(graph.nodes) if n.op.name == case.op.upper() or
                (case.op in ("swiglu", "cpy", "cont", "dup") and n.op in (Op.GLU, Op.CPY, Op.CONT, Op.DUP)))


# (case name, whether the fast kernel takes its node)
TAKEN = [
    ("rms_norm(decode,ne=[1024, 1, 1, 1])", True),
    ("norm(decode,ne=[1024, 1, 1, 1])", True),
    ("rms_norm(permuted (0,2,1,3))", True),
    ("rms_norm(type=F16)", True),
    ("rms_norm(decode,ne=[1024, 300, 1, 1])", True),  # past FAST_MAX_ELEMENTS: the threaded kernel
    ("l2_norm(ne=[64, 5, 4, 3],eps=1e-12)", None),       # no fast kernel for the op
    ("soft_max(ne=[168, 1, 16, 1],mask=F16[168, 1, 1, 1],scale=0.125,max_bias=0.0,causal)", True),
    ("soft_max(ne=[168, 1, 12, 1],mask=F32[168, 1, 1, 1],scale=0.125,max_bias=8.0,sinks)", True),
    ("soft_max(ne=[16, 7, 4, 2],mask=F16[16, 7, 2, 1],scale=1.0,max_bias=0.0)", True),
    # a prompt's scores, past FAST_MAX_ELEMENTS: the numba kernel with the rows over the threads
    ("soft_max(ne=[1024, 64, 8, 1],mask=F16[1024, 64, 1, 1],scale=0.125,max_bias=0.0,causal)", True),
    ("rope(type=F32,ne=[64, 16, 1, 1],n_dims=64,mode=0,fs=1.0,ef=0.0,af=1.0,ff=False)", True),
    ("rope(type=F16,ne=[128, 8, 1, 1],n_dims=64,mode=2,fs=1.0,ef=0.0,af=1.0,ff=False,n_offs=64)", True),
    # a prompt's rows, past THREADED_MIN_ELEMENTS: the threaded kernel (tokens over the threads)
    ("rope(type=F32,ne=[256, 4, 128, 1],n_dims=256,mode=2,fs=1.0,ef=0.0,af=1.0,ff=False)", True),
    ("rope(type=F32,ne=[128, 8, 80, 1],n_dims=64,mode=0,fs=1.0,ef=0.0,af=1.0,ff=True,n_offs=32)", True),
    ("rope(type=F32,ne=[128, 3, 2, 1],n_dims=128,mode=8,fs=1.0,ef=0.0,af=1.0,ff=False,sections=[21, 21, 21, 0])",
     False),  # M-RoPE: torch's kernel
    ("set_rows(type=F16,ne0=1024,n_rows=168,n=1,batch=[1, 1],idx=I64[1, 1],b=F32)", True),
    ("set_rows(type=Q8_0,ne0=64,n_rows=10,n=4,batch=[1, 1],idx=I64[1, 1],b=F32)", False),  # quantizes
    ("cpy(V transposed,F16->F16,n_kv=40,heads=4)", True),
    ("cpy(V transposed,F16->F16,n_kv=168,heads=16)", True),  # the numba transpose
    ("cpy(V transposed,F32->F16,n_kv=168,heads=16)", True),  # torch's copy over coalesced views
    ("cpy(BF16->F32,permuted source)", False),
    ("cpy(F32->F32)", False),  # contiguous: the generic memcpy
    ("swiglu(split,decode ne0=2816)", True),
    ("swiglu(fused,swapped)", True),
    ("geglu(fused,type=F32)", True),
    ("add(type=F32,ne_a=[32, 4, 3, 2],ne_b=[16, 2, 3, 1])", True),  # b tiled
    ("div(type=F16,ne_a=[33, 5, 1, 1],ne_b=[1, 5, 1, 1])", True),
    ("mul(non-contiguous a, broadcast b)", True),
    ("mul(type=F32,ne_a=[1024, 1, 1, 1],ne_b=[1024, 1, 1, 1])", True),
    ("mul(type=F32,ne_a=[1024, 16, 1, 1],ne_b=[1024, 1, 1, 1])", False),  # past BINARY_MAX_ELEMENTS
    ("add(type=BF16,ne_a=[32, 4, 3, 2],ne_b=[32, 4, 3, 2])", False),
    ("scale(type=F32,s=0.37,b=0.0)", True),
    ("scale(type=F32,s=1.5,b=-0.25)", True),
    ("scale(type=F16,s=1.5,b=-0.25)", True),
    ("scale(strided rows)", True),
    ("scale(type=BF16,s=0.37,b=0.0)", False),
    ("add(type_a=Q8_0,type_b=F32,out=Q8_0)", False),
    ("get_rows(type=Q4_K,ne0=256,n_rows=6,n=4,batch=[1, 1])", True),
    ("get_rows(type=Q6_K,ne0=256,n_rows=6,n=4,batch=[1, 1])", True),
    ("get_rows(type=Q4_0,ne0=256,n_rows=5,n=3,batch=[2, 2])", True),
    ("get_rows(type=Q8_0,ne0=256,n_rows=5,n=3,batch=[2, 2])", True),
    ("get_rows(type=Q4_K,ne0=256,n_rows=5,n=3,batch=[2, 2])", True),
    ("get_rows(type=IQ4_NL,ne0=256,n_rows=6,n=4,batch=[1, 1])", True),
    ("get_rows(type=Q2_K,ne0=256,n_rows=6,n=4,batch=[1, 1])", True),
    ("get_rows(type=Q3_K,ne0=256,n_rows=6,n=4,batch=[1, 1])", True),
    ("get_rows(type=Q5_K,ne0=256,n_rows=6,n=4,batch=[1, 1])", False),  # the torch dequantizer
    ("get_rows(type=F16,ne0=16,n_rows=10,n=5,batch=[1, 1])", False),
    ("mul_mat(KQ decode,n_kv=168,head_dim=64,heads=16/16)", True),
    ("mul_mat(KQ decode,n_kv=37,head_dim=128,heads=8/2)", True),
    ("mul_mat(type_a=F16,type_b=F32,m=128,n=1,k=37,bs=[2, 1],nr=[4, 1])", True),
    ("mul_mat(type_a=F16,type_b=F32,m=32,n=2,k=40,bs=[2, 2],nr=[2, 3])", True),
    ("mul_mat(KQ decode,n_kv=5,head_dim=32,heads=4/1)", True),  # one K matrix: half_matvec
    ("mul_mat(type_a=F16,type_b=F32,m=16,n=1,k=64,bs=[1, 1],nr=[1, 1])", True),  # a decode's F16 weight
    ("mul_mat(type_a=F16,type_b=F32,m=2304,n=3,k=2048,bs=[1, 1],nr=[1, 1])", True),
    ("mul_mat(type_a=F16,type_b=F32,m=32,n=1,k=5,bs=[1, 1],nr=[4, 1])", True),  # one weight, b batched
    ("mul_mat(type_a=F16,type_b=F32,k=64 views of rows of 96)", True),  # the weight's rows strided
    ("mul_mat(type_a=F16,type_b=F16,m=16,n=1,k=64,bs=[1, 1],nr=[1, 1])", False),  # F16 b: torch's
    ("mul_mat(type_a=F16,type_b=F32,m=8,n=5,k=64,bs=[3, 2],nr=[1, 1])", False),  # 5 rows, batched
    ("mul_mat(type_a=F16,type_b=F32,m=7,n=9,k=96,bs=[1, 1],nr=[1, 1])", True),  # a weight's micro-batch: half_gemm
    ("mul_mat(type_a=BF16,type_b=F32,m=16,n=1,k=64,bs=[1, 1],nr=[1, 1])", True),  # a decode's BF16 weight: bf16_matvec
    ("mul_mat(type_a=BF16,type_b=F32,m=7,n=9,k=96,bs=[1, 1],nr=[1, 1])", False),  # a prompt's: torch's BF16 GEMM
    ("mul_mat(type_a=Q8_0,type_b=F32,m=8,n=5,k=64,bs=[3, 2],nr=[1, 1])", False),
    ("mul_mat(type_a=F16,type_b=F32,b=transposed view)", False),  # 2-D, and k strided in b
]


def _case(name):
    assert name in CASES, f"no op case {name!r}"
    return CASES[name]


@pytest.mark.parametrize("name,taken", TAKEN, ids=[t[0] for t in TAKEN])
def test_fast_kernel_takes_the_nodes_it_handles(name, taken, cpu):
    case = _case(name)
    with prepared_case(case, cpu) as (graph, _, out):
        node = out if out.op != Op.NONE else _op_node(case, graph)
        fast = FAST_BINDS.get(node.op)
        if taken is None:
            assert fast is None
        else:
            assert (fast(node) is not None) == taken
    ok, err = check_case_against_reference(case, cpu)
    assert ok, f"{name}: nmse {err:.3g}"


@pytest.mark.parametrize("op", sorted(FAST_BINDS, key=lambda o: o.value), ids=lambda o: o.name)
def test_fast_entries_keep_the_torch_kernels_supports(op):
    assert CPU_KERNELS.entries[op][1] is TORCH_KERNELS.entries[op][1]


def test_the_environment_can_turn_the_fast_kernels_off(cpu, monkeypatch):
    from torchggml.devices.kernels import compiled_nodes
    case = _case("rms_norm(decode,ne=[1024, 1, 1, 1])")
    with prepared_case(case, cpu) as (graph, _, out):
        (fast, _), = compiled_nodes(graph.nodes, CPU_KERNELS, "CPU")
        monkeypatch.setenv("TORCHGGML_CPU_FAST_OPS", "0")
        (generic, _), = compiled_nodes(graph.nodes, CPU_KERNELS, "CPU")
        assert isinstance(fast, BoundKernel) and generic.func.__name__ == "_rms_norm_into"


@pytest.mark.parametrize("name", [t[0] for t in TAKEN if t[1]])
def test_without_numba_the_torch_kernels_run(name, cpu, monkeypatch):
    monkeypatch.setattr(fast_ops, "numba_available", lambda: False)
    case = _case(name)
    with prepared_case(case, cpu) as (graph, _, out):
        fast = FAST_BINDS[out.op]
        bound = fast(out)
        # copies still coalesce their views (a torch copy); nothing else binds
        assert bound is None or (out.op in (Op.CPY, Op.CONT, Op.DUP) and bound.func is fast_ops._torch_copy)
    ok, err = check_case_against_reference(case, cpu)
    assert ok, f"{name}: nmse {err:.3g}"


@pytest.mark.parametrize("name", [t[0] for t in TAKEN if t[1] and t[0].startswith("scale(")])
def test_scale_kernel_equals_the_torch_kernel(name, cpu, monkeypatch):
    """Bit for bit: the product rounded to float32, then b added (or not, when b is 0)."""
    outs = []
    for fast in ("1", "0"):
        monkeypatch.setenv("TORCHGGML_CPU_FAST_OPS", fast)
        with prepared_case(_case(name), cpu) as (graph, inputs, out):
            assert ggml.backend_graph_compute(cpu, graph) == ggml.Status.SUCCESS
            outs.append(torch.as_tensor(ggml.backend_tensor_get(out)).clone())
    assert torch.equal(outs[0], outs[1])


def _computed_with_index(cpu, build, idx_tensor, bad):
    """Build (ctx -> (out, idx input, other inputs)), allocate on the CPU, set the index to
    `bad`, compute."""
    ctx = ggml.init(no_alloc=True)
    buffer = None
    try:
        out, idx, others = build(ctx)
        graph = ggml.new_graph(ctx)
        ggml.build_forward_expand(graph, out)
        buffer = ggml.backend_alloc_ctx_tensors(ctx, cpu)
        assert FAST_BINDS[out.op](out) is not None
        for t in others:
            ggml.backend_tensor_set(t, torch.zeros(ggml.nbytes(t), dtype=torch.uint8))
        ggml.backend_tensor_set(idx, torch.tensor([bad], dtype=idx_tensor))
        ggml.backend_graph_compute(cpu, graph)
    finally:
        if buffer is not None:
            ggml.backend_buffer_free(buffer)
        ggml.free(ctx)


@pytest.mark.parametrize("bad", [-1, 168])
def test_set_rows_index_outside_the_destination_is_an_index_error(bad, cpu):
    def build(ctx):
        cache = ggml.new_tensor_2d(ctx, ggml.Type.F16, 64, 168)
        row = ggml.new_tensor_2d(ctx, ggml.Type.F32, 64, 1)
        idx = ggml.new_tensor_1d(ctx, ggml.Type.I64, 1)
        return ggml.set_rows(ctx, cache, row, idx), idx, [cache, row]
    with pytest.raises(IndexError, match=r"SET_ROWS: a row index outside \[0, 168\)"):
        _computed_with_index(cpu, build, torch.int64, bad)


@pytest.mark.parametrize("bad", [-1, 168])
def test_get_rows_index_outside_the_table_is_an_index_error(bad, cpu):
    def build(ctx):
        table = ggml.new_tensor_2d(ctx, ggml.Type.Q4_K, 256, 168)
        idx = ggml.new_tensor_1d(ctx, ggml.Type.I32, 1)
        return ggml.get_rows(ctx, table, idx), idx, [table]
    with pytest.raises(IndexError, match=r"GET_ROWS: a row index outside \[0, 168\)"):
        _computed_with_index(cpu, build, torch.int32, bad)


# (shape, permutation of a contiguous source) -> the coalesced shape
COALESCE = [
    ((1, 168, 16, 64), (0, 2, 3, 1), (1024, 168)),  # the V cache's per-head transpose
    ((2, 3, 4, 5), (0, 1, 2, 3), (120,)),           # contiguous: one run
    ((2, 3, 4, 5), (1, 0, 2, 3), (3, 2, 20)),
    ((1, 1, 1, 7), (0, 1, 2, 3), (7,)),
    ((1, 1, 1, 1), (0, 1, 2, 3), (1,)),
    ((4, 1, 6, 1), (2, 1, 0, 3), (6, 4)),
]


@pytest.mark.parametrize("shape,perm,merged", COALESCE)
def test_coalesced_views_merge_dims_both_layouts_allow(shape, perm, merged):
    src = torch.arange(torch.Size(shape).numel(), dtype=torch.float32).view(shape).permute(perm)
    dst = torch.empty(src.shape)
    vs, vd = fast_ops.coalesced(src, dst)
    assert tuple(vs.shape) == merged == tuple(vd.shape)
    vd.copy_(vs)
    assert torch.equal(dst, src)


@pytest.mark.parametrize("op", ["rms_norm", "norm"])
def test_a_zero_row_with_zero_eps_gives_nan_as_ggml(op, cpu):
    """1 / sqrt(0) is inf and 0 * inf NaN (IEEE division in the numba kernels, not an error)."""
    ctx = ggml.init(no_alloc=True)
    try:
        a = ggml.new_tensor_2d(ctx, ggml.Type.F32, 64, 2)
        out = getattr(ggml, op)(ctx, a, 0.0)
        graph = ggml.new_graph(ctx)
        ggml.build_forward_expand(graph, out)
        buffer = ggml.backend_alloc_ctx_tensors(ctx, cpu)
        assert FAST_BINDS[out.op](out) is not None
        ggml.backend_tensor_set(a, torch.zeros(2, 64))
        ggml.backend_graph_compute(cpu, graph)
        assert torch.isnan(ggml.backend_tensor_get(out).view(torch.float32)).all()
        ggml.backend_buffer_free(buffer)
    finally:
        ggml.free(ctx)


def test_exp_f32_is_within_one_ulp_and_keeps_the_special_values():
    import numpy as np
    from torchggml.devices.cpu.jit.loader import op_kernels
    exp = op_kernels().exp_f32
    x = np.linspace(-87.0, 88.5, 301).astype(np.float32)
    ours = np.array([exp(v) for v in x], dtype=np.float64)
    ref = np.exp(x.astype(np.float64))
    assert (np.abs(ours - ref) / np.spacing(ref.astype(np.float32)) <= 1.0).all()
    specials = np.array([-np.inf, np.inf, np.nan, 0.0, 89.0, -104.5], dtype=np.float32)
    got = [exp(v) for v in specials]
    assert got[0] == 0.0 and got[1] == np.inf and np.isnan(got[2]) and got[3] == 1.0
    assert got[4] == np.inf and got[5] == 0.0


def _outputs_both_ways(cpu, monkeypatch, build, values):
    """The node computed by the fast kernel and by the kernel under it, from the same inputs."""
    from torchggml.devices.kernels import compiled_nodes
    ctx = ggml.init(no_alloc=True)
    buffer = None
    try:
        out, inputs = build(ctx)
        graph = ggml.new_graph(ctx)
        ggml.build_forward_expand(graph, out)
        buffer = ggml.backend_alloc_ctx_tensors(ctx, cpu)
        results = []
        for enabled in ("1", "0"):
            monkeypatch.setenv("TORCHGGML_CPU_FAST_OPS", enabled)
            for t, v in zip(inputs, values):
                ggml.backend_tensor_set(t, v)
            for fn, node in compiled_nodes(graph.nodes, CPU_KERNELS, "CPU"):
                fn(node)
            results.append(ggml.backend_tensor_get(out).view(torch.float32).clone())
        return results
    finally:
        if buffer is not None:
            ggml.backend_buffer_free(buffer)
        ggml.free(ctx)


def test_soft_max_special_values_as_the_torch_kernel(cpu, monkeypatch):
    """Rows with NaN, +inf, all -inf (masked) and ordinary values give what the torch kernel gives."""
    inf, nan = float("inf"), float("nan")
    x = torch.tensor([[1.0, 2.0, nan, 0.5], [1.0, inf, 2.0, 0.0], [3.0, 1.0, -2.0, 0.25], [0.1, 0.2, 0.3, 0.4]])
    mask = torch.tensor([[0.0, 0.0, 0.0, 0.0], [0.0, 0.0, -inf, 0.0], [-inf, -inf, -inf, -inf], [0.0, -inf, 0.0, 0.0]])

    def build(ctx):
        a = ggml.new_tensor_2d(ctx, ggml.Type.F32, 4, 4)
        m = ggml.new_tensor_2d(ctx, ggml.Type.F32, 4, 4)
        return ggml.soft_max_ext(ctx, a, m, 0.5, 0.0), [a, m]
    fast, generic = _outputs_both_ways(cpu, monkeypatch, build, [x, mask])
    assert torch.equal(torch.isnan(fast), torch.isnan(generic))
    assert torch.allclose(fast.nan_to_num(7.0), generic.nan_to_num(7.0), rtol=1e-6, atol=0)


@pytest.mark.parametrize("ne0, rows, threaded", [
    (64, 64, True),      # past the threaded limit with many rows (an image encoder's scores): numba's rows
    (4096, 1, False),    # past it in few long rows: torch's kernel
    (8, 8, True),        # under it: numba's rows as before
])
def test_large_soft_max_kernel_choice(cpu, monkeypatch, ne0, rows, threaded):
    from torchggml.devices.cpu import fast_ops
    if not fast_ops.numba_available():
        pytest.skip("numba is not installed")
    monkeypatch.setattr(fast_ops, "THREADED_MIN_ELEMENTS", 16)
    monkeypatch.setattr(fast_ops, "THREADED_MAX_ELEMENTS", 256)
    monkeypatch.setattr(fast_ops, "SOFT_MAX_MANY_ROWS", 32)
    ctx = ggml.init(no_alloc=True)
    out = ggml.soft_max_ext(ctx, ggml.new_tensor_2d(ctx, ggml.Type.F32, ne0, rows), None, 0.5, 0.0)
    buffer = ggml.backend_alloc_ctx_tensors(ctx, cpu)
    try:
        bound = fast_ops.bind_soft_max(out)
        assert (bound is not None) == threaded
        assert bound is None or bound.kernel is fast_ops.op_kernels().soft_max_rows
    finally:
        ggml.backend_buffer_free(buffer)
        ggml.free(ctx)


F16_PRODUCTS = [  # (rows, N, K, chunk bytes): half GEMV, one chunk, several with a remainder
    (3, 40, 64, 2 << 20),
    (16, 40, 64, 2 << 20),
    (20, 300, 64, 64 * 4 * 32),
]


@pytest.mark.parametrize("m,n,k,chunk_bytes", F16_PRODUCTS)
def test_f16_weight_products_match_float64(monkeypatch, m, n, k, chunk_bytes):
    """An F16 weight times f32 rows: in half for few rows, converted to f32 a chunk of weight
    rows at a time for micro-batches (exact f32 products)."""
    from torchggml.devices.cpu import products
    monkeypatch.setattr(products, "CONVERT_CHUNK_BYTES", chunk_bytes)
    gen = torch.Generator().manual_seed(m + n)
    weight = torch.randn(n, k, generator=gen).half()
    rows = torch.randn(m, k, generator=gen)
    out = torch.full((m, n), float("nan"))
    products._times_half_cpu(weight.T, rows, out)
    want = rows.double() @ weight.double().T
    tol = 2e-6 if m >= products.HALF_CONVERT_ROWS else 2e-2  # the half GEMV rounds to half
    assert ((out.double() - want).norm() / want.norm()).item() < tol


# (rows, N, K): the numba matvec (up to HALF_PRODUCT_MAX_ROWS rows), the GEMM's 4 x 4 tiles with
# remainders of rows and of weight rows, a prompt's micro-batch; K below, at and past the row
# dot's vector step (16 values) with a remainder
NUMBA_F16_PRODUCTS = [(1, 7, 96), (4, 64, 256), (5, 4, 64), (9, 7, 96), (130, 66, 256), (1, 5, 7), (2, 9, 83),
                      (6, 3, 16)]


@pytest.mark.parametrize("m,n,k", NUMBA_F16_PRODUCTS)
def test_f16_weight_numba_products_match_float64(m, n, k):
    """An F16 weight times f32 rows through the numba layer (half_matvec, half_gemm): the rows
    rounded to F16 as ggml's F16 vec_dot type rounds them, then float32 sums of exact products,
    the results not rounded."""
    from torchggml.devices.cpu.jit.loader import op_kernels
    gen = torch.Generator().manual_seed(m * n + k)
    weight = torch.randn(n, k, generator=gen).half()
    rows = torch.randn(m, k, generator=gen)
    out = np.full((m, n), np.nan, np.float32)
    kernel = op_kernels().half_matvec if m <= fast_ops.HALF_PRODUCT_MAX_ROWS else op_kernels().half_gemm
    kernel(fast_ops.as_numpy(weight), rows.numpy(), out)
    want = rows.half().double() @ weight.double().T
    assert ((torch.from_numpy(out).double() - want).norm() / want.norm()).item() < 1e-6


@pytest.mark.parametrize("m,n,k", [(1, 7, 96), (4, 64, 256), (16, 9, 83), (3, 5, 7)])
def test_bf16_weight_matvec_matches_float64(m, n, k):
    """A BF16 weight times f32 rows through bf16_matvec: the rows rounded to BF16 as ggml's BF16
    vec_dot type rounds them (nearest even), float32 sums of exact products; each row's results
    bit for bit those of the row alone (a batched decode step's rows)."""
    from torchggml.devices.cpu.jit.loader import op_kernels
    gen = torch.Generator().manual_seed(m * n + k)
    weight = torch.randn(n, k, generator=gen).bfloat16()
    rows = torch.randn(m, k, generator=gen)
    out = np.full((m, n), np.nan, np.float32)
    op_kernels().bf16_matvec(fast_ops.as_numpy(weight), rows.numpy(), out)
    want = rows.bfloat16().double() @ weight.double().T
    assert ((torch.from_numpy(out).double() - want).norm() / want.norm()).item() < 1e-6
    for i in range(m):
        alone = np.full((1, n), np.nan, np.float32)
        op_kernels().bf16_matvec(fast_ops.as_numpy(weight), rows[i:i + 1].numpy(), alone)
        assert np.array_equal(alone[0], out[i])


# the threaded kernels (a prompt's rows over the threads) run each row as the serial ones do
THREADED = [("row_norm", "rms"), ("row_norm", "norm"), ("swiglu", "split"), ("swiglu", "fused halves"),
            ("geglu", "split"), ("geglu", "fused halves"),
            ("soft_max", "f16 mask"), ("soft_max", "no mask")]


@pytest.mark.parametrize("kernel,variant", THREADED, ids=[f"{k}-{v}" for k, v in THREADED])
def test_threaded_kernels_equal_the_serial_ones(kernel, variant):
    from torchggml.devices.cpu.jit.loader import op_kernels
    ops = op_kernels()
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 3, 5, 64)).astype(np.float32)
    serial, threaded = np.empty_like(x), np.empty_like(x)
    if kernel == "row_norm":
        for fn, out in ((ops.row_norm, serial), (ops.row_norm_rows, threaded)):
            fn(x, out, np.float32(1e-6), variant == "rms")
    elif kernel in ("swiglu", "geglu"):
        both = rng.standard_normal((2, 3, 5, 128)).astype(np.float32)
        a, g = (both[..., :64], both[..., 64:]) if variant == "fused halves" else (x, x[::-1].copy())
        for fn, out in ((ops.glu, serial), (ops.glu_rows, threaded)):
            fn(a, g, out, kernel == "geglu")
    else:
        padded = np.zeros((1, 1, 8, 64), np.float16)
        padded[..., 40:] = -np.inf
        mask = padded[:, :, :5].view(np.uint16)
        has_mask = variant == "f16 mask"
        for fn, out in ((ops.soft_max, serial), (ops.soft_max_rows, threaded)):
            fn(x, out, mask if has_mask else np.zeros((1, 1, 1, 1), np.float32), np.ones(3, np.float32),
               np.zeros(1, np.float32), np.float32(0.5), has_mask, False)
    np.testing.assert_array_equal(threaded, serial)
    assert np.isfinite(serial).all()


@pytest.mark.parametrize("kind", fast_ops.BLOCK_KINDS)
def test_get_block_rows_equals_gguf_dequantize_bit_for_bit(kind):
    """GET_ROWS' numba decoders (a table's requested rows) give the gguf package's dequantize of
    those rows, bit for bit; an index past the table is reported (its position)."""
    pytest.importorskip("numba")
    from gguf import GGMLQuantizationType, quants as gguf_quants
    from test_cpu_quant import random_blocks
    from torchggml.devices.cpu.jit.loader import op_kernels
    qtype = getattr(ggml.Type, kind)
    n, k = 9, 512
    blocks = random_blocks(qtype, n, k, seed=len(kind)).numpy()
    ids = np.array([[[4, 0, 8, 4]]], np.int64)
    out = np.full((1, 1, 4, k), np.nan, np.float32)
    assert op_kernels().get_block_rows(blocks[None, None], ids, out, fast_ops.BLOCK_KINDS.index(kind)) == -1
    want = gguf_quants.dequantize(blocks, GGMLQuantizationType(int(qtype))).reshape(n, k)[ids[0, 0]]
    np.testing.assert_array_equal(out[0, 0], want)
    assert op_kernels().get_block_rows(blocks[None, None], np.array([[[1, 9]]], np.int64), out[:, :, :2],
                                       fast_ops.BLOCK_KINDS.index(kind)) == 1


def test_prompt_rope_nodes_share_their_angles_and_follow_new_positions(cpu):
    """A prompt's ROPE nodes of the same positions (a model's Q and K of every layer) take
    rope_rows with one table of angles: the first call computes it, the others read it, and a
    call whose positions differ from the table's (the next prompt) computes it again; each
    equals the serial kernel, which computes its own angles."""
    ops = fast_ops.op_kernels()
    n_tok, pairs = fast_ops.ROPE_SHARED_MIN_TOKENS + 4, 32
    ctx = ggml.init(no_alloc=True)
    pos = ggml.new_tensor_1d(ctx, ggml.Type.I32, n_tok)
    nodes = [ggml.rope_ext(ctx, ggml.new_tensor_3d(ctx, ggml.Type.F32, 2 * pairs, heads, n_tok), pos, None,
                           2 * pairs, 2, 0, 10000.0, 1.0, 0.0, 1.0, 32.0, 1.0) for heads in (9, 3)]
    buffer = ggml.backend_alloc_ctx_tensors(ctx, cpu)
    try:
        q, k = (fast_ops.bind_rope(node) for node in nodes)
        assert q.kernel is k.kernel is ops.rope_rows and q.args[-2] is k.args[-2] and q.args[-1] is k.args[-1]
        rng = np.random.default_rng(0)
        for positions in (np.arange(n_tok), np.arange(n_tok) + 7, np.r_[np.arange(n_tok - 1), 40]):
            q.args[2][:] = positions
            for bound in (q, k):
                x = bound.args[0]
                x[:] = rng.standard_normal(x.shape).astype(np.float32)
                bound(None)
                serial = np.empty_like(x)
                ops.rope(x, serial, *bound.args[2:-2])
                np.testing.assert_array_equal(bound.args[1], serial)
    finally:
        ggml.backend_buffer_free(buffer)
        ggml.free(ctx)
