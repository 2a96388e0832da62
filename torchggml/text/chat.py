"""Chat templates: a model's ``tokenizer.chat_template`` (Jinja2) rendered in a sandbox.

As HuggingFace's ``apply_chat_template`` does, the template runs in Jinja2's
ImmutableSandboxedEnvironment (no attribute tricks, no mutation of the inputs) with the
context ``messages``, ``add_generation_prompt``, ``bos_token``, ``eos_token`` and
``raise_exception``; ``tojson`` and ``strftime_now`` are available as in HF.
"""
from __future__ import annotations

import json
from datetime import datetime
from functools import lru_cache
from typing import Any, Mapping, Sequence

__all__ = ["ChatTemplateError", "render_chat"]


class ChatTemplateError(ValueError):
    """A chat template that cannot be used: absent, invalid, or raising while rendering."""


def _raise_exception(message: str):
    raise ChatTemplateError(f"chat template: {message}")


@lru_cache(maxsize=8)
def _compile(template: str):
    try:
        from jinja2 import TemplateError
        from jinja2.sandbox import ImmutableSandboxedEnvironment
    except ImportError as e:  # pragma: no cover - jinja2 is a dependency
        raise ImportError("chat templates need jinja2: pip install jinja2") from e
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.filters["tojson"] = lambda x, indent=None, ensure_ascii=False: json.dumps(
        x, indent=indent, ensure_ascii=ensure_ascii)
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    try:
        return env.from_string(template)
    except TemplateError as e:
        raise ChatTemplateError(f"chat template does not compile: {e}") from None


def render_chat(template: str | None, messages: Sequence[Mapping[str, Any]], *,
                add_generation_prompt: bool = True, bos_token: str = "", eos_token: str = "",
                source: str = "model", **extra) -> str:
    """The prompt text for ``messages`` ([{"role": ..., "content": ...}, ...])."""
    if not template:
        raise ChatTemplateError(f"{source} has no tokenizer.chat_template")
    for i, m in enumerate(messages):
        if not isinstance(m, Mapping) or "role" not in m:
            raise ChatTemplateError(f"message {i} must be a mapping with 'role' and 'content', got {m!r}")
    from jinja2 import TemplateError
    try:
        return _compile(template).render(messages=[dict(m) for m in messages],
                                         add_generation_prompt=add_generation_prompt,
                                         bos_token=bos_token, eos_token=eos_token, **extra)
    except TemplateError as e:
        raise ChatTemplateError(f"{source}: chat template failed: {e}") from None
