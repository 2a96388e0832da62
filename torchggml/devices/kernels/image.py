"""Image, audio and diffusion ops: POOL_1D/2D and POOL_2D_BACK (windows by Tensor.unfold),
UPSCALE (per-axis index maps and weight matrices reproducing ggml's float32 coordinates),
PAD_REFLECT_1D, ROLL, TIMESTEP_EMBEDDING, WIN_PART, WIN_UNPART, GET_REL_POS, ADD_REL_POS."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from ...enums import Op, OpPool, ScaleMode, ScaleFlag
from ...types import Type, is_quantized
from .table import KernelTable
from .common import view, as_float, write, all_float

KERNELS = KernelTable("image")

FLT_MAX = torch.finfo(torch.float32).max


def _float_src(node) -> bool:
    return all_float(node, 1)


# ---------------------------------------------------------------- pooling

def _padded(x: torch.Tensor, dim: int, k: int, s: int, p: int, n_out: int, fill: float) -> torch.Tensor:
    """x padded along `dim` (negative) with `fill`: p before, and after as far as n_out windows
    reach (ggml's output size can reach past the padded input when the padding was fractional)."""
    after = (n_out - 1) * s + k - x.shape[dim] - p
    widths = [0, 0] * (-dim - 1) + [p, after]
    return F.pad(x, widths, value=fill)


def _windows_1d(x, k, s, p, n_out, fill):
    """[..., W] -> windows [..., OW, K]."""
    return _padded(x, -1, k, s, p, n_out, fill).unfold(-1, k, s)[..., :n_out, :]


def _windows_2d(x, k0, k1, s0, s1, p0, p1, out0, out1, fill):
    """[..., H, W] -> windows [..., OH, OW, K1, K0]."""
    x = _padded(_padded(x, -1, k0, s0, p0, out0, fill), -2, k1, s1, p1, out1, fill)
    return x.unfold(-2, k1, s1).unfold(-2, k0, s0)[..., :out1, :out0, :, :]


def _pool_fill(op) -> float:
    """ggml's max starts at -FLT_MAX, so a padded tap holding -FLT_MAX never changes it."""
    return -FLT_MAX if op == OpPool.MAX else 0.0


def _torch_pool_fits(ins, ks, ss, ps, outs) -> bool:
    """torch's pooling computes the same windows: padding at most half the kernel and ggml's
    output size equal to torch's floor((in + 2p - k) / s) + 1 (fractional ggml padding can
    differ)."""
    return all(p <= k // 2 and (n + 2 * p - k) // s + 1 == o for n, k, s, p, o in zip(ins, ks, ss, ps, outs))


@KERNELS.register(Op.POOL_1D, supports=_float_src)
def pool_1d(node):
    """Max, or the mean of the in-range taps (padding not counted)."""
    op, k, s, p = (node.op_params[i] for i in range(4))
    x = as_float(node.src[0])
    if _torch_pool_fits([x.shape[-1]], [k], [s], [p], [node.ne[0]]):
        rows = x.reshape(-1, 1, x.shape[-1])
        y = (F.max_pool1d(rows, k, s, p).clamp_min_(-FLT_MAX) if op == OpPool.MAX
             else F.avg_pool1d(rows, k, s, p, count_include_pad=False))
        write(node, y.reshape(*x.shape[:-1], -1))
        return
    win = _windows_1d(x, k, s, p, node.ne[0], _pool_fill(op))
    if op == OpPool.MAX:
        write(node, win.amax(-1).clamp_min(-FLT_MAX))
        return
    count = _windows_1d(torch.ones(x.shape[-1], device=x.device), k, s, p, node.ne[0], 0.0).sum(-1)
    write(node, torch.where(count > 0, win.sum(-1) / count.clamp_min(1), 0.0))


@KERNELS.register(Op.POOL_2D, supports=_float_src)
def pool_2d(node):
    """Max, or the sum of the in-range taps / (k0*k1) (padding counted as zeros). torch's
    pooling where it computes the same windows, else windows by unfold."""
    op, k0, k1, s0, s1, p0, p1 = (node.op_params[i] for i in range(7))
    x = as_float(node.src[0])
    if _torch_pool_fits(x.shape[-2:], (k1, k0), (s1, s0), (p1, p0), (node.ne[1], node.ne[0])):
        args = ((k1, k0), (s1, s0), (p1, p0))
        y = (F.max_pool2d(x, *args).clamp_min_(-FLT_MAX) if op == OpPool.MAX
             else F.avg_pool2d(x, *args, count_include_pad=True))
        write(node, y)
        return
    win = _windows_2d(x, k0, k1, s0, s1, p0, p1, node.ne[0], node.ne[1], _pool_fill(op))
    if op == OpPool.MAX:
        write(node, win.amax((-2, -1)).clamp_min(-FLT_MAX))
    else:
        write(node, win.sum((-2, -1)) / (k0 * k1))


@KERNELS.register(Op.POOL_2D_BACK, supports=lambda n: n.type == Type.F32 and all_float(n, 2))
def pool_2d_back(node):
    """Each output gradient back to its window: MAX to the window's first maximum among the
    in-range taps (none when every tap is padding or -FLT_MAX), AVG spread as grad / (k0*k1)."""
    op, k0, k1, s0, s1, p0, p1 = (node.op_params[i] for i in range(7))
    grad, forward = as_float(node.src[0]), as_float(node.src[1])
    out1, out0 = grad.shape[-2], grad.shape[-1]
    h, w = forward.shape[-2], forward.shape[-1]
    # flat indices of every tap, padded positions marked -1
    index = _windows_2d(torch.arange(h * w, device=grad.device).reshape(h, w),
                        k0, k1, s0, s1, p0, p1, out0, out1, -1).reshape(out1, out0, k1 * k0)
    lead = forward.shape[:-2]
    if op == OpPool.MAX:
        values = _windows_2d(forward, k0, k1, s0, s1, p0, p1, out0, out1, -FLT_MAX).reshape(*lead, out1, out0, -1)
        first = values.argmax(-1, keepdim=True)          # torch returns the first maximum, as ggml's strict >
        best = values.gather(-1, first)
        taps = index.expand(*lead, -1, -1, -1).gather(-1, first)
        contrib = torch.where(best > -FLT_MAX, grad.unsqueeze(-1), 0.0)
    else:
        taps = index.expand(*lead, -1, -1, -1)
        contrib = (grad / (k0 * k1)).unsqueeze(-1).expand_as(taps)
    valid = taps >= 0
    flat = torch.zeros(*lead, h * w + 1, device=grad.device)
    slot = torch.where(valid, taps, h * w)               # padded taps land in a discarded slot
    flat.scatter_add_(-1, slot.reshape(*lead, -1), contrib.reshape(*lead, -1).contiguous())
    write(node, flat[..., :h * w].reshape(forward.shape))


# ---------------------------------------------------------------- upscale / interpolate

def _f32(v) -> torch.Tensor:
    return torch.tensor(v, dtype=torch.float32)


def _nearest_index(n_dst: int, n_src: int, sf: torch.Tensor, device) -> torch.Tensor:
    """ggml's source index i / sf in float32, truncated (clamped: float rounding must not step
    past the last source element)."""
    i = torch.arange(n_dst, dtype=torch.float32, device=device)
    return (i / sf.to(device)).long().clamp_(0, n_src - 1)


def _bilinear_weights(n_dst, n_src, sf, offset, device) -> torch.Tensor:
    """[n_dst, n_src]: x = (i + offset)/sf - offset; taps floor(x), floor(x) + 1 clamped to the
    source; the fraction measured from the clamped first tap and clamped to [0, 1]."""
    x = (torch.arange(n_dst, dtype=torch.float32, device=device) + offset) / sf.to(device) - offset
    x0 = torch.floor(x).long()
    x1 = (x0 + 1).clamp(0, n_src - 1)
    x0 = x0.clamp(0, n_src - 1)
    dx = (x - x0.float()).clamp(0.0, 1.0)
    rows = torch.arange(n_dst, device=device)
    m = torch.zeros(n_dst, n_src, device=device)
    m.index_put_((rows, x0), 1.0 - dx, accumulate=True)
    m.index_put_((rows, x1), dx, accumulate=True)
    return m


def _bicubic_weights(n_dst, n_src, sf, offset, device) -> torch.Tensor:
    """[n_dst, n_src]: Keys' cubic convolution (a = -0.75, as ggml and torch) over the taps
    floor(x) - 1 .. floor(x) + 2, clamped to the source."""
    a = -0.75
    x = (torch.arange(n_dst, dtype=torch.float32, device=device) + offset) / sf.to(device) - offset
    x0 = torch.floor(x)
    t = x - x0

    def near(v):     # |v| <= 1
        return ((a + 2) * v - (a + 3)) * v * v + 1

    def far(v):      # 1 < |v| < 2
        return ((a * v - 5 * a) * v + 8 * a) * v - 4 * a

    weights = (far(t + 1), near(t), near(1 - t), far(2 - t))
    rows = torch.arange(n_dst, device=device)
    m = torch.zeros(n_dst, n_src, device=device)
    for tap, w in zip(range(-1, 3), weights):
        m.index_put_((rows, (x0.long() + tap).clamp(0, n_src - 1)), w, accumulate=True)
    return m


def _antialias_weights(n_dst, n_src, sf, offset, device) -> torch.Tensor:
    """[n_dst, n_src]: bilinear with antialiasing (the triangle filter widened to 1/sf when
    downsampling, as torch's antialias=True), each row normalized to sum 1."""
    support = torch.clamp_min(1.0 / sf, 1.0).to(device)
    centre = (torch.arange(n_dst, dtype=torch.float32, device=device) + offset) / sf.to(device)
    lo = (centre - support + offset).long().clamp_min(0)
    hi = (centre + support + offset).long().clamp_max(n_src)
    s = torch.arange(n_src, dtype=torch.float32, device=device)
    w = torch.clamp_min(1.0 - ((s[None, :] - centre[:, None] + offset) * (1.0 / support)).abs(), 0.0)
    taps = s.long()[None, :]
    w = torch.where((taps >= lo[:, None]) & (taps < hi[:, None]), w, 0.0)
    total = w.sum(-1, keepdim=True)
    return torch.where(total > 0, w / torch.where(total > 0, total, 1.0), 0.0)


@KERNELS.register(Op.UPSCALE, supports=lambda n: n.type == Type.F32 and n.src[0].type == Type.F32)
def upscale(node):
    """Nearest over ne[2], ne[3]; over ne[0], ne[1] the mode's per-axis maps, at ggml's float32
    coordinates: sf = ne_dst / ne_src, pixel offset 0.5 (0 and sf = (dst - 1)/(src - 1) with
    ALIGN_CORNERS)."""
    flags = node.op_params[0]
    mode = flags & 0xFF
    src = node.src[0]
    x = as_float(src)
    device = x.device
    sf = [_f32(node.ne[i]) / _f32(src.ne[i]) for i in range(4)]
    offset = 0.5
    if flags & ScaleFlag.ALIGN_CORNERS:
        offset = 0.0
        for i in (0, 1):
            if node.ne[i] > 1 and src.ne[i] > 1:
                sf[i] = _f32(node.ne[i] - 1) / _f32(src.ne[i] - 1)
    for i in (3, 2):
        if node.ne[i] != src.ne[i]:
            x = x.index_select(3 - i, _nearest_index(node.ne[i], src.ne[i], sf[i], device))
    if mode == ScaleMode.NEAREST:
        x = x.index_select(2, _nearest_index(node.ne[1], src.ne[1], sf[1], device))
        write(node, x.index_select(3, _nearest_index(node.ne[0], src.ne[0], sf[0], device)))
        return
    if mode == ScaleMode.BICUBIC:
        weights = _bicubic_weights
    elif flags & ScaleFlag.ANTIALIAS:
        weights = _antialias_weights
    else:
        weights = _bilinear_weights
    m0 = weights(node.ne[0], src.ne[0], sf[0], offset, device)
    m1 = weights(node.ne[1], src.ne[1], sf[1], offset, device)
    write(node, torch.matmul(m1, torch.matmul(x, m0.t())))


# ---------------------------------------------------------------- padding, roll, timestep embedding

@KERNELS.register(Op.PAD_REFLECT_1D, supports=_float_src)
def pad_reflect_1d(node):
    p0, p1 = node.op_params[0], node.op_params[1]
    x = as_float(node.src[0])
    y = F.pad(x.reshape(-1, 1, x.shape[-1]), (p0, p1), mode="reflect")
    write(node, y.reshape(tuple(reversed(node.ne))))


@KERNELS.register(Op.ROLL, supports=lambda n: not is_quantized(n.type) and n.src[0].type == n.type)
def roll(node):
    """dst[i] = src[(i - shift) mod ne] in every dim (torch.roll); values of any plain type."""
    shifts = [node.op_params[i] for i in range(4)]
    view(node).copy_(torch.roll(view(node.src[0]), shifts[::-1], dims=(0, 1, 2, 3)))


@KERNELS.register(Op.TIMESTEP_EMBEDDING, supports=lambda n: n.src[0].type == Type.F32)
def timestep_embedding(node):
    """Row t: cos(t f_j) for j < dim//2, then sin(t f_j), f_j = exp(-log(max_period) j / half) in
    float32; a zero last column for an odd dim."""
    dim, max_period = node.op_params[0], node.op_params[1]
    half = dim // 2
    t = as_float(node.src[0]).reshape(-1)
    j = torch.arange(half, dtype=torch.float32, device=t.device)
    freq = torch.exp(-torch.log(_f32(float(max_period))).to(t.device) * j / half)
    arg = t[:, None] * freq[None, :]
    out = torch.zeros(t.shape[0], dim, device=t.device)
    out[:, :half] = torch.cos(arg)
    out[:, half:2 * half] = torch.sin(arg)
    write(node, out)


# ---------------------------------------------------------------- SAM: windows and relative positions

@KERNELS.register(Op.WIN_PART, supports=lambda n: n.src[0].type == Type.F32)
def win_part(node):
    """[H, W, C] zero padded to whole w x w windows -> [npy*npx, w, w, C], windows row by row."""
    npx, npy, w = node.op_params[0], node.op_params[1], node.op_params[2]
    x = as_float(node.src[0])[0]                       # [H, W, C]
    h, wd = x.shape[0], x.shape[1]
    x = F.pad(x, (0, 0, 0, npx * w - wd, 0, npy * w - h))
    x = x.reshape(npy, w, npx, w, -1).permute(0, 2, 1, 3, 4)
    write(node, x.reshape(npy * npx, w, w, -1))


@KERNELS.register(Op.WIN_UNPART, supports=lambda n: n.src[0].type == Type.F32)
def win_unpart(node):
    """Windows [n, w, w, C] back to [h0, w0, C], padding dropped."""
    w = node.op_params[0]
    w0, h0 = node.ne[1], node.ne[2]
    npx = (w0 + w - 1) // w
    x = as_float(node.src[0])                          # [n, w, w, C]
    npy = x.shape[0] // npx
    x = x.reshape(npy, npx, w, w, -1).permute(0, 2, 1, 3, 4).reshape(npy * w, npx * w, -1)
    write(node, x[:h0, :w0])


@KERNELS.register(Op.GET_REL_POS, supports=lambda n: n.src[0].type in (Type.F16, Type.BF16))
def get_rel_pos(node):
    """dst[q, k] = a[(kh - 1 - k) + q]: the embedding of the offset q - k. The 16-bit values are
    copied as they are (a BF16 source's bits land in the F16 result, as in ggml)."""
    kh, qh = node.ne[1], node.ne[2]
    a = view(node.src[0])[0, 0].view(torch.int16)      # [2*kh - 1, C]
    q = torch.arange(qh, device=a.device)[:, None]
    k = torch.arange(kh, device=a.device)[None, :]
    view(node)[0].view(torch.int16).copy_(a[(kh - 1 - k) + q])


@KERNELS.register(Op.ADD_REL_POS, supports=lambda n: n.type == Type.F32 and n.src[0].type == Type.F32)
def add_rel_pos(node):
    """a viewed as [B, H, W, kh, kw]: += ph[B, H, W, kh] along kw and pw[B, H, W, kw] along kh."""
    pw, ph = as_float(node.src[1]), as_float(node.src[2])   # [B, H, W(q), W(k)]
    x = as_float(node.src[0])
    width = pw.shape[-1]
    shaped = x.reshape(*pw.shape, width)               # [B, H, Wq, kh, kw]
    write(node, (shaped + ph[..., :, None] + pw[..., None, :]).reshape(x.shape))
