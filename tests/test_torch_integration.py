"""ggml graphs inside PyTorch: graph_function (equal to backend_graph_compute, through
torch.compile(fullgraph=True) and torch.export), its gradients (gradcheck per op), custom ops
with Python callables, profiler ranges, and backends on given streams (SIM)."""
from __future__ import annotations

import threading

import pytest
import torch

import torchggml as ggml
from torchggml.models.placement import find_device

F32 = ggml.Type.F32


def sim_backend(i=0):
    try:
        find_device(f"SIM{i}")
    except ValueError:
        pytest.skip("no SIM devices (TORCHGGML_SIM_DEVICES)")
    return ggml.backend_sim_init(i)


BACKENDS = {"CPU": ggml.backend_cpu_init, "SIM0": sim_backend}


def new_input(ctx, *ne, type=F32, name="x", param=False):
    t = (ggml.new_tensor_1d, ggml.new_tensor_2d, ggml.new_tensor_3d, ggml.new_tensor_4d)[len(ne) - 1](ctx, type, *ne)
    ggml.set_name(t, name)
    ggml.set_param(t) if param else ggml.set_input(t)
    return t


def finish(ctx, out):
    ggml.set_output(out)
    g = ggml.new_graph_custom(ctx, 256)
    ggml.build_forward_expand(g, out)
    return g


def small_graph(ctx):
    """y = soft_max(rms_norm(W x)) * 2 + x W-free term: a few ops, one trainable weight."""
    x = new_input(ctx, 8, 3)
    w = new_input(ctx, 8, 5, name="w", param=True)
    h = ggml.rms_norm(ctx, ggml.mul_mat(ctx, w, x), 1e-5)
    y = ggml.scale(ctx, ggml.soft_max(ctx, h), 2.0)
    return finish(ctx, y), x, w, y


def init_weights(fn, seed=0):
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in fn.parameters():
            p.copy_(torch.rand(p.shape, generator=gen) * 2 - 1)


# ---------------------------------------------------------------- forward

@pytest.mark.parametrize("where", ["CPU", "SIM0", "sched"])
def test_graph_function_equals_backend_graph_compute(where):
    ctx = ggml.init(no_alloc=True)
    g, x, w, y = small_graph(ctx)
    if where == "sched":
        target = ggml.backend_sched_new([sim_backend(0), ggml.backend_cpu_init()], None, 256, False, True)
    else:
        target = BACKENDS[where]()
    fn = ggml.graph_function(g, [x], [y], target)
    init_weights(fn)
    xv = torch.rand(3, 8) * 2 - 1
    out = fn(xv)
    # the same graph run directly, with the same input, on the backend (or scheduler)
    ggml.backend_tensor_set(x, xv)
    if where == "sched":
        ggml.backend_sched_graph_compute(target, g)
    else:
        ggml.backend_graph_compute(target, g)
    direct = ggml.backend_tensor_get(y).reshape(3, 5)
    assert out.shape == (3, 5) and out.dtype == torch.float32
    assert torch.equal(out, direct)
    assert torch.allclose(fn.reference(xv), out, atol=1e-6)  # the torch evaluator agrees


def test_graph_function_checks_its_arguments():
    ctx = ggml.init(no_alloc=True)
    g, x, w, y = small_graph(ctx)
    fn = ggml.graph_function(g, [x], [y], ggml.backend_cpu_init())
    with pytest.raises(TypeError, match="expected 1 inputs"):
        fn()
    with pytest.raises(ValueError, match="takes 24 values"):
        fn(torch.zeros(5))
    with pytest.raises(TypeError, match="Backend or a Sched"):
        ggml.graph_function(g, [x], [y], "CPU")


def test_torch_compile_fullgraph_and_export():
    ctx = ggml.init(no_alloc=True)
    x = new_input(ctx, 8, 3)
    b = new_input(ctx, 8, name="b")
    y = finish(ctx, ggml.add(ctx, ggml.silu(ctx, x), b))
    fn = ggml.graph_function(y, [x, b], [y.nodes[-1]], ggml.backend_cpu_init())
    xv, bv = torch.randn(3, 8), torch.randn(8)

    def f(a, c):
        return torch.tanh(fn(a * 2, c)) + 1

    eager = f(xv, bv)
    compiled = torch.compile(f, fullgraph=True, backend="eager")(xv, bv)
    assert torch.allclose(compiled, eager)
    assert torch.allclose(eager, torch.tanh(torch.nn.functional.silu(xv * 2) + bv) + 1, atol=1e-6)

    class M(torch.nn.Module):
        def forward(self, a, c):
            return f(a, c)

    exported = torch.export.export(M(), (xv, bv))
    assert any("torchggml.graph_call" in str(n.target) for n in exported.graph.nodes)
    assert torch.allclose(exported.module()(xv, bv), eager)


# ---------------------------------------------------------------- gradients

def _rope_case(mode):
    def build(ctx):
        x = new_input(ctx, 8, 2, 3)
        pos = ggml.new_tensor_1d(ctx, ggml.Type.I32, 3)
        ggml.set_name(pos, "pos")
        ggml.set_input(pos)
        return [x], ggml.rope_ext(ctx, x, pos, None, 8, mode, 0, 10000.0, 1.0, 0.0, 1.0, 32.0, 1.0), {pos: torch.tensor([0, 3, 7], dtype=torch.int32)}
    return build


def _unary(fn):
    def build(ctx):
        x = new_input(ctx, 6, 3)
        return [x], fn(ctx, x), {}
    return build


def _binary(fn, b_ne=(6, 3)):
    def build(ctx):
        a, b = new_input(ctx, 6, 3, name="a"), new_input(ctx, *b_ne, name="b")
        return [a, b], fn(ctx, a, b), {}
    return build


def _get_rows(ctx):
    table = new_input(ctx, 5, 7, name="table")
    ids = ggml.new_tensor_1d(ctx, ggml.Type.I32, 4)
    ggml.set_input(ids)
    return [table], ggml.get_rows(ctx, table, ids), {ids: torch.tensor([6, 0, 3, 3], dtype=torch.int32)}


def _soft_max_ext(ctx):
    x = new_input(ctx, 6, 3, 2)
    mask = ggml.new_tensor_2d(ctx, F32, 6, 3)
    ggml.set_input(mask)
    m = torch.zeros(3, 6)
    m[0, 4:] = float("-inf")
    return [x], ggml.soft_max_ext(ctx, x, mask, 0.5, 0.0), {mask: m}


GRAD_CASES = {
    "mul_mat": _binary(lambda ctx, a, b: ggml.mul_mat(ctx, a, b), b_ne=(6, 4)),
    "mul_mat_broadcast": _binary(lambda ctx, a, b: ggml.mul_mat(ctx, a, b), b_ne=(6, 2)),
    "add_broadcast": _binary(lambda ctx, a, b: ggml.add(ctx, a, b), b_ne=(6, 1)),
    "mul": _binary(lambda ctx, a, b: ggml.mul(ctx, a, b)),
    "rms_norm": _unary(lambda ctx, x: ggml.rms_norm(ctx, x, 1e-5)),
    "norm": _unary(lambda ctx, x: ggml.norm(ctx, x, 1e-5)),
    "soft_max": _unary(lambda ctx, x: ggml.soft_max(ctx, x)),
    "soft_max_ext_mask": _soft_max_ext,
    "rope_normal": _rope_case(ggml.RopeType.NORMAL),
    "rope_neox": _rope_case(ggml.RopeType.NEOX),
    "get_rows": _get_rows,
    "silu": _unary(lambda ctx, x: ggml.silu(ctx, x)),
    "swiglu_split": _binary(lambda ctx, a, b: ggml.swiglu_split(ctx, a, b)),
    "swiglu_fused": _unary(lambda ctx, x: ggml.swiglu(ctx, x)),
    "scale_cont_permute": _unary(lambda ctx, x: ggml.cont(ctx, ggml.transpose(ctx, ggml.scale(ctx, x, 3.0)))),
}


def _grad_setup(case):
    ctx = ggml.init(no_alloc=True)
    inputs, out, constants = GRAD_CASES[case](ctx)
    g = finish(ctx, out)
    fn = ggml.graph_function(g, inputs + list(constants), [out], ggml.backend_cpu_init())
    gen = torch.Generator().manual_seed(1)
    values = [torch.rand(tuple(reversed(t.ne)), generator=gen, dtype=torch.float64) * 2 - 1 for t in inputs]
    return fn, values, list(constants.values())


@pytest.mark.filterwarnings("ignore:Input #.* is not a double precision")
@pytest.mark.parametrize("case", list(GRAD_CASES))
def test_gradcheck(case):
    """float64 gradcheck of the torch evaluator (the backward), which must also reproduce the
    ggml forward; then a float32 gradcheck through the custom op itself (ggml forward)."""
    fn, values, constants = _grad_setup(case)
    f32 = [v.float() for v in values]
    assert torch.allclose(fn(*f32, *constants).double(), fn.reference(*values, *constants), atol=1e-5)
    leaves = [v.requires_grad_() for v in values]
    assert torch.autograd.gradcheck(lambda *xs: fn.reference(*xs, *constants), leaves)
    leaves32 = [v.detach().float().requires_grad_() for v in values]
    assert torch.autograd.gradcheck(lambda *xs: fn(*xs, *constants), leaves32, eps=1e-2, atol=2e-2, rtol=2e-2)


def test_gradients_reach_trainable_weights_and_an_optimizer_updates_the_graph():
    ctx = ggml.init(no_alloc=True)
    g, x, w, y = small_graph(ctx)
    fn = ggml.graph_function(g, [x], [y], ggml.backend_cpu_init())
    init_weights(fn)
    (weight,) = fn.parameters()
    assert weight.requires_grad and weight.data_ptr() == ggml.to_torch(w).data_ptr()  # zero-copy
    xv = torch.rand(3, 8)
    target = torch.softmax(torch.randn(3, 5), -1) * 2
    opt = torch.optim.SGD([weight], lr=0.5)
    losses = []
    for _ in range(5):
        loss = ((fn(xv) - target) ** 2).sum()
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < losses[0]
    # the ggml graph reads the updated weight
    assert torch.allclose(fn(xv), fn.reference(xv), atol=1e-6)


def test_torch_compile_differentiates_through_graph_function():
    ctx = ggml.init(no_alloc=True)
    g, x, w, y = small_graph(ctx)
    fn = ggml.graph_function(g, [x], [y], ggml.backend_cpu_init())
    init_weights(fn)
    weights = torch.arange(5.0)
    xv = torch.rand(3, 8, requires_grad=True)
    torch.compile(lambda a: (fn(a) * weights).sum(), fullgraph=True, backend="aot_eager")(xv).backward()
    compiled_grads = [xv.grad.clone(), fn.parameters()[0].grad.clone()]
    xv.grad, fn.parameters()[0].grad = None, None
    (fn(xv) * weights).sum().backward()
    assert torch.allclose(compiled_grads[0], xv.grad) and torch.allclose(compiled_grads[1], fn.parameters()[0].grad)


def test_from_torch_warns_that_gradients_stop_there():
    ctx = ggml.init(no_alloc=True)
    with pytest.warns(UserWarning, match="graph_function"):
        ggml.from_torch(ctx, torch.zeros(3, requires_grad=True))


def test_an_op_without_a_torch_rule_is_named_in_the_backward():
    ctx = ggml.init(no_alloc=True)
    x = new_input(ctx, 6, 3)
    g = finish(ctx, ggml.argsort(ctx, x, ggml.SortOrder.ASC) if hasattr(ggml, "argsort") else ggml.cumsum(ctx, x))
    out = g.nodes[-1]
    fn = ggml.graph_function(g, [x], [out], ggml.backend_cpu_init())
    with pytest.raises(NotImplementedError, match=f"op {out.op.name}"):
        fn.reference(torch.rand(3, 6))


# ---------------------------------------------------------------- custom ops

def _custom_graphs(ctx, a, b, c, calls):
    def f1(dst, a, ith, nth):
        calls.append((ith, nth))
        dst.copy_(a * 2)

    def f2(dst, a, b, ith, nth):
        dst.copy_(a + b)

    def f3(dst, a, b, c, ith, nth):
        dst.copy_(a * b - c)

    def f4(dst, args, ith, nth):
        dst.copy_(torch.cat([args[0], args[1]], -1))

    r1 = ggml.map_custom1(ctx, a, f1, 4)  # n_tasks accepted, the callable runs once
    r2 = ggml.map_custom2(ctx, r1, b, f2)
    r3 = ggml.map_custom3(ctx, r2, b, c, f3, ggml.N_TASKS_MAX)
    r4 = ggml.custom_4d(ctx, F32, 8, 3, 1, 1, [r3, c], f4, 1)
    return r4


@pytest.mark.parametrize("where", ["CPU", "SIM0"])
def test_custom_ops_run_python_callables(where):
    ctx = ggml.init(no_alloc=True)
    a, b, c = (new_input(ctx, 4, 3, name=n) for n in "abc")
    calls = []
    g = finish(ctx, _custom_graphs(ctx, a, b, c, calls))
    fn = ggml.graph_function(g, [a, b, c], [g.nodes[-1]], BACKENDS[where]())
    av, bv, cv = torch.randn(3, 4), torch.randn(3, 4), torch.randn(3, 4)
    out = fn(av, bv, cv)
    expected = torch.cat([(av * 2 + bv) * bv - cv, cv], -1)
    assert torch.allclose(out, expected)
    assert calls == [(0, 1)]
    assert [n.op for n in g.nodes[-4:]] == [ggml.Op.MAP_CUSTOM1, ggml.Op.MAP_CUSTOM2, ggml.Op.MAP_CUSTOM3, ggml.Op.CUSTOM]


def test_custom_inplace_writes_into_its_source_and_bad_callables_are_refused():
    ctx = ggml.init(no_alloc=True)
    a = new_input(ctx, 4, 3, name="a")
    r = ggml.custom_inplace(ctx, a, [], lambda dst, args, ith, nth: dst.mul_(-1))
    assert r.view_src is a
    g = finish(ctx, r)
    be = ggml.backend_cpu_init()
    ggml.backend_alloc_ctx_tensors(ctx, be)
    av = torch.randn(3, 4)
    ggml.backend_tensor_set(a, av)
    ggml.backend_graph_compute(be, g)
    assert torch.equal(ggml.to_torch(r), -av)
    with pytest.raises(TypeError, match="must be callable"):
        ggml.map_custom1(ctx, a, "not callable")


# ---------------------------------------------------------------- profiler

def _profiled(run):
    # SIM backends run on worker threads: torch records their ranges with profile_all_threads
    config = torch._C._profiler._ExperimentalConfig(profile_all_threads=True)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], experimental_config=config) as prof:
        run()
    return {e.name for e in prof.events()}


def test_profiler_shows_split_and_node_ranges_that_match_the_eval_callback():
    sim, cpu = sim_backend(0), ggml.backend_cpu_init()
    wctx, ctx = ggml.init(no_alloc=True), ggml.init(no_alloc=True)
    x = new_input(ctx, 8, 3)
    w = new_input(wctx, 8, 5, name="w")
    weights = ggml.backend_alloc_ctx_tensors(wctx, sim)  # the weight lives on SIM0
    ggml.backend_buffer_set_usage(weights, ggml.BufferUsage.WEIGHTS)
    ggml.backend_tensor_set(w, torch.rand(5, 8))
    y = ggml.soft_max(ctx, ggml.rms_norm(ctx, ggml.mul_mat(ctx, w, x), 1e-5))
    g = finish(ctx, y)
    sched = ggml.backend_sched_new([sim, cpu], None, 256, False, True)
    fn = ggml.graph_function(g, [x], [y], sched)
    xv = torch.rand(3, 8)
    names = _profiled(lambda: fn(xv))
    n_splits = ggml.backend_sched_get_n_splits(sched)
    splits = {n for n in names if n.startswith("ggml:split:")}
    assert len(splits) == n_splits >= 1 and "ggml:split:SIM0:0" in splits
    node_ranges = {n for n in names if n.startswith("ggml:") and not n.startswith("ggml:split:")}
    seen = []
    ggml.backend_sched_set_eval_callback(sched, lambda t, ask: ask or seen.append(t) is None)  # observe all
    fn(xv)
    computed = {f"ggml:{t.op.name}:{t.name}" for t in seen if t.op not in (ggml.Op.NONE, ggml.Op.RESHAPE, ggml.Op.VIEW,
                                                                            ggml.Op.PERMUTE, ggml.Op.TRANSPOSE)}
    assert node_ranges == computed and computed


def test_node_ranges_follow_torchggml_profile(monkeypatch):
    ctx = ggml.init(no_alloc=True)
    g, x, w, y = small_graph(ctx)
    fn = ggml.graph_function(g, [x], [y], ggml.backend_cpu_init())
    from torchggml.profiler import profiling
    monkeypatch.delenv(ggml.PROFILE_ENV, raising=False)
    assert not profiling()
    monkeypatch.setenv(ggml.PROFILE_ENV, "1")
    assert profiling()
    names = _profiled(lambda: fn(torch.rand(3, 8)))
    assert "ggml:split:CPU:0" in names and f"ggml:MUL_MAT:{g.nodes[1].name}" in names


# ---------------------------------------------------------------- streams (SIM)

def _scale_graph(ctx, src, factor, name):
    out = ggml.scale(ctx, src, factor)
    ggml.set_name(out, name)
    return out


def test_backends_on_a_shared_stream_interleave_without_synchronizing():
    first = sim_backend(0)
    second = ggml.backend_sim_init(0, stream=first.stream)  # the same queue
    assert second.stream is first.stream
    ctx = ggml.init(no_alloc=True)
    x = new_input(ctx, 16)
    y = _scale_graph(ctx, x, 2.0, "y")
    z = _scale_graph(ctx, y, 3.0, "z")
    g1, g2 = ggml.new_graph(ctx), ggml.new_graph(ctx)
    ggml.build_forward_expand(g1, y)
    ggml.build_forward_expand(g2, z)
    g2 = ggml.graph_view(g2, 1, 2)  # only z's node: it reads y, written by the other backend
    ggml.backend_alloc_ctx_tensors(ctx, first)
    xv = torch.arange(16, dtype=torch.float32)
    gate = threading.Event()
    first.stream.submit(gate.wait, "gate")  # hold the stream until everything is queued
    ggml.backend_tensor_set_async(first, x, xv)
    ggml.backend_graph_compute_async(first, g1)
    ggml.backend_graph_compute_async(second, g2)  # no synchronize in between
    out = torch.empty(16)
    ggml.backend_tensor_get_async(second, z, out)
    gate.set()
    ggml.backend_synchronize(second)
    assert torch.equal(out, xv * 6)
    second.free()  # a backend on a shared stream leaves it running
    first.stream.submit(lambda: None, "still open")
    ggml.backend_synchronize(first)


def test_synchronize_waits_for_its_stream_only():
    busy, idle = sim_backend(0), sim_backend(1)
    gate = threading.Event()
    busy.stream.submit(gate.wait, "blocked work")
    done = threading.Event()
    threading.Thread(target=lambda: (ggml.backend_synchronize(idle), done.set()), daemon=True).start()
    assert done.wait(10), "synchronizing one stream waited for another one"
    gate.set()
    ggml.backend_synchronize(busy)


def test_a_stream_of_the_wrong_kind_is_refused():
    sim_backend(0)
    with pytest.raises(ValueError, match="WorkerStream"):
        ggml.backend_sim_init(0, stream=object())
    with pytest.raises(ValueError, match="no SIM device 99"):
        ggml.backend_sim_init(99)


def test_cuda_backends_take_the_callers_stream():
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="no CUDA device 0"):
            ggml.backend_cuda_init(0, stream=None)
        pytest.skip("no CUDA device: only the argument check ran")
    stream = torch.cuda.current_stream()
    backend = ggml.backend_cuda_init(0, stream=stream)
    assert backend.stream.stream == stream
    ctx = ggml.init(no_alloc=True)
    g, x, w, y = small_graph(ctx)
    fn = ggml.graph_function(g, [x], [y], backend)
    init_weights(fn)
    xv = torch.rand(3, 8, device="cuda")
    outs = [fn(xv) for _ in range(3)]  # eager, capture, replay
    expected = fn.reference(xv.cpu())
    assert all(o.device.type == "cuda" and torch.allclose(o.cpu(), expected, atol=1e-5) for o in outs)
    ggml.backend_synchronize(backend)


T = ggml.Type


def _two_layer_function(param: bool):
    ctx = ggml.init(no_alloc=True)
    x = ggml.new_tensor_2d(ctx, T.F32, 64, 8)
    ggml.set_input(x)
    w1, w2 = ggml.new_tensor_2d(ctx, T.F32, 64, 64), ggml.new_tensor_2d(ctx, T.F32, 64, 64)
    if param:
        ggml.set_param(w1)
        ggml.set_param(w2)
    h = ggml.silu(ctx, ggml.mul_mat(ctx, w1, x))
    h = ggml.silu(ctx, ggml.mul_mat(ctx, w2, h))
    y = ggml.mul_mat(ctx, w1, h)
    ggml.set_output(y)
    graph = ggml.new_graph(ctx)
    ggml.build_forward_expand(graph, y)
    return ggml.graph_function(graph, [x], [y], ggml.backend_cpu_init()), w1, w2


@pytest.mark.parametrize("param", [False, True], ids=["weights", "trainable"])
def test_graph_function_weights_set_after_creation_stay_set(param):
    """The weights had no memory: they used to share the compute memory, so the first call was
    right and the next ones read intermediate results (max error 2.6-5.1)."""
    f, w1, w2 = _two_layer_function(param)
    gen = torch.Generator().manual_seed(0)
    W1, W2 = torch.randn(64, 64, generator=gen) / 8, torch.randn(64, 64, generator=gen) / 8
    ggml.backend_tensor_set(w1, W1)
    ggml.backend_tensor_set(w2, W2)
    x = torch.randn(8, 64, generator=gen, dtype=torch.float64)
    W1d, W2d = W1.double().requires_grad_(param), W2.double().requires_grad_(param)
    silu = torch.nn.functional.silu
    want = silu(silu(x @ W1d.T) @ W2d.T) @ W1d.T
    for _ in range(3):
        torch.testing.assert_close(f(x.float()).double(), want, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(f.reference(x).double(), want, rtol=1e-6, atol=1e-6)
    if param:
        f(x.float()).sum().backward()
        grads = torch.autograd.grad(want.sum(), [W1d, W2d])
        for p, g in zip(f.parameters(), grads):
            torch.testing.assert_close(p.grad.double(), g, rtol=1e-3, atol=1e-3)
    f.free()
