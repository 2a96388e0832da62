"""The llama-family graph: llama (and mistral-style llama), qwen2 and qwen3.

One decoder, read top to bottom: token embeddings -> n_layer x (RMS norm, attention with
rotary positions and a KV cache, residual, RMS norm, SwiGLU feed-forward, residual) ->
RMS norm -> output projection. The architectures differ in small ways:

- llama / mistral: rotary embedding on adjacent pairs (RopeType.NORMAL);
- qwen2: q/k/v biases, NeoX rotary embedding (the two halves of each head rotate together);
- qwen3: per-head RMS norms of q and k before the rotation, NeoX rotary embedding, and an
  output projection tied to the token embeddings.

Optional tensors (biases, q/k norms, output.weight) are used whenever the file has them, as
llama.cpp does; ARCHS only says what differs in the math.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

from .. import ops
from ..context import new_tensor_1d, new_tensor_2d
from ..enums import RopeType
from ..graph import CGraph, new_graph_custom, build_forward_expand
from ..gguf import GGUFFile, GGUFError
from ..tensor import Tensor, set_name, set_input, set_output
from ..types import Type
from .kv_cache import KVCache


@dataclass(frozen=True)
class ArchFlags:
    rope_type: int
    tied_output_default: bool = False  # only a hint for the demo writer; loading checks the file


ARCHS = {
    "llama": ArchFlags(RopeType.NORMAL),
    "mistral": ArchFlags(RopeType.NORMAL),
    "qwen2": ArchFlags(RopeType.NEOX),
    "qwen3": ArchFlags(RopeType.NEOX, tied_output_default=True),
}


# ---------------------------------------------------------------- hyper-parameters

@dataclass
class HParams:
    arch: str
    n_vocab: int
    n_ctx_train: int
    n_embd: int
    n_layer: int
    n_head: int
    n_head_kv: int
    n_ff: int
    head_dim_k: int
    head_dim_v: int
    n_rot: int
    rms_eps: float
    rope_freq_base: float
    rope_freq_scale: float
    rope_type: int

    @property
    def n_embd_k_gqa(self) -> int:
        return self.head_dim_k * self.n_head_kv

    @property
    def n_embd_v_gqa(self) -> int:
        return self.head_dim_v * self.n_head_kv

    @classmethod
    def from_gguf(cls, f: GGUFFile) -> "HParams":
        arch = f.arch
        if arch not in ARCHS:
            raise GGUFError(f"{f.path}: architecture {arch!r} is not supported "
                            f"(supported: {', '.join(sorted(ARCHS))})")

        def get(suffix, default=...):
            value = f.arch_get(suffix) if default is ... else f.arch_get(suffix, default)
            if isinstance(value, list):  # per-layer values: only uniform ones are supported
                if not value or any(v != value[0] for v in value):
                    raise GGUFError(f"{f.path}: {arch}.{suffix} varies per layer ({value}); not supported")
                value = value[0]
            return value

        n_embd = int(get("embedding_length"))
        n_head = int(get("attention.head_count"))
        head_dim_k = int(get("attention.key_length", n_embd // n_head))
        embd = f.tensor_info("token_embd.weight")
        scaling = str(get("rope.scaling.type", "none"))
        factor = float(get("rope.scaling.factor", 0.0) or 0.0)
        if scaling not in ("none", "linear") and factor not in (0.0, 1.0):
            raise GGUFError(f"{f.path}: rope scaling {scaling!r} is not supported (only linear)")
        return cls(
            arch=arch,
            n_vocab=int(embd.ne[1]),
            n_ctx_train=int(get("context_length")),
            n_embd=n_embd,
            n_layer=int(get("block_count")),
            n_head=n_head,
            n_head_kv=int(get("attention.head_count_kv", n_head)),
            n_ff=int(get("feed_forward_length")),
            head_dim_k=head_dim_k,
            head_dim_v=int(get("attention.value_length", n_embd // n_head)),
            n_rot=int(get("rope.dimension_count", head_dim_k)),
            rms_eps=float(get("attention.layer_norm_rms_epsilon")),
            rope_freq_base=float(get("rope.freq_base", 10000.0)),
            rope_freq_scale=1.0 / factor if factor > 0 else 1.0,
            rope_type=int(ARCHS[arch].rope_type),
        )


# ---------------------------------------------------------------- weights

@dataclass
class LayerWeights:
    attn_norm: Tensor
    wq: Tensor
    wk: Tensor
    wv: Tensor
    wo: Tensor
    ffn_norm: Tensor
    ffn_gate: Tensor
    ffn_up: Tensor
    ffn_down: Tensor
    bq: Tensor | None = None
    bk: Tensor | None = None
    bv: Tensor | None = None
    bo: Tensor | None = None
    q_norm: Tensor | None = None
    k_norm: Tensor | None = None


@dataclass
class LlamaWeights:
    tok_embd: Tensor
    output_norm: Tensor
    output: Tensor  # token_embd when the file ties them
    layers: list[LayerWeights] = field(default_factory=list)
    rope_freqs: Tensor | None = None  # per-pair frequency divisors (Llama 3.1's long-context rope)

    @classmethod
    def from_tensors(cls, hp: HParams, tensors: dict, path: str = "model") -> "LlamaWeights":
        """Pick the weights out of `tensors` (name -> Tensor) and check their shapes."""
        def get(name, ne, required=True):
            t = tensors.get(name)
            if t is None:
                if required:
                    raise GGUFError(f"{path}: tensor {name!r} is missing")
                return None
            if list(t.ne[:len(ne)]) != list(ne) or any(n != 1 for n in t.ne[len(ne):]):
                raise GGUFError(f"{path}: tensor {name!r} has shape {t.ne[:len(ne)]}, expected {list(ne)}")
            return t

        e, q, k, v, ff = hp.n_embd, hp.head_dim_k * hp.n_head, hp.n_embd_k_gqa, hp.n_embd_v_gqa, hp.n_ff
        tok_embd = get("token_embd.weight", [e, hp.n_vocab])
        output = get("output.weight", [e, hp.n_vocab], required=False)
        w = cls(tok_embd=tok_embd, output_norm=get("output_norm.weight", [e]),
                output=tok_embd if output is None else output,
                rope_freqs=get("rope_freqs.weight", [hp.n_rot // 2], required=False))
        for il in range(hp.n_layer):
            def g(name, ne, required=True):
                return get(f"blk.{il}.{name}", ne, required)
            w.layers.append(LayerWeights(
                attn_norm=g("attn_norm.weight", [e]),
                wq=g("attn_q.weight", [e, q]), wk=g("attn_k.weight", [e, k]), wv=g("attn_v.weight", [e, v]),
                wo=g("attn_output.weight", [hp.head_dim_v * hp.n_head, e]),
                ffn_norm=g("ffn_norm.weight", [e]),
                ffn_gate=g("ffn_gate.weight", [e, ff]), ffn_up=g("ffn_up.weight", [e, ff]),
                ffn_down=g("ffn_down.weight", [ff, e]),
                bq=g("attn_q.bias", [q], False), bk=g("attn_k.bias", [k], False),
                bv=g("attn_v.bias", [v], False), bo=g("attn_output.bias", [e], False),
                q_norm=g("attn_q_norm.weight", [hp.head_dim_k], False),
                k_norm=g("attn_k_norm.weight", [hp.head_dim_k], False),
            ))
        return w


_LAYER_RE = re.compile(r"^blk\.(\d+)\.")


def tensor_layer(name: str) -> int | None:
    """The layer a weight belongs to ("blk.3.attn_q.weight" -> 3), None for the others."""
    m = _LAYER_RE.match(name)
    return int(m.group(1)) if m else None


# ---------------------------------------------------------------- the graph

@dataclass
class LlamaGraph:
    graph: CGraph
    tokens: Tensor     # I32 [n_tokens]
    positions: Tensor  # I32 [n_tokens]
    kv_idx: Tensor     # I64 [n_tokens]: the cache cell of each token
    mask: Tensor       # F16 [n_kv, n_tokens]: 0 where a token may attend to a cell, -inf elsewhere
    logits: Tensor     # F32 [n_vocab, n_tokens]
    n_tokens: int
    n_kv: int


def graph_size(hp: HParams) -> int:
    return max(1024, 64 * hp.n_layer + 256)


def build_graph(ctx, hp: HParams, w: LlamaWeights, kv: KVCache, n_tokens: int, n_kv: int,
                flash_attn: bool = False) -> LlamaGraph:
    """The forward graph of one micro-batch of n_tokens that attends to the first n_kv cells."""
    def new_input(type, *ne, name):
        t = (new_tensor_1d if len(ne) == 1 else new_tensor_2d)(ctx, type, *ne)
        set_name(t, name)
        set_input(t)
        return t

    tokens = new_input(Type.I32, n_tokens, name="inp_tokens")
    positions = new_input(Type.I32, n_tokens, name="inp_pos")
    kv_idx = new_input(Type.I64, n_tokens, name="inp_kv_idx")
    mask = new_input(Type.F16, n_kv, n_tokens, name="inp_kq_mask")

    def rms_norm(x, weight):
        return ops.mul(ctx, ops.rms_norm(ctx, x, hp.rms_eps), weight)

    def linear(x, weight, bias=None):
        y = ops.mul_mat(ctx, weight, x)
        return y if bias is None else ops.add(ctx, y, bias)

    def rope(x):
        return ops.rope_ext(ctx, x, positions, w.rope_freqs, hp.n_rot, hp.rope_type, hp.n_ctx_train,
                            hp.rope_freq_base, hp.rope_freq_scale, 0.0, 1.0, 32.0, 1.0)

    def attention(il, q, k, v):
        """q [head_dim, n_head, n_tokens], k/v [head_dim, n_head_kv, n_tokens] -> [n_embd_v, n_tokens]."""
        k_cells, v_cells = kv.store(ctx, il, k, v, kv_idx, n_kv)  # [head_dim, n_kv, n_head_kv]
        q = ops.permute(ctx, q, 0, 2, 1, 3)                          # [head_dim, n_tokens, n_head]
        scale = 1.0 / math.sqrt(hp.head_dim_k)
        if flash_attn:
            out = ops.flash_attn_ext(ctx, q, k_cells, v_cells, mask, scale, 0.0, 0.0)  # [hd, n_head, n_tokens]
            return ops.reshape_2d(ctx, out, hp.head_dim_v * hp.n_head, n_tokens)
        kq = ops.mul_mat(ctx, k_cells, q)                            # [n_kv, n_tokens, n_head]
        kq = ops.soft_max_ext(ctx, kq, mask, scale, 0.0)
        v_t = ops.cont(ctx, ops.permute(ctx, v_cells, 1, 0, 2, 3))   # [n_kv, head_dim, n_head_kv]
        out = ops.mul_mat(ctx, v_t, kq)                              # [head_dim, n_tokens, n_head]
        out = ops.permute(ctx, out, 0, 2, 1, 3)                      # [head_dim, n_head, n_tokens]
        return ops.cont_2d(ctx, out, hp.head_dim_v * hp.n_head, n_tokens)

    x = ops.get_rows(ctx, w.tok_embd, tokens)                        # [n_embd, n_tokens]
    for il, layer in enumerate(w.layers):
        h = rms_norm(x, layer.attn_norm)
        q = ops.reshape_3d(ctx, linear(h, layer.wq, layer.bq), hp.head_dim_k, hp.n_head, n_tokens)
        k = ops.reshape_3d(ctx, linear(h, layer.wk, layer.bk), hp.head_dim_k, hp.n_head_kv, n_tokens)
        v = ops.reshape_3d(ctx, linear(h, layer.wv, layer.bv), hp.head_dim_v, hp.n_head_kv, n_tokens)
        if layer.q_norm is not None:
            q = rms_norm(q, layer.q_norm)
        if layer.k_norm is not None:
            k = rms_norm(k, layer.k_norm)
        q, k = rope(q), rope(k)
        x = ops.add(ctx, x, linear(attention(il, q, k, v), layer.wo, layer.bo))

        h = rms_norm(x, layer.ffn_norm)
        h = ops.swiglu_split(ctx, linear(h, layer.ffn_gate), linear(h, layer.ffn_up))
        x = ops.add(ctx, x, linear(h, layer.ffn_down))
        set_name(x, f"l_out-{il}")

    logits = linear(rms_norm(x, w.output_norm), w.output)            # [n_vocab, n_tokens]
    set_name(logits, "result_output")
    set_output(logits)
    graph = new_graph_custom(ctx, graph_size(hp))
    build_forward_expand(graph, logits)
    return LlamaGraph(graph, tokens, positions, kv_idx, mask, logits, n_tokens, n_kv)
