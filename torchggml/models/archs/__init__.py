"""The architectures, one file each; ARCHS maps a GGUF `general.architecture` to its Arch."""
from __future__ import annotations

from ..builder import Arch
from . import gemma, gpt_oss, llama, mistral3, parallel, phi3, qwen

ARCHS: dict[str, Arch] = {}
from . import falcon_h1, jamba, lfm2, mamba, nemotron_h, qwen3next, rwkv6, rwkv7  # noqa: E402  (recurrent, hybrid)
for _module in (llama, mistral3, qwen, gemma, phi3, gpt_oss, parallel, mamba, jamba, nemotron_h, falcon_h1, lfm2,
                rwkv6, rwkv7, qwen3next):
    for _arch in _module.ARCHS:
        for _name in _arch.names:
            ARCHS[_name] = _arch


def arch_for(name: str, path: str = "model") -> Arch:
    from ...gguf.loader import GGUFError
    if name not in ARCHS:
        raise GGUFError(f"{path}: architecture {name!r} is not supported (supported: {', '.join(sorted(ARCHS))})")
    return ARCHS[name]
