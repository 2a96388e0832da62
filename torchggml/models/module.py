"""Model.as_module(): a GGUF model as a torch.nn.Module.

    module = model.as_module()
    logits = module(tokens)                 # [n_tokens, n_vocab], differentiable w.r.t. LoRA
    module.state_dict()["blk.0.attn_q.weight"]

- Parameters carry the GGUF names. Float weights are zero-copy views of the ggml tensors;
  block-quantized ones are `QuantizedWeight`s, dequantized when an op reads them (the raw
  blocks stay as they are; `.raw` has them). All are frozen (requires_grad=False).
- LoRA adapters (model.add_lora) appear as trainable parameters under `lora.` (zero-copy).
- The KV cache tensors are buffers (`kv_cache.cache_k_l0`...), views of the cache memory.
- forward runs the model graph through graph_function (its own compute memory, one plan per
  shape), so gradients reach the adapters; each call writes its tokens' K/V into the cache.
- `.to(device)` takes a ggml device ("CPU", "SIM0", "CUDA0", a Device) or a torch device and
  reloads the model there (the adapters' values move along).
"""
from __future__ import annotations

from collections import OrderedDict

import torch

from ..interop import to_torch
from ..types import type_traits
from .kv_cache import KV_PAD, attention_mask


class QuantizedWeight(torch.Tensor):
    """A frozen block-quantized weight that reads as its dequantized float32 values: every torch
    op on it dequantizes the raw blocks first (nothing is cached). detach keeps it quantized."""

    @staticmethod
    def __new__(cls, raw: torch.Tensor, ggml_type, shape):
        t = torch.Tensor._make_wrapper_subclass(cls, shape, dtype=torch.float32, device=raw.device,
                                                requires_grad=False)
        t.raw, t.ggml_type = raw, ggml_type
        return t

    def __init__(self, raw, ggml_type, shape):
        pass

    def dequantize(self) -> torch.Tensor:
        from ..quants import dequantize
        return dequantize(self.ggml_type, self.raw).reshape(self.shape).float()

    def __repr__(self, *, tensor_contents=None):
        return f"QuantizedWeight({self.ggml_type.name}, shape={tuple(self.shape)})"

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in (torch.ops.aten.detach.default, torch.ops.aten.alias.default):
            src = args[0]
            return QuantizedWeight(src.raw, src.ggml_type, src.shape)

        def unwrap(x):
            return x.dequantize() if isinstance(x, QuantizedWeight) else x
        return func(*torch.utils._pytree.tree_map(unwrap, args), **torch.utils._pytree.tree_map(unwrap, kwargs))


def _weight_value(model, name: str, t) -> torch.Tensor:
    """A frozen torch value for a weight: a zero-copy view, or a QuantizedWeight over its raw
    blocks (the file's bytes when the loaded tensor is in a repacked layout)."""
    shape = tuple(reversed(t.ne[:_ndims(t)]))
    if not type_traits(t.type).is_quantized:
        return to_torch(t)
    if t.buffer.ggml_layout:
        raw = to_torch(t, raw=True)
    else:
        raw = torch.from_numpy(model.file.tensor_data(name))
    return QuantizedWeight(raw, t.type, shape)


def _ndims(t) -> int:
    from ..tensor import n_dims
    return n_dims(t)


def _container(root: torch.nn.Module, parts: list[str]) -> torch.nn.Module:
    """The nested submodule for dotted name parts (created on demand)."""
    m = root
    for p in parts:
        sub = m._modules.get(p)
        if sub is None:
            sub = torch.nn.Module()
            m.add_module(p, sub)
        m = sub
    return m


class GGMLModule(torch.nn.Module):
    """See the module docstring."""

    MAX_GRAPHS = 4

    def __init__(self, model):
        super().__init__()
        model._require_weights("as_module")
        self._bind(model)

    def _bind(self, model) -> None:
        self.model = model
        self._functions: OrderedDict[tuple[int, int], object] = OrderedDict()  # most recent last
        self._lora = None
        self._lora_params = []
        self._modules.clear()
        self._parameters.clear()
        self._buffers.clear()
        for name, t in model.weight_buffers.tensors.items():
            *path, leaf = name.split(".")
            param = torch.nn.Parameter(_weight_value(model, name, t), requires_grad=False)
            _container(self, path).register_parameter(leaf, param)
        cache = _container(self, ["kv_cache"])
        for t in model.memory.tensors():  # K/V, or recurrent states
            cache.register_buffer(t.name, to_torch(t), persistent=False)
        self._sync_lora()

    def _sync_lora(self) -> None:
        """Register the model's current adapters as trainable parameters under `lora.`."""
        lora = self.model.lora
        if lora is self._lora:
            return
        self._lora = lora
        self._functions.clear()
        self._modules.pop("lora", None)
        self._lora_params = []
        if lora is None:
            return
        for t in lora.tensors():
            base, kind = t.name.rsplit(".", 1)
            *path, _ = base.split(".")  # blk.0.attn_q(.weight).lora_a -> lora.blk.0.attn_q.lora_a
            param = torch.nn.Parameter(to_torch(t), requires_grad=True)
            _container(self, ["lora", *path]).register_parameter(kind, param)
            self._lora_params.append(param)  # in lora.tensors() order, as the graph functions take them

    # ------------------------------------------------------------ forward

    def _function(self, n_tokens: int, n_kv: int):
        """The graph function for this shape; the MAX_GRAPHS most recent shapes keep theirs (each
        holds its own compute memory)."""
        key = (n_tokens, n_kv)
        fn = self._functions.get(key)
        if fn is not None:
            self._functions.move_to_end(key)
        else:
            from ..context import Context
            from ..torch_integration import graph_function
            from ..backend.sched import backend_sched_new
            from .builder import graph_size
            model = self.model
            ctx = Context(no_alloc=True)
            g = model.build_graph(ctx, n_tokens, n_kv)
            target = backend_sched_new(model.backends, None, graph_size(model.hp) * 2, False, True)
            params = model.lora.tensors() if model.lora is not None else []
            # a graph without rotary positions (ALiBi, learned or multi-axis positions) reads no inp_pos
            fn_positions = [g.positions] if g.positions is not None else []
            inputs = [g.tokens, *fn_positions, g.kv_idx, *g.masks.values(), *(t for t, _ in g.position_inputs)]
            fn = graph_function(g.graph, inputs, [g.logits], target, params, read_weight=self._read_weight)
            fn.ctx = ctx  # the graph's tensors live as long as the function
            fn.windows = list(g.masks)  # the masks' sliding windows (0: causal), in input order
            fn.position_values = [values for _, values in g.position_inputs]
            fn.reads_positions = bool(fn_positions)
            self._functions[key] = fn
            if len(self._functions) > self.MAX_GRAPHS:
                self._functions.popitem(last=False)  # freed when no autograd graph needs it
        return fn

    def _read_weight(self, t) -> torch.Tensor:
        """Float values of a weight the backward cannot read from memory (a repacked layout):
        its QuantizedWeight, which reads the file's blocks."""
        name = next(n for n, w in self.model.weight_buffers.tensors.items() if w is t)
        return self.get_parameter(name).dequantize()

    def forward(self, tokens: torch.Tensor, positions: torch.Tensor | None = None) -> torch.Tensor:
        """Logits [n_tokens, n_vocab] (float32) of `tokens` at `positions` (default 0..n-1); each
        token's K/V is written to cache cell `position`, and token i attends to the cells up to
        its position."""
        self._sync_lora()
        model = self.model
        tokens = torch.as_tensor(tokens).reshape(-1)
        n = tokens.numel()
        if n == 0:
            raise ValueError("forward: no tokens")
        positions = torch.arange(n) if positions is None else torch.as_tensor(positions).reshape(-1)
        if positions.numel() != n:
            raise ValueError(f"forward: {n} tokens but {positions.numel()} positions")
        top = int(positions.max()) + 1
        if int(positions.min()) < 0 or top > model.n_ctx:
            raise ValueError(f"forward: positions must lie in [0, n_ctx={model.n_ctx})")
        if int(tokens.min()) < 0 or int(tokens.max()) >= model.n_vocab:
            raise ValueError(f"forward: token ids must lie in [0, {model.n_vocab})")
        n_kv = min(model.n_ctx, -(-top // KV_PAD) * KV_PAD)
        fn = self._function(n, n_kv)
        pos = positions.cpu()
        alibi = model.hp.max_alibi_bias > 0
        masks = [attention_mask(pos, torch.arange(n_kv), window, alibi=alibi, chunked=model.hp.swa_chunked)
                 for window in fn.windows]
        extra = [values(pos) for values in fn.position_values]
        pos32 = positions.to(torch.int32)
        pos_args = [pos32] if fn.reads_positions else []
        logits = fn(tokens.to(torch.int32), *pos_args, positions.to(torch.int64), *masks, *extra, params=self._lora_params)
        return logits.reshape(n, model.n_vocab)

    # ------------------------------------------------------------ devices

    def to(self, *args, **kwargs):
        """Move to a ggml device (name or Device) or a torch device: the model is reloaded there."""
        from ..backend.device import Device
        target = args[0] if args else kwargs.get("device")
        if isinstance(target, (str, Device)) and not _is_torch_device_string(target):
            device = target  # a ggml device name or Device: the model resolves it
        else:
            device, dtype, *_ = torch._C._nn._parse_to(*args, **kwargs)
            if dtype is not None and dtype != torch.float32:
                raise TypeError("GGMLModule.to: the weights keep their GGUF types; only devices can change")
            if device is None:
                return self
            from ..backend.registry import backend_dev_for_torch_device
            device = backend_dev_for_torch_device(device)
        new = self.model.reloaded_on(device)
        if new is not self.model:
            self._bind(new)
        return self


def _is_torch_device_string(s) -> bool:
    if not isinstance(s, str):
        return False
    try:
        torch.device(s)
        return True
    except RuntimeError:
        return False
