"""The OpenAI request bodies (pydantic, strict types: "5" is not a number) and OpenAI-style errors.

Fields beyond OpenAI's are llama.cpp's: top_k, min_p, repeat_penalty, repeat_last_n, ignore_eos,
and `grammar` (GBNF or Lark) next to response_format. Unknown fields are ignored, as OpenAI's compatible servers
do; fields we know but do not implement are refused with 400 rather than silently ignored.
"""
from __future__ import annotations

import json
import math

from typing import Any, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictFloat, StrictInt, StrictStr

from ..models.sampling import DEFAULTS

Number = Union[StrictInt, StrictFloat]
TokenIds = list[StrictInt]


# an error message is cut to this many characters: a client's 10 MB grammar is not echoed back
MAX_MESSAGE_CHARS = 1000


class APIError(Exception):
    """An error answered as OpenAI does: {"error": {"message", "type", "param", "code"}}."""

    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None,
                 type: str | None = None):
        if len(message) > MAX_MESSAGE_CHARS:
            message = message[:MAX_MESSAGE_CHARS] + f"... ({len(message)} characters)"
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code
        default = "invalid_request_error" if status < 500 else "server_error"
        self.type = type or {401: "authentication_error", 408: "timeout_error"}.get(status, default)

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


class StreamOptions(BaseModel):
    include_usage: StrictBool = False


class JsonSchema(BaseModel):
    name: StrictStr = "response"
    schema_: dict[str, Any] = Field(default_factory=lambda: {"type": "object"}, alias="schema")
    strict: StrictBool | None = None
    description: StrictStr | None = None


class ResponseFormat(BaseModel):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchema | None = None
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")  # llama.cpp's json_object + schema


class LoraScale(BaseModel):
    """One adapter's scale (llama-server's lora entries; lora_adapters.py)."""
    model_config = ConfigDict(strict=True, extra="ignore")
    id: StrictInt
    scale: Number


class Sampling(BaseModel):
    """The sampling fields both completion kinds share (defaults: llama-server's)."""
    model_config = ConfigDict(strict=True, extra="ignore", populate_by_name=True)

    model: StrictStr | None = None
    stream: StrictBool = False
    stream_options: StreamOptions | None = None
    n: StrictInt = Field(1, ge=1, le=16)
    temperature: Number = Field(DEFAULTS.temperature, ge=0, le=2)
    top_p: Number = Field(DEFAULTS.top_p, ge=0, le=1)
    top_k: StrictInt = Field(DEFAULTS.top_k, ge=0)
    min_p: Number = Field(0.05, ge=0, le=1)  # llama-server's default, not the library's
    repeat_penalty: Number = Field(DEFAULTS.repeat_penalty, gt=0)
    repeat_last_n: StrictInt = Field(DEFAULTS.repeat_last_n, ge=-1)
    frequency_penalty: Number = Field(DEFAULTS.frequency_penalty, ge=-2, le=2)
    presence_penalty: Number = Field(DEFAULTS.presence_penalty, ge=-2, le=2)
    seed: StrictInt | None = None
    stop: StrictStr | list[StrictStr] | None = None
    response_format: ResponseFormat | None = None
    grammar: StrictStr | None = None
    ignore_eos: StrictBool = False
    cache_prompt: StrictBool = True  # llama-server's: reuse a slot's cells holding a prefix of the prompt
    id_slot: StrictInt = Field(-1, ge=-1)  # llama-server's: the slot to run in (-1: any)
    lora: list[LoraScale] | None = None    # llama-server's: this request's LoRA scales (lora_adapters.py)
    user: StrictStr | None = None
    # OpenAI's {"token id": bias}, llama.cpp's [[id or text, bias]] (false: banned): see logit_bias_pairs
    logit_bias: dict[str, Any] | list[Any] | None = None
    # known, not implemented: refused (400) rather than ignored
    tools: list[Any] | None = None

    def stops(self) -> list[str]:
        return [self.stop] if isinstance(self.stop, str) else list(self.stop or [])


class CompletionRequest(Sampling):
    prompt: StrictStr | list[StrictStr] | TokenIds | list[TokenIds]
    max_tokens: StrictInt | None = Field(16, ge=0)
    logprobs: StrictInt | None = Field(None, ge=0, le=20)
    echo: StrictBool = False
    suffix: StrictStr | None = None

    def prompts(self) -> list:
        """Each prompt: a text or a list of token ids."""
        p = self.prompt
        if isinstance(p, str) or (p and all(isinstance(x, int) for x in p)):
            return [p]
        return list(p)


class ContentPart(BaseModel):
    model_config = ConfigDict(extra="ignore")
    type: StrictStr
    text: StrictStr | None = None
    image_url: StrictStr | dict[str, Any] | None = None   # {"url": data:, file://, http(s)://} (media.py)
    input_audio: dict[str, Any] | None = None            # {"data": base64, "format": "wav"}


class FunctionCall(BaseModel):
    model_config = ConfigDict(extra="ignore")
    name: StrictStr
    arguments: StrictStr | dict[str, Any] = "{}"


class ToolCall(BaseModel):
    model_config = ConfigDict(extra="ignore")
    id: StrictStr | None = None
    type: Literal["function"] = "function"
    function: FunctionCall


class Function(BaseModel):
    model_config = ConfigDict(extra="ignore")
    name: StrictStr = Field(min_length=1, max_length=256)
    description: StrictStr | None = None
    parameters: dict[str, Any] | None = None


class Tool(BaseModel):
    model_config = ConfigDict(extra="ignore")
    type: Literal["function"]
    function: Function


class NamedToolChoice(BaseModel):
    type: Literal["function"]
    function: dict[str, StrictStr]


class Message(BaseModel):
    model_config = ConfigDict(extra="ignore")
    role: StrictStr
    content: StrictStr | list[ContentPart] | None = None
    name: StrictStr | None = None
    tool_calls: list[ToolCall] | None = None  # an assistant's earlier calls
    tool_call_id: StrictStr | None = None     # a tool message: the call it answers

    @property
    def has_media(self) -> bool:
        return isinstance(self.content, list) and any(p.type != "text" for p in self.content)

    def for_template(self, content: str | None = None) -> dict:
        """The message as chat templates read it (HF's convention: arguments as objects); `content`:
        its text with media markers, for a message with images or audio."""
        m = {"role": self.role, "content": self.text() if content is None else content}
        if self.name is not None:
            m["name"] = self.name
        if self.tool_call_id is not None:
            m["tool_call_id"] = self.tool_call_id
        if self.tool_calls:
            calls = []
            for c in self.tool_calls:
                args = c.function.arguments
                if isinstance(args, str):
                    try:
                        args = json.loads(args)
                    except json.JSONDecodeError:
                        pass
                calls.append({"id": c.id, "type": "function", "function": {"name": c.function.name, "arguments": args}})
            m["tool_calls"] = calls
        return m

    def text(self) -> str:
        if isinstance(self.content, list):
            if self.has_media:
                kinds = sorted({p.type for p in self.content if p.type != "text"})
                raise APIError(400, f"{'/'.join(kinds)} content is not supported: this server has no multimodal "
                                    f"projector (start it with --mmproj FILE)", "messages")
            return "".join(p.text or "" for p in self.content)
        return self.content or ""


class ChatRequest(Sampling):
    messages: list[Message] = Field(min_length=1)
    tools: list[Tool] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: StrictBool = True
    max_tokens: StrictInt | None = Field(None, ge=0)
    max_completion_tokens: StrictInt | None = Field(None, ge=0)
    logprobs: StrictBool = False
    top_logprobs: StrictInt | None = Field(None, ge=0, le=20)
    post_sampling_probs: StrictBool = False  # llama-server's: the draw's probabilities ("prob", "top_probs")


class EmbeddingRequest(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore")
    input: StrictStr | list[StrictStr] | TokenIds | list[TokenIds]
    model: StrictStr | None = None
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: StrictInt | None = None
    user: StrictStr | None = None

    def inputs(self) -> list:
        p = self.input
        if isinstance(p, str) or (p and all(isinstance(x, int) for x in p)):
            return [p]
        return list(p)


def logit_bias_pairs(value, model) -> tuple[tuple[int, float], ...]:
    """A request's logit_bias as (token id, bias) pairs, read as llama-server reads it: an object
    {"token id" or "text": bias} (OpenAI's) or a list of [token id or text, bias] pairs; a text
    stands for each of its tokens; a bias of false bans the token (-inf). Unlike llama-server,
    an id outside the vocabulary or a malformed entry is a 400 naming it, never skipped."""
    if value is None:
        return ()
    entries = list(value.items()) if isinstance(value, dict) else value
    pairs = []
    for i, entry in enumerate(entries):
        where = f"logit_bias[{json.dumps(entry[0]) if isinstance(value, dict) else i}]"
        if not isinstance(value, dict) and (not isinstance(entry, list) or len(entry) != 2):
            raise APIError(400, f"{where}: each entry must be a pair [token id or text, bias]", "logit_bias")
        key, bias = entry
        if bias is False:
            bias = -math.inf
        elif isinstance(bias, bool) or not isinstance(bias, (int, float)) or not math.isfinite(bias):
            raise APIError(400, f"{where}: the bias must be a finite number or false, got {json.dumps(bias)}",
                           "logit_bias")
        if isinstance(key, str) and isinstance(value, dict) and key.lstrip("-").isdigit():
            key = int(key)
        if isinstance(key, bool) or not isinstance(key, (int, str)):
            raise APIError(400, f"{where}: a token is an id or a text, got {json.dumps(key)}", "logit_bias")
        if isinstance(key, int):
            if not 0 <= key < model.n_vocab:
                raise APIError(400, f"{where}: token id {key} is outside the vocabulary [0, {model.n_vocab})",
                               "logit_bias")
            ids = [key]
        else:
            ids = model.tokenize(key, add_special=False)
        pairs += [(t, float(bias)) for t in ids]
    return tuple(pairs)
