"""The CPU's fused quantized products (torch_backend/cpu_quant): every block type decomposed
exactly into (q, scale, bias); MUL_MAT with a weight in the fused repack buffer against a
float64 product of the dequantized weight, per type and path (fused matvec for few rows,
dequantize + GEMM in float32 or bf16 for micro-batches); path selection; golden models on
every selectable path."""
from __future__ import annotations

import numpy as np
import pytest
import torch

import torchggml as ggml
from torchggml.quants import dequantize
from torchggml.torch_backend.cpu import cpu_reg
from torchggml.torch_backend.cpu_quant import layout
from torchggml.torch_backend.cpu_quant.decompose import DECOMPOSE, decompose
from torchggml.torch_backend.cpu_quant.features import PATHS, cpu_features, cpu_path
from torchggml.torch_backend.cpu import repack_buffer_type
from torchggml.types import type_traits

from test_models import GOLDEN, MANIFEST, check_logits, eval_steps, needs_golden
from test_repack import nmse, weight_graph

T = ggml.Type
TYPES = sorted(DECOMPOSE)


def random_blocks(qtype, n: int, k: int, seed: int) -> torch.Tensor:
    """Random ggml blocks [n, row bytes] whose float16 scales are finite and of a sane size."""
    tr = type_traits(qtype)
    g = torch.Generator().manual_seed(seed)
    blocks = torch.randint(0, 256, (n * k // tr.blck_size, tr.type_size), dtype=torch.uint8, generator=g)
    # every f16 field (d, dmin, m) of these types sits at one of these offsets: set them sane
    f16_at = {T.Q2_K: (80, 82), T.Q3_K: (108,), T.Q6_K: (208,), T.MXFP4: ()}.get(
        qtype, (0, 2) if qtype in (T.Q4_1, T.Q5_1, T.Q4_K, T.Q5_K) else (0,))
    for at in f16_at:
        sane = (torch.rand(blocks.shape[0], generator=g) * 0.02 + 1e-3).half()
        blocks[:, at:at + 2] = sane.view(torch.uint8).view(-1, 2)
    if qtype == T.MXFP4:
        blocks[:, 0] = torch.randint(118, 130, (blocks.shape[0],), dtype=torch.uint8, generator=g)
    return blocks.reshape(n, -1)


@pytest.mark.parametrize("qtype", TYPES, ids=[t.name for t in TYPES])
def test_decompose_is_dequantize(qtype):
    n, k = 3, 512
    blocks = random_blocks(qtype, n, k, seed=int(qtype))
    q, scale, bias = decompose(qtype, blocks, k)
    g = k // scale.shape[1]
    w = q.float().view(n, -1, g) * scale[..., None] + (0 if bias is None else bias[..., None])
    torch.testing.assert_close(w.view(n, k), dequantize(qtype, blocks), rtol=0, atol=0)


@pytest.mark.parametrize("qtype", TYPES, ids=[t.name for t in TYPES])
def test_dequantize_to_bf16_rounds_as_torch(qtype):
    """The prompt path's bf16 weight (dequantized straight to bf16 by the kernels) is exactly
    torch's round-to-nearest-even of the float32 dequantized weight."""
    n, k = 5, 512
    blocks = random_blocks(qtype, n, k, seed=7 * int(qtype))
    a, _b, _node, _graph, _bufs = weight_graph(qtype, n, k, 4, repack_buffer_type("fused"))
    ggml.backend_tensor_set(a, blocks.numpy())
    packed = layout._Packed(qtype, *layout.packed_views(a))
    f32 = layout.dequantized(packed, torch.float32).clone()
    torch.testing.assert_close(f32, dequantize(qtype, blocks), rtol=0, atol=0)
    assert torch.equal(layout.dequantized(packed, torch.bfloat16), f32.bfloat16())


PRODUCT_CASES = [(qtype, n, k, m, gemm) for qtype in TYPES for n, k in ((7, 256), (33, 512))
                 for m, gemm in ((1, "f32"), (3, "f32"), (40, "f32"), (40, "bf16"))]


@pytest.mark.parametrize("qtype,n,k,m,gemm", PRODUCT_CASES,
                         ids=[f"{c[0].name}-n{c[1]}-k{c[2]}-m{c[3]}-{c[4]}" for c in PRODUCT_CASES])
def test_fused_mul_mat_matches_float64(qtype, n, k, m, gemm, monkeypatch):
    monkeypatch.setenv("TORCHGGML_CPU_GEMM", gemm)
    blocks = random_blocks(qtype, n, k, seed=n * k + m)
    w = dequantize(qtype, blocks).double()
    a, b, node, graph, _bufs = weight_graph(qtype, n, k, m, repack_buffer_type("fused"))
    assert isinstance(a.buffer.buft, layout.FusedBufferType)
    ggml.backend_tensor_set(a, blocks.numpy())
    x = torch.rand(m, k, generator=torch.Generator().manual_seed(m)) * 2 - 1
    ggml.backend_tensor_set(b, x)
    assert ggml.backend_graph_compute(ggml.backend_cpu_init(), graph) == ggml.Status.SUCCESS
    ours = torch.as_tensor(ggml.backend_tensor_get(node)).reshape(m, n).double()
    # int8 activations (m < FUSED_MAX_ROWS) and bf16 GEMMs round like llama.cpp: its bound
    bound = 1e-9 if gemm == "f32" and m >= layout.FUSED_MAX_ROWS else 5e-4
    assert nmse(ours.numpy(), (x.double() @ w.T).numpy()) < bound


def test_path_override(monkeypatch):
    for path in PATHS:
        monkeypatch.setenv("TORCHGGML_CPU_PATH", path)
        assert cpu_path() == path
        buft = repack_buffer_type()
        assert (buft is None) == (path == "dequant")
        features = cpu_reg().get_proc_address("ggml_backend_get_features")()
        assert features["CPU_PATH"] == path and features["CPU_CAPABILITY"] == cpu_features()["CPU_CAPABILITY"]
    monkeypatch.setenv("TORCHGGML_CPU_PATH", "avx9000")
    with pytest.raises(ValueError, match="TORCHGGML_CPU_PATH"):
        cpu_path()


def test_n_threads_reach_numba():
    import numba
    backend = ggml.backend_cpu_init()
    before = torch.get_num_threads()
    try:
        ggml.backend_cpu_set_n_threads(backend, 1)
        assert numba.get_num_threads() == 1 and torch.get_num_threads() == 1
    finally:
        ggml.backend_cpu_set_n_threads(backend, before)


QUANT_MODELS = [e for e in MANIFEST if e["weights"] not in ("F32", "F16")]
GOLDEN_CASES = [(e, "fused") for e in QUANT_MODELS] + [
    (e, path) for e in QUANT_MODELS if e["weights"] in ("Q4_0", "Q8_0") for path in ("int4", "dequant")]


@needs_golden
@pytest.mark.parametrize("entry,path", GOLDEN_CASES, ids=[f"{e['model']}-{p}" for e, p in GOLDEN_CASES])
def test_golden_models_on_each_path(entry, path, monkeypatch):
    monkeypatch.setenv("TORCHGGML_CPU_PATH", path)
    model = ggml.load_model(GOLDEN / entry["model"], devices=["CPU"], progress=False)
    repacked = [t for t in model.weights.tensors.values() if t.buffer.name == "CPU_REPACK"]
    assert bool(repacked) == (path == "fused" or (path == "int4" and entry["weights"] == "Q4_0"))
    check_logits(model.eval(entry["tokens"]), entry)
    check_logits(eval_steps(model, entry["tokens"]), entry)
    model.close()


@pytest.mark.parametrize("path", PATHS)
def test_devices_command_names_features_and_path(path, monkeypatch, capsys):
    from torchggml import cli
    monkeypatch.setenv("TORCHGGML_CPU_PATH", path)
    assert cli.main(["devices"]) == 0
    line = next(l for l in capsys.readouterr().out.splitlines() if l.startswith("CPU features:"))
    assert f"CPU_PATH = {path}" in line and f"CPU_CAPABILITY = {cpu_features()['CPU_CAPABILITY']}" in line


def test_fused_buffer_takes_only_whole_weights():
    a, *_rest, bufs = weight_graph(T.Q8_0, 8, 64, 1, repack_buffer_type("fused"))
    blocks = random_blocks(T.Q8_0, 8, 64, seed=1)
    with pytest.raises(ValueError, match="must be written whole"):
        ggml.backend_tensor_set(a, blocks.reshape(-1)[:34].numpy(), offset=34)
    with pytest.raises(TypeError, match="repacked layout"):
        ggml.backend_tensor_get(a)


# The kernels compile for the CPU they run on; these targets check the code they generate for an
# AVX2-only CPU and for baseline x86-64 (SSE2), on any x86 machine (numba caches per target).
@pytest.mark.skipif(not any(a in __import__("platform").machine().lower() for a in ("x86", "amd64")),
                    reason="x86 code generation targets")
@pytest.mark.parametrize("target", ["haswell", "x86-64"])
def test_fused_kernels_on_other_x86_targets(target):
    import subprocess
    import sys
    from pathlib import Path
    env = {**__import__("os").environ, "NUMBA_CPU_NAME": target, "NUMBA_CPU_FEATURES": ""}
    cases = "m1-f32 and (Q8_0-n33 or Q6_K-n33 or Q4_K-n33 or Q5_K-n33)"
    out = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", __file__,
                          "-k", f"test_fused_mul_mat_matches_float64 and {cases}"],
                         env=env, cwd=Path(__file__).parent, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0 and "4 passed" in out.stdout, out.stdout[-2000:] + out.stderr[-2000:]
