"""POST /v1/responses (also /responses): OpenAI's Responses API, text and function tools, as
llama-server serves it: the request becomes a chat request and the chat path answers.

    {"input": str | [items], "instructions": str, "max_output_tokens": int, "tools": [{"type":
     "function", "name", "description", "parameters"}], "tool_choice", "stream", "text": {"format"}}
    -> {"id": "resp_...", "object": "response", "status": "completed" | "incomplete", "output": [
        {"type": "reasoning", ...}, {"type": "message", "content": [{"type": "output_text", "text"}]},
        {"type": "function_call", "call_id", "name", "arguments"}], "usage": {...}}

Input items: messages ({"role": "user" | "system" | "developer" | "assistant", "content": str or
input_text / output_text parts, and in a user message input_image ({"image_url": a data URL or
http(s) URL}) and input_audio ({"input_audio": {"data": base64, "format"}}) parts for a server
with --mmproj: the chat's image_url and input_audio parts, media.py reads them}), function_call items (the assistant's earlier calls) and
function_call_output items (their results, as tool messages); earlier reasoning items are dropped.
instructions is a system message first. A reply cut by max_output_tokens is "incomplete"
(incomplete_details.reason "max_output_tokens").

Responses are stored in memory (store: true, OpenAI's default; ResponseStore: the MAX_STORED most
recently used, within MAX_STORED_CHARS of JSON) with their conversation: previous_response_id
continues it (that response's input and output come before this input; its instructions do not
carry over, as OpenAI's), GET /v1/responses/{id} answers a stored response and DELETE forgets it.
An unknown or forgotten id is 400 previous_response_not_found (404 on GET and DELETE).

A stream sends response.created, response.in_progress, then per output item
response.output_item.added, its parts (response.content_part.added, response.output_text.delta ...
.done, response.content_part.done; a function call's response.function_call_arguments.delta and
.done; reasoning's response.reasoning_text.delta and .done), response.output_item.done, and
response.completed (or response.incomplete) with the whole response; each event has its
sequence_number. A failure mid-stream is an `error` event.
"""
from __future__ import annotations

import json
import time
import uuid
from collections import OrderedDict
from typing import Any, Literal

from fastapi import Request
from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, StrictStr, ValidationError

from .protocol import APIError, ChatRequest, Number
from .sse import event_stream, sse

ROUTES = {"/v1/responses", "/responses"}  # (+ /v1/responses/{id}: "other")
# stored responses: at most this many, and this many characters of JSON, least recently used dropped first
MAX_STORED = 256
MAX_STORED_CHARS = 64 << 20


class Part(BaseModel):
    model_config = ConfigDict(extra="ignore")
    type: StrictStr
    text: StrictStr | None = None
    image_url: StrictStr | None = None          # input_image
    file_id: StrictStr | None = None
    input_audio: dict[str, Any] | None = None   # input_audio: {"data": base64, "format": "wav"}


class Item(BaseModel):
    model_config = ConfigDict(extra="ignore")
    type: StrictStr = "message"
    role: StrictStr | None = None
    content: StrictStr | list[Part] | None = None
    call_id: StrictStr | None = None      # function_call, function_call_output
    name: StrictStr | None = None
    arguments: StrictStr | None = None
    output: StrictStr | list[Part] | None = None


class FunctionTool(BaseModel):
    model_config = ConfigDict(extra="ignore")
    type: Literal["function"]
    name: StrictStr = Field(min_length=1, max_length=256)
    description: StrictStr | None = None
    parameters: dict[str, Any] | None = None
    strict: StrictBool | None = None


class TextFormat(BaseModel):
    model_config = ConfigDict(extra="ignore", populate_by_name=True)
    type: Literal["text", "json_object", "json_schema"] = "text"
    name: StrictStr | None = None
    schema_: dict[str, Any] | None = Field(None, alias="schema")


class TextOptions(BaseModel):
    model_config = ConfigDict(extra="ignore")
    format: TextFormat = Field(default_factory=TextFormat)


class ResponsesRequest(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore")
    model: StrictStr | None = None
    input: StrictStr | list[Item]
    instructions: StrictStr | None = None
    max_output_tokens: StrictInt | None = Field(None, ge=0)
    temperature: Number | None = Field(None, ge=0, le=2)
    top_p: Number | None = Field(None, ge=0, le=1)
    tools: list[FunctionTool] | None = None
    tool_choice: Literal["none", "auto", "required"] | dict[str, Any] | None = None
    parallel_tool_calls: StrictBool = True
    stream: StrictBool = False
    text: TextOptions | None = None
    previous_response_id: StrictStr | None = None
    store: StrictBool = True
    seed: StrictInt | None = None


def _text(content, where: str) -> str:
    if content is None or isinstance(content, str):
        return content or ""
    for p in content:
        if p.type not in ("input_text", "output_text", "text"):
            raise APIError(400, f"{where}: a {p.type!r} part is not supported (input_text, output_text; "
                                f"input_image, input_audio in a user message)", "input")
    return "".join(p.text or "" for p in content)


def _content(content, where: str, role: str) -> str | list[dict]:
    """A message's content for the chat: its text, or with images or audio (a user's) the chat's parts."""
    if content is None or isinstance(content, str) or all(p.type not in ("input_image", "input_audio")
                                                           for p in content):
        return _text(content, where)
    if role != "user":
        raise APIError(400, f"{where}: images and audio go in user messages", "input")
    parts = []
    for k, p in enumerate(content):
        if p.type == "input_image":
            if p.image_url is None:
                what = "file_id is not supported (no files are stored)" if p.file_id else "image_url is missing"
                raise APIError(400, f"{where}.content[{k}]: an input_image's {what}; give image_url", "input")
            parts.append({"type": "image_url", "image_url": {"url": p.image_url}})
        elif p.type == "input_audio":
            parts.append({"type": "input_audio", "input_audio": p.input_audio or {}})
        else:
            parts.append({"type": "text", "text": _text([p], f"{where}.content[{k}]")})
    return parts


def item_messages(items: list[Item], param: str = "input") -> list[dict]:
    """Input (or output) items as chat messages; `param` names them in errors."""
    out: list[dict] = []
    for i, item in enumerate(items):
        where = f"{param}[{i}]"
        if item.type == "message":
            if item.role not in ("user", "system", "developer", "assistant"):
                raise APIError(400, f"{where}: role {item.role!r} must be user, system, developer or assistant", "input")
            out.append({"role": "system" if item.role == "developer" else item.role,
                        "content": _content(item.content, where, item.role)})
        elif item.type == "function_call":
            if not (item.call_id and item.name and item.arguments is not None):
                raise APIError(400, f"{where}: a function_call item needs call_id, name and arguments", "input")
            call = {"id": item.call_id, "type": "function", "function": {"name": item.name, "arguments": item.arguments}}
            if out and out[-1]["role"] == "assistant":  # calls of one turn go together
                out[-1].setdefault("tool_calls", []).append(call)
            else:
                out.append({"role": "assistant", "content": "", "tool_calls": [call]})
        elif item.type == "function_call_output":
            if not item.call_id or item.output is None:
                raise APIError(400, f"{where}: a function_call_output item needs call_id and output", "input")
            out.append({"role": "tool", "tool_call_id": item.call_id, "content": _text(item.output, where)})
        elif item.type != "reasoning":  # earlier reasoning is not shown to the model again
            raise APIError(400, f"{where}: item type {item.type!r} is not supported (message, function_call, "
                                "function_call_output, reasoning)", "input")
    return out


def input_messages(req: ResponsesRequest) -> list[dict]:
    """The request's input as chat messages (without instructions)."""
    return item_messages([Item(role="user", content=req.input)] if isinstance(req.input, str) else req.input)


def chat_messages(req: ResponsesRequest, history: list[dict] = ()) -> list[dict]:
    """The chat: instructions, the earlier conversation (previous_response_id's), the input."""
    out = [{"role": "system", "content": req.instructions}] if req.instructions is not None else []
    new = input_messages(req)
    if not new:
        raise APIError(400, "input is empty", "input")
    return out + list(history) + new


def output_messages(output: list[dict]) -> list[dict]:
    """A response's output items as the assistant's chat messages (reasoning dropped)."""
    return item_messages([Item.model_validate(o) for o in output], "output")


class ResponseStore:
    """Stored responses and their conversations (previous_response_id), least recently used dropped
    first past MAX_STORED entries or MAX_STORED_CHARS characters of JSON. Used on the event loop only."""

    def __init__(self, limit: int = MAX_STORED, chars: int = MAX_STORED_CHARS):
        self.limit, self.chars = limit, chars
        self.entries: OrderedDict[str, tuple[dict, list[dict], int]] = OrderedDict()
        self.size = 0

    def put(self, response: dict, history: list[dict]) -> None:
        size = len(json.dumps(response)) + len(json.dumps(history))
        if size > self.chars:
            return  # larger than the whole store: not kept
        self.entries[response["id"]] = (response, history, size)
        self.size += size
        while len(self.entries) > self.limit or self.size > self.chars:
            self.size -= self.entries.popitem(last=False)[1][2]

    def get(self, rid: str) -> tuple[dict, list[dict]] | None:
        entry = self.entries.get(rid)
        if entry is None:
            return None
        self.entries.move_to_end(rid)
        return entry[0], entry[1]

    def delete(self, rid: str) -> bool:
        entry = self.entries.pop(rid, None)
        if entry is not None:
            self.size -= entry[2]
        return entry is not None


def chat_request(req: ResponsesRequest, history: list[dict] = ()) -> ChatRequest:
    body: dict = {"messages": chat_messages(req, history), "stream": req.stream, "max_tokens": req.max_output_tokens,
                  "parallel_tool_calls": req.parallel_tool_calls}
    if req.stream:
        body["stream_options"] = {"include_usage": True}
    for name in ("model", "temperature", "top_p", "seed"):
        if getattr(req, name) is not None:
            body[name] = getattr(req, name)
    if req.tools:
        body["tools"] = [{"type": "function", "function": t.model_dump(exclude_none=True, exclude={"type", "strict"})}
                         for t in req.tools]
    choice = req.tool_choice
    if isinstance(choice, dict):
        if choice.get("type") != "function" or not isinstance(choice.get("name"), str):
            raise APIError(400, 'tool_choice: an object must be {"type": "function", "name": ...}', "tool_choice")
        choice = {"type": "function", "function": {"name": choice["name"]}}
    if choice is not None:
        body["tool_choice"] = choice
    fmt = req.text.format if req.text is not None else None
    if fmt is not None and fmt.type != "text":
        body["response_format"] = ({"type": "json_object"} if fmt.type == "json_object" else
                                   {"type": "json_schema", "json_schema": {"name": fmt.name or "response",
                                                                           "schema": fmt.schema_ or {}}})
    try:
        return ChatRequest.model_validate(body)
    except ValidationError as e:
        err = e.errors()[0]
        raise APIError(400, f"{'.'.join(map(str, err.get('loc', ())))}: {err['msg']}", "input") from None


def _id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


def reasoning_item(text: str, rid: str) -> dict:
    return {"type": "reasoning", "id": rid, "summary": [], "status": "completed",
            "content": [{"type": "reasoning_text", "text": text}]}


def text_part(text: str) -> dict:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def message_item(text: str, mid: str, status: str = "completed") -> dict:
    return {"type": "message", "id": mid, "role": "assistant", "status": status,
            "content": [text_part(text)] if status == "completed" else []}


def call_item(call: dict, status: str = "completed") -> dict:
    return {"type": "function_call", "id": "fc_" + call["id"], "call_id": call["id"], "status": status,
            "name": call["function"]["name"], "arguments": call["function"]["arguments"] if status == "completed" else ""}


def response_object(req: ResponsesRequest, state, rid: str, created: int, output: list, status: str,
                    usage: dict | None) -> dict:
    out = {"id": rid, "object": "response", "created_at": created, "status": status, "model": req.model or state.model_id,
           "output": output, "error": None,
           "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None,
           "instructions": req.instructions, "max_output_tokens": req.max_output_tokens,
           "parallel_tool_calls": req.parallel_tool_calls, "tool_choice": req.tool_choice or "auto",
           "tools": [t.model_dump(exclude_none=True) for t in req.tools or []], "temperature": req.temperature,
           "top_p": req.top_p, "metadata": {}, "text": {"format": {"type": "text"}}, "usage": None,
           "store": req.store, "previous_response_id": req.previous_response_id}
    if usage is not None:
        out["usage"] = {"input_tokens": usage["prompt_tokens"], "output_tokens": usage["completion_tokens"],
                        "total_tokens": usage["total_tokens"], "input_tokens_details": {"cached_tokens": 0},
                        "output_tokens_details": {"reasoning_tokens": 0}}
    return out


def _status(finish: str | None) -> str:
    return "incomplete" if finish == "length" else "completed"


def output_of(message: dict) -> list[dict]:
    out = []
    if message.get("reasoning_content"):
        out.append(reasoning_item(message["reasoning_content"], _id("rs")))
    if message.get("content"):
        out.append(message_item(message["content"], _id("msg")))
    out += [call_item(c) for c in message.get("tool_calls") or []]
    return out


async def response_events(chunks, req: ResponsesRequest, state, rid: str, created: int, on_done=None):
    """OpenAI chat chunks as the Responses API's stream events; on_done(the whole response) at the end."""
    seq = [0]
    output: list[dict] = []
    open_item: dict = {}   # the item being streamed: its kind, id, index, text so far
    finish = None

    def event(kind: str, **fields) -> str:
        seq[0] += 1
        return sse({"type": kind, "sequence_number": seq[0] - 1, **fields}, kind)

    def start(kind: str) -> str:
        text = close()
        iid = _id("rs" if kind == "reasoning" else "msg")
        open_item.update(kind=kind, id=iid, index=len(output), text="")
        item = reasoning_item("", iid) if kind == "reasoning" else message_item("", iid, "in_progress")
        item["status"] = "in_progress"
        item["content"] = []
        output.append(item)
        part = {"type": "reasoning_text", "text": ""} if kind == "reasoning" else text_part("")
        return (text + event("response.output_item.added", output_index=open_item["index"], item=item)
                + event("response.content_part.added", item_id=iid, output_index=open_item["index"],
                        content_index=0, part=part))

    def close() -> str:
        if not open_item:
            return ""
        kind, iid, index, text = open_item["kind"], open_item["id"], open_item["index"], open_item["text"]
        open_item.clear()
        if kind == "reasoning":
            item, part = reasoning_item(text, iid), {"type": "reasoning_text", "text": text}
            done = event("response.reasoning_text.done", item_id=iid, output_index=index, content_index=0, text=text)
        else:
            item, part = message_item(text, iid), text_part(text)
            done = event("response.output_text.done", item_id=iid, output_index=index, content_index=0, text=text,
                         logprobs=[])
        output[index] = item
        return (done + event("response.content_part.done", item_id=iid, output_index=index, content_index=0,
                             part=part)
                + event("response.output_item.done", output_index=index, item=item))

    def delta(text: str) -> str:
        open_item["text"] += text
        kind = "response.reasoning_text.delta" if open_item["kind"] == "reasoning" else "response.output_text.delta"
        extra = {} if open_item["kind"] == "reasoning" else {"logprobs": []}
        return event(kind, item_id=open_item["id"], output_index=open_item["index"], content_index=0, delta=text,
                     **extra)

    try:
        yield event("response.created", response=response_object(req, state, rid, created, [], "in_progress", None))
        yield event("response.in_progress", response=response_object(req, state, rid, created, [], "in_progress", None))
        async for chunk in chunks:
            if isinstance(chunk, APIError):
                yield event("error", code=chunk.code, message=chunk.message, param=chunk.param)
                return
            if chunk.get("usage") is not None and not chunk["choices"]:
                yield close()
                status = _status(finish)
                whole = response_object(req, state, rid, created, output, status, chunk["usage"])
                if on_done is not None:
                    on_done(whole)
                yield event(f"response.{status}", response=whole)
                continue
            choice = chunk["choices"][0]
            d = choice["delta"]
            if d.get("reasoning_content"):
                if open_item.get("kind") != "reasoning":
                    yield start("reasoning")
                yield delta(d["reasoning_content"])
            if d.get("content"):
                if open_item.get("kind") != "message":
                    yield start("message")
                yield delta(d["content"])
            for call in d.get("tool_calls") or []:
                yield close()
                index = len(output)
                output.append(call_item(call))
                iid, args = output[-1]["id"], call["function"]["arguments"]
                yield event("response.output_item.added", output_index=index, item=call_item(call, "in_progress"))
                yield event("response.function_call_arguments.delta", item_id=iid, output_index=index, delta=args)
                yield event("response.function_call_arguments.done", item_id=iid, output_index=index, arguments=args)
                yield event("response.output_item.done", output_index=index, item=output[-1])
            if choice.get("finish_reason"):
                finish = choice["finish_reason"]
    finally:
        await chunks.aclose()


def register(app, state, serving) -> None:
    store = ResponseStore()

    def stored(rid: str, status: int, param: str | None):
        entry = store.get(rid)
        if entry is None:
            code = "previous_response_not_found" if status == 400 else "response_not_found"
            raise APIError(status, f"Previous response with id '{rid[:200]}' not found" if status == 400 else
                           f"Response with id '{rid[:200]}' not found", param, code)
        return entry

    async def responses(request: Request):
        req = await serving.parse_body(request, ResponsesRequest)
        history = [] if req.previous_response_id is None else \
            stored(req.previous_response_id, 400, "previous_response_id")[1]
        chat = await state.run(chat_request, req, history)
        answer = await serving.chat(request, chat)
        if answer is None:
            return None
        rid, created = _id("resp"), int(time.time())
        conversation = history + input_messages(req)

        def keep(whole: dict) -> None:
            if req.store:
                store.put(whole, conversation + output_messages(whole["output"]))

        if req.stream:
            return event_stream(response_events(answer, req, state, rid, created, keep))
        choice = answer["choices"][0]
        whole = response_object(req, state, rid, created, output_of(choice["message"]),
                                _status(choice["finish_reason"]), answer["usage"])
        keep(whole)
        return whole

    async def retrieve(response_id: str):
        return stored(response_id, 404, None)[0]

    async def delete(response_id: str):
        stored(response_id, 404, None)
        store.delete(response_id)
        return {"id": response_id, "object": "response", "deleted": True}

    for prefix in ("/v1", ""):
        app.add_api_route(f"{prefix}/responses", responses, methods=["POST"])
        app.add_api_route(f"{prefix}/responses/{{response_id}}", retrieve, methods=["GET"])
        app.add_api_route(f"{prefix}/responses/{{response_id}}", delete, methods=["DELETE"])
