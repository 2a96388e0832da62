"""Model: a GGUF model on one or more devices, with a KV cache, a tokenizer and generation.

    model = torchggml.load_model("model.gguf", devices=["CUDA0"])
    logits = model.eval(model.tokenize("Hello"))   # [n_tokens, n_vocab] float32, appends to the cache
    for text in model.generate("Once upon a time", max_tokens=32):
        print(text, end="")

Threads: a Model may be shared between threads. eval, generate, reset and close are serialized
by one lock per model, so calls from different threads run one after another (each result is
what that call would give alone, with the cache as the previous call left it); hold
`model.lock` to make a sequence of calls (reset, then eval) atomic. A generate()
holds the lock from its first item until it is exhausted or closed: iterate it to the end (or
close it) in the thread that started it.

Non-finite logits: an eval whose logits contain NaN or inf raises NonFiniteLogitsError; the
cache cells that batch wrote are zeroed and n_past is left where it was, so later calls are
not poisoned. reset() zeroes every cell written since the last reset.

close() frees the compute, KV and weight buffers and closes the file's mapping; a later eval,
generate or reset raises ModelClosedError.

Placement: every layer (its weights and its KV cache) lives on one device. On one device the
graph is planned by gallocr and run by that device's backend; across several devices the
scheduler (backend_sched) splits it and copies activations between them.
"""
from __future__ import annotations

import logging
import math
import threading
import time
from dataclasses import dataclass
from typing import Iterable, Iterator, Sequence

import torch

from ..backend.backend import (backend_graph_plan_create, backend_graph_plan_free,
                               backend_graph_plan_compute, backend_free, backend_synchronize)
from ..backend.device import Device, DeviceType
from ..backend.backend import backend_tensor_set_async
from ..backend.tensor_io import backend_tensor_set, backend_tensor_get
from ..context import Context
from ..gguf import GGUFFile, load_weights
from ..types import is_quantized
from .kv_cache import KVCache, kv_type_from_name
from .llama import HParams, LlamaWeights, LlamaGraph, build_graph, graph_size, tensor_layer

log = logging.getLogger(__name__)

# the default KV cache size caps the model's training context (which can be 128k tokens)
DEFAULT_MAX_CTX = 4096


# ---------------------------------------------------------------- devices and placement

def cpu_device() -> Device:
    from ..torch_backend.cpu import cpu_device as _cpu
    return _cpu()


def _registry():
    try:
        from ..backend import registry
    except ImportError:
        return None
    return registry


def all_devices() -> list[Device]:
    """Every device the registry knows (just the CPU until the registry exists)."""
    reg = _registry()
    if reg is None:
        return [cpu_device()]
    return [reg.backend_dev_get(i) for i in range(reg.backend_dev_count())]


def find_device(spec) -> Device:
    """A Device from a Device, or a name such as "CPU", "CUDA0", "SIM0" (case-insensitive)."""
    if isinstance(spec, Device):
        return spec
    name = str(spec)
    for dev in all_devices():
        if dev.get_name().lower() == name.lower():
            return dev
    known = ", ".join(d.get_name() for d in all_devices())
    raise ValueError(f"unknown device {name!r} (available: {known})")


def gpu_devices() -> list[Device]:
    return [d for d in all_devices() if d.get_type() != DeviceType.CPU]


@dataclass
class Placement:
    """Which device holds the input embeddings, each layer, and the output head."""
    input: Device
    layers: list[Device]
    output: Device

    @property
    def devices(self) -> list[Device]:
        """Distinct devices, accelerators first, the CPU last (the scheduler's priority order)."""
        seen = []
        for d in [*self.layers, self.input, self.output]:
            if all(d is not s for s in seen):
                seen.append(d)
        return sorted(seen, key=lambda d: d.get_type() == DeviceType.CPU)

    @property
    def single(self) -> bool:
        return len(self.devices) == 1

    def describe(self) -> str:
        runs = []
        for il, d in enumerate(self.layers):
            if runs and runs[-1][0] is d:
                runs[-1][2] = il
            else:
                runs.append([d, il, il])
        layers = ", ".join(f"{d.get_name()}: layers {a}-{b}" for d, a, b in runs)
        return f"input {self.input.get_name()}, {layers}, output {self.output.get_name()}"


def split_layers(n_layer: int, devices: Sequence[Device], tensor_split: Sequence[float] | None) -> list[Device]:
    """Consecutive runs of layers per device, in proportion to tensor_split (equal by default)."""
    if tensor_split is None:
        tensor_split = [1.0] * len(devices)
    if len(tensor_split) != len(devices) or any(s < 0 for s in tensor_split) or sum(tensor_split) <= 0:
        raise ValueError(f"tensor_split {list(tensor_split)} must give a non-negative share to each of "
                         f"the {len(devices)} devices")
    total = float(sum(tensor_split))
    bounds, acc = [], 0.0
    for s in tensor_split:
        acc += s
        bounds.append(round(n_layer * acc / total))
    out, start = [], 0
    for dev, end in zip(devices, bounds):
        out += [dev] * (end - start)
        start = end
    return out


def plan_placement(n_layer: int, devices=None, n_gpu_layers: int | None = None,
                   tensor_split: Sequence[float] | None = None) -> Placement:
    """llama.cpp's rules, with explicit devices as the shortcut:
    - nothing given: everything on the CPU;
    - devices only: the layers are split over them (tensor_split proportions), the input on the
      first and the output on the last;
    - n_gpu_layers (with `devices` or every accelerator): the last n_gpu_layers layers are split
      over the accelerators, the rest and the input stay on the CPU, the output moves when
      n_gpu_layers > n_layer."""
    devs = None if devices is None else [find_device(d) for d in ([devices] if isinstance(devices, (str, Device)) else devices)]
    if devs is not None and not devs:
        raise ValueError("devices is empty")
    cpu = cpu_device()
    if n_gpu_layers is None:
        if devs is None:
            return Placement(cpu, [cpu] * n_layer, cpu)
        layers = split_layers(n_layer, devs, tensor_split)
        return Placement(devs[0], layers, devs[-1])
    gpus = [d for d in (devs if devs is not None else gpu_devices()) if d.get_type() != DeviceType.CPU]
    n_gpu = max(0, min(int(n_gpu_layers), n_layer + 1))
    if not gpus or n_gpu == 0:
        if n_gpu and not gpus:
            log.warning("n_gpu_layers=%d but there is no accelerator: running on the CPU", n_gpu_layers)
        return Placement(cpu, [cpu] * n_layer, cpu)
    n_offload = min(n_gpu, n_layer)
    layers = [cpu] * (n_layer - n_offload) + split_layers(n_offload, gpus, tensor_split)
    return Placement(cpu, layers, layers[-1] if n_gpu > n_layer else cpu)


# ---------------------------------------------------------------- sampling

def sample_token(logits: torch.Tensor, temperature: float = 0.8, top_k: int = 40, top_p: float = 0.95,
                 generator: torch.Generator | None = None) -> int:
    """Temperature, then top-k, then top-p (nucleus) sampling; greedy when temperature <= 0."""
    if temperature <= 0:
        return int(torch.argmax(logits))
    logits = logits.double() / temperature
    if 0 < top_k < logits.numel():
        kth = torch.topk(logits, top_k).values[-1]
        logits = logits.masked_fill(logits < kth, -math.inf)
    probs = torch.softmax(logits, dim=-1)
    if 0 < top_p < 1:
        sorted_p, order = torch.sort(probs, descending=True)
        # keep the smallest prefix whose mass reaches top_p (always at least one token)
        keep = torch.cumsum(sorted_p, 0) - sorted_p < top_p
        probs = torch.zeros_like(probs).scatter_(0, order[keep], sorted_p[keep])
    return int(torch.multinomial(probs, 1, generator=generator))


# ---------------------------------------------------------------- the model

class ModelClosedError(RuntimeError):
    """The model was closed: its buffers are freed and it can no longer evaluate."""


class NonFiniteLogitsError(FloatingPointError):
    """An eval produced NaN or inf logits (its cache cells were zeroed, n_past not advanced)."""


@dataclass
class Timings:
    prompt_tokens: int = 0
    prompt_s: float = 0.0
    gen_tokens: int = 0
    gen_s: float = 0.0

    @property
    def prompt_tps(self) -> float:
        return self.prompt_tokens / self.prompt_s if self.prompt_s else 0.0

    @property
    def gen_tps(self) -> float:
        return self.gen_tokens / self.gen_s if self.gen_s else 0.0


class Model:
    """A loaded model. Use torchggml.load_model to make one."""

    def __init__(self, file: GGUFFile, tokenizer, hp: HParams | None = None, weights=None,
                 placement: Placement | None = None, n_ctx: int = 0, n_batch: int = 512,
                 flash_attn: bool = False, kv_type="f16", n_threads: int | None = None):
        self.file = file
        self.path = file.path
        self._tokenizer = tokenizer  # None: read from the file on first use
        self.hp = hp
        self.vocab_only = hp is None
        self.timings = Timings()
        self.closed = False
        # serializes eval/generate/reset/close (see the module doc); hold it (`with model.lock:`)
        # to make a sequence of calls, e.g. reset then eval, atomic
        self.lock = threading.RLock()
        if self.vocab_only:
            return
        self.weights = weights
        self.w = LlamaWeights.from_tensors(hp, weights.tensors, file.path)
        self.placement = placement
        self.n_ctx = n_ctx
        self.n_batch = n_batch
        self.flash_attn = flash_attn
        self.kv_type = kv_type_from_name(kv_type)
        if is_quantized(self.kv_type) and not flash_attn:
            raise ValueError(f"kv_type {kv_type!r} needs flash_attn=True: without flash attention the "
                             f"V cache is read transposed, which a block-quantized cache cannot do")
        self.kv = KVCache(hp.n_layer, n_ctx, hp.head_dim_k, hp.head_dim_v, hp.n_head_kv, self.kv_type,
                          [d.get_buffer_type() for d in placement.layers])
        self.lora = None  # a LoraAdapter applied to every graph (add_lora / load_lora)
        self._setup_compute(n_threads)

    # ------------------------------------------------------------ compute setup

    def _setup_compute(self, n_threads: int | None) -> None:
        devices = self.placement.devices
        if not self.placement.single and devices[-1].get_type() != DeviceType.CPU:
            devices.append(cpu_device())  # the scheduler runs inputs on the CPU, its last backend
        self.backends = [d.init_backend() for d in devices]
        if n_threads is not None:
            for b in self.backends:
                if hasattr(b, "set_n_threads"):
                    b.set_n_threads(n_threads)
        self._graph: LlamaGraph | None = None
        self._ctx: Context | None = None
        self._plan = None
        if self.placement.single:
            from ..alloc import gallocr_new, gallocr_reserve
            self.sched = None
            self.backend = self.backends[0]
            self.galloc = gallocr_new(self.backend.get_default_buffer_type())
            reserve = gallocr_reserve
        else:
            from ..backend.sched import backend_sched_new, backend_sched_reserve
            self.backend = None
            self.galloc = None
            self.sched = backend_sched_new(self.backends, None, graph_size(self.hp), False, True)
            reserve = backend_sched_reserve
        # plan the compute buffers for the largest micro-batch once, as llama.cpp does
        worst = self._build(min(self.n_batch, self.n_ctx), self.n_ctx)
        if not reserve(self.galloc or self.sched, worst.graph):
            raise MemoryError(f"{self.path}: cannot allocate the compute buffers")

    def _build(self, n_tokens: int, n_kv: int) -> LlamaGraph:
        self._ctx = Context(no_alloc=True)
        return self.build_graph(self._ctx, n_tokens, n_kv)

    def build_graph(self, ctx: Context, n_tokens: int, n_kv: int) -> LlamaGraph:
        """The forward graph of n_tokens attending to n_kv cache cells, LoRA included."""
        g = build_graph(ctx, self.hp, self.w, self.kv, n_tokens, n_kv, self.flash_attn)
        if self.lora is not None:
            replaced = self.lora.apply(ctx, g.graph)
            g.logits = replaced.get(id(g.logits), g.logits)
        return g

    # ------------------------------------------------------------ PyTorch integration

    def as_module(self):
        """This model as a torch.nn.Module (see torchggml/models/module.py)."""
        from .module import GGMLModule
        return GGMLModule(self)

    def add_lora(self, rank: int, targets=None, alpha: float | None = None, seed: int = 0):
        """Add trainable LoRA adapters (see torchggml/models/lora.py) and return them."""
        from .lora import LoraAdapter, DEFAULT_TARGETS
        self._require_weights("add_lora")
        return self.set_lora(LoraAdapter.create(self, rank, targets or DEFAULT_TARGETS, alpha, seed))

    def load_lora(self, path, scale: float = 1.0):
        """Apply a GGUF LoRA adapter file (llama.cpp's format) and return it."""
        from .lora import LoraAdapter
        self._require_weights("load_lora")
        return self.set_lora(LoraAdapter.load(self, path, scale))

    def set_lora(self, adapter):
        """Use `adapter` (or None) in every graph from now on; the previous one is freed."""
        if self.lora is not None and self.lora is not adapter:
            self.lora.free()
        self.lora = adapter
        self._graph = None  # the next eval builds (and allocates) a graph with the adapter
        return adapter

    def _graph_for(self, n_tokens: int, n_kv: int) -> LlamaGraph:
        """The allocated graph for this shape. When the shape repeats (decode steps) the previous
        graph is reused as it is: its tensors keep their addresses, so only the inputs change."""
        g = self._graph
        if g is not None and g.n_tokens == n_tokens and g.n_kv == n_kv:
            return g
        if self._plan is not None:
            backend_graph_plan_free(self.backend, self._plan)
            self._plan = None
        g = self._graph = self._build(n_tokens, n_kv)
        if self.sched is not None:
            from ..backend.sched import backend_sched_reset, backend_sched_alloc_graph
            backend_sched_reset(self.sched)
            ok = backend_sched_alloc_graph(self.sched, g.graph)
        else:
            from ..alloc import gallocr_alloc_graph
            ok = gallocr_alloc_graph(self.galloc, g.graph)
            self._plan = backend_graph_plan_create(self.backend, g.graph) if ok else None
        if not ok:
            self._graph = None
            raise MemoryError(f"{self.path}: cannot allocate the graph for {n_tokens} tokens")
        return g

    # ------------------------------------------------------------ evaluation

    @property
    def n_vocab(self) -> int:
        return self.hp.n_vocab if self.hp else self.tokenizer.n_vocab

    @property
    def n_past(self) -> int:
        """Tokens in the KV cache."""
        self._require_weights("n_past")
        return self.kv.n_past

    def _require_weights(self, what: str) -> None:
        if self.closed:
            raise ModelClosedError(f"{what}: the model {self.path} was closed")
        if self.vocab_only:
            raise RuntimeError(f"{what}: {self.path} was loaded with vocab_only=True (no weights)")

    def reset(self) -> None:
        """Empty the KV cache (zeroing the cells used): the next eval starts at position 0."""
        with self.lock:
            self._require_weights("reset")
            self.kv.clear()

    def eval(self, tokens) -> torch.Tensor:
        """Run `tokens` (after the cached ones) and return their logits, float32 [len(tokens), n_vocab].
        The prompt is processed in micro-batches of n_batch tokens. NonFiniteLogitsError when
        the logits are not all finite (the cache is then left as it was before this call)."""
        with self.lock:
            self._require_weights("eval")
            return self._eval(tokens)

    def _eval(self, tokens) -> torch.Tensor:
        if not isinstance(tokens, torch.Tensor):
            tokens = list(tokens)
        ids = torch.as_tensor(tokens, dtype=torch.int64).reshape(-1)
        if ids.numel() == 0:
            return torch.empty(0, self.n_vocab)
        bad = (ids < 0) | (ids >= self.n_vocab)
        if bool(bad.any()):
            raise ValueError(f"eval: token id {int(ids[bad][0])} is outside the vocabulary [0, {self.n_vocab})")
        self.kv.n_kv_for(ids.numel())  # raises early when the cache cannot hold them all
        out = torch.empty(ids.numel(), self.n_vocab)
        n_past = self.kv.n_past
        for start in range(0, ids.numel(), self.n_batch):
            chunk = ids[start: start + self.n_batch]
            logits = out[start: start + chunk.numel()]
            logits[:] = self._eval_ubatch(chunk)
            if not bool(torch.isfinite(logits).all()):
                # the cells written may hold NaN: zero them so no later call can read them
                self.kv.zero_cells(n_past, self.kv.n_written)
                self.kv.n_past = n_past
                bad = int((~torch.isfinite(logits)).any(dim=1).nonzero()[0]) + start
                raise NonFiniteLogitsError(f"{self.path}: eval produced non-finite logits (first at token "
                                           f"{bad}, position {n_past + bad}); the cache was restored to "
                                           f"{n_past} tokens")
        return out

    def _eval_ubatch(self, ids: torch.Tensor) -> torch.Tensor:
        n_tokens, n_past = ids.numel(), self.kv.n_past
        n_kv = self.kv.n_kv_for(n_tokens)
        g = self._graph_for(n_tokens, n_kv)
        self.kv.n_written = max(self.kv.n_written, n_past + n_tokens)  # before compute writes them
        pos = torch.arange(n_past, n_past + n_tokens)
        inputs = ((g.tokens, ids.to(torch.int32)), (g.positions, pos.to(torch.int32)), (g.kv_idx, pos),
                  (g.mask, causal_mask(n_past, n_tokens, n_kv)))
        for tensor, value in inputs:
            if self.sched is not None:
                backend_tensor_set(tensor, value)  # the scheduler keeps inputs in CPU memory
            else:
                backend_tensor_set_async(self.backend, tensor, value)  # ordered on the backend's stream
        if self.sched is not None:
            from ..backend.sched import backend_sched_graph_compute
            status = backend_sched_graph_compute(self.sched, g.graph)
        else:
            status = backend_graph_plan_compute(self.backend, self._plan)
            backend_synchronize(self.backend)  # accelerator backends compute asynchronously
        if int(status) != 0:
            raise RuntimeError(f"{self.path}: graph compute failed with status {status!r}")
        self.kv.n_past += n_tokens
        return backend_tensor_get(g.logits).reshape(n_tokens, self.n_vocab)

    # ------------------------------------------------------------ text

    @property
    def tokenizer(self):
        """The Tokenizer, built from the file's metadata on first use: a model whose
        tokenizer cannot be used (e.g. an unknown pre-tokenizer) still evaluates token ids."""
        if self._tokenizer is None:
            from ..tokenizer import Tokenizer
            self._tokenizer = Tokenizer.from_gguf(self.file)
        return self._tokenizer

    def tokenize(self, text: str, add_special: bool = True, parse_special: bool = False) -> list[int]:
        return self.tokenizer.tokenize(text, add_special, parse_special)

    def chat_prompt(self, messages, add_generation_prompt: bool = True) -> str:
        """The prompt text for `messages` ([{"role": "user", "content": ...}, ...]), rendered
        with the model's tokenizer.chat_template in a Jinja2 sandbox (torchggml.chat)."""
        from ..chat import render_chat
        tok = self.tokenizer
        text = lambda i: tok.token_text(i) if i is not None else ""
        return render_chat(tok.chat_template, messages, add_generation_prompt=add_generation_prompt,
                           bos_token=text(tok.bos_id), eos_token=text(tok.eos_id), source=self.path)

    def chat(self, messages, **generate_args) -> Iterator[str]:
        """Stream the assistant's reply to `messages` (see chat_prompt); `generate_args` as
        for generate. Special tokens in the rendered prompt are parsed; BOS is added unless
        the template wrote it."""
        prompt = self.chat_prompt(messages)
        tok = self.tokenizer
        has_bos = tok.bos_id is not None and prompt.startswith(tok.token_text(tok.bos_id))
        return self.generate(self.tokenize(prompt, add_special=not has_bos, parse_special=True), **generate_args)

    def detokenize(self, ids: Iterable[int]) -> str:
        return self.tokenizer.detokenize(list(ids))

    def generate(self, prompt, max_tokens: int = 128, temperature: float = 0.8, top_k: int = 40,
                 top_p: float = 0.95, seed: int | None = None) -> Iterator[str]:
        """Stream the text of up to max_tokens sampled tokens after `prompt` (text, or token ids).
        The KV cache starts empty; generation stops at an end-of-generation token or a full
        cache. `self.timings` has the prompt and generation speeds afterwards. The model is
        held (other threads wait) from the first item until the generator ends or is closed."""
        with self.lock:
            self._require_weights("generate")
            yield from self._generate(prompt, max_tokens, temperature, top_k, top_p, seed)

    def _generate(self, prompt, max_tokens, temperature, top_k, top_p, seed) -> Iterator[str]:
        ids = self.tokenize(prompt) if isinstance(prompt, str) else [int(i) for i in prompt]
        if not ids:
            raise ValueError("generate: the prompt has no tokens")
        gen = torch.Generator().manual_seed(seed if seed is not None else torch.seed() & 0xFFFFFFFF)
        decoder = self.tokenizer.stream_decoder()
        self.reset()
        self.timings = t = Timings()
        start = time.perf_counter()
        logits = self.eval(ids)[-1]
        t.prompt_tokens, t.prompt_s = len(ids), time.perf_counter() - start
        start = time.perf_counter()
        for _ in range(max_tokens):
            token = sample_token(logits, temperature, top_k, top_p, gen)
            if self.tokenizer.is_eog(token):
                break
            text = decoder.push(token)
            if text:
                yield text
            t.gen_tokens += 1
            if self.n_past >= self.n_ctx:
                break
            logits = self.eval([token])[0]
            t.gen_s = time.perf_counter() - start
        t.gen_s = time.perf_counter() - start
        rest = decoder.flush()
        if rest:
            yield rest

    # ------------------------------------------------------------ misc

    def describe(self) -> str:
        if self.vocab_only:
            return f"{self.path}: vocabulary only ({self.tokenizer!r})"
        hp = self.hp
        return (f"{self.path}: {hp.arch}, {hp.n_layer} layers, n_embd {hp.n_embd}, {hp.n_head} heads "
                f"({hp.n_head_kv} KV), n_vocab {hp.n_vocab}; n_ctx {self.n_ctx}, n_batch {self.n_batch}, "
                f"KV {self.kv_type.name}{', flash attention' if self.flash_attn else ''}; "
                f"{self.placement.describe()}")

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
        if self._plan is not None:
            backend_graph_plan_free(self.backend, self._plan)
            self._plan = None
        if self.galloc is not None:
            from ..alloc import gallocr_free
            gallocr_free(self.galloc)
        if self.sched is not None:
            from ..backend.sched import backend_sched_free
            backend_sched_free(self.sched)
        for b in self.kv.buffers:
            b.free()
        if self.lora is not None:
            self.lora.free()
        self.weights.free()
        for b in self.backends:
            backend_free(b)
        # drop every tensor that views the freed memory, so the file's mapping can close
        self._graph = self._ctx = self.w = self.weights = self.kv = self.sched = self.galloc = None


# weights read only as MUL_MAT's src0 (token_embd is also read by GET_ROWS, norms by MUL)
MATMUL_WEIGHTS = ("attn_q.weight", "attn_k.weight", "attn_v.weight", "attn_output.weight",
                  "ffn_gate.weight", "ffn_up.weight", "ffn_down.weight")


def is_matmul_weight(name: str) -> bool:
    return name == "output.weight" or (tensor_layer(name) is not None and name.endswith(MATMUL_WEIGHTS))


def extra_buffer_types(device: Device) -> list:
    """The device's extra buffer types that take weights in their own layout (ggml's
    ggml_backend_dev_get_extra_bufts, e.g. the CPU's CPU_REPACK), as llama.cpp uses them."""
    reg = getattr(device, "reg", None)
    get = reg.get_proc_address("ggml_backend_dev_get_extra_bufts") if reg is not None else None
    return [b for b in (get(device) if get is not None else []) if hasattr(b, "supports_weight")]


def causal_mask(n_past: int, n_tokens: int, n_kv: int) -> torch.Tensor:
    """F16 [n_tokens, n_kv] (ggml ne [n_kv, n_tokens]): token i (position n_past + i) sees cells
    0..n_past + i."""
    cells = torch.arange(n_kv)[None, :]
    pos = torch.arange(n_past, n_past + n_tokens)[:, None]
    return torch.where(cells <= pos, 0.0, -math.inf).to(torch.float16)


def load(path, devices=None, n_gpu_layers: int | None = None, n_ctx: int | None = None, n_batch: int = 512,
         flash_attn: bool = False, kv_type="f16", vocab_only: bool = False,
         tensor_split: Sequence[float] | None = None, n_threads: int | None = None,
         progress: bool = True, repack: bool = True, check_tensors: bool = False,
         tensor_parallel=None) -> Model:
    """See torchggml.load_model."""
    from ..gguf import open_gguf
    file = open_gguf(path)  # the tokenizer is built from it on first use
    if vocab_only:
        return Model(file, None)
    hp = HParams.from_gguf(file)
    n_ctx = min(hp.n_ctx_train, DEFAULT_MAX_CTX) if not n_ctx else int(n_ctx)
    if n_ctx <= 0 or n_batch <= 0:
        raise ValueError(f"n_ctx ({n_ctx}) and n_batch ({n_batch}) must be positive")
    if tensor_parallel is not None:
        if devices is not None or n_gpu_layers is not None or tensor_split is not None:
            raise ValueError("tensor_parallel replaces devices, n_gpu_layers and tensor_split: give only it")
        from .tensor_parallel import tensor_parallel_device
        devices = [tensor_parallel_device(file, hp, tensor_parallel, kv_type_from_name(kv_type))]
    placement = plan_placement(hp.n_layer, devices, n_gpu_layers, tensor_split)

    def device_of(name: str) -> Device:
        il = tensor_layer(name)
        if il is not None:
            if il >= hp.n_layer:
                raise ValueError(f"{path}: tensor {name!r} belongs to layer {il}, but the model has {hp.n_layer}")
            return placement.layers[il]
        if name.startswith("output"):
            return placement.output
        return placement.input

    def buft_of(name: str):
        device = device_of(name)
        if repack and is_matmul_weight(name):
            info = file.tensor_info(name)
            for extra in extra_buffer_types(device):
                if extra.supports_weight(info.type, info.ne):
                    return extra
        return device.get_buffer_type()

    weights = load_weights(file, buft_of, progress=progress, check_values=check_tensors)
    return Model(file, None, hp, weights, placement, n_ctx, int(n_batch), bool(flash_attn), kv_type, n_threads)
