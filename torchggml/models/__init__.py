"""GGUF models: the architectures of models/archs/ (llama with or without experts, mistral,
qwen2, qwen3, their MoE variants, ...) with a KV cache and generation."""
from __future__ import annotations

from .archs import ARCHS
from .builder import Arch, GraphBuilder, Weights
from .hparams import HParams
from .kv_cache import KVCache
from .lora import LoraAdapter
from .model import Model, Timings
from .placement import Placement, plan_placement, find_device
from .generation import Generation
from .sampling import Sampler, SamplingParams, StopStrings, TokenChoice, sample_token
from .module import GGMLModule, QuantizedWeight
from .params import ModelParams

__all__ = ["load_model", "Model", "ModelParams", "Placement", "Timings", "HParams", "Arch", "GraphBuilder",
           "Weights", "KVCache", "ARCHS", "plan_placement", "sample_token", "find_device", "LoraAdapter",
           "GGMLModule", "QuantizedWeight", "SamplingParams", "Sampler", "StopStrings", "TokenChoice", "Generation"]


def load_model(path, params: ModelParams | None = None, **options) -> Model:
    """Load a GGUF model. `params` (a ModelParams) and/or its fields as keywords, e.g.
    load_model(path, devices=["CUDA0"], n_ctx=2048, flash_attn=True); see ModelParams for
    each option."""
    from .loading import load
    return load(path, params, **options)
