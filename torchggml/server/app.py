"""The HTTP side: an ASGI app (FastAPI) with OpenAI's endpoints over the continuous-batching engine.

    /v1/models  /v1/completions  /v1/chat/completions  /v1/embeddings  (also without /v1)
    /health  /metrics (Prometheus text)

and, each with its protocol in a module of its own (ENDPOINTS, registered with a Serving): llama-server's
/completion (completion.py), /infill (infill.py), /v1/rerank (rerank.py), /lora-adapters
(lora_adapters.py), Anthropic's /v1/messages (anthropic.py) and OpenAI's /v1/responses
(responses.py); /tokenize, /detokenize, /apply-template, /props, /slots (llama_endpoints.py); the
chat page (webui.py).

Requests are checked before anything runs; every bad input is an OpenAI-style JSON error with a
4xx status (engine failures are 500, a full queue 503). Streaming answers are server-sent events
("data: {chunk}" ... "data: [DONE]"); a client that hangs up cancels its sequences (the stream's
generator is closed, or a waiting non-streaming handler sees the disconnect). With an API key every
endpoint but /health wants "Authorization: Bearer KEY" (or "X-Api-Key: KEY"), compared in constant time.
"""
from __future__ import annotations

import asyncio
import base64
import hmac
import json
import time
import uuid
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Callable

import torch
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse
from pydantic import RootModel, ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

from ..models.generation import Generation
from ..models.prompt import is_parts
from ..models.sampling import SamplingParams
from .engine import Engine, Job, QueueFull
from .grammar import Constraint, GrammarError, Vocabulary
from .limits import Limits, check_body, check_raw, check_text, wrap_seed
from .protocol import (APIError, ChatRequest, CompletionRequest, EmbeddingRequest, NamedToolChoice, Sampling,
                       logit_bias_pairs)
from .tool_calls import ReplyStream, ToolFormat, tool_format
from . import anthropic, completion, infill, llama_endpoints, lora_adapters, rerank, responses, webui
from .lora_adapters import scales_of
from .sse import sse_response

# how often a waiting non-streaming handler checks that its client is still there
DISCONNECT_POLL_S = 0.25
# a text longer than slot_ctx x (the most characters one token covers) x this cannot fit (slack for
# normalizers that shrink text); it is refused before tokenizing
TEXT_SLACK = 4
# llama-server's answer while the model loads
LOADING = {"error": {"code": 503, "message": "Loading model", "type": "unavailable_error"}}


class ServerState:
    """What the endpoints share: the model, the engine, the served name, the limits, counters.

    The server answers before the model is loaded: `model` and `engine` are None, and every endpoint
    answers 503 "Loading model" until `attach` and `warm_up` have run (`ready`)."""

    def __init__(self, model, engine: Engine | None, model_id: str, pooling: str | None = None,
                 limits: Limits | None = None, strict_model: bool = False, request_timeout: float | None = None,
                 reasoning_format: str = "auto", media_path: str | None = None, slot_save_path: str | None = None):
        self.model_id, self.pooling_option = model_id, pooling
        self.mm = None                             # a torchggml.mtmd.Multimodal: images and audio in chats
        self.media_path = media_path               # file:// media URLs name files in this folder (media.py)
        self.reasoning_format = reasoning_format   # "auto": thinking as reasoning_content; "none": left in content
        self.slot_save_path = slot_save_path       # slot files' folder (None: slot actions answer 501)
        self.limits = limits or Limits()
        self.strict_model = strict_model           # unknown model names: 404 (default: served, as llama-server)
        self.request_timeout = request_timeout     # seconds a sequence may run (None: no deadline)
        self.requests = Counter()  # (route, status) -> count
        self.created = int(time.time())
        self._vocab: Vocabulary | None = None
        # tokenization, template rendering, grammar compilation and body parsing: off the event loop
        self.pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="torchggml-prepare")
        self.model = self.engine = None
        self.lora_paths: list[str] = []          # serve --lora: the adapters (lora_adapters.py)
        self.lora_scales: tuple[float, ...] = ()  # their scales for requests without a lora field
        self.ready = False
        if model is not None:
            self.attach(model, engine)
            self.ready = True

    def attach(self, model, engine: Engine, mm=None) -> None:
        if getattr(model.arch, "encoder_decoder", False):  # its decoder reads one encoded prompt at a time
            raise ValueError(f"{model.path}: {model.hp.arch} is an encoder-decoder model; the server does not run "
                             f"those (use Model.generate)")
        self.model, self.engine, self.mm = model, engine, mm
        self.pooling = self.pooling_option or model.pooling_type
        tok = model.tokenizer
        cover = max(max(len(tok.token_to_piece_bytes(i)), len(tok.token_text(i))) for i in range(model.n_vocab))
        self.max_text_chars = engine.slot_ctx * max(cover, 1) * TEXT_SLACK

    def warm_up(self) -> None:
        """One short generation through the engine (kernels compiled, buffers planned) and the
        grammar vocabulary, so that the first client does not pay for them; then ready."""
        import threading
        from ..models.sampling import SamplingParams as Params
        done = threading.Event()
        try:
            ids = self.model.tokenize("Hello", add_special=True) or [0]
            gen = Generation(self.model.tokenizer, ids, Params(temperature=0), 2)
        except Exception:  # no usable tokenizer: nothing to warm (requests will say what is wrong)
            gen = None
        if gen is not None:  # an engine error ends the job too: warming is best effort
            self.engine.submit([Job(ids, lambda event: event[0] in ("done", "error") and done.set(), gen)])
            done.wait(600)
        try:
            self.vocab
        except GrammarError:  # llguidance absent: grammars answer 400 when asked
            pass
        self.ready = True

    async def run(self, fn, *args):
        """fn(*args) on the preparation thread: the event loop keeps answering meanwhile."""
        return await asyncio.get_running_loop().run_in_executor(self.pool, fn, *args)

    @property
    def vocab(self) -> Vocabulary:
        if self._vocab is None:
            self._vocab = Vocabulary(self.model.tokenizer)
        return self._vocab

    # ------------------------------------------------------------ request checks

    def check_model(self, name: str | None) -> None:
        """Whatever name is asked is served (as llama-server); with strict_model another name is 404."""
        if self.strict_model and name is not None and name != self.model_id:
            raise APIError(404, f"The model '{name[:200]}' does not exist; this server serves '{self.model_id}'",
                           "model", "model_not_found")

    def prompt_ids(self, prompt, param: str = "prompt", add_special: bool = True, parse_special: bool = False) -> list[int]:
        limit = self.engine.slot_ctx
        if isinstance(prompt, str):
            check_text(prompt, self.max_text_chars, param, limit)
            ids = self.model.tokenize(prompt, add_special=add_special, parse_special=parse_special)
        else:
            ids = list(prompt)
            if len(ids) < limit:
                bad = [t for t in ids if not 0 <= t < self.model.n_vocab]
                if bad:
                    raise APIError(400, f"token id {bad[0]} is outside the vocabulary [0, {self.model.n_vocab})",
                                   param)
        if not ids:
            raise APIError(400, f"the {param} is empty", param)
        if len(ids) >= limit:
            raise APIError(400, f"the {param} has {len(ids)} tokens; this server's context (n_ctx) holds {limit}, "
                                f"prompt and completion together", param, "context_length_exceeded")
        return ids

    def constraint_source(self, req: Sampling) -> tuple[str, object] | None:
        if req.grammar is not None and req.response_format is not None and req.response_format.type != "text":
            raise APIError(400, "give either grammar or response_format, not both", "grammar")
        tools = self.tool_grammar(req) if isinstance(req, ChatRequest) else None
        if tools is not None:
            if req.grammar is not None or (req.response_format is not None and req.response_format.type != "text"):
                raise APIError(400, "a call the request requires (tool_choice) cannot also follow a grammar or "
                                    "response_format", "tool_choice")
            return "grammar", tools
        if req.grammar is not None:
            return "grammar", req.grammar
        rf = req.response_format
        if rf is None or rf.type == "text":
            return None
        if rf.type == "json_schema":
            if rf.json_schema is None:
                raise APIError(400, "response_format of type json_schema needs a json_schema", "response_format")
            return "json_schema", rf.json_schema.schema_
        return "json_schema", rf.schema_ or {"type": "object"}

    def check_unsupported(self, req: Sampling) -> None:
        if not isinstance(req, ChatRequest) and req.tools is not None:
            raise APIError(400, "tools is not supported by this server", "tools")

    def jobs(self, req: Sampling, prompts: list, max_tokens: int | None, logprobs: int | None,
             stops: list[str], emit) -> list[Job]:
        """A Job per prompt and choice; a prompt is token ids, or parts with media (chat_prompt):
        those are evaluated when their slot starts and never kept in the prompt cache."""
        source = self.constraint_source(req)
        grammar = None
        if source is not None:
            param = "grammar" if source[0] == "grammar" else "response_format"
            try:
                grammar = self.vocab.compile(*source)
            except GrammarError as e:
                raise APIError(400, str(e), param) from None
            try:  # before decoding: a grammar whose language is empty fails here
                Constraint(self.vocab, grammar, json_bounds=source[0] == "json_schema").allowed()
            except GrammarError as e:
                raise APIError(400, f"the {param} can produce no string ({e})", param) from None
        seed = wrap_seed(req.seed)
        bias = logit_bias_pairs(req.logit_bias, self.model)
        if req.id_slot >= self.engine.parallel:
            raise APIError(400, f"id_slot {req.id_slot}: this server has slots 0..{self.engine.parallel - 1} "
                                "(--parallel)", "id_slot")
        id_slot = req.id_slot
        lora = None if req.lora is None else scales_of(req.lora, len(self.lora_paths), "lora")
        lora = lora if self.lora_paths else None  # (no adapters: an empty list asks nothing)
        deadline = None if self.request_timeout is None else time.monotonic() + self.request_timeout
        jobs = []
        for p_index, ids in enumerate(prompts):
            for k in range(req.n):
                params = SamplingParams(
                    temperature=float(req.temperature), top_k=req.top_k, top_p=float(req.top_p),
                    min_p=float(req.min_p), repeat_penalty=float(req.repeat_penalty),
                    frequency_penalty=float(req.frequency_penalty), presence_penalty=float(req.presence_penalty),
                    repeat_last_n=req.repeat_last_n, seed=None if seed is None else wrap_seed(seed + k),
                    logprobs=logprobs, logit_bias=bias,
                    post_sampling_probs=logprobs is not None and getattr(req, "post_sampling_probs", False))
                media = is_parts(ids)
                n_prompt = sum(len(p) for p in ids) if media else len(ids)
                limit = self.engine.slot_ctx - n_prompt
                if max_tokens is not None and max_tokens > limit:  # it could never be admitted
                    raise APIError(400, f"the prompt ({n_prompt} tokens) and max_tokens ({max_tokens}) need "
                                        f"{n_prompt + max_tokens} tokens, more than this server's context (n_ctx "
                                        f"{self.engine.slot_ctx})", "max_tokens", "context_length_exceeded")
                n = limit if max_tokens is None else max_tokens
                constraint = None
                if grammar is not None:
                    constraint = Constraint(self.vocab, grammar, json_bounds=source[0] == "json_schema")
                if media:
                    gen = self.model.generation(ids, n, params, stops, constraint, req.ignore_eos, what="messages")
                else:
                    gen = Generation(self.model.tokenizer, ids, params, n, stops, constraint, req.ignore_eos)
                jobs.append(Job(gen.prompt, emit, gen, index=p_index * req.n + k,
                                cache_prompt=req.cache_prompt and not media, deadline=deadline, id_slot=id_slot,
                                lora=lora))
        return jobs

    @property
    def room(self) -> int:
        """The sequences this server can ever hold at once: slots and queue."""
        return self.engine.parallel + self.engine.max_queue

    def submit(self, jobs: list[Job]) -> None:
        if self.lora_paths:  # a request without its own LoRA scales runs with the server's of now
            for job in jobs:
                job.lora = self.lora_scales if job.lora is None else job.lora
        room = self.room
        if len(jobs) > room:  # could never be accepted: not a matter of retrying later
            raise APIError(400, f"the request needs {len(jobs)} sequences (prompts x n); this server runs "
                                f"{self.engine.parallel} and queues {self.engine.max_queue}", "n")
        try:
            self.engine.submit(jobs)
        except QueueFull as e:
            raise APIError(503, str(e), None, "server_busy") from None

    # ------------------------------------------------------------ chat

    def chat_prompt(self, req: ChatRequest) -> tuple[list, list[str]]:
        """The prompt's token ids (with images or audio: its parts, the media encoded) and extra
        stop strings (see chat_text)."""
        prompt, stops, media = self.chat_text(req)
        tok = self.model.tokenizer
        has_bos = tok.bos_id is not None and prompt.startswith(tok.token_text(tok.bos_id))
        if not media:
            return self.prompt_ids(prompt, "messages", add_special=not has_bos, parse_special=True), stops
        from ..models.prompt import prompt_parts
        from ..mtmd import media_prompt
        parts = media_prompt(prompt, media)
        if isinstance(parts[0], str):
            parts[0] = self.model.tokenize(parts[0], add_special=not has_bos, parse_special=True)
        try:
            parts = prompt_parts(self.mm.parts(parts), lambda text, first: self.model.tokenize(
                text, add_special=False, parse_special=True), "messages")
        except ValueError as e:  # an image or audio clip that cannot be decoded
            raise APIError(400, f"messages: {e}", "messages") from None
        n = sum(len(p) for p in parts)
        if n >= self.engine.slot_ctx:
            raise APIError(400, f"the messages have {n} tokens with their media; this server's context per sequence "
                                f"holds {self.engine.slot_ctx}, prompt and completion together", "messages",
                           "context_length_exceeded")
        return parts, stops

    def template_messages(self, req: ChatRequest) -> tuple[list[dict], list]:
        """The messages as the chat template reads them, and their images and audio (each one's
        place a media marker in its message's text)."""
        messages, media = [], []
        for i, m in enumerate(req.messages):
            if not m.has_media or self.mm is None:  # (text() says that media needs --mmproj)
                messages.append(m.for_template())
                continue
            from ..mtmd import split_media
            from .media import resolve_content
            (text,), items = split_media([{"content": resolve_content(m.content, self.mm, self.media_path, f"messages[{i}]")}])
            messages.append(m.for_template(text["content"]))
            media += items
        return messages, media

    def chat_text(self, req: ChatRequest) -> tuple[str, list[str], list]:
        """The chat prompt's text and extra stop strings (Model.chat_template and chat_stops: the
        file's template, else chatml as llama.cpp falls back to, and its end of turn where the
        vocabulary lacks it), and the media its markers stand for. With tools, the template gets
        them (or, for a template that cannot show them, a system message does: tool_calls.py's
        generic format)."""
        from ..text.chat import ChatTemplateError, render_chat
        tok = self.model.tokenizer
        template, stops = self.model.chat_template().text, self.model.chat_stops()
        text = lambda i: tok.token_text(i) if i is not None else ""  # noqa: E731
        messages, media = self.template_messages(req)
        extra = {}
        if req.tools and req.tool_choice != "none":
            tools = [t.model_dump(exclude_none=True) for t in req.tools]
            system = tool_format(template).system_prompt(tools)
            if system is None:  # the template lists the tools itself
                extra["tools"] = tools
            elif messages[0]["role"] == "system":
                messages[0] = dict(messages[0], content=messages[0]["content"] + "\n\n" + system)
            else:
                messages.insert(0, {"role": "system", "content": system})
        check_text("".join(m["content"] + m["role"] for m in messages), self.max_text_chars, "messages",
                   self.engine.slot_ctx)
        try:
            prompt = render_chat(template, messages, bos_token=text(tok.bos_id), eos_token=text(tok.eos_id),
                                 source=self.model_id, **extra)
        except ChatTemplateError as e:
            raise APIError(400, str(e), "messages") from None
        return prompt, stops, media

    def reply_format(self) -> ToolFormat:
        return tool_format(self.model.chat_template().text)

    def tool_grammar(self, req: ChatRequest) -> str | None:
        """The Lark grammar that holds the reply to a tool call where the request requires one (or
        the generic format's JSON), or None."""
        if not req.tools or req.tool_choice == "none":
            return None
        tools = [t.model_dump(exclude_none=True) for t in req.tools]
        choice = req.tool_choice.model_dump() if isinstance(req.tool_choice, NamedToolChoice) else (req.tool_choice or "auto")
        try:
            return self.reply_format().grammar(tools, choice)
        except ValueError as e:
            raise APIError(400, str(e), "tool_choice") from None

    # ------------------------------------------------------------ metrics

    def metrics_text(self) -> str:
        s, e, m = self.engine.stats, self.engine, self.model
        lines = []

        def metric(name, kind, help, samples):
            lines.extend([f"# HELP torchggml_{name} {help}", f"# TYPE torchggml_{name} {kind}"])
            for labels, value in samples:
                label = "{" + ",".join(f'{k}="{_escape_label(v)}"' for k, v in labels.items()) + "}" if labels else ""
                lines.append(f"torchggml_{name}{label} {value}")

        metric("requests_total", "counter", "HTTP requests by route (other: no such route) and status",
               [({"path": p, "status": st}, n) for (p, st), n in sorted(self.requests.items())])
        metric("prompt_tokens_total", "counter", "prompt tokens processed", [({}, s.prompt_tokens)])
        metric("draft_tokens_total", "counter", "speculative decoding: draft tokens evaluated", [({}, s.drafted_tokens)])
        metric("draft_tokens_accepted_total", "counter", "speculative decoding: draft tokens taken",
               [({}, s.accepted_tokens)])
        metric("draft_acceptance_ratio", "gauge", "speculative decoding: accepted / drafted",
               [({}, s.accepted_tokens / s.drafted_tokens if s.drafted_tokens else 0.0)])
        metric("prompt_tokens_cached_total", "counter", "prompt tokens found in a slot's cells (prompt cache)",
               [({}, s.cached_prompt_tokens)])
        metric("prompt_tokens_reused_total", "counter", "of them, moved to another position (--cache-reuse)",
               [({}, s.reused_tokens)])
        pc = e.prompt_cache
        if pc is not None:
            metric("prompt_cache_bytes", "gauge", "host-memory prompt cache: bytes held (--cache-ram)", [({}, pc.nbytes)])
            metric("prompt_cache_entries", "gauge", "host-memory prompt cache: prompts held", [({}, len(pc.entries))])
            metric("prompt_cache_stored_total", "counter", "host-memory prompt cache: prompts stored", [({}, pc.stored)])
            metric("prompt_cache_evicted_total", "counter", "host-memory prompt cache: prompts dropped for room",
                   [({}, pc.evicted)])
            metric("prompt_cache_hits_total", "counter", "host-memory prompt cache: prefixes copied back to a slot",
                   [({}, pc.hits)])
            metric("prompt_cache_restored_tokens_total", "counter", "host-memory prompt cache: tokens copied back",
                   [({}, pc.restored_tokens)])
        metric("generated_tokens_total", "counter", "tokens generated", [({}, s.generated_tokens)])
        metric("tokens_per_second", "gauge", "tokens generated per second over the last 10 s",
               [({}, f"{s.tokens_per_second():.3f}")])
        metric("decode_steps_total", "counter", "batched evaluation steps", [({}, s.steps)])
        metric("batch_tokens_total", "counter", "tokens in all steps (batch size = this / steps)",
               [({}, s.batch_tokens)])
        metric("mixed_steps_total", "counter", "steps with prompt chunks beside running decodes",
               [({}, s.mixed_steps)])
        metric("sequences_finished_total", "counter", "sequences ended, by reason",
               [({"reason": r}, n) for r, n in sorted(s.sequences_finished.items())])
        metric("queue_waiting", "gauge", "requests' sequences waiting for a slot or for cells", [({}, e.n_waiting)])
        metric("sequences_active", "gauge", "sequences in slots", [({}, len(e.active))])
        metric("slots", "gauge", "parallel sequences (--parallel)", [({}, e.parallel)])
        kv = m.memory
        used = kv.n_past if kv is not None else 0
        metric("kv_cache_used_cells", "gauge", "KV cache cells holding tokens", [({}, used)])
        metric("kv_cache_cells", "gauge", "KV cache size (n_ctx)", [({}, m.n_ctx)])
        metric("kv_cache_usage_ratio", "gauge", "used / size", [({}, f"{used / m.n_ctx:.4f}")])
        return "\n".join(lines) + "\n"


# ---------------------------------------------------------------- response pieces

def _usage(prompt_tokens: int, completion_tokens: int) -> dict:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


def _piece(tok, token: int) -> bytes:
    return tok.token_to_piece_bytes(token)


def completion_logprobs(tok, choices, offset: int) -> dict:
    out = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
    for c in choices:
        piece = _piece(tok, c.token).decode("utf-8", errors="replace")
        out["tokens"].append(piece)
        out["token_logprobs"].append(c.logprob)
        out["top_logprobs"].append({_piece(tok, t).decode("utf-8", errors="replace"): lp for t, lp in c.top})
        out["text_offset"].append(offset)
        offset += len(piece)
    return out


def chat_logprobs(tok, choices, post_sampling: bool = False) -> dict:
    """OpenAI's logprobs.content; with post_sampling (llama-server's post_sampling_probs) each entry's
    "prob" and "top_probs", the draw's probabilities, instead of "logprob" and "top_logprobs"."""
    def entry(token, value):
        piece = _piece(tok, token)
        return {"token": piece.decode("utf-8", errors="replace"), "prob" if post_sampling else "logprob": value,
                "bytes": list(piece)}
    if post_sampling:
        return {"content": [{**entry(c.token, c.prob), "top_probs": [entry(t, p) for t, p in c.top_probs]}
                            for c in choices]}
    return {"content": [{**entry(c.token, c.logprob), "top_logprobs": [entry(t, lp) for t, lp in c.top]}
                        for c in choices]}


def _escape_label(value) -> str:
    """A Prometheus label value: backslash, double quote and newline escaped."""
    return str(value).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def merge_deltas(deltas: list[dict]) -> dict:
    """Deltas of one chunk as one: texts joined, tool calls listed."""
    out: dict = {}
    for d in deltas:
        for key, value in d.items():
            out[key] = out.get(key, [] if key == "tool_calls" else "") + value
    return out


async def read_body(request: Request, limit: int, timeout: float) -> bytes:
    """The body, at most `limit` bytes (413 past it, before reading the rest) within `timeout`
    seconds (408)."""
    length = request.headers.get("content-length")
    if length is not None and length.isdigit() and int(length) > limit:
        raise APIError(413, f"the body has {int(length)} bytes; this server accepts at most {limit} "
                            "(--max-body-size)", None, "body_too_large")
    chunks, size = [], 0

    async def read():
        nonlocal size
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                raise APIError(413, f"the body has more than {limit} bytes; this server accepts at most {limit} "
                                    "(--max-body-size)", None, "body_too_large")
            chunks.append(chunk)
    try:
        await asyncio.wait_for(read(), timeout)
    except asyncio.TimeoutError:
        raise APIError(408, f"the body was not received within {timeout:g} s (--timeout)", None,
                       "request_timeout") from None
    return b"".join(chunks)


async def parse_body(request: Request, cls, state: "ServerState", timeout: float):
    """The JSON body as `cls` (whatever the Content-Type, as llama-server), its size and counts
    bounded (limits.py) before it is validated; APIError 400 for malformed JSON or a field of the
    wrong type or range, naming the field. Parsing runs on the preparation thread."""
    raw = await read_body(request, state.limits.max_body_bytes, timeout)
    return await state.run(_validate, raw, cls, state)


def _validate(raw: bytes, cls, state: "ServerState"):
    check_raw(raw, state.limits)
    try:
        body = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise APIError(400, f"malformed JSON body: {e}") from None
    if isinstance(cls, type) and issubclass(cls, RootModel):  # a body that is a list (/lora-adapters)
        pass
    elif not isinstance(body, dict):
        raise APIError(400, f"the body must be a JSON object, got {type(body).__name__}")
    else:
        check_body(body, raw, state.limits, state.room)
    try:
        return cls.model_validate(body)
    except ValidationError as e:
        errors = e.errors()
        # the top-level field is the param; a union's alternatives are reported together
        param = str(errors[0]["loc"][0]) if errors[0].get("loc") else None
        same = [err for err in errors if err.get("loc", ())[:1] == errors[0].get("loc", ())[:1]]
        reasons = " or ".join(dict.fromkeys(err["msg"] for err in same))
        got = f" (got {json.dumps(same[0]['input'])[:80]})" if param and "input" in same[0] else ""
        raise APIError(400, f"{param or 'body'}: {reasons}{got}", param) from None


@dataclass(frozen=True)
class Serving:
    """What create_app gives the endpoint modules: parse_body(request, cls) -> the validated body;
    start(request, jobs_for) -> (queue, jobs) queued; run_generation(...) (see create_app);
    chat(request, ChatRequest) -> OpenAI's chat.completion, or its chunks when the request streams;
    pooled(request, inputs, pooling) -> each input's pooled states (None: the client hung up)."""
    parse_body: Callable
    start: Callable
    run_generation: Callable
    chat: Callable
    pooled: Callable


OPEN_PATHS = ("/health", "/")  # no API key: readiness, and the chat page (its API calls carry the key)


class StalledClient(Exception):
    """A client that did not take a response's bytes within the write timeout."""


class AuthAndCount:
    """Checks the API key (constant-time compare; /health and the chat page are open), answers 503 while the model
    loads, bounds each write to the client by `write_timeout` (a stream whose client stops reading
    is cancelled: its jobs, listed in scope["torchggml.jobs"] by the handler, and its connection),
    and counts responses by route and status for /metrics (a path no route serves counts as "other",
    so that clients cannot grow the counters)."""

    def __init__(self, app, state: ServerState, api_key: str | None, routes: set[str], write_timeout: float):
        self.app, self.state, self.routes, self.write_timeout = app, state, routes, write_timeout
        self.expected = f"Bearer {api_key}".encode() if api_key is not None else None

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        path = scope["path"]
        route = path if path in self.routes else "other"
        if self.expected is not None and path not in OPEN_PATHS:
            headers = dict(scope.get("headers") or [])
            given = headers.get(b"authorization", b"")
            if not given and b"x-api-key" in headers:  # Anthropic's clients send the key in X-Api-Key
                given = b"Bearer " + headers[b"x-api-key"]
            if not hmac.compare_digest(given, self.expected):
                self.state.requests[(route, 401)] += 1
                error = APIError(401, "Invalid or missing API key (Authorization: Bearer KEY, or X-Api-Key: KEY)", None,
                                 "invalid_api_key")
                return await JSONResponse(error.body(), status_code=401)(scope, receive, send)
        if not self.state.ready:
            self.state.requests[(route, 503)] += 1
            return await JSONResponse(LOADING, status_code=503)(scope, receive, send)
        status = [500]
        jobs = scope["torchggml.jobs"] = []

        async def send_and_note(message):
            if message["type"] == "http.response.start":
                status[0] = message["status"]
            try:
                await asyncio.wait_for(send(message), self.write_timeout)
            except asyncio.TimeoutError:
                for j in jobs:
                    j.cancel()
                raise StalledClient(f"the client took no data for {self.write_timeout:g} s (--timeout)") from None
        try:
            await self.app(scope, receive, send_and_note)
        finally:
            self.state.requests[(route, status[0])] += 1


# ---------------------------------------------------------------- the app

# the endpoints with their protocol in a module of their own: module.ROUTES, module.register(app, state, serving)
ENDPOINTS = (rerank, completion, infill, anthropic, responses, lora_adapters)
ROUTES = {"/", "/health", "/metrics"} | llama_endpoints.ROUTES | set().union(*(m.ROUTES for m in ENDPOINTS)) | {
    f"{prefix}/{name}" for prefix in ("/v1", "") for name in ("models", "completions", "chat/completions", "embeddings")}


def create_app(state: ServerState, api_key: str | None = None, timeout: float = 600.0):
    """The ASGI app; `timeout` (seconds, llama-server's --timeout): how long a request body may take
    to arrive, and how long a client may leave a response's bytes unread."""
    app = FastAPI(title="torchggml", docs_url=None, redoc_url=None, openapi_url=None)
    app.state.server = state

    def error_response(e: APIError) -> JSONResponse:
        return JSONResponse(e.body(), status_code=e.status)

    # a plain ASGI middleware: Starlette's BaseHTTPMiddleware would hide client disconnects
    app.add_middleware(AuthAndCount, state=state, api_key=api_key, routes=ROUTES, write_timeout=timeout)

    @app.exception_handler(APIError)
    async def on_api_error(request, e: APIError):
        return error_response(e)

    @app.exception_handler(StarletteHTTPException)
    async def on_http_error(request, e: StarletteHTTPException):
        path = request.url.path[:200]
        message = {404: f"no such endpoint: {request.method} {path}",
                   405: f"method {request.method} is not allowed on {path}"}.get(e.status_code, str(e.detail))
        return error_response(APIError(e.status_code, message, None, None))

    @app.exception_handler(Exception)
    async def on_crash(request, e: Exception):
        if isinstance(e, StalledClient):
            raise e  # the connection is dropped: nothing can be sent to this client
        return error_response(APIError(500, f"{type(e).__name__}: {e}", type="server_error"))

    webui.register(app)
    llama_endpoints.register(app, state, parse_body, timeout)

    @app.get("/health")
    async def health():  # readiness, as llama-server: 503 "Loading model" (the middleware) until warmed
        return {"status": "ok"}

    @app.get("/metrics")
    async def metrics():
        return PlainTextResponse(state.metrics_text(), media_type="text/plain; version=0.0.4")

    async def models():
        return {"object": "list", "data": [{"id": state.model_id, "object": "model", "created": state.created,
                                            "owned_by": "torchggml"}]}

    async def next_event(queue: asyncio.Queue, request: Request, jobs: list[Job], checked: list[float]):
        """The next engine event; None when the client hung up (its jobs are cancelled). The
        connection is checked every DISCONNECT_POLL_S (checked[0]: the last time), events or not."""
        while True:
            if time.monotonic() - checked[0] >= DISCONNECT_POLL_S:
                checked[0] = time.monotonic()
                if await request.is_disconnected():
                    for j in jobs:
                        j.cancel()
                    return None
            try:
                return await asyncio.wait_for(queue.get(), DISCONNECT_POLL_S)
            except asyncio.TimeoutError:
                pass

    async def start(request: Request, jobs_for) -> tuple[asyncio.Queue, list[Job]]:
        """The request's jobs, made on the preparation thread (grammars compiled, stop strings
        indexed), then queued."""
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue = asyncio.Queue()
        jobs = await state.run(jobs_for, lambda event: loop.call_soon_threadsafe(queue.put_nowait, event))
        state.submit(jobs)
        request.scope.setdefault("torchggml.jobs", []).extend(jobs)
        return queue, jobs

    def failure(payload, status) -> APIError:
        """An engine error event as an APIError: the client's grammar (400) or the server (500)."""
        if status == 400:
            return APIError(400, payload, "grammar")
        return APIError(500, payload, type="server_error")

    async def run_generation(request: Request, jobs: list[Job], queue, stream: bool, chunk_of, final_of,
                             include_usage: bool, raw: bool = False):
        """Collect (or stream) the jobs' events. chunk_of(job, text, choices, finish) -> a streamed
        chunk; final_of(texts, choices, finishes, usage) -> the whole answer. A stream is an SSE
        response, or with `raw` the chunks themselves (an async iterator of dicts, an APIError where
        the generation failed) for an endpoint that answers in another protocol."""
        n_prompt = sum(len(j.prompt) for j in jobs)

        def usage():
            return _usage(n_prompt, sum(j.gen.n_generated for j in jobs))

        if not stream:
            texts, picked, finishes = [""] * len(jobs), [[] for _ in jobs], [None] * len(jobs)
            remaining, checked = len(jobs), [time.monotonic()]
            while remaining:
                event = await next_event(queue, request, jobs, checked)
                if event is None:
                    return None
                kind, job, payload, new = event
                if kind == "error":
                    for j in jobs:
                        j.cancel()
                    raise failure(payload, new)
                texts[job.index] += payload
                if kind == "token":
                    picked[job.index] += new
                else:
                    finishes[job.index] = job.gen.finish_reason
                    remaining -= 1
            return final_of(texts, picked, finishes, usage())

        async def chunks():
            try:
                for j in jobs:
                    first = chunk_of(j, None, [], None)  # the opening chunk (chat: the role)
                    if first is not None:
                        yield first
                remaining = len(jobs)
                while remaining:
                    kind, job, payload, new = await queue.get()
                    if kind == "error":
                        yield failure(payload, new)
                        return
                    if kind == "token":
                        yield chunk_of(job, payload, new, None)
                    else:
                        remaining -= 1
                        yield chunk_of(job, payload, [], job.gen.finish_reason)
                if include_usage:
                    yield chunk_of(None, None, [], None) | {"choices": [], "usage": usage()}
            finally:  # also when the client hung up: Starlette closes the stream
                for j in jobs:
                    j.cancel()

        return chunks() if raw else sse_response(chunks(), done="data: [DONE]\n\n")

    async def completions(request: Request):
        req = await parse_body(request, CompletionRequest, state, timeout)
        state.check_model(req.model)
        if req.suffix is not None:
            raise APIError(400, "suffix is not supported by this server", "suffix")
        tok = state.model.tokenizer
        state.check_unsupported(req)
        prompts = await state.run(lambda: [state.prompt_ids(p) for p in req.prompts() or [[]]])
        queue, jobs = await start(request, lambda emit: state.jobs(req, prompts, req.max_tokens, req.logprobs,
                                                                   req.stops(), emit))
        cid, created = f"cmpl-{uuid.uuid4().hex}", int(time.time())
        echo = await state.run(lambda: [tok.detokenize(p) if req.echo else "" for p in prompts])
        offsets = [len(e) for e in echo for _ in range(req.n)]

        def head():
            return {"id": cid, "object": "text_completion", "created": created, "model": state.model_id}

        def chunk_of(job, text, new, finish):
            if job is None:
                return head()
            if text is None:  # the opening chunk: the echoed prompt
                prompt_text = echo[job.index // req.n]
                if not prompt_text:
                    return None
                text = prompt_text
            lp = None
            if req.logprobs is not None and new:
                lp = completion_logprobs(tok, new, offsets[job.index])
                offsets[job.index] += sum(len(t) for t in lp["tokens"])
            return head() | {"choices": [{"index": job.index, "text": text, "logprobs": lp, "finish_reason": finish}]}

        def final_of(texts, picked, finishes, usage):
            choices = []
            for i, (text, chosen, finish) in enumerate(zip(texts, picked, finishes)):
                prefix = echo[i // req.n]
                lp = completion_logprobs(tok, chosen, len(prefix)) if req.logprobs is not None else None
                choices.append({"index": i, "text": prefix + text, "logprobs": lp, "finish_reason": finish})
            return head() | {"choices": choices, "usage": usage}

        return await run_generation(request, jobs, queue, req.stream, chunk_of, final_of,
                                    bool(req.stream_options and req.stream_options.include_usage))

    async def chat_completions(request: Request):
        req = await parse_body(request, ChatRequest, state, timeout)
        result = await chat_run(request, req)
        return sse_response(result, done="data: [DONE]\n\n") if req.stream else result

    async def chat_run(request: Request, req: ChatRequest):
        """A chat request's answer: OpenAI's chat.completion, or (req.stream) its chunks as an
        async iterator (run_generation's raw stream) for the endpoint to send in its protocol."""
        state.check_model(req.model)
        tok = state.model.tokenizer
        state.check_unsupported(req)
        max_tokens = req.max_completion_tokens if req.max_completion_tokens is not None else req.max_tokens
        logprobs = (req.top_logprobs or 0) if req.logprobs else None
        if req.top_logprobs and not req.logprobs:
            raise APIError(400, "top_logprobs needs logprobs: true", "top_logprobs")
        ids, extra_stops = await state.run(state.chat_prompt, req)
        queue, jobs = await start(request, lambda emit: state.jobs(req, [ids], max_tokens, logprobs,
                                                                   req.stops() + extra_stops, emit))
        cid, created = f"chatcmpl-{uuid.uuid4().hex}", int(time.time())
        # tool calls and reasoning: parsed from the reply by its template's family (tool_calls.py)
        fmt = state.reply_format()
        with_tools = bool(req.tools) and req.tool_choice != "none"
        split = state.reasoning_format != "none"
        tail = ids[-1] if is_parts(ids) else ids  # (a prompt with media ends with text)
        opened = split and state.model.detokenize(list(tail[-4:])).rstrip().endswith("<think>")
        streams = {j.index: ReplyStream(fmt, with_tools, split, opened) for j in jobs}

        def head():
            return {"id": cid, "object": "chat.completion.chunk", "created": created, "model": state.model_id}

        def chunk_of(job, text, new, finish):
            if job is None:
                return head()
            if text is None:
                delta = {"role": "assistant", "content": ""}
            else:
                stream = streams[job.index]
                deltas = stream.push(text)
                if finish is not None:
                    last, called = stream.finish()
                    deltas += last
                    finish = "tool_calls" if called else finish
                delta = merge_deltas(deltas)
            lp = chat_logprobs(tok, new, req.post_sampling_probs) if logprobs is not None and new else None
            return head() | {"choices": [{"index": job.index, "delta": delta, "logprobs": lp, "finish_reason": finish}]}

        def final_of(texts, picked, finishes, usage):
            choices = []
            for i, (text, chosen, finish) in enumerate(zip(texts, picked, finishes)):
                message = {"role": "assistant", "content": text}
                if with_tools or split:
                    reply = fmt.parse(text, opened) if (with_tools or fmt.think or opened or "<think>" in text
                                                         or fmt.name == "harmony") else None
                    if reply is not None:
                        message["content"] = reply.content if (reply.content or not reply.tool_calls) else None
                        if reply.reasoning is not None and split:
                            message["reasoning_content"] = reply.reasoning
                        if with_tools and reply.tool_calls:
                            message["tool_calls"], finish = reply.tool_calls, "tool_calls"
                choices.append({"index": i, "message": message,
                                "logprobs": chat_logprobs(tok, chosen, req.post_sampling_probs)
                                if logprobs is not None else None,
                                "finish_reason": finish})
            return head() | {"object": "chat.completion", "choices": choices, "usage": usage}

        return await run_generation(request, jobs, queue, req.stream, chunk_of, final_of,
                                    bool(req.stream_options and req.stream_options.include_usage), raw=True)

    async def pooled(request: Request, inputs: list[list[int]], pooling: str) -> list | None:
        """The pooled hidden states of each input (token ids), in order; None when the client hung up."""
        queue, jobs = await start(request, lambda emit: [Job(ids, emit, None, pooling, index=i)
                                                         for i, ids in enumerate(inputs)])
        vectors: list = [None] * len(jobs)
        checked = [time.monotonic()]
        for _ in jobs:
            event = await next_event(queue, request, jobs, checked)
            if event is None:
                return None
            kind, job, payload, status = event
            if kind == "error":
                raise failure(payload, status)
            vectors[job.index] = payload
        return vectors

    async def embeddings(request: Request):
        req = await parse_body(request, EmbeddingRequest, state, timeout)
        state.check_model(req.model)
        n_embd = state.model.hp.n_embd
        if state.pooling in ("none", "rank"):  # as llama.cpp: per-token states or scores are no OpenAI embedding
            raise APIError(400, f"pooling {state.pooling!r} is not OpenAI compatible: serve the model with another "
                                f"pooling (rank: its scores are the reranking endpoint's)", "input")
        if req.dimensions is not None and req.dimensions != n_embd:
            raise APIError(400, f"dimensions={req.dimensions}: this model's embeddings have {n_embd}", "dimensions")
        inputs = await state.run(lambda: [state.prompt_ids(p, "input") for p in req.inputs() or [[]]])
        vectors = await pooled(request, inputs, state.pooling)
        if vectors is None:
            return None
        data = []
        for i, v in enumerate(vectors):
            v = torch.nn.functional.normalize(v.float(), dim=-1)  # llama.cpp: L2
            if req.encoding_format == "base64":
                value = base64.b64encode(v.numpy().astype("<f4").tobytes()).decode()
            else:
                value = v.tolist()
            data.append({"object": "embedding", "index": i, "embedding": value})
        n = sum(len(x) for x in inputs)
        return {"object": "list", "data": data, "model": state.model_id,
                "usage": {"prompt_tokens": n, "total_tokens": n}}

    serving = Serving(parse_body=lambda request, cls: parse_body(request, cls, state, timeout), start=start,
                      run_generation=run_generation, chat=chat_run, pooled=pooled)
    for module in ENDPOINTS:
        module.register(app, state, serving)
    for prefix in ("/v1", ""):
        app.add_api_route(f"{prefix}/models", models, methods=["GET"])
        app.add_api_route(f"{prefix}/completions", completions, methods=["POST"])
        app.add_api_route(f"{prefix}/chat/completions", chat_completions, methods=["POST"])
        app.add_api_route(f"{prefix}/embeddings", embeddings, methods=["POST"])
    return app
