"""The meta device (tensor parallelism): split states, meta buffers, the all-reduce, op results
on Meta(SIM0..SIMn-1) against one device, the scheduler, and the golden models."""
import collections

import pytest
import torch

import torchggml as ggml
from torchggml.devices.meta.meta import meta_info, get_split_state
from torchggml.devices.meta.split import split_evenly
from torchggml.test_ops.meta import MetaCaseRunner, check_meta_case
from torchggml.test_ops.runner import all_cases

S = ggml.SplitAxis


@pytest.fixture(scope="module")
def sims():
    """Four SIM devices for this module (the session default is two)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TORCHGGML_SIM_DEVICES", "4")
        yield [ggml.backend_dev_by_name(f"SIM{j}") for j in range(4)]


@pytest.mark.parametrize("axis,name", [(S.AXIS_0, "0"), (S.AXIS_3, "3"), (S.MIRRORED, "MIRRORED"),
                                       (S.PARTIAL, "PARTIAL"), (S.NONE, "NONE"), (S.UNKNOWN, "UNKNOWN")])
def test_split_axis_name(axis, name):
    assert ggml.backend_meta_split_axis_name(axis) == name


def test_meta_device_props(sims):
    dev = ggml.backend_meta_device(sims[:2])
    assert dev is ggml.backend_meta_device(sims[:2])
    assert ggml.backend_dev_name(dev) == "Meta(SIM0,SIM1)"
    assert ggml.backend_dev_type(dev) == ggml.DeviceType.META
    free, total = ggml.backend_dev_memory(dev)
    assert total == sum(ggml.backend_dev_memory(d)[1] for d in sims[:2])
    buft = ggml.backend_dev_buffer_type(dev)
    assert buft.get_name() == "Meta(SIM0,SIM1)" and not buft.is_host()
    assert ggml.backend_dev_supports_buft(dev, buft)
    assert not ggml.backend_dev_supports_buft(dev, sims[0].get_buffer_type())
    with pytest.raises(ValueError, match="listed twice"):
        ggml.backend_meta_device([sims[0], sims[0]])


# ---------------------------------------------------------------- set / get

def _alloc(dev, ne, type=ggml.Type.F32, name="w"):
    ctx = ggml.init(no_alloc=True)
    t = ggml.new_tensor(ctx, type, ne)
    ggml.set_name(t, name)
    buf = ggml.backend_alloc_ctx_tensors_from_buft(ctx, dev.get_buffer_type())
    return ctx, t, buf


@pytest.mark.parametrize("n", [2, 3, 4])
@pytest.mark.parametrize("state,ne", [
    (ggml.MetaSplitState(S.AXIS_0), [64, 3, 2, 1]),
    (ggml.MetaSplitState(S.AXIS_1), [8, 12, 2, 1]),
    (ggml.MetaSplitState(S.AXIS_2), [8, 3, 12, 1]),
    (ggml.MetaSplitState(S.AXIS_3), [8, 3, 2, 12]),
    (ggml.MetaSplitState(S.AXIS_1, n_segments=3), [8, 24, 1, 1]),  # e.g. a fused QKV
    (ggml.MetaSplitState(S.MIRRORED), [8, 5, 1, 1]),
])
def test_set_get_round_trip(sims, n, state, ne):
    dev = ggml.backend_meta_device(sims[:n], lambda t: state)
    ctx, t, buf = _alloc(dev, ne)
    x = torch.randn(list(reversed(ne)))
    ggml.backend_tensor_set(t, x)
    assert torch.equal(ggml.backend_tensor_get(t).reshape(x.shape), x)
    info = meta_info(t)
    if state.is_split:  # each device holds exactly its slice (per segment)
        axis = int(state.axis)
        assert sum(s.ne[axis] for s in info.simples) == ne[axis]
        seg = ne[axis] // state.n_segments
        parts = x.movedim(3 - axis, 0).split(seg)
        for j, s in enumerate(info.simples):
            sizes = split_evenly(seg, n)
            mine = torch.cat([p[sum(sizes[:j]):sum(sizes[:j + 1])] for p in parts])
            got = ggml.backend_tensor_get(s).reshape(list(reversed(s.ne))).movedim(3 - axis, 0)
            assert torch.equal(got, mine)
    else:
        for s in info.simples:
            assert torch.equal(ggml.backend_tensor_get(s).reshape(x.shape), x)


def test_set_get_row_ranges_and_quantized_slices(sims):
    dev = ggml.backend_meta_device(sims[:3], lambda t: ggml.MetaSplitState(S.AXIS_0))
    ctx, t, buf = _alloc(dev, [96, 4], ggml.Type.Q8_0)
    data = ggml.quants.quantize(ggml.Type.Q8_0, torch.randn(4, 96))
    ggml.backend_tensor_set(t, data)
    assert [s.ne[0] for s in meta_info(t).simples] == [32, 32, 32]   # whole blocks per device
    row = ggml.type_traits(ggml.Type.Q8_0).type_size * 3
    got = ggml.backend_tensor_get(t, offset=row, size=2 * row)
    assert torch.equal(got, data.reshape(-1)[row:3 * row])
    with pytest.raises(ValueError, match="whole multiples"):
        ggml.backend_tensor_get(t, offset=5, size=row)


def test_partial_set_divides_by_the_device_count(sims):
    dev = ggml.backend_meta_device(sims[:4], lambda t: ggml.MetaSplitState(S.PARTIAL))
    ctx, t, buf = _alloc(dev, [6, 2])
    x = torch.randn(2, 6)
    ggml.backend_tensor_set(t, x)
    total = sum(ggml.backend_tensor_get(s).reshape(2, 6) for s in meta_info(t).simples)
    assert torch.allclose(total, x)


def test_bad_split_sizes_are_named(sims):
    dev = ggml.backend_meta_device(sims[:2], lambda t: ggml.MetaSplitState(S.AXIS_1, (3, 3)))
    with pytest.raises(ValueError, match="'w'.*adding up to ne\\[1\\]=8"):
        _alloc(dev, [4, 8])


# ---------------------------------------------------------------- all-reduce

@pytest.mark.parametrize("n", [2, 3, 4])
def test_butterfly_allreduce(sims, n):
    backends = [d.init_backend() for d in sims[:n]]
    comm = ggml.comm_init(backends)
    ctxs, ts, xs = [], [], []
    for j, b in enumerate(backends):
        ctx = ggml.init(no_alloc=True)
        t = ggml.new_tensor_2d(ctx, ggml.Type.F32, 7, 3)
        ggml.backend_alloc_ctx_tensors(ctx, b)
        xs.append(torch.randn(3, 7))
        ggml.backend_tensor_set(t, xs[-1])
        ctxs.append(ctx)
        ts.append(t)
    for _ in range(2):  # twice: the scratch buffers are reused safely
        assert ggml.comm_allreduce_tensor(comm, ts)
        xs = [sum(xs)] * n
    for b in backends:
        ggml.backend_synchronize(b)
    for t in ts:
        assert torch.allclose(ggml.backend_tensor_get(t), xs[0], atol=1e-5)
    assert comm.n_allreduce == 2 and comm.bytes_allreduce == 2 * 7 * 3 * 4
    ggml.comm_free(comm)


def test_reg_proc_addresses_give_the_collectives(sims):
    reg = ggml.backend_dev_backend_reg(sims[0])
    for name in ("comm_init", "comm_allreduce_tensor", "comm_free"):
        assert callable(ggml.backend_reg_get_proc_address(reg, name))


# ---------------------------------------------------------------- a small MLP, split and all-reduced

@pytest.mark.parametrize("n", [2, 3, 4])
def test_column_then_row_split_product_is_all_reduced(sims, n):
    names = {"w_col": ggml.MetaSplitState(S.AXIS_1), "w_row": ggml.MetaSplitState(S.AXIS_0)}
    dev = ggml.backend_meta_device(sims[:n], lambda t: names.get(t.name))
    backend = dev.init_backend()
    wctx = ggml.init(no_alloc=True)
    x = ggml.set_name(ggml.new_tensor_2d(wctx, ggml.Type.F32, 64, 3), "x")
    w1 = ggml.set_name(ggml.new_tensor_2d(wctx, ggml.Type.F32, 64, 96), "w_col")
    w2 = ggml.set_name(ggml.new_tensor_2d(wctx, ggml.Type.F32, 96, 64), "w_row")
    ggml.backend_alloc_ctx_tensors_from_buft(wctx, dev.get_buffer_type())
    X, W1, W2 = torch.randn(3, 64), torch.randn(96, 64) / 8, torch.randn(64, 96) / 8
    for t, v in ((x, X), (w1, W1), (w2, W2)):
        ggml.backend_tensor_set(t, v)
    ctx = ggml.init(no_alloc=True)
    h = ggml.silu(ctx, ggml.mul_mat(ctx, w1, x))
    y = ggml.add(ctx, ggml.mul_mat(ctx, w2, h), x)
    graph = ggml.new_graph(ctx)
    ggml.build_forward_expand(graph, y)
    galloc = ggml.gallocr_new(dev.get_buffer_type())
    assert ggml.gallocr_alloc_graph(galloc, graph)
    states = [get_split_state(node, assume_sync=False).axis for node in graph.nodes]
    assert states == [S.AXIS_0, S.AXIS_0, S.PARTIAL, S.MIRRORED]
    ggml.backend_graph_compute(backend, graph)
    ref = torch.nn.functional.silu(X @ W1.T) @ W2.T + X
    assert torch.allclose(ggml.backend_tensor_get(y), ref, atol=1e-4)
    assert backend.comm.n_allreduce == 1
    backend.free()


def test_unsupported_combination_names_op_and_states(sims):
    dev = ggml.backend_meta_device(sims[:2], lambda t: ggml.MetaSplitState(S.AXIS_1))
    wctx = ggml.init(no_alloc=True)
    a = ggml.new_tensor_2d(wctx, ggml.Type.F32, 8, 4)
    b = ggml.new_tensor_2d(wctx, ggml.Type.F32, 8, 6)
    ggml.backend_alloc_ctx_tensors_from_buft(wctx, dev.get_buffer_type())
    ctx = ggml.init(no_alloc=True)
    out = ggml.mul_mat(ctx, a, b)
    graph = ggml.new_graph(ctx)
    ggml.build_forward_expand(graph, out)
    with pytest.raises(ggml.UnsupportedSplitError, match=r"op MUL_MAT .*axis 1 \[2, 2\].*axis 1 \[3, 3\]"):
        ggml.gallocr_alloc_graph(ggml.gallocr_new(dev.get_buffer_type()), graph)


# ---------------------------------------------------------------- every op against one device

def _cases_per_op(k: int) -> list:
    by_op = collections.defaultdict(list)
    for c in all_cases():
        by_op[c.op].append(c)
    chosen = []
    for cs in by_op.values():
        step = max(1, len(cs) // k)
        chosen += cs[::step][:k]
    return chosen


OP_RUNS = [(2, c) for c in _cases_per_op(4)] + [(n, c) for n in (3, 4) for c in _cases_per_op(2)]


@pytest.fixture(scope="module")
def runners(sims):
    made = {n: MetaCaseRunner(sims[:n]) for n in (2, 3, 4)}
    yield made, sims[0].init_backend()
    for r in made.values():
        r.free()


@pytest.mark.parametrize("n,case", OP_RUNS, ids=[f"{n}dev-{c.name}" for n, c in OP_RUNS])
def test_op_on_meta_equals_one_device(runners, n, case):
    made, reference = runners
    if not all(reference.supports_op(node) for node in _nodes(case)):
        pytest.skip(f"{case.name} is not supported on SIM0")
    ok, err, policy = check_meta_case(case, made[n], reference)
    assert ok, f"{case.name} on {made[n].device.get_name()} split {policy}: nmse {err:.3g} > {case.max_nmse:g}"


def _nodes(case):
    ctx = ggml.init(no_alloc=True)
    out, _ = case.build(ctx)
    graph = ggml.new_graph_custom(ctx, 4096)
    ggml.build_forward_expand(graph, out)
    return graph.nodes


# the ops of the llama/qwen graphs must really run split (not just MIRRORED)
LLAMA_OPS = ["mul_mat", "rms_norm", "mul", "add", "rope", "get_rows", "set_rows", "soft_max", "cont",
             "cpy", "flash_attn_ext", "swiglu", "scale", "silu"]


@pytest.mark.parametrize("op", LLAMA_OPS)
def test_llama_ops_run_split(runners, op):
    made, _ = runners
    cases = [c for c in all_cases() if c.op == op][:6]
    policies = [made[2].run(c)[0] for c in cases]
    assert any(p is not None for p in policies), f"no {op} case could be split: {policies}"


@pytest.mark.parametrize("wtype", [ggml.Type.F16, ggml.Type.BF16], ids=lambda t: t.name)
@pytest.mark.parametrize("n", [1, 2])
def test_half_weight_products_keep_float32_results(sims, wtype, n):
    """F16/BF16 weights multiply with float32 results on SIM devices (as in ggml), so the
    partial sums of a weight split along K add up to one device's product: a half-rounded
    product (relative error ~3e-4 for F16) fails the 1e-6 bound."""
    split = lambda t: ggml.MetaSplitState(S.AXIS_0) if t.name in ("w", "x") else None  # noqa: E731
    dev = sims[0] if n == 1 else ggml.backend_meta_device(sims[:n], split)
    backend = dev.init_backend()
    wctx = ggml.init(no_alloc=True)
    x = ggml.set_name(ggml.new_tensor_2d(wctx, ggml.Type.F32, 256, 5), "x")
    w = ggml.set_name(ggml.new_tensor_2d(wctx, wtype, 256, 48), "w")
    ggml.backend_alloc_ctx_tensors_from_buft(wctx, dev.get_buffer_type())
    gen = torch.Generator().manual_seed(7)
    X, W = torch.randn(5, 256, generator=gen), torch.randn(48, 256, generator=gen) / 16
    W = W.to(torch.float16 if wtype == ggml.Type.F16 else torch.bfloat16)
    ggml.backend_tensor_set(x, X)
    ggml.backend_tensor_set(w, W)
    ctx = ggml.init(no_alloc=True)
    y = ggml.mul_mat(ctx, w, x)
    graph = ggml.new_graph(ctx)
    ggml.build_forward_expand(graph, y)
    assert ggml.gallocr_alloc_graph(ggml.gallocr_new(dev.get_buffer_type()), graph)
    ggml.backend_graph_compute(backend, graph)
    ref = X.double() @ W.double().T
    ours = ggml.backend_tensor_get(y).double()
    assert ((ours - ref).norm() / ref.norm()).item() <= 1e-6
    backend.free()


# ---------------------------------------------------------------- golden models on Meta(SIM0,SIM1)

from test_models import (MANIFEST, check_logits, eval_steps, needs_golden,  # noqa: E402
                         rel_err, GOLDEN)
from pathlib import Path  # noqa: E402

# meta vs one device (relative L2): float weights 1e-4, as only the summation order of the split
# products differs (F16 products keep float32 results on accelerator devices, as in ggml)
META_MAX_ERR = {"F32": 1e-4, "F16": 1e-4}


def meta_golden_cases():
    cases = []
    for entry in MANIFEST:
        w = entry["weights"]
        marks = [] if w in ("F32", "F16") else [pytest.mark.slow]  # Triton in the interpreter
        for fa in (False, True):
            if fa and w not in ("F32",):
                continue
            cases.append(pytest.param(entry, fa, marks=marks, id=f"{Path(entry['model']).stem}{'-fa' if fa else ''}"))
    return cases


@needs_golden
@pytest.mark.parametrize("entry,flash_attn", meta_golden_cases())
def test_golden_logits_on_meta_sim0_sim1(entry, flash_attn):
    path = GOLDEN / entry["model"]
    single = ggml.load_model(path, devices=["SIM0"], flash_attn=flash_attn, progress=False)
    meta = ggml.load_model(path, tensor_parallel=["SIM0", "SIM1"], flash_attn=flash_attn, progress=False)
    try:
        assert meta.placement.single and meta.placement.layers[0].get_name() == "Meta(SIM0,SIM1)"
        tokens = entry["tokens"]
        max_err = META_MAX_ERR.get(entry["weights"], 1e-3)
        for run in (lambda m: m.eval(tokens), lambda m: eval_steps(m, tokens)):  # one batch; prompt + decode
            ours, ref = run(meta), run(single)
            err = rel_err(ours.numpy(), ref.numpy())
            assert err <= max_err, f"{entry['model']}: meta vs SIM0 relative L2 {err:.2e} > {max_err:.0e}"
            check_logits(ours, entry)
            meta.reset()
            single.reset()
        assert meta.backends[0].comm.n_allreduce > 0  # the scheduler's first backend: the meta device
    finally:
        meta.close()
        single.close()


# (tiny architecture, K/V heads): a meta device of one device holds every tensor whole; a split
# of one K/V head over it reached RMS_NORM's rows through Gemma 3's per-head norm (its 270M
# model has one K/V head)
ONE_DEVICE_CASES = [("gemma3", 1), ("gemma3", 2), ("llama-yarn", 1)]


@pytest.mark.parametrize("case,n_head_kv", ONE_DEVICE_CASES, ids=[f"{c}-kv{k}" for c, k in ONE_DEVICE_CASES])
def test_meta_of_one_device_equals_the_device(tmp_path, case, n_head_kv):
    from dataclasses import replace
    from torchggml.gguf.writer.tiny import CASES_BY_NAME, write_tiny_model
    path = write_tiny_model(tmp_path / f"{case}.gguf", replace(CASES_BY_NAME[case], n_head_kv=n_head_kv))
    tokens = [1, 7, 3, 12, 5]
    single = ggml.load_model(path, devices=["CPU"], progress=False)
    meta = ggml.load_model(path, tensor_parallel=["CPU"], progress=False)
    try:
        assert meta.placement.layers[0].get_name() == "Meta(CPU)"
        for run in (lambda m: m.eval(tokens), lambda m: eval_steps(m, tokens)):  # one batch; prompt + decode
            ours, ref = run(meta), run(single)
            assert rel_err(ours.numpy(), ref.numpy()) <= 1e-6
            meta.reset()
            single.reset()
    finally:
        meta.close()
        single.close()


# ---------------------------------------------------------------- the scheduler: Meta(SIM0,SIM1) + CPU

def test_scheduler_runs_a_meta_backend_beside_the_cpu(sims):
    names = {"w_col": ggml.MetaSplitState(S.AXIS_1), "w_row": ggml.MetaSplitState(S.AXIS_0)}
    dev = ggml.backend_meta_device(sims[:2], lambda t: names.get(t.name))
    meta, cpu = dev.init_backend(), ggml.backend_cpu_init()
    wctx = ggml.init(no_alloc=True)
    w1 = ggml.set_name(ggml.new_tensor_2d(wctx, ggml.Type.F32, 32, 48), "w_col")
    w2 = ggml.set_name(ggml.new_tensor_2d(wctx, ggml.Type.F32, 48, 32), "w_row")
    wbuf = ggml.backend_alloc_ctx_tensors_from_buft(wctx, dev.get_buffer_type())
    ggml.backend_buffer_set_usage(wbuf, ggml.BufferUsage.WEIGHTS)
    W1, W2, X = torch.randn(48, 32), torch.randn(32, 48), torch.randn(4, 32)
    ggml.backend_tensor_set(w1, W1)
    ggml.backend_tensor_set(w2, W2)
    ctx = ggml.init(no_alloc=True)
    x = ggml.new_tensor_2d(ctx, ggml.Type.F32, 32, 4)
    ggml.set_input(x)
    y = ggml.mul_mat(ctx, w2, ggml.relu(ctx, ggml.mul_mat(ctx, w1, x)))
    out = ggml.sum_rows(ctx, ggml.sqr(ctx, y))  # after the meta part, on whichever backend takes it
    ggml.set_output(out)
    graph = ggml.new_graph(ctx)
    ggml.build_forward_expand(graph, out)
    sched = ggml.backend_sched_new([meta, cpu], None, 256, False, True)
    assert ggml.backend_sched_alloc_graph(sched, graph)
    assert ggml.backend_sched_get_tensor_backend(sched, graph.nodes[0]) is meta
    ggml.backend_tensor_set(x, X)
    ggml.backend_sched_graph_compute(sched, graph)
    ref = ((torch.relu(X @ W1.T) @ W2.T) ** 2).sum(-1, keepdim=True)
    assert torch.allclose(ggml.backend_tensor_get(out).reshape(ref.shape), ref, rtol=1e-4, atol=1e-3)
    assert ggml.backend_sched_get_n_splits(sched) >= 1
    ggml.backend_sched_free(sched)
    meta.free()
