"""/v1/messages (Anthropic's Messages API) through the official `anthropic` SDK, on the demo model
served in this process: text equal to the chat endpoint's, a stream of Anthropic's events that
adds up to the whole message, stop reasons, a two-turn tool_use / tool_result exchange (the demo
has no template: the generic JSON format, held by its grammar), count_tokens, bad input."""
from __future__ import annotations

import pytest

anthropic = pytest.importorskip("anthropic", reason="the Messages API tests need the anthropic SDK (pip install -e '.[test]')")

from conftest import serving  # noqa: E402
from torchggml.models import load_model  # noqa: E402

KEY = "k-123"
WEATHER = {"name": "get_weather", "description": "The weather in a city",
           "input_schema": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 10}},
                            "required": ["city"]}}
GREEDY = {"temperature": 0}  # the SDK no longer takes temperature: Anthropic's API still does
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]


@pytest.fixture(scope="module")
def served(demo_path):
    model = load_model(demo_path, progress=False)
    with serving(model, api_key=KEY) as http:
        http.headers["Authorization"] = f"Bearer {KEY}"  # the plain requests; the SDK sends X-Api-Key
        yield http, anthropic.Anthropic(base_url="http://testserver", api_key=KEY, http_client=http, max_retries=0)
    model.close()


def chat_text(http, messages, **fields) -> dict:
    r = http.post("/v1/chat/completions", json={"messages": messages, "temperature": 0, **fields})
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]


CASES = [  # (system, messages as Anthropic writes them, the same as chat messages)
    (None, [{"role": "user", "content": "Hello"}], [{"role": "user", "content": "Hello"}]),
    ("Be brief.", [{"role": "user", "content": [{"type": "text", "text": "Hel"}, {"type": "text", "text": "lo"}]}],
     [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello"}]),
    ([{"type": "text", "text": "Be brief."}],
     [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!"}, {"role": "user", "content": "More"}],
     [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
      {"role": "assistant", "content": "Hello!"}, {"role": "user", "content": "More"}]),
]


@pytest.mark.parametrize("system,messages,as_chat", CASES)
def test_message_is_the_chat_answer(served, system, messages, as_chat):
    http, client = served
    extra = {} if system is None else {"system": system}
    m = client.messages.create(model="tiny", max_tokens=8, extra_body=GREEDY, messages=messages, **extra)
    expect = chat_text(http, as_chat, max_tokens=8)
    assert m.type == "message" and m.role == "assistant" and m.content[0].type == "text"
    assert m.content[0].text == expect["message"]["content"]
    assert m.stop_reason == {"length": "max_tokens", "stop": "end_turn"}[expect["finish_reason"]]
    assert m.usage.output_tokens <= 8 and m.usage.input_tokens > 0
    assert client.messages.count_tokens(model="tiny", messages=messages, **extra).input_tokens == m.usage.input_tokens


def test_stream_adds_up_to_the_message(served):
    _, client = served
    args = dict(model="tiny", max_tokens=10, extra_body=GREEDY, messages=ASK)
    whole = client.messages.create(**args)
    with client.messages.stream(**args) as stream:
        events = list(stream)
        final = stream.get_final_message()
    kinds = [e.type for e in events]
    assert kinds[0] == "message_start" and kinds[-1] == "message_stop" and "message_delta" in kinds
    assert kinds.count("content_block_start") == kinds.count("content_block_stop") == 1
    assert final.content[0].text == whole.content[0].text and final.stop_reason == whole.stop_reason
    assert final.usage.output_tokens == whole.usage.output_tokens


def test_stop_sequence(served):
    _, client = served
    full = client.messages.create(model="tiny", max_tokens=10, extra_body=GREEDY, messages=ASK).content[0].text
    word = full[4:6]
    m = client.messages.create(model="tiny", max_tokens=10, extra_body=GREEDY, messages=ASK, stop_sequences=[word])
    assert m.content[0].text == full[:full.index(word)]
    assert m.stop_reason == "stop_sequence" and m.stop_sequence == word


@pytest.mark.parametrize("stream,choice", [(False, {"type": "any"}), (True, {"type": "any"}),
                                           (False, {"type": "tool", "name": "get_weather"})])
def test_a_two_turn_tool_use(served, stream, choice):
    _, client = served
    args = dict(model="tiny", max_tokens=64, extra_body=GREEDY, tools=[WEATHER], tool_choice=choice)
    if stream:
        with client.messages.stream(messages=ASK, **args) as s:
            first = s.get_final_message()
    else:
        first = client.messages.create(messages=ASK, **args)
    assert first.stop_reason == "tool_use"
    use = [b for b in first.content if b.type == "tool_use"][0]
    assert use.name == "get_weather" and set(use.input) == {"city"} and use.id
    messages = ASK + [{"role": "assistant", "content": [b.model_dump() for b in first.content]},
                      {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "21 C"}]}]
    second = client.messages.create(messages=messages, model="tiny", max_tokens=6, extra_body=GREEDY, tools=[WEATHER],
                                    tool_choice={"type": "none"})
    assert second.stop_reason in ("end_turn", "max_tokens") and second.content[0].type == "text"


BAD = [  # (body, the message's words)
    ({"max_tokens": 5, "messages": []}, "messages"),
    ({"max_tokens": 5, "messages": [{"role": "system", "content": "x"}]}, "messages"),
    ({"max_tokens": 5, "messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]}, "image source"),
    ({"max_tokens": 5, "messages": [{"role": "user", "content": [{"type": "image", "source": {
        "type": "base64", "media_type": "text/plain", "data": "aGk="}}]}]}, "media_type image/"),
    ({"max_tokens": 5, "messages": [{"role": "user", "content": [{"type": "image", "source": {
        "type": "base64", "media_type": "image/png", "data": "aGk="}}]}]}, "--mmproj"),
    ({"max_tokens": 5, "messages": [{"role": "assistant", "content": [{"type": "image", "source": {
        "type": "url", "url": "http://x"}}]}]}, "'image' block is not supported in a assistant"),
    ({"max_tokens": -1, "messages": ASK}, "max_tokens"),
    ({"max_tokens": 5, "messages": ASK, "tools": [WEATHER], "tool_choice": {"type": "tool"}}, "name"),
]


@pytest.mark.parametrize("body,words", BAD)
def test_bad_input(served, body, words):
    r = served[0].post("/v1/messages", json=body)
    assert r.status_code == 400 and words in r.json()["error"]["message"], r.text


def _events(chunks, job_prompt=(1, 2, 3)):
    """message_events over these OpenAI chunks: the (event, data) pairs it sends."""
    import asyncio
    import json
    from types import SimpleNamespace
    from torchggml.server.anthropic import message_events

    async def source():
        for c in chunks:
            yield c
    request = SimpleNamespace(scope={"torchggml.jobs": [SimpleNamespace(prompt=list(job_prompt), gen=None)]})

    async def run():
        return [text async for text in message_events(source(), request, "m", "msg_1")]
    out = []
    for text in asyncio.run(run()):
        for block in filter(None, text.split("\n\n")):
            event, data = block.split("\n")
            out.append((event[len("event: "):], json.loads(data[len("data: "):])))
    return out


def _chunk(delta=None, finish=None, usage=None):
    if usage is not None:
        return {"choices": [], "usage": usage}
    return {"choices": [{"index": 0, "delta": delta or {}, "finish_reason": finish}]}


def test_stream_blocks_thinking_text_and_tool_use():
    """A reasoning model's reply that calls a tool: a thinking block, a text block, a tool_use
    block (its input as one input_json_delta), each started and stopped in order."""
    call = {"index": 0, "id": "call_1", "type": "function", "function": {"name": "f", "arguments": '{"a": 1}'}}
    events = _events([_chunk({"role": "assistant", "content": ""}), _chunk({"reasoning_content": "hm"}),
                      _chunk({"reasoning_content": "m"}), _chunk({"content": "ok"}),
                      _chunk({"tool_calls": [call]}, "tool_calls"),
                      _chunk(usage={"prompt_tokens": 3, "completion_tokens": 5, "total_tokens": 8})])
    kinds = [(e, d.get("index"), (d.get("content_block") or d.get("delta") or {}).get("type")) for e, d in events]
    assert kinds == [("message_start", None, None),
                     ("content_block_start", 0, "thinking"), ("content_block_delta", 0, "thinking_delta"),
                     ("content_block_delta", 0, "thinking_delta"), ("content_block_stop", 0, None),
                     ("content_block_start", 1, "text"), ("content_block_delta", 1, "text_delta"),
                     ("content_block_stop", 1, None),
                     ("content_block_start", 2, "tool_use"), ("content_block_delta", 2, "input_json_delta"),
                     ("content_block_stop", 2, None), ("message_delta", None, None), ("message_stop", None, None)]
    assert events[0][1]["message"]["usage"]["input_tokens"] == 3
    assert events[-2][1]["delta"]["stop_reason"] == "tool_use" and events[-2][1]["usage"]["output_tokens"] == 5
    assert events[9][1]["delta"]["partial_json"] == '{"a": 1}' and events[8][1]["content_block"]["name"] == "f"
