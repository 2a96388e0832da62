"""Backends, buffers, streams and events on CPU and SIM devices: the ggml-backend API calls,
async ordering on the SIM worker streams, graph plans, graph copy/compare, multi-buffers and
bad input. SIM devices come from TORCHGGML_SIM_DEVICES (tests/conftest.py sets 2)."""
import gc
import threading
import time
from contextlib import contextmanager

import numpy as np
import pytest
import torch

import torchggml as ggml
from torchggml.quants import quantize
from torchggml.devices.kernels import TORCH_KERNELS
from torchggml.devices.kernels.gpu import GPU_KERNELS

T = ggml.Type


@pytest.fixture(autouse=True)
def two_sim_devices(monkeypatch):
    monkeypatch.setenv("TORCHGGML_SIM_DEVICES", "2")


@pytest.fixture
def cpu():
    return ggml.backend_cpu_init()


@pytest.fixture
def sim0():
    b = ggml.backend_init_by_name("SIM0")
    yield b
    ggml.backend_free(b)


@pytest.fixture
def sim1():
    b = ggml.backend_init_by_name("SIM1")
    yield b
    ggml.backend_free(b)


@pytest.fixture(params=["CPU", "SIM0"] + (["CUDA0"] if torch.cuda.is_available() else []))
def backend(request):
    b = ggml.backend_init_by_name(request.param)
    yield b
    ggml.backend_free(b)


@contextmanager
def gated(backend):
    """Hold the backend's stream at this point until the block ends (a host function on the
    stream, as cudaLaunchHostFunc), so that work queued inside the block cannot have run."""
    gate = threading.Event()
    backend.stream.submit(gate.wait, "test gate")
    try:
        yield
    finally:
        gate.set()


def rand(*shape, seed=0):
    return torch.rand(*shape, generator=torch.Generator().manual_seed(seed)) * 2 - 1


def tensors_on(backend, *nes, type=T.F32):
    """New tensors of the given ne lists in one buffer of the backend."""
    ctx = ggml.init(no_alloc=True)
    ts = [ggml.new_tensor(ctx, type, ne) for ne in nes]
    buf = ggml.backend_alloc_ctx_tensors(ctx, backend)
    return ctx, buf, ts


def matmul_chain(backend, n=256, depth=4, seed=0):
    """x -> (w @ .)^depth on the backend, w and x set; (graph, w, x, out, reference)."""
    ctx = ggml.init(no_alloc=True)
    w = ggml.new_tensor_2d(ctx, T.F32, n, n)
    x = ggml.new_tensor_2d(ctx, T.F32, n, n)
    out = x
    for _ in range(depth):
        out = ggml.mul_mat(ctx, w, out)
    g = ggml.new_graph(ctx)
    ggml.build_forward_expand(g, out)
    ggml.backend_alloc_ctx_tensors(ctx, backend)
    wv, xv = rand(n, n, seed=seed) / n ** 0.5, rand(n, n, seed=seed + 1)
    ggml.backend_tensor_set(w, wv)
    ggml.backend_tensor_set(x, xv)
    ref = xv.double()
    for _ in range(depth):
        ref = ref @ wv.double().T
    return ctx, g, w, x, out, ref.float()


def add_scale_graph(backend, n=64):
    """out = (a + b) * 3 on the backend; (ctx, graph, a, b, out)."""
    ctx = ggml.init(no_alloc=True)
    a = ggml.new_tensor_1d(ctx, T.F32, n)
    b = ggml.new_tensor_1d(ctx, T.F32, n)
    out = ggml.scale(ctx, ggml.add(ctx, a, b), 3.0)
    g = ggml.new_graph(ctx)
    ggml.build_forward_expand(g, out)
    ggml.backend_alloc_ctx_tensors(ctx, backend)
    return ctx, g, a, b, out


# ---------------------------------------------------------------- buffer types and buffers

@pytest.mark.parametrize("dev_name, is_host, alignment", [("CPU", True, 32), ("SIM0", False, 128)])
def test_buffer_type_and_buffer_calls(dev_name, is_host, alignment):
    dev = ggml.backend_dev_by_name(dev_name)
    buft = ggml.backend_dev_buffer_type(dev)
    assert ggml.backend_buft_name(buft) == dev_name
    assert ggml.backend_buft_is_host(buft) is is_host
    assert ggml.backend_buft_get_alignment(buft) == alignment
    assert ggml.backend_buft_get_device(buft) is dev
    assert ggml.backend_buft_get_max_size(buft) > 2**20
    ctx = ggml.init(no_alloc=True)
    t = ggml.new_tensor_2d(ctx, T.F16, 10, 3)
    assert ggml.backend_buft_get_alloc_size(buft, t) == 60
    buf = ggml.backend_buft_alloc_buffer(buft, 1000)
    assert ggml.backend_buffer_get_size(buf) == 1000
    assert ggml.backend_buffer_get_base(buf) % alignment == 0
    assert ggml.backend_buffer_is_host(buf) is is_host
    assert ggml.backend_buffer_get_type(buf) is buft
    assert ggml.backend_buffer_name(buf) == dev_name
    assert ggml.backend_buffer_get_alignment(buf) == alignment
    assert ggml.backend_buffer_get_alloc_size(buf, t) == 60
    assert ggml.backend_buffer_get_usage(buf) == ggml.BufferUsage.ANY
    ggml.backend_buffer_set_usage(buf, ggml.BufferUsage.WEIGHTS)
    assert ggml.backend_buffer_get_usage(buf) == ggml.BufferUsage.WEIGHTS
    assert ggml.backend_tensor_alloc(buf, t, ggml.backend_buffer_get_base(buf) + 128) == ggml.Status.SUCCESS
    assert ggml.backend_buffer_init_tensor(buf, t) == ggml.Status.SUCCESS
    ggml.backend_buffer_clear(buf, 0x3C)  # 0x3C3C is 1.0586 in f16
    assert torch.equal(ggml.backend_tensor_get(t), torch.full((3, 10), 0x3C3C, dtype=torch.int16).view(torch.float16))
    ggml.backend_tensor_memset(t, 0, 20, 20)
    assert (ggml.backend_tensor_get(t).view(-1)[10:20] == 0).all()
    ggml.backend_buffer_reset(buf)
    ggml.backend_buffer_free(buf)


@pytest.mark.parametrize("src_dev, dst_dev", [("CPU", "SIM0"), ("SIM0", "SIM1"), ("SIM1", "CPU"), ("SIM0", "SIM0")])
def test_tensor_copy_between_devices(src_dev, dst_dev):
    src_b = ggml.backend_init_by_name(src_dev)
    dst_b = ggml.backend_init_by_name(dst_dev)
    _, _, (src,) = tensors_on(src_b, [7, 5])
    _, _, (dst,) = tensors_on(dst_b, [7, 5])
    value = rand(5, 7)
    ggml.backend_tensor_set(src, value)
    ggml.backend_tensor_copy(src, dst)
    assert torch.equal(ggml.backend_tensor_get(dst), value)


def test_cpu_buffer_from_ptr_shares_memory():
    arr = np.arange(12, dtype=np.float32)
    buf = ggml.backend_cpu_buffer_from_ptr(arr)
    ctx = ggml.init(no_alloc=True)
    t = ggml.new_tensor_1d(ctx, T.F32, 12)
    ggml.backend_tensor_alloc(buf, t, ggml.backend_buffer_get_base(buf))
    arr[3] = 42.0  # the tensor sees writes to the array: no copy was made
    assert ggml.backend_tensor_get(t)[3] == 42.0
    assert ggml.backend_buffer_is_host(buf)


def test_multi_buffer_reaches_every_member(sim0):
    parts = [ggml.backend_alloc_buffer(sim0, n) for n in (256, 512)]
    multi = ggml.backend_multi_buffer_alloc_buffer(parts)
    assert ggml.backend_buffer_is_multi_buffer(multi)
    assert not ggml.backend_buffer_is_multi_buffer(parts[0])
    assert ggml.backend_buffer_get_size(multi) == 768
    assert ggml.backend_buffer_name(multi) == "SIM0"
    ggml.backend_buffer_set_usage(multi, ggml.BufferUsage.WEIGHTS)
    assert all(ggml.backend_buffer_get_usage(p) == ggml.BufferUsage.WEIGHTS for p in parts)
    ggml.backend_multi_buffer_set_usage(multi, ggml.BufferUsage.COMPUTE)
    assert all(ggml.backend_buffer_get_usage(p) == ggml.BufferUsage.COMPUTE for p in parts)
    ctx = ggml.init(no_alloc=True)
    ts = [ggml.new_tensor_1d(ctx, T.I8, p.size) for p in parts]
    for t, p in zip(ts, parts):
        ggml.backend_tensor_alloc(p, t, p.get_base())
    ggml.backend_buffer_clear(multi, 7)
    assert all((ggml.backend_tensor_get(t) == 7).all() for t in ts)
    with pytest.raises(TypeError, match="not a multi-buffer"):
        ggml.backend_multi_buffer_set_usage(parts[0], ggml.BufferUsage.ANY)
    free_before = ggml.backend_dev_memory(ggml.backend_get_device(sim0))[0]
    ggml.backend_buffer_free(multi)
    assert all(p.freed for p in parts)
    assert ggml.backend_dev_memory(ggml.backend_get_device(sim0))[0] >= free_before + 768 - 4096


# ---------------------------------------------------------------- backends

def test_backend_calls(backend):
    dev = ggml.backend_get_device(backend)
    assert ggml.backend_name(backend) == ggml.backend_dev_name(dev)
    assert len(ggml.backend_guid(backend)) == 16
    buft = ggml.backend_get_default_buffer_type(backend)
    assert buft is ggml.backend_dev_buffer_type(dev)
    assert ggml.backend_get_alignment(backend) == ggml.backend_buft_get_alignment(buft)
    assert ggml.backend_get_max_size(backend) == ggml.backend_buft_get_max_size(buft)
    assert ggml.backend_supports_buft(backend, buft)
    buf = ggml.backend_alloc_buffer(backend, 4096)
    assert ggml.backend_buffer_get_type(buf) is buft
    ctx, g, a, b, out = add_scale_graph(backend)
    assert ggml.backend_supports_op(backend, out)
    av, bv = rand(64, seed=1), rand(64, seed=2)
    ggml.backend_tensor_set_async(backend, a, av)
    ggml.backend_tensor_set_async(backend, b, bv)
    assert ggml.backend_graph_compute_async(backend, g) == ggml.Status.SUCCESS
    host = torch.empty(64)
    ggml.backend_tensor_get_async(backend, out, host)
    ggml.backend_synchronize(backend)
    torch.testing.assert_close(host, (av + bv) * 3)
    assert ggml.backend_graph_compute(backend, g) == ggml.Status.SUCCESS


def test_guids_tell_backend_kinds_apart(cpu, sim0, sim1):
    assert ggml.backend_guid(sim0) == ggml.backend_guid(sim1) != ggml.backend_guid(cpu)


@pytest.mark.parametrize("backend_dev, buft_of, supported", [
    ("SIM0", "SIM0", True), ("SIM0", "SIM1", False), ("SIM0", "CPU", False),
    ("CPU", "CPU", True), ("CPU", "SIM0", False), ("CPU", "SIM0_Host", True),
])
def test_supports_buft(backend_dev, buft_of, supported):
    dev = ggml.backend_dev_by_name(backend_dev)
    if buft_of.endswith("_Host"):
        buft = ggml.backend_dev_host_buffer_type(ggml.backend_dev_by_name(buft_of[:-5]))
    else:
        buft = ggml.backend_dev_buffer_type(ggml.backend_dev_by_name(buft_of))
    assert ggml.backend_dev_supports_buft(dev, buft) is supported


@pytest.mark.parametrize("ne1, offload", [(1, False), (31, False), (32, True), (512, True)])
def test_sim_offload_op_follows_the_gpu_batch_policy(ne1, offload):
    ctx = ggml.init(no_alloc=True)
    w = ggml.new_tensor_2d(ctx, T.Q8_0, 64, 16)
    x = ggml.new_tensor_2d(ctx, T.F32, 64, ne1)
    assert ggml.backend_dev_offload_op(ggml.backend_dev_by_name("SIM0"), ggml.mul_mat(ctx, w, x)) is offload
    assert ggml.backend_dev_offload_op(ggml.backend_dev_by_name("CPU"), ggml.mul_mat(ctx, w, x)) is False


# ---------------------------------------------------------------- asynchrony and ordering on SIM

def test_async_calls_return_before_the_work_runs(sim0):
    ctx, g, a, b, out = add_scale_graph(sim0)
    host = np.zeros(64, dtype=np.float32)
    with gated(sim0):
        ggml.backend_tensor_set_async(sim0, a, np.ones(64, dtype=np.float32))
        ggml.backend_tensor_set_async(sim0, b, np.full(64, 2, dtype=np.float32))
        ggml.backend_graph_compute_async(sim0, g)
        ggml.backend_tensor_get_async(sim0, out, host)
        time.sleep(0.05)
        assert not host.any()  # nothing ran: the stream is held
    ggml.backend_synchronize(sim0)
    assert (host == 9).all()  # valid after synchronize


@pytest.mark.parametrize("dest", ["torch", "numpy", "bytearray"])
def test_tensor_get_async_is_valid_only_after_synchronize(sim0, dest):
    _, _, (t,) = tensors_on(sim0, [16])
    value = rand(16, seed=3)
    ggml.backend_tensor_set(t, value)
    out = {"torch": lambda: torch.zeros(16), "numpy": lambda: np.zeros(16, np.float32),
           "bytearray": lambda: bytearray(64)}[dest]()
    with gated(sim0):
        ggml.backend_tensor_get_async(sim0, t, out)
        assert not any(bytes(memoryview(np.asarray(out) if dest != "bytearray" else out)))
    ggml.backend_synchronize(sim0)
    got = torch.frombuffer(bytearray(bytes(memoryview(np.asarray(out) if dest != "bytearray" else out))), dtype=torch.float32)
    assert torch.equal(got, value)


def test_set_async_keeps_the_source_alive(sim0):
    _, _, (t,) = tensors_on(sim0, [4096])
    with gated(sim0):
        ggml.backend_tensor_set_async(sim0, t, torch.arange(4096, dtype=torch.float32) * 2)
        gc.collect()  # the caller's temporary is gone; the queued copy still owns it
    ggml.backend_synchronize(sim0)
    assert torch.equal(ggml.backend_tensor_get(t), torch.arange(4096, dtype=torch.float32) * 2)


def test_copy_queued_behind_a_long_compute_sees_its_result(sim0, sim1):
    _, g, w, x, out, ref = matmul_chain(sim0, n=384, depth=6)
    _, _, (dst,) = tensors_on(sim1, list(out.ne))
    ggml.backend_graph_compute_async(sim0, g)
    ggml.backend_tensor_copy_async(sim0, sim1, out, dst)  # on SIM0's stream, after the compute
    host = torch.empty(384, 384)
    ggml.backend_tensor_get_async(sim1, dst, host)       # SIM1 waits for the copy
    ggml.backend_synchronize(sim1)
    torch.testing.assert_close(host, ref, rtol=1e-4, atol=1e-4)
    ggml.backend_synchronize(sim0)


def test_event_wait_makes_one_stream_wait_for_another(sim0, sim1):
    ctx, g, a, b, out = add_scale_graph(sim0)
    ggml.backend_tensor_set(a, torch.ones(64))
    ggml.backend_tensor_set(b, torch.ones(64))
    ev = ggml.backend_event_new(ggml.backend_get_device(sim0))
    seen = []
    with gated(sim0):
        ggml.backend_graph_compute_async(sim0, g)
        ggml.backend_event_record(ev, sim0)
        ggml.backend_event_wait(sim1, ev)
        sim1.stream.submit(lambda: seen.append(ggml.backend_tensor_get(out).clone()), "observe")
        time.sleep(0.05)
        assert seen == []  # SIM1 is held by SIM0's event, SIM0 by the gate
    ggml.backend_synchronize(sim1)
    assert torch.equal(seen[0], torch.full((64,), 6.0))
    ggml.backend_event_synchronize(ev)
    ggml.backend_event_free(ev)


def test_event_synchronize_blocks_the_host_until_the_mark(sim0):
    ev = ggml.backend_event_new(ggml.backend_get_device(sim0))
    ggml.backend_event_synchronize(ev)  # never recorded: nothing to wait for
    done = []
    with gated(sim0):
        sim0.stream.submit(lambda: done.append(1), "work")
        ggml.backend_event_record(ev, sim0)
        assert not ev.handle.query()
    ggml.backend_event_synchronize(ev)
    assert done == [1] and ev.handle.query()


def test_events_per_device(cpu, sim0, sim1):
    assert ggml.backend_event_new(ggml.backend_get_device(cpu)) is None
    assert ggml.backend_event_new(None) is None
    ev1 = ggml.backend_event_new(ggml.backend_get_device(sim1))
    with pytest.raises(ValueError, match="belongs to device SIM1"):
        ggml.backend_event_record(ev1, sim0)
    with pytest.raises(NotImplementedError, match="CPU has no events"):
        ggml.backend_event_record(ev1, cpu)
    ggml.backend_event_record(ev1, sim1)
    ggml.backend_event_wait(cpu, ev1)  # the CPU waits on the host
    ggml.backend_event_wait(sim0, ev1)
    ggml.backend_synchronize(sim0)
    with pytest.raises(TypeError, match="expected an Event"):
        ggml.backend_event_wait(sim0, "not an event")


def test_buffers_reused_by_later_graphs_never_read_stale_data(sim0):
    """Graphs placed at the same addresses of one buffer, queued back to back with new inputs
    and never synchronized in between, each compute from their own inputs."""
    buf = ggml.backend_alloc_buffer(sim0, 1 << 16)
    base = ggml.backend_buffer_get_base(buf)
    results, expected = [], []
    for step in range(6):
        ctx = ggml.init(no_alloc=True)
        a = ggml.new_tensor_2d(ctx, T.F32, 32, 8)
        b = ggml.new_tensor_2d(ctx, T.F32, 32, 8)
        out = ggml.mul(ctx, ggml.add(ctx, a, b), b) if step % 2 else ggml.sub(ctx, ggml.scale(ctx, a, 2.0), b)
        g = ggml.new_graph(ctx)
        ggml.build_forward_expand(g, out)
        for i, t in enumerate([a, b, *g.nodes]):  # the same slots every step
            ggml.backend_tensor_alloc(buf, t, base + i * 1024)
        av, bv = rand(8, 32, seed=step), rand(8, 32, seed=100 + step)
        ggml.backend_tensor_set_async(sim0, a, av)
        ggml.backend_tensor_set_async(sim0, b, bv)
        ggml.backend_graph_compute_async(sim0, g)
        host = torch.empty(8, 32)
        ggml.backend_tensor_get_async(sim0, out, host)
        results.append(host)
        expected.append((av + bv) * bv if step % 2 else av * 2 - bv)
    ggml.backend_synchronize(sim0)
    for got, want in zip(results, expected):
        torch.testing.assert_close(got, want)


def test_worker_errors_surface_at_synchronize_naming_the_op(sim0, monkeypatch):
    def broken_add(node):
        raise ArithmeticError("kernel exploded")
    monkeypatch.setitem(GPU_KERNELS.entries.maps[0], ggml.Op.ADD, (broken_add, lambda n: True))
    ctx, g, a, b, out = add_scale_graph(sim0)
    ggml.backend_graph_compute_async(sim0, g)          # queued: nothing raised yet
    ran_after = []
    sim0.stream.submit(lambda: ran_after.append(1), "after the failure")
    with pytest.raises(ggml.StreamError, match=r"SIM0: .*op ADD .*kernel exploded"):
        ggml.backend_synchronize(sim0)
    assert ran_after == []  # work behind a failure is dropped until it is reported
    monkeypatch.undo()
    ggml.backend_tensor_set(a, torch.ones(64))
    ggml.backend_tensor_set(b, torch.ones(64))
    assert ggml.backend_graph_compute(sim0, g) == ggml.Status.SUCCESS  # the stream works again
    assert torch.equal(ggml.backend_tensor_get(out), torch.full((64,), 6.0))


def test_freed_backend_refuses_work():
    b = ggml.backend_init_by_name("SIM1")
    thread = b.stream._thread
    ggml.backend_free(b)
    assert not thread.is_alive()
    with pytest.raises(RuntimeError, match="freed"):
        b.stream.submit(lambda: None, "late work")


# ---------------------------------------------------------------- graph plans

def test_graph_plan_create_compute_update(backend):
    ctx, g, a, b, out = add_scale_graph(backend)
    plan = ggml.backend_graph_plan_create(backend, g)
    # ADD, SCALE as bound kernel calls (on the CPU one native run holding both)
    bound = [m for call, node in plan.calls for m in getattr(call, "members", [(call, node)])]
    assert len(bound) == 2
    for step in range(3):  # the plan reads the inputs of each run, not those it was built with
        ggml.backend_tensor_set(a, torch.full((64,), float(step)))
        ggml.backend_tensor_set(b, torch.ones(64))
        assert ggml.backend_graph_plan_compute(backend, plan) == ggml.Status.SUCCESS
        ggml.backend_synchronize(backend)
        assert torch.equal(ggml.backend_tensor_get(out), torch.full((64,), 3.0 * (step + 1)))
    ctx2, g2, a2, b2, out2 = add_scale_graph(backend, n=16)
    ggml.backend_graph_plan_update(backend, plan, g2)
    ggml.backend_tensor_set(a2, torch.ones(16))
    ggml.backend_tensor_set(b2, torch.ones(16))
    ggml.backend_graph_plan_compute(backend, plan)
    ggml.backend_synchronize(backend)
    assert torch.equal(ggml.backend_tensor_get(out2), torch.full((16,), 6.0))
    ggml.backend_graph_plan_free(backend, plan)


def test_sim_plan_compute_is_queued(sim0):
    ctx, g, a, b, out = add_scale_graph(sim0)
    plan = ggml.backend_graph_plan_create(sim0, g)
    ggml.backend_tensor_set(a, torch.ones(64))
    ggml.backend_tensor_set(b, torch.ones(64))
    ggml.backend_tensor_memset(out, 0)
    with gated(sim0):
        ggml.backend_graph_plan_compute(sim0, plan)
        assert not ggml.backend_tensor_get(out).any()
    ggml.backend_synchronize(sim0)
    assert torch.equal(ggml.backend_tensor_get(out), torch.full((64,), 6.0))


# ---------------------------------------------------------------- graph copy and compare

def test_graph_copy_has_the_same_data_on_the_other_backend(cpu, sim0):
    ctx, g, a, b, out = add_scale_graph(cpu)
    ggml.backend_tensor_set(a, rand(64, seed=1))
    ggml.backend_tensor_set(b, rand(64, seed=2))
    copy = ggml.backend_graph_copy(sim0, g)
    assert ggml.backend_buffer_get_type(copy.buffer) is ggml.backend_get_default_buffer_type(sim0)
    assert [n.op for n in copy.graph.nodes] == [n.op for n in g.nodes]
    a2 = copy.graph.nodes[0].src[0]
    assert a2.buffer is copy.buffer and torch.equal(ggml.backend_tensor_get(a2), ggml.backend_tensor_get(a))
    ggml.backend_graph_compute(sim0, copy.graph)
    ggml.backend_graph_compute(cpu, g)
    assert torch.equal(ggml.backend_tensor_get(copy.graph.nodes[-1]), ggml.backend_tensor_get(out))
    ggml.backend_graph_copy_free(copy)
    assert copy.buffer.freed


def nmse(x, y):
    return float(((x.double() - y.double()) ** 2).sum() / (y.double() ** 2).sum().clamp_min(1e-30))


@pytest.mark.parametrize("wtype", [T.F32, T.F16, T.Q4_0, T.Q8_0], ids=lambda t: t.name)
def test_compare_graph_backend_node_by_node(cpu, sim0, wtype):
    """SIM (the GPU table: Triton kernels for block types under TRITON_INTERPRET=1) against the
    CPU reference, node by node."""
    ctx = ggml.init(no_alloc=True)
    w = ggml.new_tensor_2d(ctx, wtype, 64, 16)
    x = ggml.new_tensor_2d(ctx, T.F32, 64, 3)
    ids = ggml.new_tensor_1d(ctx, T.I32, 5)
    y = ggml.mul_mat(ctx, w, x)
    out = ggml.scale(ctx, ggml.add(ctx, y, y), 0.5)
    g = ggml.new_graph(ctx)
    ggml.build_forward_expand(g, out)
    ggml.build_forward_expand(g, ggml.get_rows(ctx, w, ids))
    ggml.backend_alloc_ctx_tensors(ctx, sim0)
    wv = rand(16, 64, seed=5)
    ggml.backend_tensor_set(w, quantize(wtype, wv) if ggml.is_quantized(wtype) else wv.to(ggml.type_to_dtype(wtype)))
    ggml.backend_tensor_set(x, rand(3, 64, seed=6))
    ggml.backend_tensor_set(ids, torch.tensor([3, 0, 15, 3, 7], dtype=torch.int32))
    seen = []

    def callback(i, t1, t2):
        seen.append((i, t1.op, nmse(ggml.backend_tensor_get(t1), ggml.backend_tensor_get(t2))))
        return True
    assert ggml.backend_compare_graph_backend(sim0, cpu, g, callback)
    assert [(i, op) for i, op, _ in seen] == [(0, ggml.Op.MUL_MAT), (1, ggml.Op.ADD), (2, ggml.Op.SCALE),
                                              (3, ggml.Op.GET_ROWS)]
    assert all(err < 5e-4 for _, _, err in seen)

    seen.clear()
    assert ggml.backend_compare_graph_backend(sim0, cpu, g, callback, test_node=g.nodes[1])
    assert [(i, op) for i, op, _ in seen] == [(1, ggml.Op.ADD)]


def test_compare_graph_backend_stops_when_the_callback_says_so(cpu, sim0):
    ctx, g, a, b, out = add_scale_graph(cpu)
    ggml.backend_tensor_set(a, torch.ones(64))
    ggml.backend_tensor_set(b, torch.ones(64))
    calls = []
    assert ggml.backend_compare_graph_backend(cpu, sim0, g, lambda i, t1, t2: calls.append(i) and False)
    assert calls == [0]


def test_gpu_table_falls_through_to_reference_kernels_added_later(monkeypatch):
    ctx = ggml.init(no_alloc=True)
    a = ggml.new_tensor_1d(ctx, T.F32, 4)
    node = ggml.add(ctx, a, a)
    assert GPU_KERNELS.supports(node) == TORCH_KERNELS.supports(node)
    marker = (lambda n: None, lambda n: True)
    monkeypatch.setitem(TORCH_KERNELS.entries, ggml.Op.ARANGE, marker)
    assert GPU_KERNELS.entries[ggml.Op.ARANGE] is marker


# ---------------------------------------------------------------- bad input

def test_tensor_of_another_device_is_refused(cpu, sim0, sim1):
    _, _, (t_cpu,) = tensors_on(cpu, [8])
    _, _, (t_sim1,) = tensors_on(sim1, [8])
    with pytest.raises(ValueError, match="device CPU, not usable by backend SIM0"):
        ggml.backend_tensor_set_async(sim0, t_cpu, torch.zeros(8))
    with pytest.raises(ValueError, match="device SIM1, not usable by backend SIM0"):
        ggml.backend_tensor_get_async(sim0, t_sim1, torch.zeros(8))
    _, g_sim, *_ = add_scale_graph(sim0)
    with pytest.raises(ValueError, match="lives in buffer SIM0 of device SIM0, which backend CPU cannot use"):
        ggml.backend_graph_compute(cpu, g_sim)
    with pytest.raises(ValueError, match="which backend SIM1 cannot use"):
        ggml.backend_graph_compute(sim1, g_sim)
    with pytest.raises(ValueError, match="which backend SIM1 cannot use"):
        ggml.backend_graph_plan_create(sim1, g_sim)


@pytest.mark.parametrize("dev_name", ["CPU", "SIM0"])
def test_unsupported_op_names_op_device_and_types(dev_name):
    backend = ggml.backend_init_by_name(dev_name)
    ctx = ggml.init(no_alloc=True)
    a = ggml.new_tensor_2d(ctx, T.F32, 32, 4)
    b = ggml.new_tensor_2d(ctx, T.Q8_0, 32, 4)  # quantized activations: never a mul_mat input
    node = ggml.mul_mat(ctx, a, b)
    g = ggml.new_graph(ctx)
    ggml.build_forward_expand(g, node)
    ggml.backend_alloc_ctx_tensors(ctx, backend)
    assert not ggml.backend_supports_op(backend, node)
    with pytest.raises(ggml.UnsupportedOpError, match=rf"MUL_MAT is not supported on {dev_name} .*sources \(F32, Q8_0\)"):
        ggml.backend_graph_compute(backend, g)
    ggml.backend_free(backend)


@pytest.mark.parametrize("call", ["set", "set_async", "get", "get_async", "memset"])
def test_size_past_the_end_is_refused(sim0, call):
    _, _, (t,) = tensors_on(sim0, [16])  # 64 bytes
    data = torch.zeros(32)
    run = {"set": lambda: ggml.backend_tensor_set(t, data, 8, 64),
           "set_async": lambda: ggml.backend_tensor_set_async(sim0, t, data, 8, 64),
           "get": lambda: ggml.backend_tensor_get(t, data, 8, 64),
           "get_async": lambda: ggml.backend_tensor_get_async(sim0, t, data, 8, 64),
           "memset": lambda: ggml.backend_tensor_memset(t, 0, 60, 8)}[call]
    with pytest.raises(IndexError, match="past the end of tensor"):
        run()


def test_too_little_data_or_destination_is_refused(sim0):
    _, _, (t,) = tensors_on(sim0, [16])
    with pytest.raises(ValueError, match="exceeds the 16 bytes of data"):
        ggml.backend_tensor_set_async(sim0, t, torch.zeros(4), 0, 64)
    with pytest.raises(ValueError, match="destination has 16 bytes, 64 needed"):
        ggml.backend_tensor_get_async(sim0, t, torch.zeros(4))
    with pytest.raises(ValueError, match="read-only"):
        ggml.backend_tensor_get_async(sim0, t, bytes(64))


def test_tensor_past_the_buffer_end_is_refused(sim0):
    buf = ggml.backend_alloc_buffer(sim0, 256)
    ctx = ggml.init(no_alloc=True)
    t = ggml.new_tensor_1d(ctx, T.F32, 32)  # 128 bytes
    with pytest.raises(MemoryError, match="does not fit in buffer SIM0 of 256 bytes"):
        ggml.backend_tensor_alloc(buf, t, ggml.backend_buffer_get_base(buf) + 192)


def test_out_of_memory(sim0):
    dev = ggml.backend_get_device(sim0)
    free, total = ggml.backend_dev_memory(dev)
    with pytest.raises(MemoryError, match="SIM0"):
        ggml.backend_alloc_buffer(sim0, total + 1)
    buf = ggml.backend_alloc_buffer(sim0, 1 << 20)
    assert ggml.backend_dev_memory(dev)[0] <= free - (1 << 20) + 2**16
    ggml.backend_buffer_free(buf)
    with pytest.raises(MemoryError, match="CPU"):
        ggml.backend_buft_alloc_buffer(ggml.backend_cpu_buffer_type(), 1 << 62)


def test_sim_memory_capacity_from_the_environment(monkeypatch):
    monkeypatch.setenv("TORCHGGML_SIM_MEMORY", "1M")
    sim = ggml.backend_init_by_name("SIM0")
    assert ggml.backend_dev_memory(ggml.backend_get_device(sim))[1] == 2**20
    buf = ggml.backend_alloc_buffer(sim, 600_000)
    with pytest.raises(MemoryError, match="out of device memory"):
        ggml.backend_alloc_buffer(sim, 600_000)
    ggml.backend_buffer_free(buf)
    ggml.backend_buffer_free(ggml.backend_alloc_buffer(sim, 600_000))  # freed memory is free again
    ggml.backend_free(sim)
    monkeypatch.setenv("TORCHGGML_SIM_MEMORY", "lots")
    with pytest.raises(ValueError, match="TORCHGGML_SIM_MEMORY"):
        ggml.backend_dev_count()


# ---------------------------------------------------------------- CUDA (runs where a GPU is present)

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")


@needs_cuda
def test_cuda_async_roundtrip_and_events():
    b0, b1 = ggml.backend_init_by_name("CUDA0"), ggml.backend_init_by_name("CUDA0")
    _, g, w, x, out, ref = matmul_chain(b0, n=512, depth=8)
    _, _, (dst,) = tensors_on(b1, list(out.ne))
    ggml.backend_graph_compute_async(b0, g)
    ev = ggml.backend_event_new(ggml.backend_get_device(b0))
    ggml.backend_event_record(ev, b0)
    ggml.backend_event_wait(b1, ev)
    ggml.backend_tensor_copy_async(b0, b1, out, dst)
    host = torch.empty(512, 512).pin_memory()
    ggml.backend_tensor_get_async(b1, dst, host)
    ggml.backend_synchronize(b1)
    torch.testing.assert_close(host, ref, rtol=2e-3, atol=2e-3)
    ggml.backend_event_synchronize(ev)


@needs_cuda
def test_cuda_graph_plan_replays_a_50_node_graph():
    backend = ggml.backend_init_by_name("CUDA0")
    ctx = ggml.init(no_alloc=True)
    a = ggml.new_tensor_1d(ctx, T.F32, 1024)
    h = a
    for _ in range(25):
        h = ggml.scale(ctx, ggml.add(ctx, h, a), 0.5)
    g = ggml.new_graph(ctx)
    ggml.build_forward_expand(g, h)
    assert g.n_nodes == 50
    ggml.backend_alloc_ctx_tensors(ctx, backend)
    plan = ggml.backend_graph_plan_create(backend, g)
    for step in range(4):  # eager warm-up, capture + replay, replays
        av = rand(1024, seed=step)
        ggml.backend_tensor_set(a, av)
        ggml.backend_graph_plan_compute(backend, plan)
        ggml.backend_synchronize(backend)
        ref = av.clone()
        for _ in range(25):
            ref = (ref + av) * 0.5
        torch.testing.assert_close(ggml.backend_tensor_get(h), ref)
    assert plan.device_graph is not None and plan.capture_error is None
    ggml.backend_graph_plan_free(backend, plan)


@needs_cuda
def test_cuda_host_buffers():
    dev = ggml.backend_dev_by_name("CUDA0")
    host = ggml.backend_buft_alloc_buffer(ggml.backend_dev_host_buffer_type(dev), 4096)
    assert ggml.backend_buffer_is_host(host) and host.storage.is_pinned()
    arr = np.arange(16, dtype=np.float32)
    mapped = ggml.backend_dev_buffer_from_host_ptr(dev, arr)
    assert ggml.backend_buffer_get_base(mapped) == arr.ctypes.data and ggml.backend_buffer_is_host(mapped)


@pytest.mark.parametrize("alignment", [32, 64, 128, 256, 4096])
@pytest.mark.parametrize("size", [0, 1, 1000])
def test_buffer_base_honours_the_buffer_type_alignment(alignment, size):
    from torchggml.storage import TorchBufferType
    buft = TorchBufferType("ALIGNED", None, "cpu", host=True, alignment=alignment)
    buf = buft.alloc_buffer(size)
    assert buf.get_base() % alignment == 0
    assert buf.get_base() + size <= buf.storage.data_ptr() + buf.storage.nbytes()
    ggml.backend_buffer_clear(buf, 7)  # the whole range is writable


@pytest.mark.parametrize("ne_b", [[8, 4, 1, 1], [8, 1, 1, 1], [4, 2, 1, 1]])  # same, unit broadcast, tiled
def test_plan_with_bound_kernels_reads_current_inputs(ne_b):
    """Compiled plans bind views, never values: new input data shows in the next compute."""
    ctx = ggml.init(no_alloc=True)
    a = ggml.new_tensor_2d(ctx, ggml.Type.F32, 8, 4)
    b = ggml.new_tensor(ctx, ggml.Type.F32, ne_b)
    out = ggml.mul(ctx, ggml.add(ctx, a, b), b)
    graph = ggml.new_graph(ctx)
    ggml.build_forward_expand(graph, out)
    backend = ggml.backend_cpu_init()
    ggml.backend_alloc_ctx_tensors(ctx, backend)
    plan = ggml.backend_graph_plan_create(backend, graph)
    for step in range(3):
        va = torch.rand(4, 8)
        vb = torch.rand(*reversed(ne_b[:2]))
        ggml.backend_tensor_set(a, va)
        ggml.backend_tensor_set(b, vb)
        ggml.backend_graph_plan_compute(backend, plan)
        tb = vb.repeat(4 // vb.shape[0], 8 // vb.shape[1])
        torch.testing.assert_close(ggml.backend_tensor_get(out), (va + tb) * tb)
    ggml.backend_graph_plan_free(backend, plan)


# (values written, the tensor's type): BoundIO takes the fast path or backend_tensor_set's, and
# either way the tensor holds backend_tensor_set's result (or its error)
BOUND_IO_CASES = [
    ("int64 list into I32", [3, 1, 2], T.I32),
    ("int64 tensor into I32", torch.tensor([3, 1, 2]), T.I32),
    ("float64 numpy into F32", np.array([0.5, 1.5, 2.5]), T.F32),
    ("bf16 tensor into F32", torch.tensor([0.5, 1.5, 2.5], dtype=torch.bfloat16), T.F32),
    ("f32 tensor into F16", torch.tensor([0.5, 1.5, 2.5]), T.F16),
    ("a value past int32 into I32", torch.tensor([3, 1, 2 ** 40]), T.I32),
    ("floats into I32", torch.tensor([0.5, 1.0, 2.0]), T.I32),
]


@pytest.mark.parametrize("values,ttype", [c[1:] for c in BOUND_IO_CASES], ids=[c[0] for c in BOUND_IO_CASES])
def test_bound_io_writes_what_backend_tensor_set_writes(values, ttype):
    from torchggml.backend.tensor_io import BoundIO
    ctx = ggml.init(no_alloc=True)
    a, b = ggml.new_tensor_1d(ctx, ttype, 3), ggml.new_tensor_1d(ctx, ttype, 3)
    _buf = ggml.backend_alloc_ctx_tensors(ctx, ggml.backend_cpu_init())
    io = BoundIO()
    try:
        ggml.backend_tensor_set(a, values)
    except (TypeError, ValueError) as e:
        with pytest.raises(type(e)):
            io.set(b, values)
        return
    io.set(b, values)
    assert torch.equal(torch.as_tensor(ggml.backend_tensor_get(a)), torch.as_tensor(ggml.backend_tensor_get(b)))
    out = np.empty_like(ggml.to_torch(a).numpy())
    io.get(b, out)
    assert np.array_equal(out, ggml.to_torch(a).numpy())


def _f32_tensor(n=4):
    ctx = ggml.init()
    return ggml.new_tensor_1d(ctx, T.F32, n)


SETS = [  # (id, tensor type, data, expected values or (error, pattern))
    ("float64-into-f32", T.F32, np.arange(4, dtype=np.float64), [0.0, 1.0, 2.0, 3.0]),
    ("float16-into-f32", T.F32, torch.arange(4, dtype=torch.float16), [0.0, 1.0, 2.0, 3.0]),
    ("int64-into-i32", T.I32, torch.tensor([1, -2, 3, 4]), [1, -2, 3, 4]),
    ("float-into-i32", T.I32, torch.tensor([1.5, 2.0, 3.0, 4.0]), (TypeError, r"is torch\.int32; torch\.float32 data")),
    ("int-into-f32", T.F32, torch.arange(4, dtype=torch.int32), (TypeError, r"torch\.int32 data would change")),
    ("too-large-for-i32", T.I32, torch.tensor([2**40, 0, 0, 0]), (ValueError, r"must fit in torch\.int32")),
    ("floats-into-q8_0", T.Q8_0, torch.zeros(32), (TypeError, r"holds Q8_0 blocks: give its raw bytes")),
]


@pytest.mark.parametrize("type_,data,want", [c[1:] for c in SETS], ids=[c[0] for c in SETS])
def test_tensor_set_converts_or_refuses_other_dtypes(type_, data, want):
    ctx = ggml.init()
    t = ggml.new_tensor_1d(ctx, type_, 32 if type_ == T.Q8_0 else 4)
    if isinstance(want, tuple):
        with pytest.raises(want[0], match=want[1]):
            ggml.backend_tensor_set(t, data)
    else:
        ggml.backend_tensor_set(t, data)
        assert ggml.backend_tensor_get(t).tolist() == want
