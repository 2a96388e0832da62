"""The newest backend API: every function of ggml-backend.h mirrored (docs/devices.md's 115/115), the
2-D set/get and their _async forms, graph_optimize called per split by the scheduler, the meta
split state's repeats (nr), compare_graph_backend with test-node lists, the impl header's meta
helpers, the CPU reg's set_use_ref and threadpool proc addresses, and split_buffer_type."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

import torchggml as ggml
from torchggml.devices.meta.meta import meta_info
from torchggml.devices.cpu import CPUBackend

T = ggml.Type
S = ggml.SplitAxis
NAMES = [line.strip() for line in (Path(__file__).parent / "data" / "ggml_backend_h_functions.txt").read_text().splitlines()
         if line.strip() and not line.startswith("#")]


def test_every_ggml_backend_h_function_is_mirrored():
    assert len(NAMES) == 115
    missing = [n for n in NAMES if not callable(getattr(ggml, n.removeprefix("ggml_"), None))]
    assert missing == [], f"{115 - len(missing)}/115: missing {missing}"


def test_every_ggml_rpc_h_function_is_mirrored():
    names = ["backend_rpc_init", "backend_is_rpc", "backend_rpc_buffer_type", "backend_rpc_get_device_memory",
             "backend_rpc_start_server", "backend_rpc_reg", "backend_rpc_add_server"]
    assert all(callable(getattr(ggml, n, None)) for n in names)


@pytest.fixture
def sims(monkeypatch):
    monkeypatch.setenv("TORCHGGML_SIM_DEVICES", "2")
    return [ggml.backend_dev_by_name("SIM0"), ggml.backend_dev_by_name("SIM1")]


# ---------------------------------------------------------------- 2-D set / get

def _tensor(backend, n=64):
    ctx = ggml.init(no_alloc=True)
    t = ggml.new_tensor_1d(ctx, T.I8, n)
    buf = ggml.backend_alloc_ctx_tensors(ctx, backend)
    ggml.backend_tensor_set(t, torch.zeros(n, dtype=torch.int8))
    return t, buf


# offset, size, n_copies, stride_tensor, stride_data
CASES_2D = [(0, 4, 3, 8, 4), (5, 3, 4, 10, 6), (0, 16, 1, 0, 16), (2, 0, 5, 3, 1), (1, 2, 0, 4, 4), (0, 8, 8, 8, 8)]


def _expected(n, offset, size, n_copies, stride_tensor, stride_data, data):
    out = torch.zeros(n, dtype=torch.uint8)
    for i in range(n_copies):
        out[offset + i * stride_tensor:offset + i * stride_tensor + size] = data[i * stride_data:i * stride_data + size]
    return out


@pytest.mark.parametrize("member", [True, False], ids=["buffer member", "row loop"])
@pytest.mark.parametrize("case", CASES_2D)
def test_set_get_2d(case, member):
    offset, size, n_copies, st, sd = case
    t, buf = _tensor(ggml.backend_cpu_init())
    if not member:
        buf.set_tensor_2d = buf.get_tensor_2d = None  # ggml's fallback: one set/get per row
    data = torch.arange(1, 1 + max((n_copies - 1) * sd + size, 1), dtype=torch.uint8)
    ggml.backend_tensor_set_2d(t, data, offset, size, n_copies, st, sd)
    assert torch.equal(ggml.backend_tensor_get(t).view(torch.uint8), _expected(64, offset, size, n_copies, st, sd, data))
    out = torch.zeros_like(data)
    ggml.backend_tensor_get_2d(t, out, offset, size, n_copies, st, sd)
    back = torch.zeros_like(data)
    for i in range(n_copies):
        back[i * sd:i * sd + size] = data[i * sd:i * sd + size]
    assert torch.equal(out, back)


@pytest.mark.parametrize("device", ["CPU", "SIM0"])  # CPU: a row loop; SIM0: one strided copy on its stream
def test_set_get_2d_async(device, sims):
    backend = ggml.backend_dev_init(ggml.backend_dev_by_name(device))
    assert (backend.set_tensor_2d_async is None) == (device == "CPU")
    t, _ = _tensor(backend)
    data = torch.arange(40, dtype=torch.uint8)
    ggml.backend_tensor_set_2d_async(backend, t, data, 4, 5, 4, 12, 10)
    out = torch.zeros(40, dtype=torch.uint8)
    ggml.backend_tensor_get_2d_async(backend, t, out, 4, 5, 4, 12, 10)
    ggml.backend_synchronize(backend)
    assert torch.equal(ggml.backend_tensor_get(t).view(torch.uint8), _expected(64, 4, 5, 4, 12, 10, data))
    assert torch.equal(out.view(4, 10)[:, :5], data.view(4, 10)[:, :5])


@pytest.mark.parametrize("args,match", [
    ((0, 8, 9, 8, 0), "past the end"),          # the last row ends past the tensor
    ((0, 8, 3, 8, 100), "need 208 bytes"),      # the data is too short for its stride
    ((-1, 8, 1, 8, 8), "negative"),
])
def test_set_2d_checks_its_region(args, match):
    t, _ = _tensor(ggml.backend_cpu_init())
    with pytest.raises((ValueError, IndexError), match=match):
        ggml.backend_tensor_set_2d(t, torch.zeros(64, dtype=torch.uint8), *args)


# ---------------------------------------------------------------- graph_optimize

class ReorderingCPU(CPUBackend):
    """A CPU backend whose graph_optimize reverses each split's nodes where that keeps sources
    before their users (here: independent nodes), and keeps its first node's source alive to
    the split's end."""

    def __init__(self):
        super().__init__(ggml.backend_dev_by_name("CPU"))
        self.calls = []

    def graph_optimize(self, graph, params):
        self.calls.append([n.name for n in graph.nodes])
        graph.nodes.reverse()
        params.add_alloc_dep(graph.nodes[-1].src[0], graph.nodes[0])
        params.add_alloc_dep(graph.nodes[-1].src[0], graph.nodes[0])  # twice: kept once


def test_graph_optimize_is_called_per_split_and_its_order_kept():
    backend = ReorderingCPU()
    ctx = ggml.init(no_alloc=True)
    x = ggml.new_tensor_1d(ctx, T.F32, 8)
    ggml.set_input(x)
    outs = [ggml.set_name(ggml.scale(ctx, x, float(k)), f"s{k}") for k in (1, 2, 3)]
    for o in outs:
        ggml.set_output(o)
    g = ggml.new_graph(ctx)
    for o in outs:
        ggml.build_forward_expand(g, o)
    sched = ggml.backend_sched_new([backend])
    ggml.backend_sched_alloc_graph(sched, g)
    assert backend.calls == [["s1", "s2", "s3"]]                 # one split, its nodes
    assert [n.name for n in g.nodes] == ["s3", "s2", "s1"]       # the new order is the graph's
    dep = [n for n in sched.graph.nodes if n.src[0] is x and n.op in (ggml.Op.VIEW, ggml.Op.NONE)]
    assert len(dep) >= 1 and sched.graph.nodes.index(dep[-1]) > sched.graph.nodes.index(g.nodes[0])
    X = torch.arange(8.0)
    ggml.backend_tensor_set(x, X)
    ggml.backend_sched_graph_compute(sched, g)
    for k, o in zip((1, 2, 3), outs):
        assert torch.equal(ggml.backend_tensor_get(o), X * k)
    ggml.backend_sched_free(sched)


def test_graph_optimize_may_only_reorder():
    class Dropping(ReorderingCPU):
        def graph_optimize(self, graph, params):
            graph.nodes.pop()
    ctx = ggml.init(no_alloc=True)
    x = ggml.new_tensor_1d(ctx, T.F32, 8)
    g = ggml.new_graph(ctx)
    ggml.build_forward_expand(g, ggml.scale(ctx, ggml.scale(ctx, x, 2.0), 3.0))
    with pytest.raises(RuntimeError, match="may only reorder"):
        ggml.backend_sched_alloc_graph(ggml.backend_sched_new([Dropping()]), g)


# ---------------------------------------------------------------- the meta split state's repeats

def test_split_state_repeats_fused_qkv(sims):
    """A fused QKV weight: Q (16 rows) once, then K and V (8 rows each) as one segment repeating
    twice; each device holds its share of Q, then of K, then of V."""
    state = ggml.MetaSplitState(S.AXIS_1, (8, 8, 4, 4), n_segments=2, nr=(1, 2))
    dev = ggml.backend_meta_device(sims, lambda t: state)
    assert "repeating [1, 2]" in state.describe()
    ctx = ggml.init(no_alloc=True)
    w = ggml.new_tensor_2d(ctx, T.F32, 4, 32)
    buf = ggml.backend_alloc_ctx_tensors_from_buft(ctx, dev.get_buffer_type())
    W = torch.arange(32 * 4, dtype=torch.float32).reshape(32, 4)
    ggml.backend_tensor_set(w, W)
    assert torch.equal(ggml.backend_tensor_get(w), W)
    q, k, v = W[:16], W[16:24], W[24:32]
    for j, s in enumerate(meta_info(w).simples):
        mine = torch.cat([q[8 * j:8 * j + 8], k[4 * j:4 * j + 4], v[4 * j:4 * j + 4]])
        assert s.ne[1] == 16 and torch.equal(ggml.backend_tensor_get(s), mine)
    ggml.backend_buffer_free(buf)


@pytest.mark.parametrize("state,match", [
    (ggml.MetaSplitState(S.AXIS_1, (8, 8, 4, 4), n_segments=2, nr=(1,)), "repeats \\[1\\], expected 2"),
    (ggml.MetaSplitState(S.AXIS_1, (8, 8, 4, 4), n_segments=2, nr=(1, 0)), "at least 1"),
    (ggml.MetaSplitState(S.AXIS_1, (8, 8, 4, 4), n_segments=2, nr=(1, 3)), "adding up to ne\\[1\\]=32"),
])
def test_split_state_repeats_are_checked(sims, state, match):
    dev = ggml.backend_meta_device(sims, lambda t: state)
    ctx = ggml.init(no_alloc=True)
    ggml.new_tensor_2d(ctx, T.F32, 4, 32)
    with pytest.raises(ValueError, match=match):
        ggml.backend_alloc_ctx_tensors_from_buft(ctx, dev.get_buffer_type())


# ---------------------------------------------------------------- compare_graph_backend, meta helpers

def test_compare_graph_backend_with_test_nodes(sims):
    cpu, sim = ggml.backend_cpu_init(), ggml.backend_dev_init(sims[0])
    ctx = ggml.init(no_alloc=True)
    x = ggml.new_tensor_1d(ctx, T.F32, 16)
    a = ggml.scale(ctx, x, 2.0)
    b = ggml.add(ctx, a, x)
    c = ggml.mul(ctx, b, b)
    g = ggml.new_graph(ctx)
    ggml.build_forward_expand(g, c)
    ggml.backend_alloc_ctx_tensors(ctx, cpu)
    ggml.backend_tensor_set(x, torch.randn(16))
    seen = []
    assert ggml.backend_compare_graph_backend(cpu, sim, g, lambda i, t1, t2: seen.append(
        (i, torch.equal(ggml.backend_tensor_get(t1), ggml.backend_tensor_get(t2)))) or True, [c, a])
    assert seen == [(0, True), (2, True)]  # graph order, whole graphs computed first
    ctx2 = ggml.init(no_alloc=True)
    with pytest.raises(ValueError, match="not a node of the graph"):
        ggml.backend_compare_graph_backend(cpu, sim, g, lambda *a: True, [ggml.new_tensor_1d(ctx2, T.F32, 1)])


def test_meta_helpers(sims):
    dev = ggml.backend_meta_device(sims)
    backend = dev.init_backend()
    assert ggml.backend_is_meta(backend) and not ggml.backend_is_meta(ggml.backend_cpu_init())
    assert ggml.backend_meta_n_backends(backend) == 2
    assert ggml.backend_get_device(ggml.backend_meta_simple_backend(backend, 1)) is sims[1]
    with pytest.raises(IndexError, match="index 2 out of range"):
        ggml.backend_meta_simple_backend(backend, 2)
    with pytest.raises(TypeError, match="not a meta backend"):
        ggml.backend_meta_n_backends(ggml.backend_cpu_init())
    buft = dev.get_buffer_type()
    assert ggml.backend_buft_is_meta(buft) and not ggml.backend_buft_is_meta(ggml.backend_cpu_buffer_type())
    buf = ggml.backend_buft_alloc_buffer(buft, 64)
    assert ggml.backend_buffer_is_meta(buf) and not ggml.backend_buffer_is_meta(ggml.backend_alloc_buffer(ggml.backend_cpu_init(), 64))


# ---------------------------------------------------------------- CPU reg: use_ref, threadpools

def test_cpu_set_use_ref_and_threadpool_proc_addresses():
    reg = ggml.backend_dev_backend_reg(ggml.backend_dev_by_name("CPU"))
    proc = lambda name: ggml.backend_reg_get_proc_address(reg, name)
    for name in ("ggml_backend_cpu_set_use_ref", "ggml_threadpool_new", "ggml_threadpool_free",
                 "ggml_backend_cpu_set_threadpool", "ggml_backend_cpu_numa_init", "ggml_backend_cpu_is_numa"):
        assert callable(proc(name)), name
    backend = ggml.backend_cpu_init()
    ctx = ggml.init(no_alloc=True)
    x = ggml.new_tensor_2d(ctx, T.F32, 32, 4)
    y = ggml.soft_max(ctx, ggml.rms_norm(ctx, x, 1e-6))
    g = ggml.new_graph(ctx)
    ggml.build_forward_expand(g, y)
    ggml.backend_alloc_ctx_tensors(ctx, backend)
    X = torch.randn(4, 32)
    ggml.backend_tensor_set(x, X)
    ggml.backend_graph_compute(backend, g)
    fast = ggml.backend_tensor_get(y)
    proc("ggml_backend_cpu_set_use_ref")(backend, True)
    assert backend.use_ref
    ggml.backend_graph_compute(backend, g)
    ref = torch.softmax(X * torch.rsqrt(X.pow(2).mean(-1, keepdim=True) + 1e-6), -1)
    torch.testing.assert_close(ggml.backend_tensor_get(y), ref, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(fast, ref, rtol=1e-5, atol=1e-6)

    threads = torch.get_num_threads()
    try:
        pool = proc("ggml_threadpool_new")(1)
        assert ggml.threadpool_get_n_threads(pool) == 1
        proc("ggml_backend_cpu_set_threadpool")(backend, pool)
        assert backend.n_threads == 1 and backend.threadpool is pool
        proc("ggml_threadpool_free")(pool)
        with pytest.raises(ValueError, match="freed"):
            ggml.backend_cpu_set_threadpool(backend, pool)
        with pytest.raises(ValueError, match="at least 1"):
            ggml.threadpool_new(0)
    finally:
        torch.set_num_threads(threads)


# ---------------------------------------------------------------- split_buffer_type

def test_split_buffer_type_splits_matrix_rows(sims):
    reg = ggml.backend_dev_backend_reg(sims[0])
    split = ggml.backend_reg_get_proc_address(reg, "ggml_backend_split_buffer_type")
    buft = split(0, [3.0, 1.0])
    ctx = ggml.init(no_alloc=True)
    w = ggml.new_tensor_2d(ctx, T.Q8_0, 64, 16)
    b = ggml.new_tensor_1d(ctx, T.F32, 16)
    buf = ggml.backend_alloc_ctx_tensors_from_buft(ctx, buft)
    W = ggml.quants.quantize(T.Q8_0, torch.randn(16, 64))
    ggml.backend_tensor_set(w, W)
    assert torch.equal(ggml.backend_tensor_get(w).reshape(-1), W.reshape(-1))
    assert [s.ne[1] for s in meta_info(w).simples] == [12, 4]   # rows by tensor_split 3:1
    assert [s.ne[0] for s in meta_info(b).simples] == [16, 16]  # vectors whole on each device
    with pytest.raises(ValueError, match="main_device 5 out of range"):
        split(5, None)
    ggml.backend_buffer_free(buf)
