"""The shared pieces of every architecture's graph, written once: inputs, norms, projections,
rotary embedding, attention over the KV cache (with sliding windows, soft-capping, sinks),
gated feed-forward and mixture-of-experts feed-forward, the output head, and the selection of the
tokens whose logits are wanted (`GraphBuilder.output_rows`, llama.cpp's inp_out_ids).

An architecture (models/archs/*.py) is an `Arch` subclass: the keys it reads, the tensors it
loads and a `build` method that strings these pieces together, as llama.cpp's src/models do.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

import torch

from .. import ops
from ..backend.tensor_io import BoundIO
from ..context import new_tensor_1d, new_tensor_2d, new_tensor_3d
from ..gguf.loader import GGUFError
from ..graph import CGraph, new_graph_custom, build_forward_expand
from ..tensor import Tensor, set_name, set_input, set_output
from ..enums import Op
from ..types import Type
from .hparams import HParams, KeyReader
from .kv_cache import KVCache, relative_position_buckets


# ---------------------------------------------------------------- weights

class Layer(dict):
    """One layer's tensors by llama.cpp name ("attn_q", "attn_q_b" for the bias...); a tensor the
    file does not have reads as None."""
    __getattr__ = dict.get

    def __missing__(self, key):
        return None


class Weights:
    """The model's tensors by llama.cpp name, shape-checked: token_embd, output_norm, output
    (token_embd when the file ties them), rope factors, and `layers`."""

    def __init__(self, tensors: dict, path: str, arch: "Arch | None" = None):
        self.tensors, self.path, self.arch = tensors, path, arch
        self.layers: list[Layer] = []
        self.globals = Layer()
        self.used: set[str] = set()  # the names the architecture asked for (check_all_used)

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return self.__dict__["globals"].get(name)

    def get(self, name: str, ne, required: bool = True) -> Tensor | None:
        t = self.tensors.get(name)
        if t is None:
            if required:
                raise GGUFError(f"{self.path}: tensor {name!r} is missing")
            return None
        if list(t.ne[:len(ne)]) != [int(n) for n in ne] or any(n != 1 for n in t.ne[len(ne):]):
            raise GGUFError(f"{self.path}: tensor {name!r} has shape {list(t.ne)}, expected {list(ne)}")
        self.used.add(name)
        return t

    def check_all_used(self) -> None:
        """As llama.cpp's loader ("wrong number of tensors"): every tensor of the file must be
        one the architecture reads. A renamed tensor (output.weight under another name would
        silently tie the head to token_embd) or an extra one is refused, naming them."""
        unused = [n for n in self.tensors if n not in self.used]
        if unused:
            shown = ", ".join(repr(n) for n in unused[:5]) + (" ..." if len(unused) > 5 else "")
            raise GGUFError(f"{self.path}: wrong number of tensors: the file has {len(self.tensors)}, the "
                            f"architecture reads {len(self.used)}; not read: {shown} (renamed or extra tensors)")

    def add(self, key: str, name: str, ne, required: bool = True, layer: Layer | None = None) -> Tensor | None:
        t = self.get(name, ne, required)
        (self.globals if layer is None else layer)[key] = t
        return t


class LayerLoader:
    """Adds layer il's tensors: `L.weight("attn_q", ne)` reads blk.il.attn_q.weight into layer.attn_q,
    `L.bias("attn_q", ne)` the optional blk.il.attn_q.bias into layer.attn_q_b."""

    def __init__(self, w: Weights, il: int):
        self.w, self.il, self.layer = w, il, Layer()

    def weight(self, name: str, ne, required: bool = True):
        return self.w.add(name, f"blk.{self.il}.{name}.weight", ne, required, self.layer)

    def bias(self, name: str, ne, required: bool = False):
        """The bias of `name`: required, or optional where the architecture reads one (its
        `biases`; a bias it does not read stays in the file unread, and is refused as extra)."""
        biases = self.w.arch.biases if self.w.arch is not None else None
        if biases is not None and name not in biases and not required:
            return None
        required = required or bool(biases and biases.get(name))
        return self.w.add(name + "_b", f"blk.{self.il}.{name}.bias", ne, required, self.layer)

    def has(self, name: str) -> bool:
        return f"blk.{self.il}.{name}.weight" in self.w.tensors


_LAYER_RE = re.compile(r"^(?:enc\.|dec\.)?blk\.(\d+)\.")  # enc./dec.: T5's encoder and decoder layers


def tensor_layer(name: str) -> int | None:
    """The layer a weight belongs to ("blk.3.attn_q.weight", "enc.blk.3.attn_q.weight" -> 3), None for
    the others."""
    m = _LAYER_RE.match(name)
    return int(m.group(1)) if m else None


def is_output_tensor(name: str) -> bool:
    """The output head's tensors (output.weight, output_norm.*), placed with the output."""
    return name.startswith("output")


# weights read only as MUL_MAT's src0 (token_embd is also read by GET_ROWS, norms by MUL, experts
# by MUL_MAT_ID): the ones an extra buffer type (CPU_REPACK) may store in its own layout
MATMUL_WEIGHTS = tuple(f"{n}.weight" for n in (
    "attn_q", "attn_k", "attn_v", "attn_qkv", "attn_output", "ffn_gate", "ffn_up", "ffn_down",
    "ffn_gate_shexp", "ffn_up_shexp", "ffn_down_shexp"))
# the recurrent layers' projections (recurrent_layers.py), read only by MUL_MAT too
MATMUL_WEIGHTS += tuple(f"{n}.weight" for n in (
    "ssm_in", "ssm_x", "ssm_dt", "ssm_out", "shortconv.in_proj", "shortconv.out_proj", "time_mix_key", "time_mix_value",
    "time_mix_receptance", "time_mix_gate", "time_mix_output", "channel_mix_key", "channel_mix_value",
    "channel_mix_receptance", "attn_gate", "ssm_ba"))  # (ssm_in above: qwen3next's legacy q/k/v/z too)


def is_matmul_weight(name: str) -> bool:
    return name == "output.weight" or (tensor_layer(name) is not None and name.endswith(MATMUL_WEIGHTS))


# the tensor groups architectures share

# the output head of an architecture, as llama.cpp's load_tensors decides it
OUTPUT_HEADS = ("optional", "required", "tied")


def load_output(w: Weights, hp: HParams, head: str = "optional") -> None:
    """token_embd, output_norm, and the output head: output.weight, or token_embd when the file
    has none ("optional", llama.cpp's TENSOR_NOT_REQUIRED then TENSOR_DUPLICATED), output.weight
    always ("required"), or token_embd always ("tied": an output.weight is then an unread tensor)."""
    if head not in OUTPUT_HEADS:
        raise ValueError(f"load_output: head {head!r} is not one of {OUTPUT_HEADS}")
    e = hp.n_embd
    w.add("token_embd", "token_embd.weight", [e, hp.n_vocab])
    w.add("output_norm", "output_norm.weight", [e])
    biases = w.arch.biases if w.arch is not None else None
    if biases is None or "output_norm" in biases:
        w.add("output_norm_b", "output_norm.bias", [e], required=bool(biases and biases["output_norm"]))
    out = None if head == "tied" else w.add("output", "output.weight", [e, hp.n_vocab], required=head == "required")
    if out is None:
        w.globals["output"] = w.token_embd
    if biases is not None and "output" in biases:  # the head's bias (phi2)
        w.add("output_b", "output.bias", [hp.n_vocab], required=biases["output"])


def load_attention(L: LayerLoader, hp: HParams, qk_norm: bool = False, qk_norm_per_head: bool = False,
                   qk_norm_full: bool = False, norm: bool = True) -> None:
    """attn_norm (optional bias; none with norm=False); attn_q/k/v (or a fused attn_qkv) with
    optional biases; q/k norms shared by the heads ([head_dim], required when qk_norm), one per
    head ([head_dim, n_head], optional, with qk_norm_per_head) or over the whole projection
    ([n_head * head_dim], required, with qk_norm_full: olmo2); attn_output with an optional bias."""
    q, k, v = hp.head_dim_k * hp.n_head, hp.n_embd_k_gqa, hp.n_embd_v_gqa
    if norm:
        L.weight("attn_norm", [hp.n_embd])
        L.bias("attn_norm", [hp.n_embd])
    arch = L.w.arch
    if L.has("attn_qkv") and (arch is None or arch.biases is None or arch.fused_qkv):
        L.weight("attn_qkv", [hp.n_embd, q + k + v])
        L.bias("attn_qkv", [q + k + v])
    else:
        for name, n in (("attn_q", q), ("attn_k", k), ("attn_v", v)):
            L.weight(name, [hp.n_embd, n])
            L.bias(name, [n])
    per_head = qk_norm_per_head
    if qk_norm_full:
        L.weight("attn_q_norm", [q])
        L.weight("attn_k_norm", [k])
    elif qk_norm or per_head or arch is None or arch.biases is None:
        L.weight("attn_q_norm", [hp.head_dim_k] + [hp.n_head] * per_head, required=qk_norm)
        L.weight("attn_k_norm", [hp.head_dim_k] + [hp.n_head_kv] * per_head, required=qk_norm)
    L.weight("attn_output", [hp.head_dim_v * hp.n_head, hp.n_embd])
    L.bias("attn_output", [hp.n_embd])


def load_ffn(L: LayerLoader, hp: HParams, gated: bool = True, n_ff: int | None = None,
             n_ff_up: int | None = None, norm: bool = True) -> None:
    """ffn_norm (unless norm=False) with an optional bias, ffn_gate (absent when not gated),
    ffn_up (n_ff_up wide: 2 n_ff for phi3's fused [gate | up]), ffn_down, optional biases."""
    ff = n_ff or hp.n_ff
    if norm:
        L.weight("ffn_norm", [hp.n_embd])
        L.bias("ffn_norm", [hp.n_embd])
    L.weight("ffn_gate", [hp.n_embd, ff], required=gated)
    L.weight("ffn_up", [hp.n_embd, n_ff_up or ff])
    L.weight("ffn_down", [ff, hp.n_embd])
    for name, n in (("ffn_gate", ff), ("ffn_up", n_ff_up or ff), ("ffn_down", hp.n_embd)):
        L.bias(name, [n])


def load_moe(L: LayerLoader, hp: HParams, n_ff_exp: int | None = None, biases: bool = False,
             norm: str | None = "ffn_norm", probs_bias: bool | None = None) -> None:
    """The FFN's input norm (none when norm is None), the router ffn_gate_inp, the experts'
    selection bias exp_probs_b.bias (read when probs_bias is not None; required when True) and
    the stacked experts ffn_{gate,up,down}_exps (with their biases when asked)."""
    ff, e, n = n_ff_exp or hp.n_ff_exp or hp.n_ff, hp.n_embd, hp.n_expert
    if norm is not None:
        L.weight(norm, [e])
    L.weight("ffn_gate_inp", [e, n])
    if probs_bias is not None:
        L.w.add("ffn_exp_probs_b", f"blk.{L.il}.exp_probs_b.bias", [n], probs_bias, L.layer)
    L.weight("ffn_gate_exps", [e, ff, n])
    L.weight("ffn_up_exps", [e, ff, n])
    L.weight("ffn_down_exps", [ff, e, n])
    if biases:
        for name, m in (("ffn_gate_inp", n), ("ffn_gate_exps", ff), ("ffn_up_exps", ff), ("ffn_down_exps", e)):
            L.bias(name, [m, n] if name.endswith("exps") else [m], required=True)


def load_shared_expert(L: LayerLoader, hp: HParams, n_ff: int, gate_inp: bool = True) -> None:
    e = hp.n_embd
    L.weight("ffn_gate_shexp", [e, n_ff])
    L.weight("ffn_up_shexp", [e, n_ff])
    L.weight("ffn_down_shexp", [n_ff, e])
    if gate_inp:
        L.weight("ffn_gate_inp_shexp", [e])


# ---------------------------------------------------------------- architectures

class Arch:
    """An architecture: the GGUF `general.architecture` names it serves, its rotary type, the keys
    and tensors it reads, and its graph."""
    names: tuple[str, ...] = ()
    rope_type: int = 0
    output_head: str = "optional"  # see load_output
    # the biases it reads (LayerLoader.bias): name -> required, as llama.cpp's load_tensors for the
    # architecture; None: every bias the shared loaders know, optional
    biases: dict | None = None
    fused_qkv: bool = False   # a layer may hold attn_qkv instead of attn_q/k/v
    rope_freqs: bool | None = None  # Llama 3.1's rope_freqs.weight, optional (None: when biases is None)
    encoder: bool = False  # hidden states only (Model.embed), no logits (bert...)

    def project_pooled(self, w: "Weights", x):
        """Model.embed's pooled vectors (each token's with pooling none) after the architecture's
        projections (gemma-embedding's dense_2 / dense_3); x itself for most."""
        return x

    def read_hparams(self, hp: HParams, keys: KeyReader) -> None:
        """Architecture-specific keys and defaults (sliding-window pattern, scales...)."""

    def load_layer(self, L: LayerLoader, hp: HParams) -> None:
        raise NotImplementedError

    def load_weights(self, w: Weights, hp: HParams) -> None:
        load_output(w, hp, self.output_head)
        if self.rope_freqs or (self.rope_freqs is None and self.biases is None):
            w.add("rope_freqs", "rope_freqs.weight", [hp.n_rot // 2], required=False)
        for il in range(hp.n_layer):
            L = LayerLoader(w, il)
            self.load_layer(L, hp)
            w.layers.append(L.layer)

    def build(self, b: "GraphBuilder", w: Weights) -> Tensor:
        """The logits [n_vocab, n_outputs] of the micro-batch: in the last layer, right after
        attention, `b.output_rows` keeps only the rows of the tokens whose logits are wanted."""
        raise NotImplementedError


def bind_weights(arch: Arch, tensors: dict, hp: HParams, path: str) -> Weights:
    """The architecture's tensors by role, every name and shape checked and every tensor of the
    file read (tensors: name -> anything with `ne`: the file's TensorInfo before loading, the
    loaded Tensors after)."""
    w = Weights(tensors, path, arch)
    arch.load_weights(w, hp)
    if hp.n_layer_nextn:  # the skipped prediction blocks' tensors count as read (llama.cpp's TENSOR_SKIP)
        w.used.update(n for n in w.tensors if (tensor_layer(n) or 0) >= hp.n_layer)
    w.check_all_used()
    return w


# ---------------------------------------------------------------- the graph

POSITIONS_4D = "inp_pos_4d"  # the graph input of multi-axis RoPE positions (positions_4d)


@dataclass
class ModelGraph:
    graph: CGraph
    tokens: Tensor | None  # I32 [n_tokens] (None: the graph reads input embeddings, `embd`)
    positions: Tensor | None  # I32 [n_tokens] (None: the graph reads no positions)
    kv_idx: Tensor | None     # I64 [n_tokens]: the cache cell of each token (None: no KV cache)
    masks: dict          # window (0: causal only) -> F16 [n_kv, n_tokens] mask input
    logits: Tensor | None  # F32 [n_vocab, n_outputs]; None when n_outputs is 0
    position_inputs: list  # (tensor, fn(positions) -> torch values): inputs that depend on positions
    n_tokens: int
    n_kv: int
    n_outputs: int
    out_ids: Tensor | None  # I32 [n_outputs]: the tokens whose logits are computed (None: all of them)
    embeddings: bool = False  # `logits` holds the final norm's output [n_embd, n_outputs] (embeddings)
    n_seqs: int = 1         # sequences of the micro-batch (recurrent layers group tokens by them)
    s_ids: Tensor | None = None  # I32 [n_seqs]: the recurrent state slot of each sequence
    io: BoundIO = field(default_factory=BoundIO)  # its inputs and logits, written and read every step
    embd: Tensor | None = None  # F32 [n_embd, n_tokens]: input embeddings instead of `tokens` (None then)
    # T5: I32 [n_kv, n_tokens] relative position buckets with (n_buckets, bidirectional), and the
    # encoder's output F32 [n_embd, n_cross] the decoder's cross-attention reads (None: none)
    buckets: tuple | None = None
    cross: Tensor | None = None
    sched: object = None        # the scheduler it is allocated on (None: the model's own)
    separate_rows: bool = False  # its products' rows are separate sequences' tokens (mark_separate_rows)


def mark_separate_rows(g: ModelGraph) -> None:
    """A batched decode step's graph (each token another sequence's): its products may multiply
    each row as that sequence's own decode step would (ops.mul_mat_set_separate_rows), which a
    prompt's micro-batch of the same size may not do."""
    for node in g.graph.nodes:
        if node.op in (Op.MUL_MAT, Op.MUL_MAT_ID):
            ops.mul_mat_set_separate_rows(node)
    g.separate_rows = True


def graph_size(hp: HParams) -> int:
    per_layer = hp.nodes_per_layer + (4 * hp.n_expert_used + 32 if hp.n_expert else 0)
    return max(1024, per_layer * hp.n_layer + 256)


class GraphBuilder:
    """Builds one micro-batch's graph: n_tokens new tokens attending to the first n_kv cache cells,
    with logits for n_outputs of them (default: all).

    Outputs, as llama.cpp's inp_out_ids: with 0 < n_outputs < n_tokens the graph has an I32 input
    `inp_out_ids` (which tokens, in order) and `output_rows` selects those rows with GET_ROWS in
    the last layer after attention, so that layer's FFN, the output norm and the head run only for
    them. With n_outputs == n_tokens there is no selection (llama.cpp keeps an identity GET_ROWS to
    give pipeline parallelism one topology; our graphs are built per shape, so it would only copy).
    With n_outputs == 0 (a micro-batch before the one holding the wanted token) the graph ends at
    the KV cache writes: only the cache is needed from it.

    Input embeddings (from_embd, llama_batch.embd: an image's embeddings from its projector): the
    graph reads F32 rows `inp_embd` [n_embd, n_tokens] in place of the token embedding lookup,
    unscaled (llama.cpp scales only looked-up token embeddings, e.g. Gemma's sqrt(n_embd))."""

    def __init__(self, ctx, hp: HParams, memory: Memory, n_tokens: int, n_kv: int, flash_attn: bool = False,
                 n_outputs: int | None = None, embeddings: bool = False, n_seqs: int = 1, from_embd: bool = False,
                 n_cross: int = 0):
        n_outputs = n_tokens if n_outputs is None else int(n_outputs)
        if not 0 <= n_outputs <= n_tokens:
            raise ValueError(f"graph: n_outputs={n_outputs} must lie in [0, n_tokens={n_tokens}]")
        if n_seqs < 1 or n_tokens % n_seqs:
            raise ValueError(f"graph: n_tokens={n_tokens} must split evenly into n_seqs={n_seqs} sequences")
        self.ctx, self.hp, self.memory = ctx, hp, memory
        # recurrent layers: the micro-batch as [n_seq_tokens, n_seqs], each sequence's state slot,
        # and the state writes (set_rows into the memory), which no later node reads
        self.n_seqs, self.n_seq_tokens = n_seqs, n_tokens // n_seqs
        self.s_ids = self._input(Type.I32, n_seqs, name="inp_s_ids") if memory.recurrent is not None else None
        self.state_writes: list[Tensor] = []
        self.n_tokens, self.n_kv, self.flash_attn, self.n_outputs = n_tokens, n_kv, flash_attn, n_outputs
        self.embeddings = embeddings  # output the final norm's hidden states instead of the logits
        self.tokens = None if from_embd else self._input(Type.I32, n_tokens, name="inp_tokens")
        self.inp_embd = self._input(Type.F32, hp.n_embd_inp, n_tokens, name="inp_embd") if from_embd else None
        self.positions = self._input(Type.I32, n_tokens, name="inp_pos")
        self.kv_idx = self._input(Type.I64, n_tokens, name="inp_kv_idx")
        self.masks = {0: self._input(Type.F16, n_kv, n_tokens, name="inp_kq_mask")}
        if any(hp.is_swa(il) for il in range(hp.n_layer)):
            self.masks[hp.n_swa] = self._input(Type.F16, n_kv, n_tokens, name="inp_kq_mask_swa")
        self.position_inputs: list = []
        self.out_ids = self._input(Type.I32, n_outputs, name="inp_out_ids") if 0 < n_outputs < n_tokens else None
        self.cache_views: list[Tensor] = []  # every layer's K/V views on its cache writes
        self.layer_cells: dict[int, tuple[Tensor, Tensor]] = {}  # layer -> its K/V views (shared KV reads them)
        self._pos4: Tensor | None = None  # positions_4d, made on first use
        self.buckets: tuple | None = None  # relative_bias's input, made on first use
        self.cross = self._input(Type.F32, hp.n_embd, n_cross, name="inp_cross_embd") if n_cross else None

    def _input(self, type, *ne, name):
        t = (new_tensor_1d if len(ne) == 1 else new_tensor_2d)(self.ctx, type, *ne)
        set_name(t, name)
        set_input(t)
        return t

    def finish(self, logits: Tensor) -> ModelGraph:
        graph = new_graph_custom(self.ctx, graph_size(self.hp))
        for write in self.state_writes:
            build_forward_expand(graph, write)
        if self.n_outputs == 0:
            for view in self.cache_views:  # the writes, and what they depend on
                build_forward_expand(graph, view)
            logits = None
        else:
            set_name(logits, "result_norm" if self.embeddings else "result_output")
            set_output(logits)
            build_forward_expand(graph, logits)
        # inputs only the omitted part reads (the last layer's own window mask) are not in the graph
        masks = {w: m for w, m in self.masks.items() if id(m) in graph.visited}
        position_inputs = [(t, fn) for t, fn in self.position_inputs if id(t) in graph.visited]
        used = lambda t: t if t is not None and id(t) in graph.visited else None  # noqa: E731
        buckets = self.buckets if self.buckets is not None and id(self.buckets[0]) in graph.visited else None
        return ModelGraph(graph, self.tokens, used(self.positions), used(self.kv_idx), masks, logits,
                          position_inputs, self.n_tokens, self.n_kv, self.n_outputs, self.out_ids, self.embeddings,
                          self.n_seqs, used(self.s_ids), embd=self.inp_embd, buckets=buckets, cross=used(self.cross))

    def output_rows(self, il: int, *xs: Tensor) -> tuple[Tensor, ...]:
        """In the last layer (il), after attention: the rows of `xs` ([n, n_tokens] each: the
        attention output, the residual...) of the output tokens only, by GET_ROWS on inp_out_ids;
        `xs` unchanged in the other layers or when every token is an output."""
        if self.out_ids is None or il != self.hp.n_layer - 1:
            return xs
        return tuple(ops.get_rows(self.ctx, x, self.out_ids) for x in xs)

    def add_attention(self, il: int, x: Tensor, attn: Tensor) -> Tensor:
        """The residual after layer il's attention, x + attn; in the last layer of the output
        tokens' rows only (output_rows)."""
        attn, x = self.output_rows(il, attn, x)
        return self.add(x, attn)

    # ------------------------------------------------------------ small pieces

    def embed(self, tok_embd: Tensor, scale: float = 1.0, pos_embd: Tensor | None = None) -> Tensor:
        """The micro-batch's input rows [n_embd, n_tokens]: the tokens' embeddings (times scale),
        plus the learned position embeddings of their positions when pos_embd [n_embd, n_ctx_train]
        is given (gpt2, starcoder); or the input embeddings as given (from_embd)."""
        if self.inp_embd is not None:
            return self.embd_slice(0)
        x = ops.get_rows(self.ctx, tok_embd, self.tokens)                 # [n_embd, n_tokens]
        x = x if scale == 1.0 else ops.scale(self.ctx, x, scale)
        return x if pos_embd is None else ops.add(self.ctx, x, ops.get_rows(self.ctx, pos_embd, self.positions))

    def embd_slice(self, i: int) -> Tensor:
        """Slice i [n_embd, n_tokens] of the input embedding rows (0: the embeddings; i > 0: qwen3vl's
        i-th deepstack slice)."""
        e = self.hp.n_embd
        if self.hp.n_deepstack == 0:
            return self.inp_embd
        return ops.view_2d(self.ctx, self.inp_embd, e, self.n_tokens, self.inp_embd.nb[1], i * e * self.inp_embd.nb[0])

    def deepstack(self, il: int, x: Tensor) -> Tensor:
        """x after layer il plus the input rows' deepstack slice il + 1 (qwen3vl: for input
        embeddings of the first n_deepstack layers; token ids carry none)."""
        if self.inp_embd is None or il >= self.hp.n_deepstack:
            return x
        (ds,) = self.output_rows(il, self.embd_slice(il + 1))  # the last layer keeps the output rows only
        return self.add(x, ds)

    def attn_temperature(self, scale: float, floor: int, offset: float = 0.0) -> Tensor:
        """Llama 4 / mistral3 query temperature per token, F32 [1, 1, n_tokens]:
        1 + scale * log(floor((pos + offset) / floor) + 1)."""
        t = new_tensor_3d(self.ctx, Type.F32, 1, 1, self.n_tokens)
        set_name(t, "inp_attn_scale")
        set_input(t)
        self.position_inputs.append((t, lambda pos: (
            1.0 + scale * torch.log(torch.floor((pos.double() + offset) / floor) + 1.0)).float().reshape(-1, 1, 1)))
        return t

    def relative_bias(self, rel_b: Tensor, n_buckets: int, bidirectional: bool, cached: bool = True) -> Tensor:
        """T5's relative position bias [n_keys, n_tokens, n_head]: rel_b [n_head, n_buckets] rows
        looked up by the bucket of each (key, token) pair's distance: the keys are the first n_kv
        cache cells (an I32 input the memory fills, KVCache.relative_buckets), or with cached=False
        the micro-batch's own tokens (an input from their positions: the encoder's)."""
        ctx = self.ctx
        if not cached:
            t = self._input(Type.I32, self.n_tokens, self.n_tokens, name="inp_pos_bucket_enc")
            self.position_inputs.append((t, lambda pos: torch.from_numpy(
                relative_position_buckets(pos.numpy(), pos.numpy(), n_buckets, bidirectional))))
        elif self.buckets is None:
            t = new_tensor_2d(ctx, Type.I32, self.n_kv, self.n_tokens)
            set_name(t, "inp_pos_bucket")
            set_input(t)
            self.buckets = (t, n_buckets, bidirectional)
        t = t if not cached else self.buckets[0]
        bias = ops.get_rows(ctx, rel_b, ops.reshape_1d(ctx, t, t.ne[0] * t.ne[1]))  # [n_head, n_kv * n_tokens]
        bias = ops.reshape_3d(ctx, bias, bias.ne[0], t.ne[0], t.ne[1])
        return ops.cont(ctx, ops.permute(ctx, bias, 2, 0, 1, 3))

    def norm(self, x: Tensor, weight: Tensor | None, bias: Tensor | None = None, rms: bool = True) -> Tensor:
        """RMS norm (or LayerNorm with rms=False) times the weight, plus the bias."""
        x = (ops.rms_norm if rms else ops.norm)(self.ctx, x, self.hp.norm_eps)
        if weight is not None:
            x = ops.mul(self.ctx, x, weight)
        return x if bias is None else ops.add(self.ctx, x, bias)

    def linear(self, x: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
        y = ops.mul_mat(self.ctx, weight, x)
        return y if bias is None else ops.add(self.ctx, y, bias)

    def add(self, a: Tensor, b: Tensor) -> Tensor:
        return ops.add(self.ctx, a, b)

    def scale(self, x: Tensor, s: float) -> Tensor:
        return x if s == 1.0 else ops.scale(self.ctx, x, s)

    def softcap(self, x: Tensor, cap: float) -> Tensor:
        """cap * tanh(x / cap)."""
        x = ops.tanh(self.ctx, ops.scale(self.ctx, x, 1.0 / cap))
        return ops.scale(self.ctx, x, cap)

    def positions_4d(self) -> Tensor:
        """Multi-axis RoPE's positions, I32 [4 * n_tokens], for text tokens as llama.cpp gives
        them: the position on the first three axes (time, height, width), 0 on the fourth."""
        if self._pos4 is None:
            self._pos4 = new_tensor_1d(self.ctx, Type.I32, 4 * self.n_tokens)
            set_name(self._pos4, POSITIONS_4D)
            set_input(self._pos4)
            self.position_inputs.append(
                (self._pos4, lambda pos: torch.cat([pos, pos, pos, torch.zeros_like(pos)]).to(torch.int32)))
        return self._pos4

    def rope(self, x: Tensor, il: int, factors: Tensor | None = None, yarn: bool = True) -> Tensor:
        """Rotary embedding of layer il; multi-axis (rope_multi over positions_4d) when the
        architecture sets hp.rope_sections (qwen2vl, qwen3vl: their rotary type MROPE / IMROPE).
        yarn=False: without YaRN's extrapolation mix and attention factor (olmo2's windowed layers)."""
        hp = self.hp
        base, scale = hp.rope_base_scale(il)
        ext, attn = (hp.yarn_ext_factor, hp.yarn_attn_factor) if yarn else (0.0, 1.0)
        if hp.rope_sections:
            return ops.rope_multi(self.ctx, x, self.positions_4d(), factors, hp.n_rot, list(hp.rope_sections),
                                  hp.rope_type, hp.n_ctx_orig or hp.n_ctx_train, base, scale, ext, attn,
                                  hp.yarn_beta_fast, hp.yarn_beta_slow)
        return ops.rope_ext(self.ctx, x, self.positions, factors, hp.layer_n_rot(il), hp.rope_type, hp.n_ctx_orig or hp.n_ctx_train,
                            base, scale, ext, attn, hp.yarn_beta_fast, hp.yarn_beta_slow)

    # ------------------------------------------------------------ attention

    def qkv(self, h: Tensor, layer: Layer, qk_rms: bool = True, qk_norms: bool = True) -> tuple[Tensor, Tensor, Tensor]:
        """Q [head_dim, n_head, n_tokens], K and V [head_dim, n_head_kv, n_tokens]: separate
        projections, or one fused attn_qkv product split by views; biases, hp.clamp_kqv, and q/k
        norms (RMS, or LayerNorm with qk_rms=False; not here with qk_norms=False) when the layer
        has them."""
        hp, ctx, n = self.hp, self.ctx, self.n_tokens
        dq, dk = hp.head_dim_k * hp.n_head, hp.n_embd_k_gqa
        clamp = (lambda t: ops.clamp(ctx, t, -hp.clamp_kqv, hp.clamp_kqv)) if hp.clamp_kqv > 0 else (lambda t: t)
        if layer.attn_qkv is not None:
            qkv = clamp(self.linear(h, layer.attn_qkv, layer.attn_qkv_b))  # [dq + dk + dv, n_tokens]
            es = qkv.nb[0]
            q = ops.view_3d(ctx, qkv, hp.head_dim_k, hp.n_head, n, hp.head_dim_k * es, qkv.nb[1], 0)
            k = ops.view_3d(ctx, qkv, hp.head_dim_k, hp.n_head_kv, n, hp.head_dim_k * es, qkv.nb[1], dq * es)
            v = ops.view_3d(ctx, qkv, hp.head_dim_v, hp.n_head_kv, n, hp.head_dim_v * es, qkv.nb[1], (dq + dk) * es)
            v = ops.cont(ctx, v)  # the cache writes whole rows
        else:
            q = ops.reshape_3d(ctx, clamp(self.linear(h, layer.attn_q, layer.attn_q_b)), hp.head_dim_k, hp.n_head, n)
            k = ops.reshape_3d(ctx, clamp(self.linear(h, layer.attn_k, layer.attn_k_b)), hp.head_dim_k, hp.n_head_kv, n)
            v = ops.reshape_3d(ctx, clamp(self.linear(h, layer.attn_v, layer.attn_v_b)), hp.head_dim_v, hp.n_head_kv, n)
        if not qk_norms:
            return q, k, v
        return self.qk_norm(q, layer.attn_q_norm, qk_rms), self.qk_norm(k, layer.attn_k_norm, qk_rms), v

    def qk_norm(self, x: Tensor, weight: Tensor | None, rms: bool = True) -> Tensor:
        """x [head_dim, n_heads, n_tokens] normed over each head, or over all the heads together
        when the weight is as wide as they are (olmo2's q/k norms)."""
        if weight is None:
            return x
        if weight.ne[0] == x.ne[0] or x.ne[1] == 1:
            return self.norm(x, weight, rms=rms)
        flat = ops.cont_2d(self.ctx, x, x.ne[0] * x.ne[1], x.ne[2])
        return ops.reshape_3d(self.ctx, self.norm(flat, weight, rms=rms), x.ne[0], x.ne[1], x.ne[2])

    def attention(self, il: int, q: Tensor, k: Tensor, v: Tensor, wo: Tensor | None, wo_b: Tensor | None = None,
                  kq_scale: float | None = None, sinks: Tensor | None = None, v_mla: Tensor | None = None,
                  kv_from: int | None = None, kq_b: Tensor | None = None) -> Tensor:
        """Store K and V in layer il's cache (or, with kv_from, read layer kv_from's cells, written
        earlier in this graph, and k, v are None: shared KV), attend over the first n_kv cells (the layer's sliding
        window mask when it has one; soft-capped scores when hp.attn_softcap; ALiBi when
        hp.max_alibi_bias; per-head sink logits), decompress each head's output with v_mla [head_dim_v, d, n_head] when given
        (multi-head latent attention), and project with wo: [n_embd, n_tokens] (wo None: the
        heads' outputs, unprojected)."""
        hp, ctx = self.hp, self.ctx
        scale = hp.kq_scale if kq_scale is None else kq_scale
        mask = self.masks[hp.n_swa if hp.is_swa(il) else 0]
        if kv_from is not None:
            k_cells, v_cells = self.layer_cells[kv_from]
        else:
            k_cells, v_cells = self.memory.store(ctx, il, k, v, self.kv_idx, self.n_kv)  # [head_dim, n_kv, n_head_kv]
            self.cache_views += [k_cells, v_cells]
            self.layer_cells[il] = k_cells, v_cells
        out = self.attend(q, k_cells, v_cells, mask, scale, sinks, v_mla, kq_b)
        return out if wo is None else self.linear(out, wo, wo_b)

    def attend(self, q: Tensor, k_cells: Tensor, v_cells: Tensor, mask: Tensor | None, scale: float,
               sinks: Tensor | None = None, v_mla: Tensor | None = None, kq_b: Tensor | None = None) -> Tensor:
        """softmax(scale q k^T (soft-capped) + kq_b + mask) v per head, [head_dim_v * n_head, n_tokens]:
        q [head_dim, n_head, n_tokens], k_cells / v_cells [head_dim, n_kv, n_head_kv]; kq_b
        [n_kv, n_tokens, n_head] (T5's relative position bias) always takes the path without
        flash attention, as llama.cpp."""
        hp, ctx, n = self.hp, self.ctx, q.ne[2]
        n_head = q.ne[1]
        q = ops.permute(ctx, q, 0, 2, 1, 3)                                     # [head_dim, n_tokens, n_head]
        if self.flash_attn and kq_b is None:
            out = ops.flash_attn_ext(ctx, q, k_cells, v_cells, mask, scale, hp.max_alibi_bias, hp.attn_softcap)
            if sinks is not None:
                ops.flash_attn_ext_add_sinks(out, sinks)
            if v_mla is not None:                                               # out: [hd, n_head, n_tokens]
                out = ops.mul_mat(ctx, v_mla, ops.permute(ctx, out, 0, 2, 1, 3))  # [d, n_tokens, n_head]
                out = ops.cont(ctx, ops.permute(ctx, out, 0, 2, 1, 3))
            out = ops.reshape_2d(ctx, out, out.ne[0] * n_head, n)
        else:
            kq = ops.mul_mat(ctx, k_cells, q)                                   # [n_kv, n_tokens, n_head]
            if hp.attn_softcap:
                kq = self.softcap(kq, hp.attn_softcap)
            if kq_b is not None:
                kq = ops.add(ctx, kq, kq_b)
            kq = ops.soft_max_ext(ctx, kq, mask, scale, hp.max_alibi_bias)
            if sinks is not None:
                ops.soft_max_add_sinks(kq, sinks)
            v_t = ops.cont(ctx, ops.permute(ctx, v_cells, 1, 0, 2, 3))           # [n_kv, head_dim, n_head_kv]
            out = ops.mul_mat(ctx, v_t, kq)                                     # [head_dim, n_tokens, n_head]
            if v_mla is not None:
                out = ops.mul_mat(ctx, v_mla, out)                              # [d, n_tokens, n_head]
            out = ops.permute(ctx, out, 0, 2, 1, 3)
            out = ops.cont_2d(ctx, out, out.ne[0] * n_head, n)
        return out

    def self_attention(self, il: int, h: Tensor, layer: Layer, rope_factors: Tensor | None = None,
                       q_scale: float | Tensor | None = None, kq_scale: float | None = None,
                       rope: bool = True) -> Tensor:
        """The usual block: projections, q/k norms, rotary positions (none with rope=False: the
        NoPE layers of smollm3, cohere2...), attention, output projection. q_scale multiplies Q
        after the rotation: a number (gemma's query_pre_attn_scalar) or a per-token tensor
        (attn_temperature)."""
        q, k, v = self.qkv(h, layer)
        if rope:
            q, k = self.rope(q, il, rope_factors), self.rope(k, il, rope_factors)
        if isinstance(q_scale, Tensor):
            q = ops.mul(self.ctx, q, q_scale)
        elif q_scale is not None:
            q = ops.scale(self.ctx, q, q_scale)
        return self.attention(il, q, k, v, layer.attn_output, layer.attn_output_b, kq_scale, layer.attn_sinks)

    # ------------------------------------------------------------ feed-forward

    def activate(self, gate: Tensor | None, up: Tensor, act: str) -> Tensor:
        """act(gate) * up (act(up) without a gate): silu, gelu, relu_sqr (ungated), or gpt-oss's
        clamped swiglu_oai."""
        ctx = self.ctx
        if act == "swiglu_oai":
            return ops.swiglu_oai(ctx, gate, up, 1.702, 7.0)
        if act == "relu_sqr" and gate is None:  # relu(x)^2 (arcee, nemotron)
            return ops.sqr(ctx, ops.relu(ctx, up))
        if gate is None:
            return {"silu": ops.silu, "gelu": ops.gelu}[act](ctx, up)
        return {"silu": ops.swiglu_split, "gelu": ops.geglu_split}[act](ctx, gate, up)

    def ffn(self, x: Tensor, layer: Layer, act: str = "silu", suffix: str = "") -> Tensor:
        """down(act(gate(x)) * up(x)); suffix "_shexp" for a shared expert's tensors. A layer with
        ffn_up of twice the width and no ffn_gate holds [gate | up] fused (phi3): split by views."""
        up_w, gate_w, down_w = layer["ffn_up" + suffix], layer["ffn_gate" + suffix], layer["ffn_down" + suffix]
        up = self.linear(x, up_w, layer["ffn_up" + suffix + "_b"])
        gate = None if gate_w is None else self.linear(x, gate_w, layer["ffn_gate" + suffix + "_b"])
        if gate is None and up_w.ne[1] == 2 * down_w.ne[0]:
            ctx, n_ff = self.ctx, down_w.ne[0]
            gate = ops.view_2d(ctx, up, n_ff, up.ne[1], up.nb[1], 0)
            up = ops.view_2d(ctx, up, n_ff, up.ne[1], up.nb[1], n_ff * up.nb[0])
        return self.linear(self.activate(gate, up, act), down_w, layer["ffn_down" + suffix + "_b"])

    def moe(self, x: Tensor, layer: Layer, act: str = "silu", norm_weights: bool = True,
            gating: str = "softmax", w_scale: float = 0.0, weight_inputs: bool = False,
            logits: Tensor | None = None) -> Tensor:
        """Mixture of experts: the router's top n_expert_used experts per token run through
        mul_mat_id, weighted by the router's probabilities (gating "softmax" over all experts or
        "sigmoid" of each logit, renormalised over the chosen ones when norm_weights; gating
        "softmax_weight": softmax over the chosen logits only, as gpt-oss does), times w_scale
        (0: none), and summed. A layer's ffn_exp_probs_b (DeepSeek V3's selection bias) is added
        to the probabilities for choosing the experts only. weight_inputs (llama4): the experts
        are chosen by the raw logits and their weights multiply each expert's input instead of
        its output. logits: the router's [n_expert, n] when the architecture computes them itself
        (gemma4). An expert matrix's per-expert scale (ffn_down_exps_s) multiplies its products.
        x: [n_embd, n] (n: the rows after output_rows)."""
        hp, ctx, n = self.hp, self.ctx, x.ne[1]
        n_exp, n_used = hp.n_expert, hp.n_expert_used
        if logits is None:
            logits = self.linear(x, layer.ffn_gate_inp, layer.ffn_gate_inp_b)  # [n_expert, n_tokens]
        probs = {"softmax": ops.soft_max, "sigmoid": ops.sigmoid}.get(gating, lambda _, t: t)(ctx, logits)
        choice = probs if layer.ffn_exp_probs_b is None else ops.add(ctx, probs, layer.ffn_exp_probs_b)
        if hp.n_expert_groups > 1:
            choice = self.expert_groups(choice)
        if weight_inputs:
            choice = logits
        selected = ops.argsort_top_k(ctx, choice, n_used)                     # I32 [n_used, n_tokens]
        weights = ops.get_rows(ctx, ops.reshape_3d(ctx, probs, 1, n_exp, n), selected)  # [1, n_used, n_tokens]
        if gating == "softmax_weight":
            weights = ops.reshape_3d(ctx, ops.soft_max(ctx, ops.reshape_2d(ctx, weights, n_used, n)), 1, n_used, n)
        if norm_weights:
            w2 = ops.reshape_2d(ctx, weights, n_used, n)
            total = ops.clamp(ctx, ops.sum_rows(ctx, w2), 6.103515625e-5, math.inf)
            weights = ops.reshape_3d(ctx, ops.div(ctx, w2, total), 1, n_used, n)
        if w_scale not in (0.0, 1.0):
            weights = ops.scale(ctx, weights, w_scale)
        xe = ops.reshape_3d(ctx, x, hp.n_embd, 1, n)
        if weight_inputs:  # each chosen expert's input scaled by its weight: [n_embd, n_used, n]
            xe = ops.mul(ctx, ops.repeat_4d(ctx, xe, hp.n_embd, n_used, n, 1), weights)

        def experts(name, inp):
            y = ops.mul_mat_id(ctx, layer[name], inp, selected)               # [rows, n_used, n_tokens]
            if layer[name + "_s"] is not None:  # [n_expert]: each chosen expert's scale
                scales = ops.repeat_4d(ctx, ops.reshape_3d(ctx, layer[name + "_s"], 1, n_exp, 1), 1, n_exp, n, 1)
                y = ops.mul(ctx, y, ops.get_rows(ctx, scales, selected))
            bias = layer[name + "_b"]
            return y if bias is None else ops.add_id(ctx, y, bias, selected)

        up = experts("ffn_up_exps", xe)
        gate = experts("ffn_gate_exps", xe) if layer.ffn_gate_exps is not None else None
        out = experts("ffn_down_exps", self.activate(gate, up, act))         # [n_embd, n_used, n_tokens]
        if not weight_inputs:
            out = ops.mul(ctx, out, weights)
        total = None
        for i in range(n_used):  # sum over the chosen experts: views of each slot, added
            part = ops.view_2d(ctx, out, hp.n_embd, n, out.nb[2], i * out.nb[1])
            total = part if total is None else ops.add(ctx, total, part)
        return total if n_used > 1 else ops.cont(ctx, total)

    def expert_groups(self, choice: Tensor) -> Tensor:
        """DeepSeek V3's grouped top-k: the experts in hp.n_expert_groups groups, each scored by
        the sum of its two best experts' scores; only the n_group_used best groups keep their
        scores, the others' experts get -inf (choice: [n_expert, n])."""
        hp, ctx, n = self.hp, self.ctx, choice.ne[1]
        n_groups, per = hp.n_expert_groups, hp.n_expert // hp.n_expert_groups
        groups = ops.reshape_3d(ctx, choice, per, n_groups, n)                 # [per, n_groups, n]
        top2 = ops.argsort_top_k(ctx, groups, 2)                               # I32 [2, n_groups, n]
        top2 = ops.get_rows(ctx, ops.reshape_4d(ctx, groups, 1, per, n_groups, n), top2)  # [1, 2, n_groups, n]
        scores = ops.sum_rows(ctx, ops.reshape_3d(ctx, top2, 2, n_groups, n))  # [1, n_groups, n]
        kept = ops.argsort_top_k(ctx, ops.reshape_2d(ctx, scores, n_groups, n), hp.n_group_used)  # [used, n]
        rows = ops.get_rows(ctx, groups, kept)                                 # [per, used, n]
        masked = ops.set_rows(ctx, ops.fill(ctx, groups, -math.inf), rows, kept)
        return ops.reshape_2d(ctx, masked, hp.n_expert, n)

    def shared_expert(self, x: Tensor, layer: Layer, act: str = "silu") -> Tensor:
        """qwen2moe's shared expert: an FFN scaled by sigmoid(ffn_gate_inp_shexp . x) per token."""
        out = self.ffn(x, layer, act, suffix="_shexp")
        if layer.ffn_gate_inp_shexp is None:
            return out
        gate = ops.sigmoid(self.ctx, ops.mul_mat(self.ctx, layer.ffn_gate_inp_shexp, x))  # [1, n_tokens]
        return ops.mul(self.ctx, out, gate)

    # ------------------------------------------------------------ output

    def output(self, x: Tensor, w: Weights, softcap: float = 0.0, rms: bool = True, scale: float = 1.0) -> Tensor:
        """The output norm (RMS, or LayerNorm with its bias) and head; logits optionally scaled
        (command-r) or soft-capped (gemma2). With `embeddings`, the output norm's result [n_embd,
        n_tokens] instead: the hidden states the embeddings are pooled from (llama.cpp's t_embd)."""
        normed = self.norm(x, w.output_norm, w.output_norm_b, rms)
        if self.embeddings:
            return normed
        logits = self.linear(normed, w.output, w.output_b)  # [n_vocab, n_tokens]
        if scale != 1.0:
            logits = ops.scale(self.ctx, logits, scale)
        return self.softcap(logits, softcap) if softcap else logits
