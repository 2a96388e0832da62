"""`torchggml serve` started for real on a loopback port and driven with the official openai client
(and plain HTTP for the bad inputs): completions, chat, streaming, embeddings, JSON schemas,
grammars, logprobs, stop strings, concurrency, hang-ups, errors, the API key, the queue bound."""
from __future__ import annotations

import concurrent.futures
import json
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request

import pytest

for module in ("fastapi", "uvicorn", "openai", "llguidance", "jsonschema"):
    pytest.importorskip(module, reason=f"the server tests need {module} (pip install -e '.[test]')")

import jsonschema  # noqa: E402
import openai  # noqa: E402
import torch  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
KEY = "test-key-123"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    def __init__(self, *args: str):
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
        self.proc = subprocess.Popen([sys.executable, "-m", "torchggml", "serve", "--port", str(self.port), *args],
                                     cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        deadline = time.time() + 600  # ready (/health 200) = loaded and warmed: kernels compiled
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the server exited: {self.proc.stdout.read()}")
            try:
                if http(self.url + "/health")[0] == 200:
                    break
            except OSError:
                pass
            time.sleep(0.3)  # not listening yet, or 503 while loading
        else:
            self.stop()
            raise RuntimeError("the server was not ready within 600 s")
        self.model_id = http(self.url + "/v1/models", key=KEY)[1]["data"][0]["id"]

    def client(self, key: str = KEY) -> openai.OpenAI:
        return openai.OpenAI(base_url=self.url + "/v1", api_key=key, max_retries=0, timeout=120)

    def metrics(self) -> dict[str, float]:
        req = urllib.request.Request(self.url + "/metrics", headers={"Authorization": f"Bearer {KEY}"})
        text = urllib.request.urlopen(req, timeout=30).read().decode()
        return {line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1])
                for line in text.splitlines() if line and not line.startswith("#")}

    def stop(self):
        self.proc.terminate()
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def http(url: str, body: bytes | str | None = None, key: str | None = None, method: str | None = None):
    """(status, parsed JSON body) of one request."""
    headers = {"Content-Type": "application/json"}
    if key is not None:
        headers["Authorization"] = f"Bearer {key}"
    data = body.encode() if isinstance(body, str) else body
    req = urllib.request.Request(url, data=data, headers=headers, method=method)
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, json.loads(r.read() or b"null")
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"null")


@pytest.fixture(scope="module")
def slot_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("slots")


@pytest.fixture(scope="module")
def server(slot_dir):
    s = Server("--parallel", "4", "--queue-size", "32", "--api-key", KEY, "--slot-save-path", str(slot_dir),
               "--cache-ram", "16")
    yield s
    s.stop()


@pytest.fixture(scope="module")
def server1():
    """One slot and no waiting room: exactly Model.generate, and 503 when busy."""
    s = Server("--parallel", "1", "--queue-size", "0", "--api-key", KEY)
    yield s
    s.stop()


@pytest.fixture(scope="module")
def demo():
    from torchggml.gguf.writer.demo import demo_model_path
    from torchggml.models import load_model
    m = load_model(demo_model_path())
    yield m
    m.close()


PROMPTS = ["Once upon a time", "The scheduler cuts the graph"]


def test_models_and_completion(server):
    c = server.client()
    assert [m.id for m in c.models.list().data] == [server.model_id]
    r = c.completions.create(model=server.model_id, prompt=PROMPTS[0], max_tokens=6, temperature=0)
    assert r.choices[0].finish_reason in ("length", "stop") and r.choices[0].text
    assert r.usage.prompt_tokens > 0 and 0 < r.usage.completion_tokens <= 6
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens


def test_chat(server):
    r = server.client().chat.completions.create(
        model=server.model_id, messages=[{"role": "user", "content": "Hello"}], max_tokens=5, temperature=0)
    assert r.choices[0].message.role == "assistant" and r.choices[0].message.content
    assert r.usage.completion_tokens <= 5


@pytest.mark.parametrize("kind", ["completion", "chat"])
def test_stream_equals_non_stream(server, kind):
    c = server.client()
    args = dict(model=server.model_id, max_tokens=8, temperature=0)
    if kind == "completion":
        whole = c.completions.create(prompt=PROMPTS[1], **args).choices[0].text
        parts = [ch.choices[0].text for ch in c.completions.create(prompt=PROMPTS[1], stream=True, **args) if ch.choices]
    else:
        msgs = [{"role": "user", "content": "Tell me"}]
        whole = c.chat.completions.create(messages=msgs, **args).choices[0].message.content
        parts = [ch.choices[0].delta.content or "" for ch in
                 c.chat.completions.create(messages=msgs, stream=True, **args) if ch.choices]
    assert "".join(parts) == whole and whole


def test_parallel_1_equals_generate(server1, demo):
    c = server1.client()
    for prompt in PROMPTS:
        served = c.completions.create(model=server1.model_id, prompt=prompt, max_tokens=10, temperature=0).choices[0].text
        assert served == "".join(demo.generate(prompt, max_tokens=10, temperature=0))


def test_stream_usage_logprobs_and_stop(server, demo):
    c = server.client()
    full = "".join(demo.generate(PROMPTS[0], max_tokens=10, temperature=0))
    r = c.completions.create(model=server.model_id, prompt=PROMPTS[0], max_tokens=10, temperature=0, logprobs=3)
    lp = r.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == r.usage.completion_tokens
    assert all(len(top) == 3 and max(top.values()) >= v - 1e-9 for top, v in zip(lp.top_logprobs, lp.token_logprobs))
    # at temperature 0 the chosen token is the most likely one
    assert all(abs(max(top.values()) - v) < 1e-9 for top, v in zip(lp.top_logprobs, lp.token_logprobs))
    stop = full[len(full) // 2: len(full) // 2 + 2]
    cut = c.completions.create(model=server.model_id, prompt=PROMPTS[0], max_tokens=10, temperature=0, stop=[stop])
    assert cut.choices[0].text == full[:full.index(stop)] and cut.choices[0].finish_reason == "stop"
    chunks = list(c.chat.completions.create(model=server.model_id, messages=[{"role": "user", "content": "x"}],
                                            max_tokens=4, temperature=0, stream=True,
                                            stream_options={"include_usage": True}, logprobs=True, top_logprobs=2))
    assert chunks[-1].usage.completion_tokens == sum(len(ch.choices[0].logprobs.content) for ch in chunks
                                                     if ch.choices and ch.choices[0].logprobs)


def test_seed_and_sampling_options(server):
    c = server.client()
    args = dict(model=server.model_id, prompt=PROMPTS[0], max_tokens=8, temperature=1.0, seed=7,
                extra_body={"top_k": 20, "min_p": 0.05, "repeat_penalty": 1.2})
    a, b = (c.completions.create(**args).choices[0].text for _ in range(2))
    assert a == b
    r = c.completions.create(model=server.model_id, prompt=PROMPTS[0], max_tokens=8, temperature=0.7,
                             frequency_penalty=1.0, presence_penalty=0.5, n=2)
    assert [ch.index for ch in r.choices] == [0, 1] and r.usage.completion_tokens <= 16


def test_embeddings(server, demo):
    c = server.client()
    r = c.embeddings.create(model=server.model_id, input=PROMPTS)  # the client asks for base64
    assert [d.index for d in r.data] == [0, 1]
    for d, text in zip(r.data, PROMPTS):
        expect = torch.nn.functional.normalize(demo.embed(demo.tokenize(text), pooling="mean"), dim=0)
        assert torch.allclose(torch.tensor(d.embedding), expect, atol=1e-5)
    floats = c.embeddings.create(model=server.model_id, input=PROMPTS[0], encoding_format="float")
    assert torch.allclose(torch.tensor(floats.data[0].embedding), torch.tensor(r.data[0].embedding), atol=1e-6)
    assert r.usage.prompt_tokens == sum(len(demo.tokenize(p)) for p in PROMPTS)


SCHEMA = {"type": "object", "additionalProperties": False, "required": ["name", "ok", "count"],
          "properties": {"name": {"type": "string", "maxLength": 8}, "ok": {"type": "boolean"},
                         "count": {"type": "integer", "minimum": 0, "maximum": 99}}}


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_json_schema_output(server, temperature):
    r = server.client().chat.completions.create(
        model=server.model_id, messages=[{"role": "user", "content": "JSON please"}], max_tokens=60,
        temperature=temperature, seed=3,
        response_format={"type": "json_schema", "json_schema": {"name": "thing", "schema": SCHEMA}})
    value = json.loads(r.choices[0].message.content)
    jsonschema.validate(value, SCHEMA)
    assert r.choices[0].finish_reason == "stop"


def test_grammar(server):
    r = server.client().completions.create(model=server.model_id, prompt=PROMPTS[0], max_tokens=8, temperature=1.0,
                                           extra_body={"grammar": 'root ::= "yes" | "no"'})
    assert r.choices[0].text in ("yes", "no")


def test_16_concurrent_streams(server):
    c = server.client()

    def one(i):
        stream = c.completions.create(model=server.model_id, prompt=f"{PROMPTS[i % 2]} {i}", max_tokens=6,
                                      temperature=0.8, seed=i, stream=True)
        chunks = [ch for ch in stream if ch.choices]
        return "".join(ch.choices[0].text for ch in chunks), chunks[-1].choices[0].finish_reason

    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        results = list(pool.map(one, range(16)))
    assert len(results) == 16 and all(text and finish in ("length", "stop") for text, finish in results)


def test_hang_up_mid_stream(server):
    before = server.metrics().get('torchggml_sequences_finished_total{reason="cancelled"}', 0)
    stream = server.client().completions.create(model=server.model_id, prompt=PROMPTS[0], max_tokens=100,
                                                temperature=0.8, stream=True, extra_body={"min_p": 0.0})
    next(iter(stream))
    stream.close()  # the client hangs up
    deadline = time.time() + 30
    while server.metrics().get('torchggml_sequences_finished_total{reason="cancelled"}', 0) <= before:
        assert time.time() < deadline, "the hung-up sequence was not cancelled"
        time.sleep(0.2)
    assert server.metrics()["torchggml_sequences_active"] == 0
    r = server.client().completions.create(model=server.model_id, prompt=PROMPTS[0], max_tokens=3)
    assert r.choices[0].text


def test_hang_up_while_waiting_for_a_whole_answer(server1):
    """A non-streaming client that closes its connection cancels its sequence too. One slot (the
    whole context) and no end-of-generation token: the answer takes long enough (400 tokens) that
    the disconnect is seen before it ends, on a fast machine too."""
    server = server1
    key = 'torchggml_sequences_finished_total{reason="cancelled"}'
    before = server.metrics().get(key, 0)
    body = json.dumps({"prompt": PROMPTS[0], "max_tokens": 400, "ignore_eos": True, "min_p": 0.0}).encode()
    with socket.create_connection(("127.0.0.1", server.port)) as sock:
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Authorization: Bearer " + KEY.encode() + b"\r\nContent-Length: " + str(len(body)).encode()
                     + b"\r\n\r\n" + body)
        deadline = time.time() + 30
        while server.metrics()["torchggml_sequences_active"] == 0:  # it is running
            assert time.time() < deadline
            time.sleep(0.05)
    deadline = time.time() + 30
    while server.metrics().get(key, 0) <= before:
        assert time.time() < deadline, "the abandoned sequence was not cancelled"
        time.sleep(0.2)


LONG = "Once upon a time " * 200
BAD = [  # (what, path, body, status, param)
    ("malformed JSON", "/v1/completions", '{"prompt": "x", ', 400, None),
    ("not an object", "/v1/completions", '[1, 2]', 400, None),
    ("missing prompt", "/v1/completions", '{}', 400, "prompt"),
    ("wrong type max_tokens", "/v1/completions", '{"prompt": "x", "max_tokens": "ten"}', 400, "max_tokens"),
    ("wrong type temperature", "/v1/completions", '{"prompt": "x", "temperature": "hot"}', 400, "temperature"),
    ("wrong type prompt", "/v1/completions", '{"prompt": {"a": 1}}', 400, "prompt"),
    ("wrong type messages", "/v1/chat/completions", '{"messages": "hi"}', 400, "messages"),
    ("empty messages", "/v1/chat/completions", '{"messages": []}', 400, "messages"),
    ("negative max_tokens", "/v1/completions", '{"prompt": "x", "max_tokens": -5}', 400, "max_tokens"),
    ("negative chat max_tokens", "/v1/chat/completions",
     '{"messages": [{"role": "user", "content": "x"}], "max_tokens": -1}', 400, "max_tokens"),
    ("top_p out of range", "/v1/completions", '{"prompt": "x", "top_p": 3}', 400, "top_p"),
    ("prompt longer than the context", "/v1/completions", json.dumps({"prompt": LONG}), 400, "prompt"),
    ("chat longer than the context", "/v1/chat/completions",
     json.dumps({"messages": [{"role": "user", "content": LONG}]}), 400, "messages"),
    ("embedding input longer than the context", "/v1/embeddings", json.dumps({"input": LONG}), 400, "input"),
    ("token id outside the vocabulary", "/v1/completions", '{"prompt": [1, 99999]}', 400, "prompt"),
    ("empty prompt list", "/v1/completions", '{"prompt": []}', 400, "prompt"),
    ("empty token list", "/v1/completions", '{"prompt": [[]]}', 400, "prompt"),
    ("empty embedding input", "/v1/embeddings", '{"input": []}', 400, "input"),
    ("invalid JSON schema", "/v1/completions",
     '{"prompt": "x", "response_format": {"type": "json_schema", "json_schema": {"schema": {"type": "bogus"}}}}',
     400, "response_format"),
    ("invalid grammar", "/v1/completions", '{"prompt": "x", "grammar": "root ::= ("}', 400, "grammar"),
    ("logit_bias id outside the vocabulary", "/v1/completions", '{"prompt": "x", "logit_bias": {"99999": 5}}', 400,
     "logit_bias"),
    ("prompt and max_tokens longer than the context", "/v1/completions",
     '{"prompt": "x", "max_tokens": 600}', 400, "max_tokens"),
    ("image without --mmproj", "/v1/chat/completions", json.dumps({"messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}]}]}), 400, "messages"),
    ("unknown endpoint", "/v1/nothing", '{}', 404, None),
    ("wrong method", "/v1/completions", None, 405, None),
]


@pytest.mark.parametrize("what,path,body,status,param", BAD, ids=[b[0] for b in BAD])
def test_bad_input(server, what, path, body, status, param):
    code, answer = http(server.url + path, body, key=KEY, method="GET" if body is None else "POST")
    assert code == status, answer
    error = answer["error"]
    assert error["message"] and error["type"] == "invalid_request_error" and error["param"] == param


def test_bad_input_through_openai_client(server):
    c = server.client()
    with pytest.raises(openai.BadRequestError) as e:
        c.completions.create(model=server.model_id, prompt="x", max_tokens=-1)
    assert e.value.status_code == 400
    # another model's name is served, as llama-server does (404 only with --strict-model-name)
    assert c.chat.completions.create(model="gpt-17", messages=[{"role": "user", "content": "x"}], max_tokens=1).choices
    assert http(server.url + "/health")[0] == 200  # still up


def test_api_key(server):
    with pytest.raises(openai.AuthenticationError) as e:
        server.client(key="wrong").completions.create(model=server.model_id, prompt="x", max_tokens=1)
    assert e.value.status_code == 401
    code, answer = http(server.url + "/v1/models")  # no key at all
    assert code == 401 and answer["error"]["code"] == "invalid_api_key"
    assert http(server.url + "/health")[0] == 200  # health needs no key


def test_queue_full_is_503(server1):
    c = server1.client()
    running = c.completions.create(model=server1.model_id, prompt=PROMPTS[0], max_tokens=120, stream=True,
                                   extra_body={"min_p": 0.0, "top_k": 0})
    next(iter(running))  # it holds the only slot
    with pytest.raises(openai.APIStatusError) as e:
        c.completions.create(model=server1.model_id, prompt=PROMPTS[1], max_tokens=2)
    assert e.value.status_code == 503 and e.value.body["code"] == "server_busy"
    running.close()
    with pytest.raises(openai.BadRequestError):  # more sequences than it can ever hold: 400, not 503
        c.completions.create(model=server1.model_id, prompt=PROMPTS[1], max_tokens=2, n=2)


def test_metrics(server):
    server.client().completions.create(model=server.model_id, prompt=PROMPTS[0], max_tokens=2)
    m = server.metrics()
    for name in ("torchggml_generated_tokens_total", "torchggml_prompt_tokens_total", "torchggml_tokens_per_second",
                 "torchggml_queue_waiting", "torchggml_batch_tokens_total", "torchggml_kv_cache_used_cells",
                 "torchggml_kv_cache_usage_ratio"):
        assert name in m
    assert m['torchggml_requests_total{path="/v1/completions",status="200"}'] >= 1
    assert m["torchggml_generated_tokens_total"] >= 2


def test_prompt_cache_reuses_the_last_turn_and_changes_no_text(server):
    """A second turn that extends the first finds its tokens in the slot (llama-server's
    cache_prompt, on by default) and answers what it answers with cache_prompt false."""
    c = server.client()
    messages = [{"role": "user", "content": "Tell me about the scheduler."}]
    first = c.chat.completions.create(model=server.model_id, messages=messages, max_tokens=6, temperature=0)
    messages += [{"role": "assistant", "content": first.choices[0].message.content},
                 {"role": "user", "content": "And the graph?"}]
    before = server.metrics()["torchggml_prompt_tokens_cached_total"]
    cached = c.chat.completions.create(model=server.model_id, messages=messages, max_tokens=6, temperature=0)
    hit = server.metrics()["torchggml_prompt_tokens_cached_total"] - before
    fresh = c.chat.completions.create(model=server.model_id, messages=messages, max_tokens=6, temperature=0,
                                      extra_body={"cache_prompt": False})
    assert hit > 0 and cached.choices[0].message.content == fresh.choices[0].message.content


def test_speculative_serving_gives_the_same_text_and_counts_its_drafts(server):
    """--draft-ngram: drafts from prompt lookup, checked in one batch; the text is plain decoding's."""
    prompt = "one two three four. one two three four. one two three four. one two"
    plain = server.client().completions.create(model=server.model_id, prompt=prompt, max_tokens=24, temperature=0)
    spec = Server("--parallel", "2", "--api-key", KEY, "--draft-ngram", "--draft-max", "6")
    try:
        fast = spec.client().completions.create(model=spec.model_id, prompt=prompt, max_tokens=24, temperature=0)
        m = spec.metrics()
    finally:
        spec.stop()
    assert fast.choices[0].text == plain.choices[0].text
    assert m["torchggml_draft_tokens_total"] >= m["torchggml_draft_tokens_accepted_total"] > 0


WEATHER_TOOL = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 10}}, "required": ["city"]}}}


def test_a_two_turn_function_call_with_the_openai_client(server1):
    """tool_choice required: the reply is a call (the demo has no template: the generic JSON format,
    held by its grammar); the tool's result goes back as a tool message and the model answers."""
    c = server1.client()
    messages = [{"role": "user", "content": "What is the weather in Paris?"}]
    first = c.chat.completions.create(model=server1.model_id, messages=messages, tools=[WEATHER_TOOL],
                                      tool_choice="required", max_tokens=64, temperature=0)
    choice = first.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.tool_calls
    call = choice.message.tool_calls[0]
    assert call.function.name == "get_weather" and set(json.loads(call.function.arguments)) == {"city"}
    messages += [{"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
                 {"role": "tool", "tool_call_id": call.id, "content": '{"temperature": 21}'}]
    second = c.chat.completions.create(model=server1.model_id, messages=messages, tools=[WEATHER_TOOL],
                                       tool_choice="none", max_tokens=8, temperature=0)
    assert second.choices[0].finish_reason in ("stop", "length") and not second.choices[0].message.tool_calls
    stream = c.chat.completions.create(model=server1.model_id, messages=messages[:1], tools=[WEATHER_TOOL],
                                       tool_choice="required", max_tokens=64, temperature=0, stream=True)
    chunks = list(stream)
    calls = [tc for ch in chunks for tc in (ch.choices[0].delta.tool_calls or [])] if chunks else []
    assert calls and calls[0].function.name == "get_weather" and chunks[-1].choices[0].finish_reason == "tool_calls"


def test_llama_server_endpoints(server, demo):
    """/tokenize, /detokenize, /apply-template, /props and /slots answer as llama-server's do."""
    url, text = server.url, "Once upon a time"
    status, got = http(url + "/tokenize", json.dumps({"content": text}), KEY)
    assert status == 200 and got["tokens"] == demo.tokenize(text, add_special=False, parse_special=True)
    status, pieces = http(url + "/tokenize", json.dumps({"content": text, "with_pieces": True}), KEY)
    assert [p["id"] for p in pieces["tokens"]] == got["tokens"]
    assert "".join(p["piece"] for p in pieces["tokens"] if isinstance(p["piece"], str)) == text
    assert http(url + "/detokenize", json.dumps({"tokens": got["tokens"]}), KEY) == (200, {"content": text})
    assert http(url + "/detokenize", json.dumps({"tokens": [10**9]}), KEY)[0] == 400
    status, applied = http(url + "/apply-template", json.dumps({"messages": [{"role": "user", "content": "Hi"}]}), KEY)
    assert status == 200 and applied["prompt"] == "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    status, props = http(url + "/props", key=KEY)
    assert status == 200 and props["total_slots"] == 4 and props["default_generation_settings"]["params"]["top_k"] == 40
    status, slots = http(url + "/slots", key=KEY)
    assert status == 200 and [s["id"] for s in slots] == [0, 1, 2, 3]
    assert http(url + "/props")[0] == 401  # the API key holds here too


SLOT_ERRORS = [  # (what, path, body, status, message)
    ("path traversal", "/slots/0?action=save", {"filename": "../x.slot"}, 400, "Invalid filename"),
    ("a folder in the name", "/slots/0?action=restore", {"filename": "a/b"}, 400, "Invalid filename"),
    ("a dot name", "/slots/0?action=save", {"filename": ".."}, 400, "Invalid filename"),
    ("no filename", "/slots/0?action=save", {}, 400, "filename"),
    ("an absent file", "/slots/0?action=restore", {"filename": "nothing.slot"}, 400, "does not exist"),
    ("no such slot", "/slots/7?action=erase", {}, 400, "Invalid slot ID 7"),
    ("no such action", "/slots/0?action=keep", {}, 400, "Invalid action 'keep'"),
]


@pytest.mark.parametrize("what,path,body,status,message", SLOT_ERRORS, ids=[e[0] for e in SLOT_ERRORS])
def test_slot_action_errors(server, what, path, body, status, message):
    code, answer = http(server.url + path, json.dumps(body), KEY)
    assert code == status and message in answer["error"]["message"], answer


def test_slot_save_restore_and_erase_as_llama_server(server, slot_dir, server1):
    """A slot saved to a file, erased and restored answers the next turn from its cells: the reply
    is the one without the cache. Without --slot-save-path the actions answer 501."""
    c, url = server.client(), server.url
    for slot in range(4):  # no cached prompt anywhere: the next request's slot is the one that holds one
        assert http(url + f"/slots/{slot}?action=erase", "{}", KEY)[0] == 200
    prompt = "Slots keep their prompts in files"
    c.completions.create(model=server.model_id, prompt=prompt, max_tokens=4, temperature=0)
    slot = next(s["id"] for s in http(url + "/slots", key=KEY)[1] if s["n_prompt_tokens_cached"])
    status, saved = http(url + f"/slots/{slot}?action=save", json.dumps({"filename": "a.slot"}), KEY)
    assert status == 200 and saved["n_saved"] > 0 and saved["n_written"] == (slot_dir / "a.slot").stat().st_size
    assert set(saved) == {"id_slot", "filename", "n_saved", "n_written", "timings"}
    status, erased = http(url + f"/slots/{slot}?action=erase", "{}", KEY)
    assert status == 200 and erased == {"id_slot": slot, "n_erased": saved["n_saved"]}
    status, restored = http(url + "/slots/3?action=restore", json.dumps({"filename": "a.slot"}), KEY)
    assert status == 200 and (restored["n_restored"], restored["n_read"]) == (saved["n_saved"], saved["n_written"])
    before = server.metrics()["torchggml_prompt_tokens_cached_total"]
    longer = prompt + " and read them back"
    hit = c.completions.create(model=server.model_id, prompt=longer, max_tokens=6, temperature=0)
    assert server.metrics()["torchggml_prompt_tokens_cached_total"] - before == saved["n_saved"]
    fresh = c.completions.create(model=server.model_id, prompt=longer, max_tokens=6, temperature=0,
                                 extra_body={"cache_prompt": False})
    assert hit.choices[0].text == fresh.choices[0].text
    code, answer = http(server1.url + "/slots/0?action=save", json.dumps({"filename": "a.slot"}), KEY)
    assert code == 501 and "--slot-save-path" in answer["error"]["message"]
