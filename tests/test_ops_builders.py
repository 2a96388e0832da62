"""The vision/audio/diffusion and matrix-helper builders: shapes and op params as ggml.c sets
them, bad input refused with a ValueError naming the op and the tensor, and op coverage against
upstream's enums. (Values are checked against torch references in test_ops/cases/, run by test_ops.py.)"""
import json
from pathlib import Path

import pytest

import torchggml as ggml
from torchggml.enums import Op, UnaryOp, VIEW_OPS
from torchggml.devices.kernels.reference import TORCH_KERNELS

T = ggml.Type
UPSTREAM = json.loads((Path(__file__).parent / "data" / "ggml_enums.json").read_text())

# ops other work covers: the recurrent-model ops and the training ops (backward, losses, optimizers)
RECURRENT = {"SSM_CONV", "SSM_SCAN", "RWKV_WKV6", "RWKV_WKV7", "GATED_LINEAR_ATTN", "GATED_DELTA_NET", "SOLVE_TRI"}
TRAINING = {"REPEAT_BACK", "SILU_BACK", "RMS_NORM_BACK", "GET_ROWS_BACK", "SOFT_MAX_BACK", "ROPE_BACK",
            "FLASH_ATTN_BACK", "CROSS_ENTROPY_LOSS", "CROSS_ENTROPY_LOSS_BACK", "OPT_STEP_ADAMW", "OPT_STEP_SGD"}


def ctx():
    return ggml.init(no_alloc=True)


def named(t, name):
    return ggml.set_name(t, name)


# ---------------------------------------------------------------- coverage

def test_every_upstream_op_outside_recurrent_and_training_has_a_kernel():
    missing = [name for name in UPSTREAM["Op"]
               if name not in RECURRENT | TRAINING
               and (name not in Op.__members__ or (Op[name] not in VIEW_OPS and Op[name] not in TORCH_KERNELS.entries))]
    assert missing == []


def test_every_upstream_unary_op_is_defined_with_its_builder():
    assert set(UPSTREAM["UnaryOp"]) <= set(UnaryOp.__members__)
    for name in UPSTREAM["UnaryOp"]:
        assert hasattr(ggml, name.lower()), name


# ---------------------------------------------------------------- shapes and op params

@pytest.mark.parametrize("build, ne, op, params", [
    # whisper's encoder: conv_1d over 3000 mel frames, stride 1 then 2
    (lambda c: ggml.im2col(c, ggml.new_tensor_3d(c, T.F16, 3, 80, 384), ggml.new_tensor_2d(c, T.F32, 3000, 80),
                           1, 0, 1, 0, 1, 0, False, T.F16), [240, 3000, 1, 1], Op.IM2COL, [1, 0, 1, 0, 1, 0, 0]),
    (lambda c: ggml.conv_1d(c, ggml.new_tensor_3d(c, T.F16, 3, 384, 384), ggml.new_tensor_2d(c, T.F32, 3000, 384),
                            2, 1, 1), [1500, 384, 1, 1], Op.RESHAPE, None),
    # SAM's patch embedding (ggml.h's example)
    (lambda c: ggml.conv_2d_sk_p0(c, ggml.new_tensor_4d(c, T.F16, 16, 16, 3, 768),
                                  ggml.new_tensor_4d(c, T.F32, 1024, 1024, 3, 1)), [64, 64, 768, 1], Op.CONT, None),
    (lambda c: ggml.conv_2d_direct(c, ggml.new_tensor_4d(c, T.F32, 3, 3, 8, 16), ggml.new_tensor_4d(c, T.F32, 32, 30, 8, 2),
                                   2, 2, 1, 1, 1, 1), [16, 15, 16, 2], Op.CONV_2D, [2, 2, 1, 1, 1, 1]),
    (lambda c: ggml.conv_transpose_2d_p0(c, ggml.new_tensor_4d(c, T.F16, 3, 3, 4, 8),
                                         ggml.new_tensor_4d(c, T.F32, 10, 9, 8, 1), 2), [21, 19, 4, 1],
     Op.CONV_TRANSPOSE_2D, [2]),
    (lambda c: ggml.col2im_1d(c, ggml.new_tensor_2d(c, T.F32, 12, 7), 2, 3, 1), [14, 3, 1, 1], Op.COL2IM_1D, [2, 3, 1]),
    (lambda c: ggml.pool_2d(c, ggml.new_tensor_4d(c, T.F32, 9, 7, 2, 1), ggml.OpPool.AVG, 2, 2, 2, 2, 0.5, 0.5),
     [5, 4, 2, 1], Op.POOL_2D, [1, 2, 2, 2, 2, 0, 0]),
    (lambda c: ggml.pool_1d(c, ggml.new_tensor_2d(c, T.F32, 10, 3), ggml.OpPool.MAX, 3, 2, 1), [5, 3, 1, 1],
     Op.POOL_1D, [0, 3, 2, 1]),
    (lambda c: ggml.interpolate(c, ggml.new_tensor_4d(c, T.F32, 5, 4, 3, 1), 9, 7, 3, 1,
                                ggml.ScaleMode.BICUBIC | ggml.ScaleFlag.ALIGN_CORNERS), [9, 7, 3, 1], Op.UPSCALE,
     [2 | 256]),
    (lambda c: ggml.upscale(c, ggml.new_tensor_3d(c, T.F32, 5, 4, 3), 2, ggml.ScaleMode.NEAREST), [10, 8, 3, 1],
     Op.UPSCALE, [0]),
    (lambda c: ggml.win_part(c, ggml.new_tensor_3d(c, T.F32, 768, 64, 64), 14), [768, 14, 14, 25], Op.WIN_PART,
     [5, 5, 14]),
    (lambda c: ggml.timestep_embedding(c, ggml.new_tensor_1d(c, T.F32, 4), 320, 10000), [320, 4, 1, 1],
     Op.TIMESTEP_EMBEDDING, [320, 10000]),
    (lambda c: ggml.get_rel_pos(c, ggml.new_tensor_2d(c, T.F16, 64, 27), 14, 14), [64, 14, 14, 1], Op.GET_REL_POS,
     None),
    (lambda c: ggml.acc(c, ggml.new_tensor_2d(c, T.F32, 8, 4), ggml.new_tensor_2d(c, T.F32, 2, 2), 32, 128, 128, 8),
     [8, 4, 1, 1], Op.ACC, [32, 128, 128, 8, 0]),
    (lambda c: ggml.im2col_3d(c, ggml.new_tensor_4d(c, T.F16, 3, 3, 3, 8), ggml.new_tensor_4d(c, T.F32, 10, 9, 8, 4),
                              2, 1, 1, 1, 1, 1, 1, 1, 1, 1, T.F32), [54, 10, 9, 16], Op.IM2COL_3D,
     [1, 1, 1, 1, 1, 1, 1, 1, 1, 2]),
    (lambda c: ggml.dsv4_hc_comb(c, ggml.new_tensor_2d(c, T.F32, 24, 5), ggml.new_tensor_1d(c, T.F32, 3),
                                 ggml.new_tensor_1d(c, T.F32, 24), 1e-6, 20), [4, 4, 5, 1], Op.DSV4_HC_COMB, None),
])
def test_shapes_and_op_params_as_ggml(build, ne, op, params):
    t = build(ctx())
    assert t.ne == ne and t.op == op
    if params is not None:
        assert [t.op_params[i] for i in range(len(params))] == params


def test_conv_2d_dw_direct_keeps_channels_innermost_memory():
    c = ctx()
    a = ggml.permute(c, ggml.new_tensor_4d(c, T.F32, 4, 3, 3, 1), 3, 0, 1, 2)     # [3, 3, 1, 4]
    b = ggml.permute(c, ggml.new_tensor_4d(c, T.F32, 4, 10, 9, 2), 2, 0, 1, 3)    # [10, 9, 4, 2]
    out = ggml.conv_2d_dw_direct(c, a, b, 1, 1, 1, 1, 1, 1)
    assert out.ne == [10, 9, 4, 2] and out.nb[:3] == [16, 160, 4]


def test_inplace_builders_are_views_of_a():
    c = ctx()
    a = ggml.new_tensor_2d(c, T.F32, 6, 4)
    b = ggml.new_tensor_1d(c, T.F32, 3)
    for t in (ggml.acc_inplace(c, a, b, a.nb[1], a.nb[2], a.nb[3], 0), ggml.set_1d_inplace(c, a, b, 4),
              ggml.fill_inplace(c, a, 1.0)):
        assert t.view_src is a
    assert ggml.set_1d(c, a, b, 4).view_src is None


# ---------------------------------------------------------------- bad input

F32 = T.F32


@pytest.mark.parametrize("build, match", [
    (lambda c, x: ggml.im2col(c, named(ggml.new_tensor_4d(c, F32, 3, 3, 5, 2), "kernel"), x, 1, 1, 0, 0, 1, 1, True,
                              F32), r"im2col: kernel a.ne\[2\] \(IC\) must equal b.ne\[2\]"),
    (lambda c, x: ggml.im2col(c, named(ggml.new_tensor_4d(c, F32, 30, 3, 4, 2), "kernel"), x, 1, 1, 0, 0, 1, 1, True,
                              F32), "im2col: b too small"),
    (lambda c, x: ggml.conv_2d(c, named(ggml.new_tensor_4d(c, F32, 3, 3, 5, 2), "kernel"), x, 1, 1, 0, 0, 1, 1),
     "im2col: kernel"),
    (lambda c, x: ggml.conv_2d_direct(c, named(ggml.new_tensor_4d(c, F32, 3, 3, 5, 2), "kernel"), x, 1, 1, 0, 0, 1, 1),
     r"conv_2d_direct: kernel a.ne\[2\]"),
    (lambda c, x: ggml.conv_2d_dw_direct(c, named(ggml.new_tensor_4d(c, F32, 3, 3, 2, 4), "kernel"), x,
                                         1, 1, 0, 0, 1, 1), r"conv_2d_dw_direct: kernel a.ne\[2\] must be 1"),
    (lambda c, x: ggml.conv_transpose_1d(c, named(ggml.new_tensor_3d(c, F32, 3, 2, 4), "kernel"), x, 1, 0, 1),
     "conv_transpose_1d: b must be a matrix"),
    (lambda c, x: ggml.conv_transpose_1d(c, named(ggml.new_tensor_3d(c, F32, 3, 2, 10), "kernel"),
                                         ggml.view_2d(c, x, 12, 10, x.nb[1], 0), 1, 1, 1), "only p0 == 0 and d0 == 1"),
    (lambda c, x: ggml.conv_transpose_2d_p0(c, named(ggml.new_tensor_4d(c, F32, 3, 3, 2, 5), "kernel"), x, 2),
     r"conv_transpose_2d_p0: kernel a.ne\[3\] \(IC\) must equal b.ne\[2\]"),
    (lambda c, x: ggml.conv_3d_direct(c, named(ggml.new_tensor_4d(c, F32, 3, 3, 3, 6), "kernel"), x,
                                      1, 1, 1, 0, 0, 0, 1, 1, 1, 4, 2, 2), r"conv_3d_direct: a.ne\[3\]"),
    (lambda c, x: ggml.col2im_1d(c, x, 1, 3, 0), "col2im_1d: a must be a matrix"),
    (lambda c, x: ggml.pool_2d(c, x, ggml.OpPool.MAX, 20, 2, 1, 1, 0, 0), "pool_2d: no output"),
    (lambda c, x: ggml.pool_1d(c, x, ggml.OpPool.AVG, 20, 1, 0), "pool_1d: no output"),
    (lambda c, x: ggml.upscale(c, x, 1, ggml.ScaleMode.NEAREST), "upscale: scale_factor must be > 1"),
    (lambda c, x: ggml.interpolate(c, x, 4, 4, 3, 2, ggml.ScaleMode.BICUBIC | ggml.ScaleFlag.ANTIALIAS),
     "interpolate: antialias needs the bilinear mode"),
    (lambda c, x: ggml.interpolate(c, x, 4, 4, 3, 2, 7), "interpolate: unknown scale mode 7"),
    (lambda c, x: ggml.interpolate(c, ggml.cast(c, x, T.F16), 4, 4, 3, 2, 0), "interpolate: a must be F32"),
    (lambda c, x: ggml.pad_reflect_1d(c, x, 12, 1), r"pad_reflect_1d: padding \(12, 1\) must be shorter"),
    (lambda c, x: ggml.pad_reflect_1d(c, ggml.transpose(c, x), 1, 1), "pad_reflect_1d: a must be contiguous"),
    (lambda c, x: ggml.roll(c, x, 12, 0, 0, 0), r"roll: \|shift0\| = 12 must be < ne\[0\] = 12"),
    (lambda c, x: ggml.win_part(c, x, 4), r"win_part: a.ne\[3\] must be 1"),
    (lambda c, x: ggml.get_rel_pos(c, x, 5, 4), r"get_rel_pos: qh \(5\) must equal kh \(4\)"),
    (lambda c, x: ggml.add_rel_pos(c, x, x, ggml.new_tensor_1d(c, F32, 3)), "add_rel_pos: pw and ph must have"),
    (lambda c, x: ggml.acc(c, x, ggml.new_tensor_1d(c, F32, 1000), 0, 0, 0, 0), "acc: b has more elements than a"),
    (lambda c, x: ggml.set(c, x, ggml.new_tensor_1d(c, F32, 1000), 0, 0, 0, 0), "set: b has more elements than a"),
    (lambda c, x: ggml.acc(c, x, ggml.new_tensor_2d(c, F32, 4, 4), x.nb[1], x.nb[2], x.nb[3], x.nb[3] * 2 - 8),
     r"acc: b \[4, 4, 1, 1\] at offset 3832 .* past a's 3840 bytes"),
    (lambda c, x: ggml.set_2d(c, x, ggml.new_tensor_2d(c, F32, 4, 4), x.nb[1], 6),
     "set: strides .* and offset 6 must be multiples of the element size 4"),
    (lambda c, x: ggml.cumsum(c, ggml.cast(c, x, T.F16)), "cumsum: a must be F32"),
    (lambda c, x: ggml.diag(c, x), r"diag: a.ne\[1\] must be 1"),
    (lambda c, x: ggml.tri(c, x, ggml.TriType.LOWER), r"tri: a must be square"),
    (lambda c, x: ggml.fill(c, ggml.transpose(c, x), 1.0), "fill: a must be contiguous"),
    (lambda c, x: ggml.lightning_indexer(c, x, x, x, x), "lightning_indexer: mask must be F16"),
    (lambda c, x: ggml.dsv4_hc_pre(c, ggml.reshape_3d(c, x, 12, 10, 8), x), r"dsv4_hc_pre: weights must be \[hc, n_tokens\]"),
    (lambda c, x: ggml.dsv4_hc_comb(c, x, x, x, 1e-6, 1), r"dsv4_hc_comb: mixes.ne\[0\] must be"),
])
def test_bad_input_names_the_op_and_tensor(build, match):
    c = ctx()
    x = named(ggml.new_tensor_4d(c, F32, 12, 10, 4, 2), "image")
    with pytest.raises(ValueError, match=match) as err:
        build(c, x)
    assert "tensor 'image" in str(err.value) or "tensor 'kernel'" in str(err.value)


# ---------------------------------------------------------------- accelerators

NEW_FAMILY_OPS = ["im2col", "conv_2d", "conv_2d_direct", "conv_transpose_2d", "col2im_1d", "pool_2d", "pool_2d_back",
                  "upscale", "pad_reflect_1d", "roll", "timestep_embedding", "win_part", "add_rel_pos", "acc", "set",
                  "cumsum", "tri", "fill", "lightning_indexer", "dsv4_hc_comb", "softplus"]


def test_new_ops_run_on_an_accelerator_table():
    """The accelerators' tables fall back to the torch kernels: a case of each new op on the
    simulated accelerator (the GPU table, non-host buffers) matches its float64 reference."""
    from torchggml.test_ops.runner import all_cases, check_case_against_reference
    sim = ggml.backend_init_by_name("SIM0")
    try:
        for op in NEW_FAMILY_OPS:
            c = next(c for c in all_cases() if c.op == op)
            ok, err = check_case_against_reference(c, sim)
            assert ok, f"{c.name} on SIM0: normalized MSE {err:.3g}"
    finally:
        ggml.backend_free(sim)


@pytest.mark.parametrize("dim", [0, 1, 2, 3])
def test_concat_of_a_block_type_concatenates_its_blocks(dim):
    """CONCAT of Q8_0 tensors: the result dequantizes to the concatenation of the dequantized sources."""
    import torch
    from torchggml.quants import dequantize, quantize
    ne_a, ne_b = [64, 3, 2, 2], [64, 3, 2, 2]
    ne_b[dim] = 32 if dim == 0 else 1
    ctx = ggml.init(mem_size=1 << 20)
    a = ggml.new_tensor_4d(ctx, ggml.Type.Q8_0, *ne_a)
    b = ggml.new_tensor_4d(ctx, ggml.Type.Q8_0, *ne_b)
    xa, xb = torch.randn(*reversed(ne_a)), torch.randn(*reversed(ne_b))
    ggml.backend_tensor_set(a, quantize(ggml.Type.Q8_0, xa))
    ggml.backend_tensor_set(b, quantize(ggml.Type.Q8_0, xb))
    out = ggml.concat(ctx, a, b, dim)
    g = ggml.new_graph(ctx)
    ggml.build_forward_expand(g, out)
    ggml.backend_graph_compute(ggml.backend_cpu_init(), g)
    def values(t):
        return dequantize(ggml.Type.Q8_0, ggml.to_torch(t, raw=True)).reshape(*reversed(t.ne))
    want = torch.cat([values(a), values(b)], dim=3 - dim)
    assert torch.equal(values(out), want)
