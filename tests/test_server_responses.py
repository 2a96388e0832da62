"""/v1/responses (OpenAI's Responses API) through the official openai client's
client.responses.create, on the demo model served in this process: text equal to the chat
endpoint's, instructions and item lists, a stream whose deltas add up to the whole response, a
two-turn function call (function_call, then function_call_output), incomplete at
max_output_tokens, bad input."""
from __future__ import annotations

import json

import pytest

openai = pytest.importorskip("openai", reason="the Responses API tests need the openai client")

from conftest import serving  # noqa: E402
from torchggml.models import load_model  # noqa: E402

WEATHER = {"type": "function", "name": "get_weather", "description": "The weather in a city",
           "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 10}},
                          "required": ["city"]}}


@pytest.fixture(scope="module")
def served(demo_path):
    model = load_model(demo_path, progress=False)
    with serving(model) as http:
        yield http, openai.OpenAI(base_url="http://testserver/v1", api_key="none", http_client=http, max_retries=0)
    model.close()


def chat(http, messages, **fields) -> dict:
    r = http.post("/v1/chat/completions", json={"messages": messages, "temperature": 0, **fields})
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]


CASES = [  # (instructions, input, the same as chat messages)
    (None, "Hello", [{"role": "user", "content": "Hello"}]),
    ("Be brief.", "Hello", [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello"}]),
    (None, [{"role": "developer", "content": "Be brief."},
            {"role": "user", "content": [{"type": "input_text", "text": "Hi"}]},
            {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Hello!"}]},
            {"role": "user", "content": "More"}],
     [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
      {"role": "assistant", "content": "Hello!"}, {"role": "user", "content": "More"}]),
]


@pytest.mark.parametrize("instructions,input,as_chat", CASES)
def test_response_is_the_chat_answer(served, instructions, input, as_chat):
    http, client = served
    r = client.responses.create(model="tiny", input=input, instructions=instructions, max_output_tokens=8,
                                temperature=0)
    expect = chat(http, as_chat, max_tokens=8)
    assert r.output_text == expect["message"]["content"] and r.output[0].type == "message"
    assert r.status == {"length": "incomplete", "stop": "completed"}[expect["finish_reason"]]
    assert r.status != "incomplete" or r.incomplete_details.reason == "max_output_tokens"
    assert r.usage.output_tokens <= 8 and r.usage.total_tokens == r.usage.input_tokens + r.usage.output_tokens


def test_stream_adds_up_to_the_response(served):
    _, client = served
    args = dict(model="tiny", input="Tell me a story", max_output_tokens=10, temperature=0)
    whole = client.responses.create(**args)
    events = list(client.responses.create(stream=True, **args))
    kinds = [e.type for e in events]
    assert kinds[:2] == ["response.created", "response.in_progress"] and kinds[-1] == f"response.{whole.status}"
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == whole.output_text
    assert events[-1].response.output_text == whole.output_text
    assert kinds.count("response.output_item.added") == kinds.count("response.output_item.done") == 1


@pytest.mark.parametrize("stream", [False, True])
def test_a_two_turn_function_call(served, stream):
    _, client = served
    args = dict(model="tiny", tools=[WEATHER], tool_choice="required", max_output_tokens=64, temperature=0)
    ask = [{"role": "user", "content": "What is the weather in Paris?"}]
    if stream:
        first = [e for e in client.responses.create(input=ask, stream=True, **args)][-1].response
    else:
        first = client.responses.create(input=ask, **args)
    calls = [o for o in first.output if o.type == "function_call"]
    assert calls and calls[0].name == "get_weather" and set(json.loads(calls[0].arguments)) == {"city"}
    follow = ask + [{"type": "function_call", "call_id": calls[0].call_id, "name": calls[0].name,
                     "arguments": calls[0].arguments},
                    {"type": "function_call_output", "call_id": calls[0].call_id, "output": '{"temperature": 21}'}]
    second = client.responses.create(input=follow, model="tiny", tools=[WEATHER], tool_choice="none",
                                     max_output_tokens=6, temperature=0)
    assert second.output[0].type == "message" and not [o for o in second.output if o.type == "function_call"]


@pytest.mark.parametrize("stream", [False, True])
def test_previous_response_id_continues_the_conversation(served, stream):
    """A second turn by previous_response_id answers as the chat of the whole conversation (the first
    turn's instructions not carried over, as OpenAI's); store false keeps nothing; GET and DELETE."""
    http, client = served
    args = dict(model="tiny", max_output_tokens=6, temperature=0)
    if stream:
        first = [e for e in client.responses.create(input="Hello", instructions="Be brief.", stream=True,
                                                    **args)][-1].response
    else:
        first = client.responses.create(input="Hello", instructions="Be brief.", **args)
    second = client.responses.create(input="And then?", previous_response_id=first.id, **args)
    expect = chat(http, [{"role": "user", "content": "Hello"}, {"role": "assistant", "content": first.output_text},
                         {"role": "user", "content": "And then?"}], max_tokens=6)
    assert second.output_text == expect["message"]["content"] and second.previous_response_id == first.id
    third = client.responses.create(input="Why?", previous_response_id=second.id, instructions="Be kind.", **args)
    expect = chat(http, [{"role": "system", "content": "Be kind."}, {"role": "user", "content": "Hello"},
                         {"role": "assistant", "content": first.output_text}, {"role": "user", "content": "And then?"},
                         {"role": "assistant", "content": second.output_text}, {"role": "user", "content": "Why?"}],
                  max_tokens=6)
    assert third.output_text == expect["message"]["content"]
    assert client.responses.retrieve(second.id).output_text == second.output_text
    unstored = client.responses.create(input="Hi", store=False, **args)
    assert unstored.store is False
    for rid in (unstored.id, "resp_unknown"):
        r = http.post("/v1/responses", json={"input": "x", "previous_response_id": rid})
        assert r.status_code == 400 and r.json()["error"]["code"] == "previous_response_not_found", r.text
        assert http.get(f"/v1/responses/{rid}").status_code == 404
    assert http.delete(f"/v1/responses/{first.id}").json() == {"id": first.id, "object": "response", "deleted": True}
    assert http.get(f"/v1/responses/{first.id}").status_code == 404
    assert client.responses.create(input="Go on", previous_response_id=second.id, **args).status  # still stored


def test_a_function_call_continued_by_previous_response_id(served):
    """The call's output as the next input, with previous_response_id: the chat with the call and its result."""
    http, client = served
    args = dict(model="tiny", tools=[WEATHER], max_output_tokens=64, temperature=0)
    ask = "What is the weather in Paris?"
    first = client.responses.create(input=ask, tool_choice="required", **args)
    call = next(o for o in first.output if o.type == "function_call")
    second = client.responses.create(previous_response_id=first.id, tool_choice="none", input=[
        {"type": "function_call_output", "call_id": call.call_id, "output": '{"temperature": 21}'}], **args)
    expect = chat(http, [{"role": "user", "content": ask},
                         {"role": "assistant", "content": "", "tool_calls": [
                             {"id": call.call_id, "type": "function",
                              "function": {"name": call.name, "arguments": call.arguments}}]},
                         {"role": "tool", "tool_call_id": call.call_id, "content": '{"temperature": 21}'}],
                  max_tokens=64, tools=[{"type": "function", "function": {k: WEATHER[k] for k in
                                                                          ("name", "description", "parameters")}}],
                  tool_choice="none")
    assert second.output_text == expect["message"]["content"]


def test_the_store_is_bounded():
    from torchggml.server.responses import ResponseStore
    store = ResponseStore(limit=3, chars=2000)
    for i in range(5):
        store.put({"id": f"r{i}"}, [{"role": "user", "content": "x"}])
    assert list(store.entries) == ["r2", "r3", "r4"]
    store.get("r2")  # used: the least recently used is now r3
    store.put({"id": "big"}, [{"role": "user", "content": "y" * 1500}])
    assert "r3" not in store.entries and "r2" in store.entries and store.size <= 2000
    store.put({"id": "huge"}, [{"role": "user", "content": "z" * 5000}])  # larger than the whole store
    assert "huge" not in store.entries
    assert store.delete("r2") and not store.delete("r2")


BAD = [  # (body, param, the message's words)
    ({}, "input", "input"),
    ({"input": []}, "input", "empty"),
    ({"input": [{"role": "tool", "content": "x"}]}, "input", "role"),
    ({"input": [{"type": "function_call", "name": "f"}]}, "input", "call_id"),
    ({"input": [{"type": "web_search_call"}]}, "input", "not supported"),
    ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]}, "messages", "--mmproj"),
    ({"input": [{"role": "user", "content": [{"type": "input_image", "file_id": "f"}]}]}, "input", "file_id"),
    ({"input": [{"role": "assistant", "content": [{"type": "input_image", "image_url": "x"}]}]}, "input", "user"),
    ({"input": [{"role": "user", "content": [{"type": "input_file", "file_id": "f"}]}]}, "input", "input_file"),
    ({"input": "x", "previous_response_id": "resp_1"}, "previous_response_id", "not found"),
    ({"input": "x", "max_output_tokens": -1}, "max_output_tokens", ""),
    ({"input": "x", "tool_choice": {"type": "function"}}, "tool_choice", "name"),
]


@pytest.mark.parametrize("body,param,words", BAD)
def test_bad_input(served, body, param, words):
    r = served[0].post("/v1/responses", json=body)
    assert r.status_code == 400 and r.json()["error"]["param"] == param and words in r.json()["error"]["message"], r.text


def test_stream_items_reasoning_text_and_call():
    """A reasoning model's reply that calls a function: a reasoning item, a message item, a
    function_call item, each added and done, then response.completed with all three."""
    import asyncio
    import json as json_
    from torchggml.server.responses import ResponsesRequest, response_events

    call = {"index": 0, "id": "call_1", "type": "function", "function": {"name": "f", "arguments": '{"a": 1}'}}
    chunks = [{"choices": [{"index": 0, "delta": d, "finish_reason": f}]} for d, f in (
        ({"role": "assistant", "content": ""}, None), ({"reasoning_content": "hm"}, None), ({"content": "ok"}, None),
        ({"tool_calls": [call]}, "tool_calls"))]
    chunks.append({"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 5, "total_tokens": 8}})

    async def source():
        for c in chunks:
            yield c

    async def run():
        state = type("S", (), {"model_id": "m"})()
        return [t async for t in response_events(source(), ResponsesRequest(input="x"), state, "resp_1", 0)]
    events = [json_.loads(b.split("\n")[1][len("data: "):]) for t in asyncio.run(run()) for b in filter(None, t.split("\n\n"))]
    kinds = [e["type"] for e in events]
    assert kinds == ["response.created", "response.in_progress",
                     "response.output_item.added", "response.content_part.added", "response.reasoning_text.delta",
                     "response.reasoning_text.done", "response.content_part.done", "response.output_item.done",
                     "response.output_item.added", "response.content_part.added", "response.output_text.delta",
                     "response.output_text.done", "response.content_part.done", "response.output_item.done",
                     "response.output_item.added", "response.function_call_arguments.delta",
                     "response.function_call_arguments.done", "response.output_item.done", "response.completed"]
    final = events[-1]["response"]
    assert [o["type"] for o in final["output"]] == ["reasoning", "message", "function_call"]
    assert final["output"][1]["content"][0]["text"] == "ok" and final["output"][2]["arguments"] == '{"a": 1}'
    assert final["usage"]["output_tokens"] == 5 and [e["sequence_number"] for e in events] == list(range(len(events)))
