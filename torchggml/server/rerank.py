"""POST /v1/rerank (also /rerank, /v1/reranking, /reranking): llama-server's reranking endpoint.

    {"query": str, "documents": [str, ...], "top_n": int, "return_documents": false}
    -> {"model", "object": "list", "usage": {"prompt_tokens", "total_tokens"},
        "results": [{"index": i, "relevance_score": float, "document": {"text": str}}, ...]}

The results are sorted by score, highest first, and cut to top_n (Jina's API, as llama-server;
`document` only with return_documents). A body with `texts` in place of `documents` is TEI's API:
the answer is the list of {"index", "score"} (with "text" when return_text).

Each (query, document) pair is one sequence, laid out as llama.cpp's format_prompt_rerank: the
file's tokenizer.chat_template.rerank with {query} and {document} replaced, else
[BOS] query [EOS] [SEP] document [EOS] (each special token where the vocabulary adds it; SEP in
place of a missing EOS). Its score is the first output of the model's classifier head
(Model.embed with pooling "rank"), unnormalized, as llama-server's. A model that does not pool
by rank (no classifier head, or served with another pooling) is answered 501.
"""
from __future__ import annotations

from fastapi import Request
from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, StrictStr

from .limits import check_text
from .protocol import APIError

ROUTES = {f"{prefix}/{name}" for prefix in ("/v1", "") for name in ("rerank", "reranking")}


class RerankRequest(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore")
    model: StrictStr | None = None
    query: StrictStr
    documents: list[StrictStr] | None = None
    texts: list[StrictStr] | None = None   # TEI's name for the documents (and TEI's answer)
    top_n: StrictInt | None = Field(None, ge=0)
    return_documents: StrictBool = False
    return_text: StrictBool = False        # TEI's return_documents

    def docs(self) -> list[str]:
        docs = self.documents if self.documents is not None else self.texts
        if not docs:
            raise APIError(400, "documents must be a non-empty list of strings", "documents")
        return docs


def pair_tokens(model, query: str, document: str) -> list[int]:
    """The sequence one (query, document) pair is scored as (llama.cpp's format_prompt_rerank)."""
    template = model.file.get("tokenizer.chat_template.rerank", None)
    if template is not None:
        text = template.replace("{query}", query).replace("{document}", document)
        return model.tokenize(text, add_special=False, parse_special=True)
    tok = model.tokenizer
    eos = tok.eos_id if tok.eos_id is not None else tok.sep_id
    ids = [tok.bos_id] if tok.add_bos else []
    ids += model.tokenize(query, add_special=False)
    if tok.add_eos:
        ids.append(eos)
    if tok.add_sep:
        ids.append(tok.sep_id)
    ids += model.tokenize(document, add_special=False)
    if tok.add_eos:
        ids.append(eos)
    return ids


def check_reranker(state) -> None:
    model = state.model
    if state.pooling != "rank" or not hasattr(model.arch, "rank"):
        why = (f"{model.hp.arch} has no classifier head" if not hasattr(model.arch, "rank")
               else f"it is served with pooling {state.pooling!r}")
        raise APIError(501, f"this server does not support reranking: the model {state.model_id!r} does not "
                            f"pool by rank ({why}); serve a reranker (a file with pooling_type rank)",
                       None, "not_supported", "not_supported_error")


def register(app, state, serving) -> None:
    async def rerank(request: Request):
        req = await serving.parse_body(request, RerankRequest)
        state.check_model(req.model)
        check_reranker(state)
        docs = req.docs()
        model = state.model

        if len(docs) > state.room:  # before any tokenizing: these could never run at once
            raise APIError(400, f"the request has {len(docs)} documents; this server holds {state.room} sequences "
                                "(--parallel + --queue-size)", "documents")

        def prompts():
            check_text(req.query, state.max_text_chars, "query", state.engine.slot_ctx)
            out = []
            for i, doc in enumerate(docs):
                check_text(doc, state.max_text_chars, f"documents[{i}]", state.engine.slot_ctx)
                ids = state.prompt_ids(pair_tokens(model, req.query, doc), f"documents[{i}]")
                if not model.hp.causal_attn and len(ids) > model.n_batch:
                    raise APIError(400, f"documents[{i}] with the query is {len(ids)} tokens; this encoder takes "
                                        f"at most n_batch={model.n_batch} at once (-b)", "documents")
                out.append(ids)
            return out
        inputs = await state.run(prompts)
        scores = await serving.pooled(request, inputs, "rank")
        if scores is None:
            return None
        tei = req.documents is None
        label = "score" if tei else "relevance_score"
        results = []
        for i, score in enumerate(scores):
            result = {"index": i, label: float(score.reshape(-1)[0])}
            if req.return_text if tei else req.return_documents:
                result["text" if tei else "document"] = docs[i] if tei else {"text": docs[i]}
            results.append(result)
        results.sort(key=lambda r: -r[label])  # stable: equal scores keep the documents' order
        results = results[:len(results) if req.top_n is None else req.top_n]
        if tei:
            return results
        n = sum(len(ids) for ids in inputs)
        return {"model": req.model or state.model_id, "object": "list",
                "usage": {"prompt_tokens": n, "total_tokens": n}, "results": results}

    for path in sorted(ROUTES):
        app.add_api_route(path, rerank, methods=["POST"])
