"""Bounds on what one request may ask, checked on the parsed JSON before any tokenization, template
rendering or grammar compilation, so that no request can make the server do unbounded work before it
is refused (docs/server.md lists them).

`check_body(body, limits, room)` looks at the raw JSON object (before pydantic: a body of millions of
prompts is refused by counting, not by validating each one); `check_text` bounds a text by its length
before it is tokenized; `wrap_seed` is llama-server's reading of `seed`.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass

from .protocol import APIError

SEED_MOD = 1 << 32       # llama-server keeps seeds as uint32
RANDOM_SEED = -1         # llama-server's "pick one at random" (LLAMA_DEFAULT_SEED)
_SURROGATE = re.compile("[\ud800-\udfff]")
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")


@dataclass(frozen=True)
class Limits:
    max_body_bytes: int = 8 << 20      # larger bodies: 413 before they are read to the end
    max_json_containers: int = 1 << 16  # arrays and objects in a body, counted before it is parsed
    max_json_values: int = 1 << 19      # values (commas, commas inside strings included), likewise
    max_messages: int = 1024
    max_stops: int = 16
    max_stop_chars: int = 256
    max_grammar_chars: int = 65536      # a GBNF/Lark text, or a JSON schema serialized
    max_tools: int = 128
    max_logit_bias: int = 1024


def _count(body: dict, key: str, limit: int, what: str) -> None:
    value = body.get(key)
    if isinstance(value, (list, dict)) and len(value) > limit:
        raise APIError(400, f"{key} has {len(value)} {what}; this server accepts at most {limit}", key)


def check_raw(raw: bytes, limits: Limits) -> None:
    """Bounds on what parsing `raw` would build, by counting bytes (parsing millions of tiny arrays
    holds the interpreter for seconds; counting takes milliseconds)."""
    containers = raw.count(b"[") + raw.count(b"{")
    if containers > limits.max_json_containers:
        raise APIError(400, f"the body holds {containers} JSON arrays and objects (or brackets in strings); this "
                            f"server accepts at most {limits.max_json_containers}", None, "body_too_complex")
    values = raw.count(b",") + containers
    if values > limits.max_json_values:
        raise APIError(400, f"the body holds {values} JSON values (counting commas, also those in strings); this "
                            f"server accepts at most {limits.max_json_values}", None, "body_too_complex")


def check_body(body: dict, raw: bytes, limits: Limits, room: int) -> None:
    """Counts and sizes of a request body (a dict from json.loads of `raw`); `room`: the sequences
    the server can ever hold at once (slots + queue). Types are pydantic's job: only lists and
    strings are measured here, anything else passes to validation."""
    if _SURROGATE_ESCAPE.search(raw):  # only then is the parsed body walked
        surrogate_field(body)
    prompts = body.get("prompt", body.get("input"))
    key = "prompt" if "prompt" in body else "input"
    n = body.get("n", 1) if isinstance(body.get("n", 1), int) else 1
    if isinstance(prompts, list) and prompts and not all(isinstance(x, int) for x in prompts):
        if len(prompts) * max(n, 1) > room:
            raise APIError(400, f"the request needs {len(prompts) * max(n, 1)} sequences ({len(prompts)} "
                                f"{key}s x n={n}); this server holds {room} (--parallel + --queue-size)",
                           key if n <= 1 else "n")
    _count(body, "messages", limits.max_messages, "messages")
    _count(body, "tools", limits.max_tools, "tools")
    _count(body, "logit_bias", limits.max_logit_bias, "entries")
    stop = body.get("stop")
    stops = [stop] if isinstance(stop, str) else stop if isinstance(stop, list) else []
    if len(stops) > limits.max_stops:
        raise APIError(400, f"stop has {len(stops)} strings; this server accepts at most {limits.max_stops}", "stop")
    for s in stops:
        if isinstance(s, str) and len(s) > limits.max_stop_chars:
            raise APIError(400, f"a stop string has {len(s)} characters; this server accepts at most "
                                f"{limits.max_stop_chars}", "stop")
    grammar = body.get("grammar")
    if isinstance(grammar, str) and len(grammar) > limits.max_grammar_chars:
        raise APIError(400, f"grammar has {len(grammar)} characters; this server accepts at most "
                            f"{limits.max_grammar_chars}", "grammar")
    rf = body.get("response_format")
    if isinstance(rf, dict):
        size = len(json.dumps(rf))
        if size > limits.max_grammar_chars:
            raise APIError(400, f"response_format's schema has {size} characters of JSON; this server accepts "
                                f"at most {limits.max_grammar_chars}", "response_format")


def surrogate_field(body: dict) -> None:
    """400 naming the field when a string holds a lone UTF-16 surrogate ("\\ud800" escapes are valid
    JSON but no Unicode text): such text is refused, not replaced."""
    def has(value) -> bool:
        if isinstance(value, str):
            return _SURROGATE.search(value) is not None
        if isinstance(value, list):
            return any(has(v) for v in value)
        if isinstance(value, dict):
            return any(has(k) or has(v) for k, v in value.items())
        return False
    for key, value in body.items():
        if has(key) or has(value):
            raise APIError(400, f"{key} holds a lone UTF-16 surrogate (an unpaired \\uD800-\\uDFFF escape): not "
                                "valid Unicode text", key)


def check_text(text: str, max_chars: int, param: str, limit_tokens: int) -> None:
    """A text longer than `max_chars` cannot fit `limit_tokens` tokens (no token covers more than
    max_chars / limit_tokens characters): refused without tokenizing it."""
    if len(text) > max_chars:
        raise APIError(400, f"the {param} has {len(text)} characters, more than {limit_tokens} tokens can hold "
                            f"(this server's context)", param, "context_length_exceeded")


def wrap_seed(seed: int | None) -> int | None:
    """llama-server's seed: -1 (or none) draws one at random; any other integer is taken modulo 2^32
    (its uint32), so 2^64 and -2^63-1 are seeds, not errors."""
    if seed is None or seed == RANDOM_SEED:
        return None
    return seed % SEED_MOD
