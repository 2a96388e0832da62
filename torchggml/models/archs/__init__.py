"""The architectures, one file each; ARCHS maps a GGUF `general.architecture` to its Arch.

NAMES lists each module's architecture names (its Arch.names) without importing it: a model's
load imports only the module of its file's architecture (arch_for); ARCHS and MODULES import
them all on first use (tools and tests that list the architectures)."""
from __future__ import annotations

import importlib

# module -> the `general.architecture` names its Arch objects build (tests/test_archs.py checks
# this against the modules' ARCHS)
NAMES: dict[str, tuple[str, ...]] = {module: tuple(names.split()) for module, names in (
    ("llama", "llama mistral"), ("mistral3", "mistral3"), ("qwen", "qwen2 qwen3 qwen2moe qwen3moe"),
    ("gemma", "gemma gemma2 gemma3"), ("phi3", "phi3"), ("gpt_oss", "gpt-oss"),
    ("parallel", "starcoder2 command-r"), ("mamba", "mamba mamba2"), ("jamba", "jamba granitehybrid"),
    ("nemotron_h", "nemotron_h"), ("falcon_h1", "falcon-h1"), ("lfm2", "lfm2"), ("rwkv6", "rwkv6"),
    ("rwkv7", "rwkv7"), ("qwen3next", "qwen3next"), ("granite", "granite granitemoe"), ("olmo2", "olmo2"),
    ("smollm3", "smollm3"), ("exaone4", "exaone4"), ("cohere2", "cohere2"), ("gpt2", "gpt2 starcoder"),
    ("phi2", "phi2"), ("gptneox", "gptneox"), ("falcon", "falcon"), ("stablelm", "stablelm"),
    ("internlm2", "internlm2"), ("seed_oss", "seed_oss"), ("apertus", "apertus"),
    ("ernie4_5", "ernie4_5 ernie4_5-moe"), ("glm4", "glm4"), ("qwen_vl", "qwen2vl qwen3vl qwen3vlmoe"),
    ("olmoe", "olmoe"), ("phimoe", "phimoe"), ("hunyuan", "hunyuan-dense hunyuan-moe"), ("xverse", "xverse"),
    ("exaone", "exaone"), ("maincoder", "maincoder"), ("orion", "orion"), ("arcee", "arcee"),
    ("nemotron", "nemotron"), ("olmo", "olmo"), ("glm4moe", "glm4moe"), ("deepseek", "deepseek"),
    ("dots1", "dots1"), ("bailingmoe", "bailingmoe"), ("minimax_m2", "minimax-m2"), ("deepseek2", "deepseek2"),
    ("bloom", "bloom mpt"), ("llama4", "llama4"),
    ("bert", "bert jina-bert-v3 nomic-bert nomic-bert-moe jina-bert-v2 modern-bert neo-bert eurobert"),
    ("gemma_embedding", "gemma-embedding"), ("qwen35", "qwen35 qwen35moe"), ("lfm2moe", "lfm2moe"),
    ("bailingmoe2", "bailingmoe2"), ("kimi_linear", "kimi-linear"), ("minicpm3", "minicpm3"),
    ("gemma4", "gemma4"), ("t5", "t5encoder t5"), ("gemma3n", "gemma3n"))}
MODULE_OF: dict[str, str] = {name: module for module, names in NAMES.items() for name in names}
SUPPORTED = frozenset(MODULE_OF)  # every architecture name torchggml builds


def _module(module: str):
    return importlib.import_module(f"{__name__}.{module}")


def __getattr__(name: str):
    """MODULES (every architecture module) and ARCHS (name -> Arch), imported on first use."""
    if name == "MODULES":
        value = tuple(_module(m) for m in NAMES)
    elif name == "ARCHS":
        value = {n: arch for module in __getattr__("MODULES") for arch in module.ARCHS for n in arch.names}
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    globals()[name] = value
    return value


def arch_for(name: str, path: str = "model"):
    """The Arch of a `general.architecture` (importing its module only); an unsupported one is
    refused naming it and listing the supported ones."""
    if name not in SUPPORTED:
        from ...gguf.loader import GGUFError
        from ..arch_names import LLAMA_CPP_ARCHS
        known = " (llama.cpp runs it; torchggml does not yet)" if name in LLAMA_CPP_ARCHS else ""
        raise GGUFError(f"{path}: architecture {name!r} is not supported{known}; the {len(SUPPORTED)} supported: "
                        f"{', '.join(sorted(SUPPORTED))}")
    return next(arch for arch in _module(MODULE_OF[name]).ARCHS if name in arch.names)
