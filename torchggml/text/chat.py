"""Chat templates: a model's ``tokenizer.chat_template`` (Jinja2) rendered in a sandbox.

As HuggingFace's ``apply_chat_template`` does, the template runs in Jinja2's
ImmutableSandboxedEnvironment (no attribute tricks, no mutation of the inputs) with the
context ``messages``, ``add_generation_prompt``, ``bos_token``, ``eos_token`` and
``raise_exception``; ``tojson`` and ``strftime_now`` are available as in HF.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from functools import lru_cache
from typing import Any, Mapping, Sequence

__all__ = ["ChatTemplateError", "render_chat", "ChatTemplate", "choose_template", "BUILTIN_TEMPLATES"]


class ChatTemplateError(ValueError):
    """A chat template that cannot be used: absent, invalid, or raising while rendering."""


def _raise_exception(message: str):
    raise ChatTemplateError(f"chat template: {message}")


# llama.cpp's built-in formats (llama-chat.cpp) that `--chat-template NAME` can pick, as Jinja
BUILTIN_TEMPLATES = {
    "chatml": ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
               "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"),
    # system messages join the next user turn; "assistant" is "model"; contents are trimmed
    "gemma": ("{% set ns = namespace(system='') %}{% for m in messages %}"
              "{% if m['role'] == 'system' %}{% set ns.system = ns.system + (m['content'] | trim) %}"
              "{% else %}{% set role = 'model' if m['role'] == 'assistant' else m['role'] %}"
              "<start_of_turn>{{ role }}\n{% if ns.system and role != 'model' %}{{ ns.system }}\n\n"
              "{% set ns.system = '' %}{% endif %}{{ m['content'] | trim }}<end_of_turn>\n{% endif %}{% endfor %}"
              "{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}"),
}
# what llama.cpp uses for a file without tokenizer.chat_template (llama_chat_apply_template with
# no template, common_chat_templates_init): chatml, whatever the architecture
DEFAULT_TEMPLATE = "chatml"
# the text that ends a turn of each built-in format (a stop string where it is not one token)
TURN_ENDS = {"chatml": "<|im_end|>", "gemma": "<end_of_turn>"}


@dataclass(frozen=True)
class ChatTemplate:
    """The template a model's chats use: `text` (Jinja), `name` (a built-in's name, "file" for
    the file's own, "custom"), `note` (a line saying why, when it is not the file's own) and
    `turn_end` (the built-in's end-of-turn text, to stop on where the vocabulary lacks it)."""
    text: str
    name: str
    note: str | None = None
    turn_end: str | None = None


def choose_template(file_template: str | None, override: str | None = None, source: str = "model") -> ChatTemplate:
    """The template llama.cpp would use: `override` (a built-in name or a Jinja template, as
    llama.cpp's --chat-template), else the file's, else chatml (llama.cpp's default)."""
    if override:
        if override in BUILTIN_TEMPLATES:
            return ChatTemplate(BUILTIN_TEMPLATES[override], override, None, TURN_ENDS[override])
        if "{{" not in override and "{%" not in override:
            raise ChatTemplateError(f"unknown chat template {override!r}; choose one of "
                                    f"{', '.join(BUILTIN_TEMPLATES)} or give a Jinja template")
        return ChatTemplate(override, "custom")
    if file_template:
        return ChatTemplate(file_template, "file")
    name = DEFAULT_TEMPLATE
    return ChatTemplate(BUILTIN_TEMPLATES[name], name,
                        f"{source} has no tokenizer.chat_template: using {name}, as llama.cpp does "
                        f"(--chat-template {'|'.join(BUILTIN_TEMPLATES)} to choose another)", TURN_ENDS[name])


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
