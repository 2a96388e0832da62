"""The architectures, one file each; ARCHS maps a GGUF `general.architecture` to its Arch."""
from __future__ import annotations

from ..builder import Arch
from . import (apertus, arcee, bailingmoe, bailingmoe2, bert, bloom, cohere2, deepseek, deepseek2, dots1, ernie4_5,
               exaone, exaone4, falcon, falcon_h1, gemma, gemma3n, gemma4, gemma_embedding, glm4, glm4moe, gpt2,
               gpt_oss, gptneox, granite, hunyuan, internlm2, jamba, kimi_linear, lfm2, lfm2moe, llama, llama4,
               maincoder, mamba, minicpm3, minimax_m2, mistral3, nemotron, nemotron_h, olmo, olmo2, olmoe, orion,
               parallel, phi2, phi3, phimoe, qwen, qwen3next, qwen35, qwen_vl, rwkv6, rwkv7, seed_oss, smollm3,
               stablelm, t5, xverse)

MODULES = (llama, mistral3, qwen, gemma, phi3, gpt_oss, parallel, mamba, jamba, nemotron_h, falcon_h1, lfm2,
           rwkv6, rwkv7, qwen3next, granite, olmo2, smollm3, exaone4, cohere2, gpt2, phi2, gptneox, falcon,
           stablelm, internlm2, seed_oss, apertus, ernie4_5, glm4, qwen_vl, olmoe, phimoe, hunyuan, xverse,
           exaone, maincoder, orion, arcee, nemotron, olmo, glm4moe, deepseek, dots1, bailingmoe,
           minimax_m2, deepseek2, bloom, llama4, bert, gemma_embedding, qwen35, lfm2moe, bailingmoe2,
           kimi_linear, minicpm3, gemma4, t5, gemma3n)
ARCHS: dict[str, Arch] = {name: arch for module in MODULES for arch in module.ARCHS for name in arch.names}


def arch_for(name: str, path: str = "model") -> Arch:
    """The Arch of a `general.architecture`; an unsupported one is refused naming it and listing
    the supported ones."""
    from ...gguf.loader import GGUFError
    from ..arch_names import LLAMA_CPP_ARCHS
    if name not in ARCHS:
        known = " (llama.cpp runs it; torchggml does not yet)" if name in LLAMA_CPP_ARCHS else ""
        raise GGUFError(f"{path}: architecture {name!r} is not supported{known}; the {len(ARCHS)} supported: "
                        f"{', '.join(sorted(ARCHS))}")
    return ARCHS[name]
