"""GGUF models: the architectures of models/archs/ (llama with or without experts, mistral,
qwen2, qwen3, their MoE variants, ...) with a KV cache and generation."""
from __future__ import annotations

from ..lazy import lazy_exports

# each name from its module on first use (PEP 562): importing torchggml.cli.models,
# the command line's parsing, imports neither torch nor the architectures
_EXPORTS = {"ARCHS": ".archs", "Arch": ".builder", "GraphBuilder": ".builder", "Weights": ".builder",
            "HParams": ".hparams", "KVCache": ".kv_cache", "LoraAdapter": ".lora", "Model": ".model",
            "Timings": ".model", "Placement": ".placement", "plan_placement": ".placement",
            "find_device": ".placement", "Generation": ".generation", "Sampler": ".sampling",
            "SamplingParams": ".sampling", "StopStrings": ".sampling", "TokenChoice": ".sampling",
            "sample_token": ".sampling", "GGMLModule": ".module", "QuantizedWeight": ".module",
            "ModelParams": ".params"}


__getattr__ = lazy_exports(__name__, _EXPORTS)

__all__ = ["load_model", "Model", "ModelParams", "Placement", "Timings", "HParams", "Arch", "GraphBuilder",
           "Weights", "KVCache", "ARCHS", "plan_placement", "sample_token", "find_device", "LoraAdapter",
           "GGMLModule", "QuantizedWeight", "SamplingParams", "Sampler", "StopStrings", "TokenChoice", "Generation"]


def load_model(path, params: "ModelParams | None" = None, **options) -> "Model":
    """Load a GGUF model. `params` (a ModelParams) and/or its fields as keywords, e.g.
    load_model(path, devices=["CUDA0"], n_ctx=2048, flash_attn=True); see ModelParams for
    each option."""
    import gc
    # no cyclic collection while loading: the load makes objects that all stay (the modules it
    # imports, numba's registries, the model's graph), and each full collection on the way
    # walked the process's ~250k objects (a fifth of a small model's load); numba's start
    # freezes the imported ones out of later collections (devices/cpu/jit/loader.py)
    paused = gc.isenabled()
    gc.disable()
    try:
        from .loading import load
        return load(path, params, **options)
    finally:
        if paused:
            gc.enable()
