"""dequantize and get_rows: ggml rows of blocks -> float rows."""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from . import _common as c
from .decode import dequant_block


@triton.jit
def _round_to_bf16(v):
    """float32 -> bfloat16, round to nearest even, done on the bits (the interpreter's own cast
    truncates)."""
    u = v.to(tl.uint32, bitcast=True)
    rounded = (u + 0x7FFF + ((u >> 16) & 1)) >> 16
    is_nan = (u & 0x7FFFFFFF) > 0x7F800000
    bits = tl.where(is_nan, (u >> 16) | 0x40, rounded)  # NaN stays a (quiet) NaN
    return bits.to(tl.uint16).to(tl.bfloat16, bitcast=True)


def _configs():
    if c.BUILT_FOR_INTERPRETER:  # small tiles, one config: the interpreter cannot benchmark
        return [triton.Config({"BLOCK_ROWS": 4, "BLOCK_K": 64})]
    return [
        triton.Config({"BLOCK_ROWS": rows, "BLOCK_K": k}, num_warps=warps)
        for rows, k, warps in [(1, 1024, 4), (4, 256, 4), (8, 256, 4), (4, 512, 4), (16, 256, 8), (8, 512, 8)]
    ]


def _blocks_per_tile(args):
    # a tile covers whole blocks: at least one, however large the block
    return max(args["BLOCK_K"] // args["QK"], 1)


@triton.autotune(configs=_configs(), key=["n_blocks", "QTYPE", "HAS_IDS"])
@triton.heuristics({"NB": _blocks_per_tile})
@triton.jit
def _dequantize_rows_kernel(src, ids, out, n_rows, n_src_rows, n_blocks, stride_src, stride_out,
                            QTYPE: tl.constexpr, QK: tl.constexpr, TS: tl.constexpr,
                            HAS_IDS: tl.constexpr, BLOCK_ROWS: tl.constexpr, BLOCK_K: tl.constexpr,
                            NB: tl.constexpr):
    """out[r, :] = decode(src row ids[r] (or r)) for a tile of rows x NB blocks."""
    r = tl.program_id(0) * BLOCK_ROWS + tl.arange(0, BLOCK_ROWS)
    row_ok = r < n_rows
    r = tl.minimum(r, n_rows - 1)
    if HAS_IDS:  # an id out of range is the caller's to report; never read outside src
        src_row = tl.minimum(tl.maximum(tl.load(ids + r).to(tl.int64), 0), n_src_rows - 1)
    else:
        src_row = r.to(tl.int64)
    b = tl.program_id(1) * NB + tl.arange(0, NB)
    block_ok = b < n_blocks
    b = tl.minimum(b, n_blocks - 1)
    blk = (src + src_row * stride_src)[:, None, None] + (b * TS)[None, :, None]
    w = dequant_block(blk, 0, QTYPE, QK)
    dst = out + r.to(tl.int64)[:, None, None] * stride_out + (b * QK)[None, :, None] \
        + tl.arange(0, QK)[None, None, :]
    mask = row_ok[:, None, None] & block_ok[None, :, None]
    if out.dtype.element_ty == tl.bfloat16:
        w = _round_to_bf16(w)
    tl.store(dst, w.to(out.dtype.element_ty), mask=mask)


def _launch(qtype, blocks: torch.Tensor, ids, out: torch.Tensor) -> torch.Tensor:
    qk, ts = c.block_shape(qtype)
    n_blocks = blocks.shape[1] // ts
    n_rows = out.shape[0]
    if n_rows == 0:
        return out

    def grid(meta):
        return (c.cdiv(n_rows, meta["BLOCK_ROWS"]), c.cdiv(n_blocks, meta["NB"]))

    _dequantize_rows_kernel[grid](
        blocks, ids if ids is not None else blocks, out, n_rows, blocks.shape[0], n_blocks,
        blocks.stride(0), out.stride(0),
        QTYPE=int(qtype), QK=qk, TS=ts, HAS_IDS=ids is not None)
    return out


def _check_out_dtype(dtype) -> None:
    if dtype not in c.OUT_DTYPES:
        raise TypeError(f"dtype {dtype} not supported; expected one of {', '.join(map(str, c.OUT_DTYPES))}")


def dequantize(qtype, blocks: torch.Tensor, dtype: torch.dtype = torch.float16) -> torch.Tensor:
    """Decode ggml rows: `blocks` uint8 [n_rows, row_bytes] -> `dtype` [n_rows, n_cols]."""
    qtype = c.check_qtype(qtype)
    _, n_cols = c.check_blocks(qtype, blocks)
    _check_out_dtype(dtype)
    c.check_device(blocks=blocks)
    out = torch.empty(blocks.shape[0], n_cols, dtype=dtype, device=blocks.device)
    return _launch(qtype, blocks, None, out)


def check_ids(name: str, ids: torch.Tensor, limit: int) -> None:
    """Every id in [0, limit): a device sync, but an out-of-range id would read foreign memory."""
    if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= limit):
        raise ValueError(f"{name} must lie in [0, {limit}); got values in "
                         f"[{int(ids.min())}, {int(ids.max())}]")


def assert_ids_async(name: str, ids: torch.Tensor, limit: int) -> None:
    """Every id in [0, limit), checked on the device without a host sync, so it works inside
    a CUDA graph capture (torch._assert_async): on the CPU (and the SIM devices) it raises a
    RuntimeError at once; on a GPU a bad id fails the next synchronisation with a device-side
    assert. The kernels clamp ids as well, so a bad id never reads outside the weights."""
    if ids.numel():
        torch._assert_async(((ids >= 0) & (ids < limit)).all(), f"{name} must lie in [0, {limit})")


def get_rows(qtype, blocks: torch.Tensor, ids: torch.Tensor, dtype: torch.dtype = torch.float32,
             *, check_bounds: bool = True) -> torch.Tensor:
    """Rows `ids` (int32/int64, 1-D) of ggml rows `blocks`, decoded -> `dtype` [len(ids), n_cols].

    check_bounds=False skips the host-side range check of `ids` (it syncs the device; CUDA graph
    capture needs it off: use `assert_ids_async`); out-of-range ids are clamped in the kernel."""
    qtype = c.check_qtype(qtype)
    _, n_cols = c.check_blocks(qtype, blocks)
    c.check_tensor("ids", ids, c.INDEX_DTYPES, 1)
    _check_out_dtype(dtype)
    c.check_device(blocks=blocks, ids=ids)
    if check_bounds:
        check_ids("ids", ids, blocks.shape[0])
    out = torch.empty(ids.shape[0], n_cols, dtype=dtype, device=blocks.device)
    return _launch(qtype, blocks, ids.contiguous(), out)
