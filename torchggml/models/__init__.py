"""GGUF models: llama (and mistral-style llama), qwen2 and qwen3, with a KV cache and generation."""
from __future__ import annotations

from typing import Sequence

from .llama import ARCHS, HParams, LlamaWeights, build_graph
from .kv_cache import KVCache
from .model import Model, Placement, Timings, plan_placement, sample_token, find_device
from .lora import LoraAdapter
from .module import GGMLModule, QuantizedWeight

__all__ = ["load_model", "Model", "Placement", "Timings", "HParams", "LlamaWeights", "KVCache",
           "ARCHS", "build_graph", "plan_placement", "sample_token", "find_device", "LoraAdapter",
           "GGMLModule", "QuantizedWeight"]


def load_model(path, devices=None, n_gpu_layers: int | None = None, n_ctx: int | None = None,
               n_batch: int = 512, flash_attn: bool = False, kv_type="f16", vocab_only: bool = False,
               tensor_split: Sequence[float] | None = None, n_threads: int | None = None,
               progress: bool = True, repack: bool = True, check_tensors: bool = False,
               tensor_parallel=None) -> Model:
    """Load a GGUF model (architectures: llama, mistral, qwen2, qwen3).

    devices: device names or Devices ("CPU", "CUDA0", "SIM0"...); the layers are split over
        them (in proportion to tensor_split when given). None: the CPU, or with n_gpu_layers
        every accelerator.
    n_gpu_layers: llama.cpp's offload count: the last n layers go to the accelerators, the
        rest stays on the CPU (the output head moves too when n > n_layer).
    n_ctx: KV cache size in tokens (default: the model's training context, at most 4096).
    n_batch: micro-batch size for prompt processing.
    flash_attn: attention through flash_attn_ext instead of mul_mat + soft_max + mul_mat.
    kv_type: "f16" (default), "f32", "bf16", or a block type of models.kv_cache.KV_TYPES: "q8_0",
        "q4_0", "q4_1", "q5_0", "q5_1", "iq4_nl"; "q2_k".."q6_k", "iq4_xs" where the head size is
        a multiple of 256 (quantized caches need flash_attn).
    vocab_only: load only the tokenizer (works with vocabulary-only GGUF files).
    n_threads: CPU threads for the CPU backend.
    progress: show a progress bar while uploading weights to accelerators.
    repack: CPU weights of types Q4_0/Q4_1/Q4_K read only by MUL_MAT (the attention and FFN
        projections, output.weight) go to the CPU's extra buffer type CPU_REPACK, which stores
        them in torch's int4 GEMM layout (a copy instead of a view of the file; activations
        are rounded to bf16 in those products). False keeps every CPU weight a view of the file.
    check_tensors: check every weight's values (and quantized blocks' scales) for NaN/inf on
        load, as llama.cpp's --check-tensors: GGUFError naming the tensor (reads all weights).
    tensor_parallel: split every layer over several devices (a meta device): a list of device
        names or Devices, or "dist" for one device per torch.distributed rank (torchrun; gloo on
        CPU, NCCL on CUDA). Replaces devices/n_gpu_layers/tensor_split.
    """
    from .model import load
    return load(path, devices=devices, n_gpu_layers=n_gpu_layers, n_ctx=n_ctx, n_batch=n_batch,
                flash_attn=flash_attn, kv_type=kv_type, vocab_only=vocab_only, tensor_split=tensor_split,
                n_threads=n_threads, progress=progress, repack=repack, check_tensors=check_tensors,
                tensor_parallel=tensor_parallel)
