"""Tensor parallelism for the llama-family graph: how each weight and KV cache is split over
the devices of a meta device (Megatron-style).

- attention, per layer: whole KV heads (and their query heads) per device: attn_q/k/v and
  their biases split by output columns (axis 1 / bias axis 0), the K/V cache by heads (axis 0),
  attn_output by input rows (axis 0) -> a PARTIAL sum, all-reduced;
- feed-forward, per layer: ffn_gate/ffn_up split by columns, ffn_down by rows -> PARTIAL;
- everything else (embeddings, norms, output head, inputs) MIRRORED.

A layer's attention (or feed-forward) whose split would cut a quantization block, or that has
fewer KV heads than devices, stays MIRRORED: every device computes it whole.
"""
from __future__ import annotations

from ..devices.meta.split import MetaSplitState, SplitAxis, split_evenly
from ..types import blck_size
from .builder import tensor_layer
from .hparams import HParams

ATTN_COLS = ("attn_q.weight", "attn_k.weight", "attn_v.weight")
ATTN_BIAS = ("attn_q.bias", "attn_k.bias", "attn_v.bias")


def _shares(units: int, n: int) -> list[int] | None:
    return split_evenly(units, n) if units >= n else None


class LlamaSplit:
    """get_split_state for a llama/qwen model on `n` devices (counted over all ranks)."""

    def __init__(self, hp: HParams, file, n: int, kv_type):
        self.hp, self.n = hp, n
        self.attn, self.ffn = {}, {}
        for il in range(hp.n_layer):
            self.attn[il] = self._attention_shares(file, il, kv_type)
            self.ffn[il] = self._ffn_shares(file, il)

    def _type(self, file, name):
        info = file.tensors.get(name)
        return info.type if info is not None else None

    def _attention_shares(self, file, il, kv_type):
        """KV heads per device, or None when the layer's attention cannot be split."""
        hp = self.hp
        heads = _shares(hp.n_head_kv, self.n)
        if heads is None or hp.n_head % hp.n_head_kv:
            return None
        gqa = hp.n_head // hp.n_head_kv
        wo = self._type(file, f"blk.{il}.attn_output.weight")
        for h in heads:  # attn_output is cut along ne[0] (head_dim_v * query heads), the cache by KV heads
            if (h * gqa * hp.head_dim_v) % blck_size(wo) or (h * hp.head_dim_k) % blck_size(kv_type) \
                    or (h * hp.head_dim_v) % blck_size(kv_type):
                return None
        return heads

    def _ffn_shares(self, file, il):
        down = self._type(file, f"blk.{il}.ffn_down.weight")
        gran = blck_size(down)
        if self.hp.n_ff % gran or self.hp.n_ff // gran < self.n:
            return None
        return split_evenly(self.hp.n_ff, self.n, gran)

    def __call__(self, t) -> MetaSplitState | None:
        name = t.name
        hp = self.hp
        if name.startswith("cache_"):  # cache_k_l{il} / cache_v_l{il}: [head_dim * n_head_kv, n_ctx]
            il = int(name.rsplit("_l", 1)[1])
            heads = self.attn.get(il)
            head_dim = hp.head_dim_k if name.startswith("cache_k") else hp.head_dim_v
            return MetaSplitState(SplitAxis.AXIS_0, tuple(h * head_dim for h in heads)) if heads else None
        il = tensor_layer(name)
        if il is None:
            return None
        suffix = name.split(".", 2)[2]
        heads = self.attn[il]
        if heads and suffix in ATTN_COLS + ATTN_BIAS:
            gqa = hp.n_head // hp.n_head_kv if suffix.startswith("attn_q") else 1
            head_dim = hp.head_dim_v if suffix.startswith("attn_v") else hp.head_dim_k
            axis = SplitAxis.AXIS_1 if suffix.endswith("weight") else SplitAxis.AXIS_0
            return MetaSplitState(axis, tuple(h * gqa * head_dim for h in heads))
        if heads and suffix == "attn_output.weight":
            gqa = hp.n_head // hp.n_head_kv
            return MetaSplitState(SplitAxis.AXIS_0, tuple(h * gqa * hp.head_dim_v for h in heads))
        ffn = self.ffn[il]
        if ffn and suffix in ("ffn_gate.weight", "ffn_up.weight"):
            return MetaSplitState(SplitAxis.AXIS_1, tuple(ffn))
        if ffn and suffix == "ffn_down.weight":
            return MetaSplitState(SplitAxis.AXIS_0, tuple(ffn))
        return None


def tensor_parallel_device(file, hp: HParams, devices, kv_type, group=None):
    """The meta device over `devices` (names or Devices; this rank's with a process group)
    that splits this model's weights and caches."""
    from ..devices.meta.meta import backend_meta_device
    from ..backend.registry import backend_dev_by_name
    if isinstance(devices, str) and devices.lower() == "dist":
        devices, group = dist_devices()
    elif isinstance(devices, str):
        devices = [d for d in devices.split(",") if d]
    devs = [backend_dev_by_name(d) if isinstance(d, str) else d for d in devices]
    if any(d is None for d in devs):
        raise ValueError(f"tensor_parallel: unknown device in {list(devices)}")
    world = 1
    if group is not None:
        import torch.distributed as dist
        world = dist.get_world_size(group)
    split = LlamaSplit(hp, file, len(devs) * world, kv_type)
    return backend_meta_device(devs, split, group)


_owned_group = False  # dist_devices initialised the process group (so end_dist_group ends it)


def end_dist_group() -> bool:
    """Ends the process group dist_devices initialised, after every rank reached this point: a
    rank that exits while gloo's threads still serve its peers aborts ("terminate called without
    an active exception"). A group the caller initialised is left to the caller. True when it
    ended one."""
    global _owned_group
    if not _owned_group:
        return False
    import torch.distributed as dist
    if dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()
    _owned_group = False
    return True


def dist_devices():
    """([this rank's device], the world group) under torchrun: the process group is initialised
    from the environment when needed (NCCL with CUDA, gloo otherwise); the device is
    CUDA<local rank> where CUDA is available, else the CPU."""
    import os
    import torch
    import torch.distributed as dist
    from ..backend.registry import backend_dev_for_torch_device
    if not dist.is_initialized():
        if "RANK" not in os.environ:
            raise RuntimeError("tensor_parallel='dist' needs torch.distributed: start the program with "
                               "torchrun (e.g. torchrun --nproc-per-node 2 -m torchggml eval ...)")
        dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
        global _owned_group
        _owned_group = True
    local = int(os.environ.get("LOCAL_RANK", 0))
    device = f"cuda:{local}" if torch.cuda.is_available() else "cpu"
    return [backend_dev_for_torch_device(device)], dist.group.WORLD
