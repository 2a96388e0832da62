"""Quantized matrix products: out[M, N] = x[M, K] @ dequant(blocks[N, row_bytes]).T in float32.

Two kernel families, both decoding the weights inside their K loop (no dequantized copy):
- matvec (M <= 16, token generation): each program owns BLOCK_N weight rows and all M rows of x,
  so every weight byte is read once; an optional split-K spreads a short N over the whole GPU
  (partial sums go to a workspace, summed after). M == 1 accumulates fp32 FMAs per lane and
  reduces once at the end; 2..16 pads M to 16 and uses tl.dot.
- gemm (larger M, prompt processing): output tiles BLOCK_M x BLOCK_N with grouped ordering for
  L2 reuse; each K step decodes a [BLOCK_N, BLOCK_K] weight tile to fp16/bf16 and feeds tl.dot.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from torchggml.types import Type

from . import _common as c
from .decode import load_weight_tile
from .dequant import check_ids

MATVEC_MAX_M = 16
MAX_TILE_VALUES = 64 * 128  # decoded weight values per program and K step; more spill (ptxas, sm_90)
MAX_DOT_K = 256  # tl.dot steps over more K spill with M = 16 (ptxas, sm_80 and sm_90; scripts/aot_report.py)
# decoders that need the most registers: their tiles stay smaller (scripts/aot_report.py found
# 8-byte spills at 4096 decoded values per dot step and 8192 per matvec step)
HEAVY_DECODERS = frozenset({int(Type.Q3_K), int(Type.Q5_K), int(Type.TQ1_0)})
MAX_TILE_VALUES_HEAVY = 4096
# single tiles ptxas spills (8-24 bytes) for these decoders, found by scripts/aot_report.py
# --types all (sm_80/sm_90): (BLOCK_M, BLOCK_N, BLOCK_K, num_warps) of a gemm tile, or "dot"
# (matvec with M > 1) / "row" (matvec with M == 1, mul_mat_id) in place of BLOCK_M
_Q5_SPILLS = frozenset({("dot", 32, 256, 8), ("dot", 16, 256, 4), (128, 64, 32, 4), (64, 256, 32, 8)})
SPILLING_TILES = {
    int(Type.Q5_0): _Q5_SPILLS,
    int(Type.Q5_1): _Q5_SPILLS,
    int(Type.IQ4_XS): frozenset({(64, 64, 32, 4)}),
    int(Type.F16): frozenset({("dot", 32, 256, 8), ("dot", 16, 256, 4), (64, 128, 32, 8), ("row", 32, 128, 4)}),
}

# tl.dot operand dtypes (a constexpr code: dtypes are not portable constexprs across versions)
DOT_F16, DOT_BF16, DOT_F32 = 0, 1, 2


@triton.jit
def _dot_operand(v, DOT: tl.constexpr):
    if DOT == 0:
        r = v.to(tl.float16)
    elif DOT == 1:
        r = v.to(tl.bfloat16)
    else:
        r = v.to(tl.float32)
    return r


def _blocks_per_step(args):
    """NB: whole blocks per K step (1 when a step is part of a block)."""
    return max(args["BLOCK_K"] // args["QK"], 1)


def _values_per_block_step(args):
    """E: values of each block decoded per K step (the whole block, or BLOCK_K of it)."""
    return min(args["BLOCK_K"], args["QK"])


STEP_HEURISTICS = {"NB": _blocks_per_step, "E": _values_per_block_step}


def _tile_key(cfg, uses_dot: bool):
    """A config's entry in SPILLING_TILES."""
    kind = cfg.kwargs.get("BLOCK_M", "dot" if uses_dot else "row")
    return (kind, cfg.kwargs["BLOCK_N"], cfg.kwargs["BLOCK_K"], cfg.num_warps)


def _prune_configs(configs, named_args, **kwargs):
    """Keep the configs that compile for these arguments without spilling: tl.dot needs
    BLOCK_N >= 16 (matvec with M > 1, gemm) and spills past MAX_DOT_K; a tile of more than
    MAX_TILE_VALUES decoded weights would spill, and so do SPILLING_TILES for their types."""
    uses_dot = kwargs.get("BLOCK_M", named_args.get("BLOCK_M", 16)) > 1
    heavy = kwargs.get("QTYPE", named_args.get("QTYPE")) in HEAVY_DECODERS
    max_tile = MAX_TILE_VALUES_HEAVY - (1 if uses_dot else 0) if heavy else MAX_TILE_VALUES
    spills = SPILLING_TILES.get(kwargs.get("QTYPE", named_args.get("QTYPE")), frozenset())
    kept = [cfg for cfg in configs
            if (not uses_dot or (cfg.kwargs["BLOCK_N"] >= 16 and cfg.kwargs["BLOCK_K"] <= MAX_DOT_K))
            and cfg.kwargs["BLOCK_N"] * cfg.kwargs["BLOCK_K"] <= max_tile
            and _tile_key(cfg, uses_dot) not in spills]
    return kept or [min(configs, key=lambda cfg: cfg.kwargs["BLOCK_N"] * cfg.kwargs["BLOCK_K"])]


# ---------------------------------------------------------------------------------------------
# matvec

@triton.jit
def _row_dot(base, row_offs, x_row, stride_xk, k_begin, k_end, QTYPE: tl.constexpr, QK: tl.constexpr,
             TS: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, NB: tl.constexpr, E: tl.constexpr):
    """[BLOCK_N] float32: the weight rows at base + row_offs dotted with one x row over values
    k_begin .. k_end - 1: per-lane fp32 FMAs, one reduction after the loop."""
    kk = tl.arange(0, BLOCK_K)
    acc = tl.zeros([BLOCK_N, BLOCK_K], dtype=tl.float32)
    for k0 in range(k_begin, k_end, BLOCK_K):
        w = load_weight_tile(base, row_offs, k0, k_end // QK, QTYPE, QK, TS, NB, E)
        k = k0 + kk
        x = tl.load(x_row + k * stride_xk, mask=k < k_end, other=0.0).to(tl.float32)
        acc += w * x[None, :]
    return tl.sum(acc, axis=1)


def _matvec_configs():
    if c.BUILT_FOR_INTERPRETER:
        return [triton.Config({"BLOCK_N": 16, "BLOCK_K": 128})]
    # about 16-32 decoded values per thread and K step: the gathers' pointers cost registers too
    return [
        triton.Config({"BLOCK_N": n, "BLOCK_K": k}, num_warps=w, num_stages=s)
        for n, k, w, s in [
            (8, 256, 4, 3), (16, 128, 4, 3), (16, 256, 4, 3), (32, 128, 4, 3),
            (32, 256, 8, 3), (64, 128, 8, 3), (16, 512, 8, 3), (64, 64, 4, 4),
        ]
    ]


@triton.autotune(configs=_matvec_configs(), key=["N", "K", "QTYPE", "BLOCK_M", "n_splits"],
                 prune_configs_by={"early_config_prune": _prune_configs})
@triton.heuristics(STEP_HEURISTICS)
@triton.jit
def _matvec_kernel(w_ptr, x_ptr, out_ptr, M, N, K, values_per_split, n_splits,
                   stride_wn, stride_xm, stride_xk, stride_os, stride_om, stride_on,
                   QTYPE: tl.constexpr, QK: tl.constexpr, TS: tl.constexpr, DOT: tl.constexpr,
                   BLOCK_M: tl.constexpr,
                   BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, NB: tl.constexpr, E: tl.constexpr):
    """out[split, m, n] = sum over this split's K range of x[m, k] * w[n, k], for all m < M
    (n_splits only keys the autotuning: the split changes the work of a program)."""
    pid_n = tl.program_id(0)
    pid_s = tl.program_id(1)
    n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    # the tile's first row as a 64-bit pointer, its rows as 32-bit offsets from it
    base = w_ptr + (pid_n * BLOCK_N).to(tl.int64) * stride_wn
    row_offs = (tl.minimum(n, N - 1) - pid_n * BLOCK_N) * stride_wn
    k_begin = pid_s * values_per_split
    k_end = tl.minimum(k_begin + values_per_split, K)
    out = out_ptr + pid_s * stride_os
    if BLOCK_M == 1:
        y = _row_dot(base, row_offs, x_ptr, stride_xk, k_begin, k_end, QTYPE, QK, TS, BLOCK_N, BLOCK_K, NB, E)
        tl.store(out + n * stride_on, y, mask=n < N)
    else:
        m = tl.arange(0, BLOCK_M)
        kk = tl.arange(0, BLOCK_K)
        acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
        for k0 in range(k_begin, k_end, BLOCK_K):
            w = load_weight_tile(base, row_offs, k0, k_end // QK, QTYPE, QK, TS, NB, E)
            k = k0 + kk
            x = tl.load(x_ptr + m[:, None] * stride_xm + k[None, :] * stride_xk,
                        mask=(m < M)[:, None] & (k < k_end)[None, :], other=0.0)
            acc = tl.dot(_dot_operand(x, DOT), tl.trans(_dot_operand(w, DOT)), acc)
        tl.store(out + m[:, None] * stride_om + n[None, :] * stride_on, acc,
                 mask=(m < M)[:, None] & (n < N)[None, :])


def _pick_split_k(n_rows: int, n_blocks: int, device: torch.device) -> int:
    """Enough programs to fill the GPU (about 2 per SM) when N alone is too short."""
    properties = getattr(getattr(torch, device.type, None), "get_device_properties", None)
    sms = getattr(properties(device), "multi_processor_count", 0) if properties else 0
    if not sms:  # the interpreter, or a device that does not say
        return 1
    tiles = c.cdiv(n_rows, 32)  # a typical BLOCK_N
    split = max(1, (2 * sms) // tiles)
    return min(split, max(1, n_blocks // 4), 32)  # keep a few blocks per split


def _matvec(qtype: Type, blocks, x, out, dot: int, split_k: int | None):
    qk, ts = c.block_shape(qtype)
    M, K = x.shape
    N, n_blocks = blocks.shape[0], K // qk
    split = split_k or _pick_split_k(N, n_blocks, x.device)
    split = max(1, min(split, n_blocks))
    blocks_per_split = c.cdiv(n_blocks, split)
    split = c.cdiv(n_blocks, blocks_per_split)  # no empty split
    target = out if split == 1 else torch.empty(split, M, N, dtype=torch.float32, device=x.device)
    stride_os = 0 if split == 1 else target.stride(0)

    def grid(meta):
        return (c.cdiv(N, meta["BLOCK_N"]), split)

    _matvec_kernel[grid](
        blocks, x, target, M, N, K, blocks_per_split * qk, split,
        blocks.stride(0), x.stride(0), x.stride(1), stride_os, target.stride(-2), target.stride(-1),
        QTYPE=int(qtype), QK=qk, TS=ts, DOT=dot,
        BLOCK_M=1 if M == 1 else MATVEC_MAX_M)
    if split > 1:
        out.copy_(target.sum(dim=0))
    return out


# ---------------------------------------------------------------------------------------------
# gemm

def _gemm_configs():
    if c.BUILT_FOR_INTERPRETER:
        return [triton.Config({"BLOCK_M": 16, "BLOCK_N": 16, "BLOCK_K": 64, "GROUP_M": 2})]
    # scripts/aot_report.py found spills (sm_80/sm_90) in 128x128x64 and 128x256x32 with 8 warps,
    # and with Q6_K in 64x128x32 and 64x64x64 with 4 warps: those tiles run with 8 warps here
    return [
        triton.Config({"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "GROUP_M": 8}, num_warps=w, num_stages=s)
        for bm, bn, bk, w, s in [
            (128, 128, 32, 8, 3), (64, 128, 32, 8, 3), (128, 64, 32, 4, 3), (64, 64, 32, 4, 3),
            (64, 128, 64, 8, 3), (64, 64, 64, 8, 3), (32, 64, 32, 4, 3), (64, 256, 32, 8, 3),
        ]
    ]


@triton.autotune(configs=_gemm_configs(), key=["M_BUCKET", "N", "K", "QTYPE", "DOT"],
                 prune_configs_by={"early_config_prune": _prune_configs})
@triton.heuristics(STEP_HEURISTICS)
@triton.jit
def _gemm_kernel(w_ptr, x_ptr, out_ptr, M, N, K, M_BUCKET,
                 stride_wn, stride_xm, stride_xk, stride_om, stride_on,
                 QTYPE: tl.constexpr, QK: tl.constexpr, TS: tl.constexpr, DOT: tl.constexpr,
                 BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                 GROUP_M: tl.constexpr, NB: tl.constexpr, E: tl.constexpr):
    """out[m, n] = sum_k x[m, k] * w[n, k] for one BLOCK_M x BLOCK_N tile."""
    # grouped ordering: GROUP_M row-tiles run together and share the weight tiles they stream
    pid = tl.program_id(0)
    tiles_m = (M + BLOCK_M - 1) // BLOCK_M
    tiles_n = (N + BLOCK_N - 1) // BLOCK_N
    group = pid // (GROUP_M * tiles_n)
    first_m = group * GROUP_M
    group_size = tl.minimum(tiles_m - first_m, GROUP_M)
    pid_m = first_m + (pid % group_size)
    pid_n = (pid % (GROUP_M * tiles_n)) // group_size

    m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    base = w_ptr + (pid_n * BLOCK_N).to(tl.int64) * stride_wn
    row_offs = (tl.minimum(n, N - 1) - pid_n * BLOCK_N) * stride_wn
    x_rows = x_ptr + tl.minimum(m, M - 1).to(tl.int64)[:, None] * stride_xm
    kk = tl.arange(0, BLOCK_K)
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        w = load_weight_tile(base, row_offs, k0, K // QK, QTYPE, QK, TS, NB, E)
        k = k0 + kk
        x = tl.load(x_rows + k[None, :] * stride_xk, mask=(k < K)[None, :], other=0.0)
        acc = tl.dot(_dot_operand(x, DOT), tl.trans(_dot_operand(w, DOT)), acc)
    out = out_ptr + m.to(tl.int64)[:, None] * stride_om + n[None, :] * stride_on
    tl.store(out, acc, mask=(m < M)[:, None] & (n < N)[None, :])


def _gemm(qtype: Type, blocks, x, out, dot: int):
    qk, ts = c.block_shape(qtype)
    M, K = x.shape
    N = blocks.shape[0]

    def grid(meta):
        return (c.cdiv(M, meta["BLOCK_M"]) * c.cdiv(N, meta["BLOCK_N"]),)

    _gemm_kernel[grid](
        blocks, x, out, M, N, K, c.next_pow2(M),
        blocks.stride(0), x.stride(0), x.stride(1), out.stride(0), out.stride(1),
        QTYPE=int(qtype), QK=qk, TS=ts, DOT=dot)
    return out


# ---------------------------------------------------------------------------------------------
# mul_mat_id: one program per (token, slot) row and BLOCK_N outputs; the expert id is read on the
# device, so nothing waits for the host (CUDA-graph capturable)

def _prune_row_configs(configs, named_args, **kwargs):
    return _prune_configs(configs, named_args, **{**kwargs, "BLOCK_M": 1})  # no tl.dot: any BLOCK_N


def _mul_mat_id_configs():
    if c.BUILT_FOR_INTERPRETER:  # the interpreter's cost is per program: few, wide ones
        return [triton.Config({"BLOCK_N": 64, "BLOCK_K": 128})]
    return _matvec_configs()


@triton.autotune(configs=_mul_mat_id_configs(), key=["N", "K", "QTYPE", "SORTED"],
                 prune_configs_by={"early_config_prune": _prune_row_configs})
@triton.heuristics(STEP_HEURISTICS)
@triton.jit
def _mul_mat_id_kernel(w_ptr, x_ptr, ids_ptr, order_ptr, out_ptr, N, K, n_used, x_slots, n_expert,
                       stride_we, stride_wn, stride_xt, stride_xu, stride_xk, stride_it, stride_iu,
                       stride_ot, stride_ou, stride_on,
                       QTYPE: tl.constexpr, QK: tl.constexpr, TS: tl.constexpr, SORTED: tl.constexpr,
                       BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, NB: tl.constexpr, E: tl.constexpr):
    """out[t, u, n] = x[t, u % x_slots] . w[ids[t, u], n] for this program's row r = (t, u) (the
    r-th of `order` when SORTED: rows of one expert run together and share its weights in cache)."""
    r = tl.program_id(0)
    if SORTED:
        r = tl.load(order_ptr + r).to(tl.int32)
    tok = r // n_used
    slot = r % n_used
    expert = tl.load(ids_ptr + tok.to(tl.int64) * stride_it + slot * stride_iu).to(tl.int64)
    # an id out of range is reported by the caller's device-side check; never read past the weights
    expert = tl.minimum(tl.maximum(expert, 0), n_expert - 1)
    pid_n = tl.program_id(1)
    n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    base = w_ptr + expert * stride_we + (pid_n * BLOCK_N).to(tl.int64) * stride_wn
    row_offs = (tl.minimum(n, N - 1) - pid_n * BLOCK_N) * stride_wn
    x_row = x_ptr + tok.to(tl.int64) * stride_xt + (slot % x_slots) * stride_xu
    y = _row_dot(base, row_offs, x_row, stride_xk, 0, K, QTYPE, QK, TS, BLOCK_N, BLOCK_K, NB, E)
    tl.store(out_ptr + tok.to(tl.int64) * stride_ot + slot * stride_ou + n * stride_on, y, mask=n < N)


SORT_ROWS_FROM = 16  # more (token, slot) rows than this are visited in expert order


def _mul_mat_id(qtype: Type, blocks, x, ids, out):
    qk, ts = c.block_shape(qtype)
    n_expert, N = blocks.shape[0], blocks.shape[1]
    n_tokens, n_used = ids.shape
    K = x.shape[2]
    n_rows = n_tokens * n_used
    sort = n_rows > SORT_ROWS_FROM
    order = torch.argsort(ids.reshape(-1), stable=True) if sort else ids  # stays on the device

    def grid(meta):
        return (n_rows, c.cdiv(N, meta["BLOCK_N"]))

    _mul_mat_id_kernel[grid](
        blocks, x, ids, order, out, N, K, n_used, x.shape[1], n_expert,
        blocks.stride(0), blocks.stride(1), x.stride(0), x.stride(1), x.stride(2), ids.stride(0), ids.stride(1),
        out.stride(0), out.stride(1), out.stride(2),
        QTYPE=int(qtype), QK=qk, TS=ts, SORTED=sort)
    return out


# ---------------------------------------------------------------------------------------------
# wrappers

def _dot_dtype(qtype: Type, x: torch.Tensor) -> int:
    """fp16 tensor-core operands, bf16 when x or the weights are bf16 (range), fp32 for bf16 under
    the interpreter (its tl.dot has no bf16)."""
    if x.dtype == torch.bfloat16 or qtype == Type.BF16:
        return DOT_F32 if c.BUILT_FOR_INTERPRETER else DOT_BF16
    return DOT_F16


def mul_mat(qtype, blocks: torch.Tensor, x: torch.Tensor, out: torch.Tensor | None = None, *,
            kernel: str | None = None, split_k: int | None = None) -> torch.Tensor:
    """out[M, N] (float32) = x[M, K] @ dequant(blocks).T, accumulated in float32.

    blocks: uint8 [N, row_bytes], N ggml rows of K values of type `qtype` (ggml's src0).
    x: float32/float16/bfloat16 [M, K]. out: optional float32 [M, N] to write into.
    kernel: "matvec" or "gemm" to force a family (default: matvec for M <= 16);
    split_k: matvec K splits (default: enough programs to fill the GPU).
    """
    qtype = c.check_qtype(qtype)
    _, K = c.check_blocks(qtype, blocks)
    c.check_tensor("x", x, c.X_DTYPES, 2)
    if x.shape[1] != K:
        raise ValueError(f"x has {x.shape[1]} columns but the {qtype.name} rows hold {K} values "
                         f"(x {tuple(x.shape)}, blocks {tuple(blocks.shape)})")
    M, N = x.shape[0], blocks.shape[0]
    if out is None:
        out = torch.empty(M, N, dtype=torch.float32, device=x.device)
    else:
        c.check_tensor("out", out, (torch.float32,), 2)
        if tuple(out.shape) != (M, N):
            raise ValueError(f"out has shape {tuple(out.shape)}; expected {(M, N)}")
    c.check_device(blocks=blocks, x=x, out=out)
    if kernel not in (None, "matvec", "gemm"):
        raise ValueError(f"kernel must be 'matvec', 'gemm' or None, got {kernel!r}")
    if split_k is not None and (not isinstance(split_k, int) or split_k < 1):
        raise ValueError(f"split_k must be a positive int, got {split_k!r}")
    if kernel == "matvec" and M > MATVEC_MAX_M:
        raise ValueError(f"the matvec kernel takes M <= {MATVEC_MAX_M}, got M={M}")
    if M == 0 or N == 0:
        return out
    dot = _dot_dtype(qtype, x)
    if kernel == "matvec" or (kernel is None and M <= MATVEC_MAX_M):
        return _matvec(qtype, blocks, x, out, dot, split_k)
    return _gemm(qtype, blocks, x, out, dot)


def mul_mat_id(qtype, blocks: torch.Tensor, x: torch.Tensor, ids: torch.Tensor,
               out: torch.Tensor | None = None, *, check_bounds: bool = True) -> torch.Tensor:
    """ggml MUL_MAT_ID: out[t, u] = x[t, u or 0] @ dequant(blocks[ids[t, u]]).T (float32).

    blocks: uint8 [n_expert, N, row_bytes]; x: [n_tokens, n_used or 1, K];
    ids: int32/int64 [n_tokens, n_used]; out: optional float32 [n_tokens, n_used, N].
    Each (token, slot) row reads its expert id on the device: no host synchronisation (CUDA
    graphs can capture it). check_bounds=True first checks that the ids lie in [0, n_expert)
    on the host (a device sync, a ValueError); False leaves that to the caller (e.g.
    `assert_ids_async`, which does not sync): out-of-range ids are clamped, never read past the
    weights.
    """
    qtype = c.check_qtype(qtype)
    _, K = c.check_blocks(qtype, blocks, ndim=3)
    c.check_tensor("x", x, c.X_DTYPES, 3)
    c.check_tensor("ids", ids, c.INDEX_DTYPES, 2)
    n_expert, N = blocks.shape[0], blocks.shape[1]
    n_tokens, n_used = ids.shape
    if x.shape[0] != n_tokens or x.shape[1] not in (1, n_used) or x.shape[2] != K:
        raise ValueError(f"x has shape {tuple(x.shape)}; expected ({n_tokens}, {n_used} or 1, {K}) "
                         f"for ids {tuple(ids.shape)} and {qtype.name} rows of {K} values")
    if out is None:
        out = torch.empty(n_tokens, n_used, N, dtype=torch.float32, device=x.device)
    else:
        c.check_tensor("out", out, (torch.float32,), 3)
        if tuple(out.shape) != (n_tokens, n_used, N):
            raise ValueError(f"out has shape {tuple(out.shape)}; expected {(n_tokens, n_used, N)}")
    c.check_device(blocks=blocks, x=x, ids=ids, out=out)
    if check_bounds:
        check_ids("ids", ids, n_expert)
    if ids.numel() == 0 or N == 0:
        return out
    return _mul_mat_id(qtype, blocks, x, ids, out)
