"""llama-server's /completion (n_probs, stop types, streaming without [DONE], several prompts) and
logit_bias on every completion endpoint, on the demo model served in this process; a second copy
of the model is the reference (Model.generate with the same SamplingParams, its logits)."""
from __future__ import annotations

import json
import math

import pytest
import torch

from conftest import serving
from torchggml.models import load_model

PROMPT = "Once upon a time"


@pytest.fixture(scope="module")
def served(demo_path):
    model, reference = (load_model(demo_path, progress=False) for _ in range(2))
    with serving(model, parallel=2) as client:
        yield client, reference
    model.close()
    reference.close()


def logits(ref, ids) -> torch.Tensor:
    """The reference's logits after `ids`, from an empty cache."""
    ref.reset()
    return ref.eval(ids, logits="last")[-1]


def generate(ref, prompt=PROMPT, n=8, **sampling) -> str:
    return "".join(ref.generate(prompt, max_tokens=n, temperature=0, **sampling))


def post(client, path, body):
    r = client.post(path, json=body)
    assert r.status_code == 200, r.text
    return r.json()


def test_completion_is_generate_and_says_why_it_stopped(served):
    client, ref = served
    full = generate(ref)
    r = post(client, "/completion", {"prompt": PROMPT, "n_predict": 8, "temperature": 0, "return_tokens": True})
    assert r["content"] == full and r["stop"] is True and r["stop_type"] == "limit" and r["tokens_predicted"] == 8
    assert len(r["tokens"]) == 8 and ref.detokenize(r["tokens"]) == full
    assert r["tokens_evaluated"] == len(ref.tokenize(PROMPT, parse_special=True)) and r["id_slot"] in (0, 1)
    word = full[3:5]
    cut = post(client, "/completion", {"prompt": PROMPT, "n_predict": 8, "temperature": 0, "stop": [word]})
    assert cut["content"] == full[:full.index(word)] and cut["stop_type"] == "word" and cut["stopping_word"] == word


def test_n_probs_are_the_models_log_probabilities(served):
    client, ref = served
    r = post(client, "/completion", {"prompt": PROMPT, "n_predict": 3, "temperature": 0, "n_probs": 4})
    probs = r["completion_probabilities"]
    assert len(probs) == 3 and all(len(p["top_logprobs"]) == 4 for p in probs)
    expect = torch.log_softmax(logits(ref, ref.tokenize(PROMPT, parse_special=True)).double(), -1)
    top = torch.topk(expect, 4)
    first = probs[0]
    assert [t["id"] for t in first["top_logprobs"]] == top.indices.tolist() and first["id"] == top.indices[0]
    assert [t["logprob"] for t in first["top_logprobs"]] == pytest.approx(top.values.tolist(), abs=1e-4)  # batch shapes round apart
    assert bytes(first["bytes"]) == ref.tokenizer.token_to_piece_bytes(first["id"])
    assert "".join(p["token"] for p in probs) == r["content"]


def test_n_probs_equal_llama_cpps(served, demo_path, llama_cpp):
    """The first step's n_probs against llama.cpp's logits for the same prompt (llama-cpp-python)."""
    client, ref = served
    ids = ref.tokenize(PROMPT, parse_special=True)
    llm = llama_cpp.Llama(model_path=demo_path, n_ctx=64, logits_all=True, verbose=False)
    llm.eval(ids)
    expect = torch.log_softmax(torch.tensor(llm.scores[len(ids) - 1], dtype=torch.float64), -1)
    top = torch.topk(expect, 4)
    got = post(client, "/completion", {"prompt": ids, "n_predict": 1, "temperature": 0, "n_probs": 4})
    first = got["completion_probabilities"][0]["top_logprobs"]
    assert [t["id"] for t in first] == top.indices.tolist()
    assert [t["logprob"] for t in first] == pytest.approx(top.values.tolist(), abs=2e-3)


POST_SAMPLING = [  # sampling fields; the first step's draw against the sampler's on the reference's logits
    {"temperature": 1.0, "top_k": 6, "top_p": 0.9, "min_p": 0.05, "seed": 7},
    {"temperature": 0.6, "top_k": 0, "top_p": 0.5, "min_p": 0.0, "seed": 3, "repeat_penalty": 1.3},
    {"temperature": 0},
]


@pytest.mark.parametrize("sampling", POST_SAMPLING)
@pytest.mark.parametrize("path", ["/completion", "/v1/chat/completions"])
def test_post_sampling_probs_are_the_samplers(served, path, sampling):
    """post_sampling_probs: each token's probability in the draw and the n_probs most probable kept
    candidates (llama-server's "prob" / "top_probs"), as the library's sampler reports them."""
    from torchggml.models.sampling import Sampler, SamplingParams
    client, ref = served
    n = 5
    if path == "/completion":
        ids = ref.tokenize(PROMPT, parse_special=True)
        r = post(client, path, {"prompt": PROMPT, "n_predict": 3, "n_probs": n, "post_sampling_probs": True,
                                **sampling})
        steps = r["completion_probabilities"]
    else:
        messages = [{"role": "user", "content": PROMPT}]
        text, tok = ref.chat_prompt(messages), ref.tokenizer
        has_bos = tok.bos_id is not None and text.startswith(tok.token_text(tok.bos_id))
        ids = ref.tokenize(text, add_special=not has_bos, parse_special=True)
        r = post(client, path, {"messages": messages, "max_tokens": 3, "logprobs": True, "top_logprobs": n,
                                "post_sampling_probs": True, **sampling})
        steps = r["choices"][0]["logprobs"]["content"]
    params = {k: v for k, v in sampling.items() if k != "seed"}
    expect = Sampler(SamplingParams(**{"min_p": 0.05, **params}, logprobs=n, post_sampling_probs=True),
                     history=ids).sample(logits(ref, ids))
    first = steps[0]
    assert "logprob" not in first and "top_logprobs" not in first
    assert [bytes(t["bytes"]) for t in first["top_probs"]] == \
        [ref.tokenizer.token_to_piece_bytes(t) for t, _ in expect.top_probs]
    assert [t["prob"] for t in first["top_probs"]] == pytest.approx([p for _, p in expect.top_probs], abs=1e-4)
    for step in steps:  # the drawn token is a kept candidate, with its probability
        assert 0 < step["prob"] <= 1 and 0 < len(step["top_probs"]) <= n
        listed = {bytes(t["bytes"]): t["prob"] for t in step["top_probs"]}
        if bytes(step["bytes"]) in listed:
            assert step["prob"] == listed[bytes(step["bytes"])]
    if sampling["temperature"] == 0:
        assert all(s["prob"] == 1.0 and len(s["top_probs"]) == 1 for s in steps)


def test_stream_is_the_whole_answer_without_done(served):
    client, _ = served
    body = {"prompt": PROMPT, "n_predict": 6, "temperature": 0, "n_probs": 2, "stream": True}
    with client.stream("POST", "/completion", json=body) as r:
        lines = [line for line in r.iter_lines() if line]
    chunks = [json.loads(line[len("data: "):]) for line in lines]
    whole = post(client, "/completion", dict(body, stream=False))
    assert all(line.startswith("data: {") for line in lines)  # no [DONE]
    assert "".join(c["content"] for c in chunks) == whole["content"]
    assert [c["stop"] for c in chunks] == [False] * (len(chunks) - 1) + [True]
    assert sum(len(c.get("completion_probabilities", [])) for c in chunks) == whole["tokens_predicted"]


def test_several_prompts_answer_a_list(served):
    client, ref = served
    prompts = [PROMPT, "The scheduler"]
    r = post(client, "/completion", {"prompt": prompts, "n_predict": 4, "temperature": 0})
    assert [x["index"] for x in r] == [0, 1] and [x["content"] for x in r] == [generate(ref, p, 4) for p in prompts]
    mixed = post(client, "/completion", {"prompt": ref.tokenize(PROMPT, parse_special=True), "n_predict": 4,
                                         "temperature": 0})
    assert mixed["content"] == generate(ref, PROMPT, 4)


def _greedy_first(ref) -> int:
    return int(torch.argmax(logits(ref, ref.tokenize(PROMPT))))


# (endpoint, how the bias is written) -> the request's logit_bias from (token id, its text)
BIAS_FORMS = [
    ("/v1/completions", "openai map", lambda t, text, b: {str(t): b}),
    ("/completion", "llama pairs", lambda t, text, b: [[t, b]]),
    ("/completion", "llama text pairs", lambda t, text, b: [[text, b]]),
    ("/completion", "openai map of text", lambda t, text, b: {text: b}),
    ("/v1/chat/completions", "openai map", lambda t, text, b: {str(t): b}),
]


@pytest.mark.parametrize("path,form,bias", BIAS_FORMS, ids=[f"{p}-{f}" for p, f, _ in BIAS_FORMS])
@pytest.mark.parametrize("kind", ["ban", "force"])
def test_logit_bias(served, path, form, bias, kind):
    """A banned token (false, or -100 in OpenAI's map) is never produced; +100 forces one: the
    output equals Model.generate with the same (id, bias) pairs."""
    client, ref = served
    token = _greedy_first(ref)
    text = ref.tokenizer.token_to_piece(token)
    if form.endswith("text") or "text" in form:
        ids = ref.tokenize(text, add_special=False)
        if ids != [token]:
            pytest.skip(f"the demo's first greedy token {text!r} does not tokenize back to itself")
    value = (-100 if "openai" in form else False) if kind == "ban" else 100
    body = {"logit_bias": bias(token, text, value), "temperature": 0, "max_tokens": 6}
    if path == "/v1/chat/completions":
        body["messages"] = [{"role": "user", "content": PROMPT}]
        got = post(client, path, body)["choices"][0]["message"]["content"]
        prompt = client.post("/apply-template", json={"messages": body["messages"]}).json()["prompt"]
        expect = "".join(ref.generate(ref.tokenize(prompt, parse_special=True), max_tokens=6, temperature=0,
                                      logit_bias=((token, -math.inf if kind == "ban" else 100.0),)))
    else:
        body["prompt"] = PROMPT
        r = post(client, path, body)
        got = r["choices"][0]["text"] if path.startswith("/v1") else r["content"]
        expect = generate(ref, n=6, logit_bias=((token, (-100.0 if "openai" in form else -math.inf)
                                                        if kind == "ban" else 100.0),))
    assert got == expect
    if kind == "force":
        assert got == text * 6 or got.startswith(text)


BAD = [  # (path, body, param, the message's words)
    ("/completion", {"prompt": PROMPT, "logit_bias": [[1]]}, "logit_bias", "pair"),
    ("/completion", {"prompt": PROMPT, "logit_bias": [[10 ** 6, 1]]}, "logit_bias", "outside the vocabulary"),
    ("/completion", {"prompt": PROMPT, "logit_bias": {"5": "x"}}, "logit_bias", "finite number or false"),
    ("/v1/completions", {"prompt": PROMPT, "logit_bias": {"5": True}}, "logit_bias", "finite number or false"),
    ("/completion", {"prompt": PROMPT, "n_probs": 21}, "n_probs", ""),
    ("/completion", {"prompt": PROMPT, "n_predict": -2}, "n_predict", ""),
    ("/completion", {"prompt": {"a": 1}}, "prompt", ""),
]


@pytest.mark.parametrize("path,body,param,words", BAD, ids=[f"{b[2]}-{i}" for i, b in enumerate(BAD)])
def test_bad_input(served, path, body, param, words):
    r = served[0].post(path, json=body)
    assert r.status_code == 400 and r.json()["error"]["param"] == param and words in r.json()["error"]["message"], r.text


# ---------------------------------------------------------------- /infill

@pytest.fixture(scope="module")
def fim(tmp_path_factory):
    """The demo with Qwen's FIM tokens (tests/test_tokenizer.py's fim_vocab), n_batch 64 so that
    the prefix and suffix are cut; served, and a reference copy."""
    from test_tokenizer import fim_vocab
    path = fim_vocab(tmp_path_factory.mktemp("fim") / "fim.gguf", "texts")
    model, reference = (load_model(path, n_batch=64, progress=False) for _ in range(2))
    with serving(model) as client:
        yield client, reference
    model.close()
    reference.close()


def _laid_out(ref, prefix, suffix, prompt="", extra=(), n_predict=0):
    """format_infill by hand for n_batch 64, n_ctx 512: prefix <= 48 tokens, suffix <= 14 - prompt."""
    f, t = ref.tokenizer.fim_ids, (lambda s: ref.tokenize(s, add_special=False))
    ex = [f["rep"]] + t("myproject\n")
    for name, text in extra:
        ex += [f["sep"]] + t(name + "\n") + t(text)
    ex += [f["sep"]] + t("filename\n")
    p = ref.tokenize(prompt, add_special=False, parse_special=True)
    keep = min(len(ex), max(0, 512 - 64 - 2 * n_predict))
    return (ex[len(ex) - keep:] + [ref.tokenizer.bos_id, f["pre"]] + t(prefix)[-48:] + p + [f["suf"]]
            + t(suffix)[:max(0, 14 - len(p))] + [f["mid"]])


INFILL = [  # (body beyond n_predict and temperature, what _laid_out is given)
    ({"input_prefix": "def f(x):\n    ", "input_suffix": "\n    return y\n"},
     dict(prefix="def f(x):\n    ", suffix="\n    return y\n")),
    ({"input_prefix": "the graph " * 40, "input_suffix": "runs on " * 20, "prompt": "y ="},
     dict(prefix="the graph " * 40, suffix="runs on " * 20, prompt="y =")),
    ({"input_prefix": "a", "input_suffix": "b", "input_extra": [{"filename": "u.py", "text": "x = 1"}, {"text": "z"}]},
     dict(prefix="a", suffix="b", extra=[("u.py", "x = 1"), ("tmp", "z")])),
]


@pytest.mark.parametrize("body,layout", INFILL)
def test_infill_is_format_infill_then_generate(fim, body, layout):
    client, ref = fim
    ids = _laid_out(ref, n_predict=5, **layout)
    r = post(client, "/infill", {**body, "n_predict": 5, "temperature": 0, "return_tokens": True})
    assert r["tokens_evaluated"] == len(ids) and r["prompt"] == ref.detokenize(ids)
    assert r["content"] == "".join(ref.generate(ids, max_tokens=5, temperature=0))


def test_infill_streams_as_completion(fim):
    client, _ = fim
    body = {"input_prefix": "def f(x):", "input_suffix": "return y", "n_predict": 5, "temperature": 0}
    with client.stream("POST", "/infill", json=dict(body, stream=True)) as r:
        chunks = [json.loads(line[len("data: "):]) for line in r.iter_lines() if line]
    assert "".join(c["content"] for c in chunks) == post(client, "/infill", body)["content"] and chunks[-1]["stop"]


INFILL_BAD = [  # (body, status, param)
    ({"input_suffix": "b"}, 400, "input_prefix"),
    ({"input_prefix": "a"}, 400, "input_suffix"),
    ({"input_prefix": "a", "input_suffix": "b", "input_extra": [{"filename": "x"}]}, 400, "input_extra"),
    ({"input_prefix": "a", "input_suffix": "b", "prompt": 5}, 400, "prompt"),
    ({"input_prefix": "a " * 100_000, "input_suffix": "b"}, 400, "input_prefix"),   # refused before tokenizing
    ({"input_prefix": "a", "input_suffix": "b", "input_extra": [{"text": "c " * 100_000}]}, 400, "input_extra[0]"),
]


@pytest.mark.parametrize("body,status,param", INFILL_BAD)
def test_infill_bad_input(fim, body, status, param):
    r = fim[0].post("/infill", json=body)
    assert r.status_code == status and r.json()["error"]["param"] == param, r.text


def test_infill_without_fim_tokens_is_501(served):
    r = served[0].post("/infill", json={"input_prefix": "a", "input_suffix": "b"})
    assert r.status_code == 501 and "no FIM prefix, suffix, middle token" in r.json()["error"]["message"], r.text
