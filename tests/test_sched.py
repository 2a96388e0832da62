"""The scheduler on CPU + SIM devices: assignment, splits, copies, compute order, pipelining.
The first accelerator is TORCHGGML_TEST_DEVICE (SIM0; CUDA0 when scripts/gpu_check.py runs these
on a GPU), the second SIM1."""
from __future__ import annotations

import random

import pytest
import torch

import torchggml as ggml
from torchggml import config

T = ggml.Type
ACCEL = config.value("TORCHGGML_TEST_DEVICE")


def _sim_available(n=2):
    try:
        return all(ggml.backend_dev_by_name(f"SIM{i}") is not None for i in range(n))
    except Exception:
        return False


pytestmark = pytest.mark.skipif(not _sim_available(), reason="SIM devices not available (TORCHGGML_SIM_DEVICES unset)")


@pytest.fixture(scope="module")
def backends():
    sim0 = ggml.backend_init_by_name(ACCEL)
    sim1 = ggml.backend_init_by_name("SIM1")
    cpu = ggml.backend_cpu_init()
    return sim0, sim1, cpu


def make_weights(backend, shapes, seed=0):
    """Weight tensors of the given [ne0, ne1] shapes in a WEIGHTS buffer of backend's device."""
    ctx = ggml.init(no_alloc=True)
    ws = [ggml.new_tensor_2d(ctx, T.F32, *ne) for ne in shapes]
    for i, w in enumerate(ws):
        ggml.set_name(w, f"w{i}")
    buf = ggml.backend_alloc_ctx_tensors(ctx, backend)
    ggml.backend_buffer_set_usage(buf, ggml.BufferUsage.WEIGHTS)
    g = torch.Generator().manual_seed(seed)
    for w in ws:
        ggml.backend_tensor_set(w, torch.rand(w.ne[1], w.ne[0], generator=g) * 2 - 1)
    return ctx, buf, ws


def mlp_graph(ws, n_tokens=4):
    """x -> (mul_mat w_i, add, silu)* -> out; x is a user INPUT."""
    ctx = ggml.init(no_alloc=True)
    x = ggml.new_tensor_2d(ctx, T.F32, ws[0].ne[0], n_tokens)
    ggml.set_name(x, "x")
    ggml.set_input(x)
    h = x
    for i, w in enumerate(ws):
        h = ggml.mul_mat(ctx, w, h)
        ggml.set_name(h, f"mm{i}")
        h = ggml.silu(ctx, ggml.add(ctx, h, h))
    ggml.set_output(h)
    graph = ggml.new_graph(ctx)
    ggml.build_forward_expand(graph, h)
    return ctx, graph, x, h


def run_sched(sched, graph, x, out, x_values):
    assert ggml.backend_sched_alloc_graph(sched, graph)
    ggml.backend_tensor_set(x, x_values)
    assert ggml.backend_sched_graph_compute(sched, graph) == ggml.Status.SUCCESS
    return ggml.backend_tensor_get(out).clone()


def reference(ws, x_values):
    h = x_values
    for w in ws:
        wv = ggml.backend_tensor_get(w)
        h = torch.nn.functional.silu(2 * (h @ wv.T))
    return h


def test_one_backend_gives_one_split_and_no_copies(backends):
    _, _, cpu = backends
    _, _, ws = make_weights(cpu, [(16, 16), (16, 16)])
    sched = ggml.backend_sched_new([cpu])
    _, graph, x, out = mlp_graph(ws)
    xv = torch.rand(4, 16)
    got = run_sched(sched, graph, x, out, xv)
    assert ggml.backend_sched_get_n_splits(sched) == 1
    assert all(not s.inputs for s in sched.splits)
    torch.testing.assert_close(got, reference(ws, xv))


def test_weights_on_sim_input_on_cpu_splits_and_copy_names(backends):
    sim0, _, cpu = backends
    _, _, ws = make_weights(sim0, [(16, 16), (16, 16)])
    sched = ggml.backend_sched_new([sim0, cpu])
    _, graph, x, out = mlp_graph(ws)
    xv = torch.rand(4, 16)
    got = run_sched(sched, graph, x, out, xv)
    # the user input sits on the CPU (last backend); everything else runs on SIM0
    assert ggml.backend_sched_get_tensor_backend(sched, x) is cpu
    assert ggml.backend_sched_get_n_splits(sched) == 1
    split = sched.splits[0]
    assert split.backend_id == 0 and split.inputs == [x]
    mm0 = ggml.graph_get_tensor(graph, "mm0")
    assert mm0.src[1] is x  # the caller's graph keeps its own sources
    with sched.copies_applied():  # the split reads the copy
        assert mm0.src[1].name == f"{ACCEL}#x#0"
    torch.testing.assert_close(got, reference(ws, xv))


def test_user_assignment_survives_until_reset(backends):
    sim0, _, cpu = backends
    _, _, ws = make_weights(sim0, [(16, 16), (16, 16)])
    sched = ggml.backend_sched_new([sim0, cpu])
    _, graph, x, out = mlp_graph(ws)
    last = ggml.graph_node(graph, -1)
    ggml.backend_sched_set_tensor_backend(sched, last, cpu)
    xv = torch.rand(4, 16)
    got = run_sched(sched, graph, x, out, xv)
    assert ggml.backend_sched_get_tensor_backend(sched, last) is cpu
    # SIM0 for the body, CPU for the last node: splits = 1 + backend changes
    assert ggml.backend_sched_get_n_splits(sched) == 2
    assert [s.backend_id for s in sched.splits] == [0, 1]
    torch.testing.assert_close(got, reference(ws, xv))
    ggml.backend_sched_reset(sched)
    assert ggml.backend_sched_get_tensor_backend(sched, last) is None


def test_unsupported_op_stays_off_the_device(backends, monkeypatch):
    sim0, _, cpu = backends
    _, _, ws = make_weights(sim0, [(16, 16)])
    dev = ggml.backend_get_device(sim0)
    original = type(dev).supports_op
    monkeypatch.setattr(type(dev), "supports_op",
                        lambda self, op: op.op != ggml.Op.UNARY and original(self, op))
    sched = ggml.backend_sched_new([sim0, cpu])
    _, graph, x, out = mlp_graph(ws)
    xv = torch.rand(4, 16)
    got = run_sched(sched, graph, x, out, xv)
    for node in graph.nodes:
        if node.op == ggml.Op.UNARY:
            assert ggml.backend_sched_get_tensor_backend(sched, node) is cpu
    assert ggml.backend_sched_get_n_splits(sched) == 2
    torch.testing.assert_close(got, reference(ws, xv))


@pytest.mark.parametrize("op_offload", [True, False])
def test_op_offload_moves_large_batches_off_host_weights(backends, op_offload, monkeypatch):
    sim0, _, cpu = backends
    dev = ggml.backend_get_device(sim0)
    monkeypatch.setattr(type(dev), "offload_op", lambda self, op: op.op == ggml.Op.MUL_MAT and op.src[1].ne[1] >= 32)
    _, _, ws = make_weights(cpu, [(16, 16)])
    sched = ggml.backend_sched_new([sim0, cpu], op_offload=op_offload)
    _, graph, x, out = mlp_graph(ws, n_tokens=64)
    xv = torch.rand(64, 16)
    got = run_sched(sched, graph, x, out, xv)
    mm = ggml.graph_get_tensor(graph, "mm0")
    assert ggml.backend_sched_get_tensor_backend(sched, mm) is (sim0 if op_offload else cpu)
    if op_offload:
        assert sched.causes[mm] == "1.off"
    torch.testing.assert_close(got, reference(ws, xv))


def test_parallel_gives_four_copies_and_rotates(backends):
    sim0, sim1, cpu = backends
    _, _, ws0 = make_weights(sim0, [(16, 16)], seed=1)
    _, _, ws1 = make_weights(sim1, [(16, 16)], seed=2)
    sched = ggml.backend_sched_new([sim0, sim1, cpu], parallel=True)
    assert ggml.backend_sched_get_n_copies(sched) == 4
    seen = []
    for step in range(5):
        _, graph, x, out = mlp_graph(ws0 + ws1)
        xv = torch.rand(4, 16)
        assert ggml.backend_sched_alloc_graph(sched, graph)
        seen.append(sched.cur_copy)
        mm1 = ggml.graph_get_tensor(graph, "mm1")
        with sched.copies_applied():
            assert mm1.src[1].name.startswith("SIM1#") and mm1.src[1].name.endswith(f"#{sched.cur_copy}")
        ggml.backend_tensor_set(x, xv)
        assert ggml.backend_sched_graph_compute_async(sched, graph) == ggml.Status.SUCCESS
        ggml.backend_sched_synchronize(sched)  # read back needs the result
        torch.testing.assert_close(ggml.backend_tensor_get(out), reference(ws0 + ws1, xv))
        ggml.backend_sched_reset(sched)
    assert seen == [0, 1, 2, 3, 0]  # synchronize while allocated keeps the rotation
    # synchronize with no graph allocated restarts at slot 0 (upstream), then graphs rotate
    ggml.backend_sched_synchronize(sched)
    slots = []
    for step in range(5):
        _, graph, x, out = mlp_graph(ws0 + ws1)
        assert ggml.backend_sched_alloc_graph(sched, graph)
        slots.append(sched.cur_copy)
        ggml.backend_tensor_set(x, torch.rand(4, 16))
        ggml.backend_sched_graph_compute_async(sched, graph)
        ggml.backend_sched_reset(sched)
    ggml.backend_sched_synchronize(sched)
    assert slots == [0, 1, 2, 3, 0]


def test_eval_callback_observes_node_ranges(backends):
    sim0, _, cpu = backends
    _, _, ws = make_weights(sim0, [(16, 16), (16, 16), (16, 16)])
    sched = ggml.backend_sched_new([sim0, cpu])
    observed = []

    def callback(t, ask):
        if ask:
            return t.op == ggml.Op.MUL_MAT
        observed.append((t.name, ggml.backend_tensor_get(t).clone()))
        return True

    ggml.backend_sched_set_eval_callback(sched, callback)
    _, graph, x, out = mlp_graph(ws)
    xv = torch.rand(4, 16)
    got = run_sched(sched, graph, x, out, xv)
    assert [name for name, _ in observed] == ["mm0", "mm1", "mm2"]
    w0 = ggml.backend_tensor_get(ws[0])
    torch.testing.assert_close(observed[0][1], xv @ w0.T)
    torch.testing.assert_close(got, reference(ws, xv))


def test_reserve_then_smaller_graph_does_not_reallocate(backends):
    sim0, _, cpu = backends
    _, _, ws = make_weights(sim0, [(32, 32)] * 3)
    sched = ggml.backend_sched_new([sim0, cpu])
    _, big, _, _ = mlp_graph(ws, n_tokens=16)
    assert ggml.backend_sched_reserve(sched, big)
    size = ggml.backend_sched_get_buffer_size(sched, sim0)
    assert size > 0
    _, graph, x, out = mlp_graph(ws, n_tokens=4)
    run_sched(sched, graph, x, out, torch.rand(4, 32))
    assert ggml.backend_sched_get_buffer_size(sched, sim0) == size


# ---------------------------------------------------------------- stress: random graphs

def random_graph(rng: random.Random, weights_by_backend, n_tokens):
    """A random chain/DAG of element-wise ops and products over weights on several backends."""
    ctx = ggml.init(no_alloc=True)
    dim = 16
    x = ggml.new_tensor_2d(ctx, T.F32, dim, n_tokens)
    ggml.set_name(x, "x")
    ggml.set_input(x)
    live = [x]
    for i in range(rng.randint(6, 14)):
        a = rng.choice(live)
        kind = rng.choice(["mm", "mm", "mm", "add", "mul", "silu", "scale", "norm"])
        if kind == "mm":
            ws = rng.choice(weights_by_backend)
            h = ggml.mul_mat(ctx, rng.choice(ws), a)
        elif kind in ("add", "mul"):
            h = getattr(ggml, kind)(ctx, a, rng.choice(live))
        elif kind == "silu":
            h = ggml.silu(ctx, a)
        elif kind == "scale":
            h = ggml.scale(ctx, a, 0.5)
        else:
            h = ggml.rms_norm(ctx, a, 1e-5)
        ggml.set_name(h, f"n{i}")
        live.append(h)
    out = live[-1]
    for t in live[1:-1]:
        if rng.random() < 0.3:
            out = ggml.add(ctx, out, t)
    ggml.set_output(out)
    graph = ggml.new_graph(ctx)
    ggml.build_forward_expand(graph, out)
    return ctx, graph, x, out


def random_graph_pair(rng: random.Random, weights, cpu_weights, n_tokens):
    """The same random graph twice: over `weights` (several backends) and over `cpu_weights`
    (the same values on the CPU): (graph, x, out, ref_graph, ref_x, ref_out)."""
    state = rng.getstate()
    _, graph, x, out = random_graph(rng, weights, n_tokens)
    rng.setstate(state)
    _, ref_graph, ref_x, ref_out = random_graph(rng, cpu_weights, n_tokens)
    return graph, x, out, ref_graph, ref_x, ref_out


@pytest.mark.parametrize("parallel", [False, True])
def test_stress_random_graphs_match_single_device(backends, parallel):
    sim0, sim1, cpu = backends
    weights = [make_weights(b, [(16, 16)] * 3, seed=k)[2] for k, b in enumerate((sim0, sim1, cpu))]
    cpu_weights = [make_weights(cpu, [(16, 16)] * 3, seed=k)[2] for k in range(3)]  # same values
    sched = ggml.backend_sched_new([sim0, sim1, cpu], parallel=parallel)
    ref_sched = ggml.backend_sched_new([cpu])
    rng = random.Random(1234 + parallel)
    pending = []
    n_multi_split = n_copied = 0
    for it in range(150):
        n_tokens = rng.choice([1, 3, 8])
        # same graph twice: once across the devices (async, back to back), once on the CPU only
        graph, x, out, ref_graph, ref_x, ref_out = random_graph_pair(rng, weights, cpu_weights, n_tokens)
        xv = torch.rand(n_tokens, 16) * 2 - 1
        assert ggml.backend_sched_alloc_graph(sched, graph)
        ggml.backend_tensor_set(x, xv)
        assert ggml.backend_sched_graph_compute_async(sched, graph) == ggml.Status.SUCCESS
        n_multi_split += ggml.backend_sched_get_n_splits(sched) > 1
        n_copied += sum(1 for s in sched.splits for t in s.inputs if not t.flags & ggml.TensorFlag.INPUT)
        host = torch.empty(tuple(reversed(out.ne))[-2:])
        ggml.backend_tensor_get_async(sched.get_tensor_backend(out), out, host)
        expected = run_sched(ref_sched, ref_graph, ref_x, ref_out, xv)
        ggml.backend_sched_reset(ref_sched)
        pending.append((host, expected, out))
        if len(pending) == 4 or it == 149:
            ggml.backend_sched_synchronize(sched)
            for host, expected, o in pending:
                torch.testing.assert_close(host, expected.reshape(host.shape), rtol=1e-5, atol=1e-5)
            pending = []
        ggml.backend_sched_reset(sched)
    # the graphs really crossed devices: many multi-split graphs and device-to-device copies
    assert n_multi_split >= 50 and n_copied >= 50, (n_multi_split, n_copied)


def test_dump_dot_colours_backends_and_boxes_splits(backends, tmp_path):
    sim0, _, cpu = backends
    _, _, ws = make_weights(sim0, [(16, 16), (16, 16)])
    sched = ggml.backend_sched_new([sim0, cpu])
    _, graph, x, out = mlp_graph(ws)
    ggml.backend_sched_set_tensor_backend(sched, ggml.graph_node(graph, -1), cpu)
    assert ggml.backend_sched_alloc_graph(sched, graph)
    path = ggml.backend_sched_graph_dump_dot(sched, graph, tmp_path / "sched.dot")
    text = path.read_text()
    assert text.startswith("digraph")
    assert text.count("subgraph cluster_") == ggml.backend_sched_get_n_splits(sched) == 2
    assert f'label="split 0: {ACCEL} (1 inputs)"' in text and "split 1: CPU" in text
    assert f"{ACCEL}#x#0" in text  # the copied input, drawn dashed
    assert "style=dashed" in text


def test_sched_debug_prints_the_assignment_table(backends, monkeypatch, capsys):
    sim0, _, cpu = backends
    monkeypatch.setenv("TORCHGGML_SCHED_DEBUG", "2")
    _, _, ws = make_weights(sim0, [(16, 16)])
    sched = ggml.backend_sched_new([sim0, cpu])
    _, graph, x, out = mlp_graph(ws)
    assert ggml.backend_sched_alloc_graph(sched, graph)
    err = capsys.readouterr().err
    assert f"## SPLIT #0: {ACCEL} # 1 inputs: [x (" in err
    import re
    assert re.search(rf"node #  0 \( +MUL_MAT\): +mm0 .*\[ *{ACCEL} +1\.wgt0\]", err)
    assert re.search(rf"{ACCEL}#x#0 \( +0K\) \[ *{ACCEL} +4\.cpy\]", err)  # mm0 reads the copy of x
    assert re.search(rf"UNARY.*\[ *{ACCEL} +2\.sup\]", err)  # spread by the expansion sweeps


def _reserve_then_alloc(sched, graph):
    assert ggml.backend_sched_reserve(sched, graph)


def _split_then_alloc(sched, graph):
    ggml.backend_sched_split_graph(sched, graph)
    ggml.backend_sched_reset(sched)


def _compute_then_reset(sched, graph):
    assert ggml.backend_sched_alloc_graph(sched, graph)
    assert ggml.backend_sched_graph_compute(sched, graph) == ggml.Status.SUCCESS
    ggml.backend_sched_reset(sched)


@pytest.mark.parametrize("before", [_reserve_then_alloc, _split_then_alloc, _compute_then_reset],
                         ids=["reserve", "split_graph", "compute+reset"])
@pytest.mark.parametrize("parallel", [False, True])
def test_reused_graph_computes_correctly_and_keeps_its_sources(backends, before, parallel):
    sim0, sim1, cpu = backends
    ws = [w for k, b in enumerate(backends) for w in make_weights(b, [(16, 16)], seed=k)[2]]
    sched = ggml.backend_sched_new([sim0, sim1, cpu], parallel=parallel)
    _, graph, x, out = mlp_graph(ws)
    sources = [list(n.src) for n in graph.nodes]
    before(sched, graph)
    for step in range(6):
        xv = torch.rand(4, 16) * 2 - 1
        got = run_sched(sched, graph, x, out, xv)
        assert ggml.backend_sched_get_n_splits(sched) == 3
        torch.testing.assert_close(got, reference(ws, xv), rtol=1e-5, atol=1e-5)
        assert [list(n.src) for n in graph.nodes] == sources  # the caller's graph is intact
        if step % 2:
            # computing the allocated graph again, without a new alloc, reads the copies again
            # (inputs are set before every compute: the allocator may reuse their memory)
            ggml.backend_tensor_set(x, xv)
            assert ggml.backend_sched_graph_compute(sched, graph) == ggml.Status.SUCCESS
            torch.testing.assert_close(ggml.backend_tensor_get(out), got)
        ggml.backend_sched_reset(sched)


def test_double_alloc_says_how_to_allocate_again(backends):
    sim0, _, cpu = backends
    _, _, ws = make_weights(sim0, [(16, 16)])
    sched = ggml.backend_sched_new([sim0, cpu])
    _, graph, _, _ = mlp_graph(ws)
    assert ggml.backend_sched_alloc_graph(sched, graph)
    with pytest.raises(RuntimeError, match=r"already allocated: compute it, or call backend_sched_reset "
                                           r"before allocating a graph \(the same one included\) again"):
        ggml.backend_sched_alloc_graph(sched, graph)


ACTIONS = ["alloc+compute", "async+sync", "recompute", "reset", "reserve", "split_graph"]


@pytest.mark.parametrize("parallel", [False, True])
def test_stress_same_graph_split_reset_reserved_and_recomputed(backends, parallel):
    """Random graphs over CPU+SIM0+SIM1, each driven through a random sequence of scheduler
    calls on the same graph object; every result equals the CPU-only run."""
    sim0, sim1, cpu = backends
    weights = [make_weights(b, [(16, 16)] * 3, seed=k)[2] for k, b in enumerate(backends)]
    cpu_weights = [make_weights(cpu, [(16, 16)] * 3, seed=k)[2] for k in range(3)]
    sched = ggml.backend_sched_new([sim0, sim1, cpu], parallel=parallel)
    ref_sched = ggml.backend_sched_new([cpu])
    rng = random.Random(77 + parallel)
    checked = multi_split = 0
    for _ in range(8):
        n_tokens = rng.choice([1, 3, 8])
        graph, x, out, ref_graph, ref_x, ref_out = random_graph_pair(rng, weights, cpu_weights, n_tokens)
        sources = [list(n.src) for n in graph.nodes]
        allocated = False
        for _ in range(10):
            action = rng.choice(ACTIONS)
            if action in ("reset", "reserve", "split_graph"):
                ggml.backend_sched_reset(sched)
                allocated = False
                if action == "reserve":
                    assert ggml.backend_sched_reserve(sched, graph)
                elif action == "split_graph":
                    ggml.backend_sched_split_graph(sched, graph)
                    ggml.backend_sched_reset(sched)
                assert [list(n.src) for n in graph.nodes] == sources
                continue
            if action != "recompute" or not allocated:  # recompute: the allocated graph again
                ggml.backend_sched_reset(sched)
                assert ggml.backend_sched_alloc_graph(sched, graph)
                allocated = True
            xv = torch.rand(n_tokens, 16) * 2 - 1
            ggml.backend_tensor_set(x, xv)
            if action == "async+sync":
                assert ggml.backend_sched_graph_compute_async(sched, graph) == ggml.Status.SUCCESS
                ggml.backend_sched_synchronize(sched)
            else:
                assert ggml.backend_sched_graph_compute(sched, graph) == ggml.Status.SUCCESS
            expected = run_sched(ref_sched, ref_graph, ref_x, ref_out, xv)
            ggml.backend_sched_reset(ref_sched)
            torch.testing.assert_close(ggml.backend_tensor_get(out).reshape(expected.shape), expected,
                                       rtol=1e-5, atol=1e-5)
            assert [list(n.src) for n in graph.nodes] == sources
            checked += 1
            multi_split += ggml.backend_sched_get_n_splits(sched) > 1
        ggml.backend_sched_reset(sched)
    assert checked >= 30 and multi_split >= 10, (checked, multi_split)
