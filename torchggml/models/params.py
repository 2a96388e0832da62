"""ModelParams: how to load and run a model, shared by load_model, Model and the CLI."""
from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, fields, replace
from typing import Sequence

# llama.cpp's n_ctx is a uint32
MAX_N_CTX = 2**32 - 1


def _check_int(name: str, value, lo: int, hi: int, none_ok: bool = False) -> None:
    if value is None and none_ok:
        return
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"ModelParams: {name} must be an integer{' or None' if none_ok else ''}, got {value!r}")
    if not lo <= value <= hi:
        raise ValueError(f"ModelParams: {name} ({value}) must lie in [{lo}, {hi}]")


def _check_tensor_split(split) -> None:
    try:
        shares = [float(s) for s in split]
    except (TypeError, ValueError):
        raise TypeError(f"ModelParams: tensor_split must be a sequence of numbers, got {split!r}") from None
    if any(not math.isfinite(s) or s < 0 for s in shares):
        raise ValueError(f"ModelParams: tensor_split {shares}: every share must be a finite number >= 0")
    if sum(shares) <= 0:
        raise ValueError(f"ModelParams: tensor_split {shares}: the shares sum to 0; give at least one device "
                         f"a positive share")


@dataclass(frozen=True)
class ModelParams:
    """devices: device names or Devices ("CPU", "CUDA0", "SIM0"...); the layers are split over
        them (in proportion to tensor_split when given). None: the CPU, or with n_gpu_layers
        every accelerator.
    n_gpu_layers: llama.cpp's offload count: the last n layers go to the accelerators, the
        rest stays on the CPU (the output head moves too when n > n_layer).
    tensor_split: share of the layers for each device.
    n_ctx: KV cache size in tokens (0/None: the model's training context, at most 4096).
    n_batch: micro-batch size for prompt processing.
    flash_attn: attention through flash_attn_ext instead of mul_mat + soft_max + mul_mat.
    kv_type: "f16" (default), "f32", "bf16", or a block type of models.kv_cache.KV_TYPES: "q8_0",
        "q4_0", "q4_1", "q5_0", "q5_1", "iq4_nl"; "q2_k".."q6_k", "iq4_xs" where the head size is
        a multiple of 256 (quantized caches need flash_attn).
    vocab_only: load only the tokenizer (works with vocabulary-only GGUF files).
    n_threads: CPU threads for the CPU backend.
    progress: show a progress bar while uploading weights to accelerators.
    repack: quantized CPU weights read only by MUL_MAT (and MoE experts, read by MUL_MAT_ID)
        go to the CPU's extra buffer type CPU_REPACK when its layout takes them: a copy
        instead of a view of the file, in the layout of the CPU product path
        (TORCHGGML_CPU_PATH: every block type and the experts for `fused`, 2-D Q4_0/Q4_1/Q4_K
        for `int4`). False keeps every CPU weight a view of the file.
    tensor_parallel: split every layer over several devices (a meta device): a list of device
        names or Devices, or "dist" for one device per torch.distributed rank (torchrun; gloo on
        CPU, NCCL on CUDA). Replaces devices/n_gpu_layers/tensor_split.
    rpc: ggml RPC servers ("host:port", ...) whose devices join the model, as llama.cpp's --rpc
        (RPC0, RPC1... in the order given). Without devices and n_gpu_layers the layers are split
        over the servers' devices and then the local CPU (tensor_split weighs them); with
        n_gpu_layers they count as accelerators; or name them in devices.
    use_mmap: True (default, as llama.cpp): CPU weights are views of the file's mapping (zero
        copy, the fastest load), which asks for huge pages (MADV_HUGEPAGE: granted where the page
        cache holds the file in 2 MiB folios, as Linux 6.x filesystems with large folios do for a
        file read whole; GGUFFile.maps_in_huge_pages tells). False: every CPU weight is read into
        CPU memory in huge pages, as llama.cpp's --no-mmap plus huge pages: a decode step, which
        streams every weight, runs faster than from a mapping in 4 KiB pages, at the cost of
        the first touch of that memory at load (the machine's page fault cost).
    check_tensors: check every weight's values (and quantized blocks' scales) for NaN/inf on
        load, as llama.cpp's --check-tensors: GGUFError naming the tensor (reads all weights).
    n_seq_max: sequences the recurrent state of recurrent and hybrid models holds at once (one
        state slot each, per recurrent layer).
    """
    devices: object = None
    n_gpu_layers: int | None = None
    tensor_split: Sequence[float] | None = None
    n_ctx: int | None = None
    n_batch: int = 512
    flash_attn: bool = False
    kv_type: object = "f16"
    vocab_only: bool = False
    n_threads: int | None = None
    progress: bool = True
    repack: bool = True
    check_tensors: bool = False
    use_mmap: bool = True
    tensor_parallel: object = None
    rpc: Sequence[str] | None = None
    n_seq_max: int = 4

    def __post_init__(self):
        """Each option checked on its own, the error naming it (ValueError, or TypeError for a
        value of the wrong kind)."""
        _check_int("n_ctx", self.n_ctx, 0, MAX_N_CTX, none_ok=True)
        _check_int("n_batch", self.n_batch, 1, MAX_N_CTX)
        _check_int("n_threads", self.n_threads, 1, 4096, none_ok=True)
        _check_int("n_gpu_layers", self.n_gpu_layers, -2**31, 2**31 - 1, none_ok=True)
        if self.tensor_split is not None:
            _check_tensor_split(self.tensor_split)
        if not isinstance(self.use_mmap, bool):
            raise TypeError(f"ModelParams: use_mmap must be True or False, got {self.use_mmap!r}")

    @classmethod
    def names(cls) -> list[str]:
        return [f.name for f in fields(cls)]

    def with_options(self, **options) -> "ModelParams":
        """A copy with some fields changed; an unknown name is a TypeError that lists the known ones."""
        unknown = sorted(set(options) - set(self.names()))
        if unknown:
            raise TypeError(f"unknown model option(s) {', '.join(unknown)} (known: {', '.join(self.names())})")
        return replace(self, **options)
