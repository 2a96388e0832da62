"""Model: a GGUF model on one or more devices, with a KV cache, a tokenizer and generation.

    model = torchggml.load_model("model.gguf", devices=["CUDA0"])
    logits = model.eval(model.tokenize("Hello"))   # [n_tokens, n_vocab] float32, appends to the cache
    last = model.eval(more_tokens, logits="last")  # [1, n_vocab]: only the last token's logits
    for text in model.generate("Once upon a time", max_tokens=32):
        print(text, end="")

Threads: a Model may be shared between threads. eval, eval_batch, generate, reset and close are
serialized by one lock per model, so calls from different threads run one after another (each
result is what that call would give alone, with the cache as the previous call left it); hold
`model.lock` to make a sequence of calls (reset, then eval) atomic. A generate() holds the lock
from its first item until it is exhausted or closed: iterate it to the end (or close it) in the
thread that started it. Two threads that interleave their calls on one sequence (each resetting
and evaluating seq 0) get InterleavedSequenceError rather than logits computed after each
other's tokens (sequences.py): give each thread its own seq_id, or hold model.lock.

Outputs: eval(logits="last") computes only the last token's logits, as llama.cpp does for a
batch whose logits flag is set on its last token only (llama-cpp-python's default,
logits_all=False): the graph keeps that token's row after the last layer's attention, so the
last layer's FFN, the output norm and the head run for one row instead of n (for a 32000-token
vocabulary the head alone is a third of a 128-token prompt's time). Micro-batches before the one
holding that token compute only the KV cache. generate() and chat() evaluate the prompt this way.

Non-finite logits: an eval whose computed logits contain NaN or inf raises NonFiniteLogitsError;
the cache cells that call wrote are zeroed and the cache is left as it was, so later calls are
not poisoned. Only computed logits are checked (with logits="last", the last token's; a NaN in an
earlier token reaches it through attention). reset() zeroes every cell written since the last reset.

close() frees the compute, KV and weight buffers and closes the file's mapping; a later eval,
generate or reset raises ModelClosedError.

Placement: every layer (its weights and its KV cache) lives on one device. The scheduler
(backend_sched) runs every graph, as llama.cpp does: on one device the graph is one split; across
several devices it is cut where the device changes and activations are copied between them.
The architecture (models/archs/) says which keys and tensors the file has and builds the graph.

The models package answers one question per file: placement.py (which device holds what),
sampling.py (the next token from logits), kv_cache.py and recurrent_state.py (the memory kinds:
the architecture picks one), this file (Model: eval and generation), loading.py (a GGUF file to
a Model). This module composes lora.py (add_lora/load_lora) and module.py (as_module); they take
the model as an argument and do not import this module back (no circle).
"""
from __future__ import annotations

import collections
import time
from dataclasses import dataclass, replace
from typing import Iterable, Iterator, Sequence

import numpy as np
import torch

from ..backend.backend import backend_free
from ..backend.device import DeviceType
from ..backend.sched import (backend_sched_new, backend_sched_reserve, backend_sched_reset, backend_sched_free,
                             backend_sched_alloc_graph, backend_sched_graph_compute)
from ..context import Context
from ..gguf.loader import GGUFFile
from ..types import is_quantized
from .builder import POSITIONS_4D, Arch, GraphBuilder, ModelGraph, bind_weights, graph_size, mark_separate_rows
from .hparams import HParams
from .kv_cache import kv_type_from_name
from .lora import DEFAULT_TARGETS, LoraAdapter
from .module import GGMLModule
from .params import ModelParams
from .placement import Placement, cpu_device, find_device
from .batch_generator import BatchGenerator, Update
from .generation import Generation
from .prompt import EmbeddingChunk, is_parts, prompt_parts
from .recurrent_state import memory_for
from .sampling import Sampler, SamplingParams, TokenChoice
from .speculative import make_draft
from .sequences import ModelLock, SequenceGuard, token_id_array

# the default KV cache size caps the model's training context (which can be 128k tokens)
DEFAULT_MAX_CTX = 4096

# eval's `logits` choices: every token's, or only the last token's (of each sequence)
LOGITS = ("all", "last")
# micro-batches of at most this many tokens keep their graphs built, for the last SMALL_GRAPHS
# shapes (Model._graph_for)
SMALL_GRAPH_TOKENS = 16
SMALL_GRAPHS = 4

# embed's pooling of the hidden states (llama.cpp's pooling types)
POOLING = ("mean", "cls", "last", "none", "rank")


def normalize_embeddings(x: torch.Tensor, norm: int) -> torch.Tensor:
    """Each row of x (or the vector x) divided by its norm, as llama.cpp's common_embd_normalize:
    -1 none, 0 max-absolute / 32760 (the int16 range), 2 Euclidean, other p the p-norm (1:
    taxicab), in float64; a zero vector stays zero."""
    if norm == -1:
        return x
    xd = x.double()
    if norm == 0:
        total = xd.abs().amax(dim=-1, keepdim=True) / 32760.0
    elif norm == 2:
        total = xd.pow(2).sum(dim=-1, keepdim=True).sqrt()
    elif norm >= 1:
        total = xd.abs().pow(norm).sum(dim=-1, keepdim=True).pow(1.0 / norm)
    else:
        raise ValueError(f"embed: normalize={norm}; choose -1 (none), 0 (max-absolute), 1 (taxicab), 2 (Euclidean) "
                         f"or p > 2 (p-norm)")
    return torch.where(total > 0, xd / total.clamp_min(1e-300), torch.zeros_like(xd)).float()


class ModelClosedError(RuntimeError):
    """The model was closed: its buffers are freed and it can no longer evaluate."""


FINITE_CHECK_VALUES = 1 << 22  # checked at a time: a 262k vocabulary's 512 rows would need a 128 MiB mask


def all_finite(values: np.ndarray) -> bool:
    """Whether every value is finite (numpy: cheaper than torch's check), a slice at a time so
    that the check's mask stays small beside a micro-batch's logits."""
    flat = values.reshape(-1)
    if flat.size <= FINITE_CHECK_VALUES:  # (a decode step's row: one check)
        return bool(np.isfinite(flat).all())
    return all(bool(np.isfinite(flat[i: i + FINITE_CHECK_VALUES]).all())
               for i in range(0, flat.size, FINITE_CHECK_VALUES))


class NonFiniteLogitsError(FloatingPointError):
    """An eval produced NaN or inf logits (its cache cells were zeroed, the cache restored)."""


@dataclass
class Timings:
    """llama_perf_context_print's figures: the prompt's tokens and time, the generated tokens
    and their time; load_s and warmup_s (set by whoever loaded and warmed the model up: the
    command line) are the one-time costs the prompt's figure does not hold."""
    prompt_tokens: int = 0
    prompt_s: float = 0.0
    gen_tokens: int = 0
    gen_s: float = 0.0
    drafted: int = 0   # speculative decoding: draft tokens evaluated
    accepted: int = 0  # and taken
    load_s: float = 0.0
    warmup_s: float = 0.0

    @property
    def prompt_tps(self) -> float:
        return self.prompt_tokens / self.prompt_s if self.prompt_s else 0.0

    @property
    def gen_tps(self) -> float:
        return self.gen_tokens / self.gen_s if self.gen_s else 0.0


class Model:
    """A loaded model. Use torchggml.load_model to make one."""

    def __init__(self, file: GGUFFile, tokenizer, params: ModelParams, arch: Arch | None = None,
                 hp: HParams | None = None, weight_buffers=None, placement: Placement | None = None):
        self.file = file
        self.path = file.path
        self._tokenizer = tokenizer  # None: read from the file on first use
        self.chat_template_override: str | None = None  # a built-in name or Jinja (chat_template)
        self.params = params
        self.arch = arch
        self.hp = hp
        self.vocab_only = hp is None
        self.timings = Timings()
        self.closed = False
        # serializes eval/generate/reset/close (see the module doc); hold it (`with model.lock:`)
        # to make a sequence of calls, e.g. reset then eval, atomic
        self.lock = ModelLock()
        self.sequences = SequenceGuard(self.path)  # InterleavedSequenceError between threads
        # the function that loaded this model (loading.load, which imports this module): reloaded_on
        # loads again through it
        self.loader = None
        if self.vocab_only:
            return
        self.weight_buffers = weight_buffers  # gguf.loader.WeightBuffers: the tensors and their buffers
        self.weights = bind_weights(arch, weight_buffers.tensors, hp, file.path)  # by llama.cpp name, checked
        self.placement = placement
        # context_length 0 (unknown) loads as in llama.cpp: the context is then the default size
        self.n_ctx = int(params.n_ctx) if params.n_ctx else min(hp.n_ctx_train or DEFAULT_MAX_CTX, DEFAULT_MAX_CTX)
        self.n_batch = int(params.n_batch)
        self.flash_attn = bool(params.flash_attn)
        self.kv_type = kv_type_from_name(params.kv_type)
        if is_quantized(self.kv_type) and not self.flash_attn:
            raise ValueError(f"kv_type {params.kv_type!r} needs flash_attn=True: without flash attention the "
                             f"V cache is read transposed, which a block-quantized cache cannot do")
        # the memory the architecture asks for: a KV cache, recurrent states, or both (hybrid)
        self.memory = memory_for(arch, hp, self.n_ctx, self.kv_type, [d.get_buffer_type() for d in placement.layers],
                                 int(params.n_seq_max))
        self.lora = None  # a LoraAdapter applied to every graph (add_lora / load_lora)
        # an encoder-decoder model's (T5) encoder output [n, n_embd] (Model.encode), which the
        # decoder's cross-attention reads; kept until the next encode
        self.cross: torch.Tensor | None = None
        self._setup_compute(params.n_threads)

    # ------------------------------------------------------------ compute setup

    def _setup_compute(self, n_threads: int | None) -> None:
        """One scheduler over the placement's devices and the CPU (always its last backend, where
        the inputs live); a single device gives one split."""
        devices = self.placement.devices
        if devices[-1].get_type() != DeviceType.CPU:
            devices.append(cpu_device())
        self.backends = [d.init_backend() for d in devices]
        if n_threads is not None:
            for b in self.backends:
                if hasattr(b, "set_n_threads"):
                    b.set_n_threads(n_threads)
        self._graph: ModelGraph | None = None
        self._small_graphs: collections.OrderedDict[tuple, ModelGraph] = collections.OrderedDict()
        self.last_graph: ModelGraph | None = None  # the graph of the last micro-batch (for inspection)
        self._ctx: Context | None = None
        self.sched = backend_sched_new(self.backends, None, graph_size(self.hp), False, True)
        # plan the compute buffers for the largest micro-batch once, as llama.cpp does
        n_cross = min(self.n_batch, self.n_ctx) if getattr(self.arch, "encoder_decoder", False) else 0
        worst = self._build(min(self.n_batch, self.n_ctx), self.n_ctx, embeddings=self.arch.encoder, n_cross=n_cross)
        if not backend_sched_reserve(self.sched, worst.graph):
            raise MemoryError(f"{self.path}: cannot allocate the compute buffers")

    def _build(self, n_tokens: int, n_kv: int, n_outputs: int | None = None, embeddings: bool = False,
               n_seqs: int = 1, from_embd: bool = False, n_cross: int = 0, separate_rows: bool = False) -> ModelGraph:
        self._ctx = Context(no_alloc=True)
        g = self.build_graph(self._ctx, n_tokens, n_kv, n_outputs, embeddings, n_seqs, from_embd, n_cross)
        if separate_rows:
            mark_separate_rows(g)
        return g

    def build_graph(self, ctx: Context, n_tokens: int, n_kv: int, n_outputs: int | None = None,
                    embeddings: bool = False, n_seqs: int = 1, from_embd: bool = False,
                    n_cross: int = 0) -> ModelGraph:
        """The architecture's forward graph of n_tokens attending to n_kv cache cells, LoRA
        included, with logits for n_outputs of the tokens (default all; see GraphBuilder), or
        with `embeddings` the output norm's hidden states instead of the logits; with recurrent
        layers the tokens are n_seqs sequences' equal shares, grouped by sequence; with from_embd
        the graph reads input embeddings instead of token ids; n_cross: the encoder output rows
        an encoder-decoder model's decoder reads (Model.encode)."""
        b = GraphBuilder(ctx, self.hp, self.memory, n_tokens, n_kv, self.flash_attn, n_outputs, embeddings, n_seqs,
                         from_embd, n_cross)
        g = b.finish(self.arch.build(b, self.weights))
        if self.lora is not None:
            replaced = self.lora.apply(ctx, g.graph)
            g.logits = replaced.get(id(g.logits), g.logits)
        return g

    # ------------------------------------------------------------ PyTorch integration

    def as_module(self) -> GGMLModule:
        """This model as a torch.nn.Module (see torchggml/models/module.py)."""
        return GGMLModule(self)

    def reloaded_on(self, device) -> "Model":
        """This model loaded again on `device` (a name or Device) with the same context, batch
        and cache options, its LoRA adapter copied along; itself when it already lives there alone."""
        device = find_device(device)
        if self.placement.single and self.placement.devices[0] is device:
            return self
        new = self.loader(self.path, devices=[device], n_ctx=self.n_ctx, n_batch=self.n_batch,
                   flash_attn=self.flash_attn, kv_type=self.kv_type.name.lower(), progress=False)
        if self.lora is not None:
            new.set_lora(self.lora.copy_for(new))
        return new

    def add_lora(self, rank: int, targets=None, alpha: float | None = None, seed: int = 0):
        """Add trainable LoRA adapters (see torchggml/models/lora.py) and return them."""
        self._require_weights("add_lora")
        return self.set_lora(LoraAdapter.create(self, rank, targets or DEFAULT_TARGETS, alpha, seed))

    def load_lora(self, path, scale: float = 1.0):
        """Apply a GGUF LoRA adapter file (llama.cpp's format) and return it."""
        self._require_weights("load_lora")
        return self.set_lora(LoraAdapter.load(self, path, scale))

    def set_lora(self, adapter):
        """Use `adapter` (or None) in every graph from now on; the previous one is freed."""
        if self.lora is not None and self.lora is not adapter:
            self.lora.free()
        self.lora = adapter
        self._graph = None  # the next eval builds (and allocates) a graph with the adapter
        self._free_small_graphs()
        return adapter

    def _graph_for(self, n_tokens: int, n_kv: int, n_outputs: int, embeddings: bool = False,
                   n_seqs: int = 1, from_embd: bool = False, n_cross: int = 0,
                   separate_rows: bool = False) -> ModelGraph:
        """The allocated graph for this shape (n_tokens, n_kv, n_outputs, embeddings, n_seqs, from_embd,
        n_cross: the encoder output rows a T5 decoder reads; separate_rows: each token is another
        sequence's, see mark_separate_rows). When the shape repeats (decode steps)
        the previous graph is reused as it is: its tensors keep their addresses, so only the inputs
        change. Graphs of a few tokens (SMALL_GRAPH_TOKENS) stay
        built, each on its own scheduler, for the last SMALL_GRAPHS shapes: a loop that alternates
        shapes (a draft model's catch-up and single steps, the server's steps as sequences come
        and go) reuses them instead of building and planning them again."""
        shape = (n_tokens, n_kv, n_outputs, embeddings, n_seqs, from_embd, n_cross, separate_rows)
        if n_tokens <= SMALL_GRAPH_TOKENS and self.sched.callback_eval is None:
            return self._small_graph(shape)
        g = self._graph
        if g is not None and (g.n_tokens, g.n_kv, g.n_outputs, g.embeddings, g.n_seqs, g.embd is not None,
                              0 if g.cross is None else g.cross.ne[1], g.separate_rows) == shape:
            return g
        g = self._graph = self._build(*shape)
        backend_sched_reset(self.sched)
        if not backend_sched_alloc_graph(self.sched, g.graph):
            self._graph = None
            raise MemoryError(f"{self.path}: cannot allocate the graph for {n_tokens} tokens")
        return g

    def _small_graph(self, shape: tuple) -> ModelGraph:
        g = self._small_graphs.get(shape)
        if g is not None:
            self._small_graphs.move_to_end(shape)
            return g
        g = self._build(*shape)
        g.sched = backend_sched_new(self.backends, None, graph_size(self.hp), False, True)
        if not backend_sched_alloc_graph(g.sched, g.graph):
            backend_sched_free(g.sched)
            raise MemoryError(f"{self.path}: cannot allocate the graph for {shape[0]} tokens")
        self._small_graphs[shape] = g
        if len(self._small_graphs) > SMALL_GRAPHS:
            backend_sched_free(self._small_graphs.popitem(last=False)[1].sched)
        return g

    def _free_small_graphs(self) -> None:
        for g in self._small_graphs.values():
            backend_sched_free(g.sched)
        self._small_graphs.clear()

    # ------------------------------------------------------------ evaluation

    @property
    def n_vocab(self) -> int:
        return self.hp.n_vocab if self.hp else self.tokenizer.n_vocab

    @property
    def n_past(self) -> int:
        """Tokens in the KV cache (of every sequence)."""
        self._require_weights("n_past")
        return self.memory.n_past

    def _require_weights(self, what: str) -> None:
        if self.closed:
            raise ModelClosedError(f"{what}: the model {self.path} was closed")
        if self.vocab_only:
            raise RuntimeError(f"{what}: {self.path} was loaded with vocab_only=True (no weights)")

    def reset(self, seq_id: int | None = None) -> None:
        """Empty the KV cache (or forget one sequence), zeroing the cells: the next eval of it
        starts at position 0."""
        with self.lock:
            self._require_weights("reset")
            self.memory.clear(seq_id)
            self.sequences.changed(None if seq_id is None else [int(seq_id)])

    def keep_prefix(self, seq_id: int, n: int) -> bool:
        """Sequence seq_id keeps its first n positions and forgets the rest (llama.cpp's seq_rm
        from n); False, changing nothing, where the memory cannot go back (recurrent states)."""
        with self.lock:
            self._require_weights("keep_prefix")
            if self.memory.keep_prefix is None:
                return False
            self.memory.keep_prefix(seq_id, n)
            self.sequences.changed([int(seq_id)])
            return True

    def can_shift(self) -> str | None:
        """None where shift() works on this model; otherwise why not (kv_shift.k_rotation)."""
        from .kv_shift import k_rotation
        return k_rotation(self)[1]

    def shift(self, seq_id: int, p0: int, p1: int, delta: int) -> None:
        """Sequence seq_id's positions [p0, p1) move by delta, their K re-rotated (llama.cpp's
        seq_add with its K shift); positions [p0 + delta, p1 + delta) must be free of it.
        ValueError where the model's K cannot be shifted (can_shift says why)."""
        from .kv_shift import k_rotation
        with self.lock:
            self._require_weights("shift")
            rotate, why = k_rotation(self)
            if rotate is None:
                raise ValueError(f"{self.path}: its KV cache cannot be shifted: {why}")
            self.memory.attention.shift(seq_id, p0, p1, delta, rotate)
            self.sequences.changed([int(seq_id)])

    def remove(self, seq_id: int, p0: int, p1: int) -> None:
        """Sequence seq_id forgets its positions [p0, p1) (llama.cpp's seq_rm; KV caches only)."""
        with self.lock:
            self._require_weights("remove")
            if self.memory.keep_prefix is None:
                raise ValueError(f"{self.path}: its {type(self.memory).__name__} cannot forget positions")
            self.memory.attention.remove(seq_id, p0, p1)
            self.sequences.changed([int(seq_id)])

    def save_seq(self, seq_id: int):
        """A host copy of sequence seq_id's memory (SeqCells: KV cells, recurrent states), for
        load_seq; ValueError where the memory cannot copy one out."""
        with self.lock:
            self._require_weights("save_seq")
            if self.memory.save_seq is None:
                raise ValueError(f"{self.path}: its {type(self.memory).__name__} cannot copy a sequence's state out")
            return self.memory.save_seq(seq_id)

    def load_seq(self, seq_id: int, saved, n: int | None = None) -> None:
        """Sequence seq_id holds the first n positions (all: None) of a save_seq copy (a recurrent
        state only all of them); the next token it evaluates is at position n."""
        with self.lock:
            self._require_weights("load_seq")
            if self.memory.load_seq is None:
                raise ValueError(f"{self.path}: its {type(self.memory).__name__} cannot load a sequence's state")
            self.memory.load_seq(seq_id, saved, n)
            self.sequences.changed([int(seq_id)])

    def _token_ids(self, tokens) -> np.ndarray:
        """The ids as int32, the graph's input type (checked here against the vocabulary, so
        writing them needs no range check)."""
        if type(tokens) is list and len(tokens) == 1 and type(tokens[0]) is int:  # a decode step's token
            if not 0 <= tokens[0] < self.n_vocab:
                raise ValueError(f"eval: token id {tokens[0]} is outside the vocabulary [0, {self.n_vocab})")
            return np.array(tokens, dtype=np.int32)
        values = token_id_array(tokens, self.path)
        if values.size and (values.min() < 0 or values.max() >= self.n_vocab):
            bad = values[(values < 0) | (values >= self.n_vocab)][0]
            raise ValueError(f"eval: token id {int(bad)} is outside the vocabulary [0, {self.n_vocab})")
        return values.astype(np.int32)

    def eval(self, tokens, seq_id: int = 0, logits: str = "all") -> torch.Tensor:
        """Run `tokens` (after the cached ones of sequence seq_id) and return logits, float32:
        logits="all" (default): every token's, [len(tokens), n_vocab] (scoring, perplexity);
        logits="last": only the last token's, [1, n_vocab] (what generation needs: llama.cpp's
        default batch, whose last token alone has its logits flag set). "last" skips the output
        head, the output norm and the last layer's FFN for the other tokens; the KV cache ends
        the same either way. A string rather than llama-cpp-python's bool `logits_all` so the call
        says which logits it gets. The tokens are processed in micro-batches of n_batch tokens.
        NonFiniteLogitsError when the computed logits are not all finite (the cache is then left
        as it was before this call)."""
        with self.lock:
            self._require_weights("eval")
            ids = self._token_ids(tokens)
            if ids.size == 1 and logits in LOGITS:
                out = self._eval_one(ids, int(seq_id))
                if out is not None:
                    return out
            outputs = self._output_flags([ids.size], logits, "eval")
            return self._eval_tokens(ids, np.full(ids.size, int(seq_id), dtype=np.int64), outputs)

    def eval_embeddings(self, values: torch.Tensor, seq_id: int = 0, logits: str = "all",
                        causal: bool = True, grid: tuple[int, int] | None = None) -> torch.Tensor:
        """As eval, for input embeddings instead of token ids (llama_batch.embd): values float
        [n_tokens, n_embd], e.g. an image's rows from its projector (torchggml.mtmd), each taking
        one position after sequence seq_id's cached tokens. causal=False: the rows attend to each
        other both ways (llama_set_causal_attn(false), as Gemma 3 reads an image); they are then
        evaluated in one micro-batch, so at most n_batch of them. Rows are n_embd wide (qwen3vl:
        n_embd_inp, with its deepstack slices). grid=(width, height): the rows are an image's
        width x height tokens in row order; a multi-axis RoPE model (qwen2vl, qwen3vl) rotates
        them at (p, p + row, p + column, 0) from the sequence's next rotary position p, and the tokens
        after them start max(width, height) positions on, as llama.cpp's M-RoPE images do."""
        with self.lock:
            self._require_weights("eval_embeddings")
            values = torch.as_tensor(values)
            width = self.hp.n_embd_inp
            if values.dim() != 2 or values.shape[1] != width or not values.is_floating_point():
                raise ValueError(f"eval_embeddings: values must be float [n_tokens, {width}] "
                                 f"(the model's input width), got {values.dtype} {list(values.shape)}")
            n = int(values.shape[0])
            rope4, jump = None, None
            if grid is not None and self.hp.rope_sections:
                gx, gy = (int(v) for v in grid)
                if gx * gy != n:
                    raise ValueError(f"eval_embeddings: grid {gx}x{gy} is not the {n} rows given")
                start = self.memory.seq_len(seq_id)
                p = int(self.memory.rope_positions(np.array([seq_id]), np.array([start], np.int32))[0])
                i = np.arange(n)
                rope4 = np.stack([np.full(n, p), p + i // gx, p + i % gx, np.zeros(n, np.int64)]).astype(np.int32)
                jump = (start + n, max(gx, gy) - n)
            if not causal:
                if not hasattr(self.memory, "causal"):
                    raise ValueError(f"eval_embeddings: causal=False needs a KV cache; {self.path}'s memory is "
                                     f"{type(self.memory).__name__}")
                if n > self.n_batch:
                    raise ValueError(f"eval_embeddings: {n} non-causal rows must fit one micro-batch "
                                     f"(n_batch={self.n_batch}); load the model with a larger n_batch")
            outputs = self._output_flags([n], logits, "eval_embeddings")
            values = values.detach().to("cpu", torch.float32).contiguous()
            causal_before = getattr(self.memory, "causal", True)
            if not causal:
                self.memory.causal = False
            try:
                out = self._eval_tokens(np.zeros(n, dtype=np.int32), np.full(n, int(seq_id), dtype=np.int64),
                                        outputs, embd=values, rope4=rope4)
                if jump is not None:
                    self.memory.add_rope_jump(seq_id, *jump)
                return out
            finally:
                if not causal:
                    self.memory.causal = causal_before

    def eval_batch(self, sequences, seq_ids: Sequence[int] | None = None,
                   logits: str | Sequence[str] = "all") -> list[torch.Tensor]:
        """Run several sequences at once, each after its own cached tokens (one KV cache holds
        them all, as llama.cpp's unified cache does): sequences[i] continues sequence seq_ids[i]
        (default i). Returns each one's logits: [len(sequences[i]), n_vocab] with logits="all",
        its last token's [1, n_vocab] with logits="last" (see eval); `logits` may also be one
        choice per sequence (a speculative step wants every row of the drafted sequences only)."""
        with self.lock:
            self._require_weights("eval_batch")
            return self._eval_batch(sequences, seq_ids, logits)

    def embed(self, tokens, pooling: str | None = None, seq_id: int | None = None,
              normalize: int = 2) -> torch.Tensor:
        """The embedding of `tokens` (ids; a text is tokenized): the final hidden states (the
        output norm's, before the head; an encoder's last layer), pooled as llama.cpp pools them:
        "mean" over the tokens, "cls" (the first token's), "last", "none" (every token's,
        [n_tokens, n_embd]) or "rank" (an encoder's classifier head over the first token or the mean,
        as its classifier.pooling_type says: the reranking scores, [n_cls_out]). pooling None: the file's {arch}.pooling_type, mean when it
        has none. Each vector is normalized as llama.cpp's --embd-normalize: 2 (default)
        Euclidean, -1 none, 0 max-absolute scaled to the int16 range, 1 taxicab, p > 2 the
        p-norm; rank scores are never normalized. Float32. The tokens are evaluated as sequence
        seq_id (default: one no other sequence uses), whose cells are freed afterwards, so other
        sequences in the cache are left as they were; an encoder (non-causal attention) takes them
        in one micro-batch, so at most n_batch tokens."""
        with self.lock:
            self._require_weights("embed")
            ids = self._token_ids(self.tokenize(tokens) if isinstance(tokens, str) else tokens)
            if ids.size == 0:
                raise ValueError("embed: no tokens")
            pooling = self.pooling_type if pooling is None else pooling
            if pooling not in POOLING:
                raise ValueError(f"embed: pooling={pooling!r}; choose one of {', '.join(POOLING)}")
            if pooling == "rank" and not hasattr(self.arch, "rank"):
                raise ValueError(f"embed: pooling 'rank' needs an encoder with a classifier head; {self.hp.arch} "
                                 f"has none")
            if not self.hp.causal_attn and ids.size > self.n_batch:
                raise ValueError(f"embed: {ids.size} tokens do not fit one micro-batch of n_batch={self.n_batch}; "
                                 f"an encoder attends over the whole input (load it with a larger n_batch)")
            if seq_id is None:
                seq_id = max(self.memory.seq_next, default=-1) + 1
            if self.memory.seq_len(seq_id):
                raise ValueError(f"embed: sequence {seq_id} is in use")
            try:
                hidden = self._eval_tokens(ids, np.full(ids.size, int(seq_id), dtype=np.int64),
                                           np.ones(ids.size, dtype=bool), embeddings=True)
            finally:
                self.memory.clear(seq_id)
        if pooling == "rank":
            return self.arch.rank(self.weights, self.hp, hidden)
        pooled = hidden.mean(dim=0) if pooling == "mean" else {"cls": hidden[0], "last": hidden[-1],
                                                               "none": hidden}[pooling]
        return normalize_embeddings(self.arch.project_pooled(self.weights, pooled), normalize)

    def encode(self, tokens) -> torch.Tensor:
        """Run an encoder-decoder model's encoder (T5) over `tokens` (ids; a text is tokenized),
        as llama_encode: the tokens attend to each other both ways, in one micro-batch (at most
        n_batch of them). Returns the encoder's output [n_tokens, n_embd], float32, and keeps it
        for the decoder's cross-attention: eval / generate then run the decoder over it. The KV
        cache's sequences are left as they were."""
        with self.lock:
            self._require_weights("encode")
            if not getattr(self.arch, "encoder_decoder", False):
                raise ValueError(f"encode: {self.hp.arch} is not an encoder-decoder model")
            ids = self._token_ids(self.tokenize(tokens) if isinstance(tokens, str) else tokens)
            if not 0 < ids.size <= self.n_batch:
                raise ValueError(f"encode: {ids.size} tokens; the encoder takes 1 to n_batch={self.n_batch} "
                                 f"(load the model with a larger n_batch)")
            seq_id = max(self.memory.seq_next, default=-1) + 1
            causal, self.memory.causal = self.memory.causal, False
            try:
                self.cross = self._eval_tokens(ids, np.full(ids.size, seq_id, dtype=np.int64),
                                               np.ones(ids.size, dtype=bool), embeddings=True)
            finally:
                self.memory.causal = causal
                self.memory.clear(seq_id)
            return self.cross

    def decoder_start_token(self) -> int:
        """The decoder's first token: the file's decoder_start_token_id, else BOS (as llama.cpp's
        examples choose it)."""
        start = getattr(self.hp, "dec_start_token_id", -1)
        if start < 0:
            start = self.tokenizer.bos_id
        if start is None or start < 0:
            raise ValueError(f"{self.path}: no decoder start token (decoder_start_token_id, or a BOS token)")
        return int(start)

    @property
    def pooling_type(self) -> str:
        """The file's {arch}.pooling_type as a name of POOLING (llama.cpp's enum: 0 none, 1 mean,
        2 cls, 3 last, 4 rank); mean when absent or unspecified."""
        value = self.file.get(f"{self.file.arch}.pooling_type", None)
        return {0: "none", 2: "cls", 3: "last", 4: "rank"}.get(value, "mean")

    def _eval_batch(self, sequences, seq_ids, logits) -> list[torch.Tensor]:
        seq_ids = list(range(len(sequences))) if seq_ids is None else [int(s) for s in seq_ids]
        if len(seq_ids) != len(sequences) or len(set(seq_ids)) != len(seq_ids):
            raise ValueError(f"eval_batch: {len(sequences)} sequences need as many distinct seq_ids, got {seq_ids}")
        ids = [self._token_ids(t) for t in sequences]
        lengths = [t.size for t in ids]
        outputs = self._output_flags(lengths, logits, "eval_batch")
        if len(ids) == 1:  # one sequence (a decode step of one generation): no splitting
            out = self._eval_one(ids[0], seq_ids[0]) if lengths[0] == 1 else None
            return [out if out is not None else
                    self._eval_tokens(ids[0], np.full(lengths[0], seq_ids[0], dtype=np.int64), outputs)]
        flat = np.concatenate(ids) if ids else np.empty(0, dtype=np.int32)
        seqs = np.repeat(np.asarray(seq_ids, dtype=np.int64), lengths)
        rows = [int(np.count_nonzero(flags)) for flags in np.split(outputs, np.cumsum(lengths)[:-1])] if ids else []
        return list(self._eval_tokens(flat, seqs, outputs).split(rows))

    @staticmethod
    def _output_flags(lengths: list[int], logits, what: str) -> np.ndarray:
        """Bool per token of the concatenated sequences: is its logits row computed
        (llama.cpp's batch.logits)? Every token for "all", each sequence's last for "last"; a
        list gives each sequence its own choice."""
        choices = [logits] * len(lengths) if isinstance(logits, str) else (
            list(logits) if isinstance(logits, (list, tuple)) else None)
        if choices is None or len(choices) != len(lengths) or any(c not in LOGITS for c in choices):
            raise ValueError(f"{what}: logits={logits!r}; choose 'all' (every token's logits) or 'last' "
                             f"(only the last token's), or one of them per sequence")
        if all(c == "all" for c in choices):
            return np.ones(sum(lengths), dtype=bool)
        flags, end = np.zeros(sum(lengths), dtype=bool), 0
        for n, choice in zip(lengths, choices):  # a Python loop: a decode step has few sequences
            if choice == "all":
                flags[end:end + n] = True
            elif n:
                flags[end + n - 1] = True
            end += n
        return flags

    def _eval_tokens(self, ids: np.ndarray, seq_ids: np.ndarray, outputs: np.ndarray,
                     embeddings: bool = False, embd: torch.Tensor | None = None,
                     rope4: np.ndarray | None = None) -> torch.Tensor:
        """The logits rows (with `embeddings`: the hidden-state rows) of the tokens flagged in
        `outputs`, in token order. ids int32, seq_ids int64, outputs bool: numpy arrays, whose small
        operations cost a fraction of torch's (a decode step is a few dozen of them).
        embd: float32 [n_tokens, n_embd] input rows read instead of the ids (then unread).
        rope4: int32 [4, n_tokens] multi-axis rotary positions in place of the tokens' own."""
        width = self.hp.n_embd if embeddings else self.n_vocab
        if ids.size == 0:
            return torch.empty(0, width)
        seqs = [int(seq_ids[0])] if seq_ids.size == 1 else np.unique(seq_ids).tolist()
        self.sequences.check(seqs, held=self.lock.depth > 1)
        self.sequences.changed(seqs)  # a failed eval may have changed them too
        whole = self.memory.plan(seq_ids)  # raises early when the cache cannot hold them all
        out = torch.empty(int(np.count_nonzero(outputs)), width)
        before = self.memory.snapshot()
        # micro-batches: runs of n_batch tokens, or (recurrent memory) equal shares of each sequence
        ubatches = self.memory.ubatches(seq_ids, self.n_batch)
        whole_batch = len(ubatches) == 1 and isinstance(ubatches[0], slice) and ubatches[0] == slice(0, ids.size)
        row_of = None if whole_batch else np.cumsum(outputs) - 1  # each output token's row of `out`
        for idx in ubatches:
            if whole_batch:  # one micro-batch in token order (a decode step): its plan is made, its rows are out's
                logits = out
                self._eval_ubatch(ids, seq_ids, outputs, logits, embeddings, whole, embd, rope4)
            elif isinstance(idx, slice):  # a run of tokens in order: its rows are a run of out's, written there
                flags_i = outputs[idx]
                first = int(row_of[idx.start]) + 1 - int(outputs[idx.start])  # outputs before the run
                logits = out[first: first + int(np.count_nonzero(flags_i))]
                self._eval_ubatch(ids[idx], seq_ids[idx], flags_i, logits, embeddings,
                                  embd=None if embd is None else embd[idx],
                                  rope4=None if rope4 is None else rope4[:, idx])
            else:
                flags_i = outputs[idx]
                logits = torch.empty(int(np.count_nonzero(flags_i)), width)
                self._eval_ubatch(ids[idx], seq_ids[idx], flags_i, logits, embeddings,
                                  embd=None if embd is None else embd[torch.as_tensor(np.arange(ids.size)[idx])])
                out[torch.from_numpy(row_of[idx][flags_i])] = logits
            if not all_finite(logits.numpy()):
                finite = torch.isfinite(logits).all(dim=1)
                # the cells written may hold NaN: zero them so no later call can read them
                self.memory.restore(before)
                bad = int(np.arange(ids.size)[idx][outputs[idx]][int((~finite).nonzero()[0])])
                n_past = self.memory.seq_len(int(seq_ids[bad])) + int((seq_ids[:bad] == seq_ids[bad]).sum())
                raise self._non_finite(bad, n_past)
        return out

    def _non_finite(self, token: int, position: int) -> NonFiniteLogitsError:
        return NonFiniteLogitsError(f"{self.path}: eval produced non-finite logits (first at token {token}, "
                                    f"position {position}); the cache was restored to {self.memory.n_past} tokens")

    def _eval_one(self, ids: np.ndarray, seq_id: int) -> torch.Tensor | None:
        """A decode step: one token (ids, int32 [1]) after sequence seq_id's cached ones, its
        logits [1, n_vocab], as _eval_tokens computes them with less host work: one micro-batch,
        nothing to split or gather. None where the graph needs the general path (an encoder's
        output, multi-axis positions)."""
        if getattr(self.arch, "encoder_decoder", False):
            return None
        seq = [seq_id]
        self.sequences.check(seq, held=self.lock.depth > 1)
        self.sequences.changed(seq)
        memory = self.memory
        batch = memory.plan(np.array(seq, dtype=np.int64))  # raises when the memory cannot hold it
        g = self._graph_for(1, batch.n_kv, 1, False, batch.n_seqs, False, 0, False)
        if g.embd is not None or g.position_inputs or g.out_ids is not None:
            return None
        self.last_graph = g
        before = memory.snapshot()
        g.io.set(g.tokens, ids)
        if g.positions is not None:
            g.io.set(g.positions, batch.positions)
        memory.set_inputs(g, batch)
        self._compute(g, batch)
        memory.commit(batch)
        out = torch.empty(1, self.n_vocab)
        values = out.numpy()
        g.io.get(g.logits, values)
        if not all_finite(values):
            memory.restore(before)  # (zeroes what it wrote, which may hold NaN)
            raise self._non_finite(0, memory.seq_len(seq_id))
        return out

    def _eval_ubatch(self, ids: np.ndarray, seq_ids: np.ndarray, outputs: np.ndarray,
                     logits: torch.Tensor, embeddings: bool = False, batch=None,
                     embd: torch.Tensor | None = None, rope4: np.ndarray | None = None) -> None:
        """One micro-batch (`batch`: the memory's plan for it, when made already); the rows of
        the tokens flagged in `outputs` are written to `logits`. embd: its input rows, if any;
        rope4: its multi-axis rotary positions [4, n_tokens], if given."""
        batch = batch or self.memory.plan(seq_ids)
        n_tokens, n_outputs = ids.size, logits.shape[0]
        cross = self.cross if getattr(self.arch, "encoder_decoder", False) and not embeddings else None
        # a batched decode step (each token another sequence's): each row multiplied as one alone
        separate_rows = 1 < n_tokens == np.unique(seq_ids).size
        g = self.last_graph = self._graph_for(n_tokens, batch.n_kv, n_outputs, embeddings, batch.n_seqs,
                                              embd is not None, 0 if cross is None else cross.shape[0], separate_rows)
        # the scheduler keeps user inputs in CPU memory and copies them where they are read
        if g.cross is not None:
            g.io.set(g.cross, cross)
        if g.embd is not None:
            g.io.set(g.embd, embd)
        else:
            g.io.set(g.tokens, ids)
        if g.positions is not None:
            g.io.set(g.positions, batch.positions)
        self.memory.set_inputs(g, batch)  # the memory's inputs: cache cells and masks, state slots
        positions = batch.positions
        if self.memory.rope_positions is not None:  # M-RoPE images take fewer positions than tokens
            positions = self.memory.rope_positions(batch.seq_ids, positions)
        for tensor, values in g.position_inputs:
            if rope4 is not None and tensor.name == POSITIONS_4D:
                g.io.set(tensor, torch.from_numpy(np.ascontiguousarray(rope4).reshape(-1)))
            else:
                g.io.set(tensor, values(torch.from_numpy(positions)))
        if g.out_ids is not None:
            g.io.set(g.out_ids, np.flatnonzero(outputs))
        self._compute(g, batch)
        self.memory.commit(batch)
        if n_outputs:
            g.io.get(g.logits, logits.numpy())

    def _compute(self, g: ModelGraph, batch) -> None:
        """Run graph g, whose inputs are set, for the memory's `batch` (not committed here)."""
        self.memory.mark_written(batch)
        self.file.check_unchanged()  # a truncated file would fault (SIGBUS) in the weights' pages
        status = backend_sched_graph_compute(g.sched or self.sched, g.graph)
        if int(status) != 0:
            raise RuntimeError(f"{self.path}: graph compute failed with status {status!r}")

    # ------------------------------------------------------------ text

    @property
    def tokenizer(self):
        """The Tokenizer, built from the file's metadata on first use: a model whose
        tokenizer cannot be used (e.g. an unknown pre-tokenizer) still evaluates token ids."""
        if self._tokenizer is None:
            from ..text.tokenizer import Tokenizer
            self._tokenizer = Tokenizer.from_gguf(self.file)
        return self._tokenizer

    def tokenize(self, text: str, add_special: bool = True, parse_special: bool = False) -> list[int]:
        return self.tokenizer.tokenize(text, add_special, parse_special)

    def chat_template(self, override: str | None = None):
        """The ChatTemplate (torchggml.text.chat) this model's chats use: `override` (a built-in name
        such as "gemma", or Jinja), else self.chat_template_override, else the file's
        tokenizer.chat_template, else chatml as llama.cpp falls back to (its `note` says so)."""
        from ..text.chat import choose_template
        return choose_template(self.tokenizer.chat_template, override or self.chat_template_override, self.path)

    def chat_prompt(self, messages, add_generation_prompt: bool = True) -> str:
        """The prompt text for `messages` ([{"role": "user", "content": ...}, ...]), rendered
        with chat_template() in a Jinja2 sandbox (torchggml.text.chat)."""
        from ..text.chat import render_chat
        tok = self.tokenizer
        text = lambda i: tok.token_text(i) if i is not None else ""
        return render_chat(self.chat_template().text, messages, add_generation_prompt=add_generation_prompt,
                           bos_token=text(tok.bos_id), eos_token=text(tok.eos_id), source=self.path)

    def chat_stops(self) -> list[str]:
        """Stop strings a chat needs beyond the end-of-generation tokens: a built-in format's
        end of turn where the vocabulary has no such token."""
        end = self.chat_template().turn_end
        return [end] if end and self.tokenizer.text_to_token(end) is None else []

    def chat(self, messages, **generate_args) -> Iterator[str]:
        """Stream the assistant's reply to `messages` (see chat_prompt); `generate_args` as
        for generate. Special tokens in the rendered prompt are parsed; BOS is added unless
        the template wrote it."""
        prompt = self.chat_prompt(messages)
        tok = self.tokenizer
        has_bos = tok.bos_id is not None and prompt.startswith(tok.token_text(tok.bos_id))
        generate_args["stop"] = list(generate_args.get("stop") or ()) + self.chat_stops()
        return self.generate(self.tokenize(prompt, add_special=not has_bos, parse_special=True), **generate_args)

    def detokenize(self, ids: Iterable[int]) -> str:
        return self.tokenizer.detokenize(list(ids))

    def generate(self, prompt, max_tokens: int = 128, *, stop: Sequence[str] = (), constraint=None,
                 draft=None, n_draft: int = 8, **sampling) -> Iterator[str]:
        """Stream the text of up to max_tokens sampled tokens after `prompt`: text, token ids, or a
        list of parts (texts, token-id lists, EmbeddingChunks such as an image's, ending with text;
        see prompt.py). `sampling`: SamplingParams' fields (temperature, top_k, top_p, min_p, seed, the penalties;
        their defaults are SamplingParams'); `stop`: strings that end the text (not included);
        `constraint`: a grammar (generation.Constraint, e.g. torchggml.server.grammar's) that
        masks the tokens allowed next; `draft`: speculative decoding, "ngram" (prompt lookup), a
        draft Model of the same vocabulary, or a speculative.* draft, proposing up to n_draft
        tokens a step (the same text; see models/speculative.py). The KV cache starts empty and keeps the text afterwards;
        generation stops at an end-of-generation token, a stop string, a complete grammar or a
        full cache. `self.timings` has the prompt and generation speeds afterwards. The model is
        held (other threads wait) from the first item until the generator ends or is closed.
        generate_tokens() gives the tokens with their log-probabilities instead of text."""
        gen = self.generation(prompt, max_tokens, SamplingParams(**sampling), stop, constraint, what="generate")
        for update in self._run_generations([gen], "generate", draft, n_draft):
            for text in (update.text, update.rest):
                if text:
                    yield text

    def generate_tokens(self, prompt, max_tokens: int = 128, params: SamplingParams | None = None,
                        stop: Sequence[str] = (), constraint=None) -> Iterator[TokenChoice]:
        """As generate, but yield each sampled token as a TokenChoice (with params.logprobs set:
        its log-probability and the top alternatives')."""
        gen = self.generation(prompt, max_tokens, params, stop, constraint, what="generate_tokens")
        for update in self._run_generations([gen], "generate_tokens"):
            yield from update.choices

    def generate_batch(self, prompts, max_tokens: int = 128, *, stop: Sequence[str] = (),
                       constraints: Sequence | None = None, **sampling) -> list[str]:
        """The text of up to max_tokens sampled tokens after each prompt (texts, or lists of token
        ids), generated together by the loop generate uses (batch_generator.py): one batch per step
        holding the next token of every sequence still going, prompts in chunks beside them. Every
        option of generate applies to each sequence (`constraints`: one grammar per prompt, or
        None); with a seed, sequence i draws from seed + i. Each sequence may use n_ctx / len(prompts)
        cells. The KV cache starts empty."""
        if getattr(self.arch, "encoder_decoder", False) and len(prompts) != 1:
            raise ValueError(f"generate_batch: {self.hp.arch} is an encoder-decoder model: one prompt at a time "
                             f"(its decoder reads one encoder output)")
        if constraints is not None and len(constraints) != len(prompts):
            raise ValueError(f"generate_batch: {len(constraints)} constraints for {len(prompts)} prompts")
        params = SamplingParams(**sampling)
        gens = [self.generation(p, max_tokens, params if params.seed is None else replace(params, seed=params.seed + i),
                                stop, constraints[i] if constraints is not None else None, what="generate_batch")
                for i, p in enumerate(prompts)]
        if not gens:
            raise ValueError("generate_batch: give at least one prompt")
        texts = [[] for _ in gens]
        for update in self._run_generations(gens, "generate_batch"):
            texts[update.seq.seq_id] += [update.text, update.rest]
        return ["".join(t) for t in texts]

    def _tokenize_part(self, text: str, first: bool) -> list[int]:
        return self.tokenize(text, first, parse_special=True)

    def generation(self, prompt, max_tokens: int = 128, params: SamplingParams | None = None,
                   stop: Sequence[str] = (), constraint=None, ignore_eos: bool = False,
                   what: str = "generation") -> Generation:
        """A Generation of `prompt` (text, token ids, or parts: see generate) for the decode loop
        (BatchGenerator). A prompt with embeddings gets its `prefix`: the parts the loop evaluates
        into the cache before it starts from the prompt's last token; its prompt ids hold 0 for each
        embedding row (cells only), and the sampler's history is the text's tokens."""
        self._require_weights(what)
        params = params or SamplingParams()
        if is_parts(prompt):
            parts = prompt_parts(prompt, self._tokenize_part, what)
            if any(isinstance(p, EmbeddingChunk) for p in parts):
                if isinstance(parts[-1], EmbeddingChunk):
                    raise ValueError(f"{what}: a prompt with embeddings must end with text (its last token starts "
                                     f"the generation)")
                ids = np.concatenate([p if isinstance(p, np.ndarray) else np.zeros(len(p), np.int32) for p in parts])
                gen = Generation(self.tokenizer, ids.tolist(), params, max_tokens, stop, constraint, ignore_eos)
                gen.sampler = Sampler(params, history=[int(i) for p in parts if isinstance(p, np.ndarray) for i in p])
                gen.prefix = parts[:-1] + [parts[-1][:-1]]
                return gen
            prompt = np.concatenate(parts).tolist()
        ids = self.tokenize(prompt) if isinstance(prompt, str) else [int(i) for i in prompt]
        if not ids:
            raise ValueError(f"{what}: the prompt has no tokens")
        if getattr(self.arch, "encoder_decoder", False):  # T5: the prompt is the encoder's input
            self.encode(ids)
            ids = [self.decoder_start_token()]
        return Generation(self.tokenizer, ids, params, max_tokens, stop, constraint, ignore_eos)

    def eval_parts(self, parts, seq_id: int = 0) -> torch.Tensor | None:
        """Evaluate a prompt's parts in order (see prompt.py) after sequence seq_id's cached
        tokens and return the last one's logits [1, n_vocab]."""
        with self.lock:
            self._require_weights("eval_parts")
            logits = None
            for p in prompt_parts(parts, self._tokenize_part, "eval_parts"):
                if isinstance(p, EmbeddingChunk):
                    logits = self.eval_embeddings(p.values, seq_id, logits="last", causal=p.causal, grid=p.grid)
                else:
                    logits = self.eval(p, seq_id, logits="last")
            return logits

    def _run_generations(self, gens: list[Generation], what: str, draft=None, n_draft: int = 8) -> Iterator[Update]:
        """Run `gens` together on an empty cache (sequence i is gens[i]; each may use n_ctx / len(gens)
        cells), yielding every step's updates; a sequence's own sampling error is raised."""
        with self.lock:
            self._require_weights(what)
            if draft is not None and any(g.prefix is not None for g in gens):
                raise ValueError(f"{what}: speculative decoding does not take prompts with embeddings")
            self.reset()
            self.timings = t = Timings(load_s=self.timings.load_s, warmup_s=self.timings.warmup_s)
            batch = BatchGenerator(self, keep_finished=True, draft=make_draft(draft, self), n_draft=n_draft)
            start = time.perf_counter()
            seqs = []
            for i, gen in enumerate(gens):
                seqs.append(batch.add(gen, i, self.n_ctx // len(gens)))
            while batch.active:
                updates = batch.step()
                t.drafted += batch.last.drafted
                t.accepted += batch.last.accepted
                for update in updates:
                    if update.error is not None:
                        raise update.error
                    t.gen_tokens += len(update.choices)
                    yield update
            end = time.perf_counter()
            prompt_end = max(s.prompt_done_at or end for s in seqs)
            t.prompt_tokens = sum(len(g.prompt) for g in gens)
            t.prompt_s, t.gen_s = prompt_end - start, end - prompt_end

    # ------------------------------------------------------------ misc

    def describe(self) -> str:
        if self.vocab_only:
            return f"{self.path}: vocabulary only ({self.tokenizer!r})"
        hp = self.hp
        extras = "".join([f", {hp.n_expert} experts ({hp.n_expert_used} used)" if hp.n_expert else "",
                          f", sliding window {hp.n_swa} on {sum(hp.swa_layers)} layers" if any(hp.swa_layers) else "",
                          f", rope scaling {hp.rope_scaling}" if hp.rope_freq_scale != 1.0 or hp.yarn_ext_factor else ""])
        return (f"{self.path}: {hp.arch}, {hp.n_layer} layers, n_embd {hp.n_embd}, {hp.n_head} heads "
                f"({hp.n_head_kv} KV), n_vocab {hp.n_vocab}{extras}; n_ctx {self.n_ctx}, n_batch {self.n_batch}, "
                f"KV {self.kv_type.name}{', flash attention' if self.flash_attn else ''}; "
                f"{self.placement.describe()}{self._weights_memory()}")

    def _weights_memory(self) -> str:
        read_in = getattr(self.weight_buffers, "cpu_read_in", 0)
        return f"; {read_in / 2**20:.0f} MiB of CPU weights read into memory (not mapped)" if read_in else ""

    def close(self) -> None:
        """Free the compute, KV and weight buffers and close the file; a later eval raises
        ModelClosedError. Closing twice is allowed."""
        with self.lock:
            if self.closed:
                return
            self.closed = True
            if not self.vocab_only:
                self._free_compute()
            self.file.close()

    def _free_compute(self) -> None:
        self._free_small_graphs()
        backend_sched_free(self.sched)
        for b in self.memory.buffers:
            b.free()
        if self.lora is not None:
            self.lora.free()
        self.weight_buffers.free()
        for b in self.backends:
            backend_free(b)
        # drop every tensor that views the freed memory, so the file's mapping can close
        self._graph = self.last_graph = self._ctx = self.weights = self.weight_buffers = self.memory = self.sched = None
