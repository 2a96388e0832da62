"""The prompt's int8 GEMM over ggml's Q8_0 / Q4_0 / Q4_1 / Q5_0 / Q5_1 / Q2_K / Q3_K / Q4_K / Q5_K /
Q6_K / IQ4_NL / IQ4_XS blocks in place, and over the fused layout's rows of the other types (MXFP4,
and the experts of the in-place types),
compiled by numba (the IR of its panels and tiles: gemm_ir.py; loader.gemm_kernels() loads this
module).

    quantize_activations(x, group, zero, scale_block, xq, dx, xz, xm)
        x f32 [M, K] -> xq int8 [M, K] rounded as ggml's vec_dot types round them: per 32 values
        as Q8_0 (scale_block 32: Q8_0, Q4_0 weights), per 256 as Q8_K (256: the K-quants, as
        their matvec, so a prompt and a decode step round alike); dx f32 [M, K/scale_block]
        the scales (NaN for a block that holds an infinity or a NaN), xz int32 [M, K/group]
        minus zero times each group's sum of q, xm f32 [M, K/group] the scale times each
        group's sum of q (rows over the threads)
    panel_gemm(blocks, kind, xq, dx, xz, xm, out, panels, scales, mins)
        out[m, n] = sum_k W[n, k] x[m, k] for blocks uint8 [N, row bytes] (N a multiple of
        PANEL_ROWS); panels/scales/mins: one work area per numba thread (layouts/fused.py's
        _int8_gemm makes them)
    offset_panel_gemm(...)  the same for ggml's Q4_1 / Q5_0 / Q5_1 blocks in place
    low_k_panel_gemm(...)   the same for ggml's Q2_K / Q3_K blocks in place
    rows_block_gemm(blocks, kind, x, group, zero, scale_block, out, threads, xq, dx, xz, xm, rounded)
        quantize_activations into xq, dx, xz, xm (unless `rounded`: an earlier call rounded x
        there) and the kind's panel GEMM (any of the three above) in one call, its work areas
        made there (for up to `threads` numba threads; and the rounded rows' where xq has not
        M rows): a prompt's product bound once (layouts/fused.py's bound_int8_gemm)
    layout_panel_gemm(words, scale, bias, kind, xq, dx, xz, xm, out, panels, scales, mins)
        the same for the fused layout's rows (gemm_ir.LAYOUT_KINDS): words uint32 [N, K/4] its
        int8 q (or [N, K/8]: Q4_1's nibbles) 4 bytes a word, scale and bias f32 [N, K/G] (bias
        unread for kinds without one), panels uint32 (the tile reads their bytes)

Each thread takes PANEL_ROWS weight rows at a time: it lays them out as a panel (pack_rows) in
its work area, which stays in its cache while the tiles multiply it by every activation row.
"""
import numba
import numpy as np
from numba import njit, prange

from .gemm_ir import PANEL_ROWS, _gemm_intrinsics, gemm_isa, kind_params, tile_cols
from .llvm_ir import IQ4_NL_KIND
from .quant_kernels import round_row_q8_0, round_row_q8_k

ISA = gemm_isa() or "avx2"  # numba's cache keeps one build per target CPU, so these are constants
TILE_COLS = tile_cols(ISA)
pack_rows, tile = _gemm_intrinsics(ISA)
# the int8 layout kinds' panels hold u = q + 128 (q with its sign bit flipped), or q on AVX2
FLIP = np.uint32(0x80808080) if kind_params(32, ISA)[1] else np.uint32(0)


@njit(parallel=True, cache=True, nogil=True)
def quantize_activations(x, group, zero, scale_block, xq, dx, xz, xm):
    m_rows, k = x.shape
    sums = np.empty((m_rows, k // 16), np.int32)  # each 16 values' sum of q
    for m in prange(m_rows):
        if scale_block == 32:
            round_row_q8_0(x[m], xq[m], dx[m], sums[m])
        else:
            round_row_q8_k(x[m], xq[m], dx[m], sums[m])
        for j in range(k // group):
            total = 0
            for i in range(group * j // 16, group * (j + 1) // 16):
                total += sums[m, i]
            xm[m, j] = dx[m, j * group // scale_block] * np.float32(total)
            xz[m, j] = -zero * total


@njit(cache=True, nogil=True, inline="always")
def _pack(blocks, n0, kind, panel, scales, mins):
    for r in range(0, PANEL_ROWS, 4):
        w0, w1, w2, w3 = blocks[n0 + r], blocks[n0 + r + 1], blocks[n0 + r + 2], blocks[n0 + r + 3]
        if kind == 34:  # the IR's kind is a compile-time constant: one branch each
            pack_rows(w0, w1, w2, w3, panel, scales, mins, r, 34)
        elif kind == 18:
            pack_rows(w0, w1, w2, w3, panel, scales, mins, r, 18)
        elif kind == IQ4_NL_KIND:
            pack_rows(w0, w1, w2, w3, panel, scales, mins, r, IQ4_NL_KIND)
        elif kind == 144:
            pack_rows(w0, w1, w2, w3, panel, scales, mins, r, 144)
        elif kind == 176:
            pack_rows(w0, w1, w2, w3, panel, scales, mins, r, 176)
        elif kind == 136:
            pack_rows(w0, w1, w2, w3, panel, scales, mins, r, 136)
        else:
            pack_rows(w0, w1, w2, w3, panel, scales, mins, r, 210)


@njit(cache=True, nogil=True, inline="always")
def _tiles(kind, panel, scales, mins, xq, dx, xz, xm, out):
    """out [M, PANEL_ROWS] = the panel's rows times every activation row, TILE_COLS at a time
    (IQ4_NL's panel holds int8 values and float scales as Q8_0's: Q8_0's tile)."""
    m_rows = xq.shape[0]
    full = m_rows - m_rows % TILE_COLS
    for c in range(0, full, TILE_COLS):
        e = c + TILE_COLS
        if kind == 34 or kind == IQ4_NL_KIND:
            tile(panel, scales, mins, xq[c:e], dx[c:e], xz[c:e], xm[c:e], out[c:e], TILE_COLS, 34)
        elif kind == 18:
            tile(panel, scales, mins, xq[c:e], dx[c:e], xz[c:e], xm[c:e], out[c:e], TILE_COLS, 18)
        elif kind == 144:
            tile(panel, scales, mins, xq[c:e], dx[c:e], xz[c:e], xm[c:e], out[c:e], TILE_COLS, 144)
        elif kind == 176:
            tile(panel, scales, mins, xq[c:e], dx[c:e], xz[c:e], xm[c:e], out[c:e], TILE_COLS, 176)
        elif kind == 136:
            tile(panel, scales, mins, xq[c:e], dx[c:e], xz[c:e], xm[c:e], out[c:e], TILE_COLS, 136)
        else:
            tile(panel, scales, mins, xq[c:e], dx[c:e], xz[c:e], xm[c:e], out[c:e], TILE_COLS, 210)
    for c in range(full, m_rows):
        e = c + 1
        if kind == 34 or kind == IQ4_NL_KIND:
            tile(panel, scales, mins, xq[c:e], dx[c:e], xz[c:e], xm[c:e], out[c:e], 1, 34)
        elif kind == 18:
            tile(panel, scales, mins, xq[c:e], dx[c:e], xz[c:e], xm[c:e], out[c:e], 1, 18)
        elif kind == 144:
            tile(panel, scales, mins, xq[c:e], dx[c:e], xz[c:e], xm[c:e], out[c:e], 1, 144)
        elif kind == 176:
            tile(panel, scales, mins, xq[c:e], dx[c:e], xz[c:e], xm[c:e], out[c:e], 1, 176)
        elif kind == 136:
            tile(panel, scales, mins, xq[c:e], dx[c:e], xz[c:e], xm[c:e], out[c:e], 1, 136)
        else:
            tile(panel, scales, mins, xq[c:e], dx[c:e], xz[c:e], xm[c:e], out[c:e], 1, 210)


@njit(parallel=True, cache=True, nogil=True)
def panel_gemm(blocks, kind, xq, dx, xz, xm, out, panels, scales, mins):
    for p in prange(blocks.shape[0] // PANEL_ROWS):
        t = numba.get_thread_id()
        n0 = p * PANEL_ROWS
        _pack(blocks, n0, kind, panels[t], scales[t], mins[t])
        _tiles(kind, panels[t], scales[t], mins[t], xq, dx, xz, xm, out[:, n0:n0 + PANEL_ROWS])


@njit(cache=True, nogil=True, inline="always")
def _offset_pack(blocks, n0, kind, panel, scales, mins):
    for r in range(0, PANEL_ROWS, 4):
        w0, w1, w2, w3 = blocks[n0 + r], blocks[n0 + r + 1], blocks[n0 + r + 2], blocks[n0 + r + 3]
        if kind == 20:
            pack_rows(w0, w1, w2, w3, panel, scales, mins, r, 20)
        elif kind == 22:
            pack_rows(w0, w1, w2, w3, panel, scales, mins, r, 22)
        else:
            pack_rows(w0, w1, w2, w3, panel, scales, mins, r, 24)


@njit(cache=True, nogil=True, inline="always")
def _offset_tiles(kind, panel, scales, mins, xq, dx, xz, xm, out):
    """_tiles for the offset kinds."""
    m_rows = xq.shape[0]
    full = m_rows - m_rows % TILE_COLS
    for c in range(0, full, TILE_COLS):
        e = c + TILE_COLS
        if kind == 20:
            tile(panel, scales, mins, xq[c:e], dx[c:e], xz[c:e], xm[c:e], out[c:e], TILE_COLS, 20)
        elif kind == 22:
            tile(panel, scales, mins, xq[c:e], dx[c:e], xz[c:e], xm[c:e], out[c:e], TILE_COLS, 22)
        else:
            tile(panel, scales, mins, xq[c:e], dx[c:e], xz[c:e], xm[c:e], out[c:e], TILE_COLS, 24)
    for c in range(full, m_rows):
        e = c + 1
        if kind == 20:
            tile(panel, scales, mins, xq[c:e], dx[c:e], xz[c:e], xm[c:e], out[c:e], 1, 20)
        elif kind == 22:
            tile(panel, scales, mins, xq[c:e], dx[c:e], xz[c:e], xm[c:e], out[c:e], 1, 22)
        else:
            tile(panel, scales, mins, xq[c:e], dx[c:e], xz[c:e], xm[c:e], out[c:e], 1, 24)


@njit(parallel=True, cache=True, nogil=True)
def offset_panel_gemm(blocks, kind, xq, dx, xz, xm, out, panels, scales, mins):
    """panel_gemm for ggml's Q4_1 (kind 20), Q5_0 (22) and Q5_1 (24) blocks in place."""
    for p in prange(blocks.shape[0] // PANEL_ROWS):
        t = numba.get_thread_id()
        n0 = p * PANEL_ROWS
        _offset_pack(blocks, n0, kind, panels[t], scales[t], mins[t])
        _offset_tiles(kind, panels[t], scales[t], mins[t], xq, dx, xz, xm, out[:, n0:n0 + PANEL_ROWS])


@njit(cache=True, nogil=True, inline="always")
def _low_k_pack(blocks, n0, kind, panel, scales, mins):
    for r in range(0, PANEL_ROWS, 4):
        w0, w1, w2, w3 = blocks[n0 + r], blocks[n0 + r + 1], blocks[n0 + r + 2], blocks[n0 + r + 3]
        if kind == 84:
            pack_rows(w0, w1, w2, w3, panel, scales, mins, r, 84)
        else:
            pack_rows(w0, w1, w2, w3, panel, scales, mins, r, 110)


@njit(cache=True, nogil=True, inline="always")
def _low_k_tiles(kind, panel, scales, mins, xq, dx, xz, xm, out):
    """_tiles for the low K-quants."""
    m_rows = xq.shape[0]
    full = m_rows - m_rows % TILE_COLS
    for c in range(0, full, TILE_COLS):
        e = c + TILE_COLS
        if kind == 84:
            tile(panel, scales, mins, xq[c:e], dx[c:e], xz[c:e], xm[c:e], out[c:e], TILE_COLS, 84)
        else:
            tile(panel, scales, mins, xq[c:e], dx[c:e], xz[c:e], xm[c:e], out[c:e], TILE_COLS, 110)
    for c in range(full, m_rows):
        e = c + 1
        if kind == 84:
            tile(panel, scales, mins, xq[c:e], dx[c:e], xz[c:e], xm[c:e], out[c:e], 1, 84)
        else:
            tile(panel, scales, mins, xq[c:e], dx[c:e], xz[c:e], xm[c:e], out[c:e], 1, 110)


@njit(parallel=True, cache=True, nogil=True)
def low_k_panel_gemm(blocks, kind, xq, dx, xz, xm, out, panels, scales, mins):
    """panel_gemm for ggml's Q2_K (kind 84) and Q3_K (110) blocks in place."""
    for p in prange(blocks.shape[0] // PANEL_ROWS):
        t = numba.get_thread_id()
        n0 = p * PANEL_ROWS
        _low_k_pack(blocks, n0, kind, panels[t], scales[t], mins[t])
        _low_k_tiles(kind, panels[t], scales[t], mins[t], xq, dx, xz, xm, out[:, n0:n0 + PANEL_ROWS])


@njit(cache=True, nogil=True)
def rows_block_gemm(blocks, kind, x, group, zero, scale_block, out, threads, xq, dx, xz, xm, rounded):
    m_rows, k = x.shape
    if xq.shape[0] != m_rows:  # no rounded rows' areas given: this call's own
        xq, dx = np.empty((m_rows, k), np.int8), np.empty((m_rows, k // scale_block), np.float32)
        xz, xm = np.empty((m_rows, k // group), np.int32), np.empty((m_rows, k // group), np.float32)
    if not rounded:
        quantize_activations(x, group, zero, scale_block, xq, dx, xz, xm)
    panels = np.empty((threads, k * PANEL_ROWS // 4), np.uint32).view(np.uint8)
    scales = np.empty((threads, (k // 16 + k // 32) * PANEL_ROWS), np.float32)  # Q2_K's, Q3_K's d per 32
    mins = np.empty((threads, k // 16 * PANEL_ROWS), np.float32)
    if kind == 84 or kind == 110:
        low_k_panel_gemm(blocks, kind, xq, dx, xz, xm, out, panels, scales, mins)
    elif kind == 20 or kind == 22 or kind == 24:
        offset_panel_gemm(blocks, kind, xq, dx, xz, xm, out, panels, scales, mins)
    else:
        panel_gemm(blocks, kind, xq, dx, xz, xm, out, panels, scales, mins)


@njit(cache=True, nogil=True, inline="always")
def _pack_layout(words, scale, bias, n0, kind, panel, scales, mins):
    """A panel of the fused layout's rows n0..n0+PANEL_ROWS-1 (panel uint32 [K/4 * PANEL_ROWS]):
    quad i of row r (4 values, one word) at panel[i * PANEL_ROWS + r], group j's scale and bias
    at [j * PANEL_ROWS + r]. Q4_1's byte b of a group holds values b (low nibble) and b + 16."""
    for r in range(PANEL_ROWS):
        w = words[n0 + r]
        if kind == 4:
            for j in range(w.shape[0] // 4):
                for t in range(4):
                    word = w[4 * j + t]
                    panel[(8 * j + t) * PANEL_ROWS + r] = word & np.uint32(0x0F0F0F0F)
                    panel[(8 * j + 4 + t) * PANEL_ROWS + r] = (word >> np.uint32(4)) & np.uint32(0x0F0F0F0F)
        else:
            for i in range(w.shape[0]):
                panel[i * PANEL_ROWS + r] = w[i] ^ FLIP
        for j in range(scale.shape[1]):
            scales[j * PANEL_ROWS + r] = scale[n0 + r, j]
            if kind == 33 or kind == 17 or kind == 4:
                mins[j * PANEL_ROWS + r] = bias[n0 + r, j]


@njit(cache=True, nogil=True, inline="always")
def _layout_tiles(kind, panel, scales, mins, xq, dx, xz, xm, out):
    """_tiles for the layout kinds."""
    m_rows = xq.shape[0]
    full = m_rows - m_rows % TILE_COLS
    for c in range(0, full, TILE_COLS):
        e = c + TILE_COLS
        if kind == 32:
            tile(panel, scales, mins, xq[c:e], dx[c:e], xz[c:e], xm[c:e], out[c:e], TILE_COLS, 32)
        elif kind == 33:
            tile(panel, scales, mins, xq[c:e], dx[c:e], xz[c:e], xm[c:e], out[c:e], TILE_COLS, 33)
        elif kind == 16:
            tile(panel, scales, mins, xq[c:e], dx[c:e], xz[c:e], xm[c:e], out[c:e], TILE_COLS, 16)
        elif kind == 17:
            tile(panel, scales, mins, xq[c:e], dx[c:e], xz[c:e], xm[c:e], out[c:e], TILE_COLS, 17)
        else:
            tile(panel, scales, mins, xq[c:e], dx[c:e], xz[c:e], xm[c:e], out[c:e], TILE_COLS, 4)
    for c in range(full, m_rows):
        e = c + 1
        if kind == 32:
            tile(panel, scales, mins, xq[c:e], dx[c:e], xz[c:e], xm[c:e], out[c:e], 1, 32)
        elif kind == 33:
            tile(panel, scales, mins, xq[c:e], dx[c:e], xz[c:e], xm[c:e], out[c:e], 1, 33)
        elif kind == 16:
            tile(panel, scales, mins, xq[c:e], dx[c:e], xz[c:e], xm[c:e], out[c:e], 1, 16)
        elif kind == 17:
            tile(panel, scales, mins, xq[c:e], dx[c:e], xz[c:e], xm[c:e], out[c:e], 1, 17)
        else:
            tile(panel, scales, mins, xq[c:e], dx[c:e], xz[c:e], xm[c:e], out[c:e], 1, 4)


@njit(parallel=True, cache=True, nogil=True)
def layout_panel_gemm(words, scale, bias, kind, xq, dx, xz, xm, out, panels, scales, mins):
    for p in prange(words.shape[0] // PANEL_ROWS):
        t = numba.get_thread_id()
        n0 = p * PANEL_ROWS
        _pack_layout(words, scale, bias, n0, kind, panels[t], scales[t], mins[t])
        _layout_tiles(kind, panels[t], scales[t], mins[t], xq, dx, xz, xm, out[:, n0:n0 + PANEL_ROWS])
