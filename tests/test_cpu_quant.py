"""The CPU's fused quantized products (devices/cpu/layouts/fused.py): every block type decomposed
exactly into (q, scale, bias); MUL_MAT with a weight in the fused repack buffer, and MUL_MAT_ID
with experts there, against a float64 product of gguf's dequantized weight, per type and path
(fused matvec for few rows, dequantize + GEMM in float32 or bf16 for micro-batches); path
selection; golden models on every selectable path."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from gguf import GGMLQuantizationType, quants as gguf_quants

import torchggml as ggml
from torchggml.quants import dequantize
from torchggml.devices.cpu import cpu_device, cpu_reg
from torchggml.devices.cpu.layouts import fused as layout
from torchggml.devices.cpu.jit.llvm_ir import LOW_K_KINDS, OFFSET_BLOCK_KINDS
from torchggml.devices.cpu.layouts.decompose import DECOMPOSE, decompose
from torchggml.devices.cpu.features import PATHS, cpu_features, cpu_path
from torchggml.devices.cpu import repack_buffer_type
from torchggml.types import type_traits

from test_models import GOLDEN, MANIFEST, check_logits, eval_steps, needs_golden, sim_available
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


def _repacked(qtype, blocks, n, k, native: bool, monkeypatch) -> list[torch.Tensor]:
    """The fused layout's (q, scale, bias) after writing `blocks` (an [n, k] weight), by the
    native or the torch conversion."""
    if not native:
        monkeypatch.setattr(layout, "NATIVE_REPACK", frozenset())
    ctx = ggml.init(no_alloc=True)
    a = ggml.new_tensor_2d(ctx, qtype, k, n)
    ggml.backend_alloc_ctx_tensors_from_buft(ctx, repack_buffer_type("fused"))
    ggml.backend_tensor_set(a, blocks)
    monkeypatch.undo()
    return [v.clone() for v in layout.packed_views(a) if v is not None]


@pytest.mark.parametrize("qtype", sorted(layout.NATIVE_REPACK), ids=lambda t: t.name)
def test_native_repack_equals_the_torch_conversion(qtype, monkeypatch):
    """The load's native conversion writes the fused layout bit for bit as decompose.py (checked
    against dequantize above) does."""
    n, k = 37, 512
    blocks = random_blocks(qtype, n, k, seed=3)
    native = _repacked(qtype, blocks, n, k, True, monkeypatch)
    reference = _repacked(qtype, blocks, n, k, False, monkeypatch)
    assert [v.dtype for v in native] == [v.dtype for v in reference]
    assert all(torch.equal(x, y) for x, y in zip(native, reference))


@pytest.mark.parametrize("qtype", TYPES, ids=[t.name for t in TYPES])
def test_dequantize_to_bf16_rounds_as_torch(qtype):
    """The prompt path's bf16 weight (dequantized straight to bf16 by the kernels) is exactly
    torch's round-to-nearest-even of the float32 dequantized weight."""
    n, k = 5, 512
    blocks = random_blocks(qtype, n, k, seed=7 * int(qtype))
    a, _b, _node, _graph, _bufs = weight_graph(qtype, n, k, 4, repack_buffer_type("fused"))
    ggml.backend_tensor_set(a, blocks.numpy())
    packed = layout._Packed.of(a)
    f32 = layout.dequantized(packed, torch.float32).clone()
    torch.testing.assert_close(f32, dequantize(qtype, blocks), rtol=0, atol=0)
    assert torch.equal(layout.dequantized(packed, torch.bfloat16), f32.bfloat16())


# the in-place kinds whose products split their rows as the converted layout's (fused._layout_rows)
LAYOUT_ROWS_KINDS = OFFSET_BLOCK_KINDS + LOW_K_KINDS
LAYOUT_ROWS_TYPES = (T.Q4_1, T.Q5_0, T.Q5_1, T.Q2_K, T.Q3_K)

PRODUCT_CASES = [(qtype, n, k, m, gemm, "fused") for qtype in TYPES for n, k in ((7, 256), (33, 512))
                 for m, gemm in ((1, "f32"), (3, "f32"), (40, "f32"), (40, "bf16"))]
# rows of 7 blocks of 32: the kernels' loops over 4 blocks at a time leave 3
PRODUCT_CASES += [(qtype, 5, 224, m, "f32", "fused") for qtype in TYPES if type_traits(qtype).blck_size == 32
                  for m in (1, 3)]
# the IN_PLACE_KINDS' weights also multiplied on their ggml blocks in host memory (where models leave them)
PRODUCT_CASES += [(qtype, n, k, m, gemm, "blocks") for qtype, n, k, m, gemm, _ in PRODUCT_CASES
                  if qtype in layout.IN_PLACE_KINDS]
# MUL_MAT's fused matvec takes up to FUSED_MATMUL_MAX_ROWS rows (a batched decode step)
PRODUCT_CASES += [(qtype, 33, 512, m, "f32", "fused") for qtype in TYPES
                  for m in (layout.FUSED_MATMUL_MAX_ROWS - 1, layout.FUSED_MATMUL_MAX_ROWS)]
# 2-D weights of the other types in host memory (a tied embedding, which GET_ROWS reads too):
# converted once to the fused layout when their product is bound
PRODUCT_CASES += [(qtype, 33, 512, m, "f32", "blocks") for qtype in (T.MXFP4,) for m in (1, 40)]
# blocks in place keep the matvec up to BLOCK_MAX_ROWS rows
PRODUCT_CASES += [(qtype, 33, 512, m, "f32", "blocks") for qtype in layout.IN_PLACE_KINDS
                  for m in (layout.BLOCK_MAX_ROWS - 1, layout.BLOCK_MAX_ROWS)]


@pytest.mark.parametrize("qtype,n,k,m,gemm,where", PRODUCT_CASES,
                         ids=[f"{c[0].name}-n{c[1]}-k{c[2]}-m{c[3]}-{c[4]}-{c[5]}" for c in PRODUCT_CASES])
def test_fused_mul_mat_matches_float64(qtype, n, k, m, gemm, where, monkeypatch):
    from torchggml.devices.cpu.products import bind_block_product
    monkeypatch.setenv("TORCHGGML_CPU_GEMM", gemm)
    blocks = random_blocks(qtype, n, k, seed=n * k + m)
    w = dequantize(qtype, blocks).double()
    buft = repack_buffer_type("fused") if where == "fused" else ggml.backend_cpu_buffer_type()
    a, b, node, graph, _bufs = weight_graph(qtype, n, k, m, buft)
    assert isinstance(a.buffer.buft, layout.FusedBufferType) == (where == "fused")
    ggml.backend_tensor_set(a, blocks.numpy())
    assert (bind_block_product(node) is not None) == (where == "blocks")
    x = torch.rand(m, k, generator=torch.Generator().manual_seed(m)) * 2 - 1
    ggml.backend_tensor_set(b, x)
    assert ggml.backend_graph_compute(ggml.backend_cpu_init(), graph) == ggml.Status.SUCCESS
    ours = torch.as_tensor(ggml.backend_tensor_get(node)).reshape(m, n).double()
    # int8 activations (m < FUSED_MATMUL_MAX_ROWS) and bf16 GEMMs round like llama.cpp: its bound
    in_place = where == "blocks" and qtype in layout.IN_PLACE_KINDS and layout.IN_PLACE_KINDS[qtype] not in LAYOUT_ROWS_KINDS
    fused_rows = layout.BLOCK_MAX_ROWS if in_place else layout.FUSED_MATMUL_MAX_ROWS
    bound = 1e-9 if gemm == "f32" and m >= fused_rows else 5e-4
    assert nmse(ours.numpy(), (x.double() @ w.T).numpy()) < bound


# a batched decode step's rows (separate_rows): the matvec takes them quant_kernels.ROWS at a time
# (7: a remainder of 3 rows one at a time), however many (above every prompt limit)
ROWS_CASES = [(qtype, where, m) for where, types in (("fused", TYPES), ("blocks", sorted(layout.IN_PLACE_KINDS, key=int)))
              for qtype in types for m in (4, 7, 16)]


def packed_weight(qtype, where, blocks, n, k):
    """The weight's blocks in place ("blocks") or converted into the fused layout ("fused")."""
    if where == "blocks":
        return layout._Packed.of_blocks(qtype, blocks)
    a, _b, _node, _graph, _bufs = weight_graph(qtype, n, k, 1, repack_buffer_type("fused"))
    ggml.backend_tensor_set(a, blocks.numpy())
    return layout._Packed.of(a)


@pytest.mark.parametrize("qtype,where,m", ROWS_CASES, ids=[f"{c[0].name}-{c[1]}-m{c[2]}" for c in ROWS_CASES])
def test_matvec_of_many_rows_equals_each_row_alone(qtype, where, m):
    """Bit for bit, so a sequence's tokens do not depend on the batch it decodes in."""
    pytest.importorskip("numba")
    n, k = 9, 512
    blocks = random_blocks(qtype, n, k, seed=m)
    x = torch.rand(m, k, generator=torch.Generator().manual_seed(m)) * 2 - 1
    packed = packed_weight(qtype, where, blocks, n, k)
    together = torch.empty(m, n)
    layout._product(packed, x, together, separate_rows=True)  # a batched decode step: all rows on the matvec
    for i in range(m):
        alone = torch.empty(1, n)
        layout._matvec(packed, x[i:i + 1], *layout._plain_rows(1), alone)
        assert torch.equal(together[i], alone[0]), (i, (together[i] - alone[0]).abs().max().item())
    if where == "fused":  # MUL_MAT's dispatch keeps rows below FUSED_MATMUL_MAX_ROWS on the matvec
        assert (m < layout._matvec_max_rows(packed)) == (m < layout.FUSED_MATMUL_MAX_ROWS)


# (type, layout, rows, K, a NaN and an infinity in the rows): K of whole block pairs, and 7 blocks
# of 32 (Q4_0's and IQ4_NL's odd last block, stored as it is in their activations' pair order)
BOUND_CASES = [(qtype, where, m, 512, False) for where, types in (("fused", TYPES),
                                                                  ("blocks", sorted(layout.IN_PLACE_KINDS, key=int)))
               for qtype in types for m in (1, 3)]
BOUND_CASES += [(qtype, "blocks", 3, k, bad) for qtype in (T.Q8_0, T.Q4_0, T.IQ4_NL, T.Q4_1)
                for k, bad in ((224, False), (512, True))]
BOUND_CASES += [(qtype, "blocks", 3, 512, True) for qtype in (T.Q4_K, T.IQ4_XS, T.Q2_K)]


@pytest.mark.parametrize("qtype,where,m,k,bad", BOUND_CASES,
                         ids=[f"{c[0].name}-{c[1]}-m{c[2]}-k{c[3]}{'-nonfinite' if c[4] else ''}" for c in BOUND_CASES])
def test_bound_decode_matvec_equals_the_product(qtype, where, m, k, bad):
    """A decode step's product bound once (bound_matvec: rounding and matvec in one kernel, as
    native runs call it) gives the product's bits, for every type of both layouts (NaN where the
    product is NaN)."""
    pytest.importorskip("numba")
    n = 9
    blocks = random_blocks(qtype, n, k, seed=m)
    packed = packed_weight(qtype, where, blocks, n, k)
    x = torch.rand(m, k, generator=torch.Generator().manual_seed(m)) * 2 - 1
    if bad:
        x[0, 5], x[1, k - 1] = float("nan"), float("inf")
    want, got = torch.empty(m, n), torch.empty(m, n)
    layout._product(packed, x, want)
    bound = layout.bound_matvec(packed, x, got)
    bound()
    np.testing.assert_array_equal(got.numpy(), want.numpy())
    assert not bad or got[:2].isnan().all()
    assert layout.bound_matvec(packed, torch.rand(layout._matvec_max_rows(packed), k), got) is None


# (type, rows, what a call between the first and the last product does): nothing in their way,
# it writes the last product's output memory (that product then writes a buffer of its own and
# a copy moves its values), it writes the rows (the last product then stays where it is)
GROUP_CASES = [(qtype, m, between) for qtype in sorted(layout.IN_PLACE_KINDS, key=int) for m in (1, 3)
               for between in (("none", "output", "rows") if m == 1 else ("output",))]


@pytest.mark.parametrize("qtype,m,between", GROUP_CASES, ids=[f"{c[0].name}-m{c[1]}-{c[2]}" for c in GROUP_CASES])
def test_grouped_decode_products_equal_the_calls_one_by_one(qtype, m, between):
    """layouts/fused.group_matvecs: products of the same rows by weights of one kind (a layer's q, k
    and v) in one call give each product's bits; a product moves up only past calls that do not
    write its rows."""
    from torchggml.devices.cpu.jit.loader import BoundKernel, op_kernels
    k, sizes = 512, (9, 5, 12)
    x = torch.rand(m, k, generator=torch.Generator().manual_seed(m)) * 2 - 1
    other = torch.rand(m, k, generator=torch.Generator().manual_seed(m + 1))
    packed = [layout._Packed.of_blocks(qtype, random_blocks(qtype, n, k, seed=n + m)) for n in sizes]
    outs = [torch.zeros(m, n) for n in sizes]
    products = [layout.bound_matvec(p, x, o) for p, o in zip(packed, outs)]
    last = outs[2].reshape(1, 1, m, -1)  # a call between: a copy into the last output's memory, or into the rows
    target = {"none": torch.zeros(1, 1, m, sizes[2]), "output": last, "rows": x.reshape(1, 1, m, k)}[between]
    source = other[:, :target.shape[-1]].reshape(target.shape).clone()
    between_call = BoundKernel(op_kernels().copy, source.numpy(), target.numpy())
    calls = [products[0], between_call, products[1], products[2]]
    for call in calls:  # one by one
        call()
    want = [o.clone() for o in outs]
    for o in outs:
        o.zero_()
    x.copy_(torch.rand(m, k, generator=torch.Generator().manual_seed(m)) * 2 - 1)
    grouped = layout.group_matvecs(calls)
    for call in grouped:
        call()
    for got, expected in zip(outs, want):
        np.testing.assert_array_equal(got.numpy(), expected.numpy())
    n_products = [sum(a.shape[1] > 0 for a in c.args[12:]) for c in grouped if c.kernel is products[0].kernel]
    assert n_products == {"none": [3], "output": [3], "rows": [1, 2]}[between]


def _needs_int8_gemm():
    pytest.importorskip("numba")
    from torchggml.devices.cpu.jit.gemm_ir import gemm_available
    if not gemm_available():
        pytest.skip("the int8 GEMM needs a CPU with AVX2 or a VNNI on x86 (this one runs the float GEMM path instead)")


def _rounded_as_vec_dot_type(qtype, x: torch.Tensor, where: str = "blocks", group: int = 32) -> torch.Tensor:
    """x [M, K] rounded as ggml's vec_dot type for qtype rounds it, float64: Q8_0 per 32 values
    (d = max|x| / 127, q = round(x / d); per `group` values where given: Q2_K's and Q3_K's
    matvec rounds per 16) for Q8_0/Q4_0/IQ4_NL and the types of the fused layout,
    Q8_K per 256 for the K-quants' and IQ4_XS's blocks in place (the matvec's own rounding, which
    test_k_quant_activations_round_as_ggml_q8_k checks)."""
    if where != "blocks" or layout.IN_PLACE_KINDS.get(qtype) not in layout.Q8_K_KINDS:
        g = x.reshape(x.shape[0], -1, group)
        d = g.abs().amax(-1, keepdim=True) / 127
        q = torch.where(d > 0, torch.round(g / torch.where(d > 0, d, 1)), 0)
        return (q.double() * d.double()).reshape(x.shape)
    from torchggml.devices.cpu.jit.loader import quant_kernels
    m, k = x.shape
    xq, xd, bsums = np.empty((m, k), np.int8), np.empty((m, k // 256), np.float32), np.empty((m, k // 16), np.int16)
    quant_kernels().quantize_rows_q8_k(x.numpy(), xq, xd, bsums)
    return torch.from_numpy((xq.reshape(m, -1, 256) * xd.astype(np.float64)[:, :, None]).reshape(m, k))


# the types whose 2-D weights live in the fused layout and multiply on its int8 GEMM kinds
LAYOUT_GEMM_TYPES = [T.Q4_1, T.Q5_0, T.Q5_1, T.Q2_K, T.Q3_K, T.IQ4_NL, T.IQ4_XS, T.MXFP4]
# (type, N, K, M, where): N a multiple of the panel's 32 rows; M past INT8_GEMM_MIN_ROWS, a tile
# of 4 and a remainder, and a prompt's micro-batch; K of one 256-value block, and several; ggml's
# blocks in place, and the fused layout's rows
INT8_GEMM_CASES = [(qtype, n, k, m, "blocks") for qtype in sorted(layout.IN_PLACE_KINDS, key=int)
                   if layout.IN_PLACE_KINDS[qtype] not in LAYOUT_ROWS_KINDS
                   for n, k, m in ((32, 256, 6), (64, 512, 7), (96, 768, 130))]
# the fused layout's rows, and Q4_1's, Q5_0's, Q5_1's, Q2_K's and Q3_K's blocks in place, from LAYOUT_INT8_MIN_ROWS
INT8_GEMM_CASES += [(qtype, n, k, m, where) for where, types in (("fused", LAYOUT_GEMM_TYPES),
                                                                 ("blocks", LAYOUT_ROWS_TYPES))
                    for qtype in types for n, k, m in ((32, 256, layout.LAYOUT_INT8_MIN_ROWS), (96, 768, 130))]


BOUND_GEMM_CASES = [(qtype, m) for qtype in sorted(layout.IN_PLACE_KINDS, key=int) for m in (layout.LAYOUT_INT8_MIN_ROWS, 37)]


@pytest.mark.parametrize("qtype,m", BOUND_GEMM_CASES, ids=[f"{c[0].name}-m{c[1]}" for c in BOUND_GEMM_CASES])
def test_bound_int8_gemm_equals_the_product(qtype, m, monkeypatch):
    """A prompt's product of ggml's blocks bound once (bound_int8_gemm: rounding and GEMM in one
    kernel) gives the product's bits, for every kind in place, where the int8 GEMM takes them."""
    _needs_int8_gemm()
    monkeypatch.setenv("TORCHGGML_CPU_GEMM", "int8")
    n, k = 64, 512
    packed = layout._Packed.of_blocks(qtype, random_blocks(qtype, n, k, seed=m))
    x = torch.randn(m, k, generator=torch.Generator().manual_seed(m))
    want, got = torch.empty(m, n), torch.empty(m, n)
    layout._product(packed, x, want)
    bound = layout.bound_int8_gemm(packed, x, got)
    bound()
    assert torch.equal(got, want), (got - want).abs().max().item()
    assert layout.bound_int8_gemm(packed, x[:layout._matvec_max_rows(packed) - 1], got) is None


@pytest.mark.parametrize("qtype,n,k,m,where", INT8_GEMM_CASES,
                         ids=[f"{c[0].name}-n{c[1]}-k{c[2]}-m{c[3]}-{c[4]}" for c in INT8_GEMM_CASES])
def test_int8_gemm_is_exact_on_rounded_activations(qtype, n, k, m, where, monkeypatch):
    """A micro-batch times ggml's blocks in place, or the fused layout's rows, on the int8 GEMM
    (TORCHGGML_CPU_GEMM=int8) equals the float64 product of gguf's dequantized weight and the
    activations rounded as the matvec rounds them (integer dots, the blocks' scales), and so is
    as close to the exact product as llama.cpp's, and as the decode matvec's."""
    _needs_int8_gemm()
    from torchggml.devices.cpu.products import bind_block_product
    monkeypatch.setenv("TORCHGGML_CPU_GEMM", "int8")
    blocks = random_blocks(qtype, n, k, seed=n + k + m)
    w = dequantize(qtype, blocks).double()
    buft = repack_buffer_type("fused") if where == "fused" else ggml.backend_cpu_buffer_type()
    a, b, node, graph, _bufs = weight_graph(qtype, n, k, m, buft)
    ggml.backend_tensor_set(a, blocks.numpy())
    if where == "blocks":
        assert bind_block_product(node) is not None
    else:
        assert layout._takes_int8_gemm(layout._Packed.of(a))
    x = torch.randn(m, k, generator=torch.Generator().manual_seed(m)) * 2
    ggml.backend_tensor_set(b, x)
    assert ggml.backend_graph_compute(ggml.backend_cpu_init(), graph) == ggml.Status.SUCCESS
    ours = torch.as_tensor(ggml.backend_tensor_get(node)).reshape(m, n).double()
    want = _rounded_as_vec_dot_type(qtype, x, where) @ w.T
    torch.testing.assert_close(ours, want, rtol=1e-5, atol=1e-5 * want.abs().max().item())
    assert nmse(ours.numpy(), (x.double() @ w.T).numpy()) < 5e-4


# (type, rows): the matvec (Q8_0 rounding, Q8_K rounding for the K-quants) and the int8 GEMM
# (Q5_0's and Q5_1's blocks take the int8 GEMM from LAYOUT_INT8_MIN_ROWS; Q4_1's the float GEMM)
NON_FINITE_CASES = [(qtype, m) for qtype in sorted(layout.IN_PLACE_KINDS, key=int)
                    for m in ((2,) if qtype == T.Q4_1 else (2, layout.LAYOUT_INT8_MIN_ROWS)
                              if layout.IN_PLACE_KINDS[qtype] in LAYOUT_ROWS_KINDS else (2, 8))]


@pytest.mark.parametrize("qtype,m", NON_FINITE_CASES, ids=[f"{c[0].name}-m{c[1]}" for c in NON_FINITE_CASES])
def test_non_finite_activations_give_nan_not_finite_values(qtype, m):
    """Rows rounded to int8 with a NaN or an infinity give NaN products (a float GEMM's would be
    non-finite too), not finite values computed from a NaN's int8 cast (the NaN row), nor a
    division by zero (an infinite Q8_K block); the other rows are untouched."""
    pytest.importorskip("numba")
    blocks = random_blocks(qtype, 64, 256, seed=m)
    packed = layout._Packed.of_blocks(qtype, blocks)
    if m >= layout._matvec_max_rows(packed) and not layout._takes_int8_gemm(packed):
        pytest.skip("this CPU runs no int8 GEMM: the float GEMM's products of an infinity are infinite, not NaN")
    x = torch.randn(m, 256, generator=torch.Generator().manual_seed(m))
    clean = torch.empty(m, 64)
    layout._product(packed, x, clean)
    x[0, 5], x[1, 200] = float("nan"), float("inf")
    out = torch.empty(m, 64)
    layout._product(packed, x, out)
    assert out[:2].isnan().all()
    assert torch.equal(out[2:], clean[2:])


def test_int8_gemms_in_two_threads_at_once_equal_the_serial_ones():
    """Each Python thread lays its panels out in its own work areas (two models in two threads
    run their prompts' products at the same time)."""
    _needs_int8_gemm()
    import threading
    cases = [(qtype, layout._Packed.of_blocks(qtype, random_blocks(qtype, 96, 512, seed=int(qtype))),
              torch.randn(37, 512, generator=torch.Generator().manual_seed(int(qtype))))
             for qtype in (T.Q4_K, T.Q8_0)]
    serial = []
    for _, packed, x in cases:
        serial.append(torch.empty(37, 96))
        layout._int8_gemm(packed, x, serial[-1])
    mismatches = []

    def worker(i):
        _, packed, x = cases[i]
        for _ in range(20):
            out = torch.empty(37, 96)
            layout._int8_gemm(packed, x, out)
            if not torch.equal(out, serial[i]):
                mismatches.append(i)
    threads = [threading.Thread(target=worker, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not mismatches


# Q4_1's, Q5_0's, Q5_1's, Q2_K's and Q3_K's 2-D weights, converted to the fused layout at load
# before, are multiplied on their blocks in place: rows of the matvec (1; 4 as separate
# sequences'), the float GEMM (4, 9), the int8 GEMM where it takes them (16, 64)
OFFSET_CASES = [(qtype, m, separate) for qtype in LAYOUT_ROWS_TYPES
                for m, separate in ((1, False), (4, True), (4, False), (9, False), (16, False), (64, False))]


@pytest.mark.parametrize("qtype,m,separate", OFFSET_CASES, ids=[f"{c[0].name}-m{c[1]}{'-separate' * c[2]}"
                                                                 for c in OFFSET_CASES])
def test_offset_blocks_in_place_compute_what_the_converted_layout_did(qtype, m, separate):
    """The same arithmetic on the same values: bit for bit, but for the matvec's sum of Q4_1's
    and Q5_1's mins, which the blocks' kernel adds in another order (float32 rounding), and Q2_K's
    and Q3_K's integer sums of each 32 values' scaled groups of 16 (the layout: a float product
    per group of 16); and the same rows split between the products."""
    pytest.importorskip("numba")
    n, k = 64, 512
    blocks = random_blocks(qtype, n, k, seed=m)
    x = torch.randn(m, k, generator=torch.Generator().manual_seed(m))
    in_place, converted = layout._Packed.of_blocks(qtype, blocks), packed_weight(qtype, "fused", blocks, n, k)
    assert in_place.kind in LAYOUT_ROWS_KINDS and layout._matvec_max_rows(in_place) == layout._matvec_max_rows(converted)
    assert layout._takes_int8_gemm(in_place) == layout._takes_int8_gemm(converted)
    ours, theirs = torch.empty(m, n), torch.empty(m, n)
    layout._product(in_place, x, ours, separate)
    layout._product(converted, x, theirs, separate)
    float_gemm = not (separate or m < layout.FUSED_MATMUL_MAX_ROWS or m >= layout.LAYOUT_INT8_MIN_ROWS)
    if qtype == T.Q5_0 or float_gemm or (in_place.kind in OFFSET_BLOCK_KINDS and not (separate or m < layout.FUSED_MATMUL_MAX_ROWS)):
        assert torch.equal(ours, theirs), (ours - theirs).abs().max().item()
    else:
        torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-5 * theirs.abs().max().item())


# the int8 GEMM compiled for other x86 byte dots (numba's target named, run in a subprocess on
# this CPU, which must execute that code): (NUMBA_CPU_NAME, NUMBA_CPU_FEATURES, the ISA chosen,
# the host features that run it). AVX-VNNI's 256-bit vpdpbusd runs here in its EVEX encoding
# (AVX512-VNNI with VL: the same instruction; AVX-VNNI's VEX one needs a CPU that has it).
OTHER_GEMM_TARGETS = [("haswell", "", "avx2", {"avx2"}),
                      ("haswell", "+avx512vl,+avx512vnni", "vnni256", {"avx512vl", "avx512vnni"})]
ISA_GEMM_CASES = [(qtype, 96, 768, 130) for qtype in sorted(layout.IN_PLACE_KINDS, key=int)] + [(T.Q8_0, 64, 512, 7)]
ISA_GEMM_CASES += [(qtype, 64, 512, 7) for qtype in (T.Q4_1, T.Q5_0, T.Q5_1, T.Q2_K, T.Q3_K)]
_ISA_GEMM_SCRIPT = """
import sys, numpy as np, torch
from torchggml.devices.cpu.jit.gemm_ir import gemm_isa
from torchggml.devices.cpu.layouts import fused as layout
from torchggml.types import Type
print(gemm_isa())
data = np.load(sys.argv[1])
outs = {}
for name in data.files:
    if name.startswith("x-"):
        qtype, n = Type[name.split("-")[1]], name.split("-", 1)[1]
        x = torch.from_numpy(data[name])
        out = torch.empty(x.shape[0], data["w-" + n].shape[0])
        layout._int8_gemm(layout.packed_blocks(qtype, torch.from_numpy(data["w-" + n])), x, out)
        outs[n] = out.numpy()
np.savez(sys.argv[2], **outs)
"""


@pytest.mark.skipif(not any(a in __import__("platform").machine().lower() for a in ("x86", "amd64")),
                    reason="x86 code generation targets")
@pytest.mark.parametrize("name,features,isa,needs", OTHER_GEMM_TARGETS, ids=[t[2] for t in OTHER_GEMM_TARGETS])
def test_int8_gemm_on_other_byte_dots_equals_avx512s(name, features, isa, needs, tmp_path):
    """The AVX2 (vpmaddubsw + vpmaddwd, Q8_0 by sign) and AVX-VNNI (256-bit vpdpbusd) GEMMs give
    the AVX512-VNNI GEMM's products bit for bit on the same blocks in place (integer dots are
    exact on each; the float steps are the same in each lane; the fused layout's kinds within
    float32 rounding: LLVM orders a bias kind's float sums by the code's shape), and the float64
    product of the rounded activations, as test_int8_gemm_is_exact_on_rounded_activations."""
    import os
    import subprocess
    import sys
    from pathlib import Path
    pytest.importorskip("numba")
    from llvmlite import binding
    from torchggml.devices.cpu.jit.gemm_ir import gemm_isa
    host = {k for k, v in binding.get_host_cpu_features().items() if v}
    if not needs <= host:
        pytest.skip(f"this CPU cannot run code for {isa} (needs {', '.join(sorted(needs - host))})")
    cases = {}
    for qtype, n, k, m in ISA_GEMM_CASES:
        key = f"{qtype.name}-{n}-{k}-{m}"
        cases["w-" + key] = random_blocks(qtype, n, k, seed=n + k).numpy()
        cases["x-" + key] = (torch.randn(m, k, generator=torch.Generator().manual_seed(m)) * 2).numpy()
    np.savez(tmp_path / "in.npz", **cases)
    env = {**os.environ, "NUMBA_CPU_NAME": name, "NUMBA_CPU_FEATURES": features,
           "PYTHONPATH": os.pathsep.join([str(Path(__file__).parents[1]), os.environ.get("PYTHONPATH", "")])}
    run = subprocess.run([sys.executable, "-c", _ISA_GEMM_SCRIPT, str(tmp_path / "in.npz"), str(tmp_path / "out.npz")],
                         env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.split() == [isa]
    theirs = np.load(tmp_path / "out.npz")
    for qtype, n, k, m in ISA_GEMM_CASES:
        key = f"{qtype.name}-{n}-{k}-{m}"
        x, blocks = torch.from_numpy(cases["x-" + key]), torch.from_numpy(cases["w-" + key])
        if gemm_isa() == "avx512vnni":
            ours = torch.empty(m, n)
            layout._int8_gemm(layout.packed_blocks(qtype, blocks), x, ours)
            if qtype in layout.IN_PLACE_KINDS:
                assert np.array_equal(theirs[key], ours.numpy()), key
            else:  # the fused layout's kinds: the same integer dots, their float sums may round apart
                np.testing.assert_allclose(theirs[key], ours.numpy(), rtol=1e-5, atol=1e-5 * np.abs(ours.numpy()).max())
        want = _rounded_as_vec_dot_type(qtype, x) @ dequantize(qtype, blocks).double().T
        torch.testing.assert_close(torch.from_numpy(theirs[key]).double(), want, rtol=1e-5,
                                   atol=1e-5 * want.abs().max().item())


GEMM_CHOICES = [  # (TORCHGGML_CPU_GEMM, whether the CPU has a byte dot (AVX2, VNNI), int8 GEMM on or the error)
    ("", True, True), ("", False, False), ("int8", True, True), ("int8", False, ValueError),
    ("bf16", True, False), ("f32", True, False), ("int4", True, ValueError),
]


@pytest.mark.parametrize("choice,vnni,expected", GEMM_CHOICES)
def test_int8_gemm_is_chosen_by_features_and_environment(choice, vnni, expected, monkeypatch):
    pytest.importorskip("numba")
    from torchggml.devices.cpu import features
    from torchggml.devices.cpu.jit import gemm_ir
    monkeypatch.setenv("TORCHGGML_CPU_GEMM", choice)
    monkeypatch.setattr(gemm_ir, "gemm_available", lambda: vnni)
    if expected is ValueError:
        with pytest.raises(ValueError, match="TORCHGGML_CPU_GEMM"):
            features.int8_gemm()
    else:
        assert features.int8_gemm() is expected


# (TORCHGGML_CPU_GEMM, the byte dot, the kinds the int8 GEMM takes): all of them but Q4_1's (4, 20:
# the float GEMM keeps SmolLM2's greedy tokens on llama.cpp's) and, on AVX2, the int8 ones (Q8_0,
# the fused layout's int8 q: the f32 GEMM is faster there) unless int8 is asked for
ALL_KINDS = {34, 18, 144, 176, 210, 20, 22, 24, 4, 32, 33, 16, 17}
KIND_CHOICES = [("", "avx512vnni", ALL_KINDS - {4, 20}), ("", "vnni256", ALL_KINDS - {4, 20}),
                ("", "avx2", {18, 144, 176, 210, 22, 24}), ("int8", "avx2", ALL_KINDS),
                ("int8", "avx512vnni", ALL_KINDS), ("f32", "avx2", set()), ("", None, set())]


@pytest.mark.parametrize("choice,isa,kinds", KIND_CHOICES)
def test_int8_gemm_takes_the_kinds_it_gains_on(choice, isa, kinds, monkeypatch):
    pytest.importorskip("numba")
    from torchggml.devices.cpu import features
    from torchggml.devices.cpu.jit import gemm_ir
    monkeypatch.setenv("TORCHGGML_CPU_GEMM", choice)
    monkeypatch.setattr(gemm_ir, "gemm_isa", lambda: isa)
    assert {kind for kind in ALL_KINDS if features.int8_gemm_takes(kind)} == kinds


# (rows, the product that takes them) for a stored type's weight where the int8 GEMM runs: the
# matvec, the float GEMM for a short prompt, the int8 GEMM from LAYOUT_INT8_MIN_ROWS
LAYOUT_ROWS_CASES = [(layout.FUSED_MATMUL_MAX_ROWS - 1, "_matvec"), (layout.FUSED_MATMUL_MAX_ROWS, "_gemm"),
                     (layout.LAYOUT_INT8_MIN_ROWS - 1, "_gemm"), (layout.LAYOUT_INT8_MIN_ROWS, "_int8_gemm")]


@pytest.mark.parametrize("m,product", LAYOUT_ROWS_CASES)
def test_stored_types_take_the_int8_gemm_from_its_rows(m, product, monkeypatch):
    _needs_int8_gemm()
    monkeypatch.setenv("TORCHGGML_CPU_GEMM", "int8")
    a, _b, _node, _graph, _bufs = weight_graph(T.Q5_0, 32, 256, 1, repack_buffer_type("fused"))
    ggml.backend_tensor_set(a, random_blocks(T.Q5_0, 32, 256, seed=m).numpy())
    ran = []
    for name in ("_matvec", "_gemm", "_int8_gemm"):
        monkeypatch.setattr(layout, name, lambda *args, name=name: ran.append(name))
    layout._product(layout._Packed.of(a), torch.randn(m, 256), torch.empty(m, 32))
    assert ran == [product]


@pytest.mark.parametrize("qtype,where", [(T.Q4_0, "blocks"), (T.Q6_K, "blocks"), (T.Q5_K, "fused"), (T.Q4_1, "fused")],
                         ids=lambda c: getattr(c, "name", c))
@pytest.mark.parametrize("gemm", ["f32", "bf16"])
def test_micro_batch_products_dequantize_in_chunks(qtype, where, gemm, monkeypatch):
    """A micro-batch's weight is dequantized a chunk of rows at a time (DEQUANT_CHUNK_BYTES):
    33 rows of 512 in chunks of 16 (f32) or 32 (bf16) rows, the last one short."""
    monkeypatch.setattr(layout, "DEQUANT_CHUNK_BYTES", 16 * 512 * 4)
    test_fused_mul_mat_matches_float64(qtype, 33, 512, 40, gemm, where, monkeypatch)


# ---------------------------------------------------------------- MUL_MAT_ID with fused experts

def _ids_table(name: str, n_tokens: int, n_used: int, n_expert: int) -> torch.Tensor:
    """ids [n_tokens, n_used] (torch order) of a named pattern, so that each case takes a known path."""
    t = torch.arange(n_tokens)[:, None]
    s = torch.arange(n_used)[None, :]
    if name == "spread":  # consecutive experts: with few tokens each expert gets < 4 rows
        return (t * n_used + s) % n_expert
    if name == "rotate":  # expert (t + s) % E: every expert used n_tokens * n_used / E times
        return (t + s) % n_expert
    if name == "skewed":  # experts 0, 1 for all tokens but the last (GEMM), 2, 3 for it (matvec)
        return torch.where(t < n_tokens - 1, s, s + 2).expand(n_tokens, n_used)
    if name == "repeated":  # one expert twice per token (ggml allows it)
        return (t % n_expert).expand(n_tokens, n_used)
    raise ValueError(name)


# (n_expert, n_used, b.ne1, n_tokens, ids pattern, the paths it takes)
ID_SHAPES = [
    (8, 2, 1, 1, "spread", {"matvec"}),       # decode, one activation row broadcast to both slots
    (8, 2, 2, 3, "spread", {"matvec"}),       # a few tokens, each slot its own row
    (4, 2, 2, 12, "rotate", {"gemm"}),        # a prompt: every expert 6 rows
    (4, 2, 1, 10, "rotate", {"gemm"}),        # a prompt, b broadcast over the slots
    (6, 2, 2, 5, "skewed", {"gemm", "matvec"}),
    (4, 3, 3, 2, "repeated", {"matvec"}),
]
ID_CASES = [(qtype, *shape, "f32") for qtype in TYPES for shape in ID_SHAPES] + [
    (qtype, *ID_SHAPES[2], "bf16") for qtype in TYPES]  # the GEMMs in bf16 (AMX, AVX512-BF16)


def expert_graph(qtype, n: int, k: int, n_expert: int, n_used: int, b_used: int, n_tokens: int, path="fused"):
    """experts [k, n, n_expert] in the path's repack buffer (CPU memory for "dequant"),
    b [k, b_used, n_tokens], ids; the node."""
    wctx = ggml.init(mem_size=1 << 20, no_alloc=True)
    experts = ggml.new_tensor_3d(wctx, qtype, k, n, n_expert)
    ctx = ggml.init(mem_size=1 << 20, no_alloc=True)
    b = ggml.new_tensor_3d(ctx, T.F32, k, b_used, n_tokens)
    ids = ggml.new_tensor_2d(ctx, T.I32, n_used, n_tokens)
    node = ggml.mul_mat_id(ctx, experts, b, ids)
    bufs = (ggml.backend_alloc_ctx_tensors_from_buft(wctx, repack_buffer_type(path) or ggml.backend_cpu_buffer_type()),
            ggml.backend_alloc_ctx_tensors_from_buft(ctx, ggml.backend_cpu_buffer_type()))
    graph = ggml.new_graph(ctx)
    ggml.build_forward_expand(graph, node)
    return experts, b, ids, node, graph, bufs


@pytest.mark.parametrize("qtype,n_expert,n_used,b_used,n_tokens,pattern,paths,gemm", ID_CASES,
                         ids=[f"{c[0].name}-e{c[1]}u{c[2]}-b{c[3]}-t{c[4]}-{c[5]}-{c[7]}" for c in ID_CASES])
def test_fused_mul_mat_id_matches_float64(qtype, n_expert, n_used, b_used, n_tokens, pattern, paths, gemm,
                                          monkeypatch):
    monkeypatch.setenv("TORCHGGML_CPU_GEMM", gemm)
    taken = set()
    for name in ("matvec", "gemm"):  # record which products run
        fn = getattr(layout, f"_{name}")
        monkeypatch.setattr(layout, f"_{name}", lambda *a, _fn=fn, _name=name: (taken.add(_name), _fn(*a))[1])
    n, k = 24, 256
    blocks = random_blocks(qtype, n * n_expert, k, seed=n_expert * n_tokens + int(qtype))
    w = torch.from_numpy(gguf_quants.dequantize(blocks.numpy(), GGMLQuantizationType(int(qtype))))
    w = w.double().reshape(n_expert, n, k)
    experts, b, ids, node, graph, _bufs = expert_graph(qtype, n, k, n_expert, n_used, b_used, n_tokens)
    assert isinstance(experts.buffer.buft, layout.FusedBufferType)
    ggml.backend_tensor_set(experts, blocks.numpy())
    x = torch.rand(n_tokens, b_used, k, generator=torch.Generator().manual_seed(n_tokens)) * 2 - 1
    chosen = _ids_table(pattern, n_tokens, n_used, n_expert)
    ggml.backend_tensor_set(b, x)
    ggml.backend_tensor_set(ids, chosen.to(torch.int32))
    assert ggml.backend_dev_supports_op(cpu_device(), node)
    assert ggml.backend_graph_compute(ggml.backend_cpu_init(), graph) == ggml.Status.SUCCESS
    ours = torch.as_tensor(ggml.backend_tensor_get(node)).reshape(n_tokens, n_used, n).double()
    rows = x.double()[:, torch.arange(n_used) % b_used]                     # [n_tokens, n_used, k]
    ref = torch.einsum("tunk,tuk->tun", w[chosen], rows)
    assert taken == paths
    # int8 activations and bf16 GEMMs round like llama.cpp: its bound
    bound = 1e-9 if paths == {"gemm"} and gemm == "f32" else 5e-4
    assert nmse(ours.numpy(), ref.numpy()) < bound


@pytest.mark.parametrize("qtype", [T.Q4_0, T.Q4_1, T.Q4_K, T.Q8_0, T.IQ4_XS])
def test_mul_mat_id_of_a_batched_decode_step_equals_each_token_alone(qtype, monkeypatch):
    """A batched decode step's MUL_MAT_ID (ops.mul_mat_set_separate_rows): every expert on the
    matvec, however many rows it has, so each token's results are bit for bit its own step's."""
    taken = set()
    monkeypatch.setattr(layout, "_gemm", lambda *a: taken.add("gemm"))
    n, k, n_expert, n_used, n_tokens = 24, 256, 4, 2, 12
    blocks = random_blocks(qtype, n * n_expert, k, seed=int(qtype)).numpy()
    x = torch.rand(n_tokens, n_used, k, generator=torch.Generator().manual_seed(1)) * 2 - 1
    chosen = _ids_table("rotate", n_tokens, n_used, n_expert).to(torch.int32)  # every expert 6 rows

    def run(tokens: slice):
        experts, b, ids, node, graph, _bufs = expert_graph(qtype, n, k, n_expert, n_used, n_used, x[tokens].shape[0])
        ggml.mul_mat_set_separate_rows(node)
        ggml.backend_tensor_set(experts, blocks)
        ggml.backend_tensor_set(b, x[tokens].contiguous())
        ggml.backend_tensor_set(ids, chosen[tokens].contiguous())
        assert ggml.backend_graph_compute(ggml.backend_cpu_init(), graph) == ggml.Status.SUCCESS
        return torch.as_tensor(ggml.backend_tensor_get(node)).reshape(-1, n_used, n)
    together = run(slice(None))
    for t in range(n_tokens):
        assert torch.equal(run(slice(t, t + 1))[0], together[t]), f"token {t}"
    assert not taken


@pytest.mark.parametrize("path", ["fused", "dequant"])
@pytest.mark.parametrize("bad", [-1, 4])
def test_mul_mat_id_rejects_expert_ids_out_of_range(path, bad):
    experts, b, ids, node, graph, bufs = expert_graph(T.Q8_0, 8, 64, 4, 2, 2, 3, path)
    ggml.backend_tensor_set(experts, random_blocks(T.Q8_0, 32, 64, seed=3).numpy())
    ggml.backend_tensor_set(b, torch.zeros(3, 2, 64))
    ggml.backend_tensor_set(ids, torch.tensor([[0, 1], [2, bad], [3, 0]], dtype=torch.int32))
    with pytest.raises(IndexError, match=r"mul_mat_id: expert ids outside \[0, 4\)"):
        ggml.backend_graph_compute(ggml.backend_cpu_init(), graph)


@pytest.mark.skipif(not sim_available(), reason="SIM devices not available")
def test_moe_model_split_over_sim_and_cpu_with_fused_experts(tmp_path, monkeypatch):
    """The scheduler runs MUL_MAT_ID on the CPU for the layers whose experts are repacked there,
    on the accelerator for the others, within llama.cpp's thresholds."""
    from test_archs import DATA, MANIFEST as ARCHS, check, tiny_model_path
    monkeypatch.setenv("TORCHGGML_CPU_PATH", "fused")
    key = "llama-moe-Q8_0"
    entry = ARCHS[key]
    model = ggml.load_model(tiny_model_path(key, entry, tmp_path), n_ctx=entry["n_ctx"], progress=False,
                            devices=["SIM0", "CPU"])
    experts = {name: t.buffer.name for name, t in model.weight_buffers.tensors.items() if "_exps." in name}
    assert set(experts.values()) == {"SIM0", "CPU_REPACK"}, experts
    ref = np.load(DATA / entry["logits"])
    check(model.eval(entry["tokens"]), ref, entry, f"{key} on SIM0 + CPU")
    model.close()


def test_fused_experts_only_as_mul_mat_id_weights():
    """3-D experts in the fused buffer are read by MUL_MAT_ID; MUL_MAT would read them as blocks."""
    experts, b, ids, node, graph, bufs = expert_graph(T.Q8_0, 8, 64, 4, 2, 2, 1)
    ctx = ggml.init(mem_size=1 << 20, no_alloc=True)
    rows = ggml.new_tensor_3d(ctx, T.F32, 64, 1, 4)
    assert ggml.backend_dev_supports_op(cpu_device(), node)
    assert not ggml.backend_dev_supports_op(cpu_device(), ggml.mul_mat(ctx, experts, rows))
    assert not repack_buffer_type("int4").supports_weight(T.Q4_0, [64, 8, 4])  # its layout is 2-D only
    assert repack_buffer_type("fused").supports_weight(T.Q4_0, [64, 8, 4])


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
# (model, path, prompt GEMM): the fused path's default GEMM (int8 for blocks in place where the
# CPU has AVX2 or a VNNI) and its float GEMM for those blocks too
GOLDEN_CASES = [(e, "fused", "") for e in QUANT_MODELS] + [
    (e, "fused", "bf16") for e in QUANT_MODELS if e["weights"] in ("Q4_0", "Q8_0", "Q4_K_M", "Q6_K")] + [
    (e, path, "") for e in QUANT_MODELS if e["weights"] in ("Q4_0", "Q8_0") for path in ("int4", "dequant")]


@needs_golden
@pytest.mark.parametrize("entry,path,gemm", GOLDEN_CASES,
                         ids=[f"{e['model']}-{p}{'-' + g if g else ''}" for e, p, g in GOLDEN_CASES])
def test_golden_models_on_each_path(entry, path, gemm, monkeypatch):
    monkeypatch.setenv("TORCHGGML_CPU_PATH", path)
    monkeypatch.setenv("TORCHGGML_CPU_GEMM", gemm)
    model = ggml.load_model(GOLDEN / entry["model"], devices=["CPU"], progress=False)
    repacked = [t for t in model.weight_buffers.tensors.values() if t.buffer.name == "CPU_REPACK"]
    if path == "fused":  # 2-D weights of the IN_PLACE_KINDS stay ggml blocks, multiplied in place
        assert not any(layout.is_in_place(t.type, t.ne) for t in repacked)
        assert bool(repacked) == any(not layout.is_in_place(t.type, t.ne) and t.type not in (T.F32, T.F16)
                                     and layout.supports_shape(t.type, t.ne) and name != "token_embd.weight"
                                     for name, t in model.weight_buffers.tensors.items())
    else:
        assert bool(repacked) == (path == "int4" and entry["weights"] == "Q4_0")
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


def test_half_bits_to_float_exact_for_every_half():
    """Float16 scales are read by half_bits_to_float (the CPU's conversion, or integer
    arithmetic where it has none: the x86-64 target below): every one of the 65536 bit
    patterns, infinities and NaN included, gives numpy's float32."""
    from numba import njit
    from torchggml.devices.cpu.jit.llvm_ir import _half_bits_intrinsic
    half_to_f32 = _half_bits_intrinsic()

    @njit
    def convert(bits, out):
        for i in range(bits.shape[0]):
            out[i] = half_to_f32(bits[i])
    bits = np.arange(-32768, 32768, dtype=np.int16)
    out = np.empty(bits.shape, np.float32)
    convert(bits, out)
    assert np.array_equal(out, bits.view(np.float16).astype(np.float32), equal_nan=True)


def test_float16_rounding_in_integer_steps_is_numpy_float16():
    """Where the CPU has no half conversion, F16 stores and the matvec's Q8_0 activation scales
    round to float16 in integer steps (jit/halves.py): for every float16 value, itself, the
    midpoints to its neighbours (ties to even), points just off them, random float32 bits, and
    the overflow and subnormal edges, the bits and values of numpy's cast."""
    from numba import njit
    from torchggml.devices.cpu.jit.halves import float_to_half_bits, round_to_half

    @njit
    def rounded(x, bits, values):
        for i in range(x.shape[0]):
            bits[i] = float_to_half_bits(x[i])
            values[i] = round_to_half(x[i])
    halves = np.arange(0, 65536, dtype=np.uint32).astype(np.uint16).view(np.float16).astype(np.float32)
    near = [halves.view(np.uint32) + np.uint32(d) for d in (0x1000, 0x0FFF, 0x1001)]  # midpoints, either side
    random = np.random.default_rng(0).integers(0, 2 ** 32, 200_000, dtype=np.uint64).astype(np.uint32)
    edges = np.array([65504, 65519.996, 65520, 2.0 ** -24, 2.0 ** -25, 3 * 2.0 ** -26, 1e-30, 0.0], np.float32)
    x = np.concatenate([halves, *(b.view(np.float32) for b in near), random.view(np.float32), edges, -edges])
    bits, values = np.empty(x.shape, np.uint16), np.empty_like(x)
    rounded(x, bits, values)
    with np.errstate(over="ignore", invalid="ignore"):
        want = x.astype(np.float16)
    finite = ~np.isnan(want)
    assert np.array_equal(bits[finite], want.view(np.uint16)[finite])
    assert np.array_equal(values.view(np.uint32)[finite], want.astype(np.float32).view(np.uint32)[finite])
    assert np.isnan(bits.view(np.float16)[~finite]).all() and np.isnan(values[~finite]).all()


# The kernels compile for the CPU they run on; these targets check the code they generate for an
# AVX2-only CPU and for baseline x86-64 (SSE2), on any x86 machine (numba caches per target).
# Each compiles again: the AVX2 target compiles only the kernels whose code differs by ISA (the
# matvecs' byte dots and nibble shuffles, the half conversions and F16 row dots of llvm_ir.py;
# the int8 GEMM's byte dots are test_int8_gemm_on_other_byte_dots_equals_avx512s'); baseline
# x86-64 also a native run, whose program calls those kernels (its F16 SET_ROWS aborted there
# before halves.py: no F16C), compiled for the target with every kernel it calls.
X86_TARGET_CASES = ("(test_fused_mul_mat_matches_float64 and m1-f32 and (Q8_0-n33 or Q6_K-n33 or Q4_K-n33 or Q5_K-n33"
                    " or Q4_0-n33 or Q4_1-n33 or Q5_0-n33 or Q5_1-n33 or IQ4_NL-n33 or IQ4_XS-n33 or Q2_K-n33 or Q3_K-n33))"
                    " or half_bits or float16_rounding"
                    " or (many_rows_equals and m7 and (Q4_0 or Q4_1 or Q5_1 or Q8_0 or Q4_K or Q6_K or IQ4_NL or IQ4_XS"
                    " or Q2_K or Q3_K))"
                    " or (f16_weight_numba_products and 83)"
                    " or (block_matvec_is_exact and m9 and (IQ4_NL or IQ4_XS or Q2_K or Q3_K))"
                    " or (bound_decode and (nonfinite or k224)) or (grouped_decode and m3) or weight_rows_together")


@pytest.mark.skipif(not any(a in __import__("platform").machine().lower() for a in ("x86", "amd64")),
                    reason="x86 code generation targets")
@pytest.mark.parametrize("target,cases,passed", [
    ("haswell", X86_TARGET_CASES, 81),
    pytest.param("x86-64", f"{X86_TARGET_CASES} or bad_row_index_in_a_native_run", 82, marks=pytest.mark.slow)],
    ids=["haswell", "x86-64"])
def test_fused_kernels_on_other_x86_targets(target, cases, passed):
    import subprocess
    import sys
    from pathlib import Path
    env = {**__import__("os").environ, "NUMBA_CPU_NAME": target, "NUMBA_CPU_FEATURES": ""}
    out = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", __file__,
                          str(Path(__file__).with_name("test_cpu_native_runs.py")),
                          str(Path(__file__).with_name("test_cpu_ops.py")), "-k", cases],
                         env=env, cwd=Path(__file__).parent, capture_output=True, text=True, timeout=900)
    # each type fused and on its blocks in place, the half conversions, an F16 row dot with a
    # remainder, rows four at a time (fused and in place), the IQ4 kinds' matvec (its own AVX2
    # code) exact on the rounded activations, the decode products' vector rounding and their
    # groups, their weight rows taken together; on x86-64 a native run
    assert out.returncode == 0 and f"{passed} passed" in out.stdout, out.stdout[-2000:] + out.stderr[-2000:]


def test_kernels_load_from_numba_disk_cache_in_a_new_process(tmp_path):
    """A second process loads the compiled kernels from numba's disk cache instead of compiling
    them again (kernels defined in closures missed it in every process: ~10 s before a quantized
    model's first prompt), without numba's registries' set-up and with numba's runtime helpers
    from their cache (no LLVM compile); the first, with an empty cache, says once that it
    compiles."""
    import os
    import subprocess
    import sys
    from pathlib import Path
    script = (  # kernels that call other jitted code: the ones whose closures missed the cache
        "import numpy as np, torch\n"
        "from numba.core.base import BaseContext\n"
        "refresh, refreshed = BaseContext.refresh, []\n"
        "BaseContext.refresh = lambda self: refreshed.append(1) or refresh(self)\n"
        "from numba.core.runtime import nrtdynmod\n"
        "create, created = nrtdynmod.create_nrt_module, []\n"
        "nrtdynmod.create_nrt_module = lambda ctx: created.append(1) or create(ctx)\n"
        "from torchggml.devices.cpu.jit.loader import op_kernels, quant_kernels\n"
        "k, ops = quant_kernels(), op_kernels()\n"
        "q = np.ones((4, 64), np.int8); s = np.ones((4, 2), np.float32); xq = np.ones((1, 64), np.int8)\n"
        "xd = np.ones((1, 2), np.float32); rows = np.zeros(1, np.int64); out = np.empty((1, 4), np.float32)\n"
        "k.matvec(q, s, s, False, 32, rows, xq, xd, xd, rows, out)\n"
        "x = np.ones((1, 1, 1, 8), np.float32); ops.glu(x, x, x.copy(), False)\n"
        "print(sum(f.stats.cache_misses.get(s, 0) for f in (k.matvec, ops.glu) for s in f.signatures),\n"
        "      sum(f.stats.cache_hits.get(s, 0) for f in (k.matvec, ops.glu) for s in f.signatures),\n"
        "      len(refreshed) > 0, len(created) > 0)\n"
        "import numba\n"  # a compile after the loads gets numba's full set-up (sort, a set, hashing)
        "def f(a):\n    s = set()\n    for v in a:\n        s.add(int(v))\n    return np.sort(a)[-1] + len(s)\n"
        "print(numba.njit(f)(np.arange(3.0)))\n")
    env = {**os.environ, "NUMBA_CACHE_DIR": str(tmp_path)}
    run = lambda: subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300,  # noqa: E731
                                 cwd=Path(__file__).parents[1], env=env)
    first = run()
    assert first.returncode == 0, first.stderr[-2000:]
    assert first.stderr.count("torchggml: compiling CPU kernels (first use") == 1, first.stderr[-2000:]
    second = run()
    assert second.returncode == 0, second.stderr[-2000:]
    assert "compiling" not in second.stderr, second.stderr[-2000:]
    assert first.stdout.split()[2] == "True"  # a process that compiles gets numba's full set-up
    misses, hits, refreshed, runtime_compiled, compiled = second.stdout.split()
    assert compiled == "5.0", second.stdout
    assert (int(misses), int(hits)) == (0, 2), second.stdout
    # kernels loaded from the cache need numba's runtime, not its registries (loader.py), and
    # the runtime's compiled helpers come from a cache of their own (runtime_cache.py)
    from torchggml.devices.cpu.jit.loader import _loads_without_refresh
    assert refreshed == str(not _loads_without_refresh()), second.stdout
    assert first.stdout.split()[3] == "True" and runtime_compiled == str(not _loads_without_refresh())
    assert bool(list(tmp_path.rglob("runtime.nrt-*.nbc"))) == _loads_without_refresh()


def test_a_kernel_loaded_from_numba_cache_keeps_no_parsed_ir_and_still_links(tmp_path):
    """A kernel loaded from numba's disk cache drops the LLVM module numba parses from the cached
    bitcode (several MB a kernel, kept for the process's life: ~15 MB of a small model's first
    prompt and decode); a kernel compiled later that calls it parses it again to link it."""
    pytest.importorskip("numba")
    import importlib.util
    import numba
    from torchggml.devices.cpu.jit.linking_ir import lean_cache
    source = tmp_path / "lean_kernels.py"
    source.write_text("from numba import njit\n\n@njit(cache=True)\ndef twice(x):\n    return 2 * x\n")

    def fresh():  # a new dispatcher over the same cached file, as in a new process
        spec = importlib.util.spec_from_file_location("lean_kernels", source)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module.twice
    assert fresh()(3) == 6  # compiled and saved
    twice = fresh()
    lean_cache(twice)
    assert twice(4) == 8 and sum(twice.stats.cache_hits.values()) == 1
    library = twice.overloads[twice.signatures[0]].library
    assert library._shared_module is None
    assert numba.njit(lambda x: twice(x) + 1)(5) == 11
    assert library._shared_module is not None  # parsed again for the caller's link


def test_a_changed_llvm_ir_drops_the_cached_kernels(tmp_path, monkeypatch):
    """numba keys its disk cache on the kernel's own file; the IR the kernels inline is in
    llvm_ir.py, so a stamp of that file beside the cache drops the cached kernels when it differs
    (an edited IR used to run the old compiled code until quant_kernels.py was touched)."""
    pytest.importorskip("numba")
    from torchggml.devices.cpu.jit import loader, quant_kernels
    flushed = []
    cache_type = type(quant_kernels.block_matvec._cache)
    monkeypatch.setattr(cache_type, "flush", lambda self: flushed.append(self))  # the real ones stay
    monkeypatch.setattr(cache_type, "cache_path", str(tmp_path))
    stamp = tmp_path / "quant_kernels.llvm_ir-hash"
    stamp.write_text("an older IR")
    loader._drop_cache_of_older_ir(quant_kernels)
    assert flushed and stamp.read_text() != "an older IR"
    flushed.clear()
    loader._drop_cache_of_older_ir(quant_kernels)  # the same IR: nothing dropped
    assert not flushed


def test_an_edited_callee_drops_the_cached_native_runs(tmp_path, monkeypatch):
    """plan_kernels' cached code holds the kernels it calls (the decode products of
    quant_kernels.py, op_kernels.py): their files enter its stamp, so an edit there drops it."""
    pytest.importorskip("numba")
    from torchggml.devices.cpu.jit import loader, plan_kernels
    flushed = []
    cache_type = type(plan_kernels.run_program._cache)
    monkeypatch.setattr(cache_type, "flush", lambda self: flushed.append(self))  # the real ones stay
    monkeypatch.setattr(cache_type, "cache_path", str(tmp_path))
    loader._drop_cache_of_older_ir(plan_kernels)
    flushed.clear()
    loader._drop_cache_of_older_ir(plan_kernels)
    assert not flushed
    monkeypatch.setitem(loader.CALLEE_FILES, "plan_kernels", ("quant_kernels.py",))  # as if op_kernels.py changed
    loader._drop_cache_of_older_ir(plan_kernels)
    assert flushed


def test_k_quant_activations_round_as_ggml_q8_k():
    """The K-quants' matvec rounds activations as ggml's Q8_K (quantize_row_q8_K_ref: one scale
    a block of 256, the sums of each 16): d, q and bsums equal the reference's, all-zero blocks
    included."""
    pytest.importorskip("numba")
    from torchggml.quants import quantize
    from torchggml.devices.cpu.jit.loader import quant_kernels
    x = torch.randn(3, 1024, generator=torch.Generator().manual_seed(3)) * 5
    x[1, 256:512] = 0
    xq, xd, bsums = np.empty((3, 1024), np.int8), np.empty((3, 4), np.float32), np.empty((3, 64), np.int16)
    quant_kernels().quantize_rows_q8_k(x.numpy(), xq, xd, bsums)
    blocks = quantize("Q8_K", x.reshape(-1, 256)).numpy().view(np.uint8).reshape(12, -1)  # d f32, 256 q, 16 sums
    np.testing.assert_array_equal(xd.reshape(-1), blocks[:, :4].copy().view(np.float32).reshape(-1))
    np.testing.assert_array_equal(xq.reshape(12, 256), blocks[:, 4:260].view(np.int8))
    np.testing.assert_array_equal(bsums.reshape(12, 16), blocks[:, 260:292].copy().view(np.int16))


# (scale block, group, zero point): Q8_0's rounding with groups of 32 and of 16 and the kinds'
# zero points (Q4_0's 8, Q5_0's 16, the int8 kinds' 128, none), Q8_K's with groups of 32 and of 16
GEMM_ROUNDING_CASES = [(32, 32, 8), (32, 32, 16), (32, 16, 128), (32, 32, 0), (256, 32, 0), (256, 16, 32), (256, 32, 128)]


@pytest.mark.parametrize("scale_block,group,zero", GEMM_ROUNDING_CASES,
                         ids=[f"block{c[0]}-group{c[1]}-zero{c[2]}" for c in GEMM_ROUNDING_CASES])
def test_gemm_activations_round_as_the_decode_matvecs(scale_block, group, zero):
    """The prompt GEMM's activation rounding (gemm_kernels.quantize_activations, jit/rounding_ir.py)
    equals the decode matvec's (quant_kernels.quantize_rows: Q8_0, quantize_rows_q8_k: Q8_K) bit
    for bit: q, the scales, NaN scales for blocks with an infinity or a NaN (their q 0), all-zero
    blocks, ties, equal magnitudes of both signs (Q8_K's max is the first); and each group's
    terms: -zero times its sum of q, and the scale times that sum."""
    _needs_int8_gemm()
    from torchggml.devices.cpu.jit.loader import gemm_kernels, quant_kernels
    m, k = 9, 768
    g = torch.Generator().manual_seed(scale_block + group + zero)
    x = torch.randn(m, k, generator=g) * torch.tensor([1e-3, 1.0, 50.0]).repeat(3)[:, None]
    x[0, :64] = torch.round(x[0, :64] * 2) / 2                 # ties
    x[1, :256], x[1, 256:272], x[1, 272:288] = 0.0, -3.0, 3.0   # zeros; -3 before 3
    x[2, 5], x[3, 300], x[4, k - 1] = float("nan"), float("inf"), -float("inf")
    x = x.numpy()
    xq, dx = np.empty((m, k), np.int8), np.empty((m, k // scale_block), np.float32)
    xz, xm = np.empty((m, k // group), np.int32), np.empty((m, k // group), np.float32)
    gemm_kernels().quantize_activations(x, group, zero, scale_block, xq, dx, xz, xm)
    want_q = np.empty((m, k), np.int8)
    if scale_block == 32:
        want_d, sums = np.empty((m, k // 32), np.float32), np.empty((m, k // 32), np.float32)
        quant_kernels().quantize_rows(x, 32, want_q, want_d, sums)
        bad = np.isnan(want_d)
        want_q.reshape(m, -1, 32)[bad] = 0  # the matvec's NaN scale makes its q unread
    else:
        want_d, bsums = np.empty((m, k // 256), np.float32), np.empty((m, k // 16), np.int16)
        quant_kernels().quantize_rows_q8_k(x, want_q, want_d, bsums)
    np.testing.assert_array_equal(xq, want_q)
    np.testing.assert_array_equal(dx.view(np.uint32), want_d.view(np.uint32))
    totals = want_q.reshape(m, -1, group).astype(np.int32).sum(-1)
    np.testing.assert_array_equal(xz, -zero * totals)
    np.testing.assert_array_equal(xm, np.repeat(want_d, scale_block // group, axis=1) * totals.astype(np.float32))


# (type, K, rows): every kind of blocks in place on the decode matvec, rows one at a time, four at
# a time and a remainder; K of whole block pairs, and 7 blocks of 32 (Q4_0's and IQ4_NL's odd last block)
ROUNDED_MATVEC_CASES = [(qtype, 768, m) for qtype in sorted(layout.IN_PLACE_KINDS, key=int) for m in (1, 4, 9, 16, 64)]
ROUNDED_MATVEC_CASES += [(qtype, 224, m) for qtype in (T.Q4_0, T.IQ4_NL) for m in (1, 9)]


@pytest.mark.parametrize("qtype,k,m", ROUNDED_MATVEC_CASES, ids=[f"{c[0].name}-k{c[1]}-m{c[2]}" for c in ROUNDED_MATVEC_CASES])
def test_block_matvec_is_exact_on_rounded_activations(qtype, k, m):
    """The decode matvec on ggml's blocks in place equals the float64 product of gguf's
    dequantized weight and the activations rounded as ggml's vec_dot type for the type (Q8_0
    with float16 scales, Q8_K for the K-quants; Q2_K and Q3_K per 16 values with float32 scales,
    as the converted layout's matvec rounded them), and for the Q8_0-rounded types the converted
    layout's product of the same weight (what IQ4_NL ran on before it was multiplied in place)
    within float32 rounding."""
    pytest.importorskip("numba")
    n = 40
    blocks = random_blocks(qtype, n, k, seed=k + m)
    x = torch.randn(m, k, generator=torch.Generator().manual_seed(m)) * 2
    ours = torch.empty(m, n)
    layout._product(layout._Packed.of_blocks(qtype, blocks), x, ours, separate_rows=True)
    w = dequantize(qtype, blocks).double()
    if qtype in layout.F16_ACTIVATION_SCALES:  # q from the float32 scale, the scale stored as float16
        g = x.reshape(m, -1, 32)
        d = g.abs().amax(-1, keepdim=True) / 127
        q = torch.round(g * torch.where(d > 0, 1 / d, 0))
        rounded = (q.double() * d.half().double()).reshape(m, k)
        want = rounded @ w.T
        _q, _scale, mins = decompose(qtype, blocks, k)
        if mins is not None:  # the mins times the groups' sums d * sum(q), d in float32 (quantize_rows)
            full = (q.double() * d.double()).reshape(m, k)
            want += (full - rounded) @ mins.double().repeat_interleave(32, dim=1).T
    else:
        want = _rounded_as_vec_dot_type(qtype, x, group=16 if layout.IN_PLACE_KINDS[qtype] in LOW_K_KINDS else 32) @ w.T
    torch.testing.assert_close(ours.double(), want, rtol=1e-5, atol=1e-5 * want.abs().max().item())
    if qtype in layout.F16_ACTIVATION_SCALES:  # the converted layout rounds these types' activations alike
        converted = torch.empty(m, n)
        layout._product(packed_weight(qtype, "fused", blocks, n, k), x, converted, separate_rows=True)
        torch.testing.assert_close(ours, converted, rtol=1e-5, atol=1e-5 * want.abs().max().item())


# (type, N, K): the kinds a decode step multiplies several weight rows at a time by its one
# activation row (weight_rows_dot); N with a last part chunk and a last part group, K of
# 4-pair steps and a tail pair (576), an odd last block (224), and rows too long to take side
# by side (1536: one at a time)
WEIGHT_ROWS_CASES = [(qtype, n, k) for qtype in (T.Q4_0, T.IQ4_NL) for n, k in ((11, 576), (37, 224), (16, 1536))]


@pytest.mark.parametrize("qtype,n,k", WEIGHT_ROWS_CASES, ids=[f"{c[0].name}-n{c[1]}-k{c[2]}" for c in WEIGHT_ROWS_CASES])
def test_decode_weight_rows_together_equal_row_dot_of_each(qtype, n, k):
    """A decode step's product (one activation row, its weight rows several at a time in one
    loop) gives each output as row_dot of its weight row alone, bit for bit."""
    pytest.importorskip("numba")
    from numba import njit
    from torchggml.devices.cpu.jit.loader import quant_kernels
    qk = quant_kernels()
    kind = layout.IN_PLACE_KINDS[qtype]
    blocks = random_blocks(qtype, n, k, seed=n + k).numpy().reshape(n, -1)
    x = torch.randn(1, k, generator=torch.Generator().manual_seed(k)).numpy()
    xq, xd, xsum = np.empty((1, k), np.int8), np.empty((1, k // 32), np.float32), np.empty((1, k // 32), np.float32)
    minus, bsums = np.empty((1, 8 * ((k // 32 + 1) // 2)), np.int32), np.empty((1, k // 16), np.int16)
    rows, out, none = np.zeros(1, np.int64), np.empty((1, n), np.float32), np.empty((1, 0), np.float32)
    qk.rows_block_matvecs(blocks, blocks[:0], blocks[:0], kind, x, xq, xd, xsum, bsums, minus,
                          rows, rows, out, none, none)  # xq left in pair order, minus their sums' terms
    row_dot = qk.row_dot

    @njit
    def each_row(blocks, xp, minus, xd, alone):
        for r in range(blocks.shape[0]):
            alone[r] = row_dot(blocks[r], xp[0], minus[0], xd[0], kind)
    alone = np.empty(n, np.float32)
    each_row(blocks, xq, minus, xd, alone)
    np.testing.assert_array_equal(out[0], alone)


@pytest.mark.parametrize("qtype", ["Q4_K", "Q6_K"])
def test_k_quant_products_are_exact_on_the_rounded_activations(qtype):
    """A Q4_K row is d sc q - dmin m per group, a Q6_K row d sc (u - 32): the product sums each
    block's scaled groups and its mins (Q4_K) or offsets (Q6_K, from the activations' sums of 16)
    as integers, as ggml's kernels, so that it equals the float64 product with the rounded
    activations; with the float sums of x for the mins, the rounding did not cancel (found by
    the fuzzer: a Q4_K_M model whose token_embd and ffn_gate were swapped, 5.3% from
    llama.cpp's logits)."""
    pytest.importorskip("numba")
    from torchggml.quants import quantize
    from torchggml.devices.cpu.jit.loader import quant_kernels
    kernels = quant_kernels()
    gen = torch.Generator().manual_seed(0)
    n, k, m = 64, 768, 3
    w = torch.rand(n, k, generator=gen) * 4 + 1  # all positive: large mins
    blocks = quantize(qtype, w).numpy().view(np.uint8).reshape(n, -1)
    weight = dequantize(qtype, torch.from_numpy(blocks.reshape(-1).copy())).reshape(n, k).double()
    x = (torch.randn(m, k, generator=gen) * 3).numpy()
    xq, xd, bsums = np.empty((m, k), np.int8), np.empty((m, k // 256), np.float32), np.empty((m, k // 16), np.int16)
    kernels.quantize_rows_q8_k(x, xq, xd, bsums)
    out = np.empty((m, n), np.float32)
    kernels.block_matvec(blocks, layout.IN_PLACE_KINDS[getattr(T, qtype)], np.zeros(m, np.int64), xq, xd, bsums,
                         np.arange(m), out)
    rounded = torch.from_numpy((xq.reshape(m, -1, 256) * xd[:, :, None]).reshape(m, k)).double()
    want = rounded @ weight.T
    assert torch.allclose(torch.from_numpy(out).double(), want, rtol=1e-5, atol=1e-5 * want.abs().max().item())


@pytest.mark.parametrize("qtype", sorted(layout.IN_PLACE_KINDS, key=int), ids=lambda t: t.name)
def test_blocks_in_place_dequantize_bit_exact(qtype):
    """The prompt path's dequantize of ggml's blocks in place (one LLVM vector loop per row)
    equals the gguf package's dequantize bit for bit."""
    pytest.importorskip("numba")
    from torchggml.devices.cpu.jit.loader import quant_kernels
    n, k = 37, 512
    blocks = random_blocks(qtype, n, k, seed=int(qtype)).numpy().view(np.uint8).reshape(n, -1)
    out = np.full((n, k), np.nan, np.float32)
    quant_kernels().dequantize_blocks(blocks, layout.IN_PLACE_KINDS[qtype], out)
    want = gguf_quants.dequantize(blocks, GGMLQuantizationType(int(qtype))).reshape(n, k)
    np.testing.assert_array_equal(out, want)


RUNTIME_CACHE_FILES = [  # id, what is done to a written file, read back?
    ("as-written", lambda d: d, True),
    ("a-byte-flipped", lambda d: d[:-3] + bytes([d[-3] ^ 1]) + d[-2:], False),
    ("truncated", lambda d: d[:-5], False),
    ("too-short", lambda d: d[:20], False),
    ("another-format", lambda d: b"x" + d[1:], False),
    ("empty", lambda d: b"", False),
]


@pytest.mark.parametrize("damage,read", [c[1:] for c in RUNTIME_CACHE_FILES], ids=[c[0] for c in RUNTIME_CACHE_FILES])
def test_runtime_cache_file_is_read_back_only_whole(tmp_path, damage, read):
    """runtime_cache.py's file of numba's runtime helpers: read back as written; damaged,
    truncated or foreign, not read (they are compiled again and the file rewritten)."""
    from torchggml.devices.cpu.jit.runtime_cache import _read, _write
    path = tmp_path / "runtime.nrt-0.nbc"
    state = (b"\x7fELF" + bytes(range(200)), b"BC\xc0\xde" + bytes(50))
    _write(path, state)
    path.write_bytes(damage(path.read_bytes()))
    assert _read(path) == (state if read else None)
    assert _read(tmp_path / "absent.nbc") is None


def _resident_code_kb(library: str) -> int:
    """Resident kB of the executable mappings of a library of this process (smaps)."""
    import re
    kb, inside = 0, False
    with open("/proc/self/smaps") as f:
        for line in f:
            if re.match(r"[0-9a-f]+-[0-9a-f]+ ", line):
                fields = line.split()
                inside = fields[1] == "r-xp" and len(fields) > 5 and library in fields[5]
            elif inside and line.startswith("Rss:"):
                kb += int(line.split()[1])
    return kb


def _add_on_cpu(cpu, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    ctx = ggml.init(no_alloc=True)
    x, y = (ggml.new_tensor_1d(ctx, ggml.Type.F32, len(a)) for _ in range(2))
    out = ggml.add(ctx, x, y)
    graph = ggml.new_graph(ctx)
    ggml.build_forward_expand(graph, out)
    buffer = ggml.backend_alloc_ctx_tensors(ctx, cpu)
    try:
        ggml.backend_tensor_set(x, torch.from_numpy(a))
        ggml.backend_tensor_set(y, torch.from_numpy(b))
        assert ggml.backend_graph_compute(cpu, graph) == ggml.Status.SUCCESS
        return ggml.backend_tensor_get(out).numpy().copy()
    finally:
        ggml.backend_buffer_free(buffer)


@pytest.mark.skipif(not __import__("sys").platform.startswith("linux"), reason="madvise, /proc/self/smaps: Linux")
def test_llvm_code_goes_back_to_the_page_cache_after_kernels_load():
    """LLVM's code (libllvmlite.so) that a kernel's compile or load leaves resident is handed
    back after the CPU backend's next computation (jit/code_pages.py); a compile afterwards
    faults back what it runs."""
    numba = pytest.importorskip("numba")
    from torchggml.devices.cpu.jit import code_pages
    cpu = ggml.backend_cpu_init()
    assert numba.njit(lambda v: v + 1)(1) == 2  # LLVM ran: its code is resident
    assert _resident_code_kb("libllvmlite") > 1024
    code_pages.note_loading()  # as the loader does before a kernel loads
    a, b = np.arange(8, dtype=np.float32), np.ones(8, dtype=np.float32)
    np.testing.assert_array_equal(_add_on_cpu(cpu, a, b), a + b)
    assert _resident_code_kb("libllvmlite") < 256
    assert code_pages.release() == 0  # nothing loaded since: nothing to do
    assert numba.njit(lambda v: v * 3)(2) == 6
    assert _resident_code_kb("libllvmlite") > 1024
