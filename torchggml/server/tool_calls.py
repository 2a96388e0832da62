"""Tool calls and reasoning in a chat model's reply, by the family its chat template belongs to (as
llama-server tells them apart): what the model writes when it calls a function, how to split its
thinking from its answer, and the grammar that makes it call one when the request says it must.

    fmt = tool_format(chat_template)               # "hermes", "llama3", "mistral", "harmony", ...
    reply = fmt.parse(text)                        # Reply(content, reasoning, tool_calls)
    grammar = fmt.grammar(tools, tool_choice)      # Lark for llguidance, or None (unconstrained)

Families (the markers the models were trained on):
    hermes    Qwen 2.5 / 3, Hermes, SmolLM3...: <tool_call>{"name": ..., "arguments": {...}}</tool_call>
    llama3    Llama 3.1-3.3: a JSON object {"name": ..., "parameters": {...}} (after <|python_tag|>)
    mistral   Mistral / Devstral: [TOOL_CALLS][{"name": ..., "arguments": {...}}, ...] or
              [TOOL_CALLS]name[ARGS]{...}
    harmony   gpt-oss: <|channel|>commentary to=functions.NAME ... <|message|>{...}<|call|>; the
              analysis channel is its reasoning, the final channel its answer
    deepseek  DeepSeek R1 / V3: <｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME ```json {...}``` <｜tool▁call▁end｜>
    generic   any other template: the model is asked (a system message) to answer in JSON,
              {"tool_calls": [{"name": ..., "arguments": {...}}]} or {"response": "..."}, and a
              grammar holds it to that, as llama.cpp's generic format does

Reasoning: text inside <think>...</think> (or before </think> when the prompt opened the block,
as DeepSeek R1's template does) is `reasoning`; harmony's analysis channel likewise.
"""
from __future__ import annotations

import json
import re
import secrets
from dataclasses import dataclass, field


@dataclass
class Reply:
    content: str
    reasoning: str | None = None
    tool_calls: list[dict] = field(default_factory=list)  # OpenAI's: id, type, function {name, arguments}


def tool_call(name: str, arguments) -> dict:
    """One call as OpenAI returns it (arguments as a JSON string)."""
    args = arguments if isinstance(arguments, str) else json.dumps(arguments, ensure_ascii=False)
    return {"id": "call_" + secrets.token_hex(12), "type": "function", "function": {"name": name, "arguments": args}}


def split_reasoning(text: str, opened: bool = False) -> tuple[str | None, str]:
    """(reasoning, the rest): the <think> block's text, also when the prompt opened it."""
    if opened and "</think>" in text:
        thought, rest = text.split("</think>", 1)
        return thought.strip(), rest.lstrip()
    m = re.match(r"\s*<think>(.*?)</think>\s*", text, flags=re.S)
    if m:
        return m.group(1).strip(), text[m.end():]
    return None, text


def _json_objects(text: str):
    """The JSON values in `text`, in order, each from its first { or [ to where it parses."""
    decoder, i = json.JSONDecoder(), 0
    while True:
        starts = [j for j in (text.find("{", i), text.find("[", i)) if j >= 0]
        if not starts:
            return
        start = min(starts)
        try:
            value, end = decoder.raw_decode(text, start)
        except json.JSONDecodeError:
            i = start + 1
            continue
        yield start, end, value
        i = end


# compact JSON in the grammars (llguidance's x-guidance options): no whitespace to wander in
COMPACT = {"whitespace_flexible": False, "item_separator": ",", "key_separator": ":"}


def _compact(schema: dict) -> str:
    return json.dumps(dict(schema, **{"x-guidance": COMPACT}))


def _schema_of(tool: dict) -> dict:
    """A tool's parameters; an object takes only the properties it declares unless it says
    otherwise (as llama.cpp's json-schema-to-grammar reads a schema)."""
    schema = dict(tool.get("function", {}).get("parameters") or {"type": "object", "properties": {}})
    if schema.get("type") == "object":
        schema.setdefault("additionalProperties", False)
    return schema


def _names(tools) -> list[str]:
    return [t["function"]["name"] for t in tools]


def _call_schema(tools, key: str = "arguments") -> dict:
    """A JSON schema of one call of any of the tools ({"name": ..., key: its parameters})."""
    return {"anyOf": [{"type": "object", "properties": {"name": {"const": t["function"]["name"]},
                                                         key: _schema_of(t)},
                       "required": ["name", key], "additionalProperties": False} for t in tools]}


def chosen_tools(tools, tool_choice):
    """The tools a call may name: all of them, or the one tool_choice names."""
    if isinstance(tool_choice, dict):
        name = tool_choice.get("function", {}).get("name")
        picked = [t for t in tools if t["function"]["name"] == name]
        if not picked:
            raise ValueError(f"tool_choice names {name!r}, which is not among the tools ({_names(tools)})")
        return picked
    return tools


class ToolFormat:
    name = "generic"
    think = False  # the template writes <think> blocks

    def __init__(self, template: str | None = None):
        self.template = template or ""
        self.think = "<think>" in self.template

    def parse(self, text: str, opened_think: bool = False) -> Reply:
        reasoning, rest = split_reasoning(text, opened_think) if (self.think or "<think>" in text) else (None, text)
        content, calls = self.calls(rest)
        return Reply(content, reasoning, calls)

    def calls(self, text: str) -> tuple[str, list[dict]]:
        """(content, tool calls) of the reply's text after reasoning."""
        for start, end, value in _json_objects(text):
            if isinstance(value, dict) and ("tool_calls" in value or "tool_call" in value or "response" in value):
                calls = value.get("tool_calls") or ([value["tool_call"]] if "tool_call" in value else [])
                return (value.get("response") or "", [tool_call(c["name"], c.get("arguments", {}))
                                                      for c in calls if isinstance(c, dict) and "name" in c])
        return text, []

    def system_prompt(self, tools) -> str | None:
        """A system message telling the model about the tools (only where its template cannot)."""
        return ("You can call these tools. Answer with JSON only: {\"tool_calls\": [{\"name\": ..., "
                "\"arguments\": {...}}]} to call tools, or {\"response\": \"...\"} to answer.\nTools: "
                + json.dumps([t["function"] for t in tools], ensure_ascii=False))

    def grammar(self, tools, tool_choice) -> str | None:
        """A Lark grammar for llguidance holding the reply to the format (None: unconstrained)."""
        call = _call_schema(chosen_tools(tools, tool_choice))
        calls = {"type": "object", "properties": {"tool_calls": {"type": "array", "items": call, "minItems": 1}},
                 "required": ["tool_calls"], "additionalProperties": False}
        schema = calls if tool_choice == "required" or isinstance(tool_choice, dict) else {
            "anyOf": [calls, {"type": "object", "properties": {"response": {"type": "string"}},
                              "required": ["response"], "additionalProperties": False}]}
        return f"start: reply\nreply: %json {_compact(schema)}"


class Hermes(ToolFormat):
    name = "hermes"
    CALL = re.compile(r"<tool_call>\s*(.*?)\s*(?:</tool_call>|$)", re.S)

    def calls(self, text):
        calls = []
        for m in self.CALL.finditer(text):
            try:
                value = json.loads(m.group(1))
            except json.JSONDecodeError:
                continue
            if isinstance(value, dict) and "name" in value:
                calls.append(tool_call(value["name"], value.get("arguments", {})))
        content = text[:text.find("<tool_call>")] if calls else text
        return content.strip() if calls else content, calls

    def system_prompt(self, tools):
        return None  # the template lists the tools

    def grammar(self, tools, tool_choice):
        if tool_choice != "required" and not isinstance(tool_choice, dict):
            return None
        schema = _compact(_call_schema(chosen_tools(tools, tool_choice)))
        return f'start: "<tool_call>\\n" call "\\n</tool_call>"\ncall: %json {schema}'


class Llama3(ToolFormat):
    name = "llama3"

    def calls(self, text):
        body = text.split("<|python_tag|>", 1)[-1]
        stripped = body.strip()
        if stripped.startswith("{"):
            calls = []
            for _, _, value in _json_objects(stripped):
                if isinstance(value, dict) and "name" in value and ("parameters" in value or "arguments" in value):
                    calls.append(tool_call(value["name"], value.get("parameters", value.get("arguments", {}))))
            if calls:
                return "", calls
        return text, []

    def system_prompt(self, tools):
        return None

    def grammar(self, tools, tool_choice):
        if tool_choice != "required" and not isinstance(tool_choice, dict):
            return None
        return f"start: call\ncall: %json {_compact(_call_schema(chosen_tools(tools, tool_choice), 'parameters'))}"


class Mistral(ToolFormat):
    name = "mistral"

    def calls(self, text):
        if "[TOOL_CALLS]" not in text:
            return text, []
        content, rest = text.split("[TOOL_CALLS]", 1)
        calls = []
        if "[ARGS]" in rest:  # [TOOL_CALLS]name[ARGS]{...} (each call)
            for part in rest.split("[TOOL_CALLS]"):
                name, _, args = part.partition("[ARGS]")
                found = next(_json_objects(args), None)
                if name.strip() and found is not None:
                    calls.append(tool_call(name.strip(), found[2]))
        else:
            found = next(_json_objects(rest), None)
            if found is not None and isinstance(found[2], list):
                calls = [tool_call(c["name"], c.get("arguments", {})) for c in found[2]
                         if isinstance(c, dict) and "name" in c]
        return content.strip(), calls

    def system_prompt(self, tools):
        return None

    def grammar(self, tools, tool_choice):
        if tool_choice != "required" and not isinstance(tool_choice, dict):
            return None
        schema = {"type": "array", "items": _call_schema(chosen_tools(tools, tool_choice)), "minItems": 1}
        return f'start: "[TOOL_CALLS]" calls\ncalls: %json {_compact(schema)}'


class Harmony(ToolFormat):
    name = "harmony"
    MESSAGE = re.compile(r"<\|channel\|>(\w+)([^<]*)(?:<\|constrain\|>\w+)?<\|message\|>(.*?)(?:<\|end\|>|<\|call\|>|<\|return\|>|$)",
                         re.S)

    def parse(self, text, opened_think=False):
        reasoning, content, calls = [], [], []
        if "<|channel|>" not in text:
            return Reply(text)
        for channel, header, body in self.MESSAGE.findall(text):
            target = re.search(r"to=functions\.([\w.-]+)", header)
            if target:
                found = next(_json_objects(body), None)
                calls.append(tool_call(target.group(1), found[2] if found else body.strip()))
            elif channel == "analysis":
                reasoning.append(body)
            else:
                content.append(body)
        return Reply("".join(content), "".join(reasoning) or None, calls)

    def system_prompt(self, tools):
        return None

    def grammar(self, tools, tool_choice):
        return None


class DeepSeek(ToolFormat):
    name = "deepseek"
    CALL = re.compile(r"<｜tool▁call▁begin｜>(?:function)?<｜tool▁sep｜>([^\n<]+)\s*(?:```json)?\s*(.*?)\s*(?:```)?\s*<｜tool▁call▁end｜>",
                      re.S)

    def calls(self, text):
        calls = []
        for name, body in self.CALL.findall(text):
            found = next(_json_objects(body), None)
            calls.append(tool_call(name.strip(), found[2] if found else {}))
        if not calls:
            return text, []
        return text[:text.find("<｜tool▁calls▁begin｜>")].strip(), calls

    def system_prompt(self, tools):
        return None

    def grammar(self, tools, tool_choice):
        return None


def tool_format(template: str | None) -> ToolFormat:
    """The family of a chat template (see the module doc); generic when none is recognised."""
    t = template or ""
    if "<|channel|>" in t:
        return Harmony(t)
    if "tool▁calls▁begin" in t:
        return DeepSeek(t)
    if "[TOOL_CALLS]" in t:
        return Mistral(t)
    if "<tool_call>" in t:
        return Hermes(t)
    if "<|start_header_id|>" in t and ("<|python_tag|>" in t or "ipython" in t):
        return Llama3(t)
    return ToolFormat(t)


class ReplyStream:
    """One streamed choice's deltas (OpenAI's chat.completion.chunk `delta`s): with tools, the text
    is held and parsed once the reply ends (content, then tool_calls); with reasoning split, the
    <think> block streams as reasoning_content and the rest as content; otherwise text as it
    comes."""

    def __init__(self, fmt: ToolFormat, tools: bool, reasoning: bool, opened_think: bool = False):
        self.fmt, self.tools, self.opened = fmt, tools, opened_think
        self.reasoning = reasoning and (fmt.think or opened_think) and not isinstance(fmt, Harmony)
        self.hold_all = tools or (reasoning and isinstance(fmt, Harmony))
        self.text = ""      # everything so far
        self.sent = 0       # characters of self.text already sent
        self.in_think = opened_think

    def push(self, piece: str) -> list[dict]:
        self.text += piece
        if self.hold_all:
            return []
        if not self.reasoning:
            return self._flush_content()
        out = []
        while True:
            rest = self.text[self.sent:]
            if not self.in_think:
                if self.sent == 0 and rest.lstrip().startswith("<think>"):
                    self.sent += rest.index("<think>") + len("<think>")
                    self.in_think = True
                    continue
                if self.sent == 0 and "<think>".startswith(rest.lstrip()) and rest.strip():
                    return out  # may be the start of <think>
                return out + self._flush_content()
            end = rest.find("</think>")
            if end >= 0:
                if rest[:end]:
                    out.append({"reasoning_content": rest[:end]})
                self.sent += end + len("</think>")
                self.in_think = False
                # the answer's leading white space after the block is not content
                while self.sent < len(self.text) and self.text[self.sent].isspace():
                    self.sent += 1
                continue
            keep = next((k for k in range(min(len(rest), 8), 0, -1) if "</think>".startswith(rest[-k:])), 0)
            if len(rest) - keep > 0:
                out.append({"reasoning_content": rest[:len(rest) - keep]})
                self.sent += len(rest) - keep
            return out

    def _flush_content(self) -> list[dict]:
        rest = self.text[self.sent:]
        self.sent = len(self.text)
        return [{"content": rest}] if rest else []

    def finish(self) -> tuple[list[dict], bool]:
        """The last deltas, and whether the reply called tools."""
        if self.hold_all:
            reply = self.fmt.parse(self.text, self.opened)
            out = [{"reasoning_content": reply.reasoning}] if reply.reasoning else []
            if reply.content:
                out.append({"content": reply.content})
            if self.tools and reply.tool_calls:
                out.append({"tool_calls": [dict(c, index=i) for i, c in enumerate(reply.tool_calls)]})
            return out, bool(self.tools and reply.tool_calls)
        rest = self.text[self.sent:]
        self.sent = len(self.text)
        key = "reasoning_content" if self.in_think else "content"
        return ([{key: rest}] if rest else []), False
