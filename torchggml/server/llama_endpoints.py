"""llama-server's own endpoints beside the OpenAI API: /tokenize, /detokenize, /apply-template,
/props and /slots, with llama-server's request fields and answers.

    POST /tokenize        {"content": str, "add_special": false, "parse_special": true, "with_pieces": false}
                          -> {"tokens": [ids]} or [{"id": id, "piece": str or [bytes]}]
    POST /detokenize      {"tokens": [ids]} -> {"content": str}
    POST /apply-template  {"messages": [...], "tools": [...]} -> {"prompt": str} (the chat prompt's text)
    GET  /props           the model, its chat template, n_ctx, the slots and the default sampling
    GET  /slots           each slot: its id, context, whether it is busy, the prompt tokens it holds
    POST /slots/{id}?action=save|restore  {"filename": str}  (--slot-save-path DIR: files in DIR)
                          -> {"id_slot", "filename", "n_saved", "n_written", "timings": {"save_ms"}}
                          or {"id_slot", "filename", "n_restored", "n_read", "timings": {"restore_ms"}}
    POST /slots/{id}?action=erase   -> {"id_slot", "n_erased"}
"""
from __future__ import annotations

import asyncio
import os

from fastapi import Request
from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, StrictStr

from ..models.sampling import DEFAULTS
from .engine import SlotError
from .protocol import APIError, ChatRequest

ROUTES = {"/tokenize", "/detokenize", "/apply-template", "/props", "/slots"}  # (+ /slots/{id}: "other")


class TokenizeRequest(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore")
    content: StrictStr = ""
    add_special: StrictBool = False
    parse_special: StrictBool = True
    with_pieces: StrictBool = False


class SlotFileRequest(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore")
    filename: StrictStr


def slot_file_path(folder: str, filename: str) -> str:
    """The path of `filename` in the slot folder; a name that is not a plain file name (a path, "..",
    control characters, over 255 bytes) is refused, as llama-server's fs_validate_filename does."""
    bad = (not filename or len(filename.encode()) > 255 or filename in (".", "..") or filename != filename.strip()
           or any(c in filename for c in "/\\:") or any(ord(c) < 32 or ord(c) == 127 for c in filename))
    path = os.path.join(folder, filename)
    if bad or os.path.dirname(os.path.abspath(path)) != os.path.abspath(folder):
        raise APIError(400, f"Invalid filename {filename[:80]!r}: a plain file name in the slot folder is expected",
                       "filename")
    return path


class DetokenizeRequest(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore")
    tokens: list[StrictInt] = Field(default_factory=list)


def _piece(tok, token: int):
    """A token's text, or its bytes where they are not valid UTF-8 alone (as llama-server)."""
    data = tok.token_to_piece_bytes(token)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return list(data)


def register(app, state, parse_body, timeout: float) -> None:
    @app.post("/tokenize")
    async def tokenize(request: Request):
        req = await parse_body(request, TokenizeRequest, state, timeout)
        ids = await state.run(lambda: state.model.tokenize(req.content, add_special=req.add_special,
                                                           parse_special=req.parse_special))
        if not req.with_pieces:
            return {"tokens": ids}
        tok = state.model.tokenizer
        return {"tokens": [{"id": i, "piece": _piece(tok, i)} for i in ids]}

    @app.post("/detokenize")
    async def detokenize(request: Request):
        req = await parse_body(request, DetokenizeRequest, state, timeout)
        bad = [t for t in req.tokens if not 0 <= t < state.model.n_vocab]
        if bad:
            raise APIError(400, f"token id {bad[0]} is outside the vocabulary [0, {state.model.n_vocab})", "tokens")
        return {"content": await state.run(state.model.detokenize, req.tokens)}

    @app.post("/apply-template")
    async def apply_template(request: Request):
        req = await parse_body(request, ChatRequest, state, timeout)
        prompt = (await state.run(state.chat_text, req))[0]  # (text, stops, media)
        return {"prompt": prompt}

    @app.get("/props")
    async def props():
        engine, model = state.engine, state.model
        return {"model_alias": state.model_id, "model_path": model.path, "n_ctx": model.n_ctx,
                "total_slots": engine.parallel, "chat_template": model.tokenizer.chat_template or "",
                "bos_token": _text(model, model.tokenizer.bos_id), "eos_token": _text(model, model.tokenizer.eos_id),
                "default_generation_settings": {"n_ctx": engine.slot_ctx, "params": {
                    "temperature": DEFAULTS.temperature, "top_k": DEFAULTS.top_k, "top_p": DEFAULTS.top_p,
                    "min_p": 0.05, "repeat_penalty": DEFAULTS.repeat_penalty, "repeat_last_n": DEFAULTS.repeat_last_n,
                    "frequency_penalty": DEFAULTS.frequency_penalty,
                    "presence_penalty": DEFAULTS.presence_penalty}}}

    @app.get("/slots")
    async def slots():
        engine = state.engine
        busy = {job.seq_id: job for job in list(engine.active)}
        return [{"id": slot, "n_ctx": engine.slot_ctx, "is_processing": slot in busy,
                 "n_prompt_tokens_cached": len(engine.slot_tokens.get(slot, ())),
                 "n_decoded": busy[slot].gen.n_generated if slot in busy and busy[slot].gen else 0}
                for slot in range(engine.parallel)]

    @app.post("/slots/{id_slot}")
    async def slot_action(id_slot: int, request: Request, action: str = ""):
        if state.slot_save_path is None:
            raise APIError(501, "This server does not support slots action. Start it with `--slot-save-path`",
                           None, None, "not_supported_error")
        path = None
        if action in ("save", "restore"):
            req = await parse_body(request, SlotFileRequest, state, timeout)
            path = slot_file_path(state.slot_save_path, req.filename)
        try:
            future = state.engine.slot_action(id_slot, action, path)
            return await asyncio.wrap_future(future)
        except SlotError as e:
            raise APIError(e.status, str(e), None, None, "not_supported_error" if e.status == 501 else None) from None


def _text(model, token_id) -> str:
    return model.tokenizer.token_text(token_id) if token_id is not None else ""
