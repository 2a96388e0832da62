"""POST /infill: llama-server's code infilling (fill in the middle), answered as /completion.

    {"input_prefix": str, "input_suffix": str, "input_extra": [{"filename": str, "text": str}],
     "prompt": str, "n_predict": ..., "stream": ..., sampling fields as /completion}

The sequence is llama.cpp's format_infill (the FIM repo-level pattern), from the FIM tokens of
the tokenizer (Tokenizer.fim_ids: its fim_pre/suf/mid/rep/sep metadata, else their usual texts):

    [extra] [BOS] FIM_PRE prefix prompt FIM_SUF suffix FIM_MID
    extra = FIM_REP "myproject\\n" (FIM_SEP filename "\\n" text)... FIM_SEP "filename\\n"

(without FIM_REP / FIM_SEP, each extra chunk follows a "--- snippet ---" line). As llama.cpp, the
prefix keeps its last 3/4 n_batch tokens, the suffix its first n_batch/4 - 2 - len(prompt), and the
extra chunks their last n_ctx - n_batch - 2 n_predict tokens (n_ctx of one slot; n_predict 0 where
the request sets none). A model without the prefix, suffix and middle tokens is answered 501
naming the missing ones.
"""
from __future__ import annotations

from fastapi import Request
from pydantic import BaseModel, ConfigDict, Field, StrictStr

from .completion import NativeRequest, complete
from .limits import check_text
from .protocol import APIError

ROUTES = {"/infill"}
SNIPPET = "\n\n--- snippet ---\n\n"   # the chunk separator where the vocabulary has no FIM_SEP


class ExtraChunk(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore")
    text: StrictStr
    filename: StrictStr = "tmp"


class InfillRequest(NativeRequest):
    input_prefix: StrictStr
    input_suffix: StrictStr
    input_extra: list[ExtraChunk] = Field(default_factory=list)
    prompt: StrictStr = ""


def check_fim(tokenizer) -> dict:
    fim = tokenizer.fim_ids
    missing = [name for name, what in (("pre", "prefix"), ("suf", "suffix"), ("mid", "middle"))
               if fim.get(name) is None]
    if missing:
        names = ", ".join({"pre": "prefix", "suf": "suffix", "mid": "middle"}[m] for m in missing)
        raise APIError(501, f"infill is not supported by this model: its vocabulary has no FIM {names} token "
                            f"(tokenizer.ggml.fim_{missing[0]}_token_id)", None, "not_supported", "not_supported_error")
    return fim


def check_texts(state, req: InfillRequest) -> None:
    """Each text is bounded before it is tokenized: none may be longer than a slot's context can hold."""
    texts = [("input_prefix", req.input_prefix), ("input_suffix", req.input_suffix), ("prompt", req.prompt)]
    texts += [(f"input_extra[{i}]", c.filename + c.text) for i, c in enumerate(req.input_extra)]
    for param, text in texts:
        check_text(text, state.max_text_chars, param, state.engine.slot_ctx)


def infill_tokens(model, req: InfillRequest, n_ctx: int) -> list[int]:
    """The request's sequence, as llama.cpp's format_infill lays it out."""
    tok, fim = model.tokenizer, check_fim(model.tokenizer)

    def text(s: str) -> list[int]:
        return model.tokenize(s, add_special=False)
    prompt = model.tokenize(req.prompt, add_special=False, parse_special=True)
    extra: list[int] = []
    if fim.get("rep") is not None:
        extra += [fim["rep"]] + text("myproject\n")
    for chunk in req.input_extra:
        extra += [fim["sep"]] + text(chunk.filename + "\n") if fim.get("sep") is not None else text(SNIPPET)
        extra += text(chunk.text)
    if fim.get("sep") is not None:
        extra += [fim["sep"]] + text("filename\n")
    n_batch, n_predict = model.n_batch, max(req.predict() or 0, 0)
    prefix, suffix = text(req.input_prefix), text(req.input_suffix)
    prefix = prefix[len(prefix) - min(len(prefix), 3 * (n_batch // 4)):]
    suffix = suffix[:min(len(suffix), max(0, n_batch // 4 - (2 + len(prompt))))]
    n_extra = min(max(0, n_ctx - n_batch - 2 * n_predict), len(extra))
    ids = extra[len(extra) - n_extra:]
    if tok.add_bos:
        ids.append(tok.bos_id)
    return ids + [fim["pre"]] + prefix + prompt + [fim["suf"]] + suffix + [fim["mid"]]


def register(app, state, serving) -> None:
    @app.post("/infill")
    async def infill(request: Request):
        check_fim(state.model.tokenizer)  # before the body: as llama-server, the model's answer comes first
        req = await serving.parse_body(request, InfillRequest)
        check_texts(state, req)
        ids = await state.run(lambda: state.prompt_ids(infill_tokens(state.model, req, state.engine.slot_ctx)))
        return await complete(request, state, serving, req, [ids])
