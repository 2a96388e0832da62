"""The shared pieces of recurrent and hybrid architectures, as llama.cpp builds them: the state
rows of the recurrent memory (read for the micro-batch's sequences, written back), the Mamba and
Mamba-2 mixers, the short convolution (LFM2), and the SSM hyper-parameters and tensors.

`RecurrentArch` is the base of the architectures whose memory is recurrent (or hybrid): it says
which layers are recurrent or have attention and how large their state rows are.
"""
from __future__ import annotations

from dataclasses import dataclass

from .. import ops
from ..tensor import Tensor, nelements
from .builder import Arch, GraphBuilder, LayerLoader
from .hparams import HParams, KeyReader


@dataclass
class SSMParams:
    """llama.cpp's ssm.* keys: conv_kernel, inner_size, state_size, time_step_rank (Mamba-2:
    the number of heads), group_count, dt_b_c_rms; mamba2: B and C pass through the convolution."""
    d_conv: int
    d_inner: int
    d_state: int
    dt_rank: int
    n_group: int = 1
    dt_b_c_rms: bool = False
    mamba2: bool = False

    @property
    def conv_channels(self) -> int:
        """Channels of the convolution: x, then (Mamba-2) B and C of every group."""
        return self.d_inner + 2 * self.n_group * self.d_state if self.mamba2 else self.d_inner


def read_ssm(hp: HParams, keys: KeyReader, mamba2: bool) -> None:
    get = keys.get
    n_group = get("ssm.group_count") if mamba2 else get("ssm.group_count", 1)
    hp.ssm = SSMParams(int(get("ssm.conv_kernel")), int(get("ssm.inner_size")), int(get("ssm.state_size")),
                       int(get("ssm.time_step_rank")), int(n_group), bool(get("ssm.dt_b_c_rms", False)), mamba2)


class RecurrentArch(Arch):
    """An architecture with recurrent layers. memory "recurrent": every layer recurrent, no KV
    cache; "hybrid": a KV cache on the layers with attention too."""
    memory = "recurrent"

    def is_recurrent(self, hp: HParams, il: int) -> bool:
        return True

    def has_attention(self, hp: HParams, il: int) -> bool:
        return False

    def n_embd_r(self, hp: HParams) -> int:
        """One sequence's r row: the convolution's last d_conv - 1 inputs of every channel."""
        return (hp.ssm.d_conv - 1) * hp.ssm.conv_channels

    def n_embd_s(self, hp: HParams) -> int:
        """One sequence's s row: the SSM state."""
        return hp.ssm.d_state * hp.ssm.d_inner


def per_layer(keys: KeyReader, suffix: str, n_layer: int, default: int) -> list[int]:
    """A key that may be one value or one per layer, as a list per layer."""
    value = keys.get_list(suffix)
    if isinstance(value, list):
        if len(value) != n_layer:
            from ..gguf.loader import GGUFError
            raise GGUFError(f"{keys.f.path}: {keys.arch}.{suffix} has {len(value)} entries for {n_layer} layers")
        return [int(v) for v in value]
    return [int(default)] * n_layer


class HybridArch(RecurrentArch):
    """Attention layers beside Mamba layers: a layer is recurrent when its attention.head_count_kv
    is 0 (llama.cpp's rule for jamba and granitehybrid); the KV cache holds the others."""
    memory = "hybrid"
    per_layer_keys = ("attention.head_count_kv", "feed_forward_length")
    mamba2 = True

    def read_hparams(self, hp, keys):
        read_ssm(hp, keys, self.mamba2)
        hp.layer_n_head_kv = per_layer(keys, "attention.head_count_kv", hp.n_layer, hp.n_head_kv)
        hp.layer_n_ff = per_layer(keys, "feed_forward_length", hp.n_layer, hp.n_ff)

    def is_recurrent(self, hp, il):
        return hp.layer_n_head_kv[il] == 0

    def has_attention(self, hp, il):
        return hp.layer_n_head_kv[il] > 0


def attention_no_rope(b: GraphBuilder, il: int, h: Tensor, layer) -> Tensor:
    """Attention without rotary positions (jamba, nemotron_h), scaled by attention.scale or
    1/sqrt(head_dim)."""
    q, k, v = b.qkv(h, layer)
    return b.attention(il, q, k, v, layer.attn_output, layer.attn_output_b)


# ---------------------------------------------------------------- the state rows

def read_states(b: GraphBuilder, states: Tensor) -> Tensor:
    """The rows [n_embd, n_seqs] of the micro-batch's sequences (their slots) of a state tensor."""
    return ops.get_rows(b.ctx, states, b.s_ids)


def write_states(b: GraphBuilder, states: Tensor, rows: Tensor) -> None:
    """Write the new rows [n_embd, n_seqs] (any layout) back into the sequences' slots."""
    rows = ops.reshape_2d(b.ctx, ops.cont(b.ctx, rows), states.ne[0], b.n_seqs)
    b.state_writes.append(ops.set_rows(b.ctx, states, rows, b.s_ids))


def causal_conv(b: GraphBuilder, il: int, x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
    """The depthwise causal convolution over each sequence's tokens, continuing from the
    sequence's last d_conv - 1 inputs (layer il's r state, updated here).
    x [channels, n_seq_tokens, n_seqs] -> [channels, n_seq_tokens, n_seqs] (plus bias)."""
    ctx, d_conv, channels = b.ctx, weight.ne[0], weight.ne[1]
    r = b.memory.recurrent.r[il]
    prev = ops.reshape_3d(ctx, read_states(b, r), d_conv - 1, channels, b.n_seqs)
    conv_x = ops.concat(ctx, prev, ops.transpose(ctx, x), 0)       # [d_conv - 1 + n_t, channels, n_seqs]
    last = ops.view_3d(ctx, conv_x, d_conv - 1, channels, b.n_seqs, conv_x.nb[1], conv_x.nb[2],
                       b.n_seq_tokens * conv_x.nb[0])
    write_states(b, r, last)
    out = ops.ssm_conv(ctx, conv_x, weight)
    return out if bias is None else ops.add(ctx, out, bias)


# ---------------------------------------------------------------- the gated delta rule

def l2_normed(ctx, x: Tensor, eps: float) -> Tensor:
    """llama.cpp's delta-net L2 norm: rms_norm(x, eps / n) / sqrt(n) = x / sqrt(sum(x^2) + eps)."""
    n = x.ne[0]
    return ops.scale(ctx, ops.rms_norm(ctx, x, eps / n), n ** -0.5)


def delta_rule(b: GraphBuilder, il: int, q: Tensor, k: Tensor, v: Tensor, decay: Tensor, beta: Tensor) -> Tensor:
    """The gated delta rule over layer il's s state (read for the micro-batch's sequences, the
    final one written back), q and k L2-normed here: q, k [dk, hk, nt, ns] (value head h reads key
    head h % hk), v [dv, hv, nt, ns], decay [1 or dk, hv, nt, ns] (log; a vector per key value
    with Kimi's KDA), beta [1, hv, nt, ns]. The output [dv, hv, nt, ns]."""
    ctx, eps = b.ctx, b.hp.norm_eps
    dv, hv, nt, ns = v.ne
    states = b.memory.recurrent.s[il]
    state = ops.reshape_4d(ctx, read_states(b, states), dv, dv, hv, ns)
    out = ops.gated_delta_net(ctx, l2_normed(ctx, q, eps), l2_normed(ctx, k, eps), v, decay, beta, state, 1)
    n_out = dv * hv * nt * ns
    write_states(b, states, ops.view_1d(ctx, out, states.ne[0] * ns, n_out * 4))
    return ops.view_4d(ctx, out, dv, hv, nt, ns, dv * 4, dv * hv * 4, dv * hv * nt * 4, 0)


# ---------------------------------------------------------------- RWKV's token shift

def token_shift_load(b: GraphBuilder, il: int, count: int) -> list[Tensor]:
    """Layer il's r state as `count` rows [n_embd, 1, n_seqs]: the last normed input of each
    mixer (time mix, channel mix) of the sequence's previous micro-batch."""
    ctx, e = b.ctx, b.hp.n_embd
    shift = ops.reshape_3d(ctx, read_states(b, b.memory.recurrent.r[il]), e, count, b.n_seqs)
    return [ops.view_3d(ctx, shift, e, 1, b.n_seqs, shift.nb[1], shift.nb[2], i * e * shift.nb[0])
            for i in range(count)]


def previous_tokens(b: GraphBuilder, shift: Tensor, x: Tensor) -> Tensor:
    """Each token's predecessor [n_embd, n_seq_tokens, n_seqs]: the stored row for the first."""
    if b.n_seq_tokens == 1:
        return ops.cont(b.ctx, shift)  # (a view of the r rows, strided when n_seqs > 1)
    ctx = b.ctx
    head = ops.view_3d(ctx, x, x.ne[0], b.n_seq_tokens - 1, b.n_seqs, x.nb[1], x.nb[2], 0)
    return ops.concat(ctx, shift, head, 1)


def last_token(b: GraphBuilder, x: Tensor) -> Tensor:
    return ops.view_3d(b.ctx, x, x.ne[0], 1, b.n_seqs, x.nb[1], x.nb[2], (b.n_seq_tokens - 1) * x.nb[1])


def token_shift_store(b: GraphBuilder, il: int, *xs: Tensor) -> None:
    """Keep the last token of each of xs ([n_embd, n_seq_tokens, n_seqs]) as layer il's r state."""
    rows = last_token(b, xs[0])
    for x in xs[1:]:
        rows = ops.concat(b.ctx, rows, last_token(b, x), 1)
    write_states(b, b.memory.recurrent.r[il], rows)


# ---------------------------------------------------------------- Mamba

def load_mamba(L: LayerLoader, hp: HParams) -> None:
    """attn_norm, ssm_in [n_embd, 2 d_inner], ssm_conv1d (+ bias), ssm_x, ssm_dt (+ bias), ssm_a
    [d_state, d_inner], ssm_d, ssm_out; optional ssm_dt_norm/ssm_b_norm/ssm_c_norm (Jamba)."""
    s, e = hp.ssm, hp.n_embd
    L.weight("attn_norm", [e])
    L.weight("ssm_in", [e, 2 * s.d_inner])
    L.weight("ssm_conv1d", [s.d_conv, s.d_inner])
    L.bias("ssm_conv1d", [s.d_inner], required=True)
    L.weight("ssm_x", [s.d_inner, s.dt_rank + 2 * s.d_state])
    L.weight("ssm_dt", [s.dt_rank, s.d_inner])
    L.bias("ssm_dt", [s.d_inner], required=True)
    L.weight("ssm_dt_norm", [s.dt_rank], required=False)
    L.weight("ssm_b_norm", [s.d_state], required=False)
    L.weight("ssm_c_norm", [s.d_state], required=False)
    _no_suffix(L, "ssm_a", [s.d_state, s.d_inner])
    _no_suffix(L, "ssm_d", [s.d_inner])
    L.weight("ssm_out", [s.d_inner, e])


def _no_suffix(L: LayerLoader, name: str, ne) -> None:
    """ssm_a and ssm_d are stored without the ".weight" suffix."""
    L.w.add(name, f"blk.{L.il}.{name}", ne, True, L.layer)


def mamba_mixer(b: GraphBuilder, il: int, x: Tensor, layer) -> Tensor:
    """Mamba's selective SSM block: [n_embd, n_tokens] -> [n_embd, n_tokens]."""
    ctx, s, ns, nt = b.ctx, b.hp.ssm, b.n_seqs, b.n_seq_tokens
    x = ops.reshape_3d(ctx, x, x.ne[0], nt, ns)
    xz = b.linear(x, layer.ssm_in)                                   # [2 d_inner, nt, ns]
    xs = ops.view_3d(ctx, xz, s.d_inner, nt, ns, xz.nb[1], xz.nb[2], 0)
    z = ops.view_3d(ctx, xz, s.d_inner, nt, ns, xz.nb[1], xz.nb[2], s.d_inner * xz.nb[0])
    xs = ops.silu(ctx, causal_conv(b, il, xs, layer.ssm_conv1d, layer.ssm_conv1d_b))
    x_db = b.linear(xs, layer.ssm_x)                                 # [dt_rank + 2 d_state, nt, ns]
    es = x_db.nb[0]
    dt = ops.view_3d(ctx, x_db, s.dt_rank, nt, ns, x_db.nb[1], x_db.nb[2], 0)
    B = ops.view_4d(ctx, x_db, s.d_state, 1, nt, ns, s.d_state * es, x_db.nb[1], x_db.nb[2], s.dt_rank * es)
    C = ops.view_4d(ctx, x_db, s.d_state, 1, nt, ns, s.d_state * es, x_db.nb[1], x_db.nb[2],
                    (s.dt_rank + s.d_state) * es)
    if s.dt_b_c_rms or (layer.ssm_dt_norm is not None and layer.ssm_b_norm is not None):
        dt, B, C = (b.norm(t, w) for t, w in ((dt, layer.ssm_dt_norm), (B, layer.ssm_b_norm), (C, layer.ssm_c_norm)))
    else:
        dt = ops.cont(ctx, dt)
    dt = b.linear(dt, layer.ssm_dt, layer.ssm_dt_b)                  # [d_inner, nt, ns]
    y = selective_scan(b, il, ops.reshape_4d(ctx, xs, 1, s.d_inner, nt, ns), dt, layer.ssm_a, B, C)
    y = ops.view_3d(ctx, y, s.d_inner, nt, ns, s.d_inner * 4, s.d_inner * nt * 4, 0)
    y = ops.add(ctx, y, ops.mul(ctx, xs, layer.ssm_d))
    y = ops.swiglu_split(ctx, ops.cont(ctx, z), y)
    return ops.reshape_2d(ctx, b.linear(y, layer.ssm_out), b.hp.n_embd, nt * ns)


def selective_scan(b: GraphBuilder, il: int, x: Tensor, dt: Tensor, A: Tensor, B: Tensor, C: Tensor) -> Tensor:
    """ssm_scan from layer il's s state (the sequences' slots, through ids), its final states
    written back; returns the scan's result (y first: [head_dim, n_head, n_seq_tokens, n_seqs])."""
    ctx, s = b.ctx, b.hp.ssm
    states = b.memory.recurrent.s[il]
    head_dim, n_head = x.ne[0], x.ne[1]
    all_states = ops.reshape_4d(ctx, states, s.d_state, head_dim, n_head, states.ne[1])
    out = ops.ssm_scan(ctx, all_states, x, dt, A, B, C, b.s_ids, 1)
    final = ops.view_2d(ctx, out, states.ne[0], b.n_seqs, states.ne[0] * 4, nelements(x) * 4)
    write_states(b, states, final)
    return out


# ---------------------------------------------------------------- Mamba-2

def load_mamba2(L: LayerLoader, hp: HParams, norm: bool = True) -> None:
    """ssm_in [n_embd, 2 d_inner + 2 n_group d_state + n_head] (z, xBC, dt), ssm_conv1d (+ bias)
    over xBC, ssm_dt bias, ssm_a and ssm_d [1, n_head], the grouped norm ssm_norm, ssm_out."""
    s, e = hp.ssm, hp.n_embd
    n_head = s.dt_rank
    L.weight("ssm_in", [e, s.d_inner + s.conv_channels + n_head])
    L.weight("ssm_conv1d", [s.d_conv, s.conv_channels])
    L.bias("ssm_conv1d", [s.conv_channels])
    L.bias("ssm_dt", [n_head], required=True)
    _no_suffix(L, "ssm_a", [1, n_head])
    _no_suffix(L, "ssm_d", [1, n_head])
    L.weight("ssm_norm", [s.d_inner // s.n_group, s.n_group], required=norm)
    L.weight("ssm_out", [s.d_inner, e])


def mamba2_mixer(b: GraphBuilder, il: int, x: Tensor, layer) -> Tensor:
    """Mamba-2's SSD block (scalar decay per head, B and C per group, grouped RMS norm):
    [n_embd, n_tokens] -> [n_embd, n_tokens]."""
    ctx, s, ns, nt = b.ctx, b.hp.ssm, b.n_seqs, b.n_seq_tokens
    n_head = s.dt_rank
    head_dim = s.d_inner // n_head
    zxbcdt = ops.reshape_3d(ctx, b.linear(x, layer.ssm_in), layer.ssm_in.ne[1], nt, ns)
    es = zxbcdt.nb[0]
    z = ops.view_4d(ctx, zxbcdt, head_dim, n_head, nt, ns, head_dim * es, zxbcdt.nb[1], zxbcdt.nb[2], 0)
    xbc = ops.view_3d(ctx, zxbcdt, s.conv_channels, nt, ns, zxbcdt.nb[1], zxbcdt.nb[2], s.d_inner * es)
    dt = ops.view_3d(ctx, zxbcdt, n_head, nt, ns, zxbcdt.nb[1], zxbcdt.nb[2], (s.d_inner + s.conv_channels) * es)
    xbc = ops.silu(ctx, causal_conv(b, il, xbc, layer.ssm_conv1d, layer.ssm_conv1d_b))
    es = xbc.nb[0]
    xs = ops.view_4d(ctx, xbc, head_dim, n_head, nt, ns, head_dim * es, xbc.nb[1], xbc.nb[2], 0)
    B = ops.view_4d(ctx, xbc, s.d_state, s.n_group, nt, ns, s.d_state * es, xbc.nb[1], xbc.nb[2], s.d_inner * es)
    C = ops.view_4d(ctx, xbc, s.d_state, s.n_group, nt, ns, s.d_state * es, xbc.nb[1], xbc.nb[2],
                    (s.d_inner + s.n_group * s.d_state) * es)
    dt = ops.add(ctx, ops.cont(ctx, dt), layer.ssm_dt_b)
    y = selective_scan(b, il, xs, dt, layer.ssm_a, B, C)
    y = ops.view_4d(ctx, y, head_dim, n_head, nt, ns, head_dim * 4, s.d_inner * 4, s.d_inner * nt * 4, 0)
    y = ops.add(ctx, y, ops.mul(ctx, xs, layer.ssm_d))
    y = ops.swiglu_split(ctx, ops.cont(ctx, z), y)
    if layer.ssm_norm is not None:
        y = b.norm(ops.reshape_4d(ctx, y, s.d_inner // s.n_group, s.n_group, nt, ns), layer.ssm_norm)
    y = ops.reshape_2d(ctx, y, s.d_inner, nt * ns)
    return b.linear(y, layer.ssm_out)
