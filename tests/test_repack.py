"""The CPU's repack buffer type (CPU_REPACK): Q4_0/Q4_1/Q4_K weights stored in torch's int4 GEMM
layout. MUL_MAT with a repacked weight against a float64 product of gguf's dequantized weight;
the buffer's write/read rules; the CPU device reading repacked tensors only as MUL_MAT weights;
golden models loaded with and without repacking, alone and through the scheduler."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType, quants as gguf_quants

import torchggml as ggml
from torchggml.quants import quantize
from torchggml.devices.cpu import cpu_device, cpu_reg
from torchggml.devices.kernels import UnsupportedOpError
from torchggml.devices.cpu import repack_buffer_type
from torchggml.devices.cpu.layouts.base import RepackBuffer, RepackedTensorError
from torchggml.devices.cpu.layouts.int4 import repacked_views

from test_models import (GOLDEN, MANIFEST, check_logits, entry_named, eval_steps, needs_golden,
                         sim_available)

T = ggml.Type
MAX_NMSE = 5e-4  # test-backend-ops' mul_mat threshold


def quantized_weight(qtype, n: int, k: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(ggml blocks uint8 [n, row bytes], gguf's float64 dequantization [n, k])."""
    g = torch.Generator().manual_seed(seed)
    if qtype == T.Q4_K:  # no Q4_K quantizer: random bytes, with d and dmin of a sane size
        blocks = torch.randint(0, 256, (n * k // 256, 144), dtype=torch.uint8, generator=g)
        scales = (torch.rand(n * k // 256, 2, generator=g) * 0.02 + 1e-3).half()
        blocks[:, :4] = scales.view(torch.uint8)
        blocks = blocks.reshape(n, -1).numpy()
    else:
        values = torch.rand(n, k, generator=g) * 2 - 1
        blocks = quantize(qtype, values).numpy()
    reference = gguf_quants.dequantize(blocks, GGMLQuantizationType(int(qtype))).astype(np.float64)
    return blocks, reference.reshape(n, k)


def weight_graph(qtype, n: int, k: int, m: int, buft, op="mul_mat"):
    """ctx, weight a [k, n] in `buft`, rows b [k, m] in CPU memory, the node, their buffers."""
    ctx = ggml.init(mem_size=1 << 20, no_alloc=True)
    a = ggml.new_tensor_2d(ctx, qtype, k, n)
    wctx = ctx
    ctx = ggml.init(mem_size=1 << 20, no_alloc=True)
    if op == "mul_mat":
        b = ggml.new_tensor_2d(ctx, T.F32, k, m)
        node = ggml.mul_mat(ctx, a, b)
    else:  # get_rows
        b = ggml.new_tensor_1d(ctx, T.I32, m)
        node = ggml.get_rows(ctx, a, b)
    wbuf = ggml.backend_alloc_ctx_tensors_from_buft(wctx, buft)
    graph = ggml.new_graph(ctx)
    ggml.build_forward_expand(graph, node)
    cbuf = ggml.backend_alloc_ctx_tensors_from_buft(ctx, ggml.backend_cpu_buffer_type())
    return a, b, node, graph, (wbuf, cbuf)


def nmse(ours: np.ndarray, ref: np.ndarray) -> float:
    return float(((ours - ref) ** 2).sum() / (ref ** 2).sum())


# ---------------------------------------------------------------- MUL_MAT with repacked weights

MATMUL_CASES = [(qtype, n, k, m) for qtype in (T.Q4_0, T.Q4_1) for n, k in ((16, 32), (37, 96), (130, 256))
                for m in (1, 3, 17)] + [(T.Q4_K, n, k, m) for n, k in ((16, 256), (33, 512)) for m in (1, 3, 17)]


@pytest.mark.parametrize("qtype,n,k,m", MATMUL_CASES,
                         ids=[f"{c[0].name}-n{c[1]}-k{c[2]}-m{c[3]}" for c in MATMUL_CASES])
def test_repacked_mul_mat_matches_float64(qtype, n, k, m):
    blocks, w = quantized_weight(qtype, n, k, seed=n * k + m)
    a, b, node, graph, _bufs = weight_graph(qtype, n, k, m, repack_buffer_type("int4"))
    assert isinstance(a.buffer, RepackBuffer) and a.buffer.buft.supports_tensor(a)
    ggml.backend_tensor_set(a, blocks)
    x = torch.rand(m, k, generator=torch.Generator().manual_seed(m)) * 2 - 1
    ggml.backend_tensor_set(b, x)
    backend = ggml.backend_cpu_init()
    assert ggml.backend_graph_compute(backend, graph) == ggml.Status.SUCCESS
    ours = ggml.backend_tensor_get(node).numpy().reshape(m, n).astype(np.float64)
    ref = x.double().numpy() @ w.T
    assert nmse(ours, ref) <= MAX_NMSE


def test_chunked_packing_equals_whole(monkeypatch):
    """Big weights are converted in row chunks: the layout must not depend on the chunking."""
    from torchggml.devices.cpu.layouts import int4 as repack
    n, k = 200, 64
    blocks, _ = quantized_weight(T.Q4_0, n, k, seed=1)
    packed = []
    for chunk_values in (1 << 22, 64 * k):  # one chunk, then chunks of 64 rows
        monkeypatch.setattr(repack, "CONVERT_VALUES", chunk_values)
        a, *_rest, bufs = weight_graph(T.Q4_0, n, k, 1, repack_buffer_type("int4"))
        ggml.backend_tensor_set(a, blocks)
        packed.append([v.clone() for v in repacked_views(a)])
    assert all(torch.equal(x, y) for x, y in zip(*packed))


# ---------------------------------------------------------------- buffer rules

def test_partial_writes_and_reads_raise():
    blocks, _ = quantized_weight(T.Q4_0, 16, 64, seed=0)
    a, *_rest, bufs = weight_graph(T.Q4_0, 16, 64, 1, repack_buffer_type("int4"))
    ggml.set_name(a, "blk.0.attn_q.weight")
    with pytest.raises(ValueError, match="blk.0.attn_q.weight.*written whole"):
        ggml.backend_tensor_set(a, blocks.reshape(-1)[:18], 0)
    with pytest.raises(ValueError, match="written whole"):
        ggml.backend_tensor_set(a, blocks.reshape(-1)[:18], 18)
    ggml.backend_tensor_set(a, blocks)
    with pytest.raises(RepackedTensorError, match="blk.0.attn_q.weight.*not as ggml blocks"):
        ggml.backend_tensor_get(a, np.empty(ggml.nbytes(a), np.uint8))
    with pytest.raises(RepackedTensorError, match="not as ggml blocks"):
        ggml.backend_tensor_get(a, offset=18, size=18)
    # whole-tensor reads and zero-copy views never expose the packed bytes as ggml blocks
    with pytest.raises(TypeError, match="blk.0.attn_q.weight.*repacked layout"):
        ggml.backend_tensor_get(a)
    with pytest.raises(TypeError, match="repacked layout"):
        ggml.to_torch(a, raw=True)
    # nor does a copy into ordinary memory
    ctx = ggml.init(no_alloc=True)
    dst = ggml.dup_tensor(ctx, a)
    ggml.backend_alloc_ctx_tensors_from_buft(ctx, ggml.backend_cpu_buffer_type())
    with pytest.raises(RepackedTensorError):
        ggml.backend_tensor_copy(a, dst)


def test_unsupported_tensor_cannot_be_repacked():
    ctx = ggml.init(mem_size=1 << 20, no_alloc=True)
    w = ggml.new_tensor_2d(ctx, T.Q8_0, 64, 16)
    ggml.set_name(w, "q8_weight")
    buf = ggml.backend_alloc_ctx_tensors_from_buft(ctx, repack_buffer_type("int4"))
    with pytest.raises(ValueError, match="cannot repack.*q8_weight"):
        ggml.backend_tensor_set(w, np.zeros(ggml.nbytes(w), np.uint8))
    del buf


def test_buffer_type_properties():
    buft = repack_buffer_type("int4")
    assert buft.get_name() == "CPU_REPACK" and not buft.is_host() and buft.get_device() is cpu_device()
    assert cpu_reg().get_proc_address("ggml_backend_dev_get_extra_bufts")(cpu_device()) == [repack_buffer_type()]
    assert cpu_device().supports_buft(buft)
    sims = [d for d in ggml.backend_reg_by_name("SIM").get_devices()] if sim_available() else []
    assert not any(d.supports_buft(buft) for d in sims)
    ctx = ggml.init(mem_size=1 << 20, no_alloc=True)
    w = ggml.new_tensor_2d(ctx, T.Q4_0, 4096, 33)  # 33 rows are packed as 48: more than nbytes
    assert buft.get_alloc_size(w) >= 48 * 4096 // 2 + 4096 // 32 * 48 * 4 > ggml.nbytes(w)


def test_cpu_reads_repacked_tensors_only_as_mul_mat_weights():
    blocks, _ = quantized_weight(T.Q4_0, 16, 64, seed=0)
    a, ids, node, graph, bufs = weight_graph(T.Q4_0, 16, 64, 2, repack_buffer_type("int4"), op="get_rows")
    ggml.backend_tensor_set(a, blocks)
    assert not ggml.backend_dev_supports_op(cpu_device(), node)
    with pytest.raises(UnsupportedOpError, match="GET_ROWS.*repacked"):
        ggml.backend_graph_compute(ggml.backend_cpu_init(), graph)
    _, _, mm, _, bufs2 = weight_graph(T.Q4_0, 16, 64, 2, repack_buffer_type("int4"))
    assert ggml.backend_dev_supports_op(cpu_device(), mm)


# ---------------------------------------------------------------- golden models

REPACK_MODELS = [e for e in MANIFEST if e["weights"] in ("Q4_0", "Q4_1", "Q4_K_M")]


def load(entry, **options):
    return ggml.load_model(GOLDEN / entry["model"], progress=False, **options)


@needs_golden
@pytest.mark.parametrize("entry", REPACK_MODELS, ids=[e["model"] for e in REPACK_MODELS])
@pytest.mark.parametrize("repack", [True, False])
def test_golden_models_with_and_without_repack(entry, repack, monkeypatch):
    monkeypatch.setenv("TORCHGGML_CPU_PATH", "int4")  # this file tests torch's int4 layout
    model = load(entry, devices=["CPU"], repack=repack)
    placed = {name: t.buffer.name for name, t in model.weight_buffers.tensors.items()}
    repacked = {name for name, buft in placed.items() if buft == "CPU_REPACK"}
    if repack:  # every supported projection, and nothing read by other ops
        assert "blk.0.attn_q.weight" in repacked
        assert not any(n.startswith("token_embd") or "norm" in n for n in repacked)
        assert all(model.weight_buffers[n].type in (T.Q4_0, T.Q4_1, T.Q4_K) for n in repacked)
    else:
        assert not repacked
    check_logits(model.eval(entry["tokens"]), entry)
    check_logits(eval_steps(model, entry["tokens"]), entry)
    model.close()


@needs_golden
@pytest.mark.parametrize("path", ["int4", "fused"])
def test_mixed_placement_with_repacked_cpu_layers(path, monkeypatch, tmp_path):
    """SIM0 runs the input layer's neighbour, the CPU its repacked layers: the scheduler keeps
    every read of a repacked weight on the CPU."""
    monkeypatch.setenv("TORCHGGML_CPU_PATH", path)
    if not sim_available():
        pytest.skip("SIM device not available")
    # Q4_0 on the int4 path; the fused path multiplies every golden model's 2-D weights on their
    # blocks in place, so a generated MXFP4 model there, against its run on the CPU alone
    entry = entry_named("llama-Q4_0")
    if path == "int4":
        file, tokens = GOLDEN / entry["model"], entry["tokens"]
    else:
        from torchggml.gguf.writer.demo import DEMO_CONFIG, write_model
        file, tokens = write_model(tmp_path / "mxfp4.gguf", DEMO_CONFIG, "MXFP4"), entry["tokens"]
    model = ggml.load_model(file, progress=False, n_gpu_layers=1)  # CPU layer 0 (repacked), SIM0 the last and the output
    assert model.sched is not None
    assert model.weight_buffers["blk.0.attn_q.weight"].buffer.name == "CPU_REPACK"
    assert model.weight_buffers[f"blk.{model.hp.n_layer - 1}.attn_q.weight"].buffer.name != "CPU_REPACK"
    ours = model.eval(tokens)
    model.close()
    if path == "int4":
        check_logits(ours, entry)
        return
    alone = ggml.load_model(file, progress=False, devices=["CPU"])
    ref = alone.eval(tokens).numpy()
    alone.close()
    assert np.linalg.norm(ours.numpy() - ref) / np.linalg.norm(ref) < 4e-2
    assert (ours.numpy().argmax(1) == ref.argmax(1)).mean() >= 0.9
