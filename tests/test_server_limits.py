"""Reliability, round 4 (issue 43), the server: one regression test per finding, as tables of cases.

1. bounded work before admission: body size (413), counts and text lengths checked before any
   tokenization, so a body of many prompts is refused by counting;
2. timeouts: a slow-header client is cut off, a body that does not arrive is 408, the connection
   bound answers 503 and recovers, a stalled stream is cancelled, a sequence past its deadline ends;
3. every client error a 4xx naming the parameter: seeds wrap to uint32, grammars with an empty
   language, lone surrogates, huge grammar literals not echoed; unknown model names served (404
   only with --strict-model-name);
4. JSON-schema numbers bounded as llama.cpp's json-schema-to-grammar (16 digits a part);
5. /health 503 "Loading model" until the model is ready;
6. /metrics by route (unknown paths one label, values escaped), stop strings matched in one scan,
   a clean exit on SIGTERM while a request is being read.
"""
from __future__ import annotations

import asyncio
import json
import random
import re
import signal
import socket
import time
import urllib.error
import urllib.request

import pytest

for module in ("fastapi", "uvicorn", "llguidance"):
    pytest.importorskip(module, reason=f"the server tests need {module} (pip install -e '.[test]')")

from test_server import KEY, Server, http  # noqa: E402

from torchggml.models.sampling import StopStrings  # noqa: E402

BODY_LIMIT = 200_000


@pytest.fixture(scope="module")
def server():
    s = Server("--parallel", "2", "--queue-size", "2", "--api-key", KEY, "--timeout", "2",
               "--header-timeout", "1", "--max-body-size", str(BODY_LIMIT))
    yield s
    s.stop()


@pytest.fixture(scope="module")
def strict():
    s = Server("--parallel", "1", "--api-key", KEY, "--strict-model-name", "--max-connections", "3",
               "--header-timeout", "1")
    yield s
    s.stop()


def post(server, path, body):
    return http(server.url + path, json.dumps(body) if not isinstance(body, (str, bytes)) else body, key=KEY)


def chat(content="x", **extra):
    return {"messages": [{"role": "user", "content": content}], **extra}


SCHEMA_NUMBER = {"type": "json_schema", "json_schema": {"schema": {
    "type": "object", "properties": {"x": {"type": "number"}}, "required": ["x"], "additionalProperties": False}}}

# ---------------------------------------------------------------- 1 and 3: refused before the work

REFUSED = [  # (what, path, body, status, param, the message's pattern)
    ("body over --max-body-size", "/v1/completions", {"prompt": "a" * BODY_LIMIT}, 413, None, r"at most 200000"),
    ("prompts x n past slots + queue", "/v1/completions", {"prompt": [[1]] * 3, "n": 2}, 400, "n",
     r"needs 6 sequences \(3 prompts x n=2\); this server holds 4"),
    ("forty thousand one-token prompts, by counting", "/v1/completions", '{"prompt": [' + "[1]," * 39_999 + "[1]]}",
     400, "prompt", r"needs 40000 sequences"),
    ("many embedding inputs", "/v1/embeddings", {"input": ["a"] * 5}, 400, "input", r"needs 5 sequences"),
    ("too many messages", "/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}] * 1025},
     400, "messages", r"1025 messages; .* at most 1024"),
    ("too many stop strings", "/v1/completions", {"prompt": "x", "stop": ["a"] * 17}, 400, "stop", r"17 strings"),
    ("a stop string too long", "/v1/completions", {"prompt": "x", "stop": ["a" * 257]}, 400, "stop",
     r"257 characters"),
    ("too many tools", "/v1/chat/completions", chat(tools=[{}] * 129), 400, "tools", r"129 tools"),
    ("too many logit_bias entries", "/v1/completions", {"prompt": "x", "logit_bias": {str(i): 1 for i in range(1025)}},
     400, "logit_bias", r"1025 entries"),
    ("grammar too large", "/v1/completions", {"prompt": "x", "grammar": 'root ::= "' + "a" * 70_000 + '"'},
     400, "grammar", r"70011 characters"),
    ("schema too large", "/v1/completions", {"prompt": "x", "response_format": {"type": "json_schema", "json_schema": {
        "schema": {"type": "object", "properties": {f"p{i}": {"type": "string"} for i in range(5000)}}}}},
     400, "response_format", r"characters of JSON"),
    ("prompt text longer than any context, untokenized", "/v1/completions", {"prompt": "a" * 190_000}, 400, "prompt",
     r"190000 characters, more than 512 tokens"),
    ("chat text longer than any context", "/v1/chat/completions", chat("a" * 190_000), 400, "messages",
     r"characters, more than 512 tokens"),
    ("token list longer than the context", "/v1/completions", {"prompt": [10**9] * 600}, 400, "prompt",
     r"600 tokens"),
    ("lone surrogate in a prompt", "/v1/completions", '{"prompt": "ab\\ud800c"}', 400, "prompt", r"lone UTF-16"),
    ("lone surrogate in a message", "/v1/chat/completions",
     '{"messages": [{"role": "user", "content": "\\udfff"}]}', 400, "messages", r"lone UTF-16"),
    ("lone surrogate in a stop string", "/v1/completions", '{"prompt": "a", "stop": ["\\ud83d"]}', 400, "stop",
     r"lone UTF-16"),
    ("grammar whose language is empty", "/v1/completions", {"prompt": "x", "grammar": 'root ::= x\nx ::= x "a"'},
     400, "grammar", r"can produce no string"),
    ("schema whose language is empty", "/v1/completions", {"prompt": "x", "response_format": {
        "type": "json_schema", "json_schema": {"schema": {"type": "integer", "minimum": 5, "maximum": 1}}}},
     400, "response_format", r"[Uu]nsatisfiable|no string"),
    ("float seed", "/v1/completions", {"prompt": "x", "seed": 1.5}, 400, "seed", r"integer"),
]


@pytest.mark.parametrize("what,path,body,status,param,pattern", REFUSED, ids=[r[0] for r in REFUSED])
def test_refused_before_the_work(server, what, path, body, status, param, pattern):
    code, answer = post(server, path, body)
    assert code == status, answer
    assert answer["error"]["param"] == param and re.search(pattern, answer["error"]["message"]), answer


@pytest.mark.parametrize("grammar", ['root ::= "' + "a" * 60_000, "root ::= " + "(" * 60_000],
                         ids=["unterminated literal", "unbalanced"])
def test_a_huge_grammar_is_not_echoed(server, grammar):
    code, answer = post(server, "/v1/completions", {"prompt": "x", "grammar": grammar})
    assert code == 400 and answer["error"]["param"] == "grammar"
    assert len(json.dumps(answer)) < 2000


SEEDS = [2**64, -(2**63) - 1, 10**40, -1, 2**32 - 1]


@pytest.mark.parametrize("seed", SEEDS)
def test_any_integer_seed_is_served(server, seed):
    code, answer = post(server, "/v1/completions", {"prompt": "Once", "max_tokens": 3, "seed": seed})
    assert code == 200, answer


def test_seeds_wrap_to_uint32(server):
    """As llama-server (a uint32 seed): s and s + 2^32 draw the same tokens."""
    texts = {post(server, "/v1/completions", {"prompt": "Once", "max_tokens": 8, "seed": s, "temperature": 1.5,
                                               "min_p": 0, "top_k": 0})[1]["choices"][0]["text"]
             for s in (7, 7 + 2**32, 7 - 2**32, 7 + 2**70)}
    assert len(texts) == 1


MODEL_NAMES = [("/v1/completions", {"prompt": "x", "max_tokens": 1}), ("/v1/chat/completions", chat(max_tokens=1)),
               ("/v1/embeddings", {"input": "x"})]


@pytest.mark.parametrize("path,body", MODEL_NAMES, ids=[p for p, _ in MODEL_NAMES])
def test_any_model_name_is_served_unless_strict(server, strict, path, body):
    assert post(server, path, {**body, "model": "gpt-17"})[0] == 200
    code, answer = post(strict, path, {**body, "model": "gpt-17"})
    assert code == 404 and answer["error"]["param"] == "model"
    assert post(strict, path, {**body, "model": strict.model_id})[0] == 200


# ---------------------------------------------------------------- 2. timeouts and connections

def _closed_by_server(sock: socket.socket, wait: float) -> bool:
    sock.settimeout(wait)
    try:
        return sock.recv(1) == b""
    except socket.timeout:
        return False
    except ConnectionResetError:
        return True


def _status(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=30) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code


def test_a_slow_header_client_is_cut_off(server):
    with socket.create_connection(("127.0.0.1", server.port)) as sock:
        sock.sendall(b"GET /health HTTP/1.1\r\nHo")  # ... and nothing more: --header-timeout 1
        for _ in range(5):  # a byte now and then does not keep it open
            time.sleep(0.1)
            sock.sendall(b"s")
        assert _closed_by_server(sock, 30)


def test_a_body_that_does_not_arrive_is_408(server):
    with socket.create_connection(("127.0.0.1", server.port)) as sock:
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + KEY.encode()
                     + b"\r\nContent-Length: 100\r\n\r\n{\"prompt\"")
        sock.settimeout(30)
        reply = b""
        while b"--timeout" not in reply:  # the headers and the body may come in separate reads
            chunk = sock.recv(4096)
            if not chunk:
                break
            reply += chunk
    assert reply.startswith(b"HTTP/1.1 408") and b"--timeout" in reply


def test_connection_bound_answers_503_and_recovers(strict):
    idle = [socket.create_connection(("127.0.0.1", strict.port)) for _ in range(3)]  # --max-connections 3
    try:
        assert _status(strict.url + "/health") == 503  # uvicorn's plain-text "Service Unavailable"
        for sock in idle:  # --header-timeout 1 closes them ...
            assert _closed_by_server(sock, 30)
    finally:
        for sock in idle:
            sock.close()
    assert http(strict.url + "/health")[0] == 200  # ... and the server takes clients again


def test_a_stream_whose_client_stops_reading_is_cancelled():
    """The write bound (--timeout): a send that does not complete cancels the request's jobs. (Over
    a loopback socket the demo model's longest stream fits the kernel's buffers, so the bound is
    driven here with a send that never completes.)"""
    from torchggml.server.app import AuthAndCount, StalledClient

    class State:
        ready, requests = True, __import__("collections").Counter()

    class FakeJob:
        cancelled = False

        def cancel(self):
            self.cancelled = True

    job = FakeJob()

    async def app(scope, receive, send):
        scope["torchggml.jobs"].append(job)
        await send({"type": "http.response.start", "status": 200, "headers": []})

    async def never(message):
        await asyncio.Event().wait()

    middleware = AuthAndCount(app, State(), None, {"/v1/completions"}, write_timeout=0.05)
    with pytest.raises(StalledClient):
        asyncio.run(middleware({"type": "http", "path": "/v1/completions", "headers": []}, None, never))
    assert job.cancelled and State.requests[("/v1/completions", 200)] == 1


def test_a_sequence_past_its_deadline_ends_with_length():
    from torchggml.gguf.writer.demo import demo_model_path
    from torchggml.models import load_model
    from torchggml.models.generation import Generation
    from torchggml.models.sampling import SamplingParams
    from torchggml.server.engine import Engine, Job
    model = load_model(demo_model_path())
    engine = Engine(model, parallel=1)
    try:
        events, done = [], __import__("threading").Event()
        ids = model.tokenize("Once")

        def emit(e):
            events.append(e)
            if e[0] == "done":
                done.set()
        gen = Generation(model.tokenizer, ids, SamplingParams(temperature=0), 200, ignore_eos=True)
        engine.submit([Job(ids, emit, gen, deadline=time.monotonic() - 1)])
        assert done.wait(120)
        assert gen.finish_reason == "length" and gen.n_generated == 0  # ended at its first step
    finally:
        engine.stop()
        model.close()


# ---------------------------------------------------------------- 4. JSON-schema numbers end

NUMBER_SCHEMAS = [
    {"type": "object", "properties": {"x": {"type": "number"}}, "required": ["x"], "additionalProperties": False},
    {"type": "object", "properties": {"n": {"type": "integer"}, "f": {"type": "number"}}, "required": ["n", "f"],
     "additionalProperties": False},
    {"type": "array", "items": {"type": "number"}, "minItems": 2, "maxItems": 2},
]


@pytest.fixture(scope="module")
def vocab():
    from torchggml.gguf.writer.demo import demo_model_path
    from torchggml.models import load_model
    from torchggml.server.grammar import Vocabulary
    model = load_model(demo_model_path())
    yield Vocabulary(model.tokenizer)
    model.close()


@pytest.mark.parametrize("schema", NUMBER_SCHEMAS, ids=["number", "integer-and-number", "array"])
def test_numbers_are_bounded_as_llama_cpp_bounds_them(vocab, schema):
    """A sampler that always prefers another digit still ends in valid JSON, each digit run at
    most 16 long (llama.cpp's integral-part, decimal-part and exponent)."""
    from torchggml.server.grammar import MAX_DIGITS, Constraint
    c = Constraint(vocab, vocab.compile("json_schema", schema), json_bounds=True)
    prefer = [vocab.pieces.index(p) for p in (b"7", b".", b"e", b",")]
    out = b""
    for _ in range(400):
        if c.is_complete():
            break
        allowed = c.allowed()
        token = next((t for t in prefer if allowed[t]), int(allowed.nonzero()[0]))
        c.accept(token)
        out += vocab.pieces[token]
    text = out.decode()
    json.loads(text)
    assert max(len(run) for run in re.findall(r"[0-9]+", text)) == MAX_DIGITS


@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_schema_output_with_numbers_parses(server, temperature):
    for seed in range(10):
        code, answer = post(server, "/v1/completions", {"prompt": "Value:", "max_tokens": 200, "seed": seed,
                                                         "temperature": temperature, "response_format": SCHEMA_NUMBER})
        assert code == 200, answer
        choice = answer["choices"][0]
        assert choice["finish_reason"] == "stop" and isinstance(json.loads(choice["text"])["x"], (int, float))


# ---------------------------------------------------------------- 5. readiness

def test_health_is_503_loading_until_the_model_is_ready():
    from torchggml.server.app import AuthAndCount, ServerState

    async def app(scope, receive, send):
        raise AssertionError("not reached while loading")

    sent = []

    async def send(message):
        sent.append(message)
    state = ServerState(None, None, "demo")
    middleware = AuthAndCount(app, state, None, {"/health"}, write_timeout=1)
    asyncio.run(middleware({"type": "http", "path": "/health", "headers": [], "method": "GET"}, None, send))
    assert sent[0]["status"] == 503
    assert json.loads(sent[1]["body"]) == {"error": {"code": 503, "message": "Loading model",
                                                     "type": "unavailable_error"}}
    state.pool.shutdown()


# ---------------------------------------------------------------- 6. metrics, stop strings, shutdown

def test_metrics_count_routes_not_paths_and_escape_labels(server):
    for path in ("/x%22%7D%201%0Atorchggml_injected_total%201", "/random/a", "/random/b"):
        assert http(server.url + path, key=KEY)[0] == 404
    req = urllib.request.Request(server.url + "/metrics", headers={"Authorization": f"Bearer {KEY}"})
    text = urllib.request.urlopen(req, timeout=30).read().decode()
    assert "injected" not in text and "/random" not in text
    assert re.search(r'^torchggml_requests_total\{path="other",status="404"\} [3-9]', text, re.M)


def _naive(stops, pieces):
    """The definition: the earliest start of any stop in the text so far; hold the longest tail
    that begins one."""
    shown, text, held = [], "", ""
    for piece in pieces:
        text = held + piece
        cuts = [i for i in (text.find(s) for s in stops) if i >= 0]
        if cuts:
            return shown + [text[:min(cuts)]], True
        keep = max((k for s in stops for k in range(1, len(s)) if k <= len(text) and text.endswith(s[:k])), default=0)
        held = text[len(text) - keep:]
        shown.append(text[:len(text) - keep])
    return shown + [held], False


STOP_CASES = [
    (["abcd", "bc"], ["a", "bcd"]),
    (["abcd", "bc"], ["ab", "c"]),
    (["\n\n", "END"], ["hello\n", "\nworld"]),
    (["aab"], ["a", "a", "a", "b", "c"]),
    (["xyz"], ["xy", "xy", "z"]),
    (["é", "ü!"], ["caf", "é"]),
]


@pytest.mark.parametrize("stops,pieces", STOP_CASES)
def test_stop_strings_match_their_definition(stops, pieces):
    s = StopStrings(stops)
    shown = [s.push(p) for p in pieces if not s.stopped]
    assert (shown + [s.flush()], s.stopped) == _naive(stops, pieces) or (shown, s.stopped) == _naive(stops, pieces)


def test_stop_strings_match_their_definition_on_random_texts():
    rng = random.Random(43)
    for _ in range(3000):
        stops = ["".join(rng.choice("ab") for _ in range(rng.randint(1, 5))) for _ in range(rng.randint(1, 4))]
        pieces = ["".join(rng.choice("abc") for _ in range(rng.randint(0, 4))) for _ in range(rng.randint(1, 8))]
        s = StopStrings(stops)
        shown = []
        for p in pieces:
            if s.stopped:
                break
            shown.append(s.push(p))
        expected, stopped = _naive(stops, pieces)
        got = shown + ([] if s.stopped else [s.flush()])
        assert ("".join(got), s.stopped) == ("".join(expected), stopped), (stops, pieces)


def test_sigterm_while_a_request_is_read_exits_cleanly():
    s = Server("--parallel", "1")
    try:
        with socket.create_connection(("127.0.0.1", s.port)) as sock:
            sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 1000000\r\n\r\n{\"prompt\": \"")
            time.sleep(0.5)
            s.proc.send_signal(signal.SIGTERM)
            # it exits (uvicorn re-raises the signal once it has shut down: -SIGTERM is its clean exit)
            assert s.proc.wait(timeout=60) in (0, -signal.SIGTERM)
            assert "Traceback" not in s.proc.stdout.read()
    finally:
        s.stop()
