"""POST /completion: llama-server's own completion endpoint (not OpenAI's: /v1/completions is that).

    {"prompt": str | [ids and strs] | [prompts], "n_predict": -1, "n_probs": 0, "stream": false,
     "return_tokens": false, "id_slot": -1, "logit_bias": ..., sampling fields as /v1/completions}
    -> {"index", "content", "tokens", "id_slot", "stop": true, "model", "tokens_predicted",
        "tokens_evaluated", "tokens_cached", "generation_settings", "prompt", "has_new_line",
        "truncated", "stop_type": "eos" | "limit" | "word", "stopping_word", "timings",
        "completion_probabilities": [{"id", "token", "bytes", "logprob", "top_logprobs": [...]}]}

Several prompts (a list of strings, or of token lists) answer a list of such objects. A stream
sends {"index", "content", "tokens", "stop": false, "id_slot", "tokens_predicted", "tokens_evaluated"
(, "completion_probabilities")} per step, then the whole object above with the rest of the text,
and no [DONE] (as llama-server). A prompt's text is tokenized with its special tokens parsed; a
list mixing ids and texts is one prompt (BOS added when it starts with a text).

n_probs: the most likely tokens' log-probabilities of the model's raw logits at each step, as
llama-server's default; with post_sampling_probs, the probabilities of the draw instead ("prob",
"top_probs": the n_probs most probable candidates the sampling chain kept, normalized; greedy: the
chosen token's 1). /infill answers in this same shape (infill.py).
"""
from __future__ import annotations

import math
import time
from typing import Any

from fastapi import Request
from pydantic import Field, StrictBool, StrictInt, StrictStr

from ..models.sampling_params import MAX_TOP_LOGPROBS
from .protocol import APIError, ResponseFormat, Sampling, logit_bias_pairs
from .sse import sse_response

ROUTES = {"/completion"}

Prompt = StrictStr | list[StrictInt | StrictStr]


class NativeRequest(Sampling):
    """The fields /completion and /infill share."""
    n_predict: StrictInt = Field(-1, ge=-1)
    max_tokens: StrictInt | None = Field(None, ge=-1)   # llama-server's other name for n_predict
    n_probs: StrictInt = Field(0, ge=0, le=MAX_TOP_LOGPROBS)
    post_sampling_probs: StrictBool = False
    return_tokens: StrictBool = False
    json_schema: dict[str, Any] | None = None

    def predict(self) -> int | None:
        n = self.n_predict if self.max_tokens is None else self.max_tokens
        return None if n < 0 else n


class CompletionRequest(NativeRequest):
    prompt: Prompt | list[Prompt] = ""

    def prompts(self) -> list:
        """Each prompt: a text, or a list of ids and texts."""
        p = self.prompt
        if isinstance(p, list) and p and (all(isinstance(x, str) for x in p) or any(isinstance(x, list) for x in p)):
            return p
        return [p]


def mixed_ids(state, prompt, param: str = "prompt") -> list[int]:
    """A prompt's token ids (llama-server's tokenize_mixed): texts with special tokens parsed, BOS
    where the model adds it and the prompt starts with a text."""
    if isinstance(prompt, str):
        return state.prompt_ids(prompt, param, add_special=True, parse_special=True)
    ids: list[int] = []
    for i, part in enumerate(prompt):
        if isinstance(part, str):
            ids += state.model.tokenize(part, add_special=i == 0, parse_special=True)
        else:
            ids.append(part)
    return state.prompt_ids(ids, param)


def token_probs(tok, choices, post_sampling: bool = False) -> list[dict]:
    """completion_probabilities: each generated token with its n_probs alternatives (post_sampling:
    the draw's probabilities)."""
    def entry(token: int, value: float) -> dict:
        piece = tok.token_to_piece_bytes(token)
        return {"id": token, "token": piece.decode("utf-8", errors="ignore"), "bytes": list(piece),
                "prob" if post_sampling else "logprob": value}
    if post_sampling:
        return [entry(c.token, c.prob) | {"top_probs": [entry(t, p) for t, p in c.top_probs]} for c in choices]
    return [entry(c.token, c.logprob) | {"top_logprobs": [entry(t, lp) for t, lp in c.top]} for c in choices]


def stop_type(gen) -> str:
    if gen.finish_reason == "length":
        return "limit"
    return "word" if gen.stops.word is not None else "eos"


async def complete(request: Request, state, serving, req: NativeRequest, prompts: list[list[int]]):
    """Run `prompts` (token ids) as llama-server's /completion does and answer in its shape."""
    state.check_model(req.model)
    state.check_unsupported(req)
    if req.json_schema is not None:
        if req.response_format is not None or req.grammar is not None:
            raise APIError(400, "give one of json_schema, grammar and response_format", "json_schema")
        req = req.model_copy(update={"response_format": ResponseFormat.model_validate(
            {"type": "json_object", "schema": req.json_schema})})
    logprobs = req.n_probs or None
    queue, jobs = await serving.start(request, lambda emit: state.jobs(req, prompts, req.predict(), logprobs,
                                                                       req.stops(), emit))
    tok = state.model.tokenizer
    texts = await state.run(lambda: [state.model.detokenize(p) for p in prompts])
    sent = [[] for _ in jobs]  # streamed tokens so far, per job
    settings = {"n_predict": req.n_predict if req.max_tokens is None else req.max_tokens, "seed": req.seed,
                "temperature": req.temperature, "top_k": req.top_k, "top_p": req.top_p, "min_p": req.min_p,
                "repeat_penalty": req.repeat_penalty, "repeat_last_n": req.repeat_last_n,
                "presence_penalty": req.presence_penalty, "frequency_penalty": req.frequency_penalty,
                "n_probs": req.n_probs, "post_sampling_probs": req.post_sampling_probs, "stop": req.stops(), "ignore_eos": req.ignore_eos,
                "logit_bias": [[t, b if b > -math.inf else False]  # false: banned, as the request says it
                               for t, b in logit_bias_pairs(req.logit_bias, state.model)],
                "n_ctx": state.engine.slot_ctx, "model": state.model_id}

    def whole(job, content: str, chosen) -> dict:
        gen, now = job.gen, time.perf_counter()
        first = job.first_token or now
        evaluated = len(job.prompt) - job.n_cached
        out = {"index": job.index, "content": content,
               "tokens": [c.token for c in chosen] if req.return_tokens else [], "id_slot": job.seq_id,
               "stop": True, "model": state.model_id, "tokens_predicted": gen.n_generated,
               "tokens_evaluated": len(job.prompt), "generation_settings": settings,
               "prompt": texts[job.index // req.n], "has_new_line": "\n" in content, "truncated": False,
               "stop_type": stop_type(gen), "stopping_word": gen.stops.word or "", "tokens_cached": job.n_cached,
               "timings": {"prompt_n": evaluated, "prompt_ms": (first - job.submitted) * 1e3,
                           "predicted_n": gen.n_generated, "predicted_ms": (now - first) * 1e3}}
        return out

    def chunk_of(job, text, new, finish):
        if job is None or text is None:
            return None
        if finish is not None:  # the last chunk: the whole answer, with the rest of the text
            return whole(job, text, sent[job.index])
        sent[job.index] += new
        out = {"index": job.index, "content": text, "tokens": [c.token for c in new], "stop": False,
               "id_slot": job.seq_id, "tokens_predicted": job.gen.n_generated, "tokens_evaluated": len(job.prompt)}
        if logprobs:
            out["completion_probabilities"] = token_probs(tok, new, req.post_sampling_probs)
        return out

    def final_of(contents, picked, finishes, usage):
        answers = []
        for job in jobs:
            out = whole(job, contents[job.index], picked[job.index])
            if logprobs:
                out["completion_probabilities"] = token_probs(tok, picked[job.index], req.post_sampling_probs)
            answers.append(out)
        return answers[0] if len(answers) == 1 else answers

    result = await serving.run_generation(request, jobs, queue, req.stream, chunk_of, final_of, False, raw=True)
    return sse_response(result) if req.stream else result


def register(app, state, serving) -> None:
    async def completion(request: Request):
        req = await serving.parse_body(request, CompletionRequest)
        prompts = await state.run(lambda: [mixed_ids(state, p) for p in req.prompts()])
        return await complete(request, state, serving, req, prompts)

    app.add_api_route("/completion", completion, methods=["POST"])
