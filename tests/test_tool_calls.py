"""Tool calls and reasoning in replies (server/tool_calls.py): each template family's markers parsed
into OpenAI tool_calls, thinking split off, and the grammars that force a call."""
from __future__ import annotations

import json

import pytest

from torchggml.server.tool_calls import Reply, split_reasoning, tool_format

WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "the weather in a city",
                                            "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12}},
                                                           "required": ["city"]}}}
TIME = {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object", "properties": {}}}}

# a line of each family's template: what tool_format recognises
TEMPLATES = {
    "hermes": "{% for tool in tools %}{{ tool | tojson }}{% endfor %}<tool_call>",
    "llama3": "<|start_header_id|>ipython<|end_header_id|>{{ '<|python_tag|>' }}",
    "mistral": "[AVAILABLE_TOOLS]{{ tools | tojson }}[/AVAILABLE_TOOLS][TOOL_CALLS]",
    "harmony": "<|start|>assistant<|channel|>final<|message|>",
    "deepseek": "<｜Assistant｜><｜tool▁calls▁begin｜><｜tool▁call▁begin｜>",
    "generic": "{% for m in messages %}{{ m.content }}{% endfor %}",
}


@pytest.mark.parametrize("family", list(TEMPLATES))
def test_each_template_family_is_recognised(family):
    assert tool_format(TEMPLATES[family]).name == family


def _calls(reply: Reply):
    return [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in reply.tool_calls]


@pytest.mark.parametrize("family, text, content, calls", [
    ("hermes", 'Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>',
     "Let me check.", [("get_weather", {"city": "Paris"})]),
    ("hermes", '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>\n'
               '<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>',
     "", [("get_weather", {"city": "Oslo"}), ("get_time", {})]),
    ("hermes", "Just text, no call.", "Just text, no call.", []),
    ("llama3", '<|python_tag|>{"name": "get_weather", "parameters": {"city": "Rome"}}', "",
     [("get_weather", {"city": "Rome"})]),
    ("llama3", '{"name": "get_time", "parameters": {}}', "", [("get_time", {})]),
    ("llama3", "The answer is {not json}.", "The answer is {not json}.", []),
    ("mistral", '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Lima"}}]', "",
     [("get_weather", {"city": "Lima"})]),
    ("mistral", 'Sure.[TOOL_CALLS]get_weather[ARGS]{"city": "Kyiv"}', "Sure.", [("get_weather", {"city": "Kyiv"})]),
    ("deepseek", 'Checking.<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n'
                 '{"city": "Cairo"}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>', "Checking.",
     [("get_weather", {"city": "Cairo"})]),
    ("generic", '{"tool_calls": [{"name": "get_weather", "arguments": {"city": "Quito"}}]}', "",
     [("get_weather", {"city": "Quito"})]),
    ("generic", '{"response": "Hello!"}', "Hello!", []),
    ("generic", "plain words", "plain words", []),
])
def test_tool_calls_are_parsed(family, text, content, calls):
    reply = tool_format(TEMPLATES[family]).parse(text)
    assert reply.content == content and _calls(reply) == calls
    assert all(c["id"].startswith("call_") and c["type"] == "function" for c in reply.tool_calls)


def test_harmony_channels_are_reasoning_answer_and_calls():
    fmt = tool_format(TEMPLATES["harmony"])
    text = ("<|channel|>analysis<|message|>The user wants weather.<|end|><|start|>assistant"
            "<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{\"city\": \"Bern\"}<|call|>")
    reply = fmt.parse(text)
    assert reply.reasoning == "The user wants weather." and reply.content == ""
    assert _calls(reply) == [("get_weather", {"city": "Bern"})]
    answer = fmt.parse("<|channel|>analysis<|message|>Easy.<|end|><|start|>assistant<|channel|>final<|message|>Hi!")
    assert (answer.reasoning, answer.content, answer.tool_calls) == ("Easy.", "Hi!", [])


@pytest.mark.parametrize("text, opened, reasoning, rest", [
    ("<think>\nweigh it\n</think>\n\nYes.", False, "weigh it", "Yes."),
    ("weigh it</think>Yes.", True, "weigh it", "Yes."),  # the prompt opened the block (DeepSeek R1)
    ("No thinking here.", False, None, "No thinking here."),
])
def test_reasoning_is_split_off(text, opened, reasoning, rest):
    assert split_reasoning(text, opened) == (reasoning, rest)


@pytest.mark.parametrize("family, choice", [
    ("hermes", "required"), ("llama3", "required"), ("mistral", {"type": "function", "function": {"name": "get_weather"}}),
    ("generic", "auto"), ("generic", "required"),
])
def test_a_forced_call_is_always_a_parsable_call(family, choice):
    """The grammar of tool_choice required (or a named tool) holds even a model of seeded random
    weights to a call of the right tool with arguments of its schema."""
    pytest.importorskip("llguidance")
    from torchggml.gguf.writer.demo import demo_model_path
    from torchggml.models import load_model
    from torchggml.server.grammar import Constraint, Vocabulary
    fmt = tool_format(TEMPLATES[family])
    model = load_model(demo_model_path(), progress=False)
    try:
        vocab = Vocabulary(model.tokenizer)
        grammar = vocab.compile("grammar", fmt.grammar([WEATHER, TIME], choice))
        text = "".join(model.generate("Weather?", max_tokens=200, temperature=0.8, seed=1,
                                      constraint=Constraint(vocab, grammar)))
    finally:
        model.close()
    reply = fmt.parse(text)
    if family == "generic" and choice == "auto" and not reply.tool_calls:
        assert json.loads(text)["response"] == reply.content  # it answered instead: allowed
        return
    names = {name for name, _ in _calls(reply)}
    assert reply.tool_calls and names <= ({"get_weather"} if isinstance(choice, dict) else {"get_weather", "get_time"}), text


@pytest.mark.parametrize("pieces, opened, reasoning, content", [
    (["<th", "ink>weigh", " it</th", "ink>\n\nYes", "."], False, "weigh it", "Yes."),
    (["weigh", " it</think>", "Yes."], True, "weigh it", "Yes."),
    (["No ", "thinking."], False, "", "No thinking."),
])
def test_streamed_reasoning_is_split_as_it_comes(pieces, opened, reasoning, content):
    from torchggml.server.tool_calls import ReplyStream
    stream = ReplyStream(tool_format("{{ '<think>' }}"), tools=False, reasoning=True, opened_think=opened)
    deltas = [d for piece in pieces for d in stream.push(piece)] + stream.finish()[0]
    assert "".join(d.get("reasoning_content", "") for d in deltas) == reasoning
    assert "".join(d.get("content", "") for d in deltas) == content


def test_streamed_tool_calls_come_whole_at_the_end():
    from torchggml.server.tool_calls import ReplyStream
    stream = ReplyStream(tool_format(TEMPLATES["hermes"]), tools=True, reasoning=True)
    text = 'Checking.\n<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>'
    assert all(stream.push(c) == [] for c in text)
    deltas, called = stream.finish()
    assert called and deltas[0] == {"content": "Checking."}
    assert deltas[1]["tool_calls"][0]["index"] == 0 and deltas[1]["tool_calls"][0]["function"]["name"] == "get_time"
