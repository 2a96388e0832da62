"""Native runs (devices/cpu/native_plan.py): a CPU graph plan's consecutive bound numba
kernels run in one native call compute exactly what the calls one by one compute, cover a
decode step's kernels, and report a bad row index as the call would."""
from __future__ import annotations

import numpy as np
import pytest
import torch

import torchggml as ggml
from torchggml.models import load_model

pytest.importorskip("numba")

from test_models import GOLDEN, MANIFEST, eval_steps, needs_golden  # noqa: E402

T = ggml.Type

# (golden model, load options): weights on ggml's blocks (block matvec; Q4_1's and Q5_0's its
# offset kinds), converted weights (their matvec: Q2_K's groups of 16), F16 weights (the half
# matvec), F32 weights (torch's products between runs), biases, an F32 KV cache, flash attention
CASES = [
    ("llama-Q4_0", {}),
    ("llama-Q4_1", {}),
    ("llama-Q5_0", {}),
    ("llama-Q2_K", {}),
    ("llama-Q8_0", {}),
    ("llama-Q4_K_M", {}),
    ("llama-Q6_K", {}),
    ("llama-F16", {}),
    ("llama-F32", {"kv_type": "f32"}),
    ("qwen2-F32", {}),
    ("qwen3-F16-tied", {}),
    ("llama-Q4_0", {"flash_attn": True}),
]


def _entry(name):
    return next(e for e in MANIFEST if e["model"] == f"models/{name}.gguf")


@needs_golden
@pytest.mark.parametrize("name,options", CASES, ids=[f"{n}-{'-'.join(o) or 'default'}" for n, o in CASES])
def test_native_runs_compute_what_the_calls_compute(name, options, monkeypatch):
    entry = _entry(name)
    tokens = entry["tokens"][:16]
    logits = {}
    for native in ("0", "1"):
        monkeypatch.setenv("TORCHGGML_CPU_NATIVE_RUNS", native)
        model = load_model(GOLDEN / entry["model"], progress=False, **options)
        logits[native] = eval_steps(model, tokens)
        model.close()
    assert torch.equal(logits["0"], logits["1"])


@needs_golden
@pytest.mark.parametrize("name", ["llama-Q4_0", "llama-Q4_1", "llama-Q5_1", "llama-F16"])
def test_a_decode_step_is_one_native_run(name):
    """Every call of a decode step's plan but the token embeddings' GET_ROWS of a float table
    runs in native runs; the first call is the embeddings', the rest one run."""
    from torchggml.devices.cpu.native_plan import NativeRun
    model = load_model(GOLDEN / _entry(name)["model"], progress=False)
    model.eval([1, 2, 3])
    model.eval([4])
    (split,) = (model.last_graph.sched or model.sched).splits  # (a decode step's graph has a scheduler of its own)
    calls = split.plan.calls
    runs = [fn for fn, _ in calls if isinstance(fn, NativeRun)]
    assert len(runs) == 1 and len(calls) <= 2
    assert len(runs[0].members) > 10 * model.hp.n_layer
    model.close()


def _set_rows_graph():
    ctx = ggml.init(mem_size=1 << 20, no_alloc=True)
    dst = ggml.new_tensor_2d(ctx, T.F16, 8, 4)
    rows = ggml.new_tensor_2d(ctx, T.F32, 8, 2)
    idx = ggml.new_tensor_1d(ctx, T.I64, 2)
    for t in (dst, rows, idx):
        ggml.set_input(t)
    # rms_norm, add and set_rows: three native kernels in a row (a MUL after the norm would fuse with it)
    out = ggml.set_rows(ctx, dst, ggml.add(ctx, ggml.rms_norm(ctx, rows, 1e-6), rows), idx)
    graph = ggml.new_graph(ctx)
    ggml.build_forward_expand(graph, out)
    buf = ggml.backend_alloc_ctx_tensors(ctx, ggml.backend_cpu_init())
    return graph, dst, rows, idx, out, buf


def test_a_bad_row_index_in_a_native_run_raises_as_the_call_does():
    from torchggml.devices.cpu.native_plan import NativeRun
    graph, dst, rows, idx, out, _buf = _set_rows_graph()
    backend = ggml.backend_cpu_init()
    plan = ggml.backend_graph_plan_create(backend, graph)
    ggml.backend_tensor_set(dst, torch.zeros(4, 8, dtype=torch.float16))
    ggml.backend_tensor_set(rows, torch.arange(16, dtype=torch.float32).reshape(2, 8))
    ggml.backend_tensor_set(idx, torch.tensor([3, 1]))
    assert ggml.backend_graph_plan_compute(backend, plan) == ggml.Status.SUCCESS
    assert any(isinstance(fn, NativeRun) for fn, _ in plan.calls)
    x = torch.arange(16, dtype=torch.float64).reshape(2, 8)
    want = (x / torch.sqrt((x * x).mean(1, keepdim=True) + 1e-6) + x).half()
    got = torch.as_tensor(ggml.backend_tensor_get(dst))
    assert torch.equal(got[3], want[0]) and torch.equal(got[1], want[1]) and not got[[0, 2]].any()
    ggml.backend_tensor_set(idx, torch.tensor([1, 4]))
    # (numba's SET_ROWS to F16 where the CPU converts halves in hardware, in the run; else torch's)
    with pytest.raises(Exception, match=r"SET_ROWS: (a row index outside \[0, 4\) at position 1|row indices outside)"):
        ggml.backend_graph_plan_compute(backend, plan)


def test_native_runs_can_be_turned_off(monkeypatch):
    from torchggml.devices.cpu.native_plan import NativeRun
    monkeypatch.setenv("TORCHGGML_CPU_NATIVE_RUNS", "0")
    graph, *_ = _set_rows_graph()
    plan = ggml.backend_graph_plan_create(ggml.backend_cpu_init(), graph)
    assert not any(isinstance(fn, NativeRun) for fn, _ in plan.calls)


def test_every_native_kernel_is_a_kernel_with_those_arguments():
    """plan_kernels.OPS names kernels of the jit modules, each with as many arguments as its
    branch passes (a renamed kernel or argument list would otherwise leave runs unused)."""
    import inspect
    from torchggml.devices.cpu.jit.loader import plan_kernels
    kernels = plan_kernels()
    for name, types in kernels.OPS:
        fn = getattr(kernels, name)
        assert len(inspect.signature(fn.py_func).parameters) == len(types.split()), name
        floats = sum(t in ("f4", "f8") for t in types.split())
        assert floats <= kernels.FLOAT_WIDTH and 1 + len(types.split()) - floats <= kernels.PROGRAM_WIDTH, name


def test_a_freed_buffer_read_inside_a_native_run_is_named():
    """The plan checks the buffers of every call a native run stands for, not only its last
    node's: the rows read by its first kernel lie in a buffer freed after the plan was made."""
    from torchggml.backend.buffer import BufferFreedError
    from torchggml.devices.cpu.native_plan import NativeRun
    cpu = ggml.backend_cpu_init()
    ctx_rows, ctx = ggml.init(no_alloc=True), ggml.init(no_alloc=True)
    rows = ggml.set_name(ggml.new_tensor_2d(ctx_rows, T.F32, 8, 2), "rows")
    dst, idx = ggml.new_tensor_2d(ctx, T.F16, 8, 4), ggml.new_tensor_1d(ctx, T.I64, 2)
    rows_buf, cache_buf = ggml.backend_alloc_ctx_tensors(ctx_rows, cpu), ggml.backend_alloc_ctx_tensors(ctx, cpu)
    ggml.backend_tensor_set(idx, torch.tensor([0, 1]))
    graph_ctx = ggml.init(no_alloc=True)
    out = ggml.set_rows(graph_ctx, dst, ggml.mul(graph_ctx, ggml.rms_norm(graph_ctx, rows, 1e-6), rows), idx)
    graph = ggml.new_graph(graph_ctx)
    ggml.build_forward_expand(graph, out)
    galloc = ggml.gallocr_new(ggml.backend_cpu_buffer_type())
    assert ggml.gallocr_alloc_graph(galloc, graph)
    plan = ggml.backend_graph_plan_create(cpu, graph)
    (run, last), = plan.calls
    assert isinstance(run, NativeRun) and last.src[0] is not rows and last.src[0].src[0] is not rows
    ggml.backend_buffer_free(rows_buf)
    with pytest.raises(BufferFreedError, match=r"CPU: graph plan compute: .*'rows'.* freed"):
        ggml.backend_graph_plan_compute(cpu, plan)
    del cache_buf


FIRST_KERNEL = """
import numpy as np
from torchggml.devices.cpu.jit.loader import BoundKernel, op_kernels
from torchggml.devices.cpu.native_plan import NativeRun
ops = op_kernels()
x = np.arange(16, dtype=np.float32).reshape(1, 1, 2, 8)
normed, out = np.empty_like(x), np.empty_like(x)
calls = [(BoundKernel(ops.row_norm, x, normed, np.float32(1e-6), True), None),
         (BoundKernel(ops.binary, normed, x, out, 2), None)]
NativeRun(calls)()
from torchggml.devices.cpu.jit import plan_kernels
print("run_program from the cache:", sum(plan_kernels.run_program.stats.cache_hits.values()) > 0)
want = x * x / np.sqrt((x.astype(np.float64) ** 2).mean(-1, keepdims=True) + 1e-6)
print("max error", float(np.abs(out - want).max()))
"""


def test_a_native_run_as_the_first_kernel_of_a_process():
    """numba starts its threading layer when a parallel kernel is first called from Python: a
    native run (cached code that calls parallel kernels) as a process's first kernel crashed
    before plan_kernels started it (a torchrun rank's first decode, OMP_NUM_THREADS=1)."""
    import os
    import subprocess
    import sys
    from pathlib import Path
    root = str(Path(__file__).resolve().parents[1])
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")])))
    for _ in range(2):  # a first process fills a cold cache; the next loads run_program from it
        run = subprocess.run([sys.executable, "-c", FIRST_KERNEL], env=env, capture_output=True, text=True,
                             timeout=600)
        assert run.returncode == 0, run.stderr[-2000:]
        assert float(run.stdout.split()[-1]) < 1e-4
        if "run_program from the cache: True" in run.stdout:
            break
    assert "run_program from the cache: True" in run.stdout, run.stdout


def test_the_abort_callback_is_asked_before_every_node_of_a_native_run():
    """ggml's CPU backend checks its abort callback between nodes: a plan whose nodes form one
    native run is asked before each (and stops at the first yes), not once for the run."""
    from torchggml.devices.cpu.native_plan import NativeRun
    graph, dst, rows, idx, out, _buf = _set_rows_graph()
    cpu = ggml.backend_cpu_init()
    plan = ggml.backend_graph_plan_create(cpu, graph)
    ((run, _),) = plan.calls
    assert isinstance(run, NativeRun) and len(run.members) == 3
    ggml.backend_tensor_set(idx, torch.tensor([0, 1]))
    asked = []
    cpu.set_abort_callback(lambda: asked.append(1) or len(asked) == 2)
    assert ggml.backend_graph_plan_compute(cpu, plan) == ggml.Status.ABORTED
    assert len(asked) == 2
    asked.clear()
    cpu.set_abort_callback(lambda: asked.append(1) and False)
    assert ggml.backend_graph_plan_compute(cpu, plan) == ggml.Status.SUCCESS
    assert len(asked) == 3



def test_a_native_run_shares_its_rope_angles_and_follows_new_positions():
    """A native run's ROPE calls of the same positions (a decode step's Q and K of every layer)
    run as rope_shared with one table of angles: the first computes it, the others read it, and
    the next step's positions compute it again; each call's bits are the rope call's own."""
    from torchggml.devices.cpu import fast_ops
    from torchggml.devices.cpu.native_plan import NativeRun
    ops = fast_ops.op_kernels()
    pairs, n_tok = 32, 1
    ctx = ggml.init(no_alloc=True)
    pos = ggml.new_tensor_1d(ctx, T.I32, n_tok)
    nodes = [ggml.rope_ext(ctx, ggml.new_tensor_3d(ctx, T.F32, 2 * pairs, heads, n_tok), pos, None, 2 * pairs,
                           mode, 0, 10000.0, 1.0, 0.0, 1.0, 32.0, 1.0) for heads, mode in ((9, 2), (3, 2), (4, 0))]
    buffer = ggml.backend_alloc_ctx_tensors(ctx, ggml.backend_cpu_init())
    try:
        calls = [fast_ops.bind_rope(node) for node in nodes]
        assert all(c.kernel is ops.rope for c in calls)
        run = NativeRun([(c, node) for c, node in zip(calls, nodes)])
        assert len({int(row[12]) for row in run.program}) == 1  # one table of angles for the three
        rng = np.random.default_rng(0)
        for p in (5, 5, 300, 0):
            calls[0].args[2][:] = p
            for c in calls:
                c.args[0][:] = rng.standard_normal(c.args[0].shape).astype(np.float32)
            run()
            for c in calls:
                alone = np.empty_like(c.args[1])
                ops.rope(c.args[0], alone, *c.args[2:])
                np.testing.assert_array_equal(c.args[1], alone)
    finally:
        ggml.backend_buffer_free(buffer)
        ggml.free(ctx)
