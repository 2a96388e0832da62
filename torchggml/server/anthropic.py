"""POST /v1/messages and /v1/messages/count_tokens: Anthropic's Messages API, as llama-server
serves it: the request becomes a chat request (its system prompt a system message; text,
tool_use and tool_result blocks the messages, assistant tool calls and tool messages they stand
for; tools with input_schema the functions; stop_sequences the stop strings), the chat path
answers, and its answer is written back as a message:

    {"id": "msg_...", "type": "message", "role": "assistant", "model",
     "content": [{"type": "thinking", ...}, {"type": "text", "text"}, {"type": "tool_use", "id", "name", "input"}],
     "stop_reason": "end_turn" | "max_tokens" | "stop_sequence" | "tool_use", "stop_sequence",
     "usage": {"input_tokens", "output_tokens", "cache_read_input_tokens"}}

A stream sends Anthropic's events: message_start, then for each content block
content_block_start, content_block_delta (text_delta, thinking_delta, input_json_delta),
content_block_stop, then message_delta (stop_reason, output tokens) and message_stop; a failure
is an `error` event. The API key may come as X-Api-Key (Anthropic's clients) or as a Bearer token.

Image blocks in user messages ({"type": "image", "source": {"type": "base64", "media_type":
"image/png", "data"}} or {"type": "url", "url"}) become the chat's image_url parts, for a server
with --mmproj (media.py reads them).
"""
from __future__ import annotations

import json
import uuid
from typing import Any, Literal

from fastapi import Request
from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, StrictStr, ValidationError

from ..models.prompt import is_parts
from .protocol import APIError, ChatRequest, Number
from .sse import event_stream, sse

ROUTES = {"/v1/messages", "/v1/messages/count_tokens"}


class Block(BaseModel):
    model_config = ConfigDict(extra="ignore")
    type: StrictStr
    text: StrictStr | None = None
    thinking: StrictStr | None = None
    id: StrictStr | None = None                          # tool_use
    name: StrictStr | None = None
    input: dict[str, Any] | None = None
    tool_use_id: StrictStr | None = None                 # tool_result
    content: StrictStr | list["Block"] | None = None
    source: dict[str, Any] | None = None                 # image: base64 data or a URL


class AnthropicMessage(BaseModel):
    model_config = ConfigDict(extra="ignore")
    role: Literal["user", "assistant"]
    content: StrictStr | list[Block]


class AnthropicTool(BaseModel):
    model_config = ConfigDict(extra="ignore")
    name: StrictStr = Field(min_length=1, max_length=256)
    description: StrictStr | None = None
    input_schema: dict[str, Any] = Field(default_factory=lambda: {"type": "object"})


class AnthropicToolChoice(BaseModel):
    type: Literal["auto", "any", "tool", "none"]
    name: StrictStr | None = None


class MessagesRequest(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore")
    model: StrictStr | None = None
    system: StrictStr | list[Block] | None = None
    messages: list[AnthropicMessage] = Field(min_length=1)
    max_tokens: StrictInt = Field(4096, ge=0)   # required by Anthropic; llama-server's default where absent
    stop_sequences: list[StrictStr] | None = None
    temperature: Number | None = Field(None, ge=0, le=2)
    top_p: Number | None = Field(None, ge=0, le=1)
    top_k: StrictInt | None = Field(None, ge=0)
    stream: StrictBool = False
    tools: list[AnthropicTool] | None = None
    tool_choice: AnthropicToolChoice | None = None


class CountRequest(MessagesRequest):
    max_tokens: StrictInt | None = None


def _text(blocks, where: str) -> str:
    if isinstance(blocks, str):
        return blocks
    out = []
    for b in blocks or []:
        if b.type != "text":
            raise APIError(400, f"{where}: a {b.type!r} block is not supported here (text only)", "messages")
        out.append(b.text or "")
    return "".join(out)


def image_part(source: dict | None, where: str) -> dict:
    """An Anthropic image block's source as the chat's image_url part."""
    kind = (source or {}).get("type")
    if kind == "base64":
        media_type, data = source.get("media_type"), source.get("data")
        if not (isinstance(media_type, str) and media_type.startswith("image/") and isinstance(data, str)):
            raise APIError(400, f"{where}: a base64 image source needs media_type image/... and data", "messages")
        return {"type": "image_url", "image_url": {"url": f"data:{media_type};base64,{data}"}}
    if kind == "url" and isinstance(source.get("url"), str):
        return {"type": "image_url", "image_url": {"url": source["url"]}}
    raise APIError(400, f"{where}: an image source must be of type base64 (media_type, data) or url "
                        f"(got {str(kind)[:40]!r})", "messages")


def chat_messages(req: MessagesRequest) -> list[dict]:
    """The request's conversation as OpenAI chat messages."""
    out = []
    if req.system is not None:
        out.append({"role": "system", "content": _text(req.system, "system")})
    for i, m in enumerate(req.messages):
        if isinstance(m.content, str):
            out.append({"role": m.role, "content": m.content})
            continue
        text, calls, results, parts = [], [], [], []  # parts: text and images, where there are images
        for k, b in enumerate(m.content):
            if b.type == "text":
                text.append(b.text or "")
                parts.append({"type": "text", "text": b.text or ""})
            elif b.type == "image" and m.role == "user":
                parts.append(image_part(b.source, f"messages[{i}].content[{k}]"))
            elif b.type == "thinking":
                continue  # earlier thinking is not shown to the model again (as the chat templates drop it)
            elif b.type == "tool_use" and m.role == "assistant":
                calls.append({"id": b.id or f"toolu_{i}_{len(calls)}", "type": "function",
                              "function": {"name": b.name or "", "arguments": json.dumps(b.input or {})}})
            elif b.type == "tool_result" and m.role == "user":
                results.append({"role": "tool", "tool_call_id": b.tool_use_id or "",
                                "content": _text(b.content, f"messages[{i}] tool_result")})
            else:
                raise APIError(400, f"messages[{i}]: a {b.type!r} block is not supported in a {m.role} message "
                                    "(text, tool_use from the assistant, tool_result and image from the user)",
                               "messages")
        out += results  # the tools' answers come right after the assistant's calls
        images = len(parts) > len(text)
        if text or calls or images or not results:
            message = {"role": m.role, "content": parts if images else "".join(text)}
            if calls:
                message["tool_calls"] = calls
            out.append(message)
    return out


def chat_request(req: MessagesRequest, stream: bool) -> ChatRequest:
    body: dict = {"messages": chat_messages(req), "stream": stream, "max_tokens": req.max_tokens}
    if stream:
        body["stream_options"] = {"include_usage": True}
    for name in ("model", "temperature", "top_p", "top_k"):
        if getattr(req, name) is not None:
            body[name] = getattr(req, name)
    if req.stop_sequences:
        body["stop"] = req.stop_sequences
    if req.tools:
        body["tools"] = [{"type": "function", "function": {"name": t.name, "description": t.description,
                                                          "parameters": t.input_schema}} for t in req.tools]
        choice = req.tool_choice
        if choice is not None:
            if choice.type == "tool" and not choice.name:
                raise APIError(400, "tool_choice of type tool needs the tool's name", "tool_choice")
            body["tool_choice"] = {"auto": "auto", "any": "required", "none": "none"}.get(choice.type) or \
                {"type": "function", "function": {"name": choice.name}}
    try:
        return ChatRequest.model_validate(body)
    except ValidationError as e:
        err = e.errors()[0]
        raise APIError(400, f"{'.'.join(map(str, err.get('loc', ())))}: {err['msg']}", "messages") from None


def stop_reason(finish: str, word: str | None) -> str:
    if finish == "tool_calls":
        return "tool_use"
    if finish == "length":
        return "max_tokens"
    return "stop_sequence" if word else "end_turn"


def _tool_use(call: dict) -> dict:
    try:
        args = json.loads(call["function"]["arguments"])
    except json.JSONDecodeError:
        args = {}
    return {"type": "tool_use", "id": call["id"], "name": call["function"]["name"], "input": args}


def _word(request: Request) -> str | None:
    jobs = request.scope.get("torchggml.jobs") or []
    return jobs[0].gen.stops.word if jobs and jobs[0].gen is not None else None


def message_of(answer: dict, request: Request, model: str, mid: str) -> dict:
    choice, usage = answer["choices"][0], answer["usage"]
    m = choice["message"]
    content = []
    if m.get("reasoning_content"):
        content.append({"type": "thinking", "thinking": m["reasoning_content"], "signature": ""})
    if m.get("content"):
        content.append({"type": "text", "text": m["content"]})
    content += [_tool_use(c) for c in m.get("tool_calls") or []]
    word = _word(request)
    return {"id": mid, "type": "message", "role": "assistant", "model": model, "content": content,
            "stop_reason": stop_reason(choice["finish_reason"], word), "stop_sequence": word,
            "usage": {"input_tokens": usage["prompt_tokens"], "output_tokens": usage["completion_tokens"],
                      "cache_read_input_tokens": 0}}


async def message_events(chunks, request: Request, model: str, mid: str):
    """OpenAI chat chunks as Anthropic's stream events."""
    block = {"index": -1, "type": None}  # the open content block
    finish = None

    def open_block(kind: str, start: dict):
        out = close_block()
        block["index"] += 1
        block["type"] = kind
        return out + sse({"type": "content_block_start", "index": block["index"], "content_block": start},
                         "content_block_start")

    def close_block() -> str:
        if block["type"] is None:
            return ""
        block["type"] = None
        return sse({"type": "content_block_stop", "index": block["index"]}, "content_block_stop")

    def delta(kind: str, **fields) -> str:
        return sse({"type": "content_block_delta", "index": block["index"], "delta": {"type": kind, **fields}},
                   "content_block_delta")

    try:
        async for chunk in chunks:
            if isinstance(chunk, APIError):
                yield sse({"type": "error", "error": {"type": chunk.type, "message": chunk.message}}, "error")
                return
            if chunk.get("usage") is not None and not chunk["choices"]:
                word = _word(request)
                yield close_block()
                yield sse({"type": "message_delta", "delta": {"stop_reason": stop_reason(finish, word),
                                                              "stop_sequence": word},
                           "usage": {"output_tokens": chunk["usage"]["completion_tokens"]}}, "message_delta")
                yield sse({"type": "message_stop"}, "message_stop")
                continue
            choice = chunk["choices"][0]
            d = choice["delta"]
            if d.get("role"):
                jobs = request.scope.get("torchggml.jobs") or []
                yield sse({"type": "message_start", "message": {
                    "id": mid, "type": "message", "role": "assistant", "model": model, "content": [],
                    "stop_reason": None, "stop_sequence": None,
                    "usage": {"input_tokens": sum(len(j.prompt) for j in jobs), "output_tokens": 0}}},
                    "message_start")
            if d.get("reasoning_content"):
                if block["type"] != "thinking":
                    yield open_block("thinking", {"type": "thinking", "thinking": ""})
                yield delta("thinking_delta", thinking=d["reasoning_content"])
            if d.get("content"):
                if block["type"] != "text":
                    yield open_block("text", {"type": "text", "text": ""})
                yield delta("text_delta", text=d["content"])
            for call in d.get("tool_calls") or []:
                yield open_block("tool_use", {"type": "tool_use", "id": call["id"], "name": call["function"]["name"],
                                              "input": {}})
                yield delta("input_json_delta", partial_json=call["function"]["arguments"])
            if choice.get("finish_reason"):
                finish = choice["finish_reason"]
    finally:
        await chunks.aclose()


def register(app, state, serving) -> None:
    @app.post("/v1/messages")
    async def messages(request: Request):
        req = await serving.parse_body(request, MessagesRequest)
        chat = await state.run(chat_request, req, req.stream)
        answer = await serving.chat(request, chat)
        if answer is None:
            return None
        mid, model = f"msg_{uuid.uuid4().hex}", req.model or state.model_id
        if req.stream:
            return event_stream(message_events(answer, request, model, mid))
        return message_of(answer, request, model, mid)

    @app.post("/v1/messages/count_tokens")
    async def count_tokens(request: Request):
        req = await serving.parse_body(request, CountRequest)
        chat = await state.run(chat_request, req, False)
        ids, _ = await state.run(state.chat_prompt, chat)
        return {"input_tokens": sum(len(p) for p in ids) if is_parts(ids) else len(ids)}  # (images: their rows)
