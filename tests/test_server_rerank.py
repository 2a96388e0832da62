"""/v1/rerank (and /rerank, TEI's shape) on the tiny bert reranker of tests/test_encoders.py: the
pairs laid out as llama.cpp's format_prompt_rerank, scores equal to Model.embed's rank scores
(which tests/test_encoders.py compares with llama.cpp's), sorted, cut to top_n; a model that does
not rank is answered 501 saying why."""
from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from conftest import serving
from test_encoders import with_wordpiece_vocab
from torchggml.gguf.writer.tiny import write_tiny_model
from torchggml.models import load_model
from torchggml.server.rerank import pair_tokens

QUERY = "the graph runs"
DOCS = ["the scheduler cuts the graph", "a device split", "the graph runs on the device"]


@pytest.fixture(scope="module")
def reranker(tmp_path_factory):
    path = with_wordpiece_vocab(write_tiny_model(tmp_path_factory.mktemp("rr") / "bert-rerank.gguf", "bert-rerank"))
    served, reference = (load_model(path, n_ctx=64, n_batch=64) for _ in range(2))
    with serving(served, parallel=2) as client:
        yield client, reference
    served.close()
    reference.close()


def test_pair_layout_is_llama_cpps(reranker):
    """bert (WPM): [CLS] query [SEP] document, add_eos false (llama.cpp's vocabulary flags)."""
    _, m = reranker
    tok = m.tokenizer
    ids = pair_tokens(m, QUERY, DOCS[0])
    assert ids == [tok.bos_id] + m.tokenize(QUERY, add_special=False) + [tok.sep_id] + m.tokenize(DOCS[0], add_special=False)


CASES = [  # (path, extra body fields, the number of results, with documents)
    ("/v1/rerank", {}, 3, False),
    ("/rerank", {"top_n": 2}, 2, False),
    ("/v1/reranking", {"top_n": 0}, 0, False),
    ("/v1/rerank", {"return_documents": True, "top_n": 10}, 3, True),
]


@pytest.mark.parametrize("path,extra,n,with_docs", CASES)
def test_rerank_scores_are_model_embeds_sorted(reranker, path, extra, n, with_docs):
    client, m = reranker
    r = client.post(path, json={"model": "tiny", "query": QUERY, "documents": DOCS, **extra})
    assert r.status_code == 200, r.text
    body = r.json()
    expect = [float(m.embed(pair_tokens(m, QUERY, d), pooling="rank")[0]) for d in DOCS]
    order = sorted(range(len(DOCS)), key=lambda i: -expect[i])[:n]
    assert [x["index"] for x in body["results"]] == order
    for x in body["results"]:
        assert x["relevance_score"] == pytest.approx(expect[x["index"]], rel=1e-5, abs=1e-6)
        assert ("document" in x) == with_docs and (not with_docs or x["document"] == {"text": DOCS[x["index"]]})
    n_tokens = sum(len(pair_tokens(m, QUERY, d)) for d in DOCS)
    assert body["usage"] == {"prompt_tokens": n_tokens, "total_tokens": n_tokens} and body["object"] == "list"


def test_rerank_scores_equal_llama_cpps(reranker, llama_cpp, tmp_path):
    """Each pair's score against llama.cpp's rank pooling of the same tokens
    (scripts/gen_encoder_embeddings.py's child: llama_get_embeddings_seq, pooling_type rank)."""
    spec = importlib.util.spec_from_file_location("gen", Path(__file__).parents[1] / "scripts" / "gen_encoder_embeddings.py")
    gen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen)
    client, m = reranker
    scores = {x["index"]: x["relevance_score"]
              for x in client.post("/v1/rerank", json={"query": QUERY, "documents": DOCS}).json()["results"]}
    for i, doc in enumerate(DOCS):
        out = tmp_path / f"{i}.npz"
        ids = ",".join(map(str, pair_tokens(m, QUERY, doc)))
        run = subprocess.run([sys.executable, "-c", gen.CHILD, str(m.path), str(out), ids, "rank=4"],
                             capture_output=True, text=True, timeout=120)
        assert run.returncode == 0, run.stderr[-2000:]
        ref = float(np.load(out)["rank"][0])
        assert abs(scores[i] - ref) <= 2e-3 * max(abs(ref), 1.0), (doc, scores[i], ref)


def test_tei_shape(reranker):
    client, m = reranker
    r = client.post("/rerank", json={"query": QUERY, "texts": DOCS[:2], "return_text": True})
    assert r.status_code == 200, r.text
    scores = [float(m.embed(pair_tokens(m, QUERY, d), pooling="rank")[0]) for d in DOCS[:2]]
    assert sorted(r.json(), key=lambda x: x["index"]) == [
        {"index": i, "score": pytest.approx(s, rel=1e-5, abs=1e-6), "text": DOCS[i]} for i, s in enumerate(scores)]


BAD = [  # (body, status, param)
    ({"documents": DOCS}, 400, "query"),
    ({"query": QUERY, "documents": []}, 400, "documents"),
    ({"query": QUERY}, 400, "documents"),
    ({"query": QUERY, "documents": [1, 2]}, 400, "documents"),
    ({"query": QUERY, "documents": DOCS, "top_n": -1}, 400, "top_n"),
    ({"query": QUERY, "documents": ["graph " * 80]}, 400, "documents[0]"),
    ({"query": QUERY, "documents": ["graph " * 100_000]}, 400, "documents[0]"),    # refused before tokenizing
    ({"query": "q " * 100_000, "documents": DOCS}, 400, "query"),
    ({"query": QUERY, "documents": ["a"] * 100}, 400, "documents"),                # more than slots + queue
]


@pytest.mark.parametrize("body,status,param", BAD)
def test_rerank_bad_input(reranker, body, status, param):
    r = reranker[0].post("/v1/rerank", json=body)
    assert r.status_code == status and r.json()["error"]["param"] == param, r.text


def test_a_model_without_a_classifier_head_is_501(demo_path):
    m = load_model(demo_path, progress=False)
    try:
        with serving(m) as client:
            r = client.post("/v1/rerank", json={"query": "a", "documents": ["b"]})
    finally:
        m.close()
    assert r.status_code == 501 and "classifier head" in r.json()["error"]["message"], r.text
