"""LoRA adapters on GGUF models, in llama.cpp's format.

For a weight W (ggml ne [n_in, n_out]) the adapter holds A (ne [n_in, rank]) and B
(ne [rank, n_out]); every product W x of the model graph becomes

    W x + s * B (A x),    s = scale * alpha / rank  (scale when alpha is 0)

exactly as llama.cpp's build_lora_mm. A and B live beside W on W's device, as F32 tensors
whose torch views are trainable parameters (zero-copy: an optimizer step updates the
tensors the graph reads), while W stays frozen (and possibly quantized).

Saved files are GGUF LoRA adapters llama.cpp loads: general.type = "adapter",
adapter.type = "lora", adapter.lora.alpha, tensors "<weight>.lora_a" / "<weight>.lora_b".
"""
from __future__ import annotations

import math
import os

import numpy as np
import torch

from .. import ops
from ..alloc import backend_alloc_ctx_tensors_from_buft
from ..backend.tensor_io import backend_tensor_set
from ..context import Context, new_tensor_2d
from ..enums import Op, TensorFlag
from ..gguf.loader import GGUFError, open_gguf
from ..graph import build_forward_expand, graph_clear
from ..interop import to_torch
from ..tensor import Tensor, set_name, set_output
from ..types import Type
from .builder import is_matmul_weight

# the projections of every layer (llama.cpp's LoRA targets; "output" adds the output head)
DEFAULT_TARGETS = ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down")


def _target_names(weights: dict, targets, is_target) -> list[str]:
    """Base weight names selected by `targets`: short names ("attn_q" -> blk.N.attn_q.weight,
    "output" -> output.weight) or full names; each must match a product weight."""
    names = []
    for target in targets:
        hits = [n for n in weights if is_target(n) and (n == target or n == f"{target}.weight"
                                                        or n.endswith(f".{target}.weight"))]
        if not hits:
            raise ValueError(f"add_lora: target {target!r} matches no weight used in a matrix product "
                             f"(e.g. attn_q, attn_k, attn_v, attn_output, ffn_gate, ffn_up, ffn_down, output)")
        names += [n for n in hits if n not in names]
    return names


class LoraAdapter:
    """A set of (A, B) pairs by base weight name; see the module docstring."""

    def __init__(self, base: dict, arch: str, alpha: float = 0.0, scale: float = 1.0):
        self.base = base            # name -> the model's weight Tensor
        self.arch = arch
        self.alpha = float(alpha)
        self.scale = float(scale)
        self.pairs: dict[str, tuple[Tensor, Tensor]] = {}
        self.buffers = []
        self._contexts = []

    # ------------------------------------------------------------ creation

    def _allocate(self, shapes: dict[str, int]) -> None:
        """F32 A/B tensors for each base name (name -> rank), on each weight's device."""
        groups: dict[int, tuple[object, Context]] = {}
        for name, rank in shapes.items():
            w = self.base[name]
            buft = w.buffer.buft.get_device().get_buffer_type()  # not a repacked weight layout
            _, ctx = groups.setdefault(id(buft), (buft, Context(no_alloc=True)))
            a = set_name(new_tensor_2d(ctx, Type.F32, w.ne[0], rank), f"{name}.lora_a")
            b = set_name(new_tensor_2d(ctx, Type.F32, rank, w.ne[1]), f"{name}.lora_b")
            a.flags |= int(TensorFlag.PARAM)
            b.flags |= int(TensorFlag.PARAM)
            self.pairs[name] = (a, b)
        for buft, ctx in groups.values():
            self.buffers.append(backend_alloc_ctx_tensors_from_buft(ctx, buft))
            self._contexts.append(ctx)

    @classmethod
    def create(cls, model, rank: int, targets=DEFAULT_TARGETS, alpha: float | None = None,
               seed: int = 0) -> "LoraAdapter":
        """New adapters for `targets`: A uniform in +-1/sqrt(n_in), B zero (so the model's output
        is unchanged until B is trained); alpha defaults to rank (s = 1)."""
        if int(rank) <= 0:
            raise ValueError(f"add_lora: rank must be positive, got {rank}")
        rank = int(rank)
        tensors = model.weight_buffers.tensors
        names = _target_names(tensors, [targets] if isinstance(targets, str) else targets, is_matmul_weight)
        adapter = cls({n: tensors[n] for n in names}, model.hp.arch, float(rank if alpha is None else alpha))
        adapter._allocate({n: rank for n in names})
        gen = torch.Generator().manual_seed(seed)
        for name, (a, b) in adapter.pairs.items():
            bound = 1.0 / math.sqrt(a.ne[0])
            backend_tensor_set(a, (torch.rand(a.ne[1], a.ne[0], generator=gen) * 2 - 1) * bound)
            backend_tensor_set(b, torch.zeros(b.ne[1], b.ne[0]))
        return adapter

    @classmethod
    def load(cls, model, path, scale: float = 1.0) -> "LoraAdapter":
        """A GGUF LoRA adapter for `model`, checked as llama.cpp checks it."""
        f = open_gguf(path)
        for key, want in (("general.type", "adapter"), ("adapter.type", "lora")):
            got = f.get(key, None)
            if got != want:
                raise GGUFError(f"{path}: {key} is {got!r}, expected {want!r} (not a LoRA adapter)")
        if f.arch != model.hp.arch:
            raise GGUFError(f"{path}: adapter for architecture {f.arch!r}, the model is {model.hp.arch!r}")
        found: dict[str, dict[str, str]] = {}
        for tname in f.tensors:
            base, _, kind = tname.rpartition(".")
            if kind not in ("lora_a", "lora_b"):
                raise GGUFError(f"{path}: LoRA tensor {tname!r} has an unexpected suffix")
            found.setdefault(base, {})[kind] = tname
        tensors = model.weight_buffers.tensors
        ranks = {}
        for base, kinds in found.items():
            if len(kinds) != 2:
                raise GGUFError(f"{path}: LoRA tensor pair for {base!r} is missing one component")
            if base not in tensors:
                raise GGUFError(f"{path}: LoRA tensor {base!r} does not exist in the base model")
            a_ne, b_ne, w_ne = f.tensor_info(kinds["lora_a"]).ne, f.tensor_info(kinds["lora_b"]).ne, tensors[base].ne
            if a_ne[0] != w_ne[0] or b_ne[1] != w_ne[1] or a_ne[1] != b_ne[0]:
                raise GGUFError(f"{path}: tensor {base!r}: lora_a ne {list(a_ne[:2])} / lora_b ne {list(b_ne[:2])} "
                                f"do not fit the weight's ne {list(w_ne[:2])}")
            ranks[base] = int(a_ne[1])
        adapter = cls({n: tensors[n] for n in found}, f.arch, float(f.get("adapter.lora.alpha", 0.0)), scale)
        adapter._allocate(ranks)
        import gguf
        for base, (a, b) in adapter.pairs.items():
            for t, tname in ((a, found[base]["lora_a"]), (b, found[base]["lora_b"])):
                info = f.tensor_info(tname)
                data = gguf.quants.dequantize(f.tensor_data(tname), gguf.GGMLQuantizationType(int(info.type)))
                backend_tensor_set(t, torch.from_numpy(np.ascontiguousarray(data, dtype=np.float32)))
        return adapter

    def copy_for(self, model) -> "LoraAdapter":
        """The same adapters, values copied, on `model`'s weights (the same file loaded again,
        e.g. on another device)."""
        ranks = {n: b.ne[0] for n, (_, b) in self.pairs.items()}
        adapter = LoraAdapter({n: model.weight_buffers.tensors[n] for n in self.pairs}, self.arch, self.alpha, self.scale)
        adapter._allocate(ranks)
        for (a, b), (a0, b0) in zip(adapter.pairs.values(), self.pairs.values()):
            with torch.no_grad():
                to_torch(a).copy_(to_torch(a0))
                to_torch(b).copy_(to_torch(b0))
        return adapter

    # ------------------------------------------------------------ use

    def pair_scale(self, name: str) -> float:
        """llama.cpp's s = scale * alpha / rank (scale alone when alpha is 0)."""
        rank = self.pairs[name][1].ne[0]
        return self.scale * self.alpha / rank if self.alpha else self.scale

    def parameters(self) -> dict[str, torch.Tensor]:
        """name ("<weight>.lora_a"/".lora_b") -> zero-copy torch view of the tensor."""
        return {t.name: to_torch(t) for pair in self.pairs.values() for t in pair}

    def tensors(self) -> list[Tensor]:
        return [t for pair in self.pairs.values() for t in pair]

    def apply(self, ctx, graph) -> dict[int, Tensor]:
        """Rewrite `graph` (not yet allocated) so that each product with an adapted weight adds
        s * B (A x). Returns {id(old product): new sum} for references the caller holds."""
        by_weight = {id(self.base[n]): n for n in self.pairs}
        new: dict[int, Tensor] = {}
        consumed = set()
        for node in graph.nodes:
            consumed.update(id(s) for s in node.src if s is not None)
        terminals = [n for n in graph.nodes if id(n) not in consumed]
        for node in list(graph.nodes):
            name = by_weight.get(id(node.src[0])) if node.op == Op.MUL_MAT else None
            if name is None:
                continue
            a, b = self.pairs[name]
            x = new.get(id(node.src[1]), node.src[1])  # an adapted product feeding this one
            ab = ops.mul_mat(ctx, b, ops.mul_mat(ctx, a, x))
            s = self.pair_scale(name)
            if s != 1.0:
                ab = ops.scale(ctx, ab, s)
            new[id(node)] = set_name(ops.add(ctx, node, ab), f"{node.name}-lora")
        if not new:
            return new
        for t in graph.nodes:
            for i, s in enumerate(t.src):
                if s is not None and id(s) in new:
                    t.src[i] = new[id(s)]
            if t.view_src is not None and id(t.view_src) in new:
                t.view_src = new[id(t.view_src)]
        graph_clear(graph)
        for t in terminals:
            out = new.get(id(t), t)
            if t.flags & TensorFlag.OUTPUT:
                set_output(out)
            build_forward_expand(graph, out)
        return new

    # ------------------------------------------------------------ files

    def save(self, path) -> str:
        """Write the adapter as a GGUF LoRA file llama.cpp loads (F32 tensors)."""
        import gguf
        path = os.fspath(path)
        w = gguf.GGUFWriter(path, self.arch)
        w.add_type("adapter")
        w.add_string("adapter.type", "lora")
        w.add_float32("adapter.lora.alpha", self.alpha)
        for t in self.tensors():
            w.add_tensor(t.name, to_torch(t).detach().cpu().numpy().astype(np.float32))
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
        return path

    def free(self) -> None:
        for b in self.buffers:
            b.free()
        self.buffers.clear()
        self.pairs.clear()


class LoraSet:
    """Several adapters on one model, each with its own scale (llama-server's --lora list): every
    adapter whose scale is not 0 adds its products to the graph. Model.set_lora takes it as it
    takes one adapter; after set_scales, set_lora again so that the next graph is built anew."""

    def __init__(self, adapters):
        self.adapters = list(adapters)

    @property
    def scales(self) -> tuple[float, ...]:
        return tuple(a.scale for a in self.adapters)

    def set_scales(self, scales) -> None:
        if len(scales) != len(self.adapters):
            raise ValueError(f"LoraSet: {len(scales)} scales for {len(self.adapters)} adapters")
        for adapter, scale in zip(self.adapters, scales):
            adapter.scale = float(scale)

    def apply(self, ctx, graph) -> dict[int, Tensor]:
        replaced: dict[int, Tensor] = {}
        for adapter in self.adapters:
            if adapter.scale:
                for key, value in adapter.apply(ctx, graph).items():
                    replaced.setdefault(key, value)  # the first adapter's sum is the outermost
        return replaced

    def copy_for(self, model) -> "LoraSet":
        return LoraSet(a.copy_for(model) for a in self.adapters)

    def free(self) -> None:
        for adapter in self.adapters:
            adapter.free()
