"""`serve --mmproj`: images and audio in chat messages (OpenAI's image_url and input_audio
parts, as llama-server takes them), driven with the official openai client: the reply equals
Multimodal.chat's in-process at temperature 0; data URLs, raw base64 and file:// under
--media-path; bad media refused with the part named."""
from __future__ import annotations

import base64
import io
import json

import pytest

pytest.importorskip("PIL", reason="the vision extra (Pillow) is not installed")
pytest.importorskip("fastapi", reason="the server extra is not installed")
pytest.importorskip("openai", reason="the server tests need openai (pip install -e '.[test]')")

from PIL import Image as PILImage  # noqa: E402

from test_mtmd import synthetic_audio, synthetic_image  # noqa: E402
from test_server import KEY, Server, http  # noqa: E402
from torchggml.gguf.writer.tiny_mmproj import write_tiny_mmproj, write_tiny_text_model  # noqa: E402

MAX_TOKENS = 4


def png_bytes() -> bytes:
    buf = io.BytesIO()
    PILImage.fromarray(synthetic_image()).save(buf, format="PNG")
    return buf.getvalue()


def wav_bytes() -> bytes:
    import wave
    import numpy as np
    pcm = (np.clip(synthetic_audio(1.0), -1, 1) * 32767).astype("<i2").tobytes()
    buf = io.BytesIO()
    with wave.open(buf, "wb") as w:
        w.setnchannels(1), w.setsampwidth(2), w.setframerate(16000), w.writeframes(pcm)
    return buf.getvalue()


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("served-media")
    media = d / "media"
    media.mkdir()
    (media / "cat.png").write_bytes(png_bytes())
    (d / "outside.png").write_bytes(png_bytes())
    return {"text": write_tiny_text_model(d / "text.gguf"), "gemma3": write_tiny_mmproj(d / "gemma3.gguf", "gemma3"),
            "qwen2a": write_tiny_mmproj(d / "qwen2a.gguf", "qwen2a"), "media": str(media)}


@pytest.fixture(scope="module")
def server(files):
    s = Server(files["text"], "--mmproj", files["gemma3"], "--media-path", files["media"], "--parallel", "2",
               "--api-key", KEY)
    yield s
    s.stop()


def image_part(url: str) -> dict:
    return {"type": "image_url", "image_url": {"url": url}}


def user(*parts) -> list[dict]:
    return [{"role": "user", "content": [{"type": "text", "text": "Describe "}, *parts,
                                         {"type": "text", "text": " briefly."}]}]


def in_process(files, projector: str, messages) -> tuple[str, int]:
    """Multimodal.chat's reply and the prompt's length in positions (text tokens and media rows)."""
    from torchggml.mtmd import load_multimodal
    mm = load_multimodal(files["text"], files[projector])
    try:
        n_prompt = len(mm.model.generation(mm.parts(mm.chat_parts(messages))).prompt)
        return "".join(mm.chat(messages, max_tokens=MAX_TOKENS, temperature=0)), n_prompt
    finally:
        mm.close()


DATA_URL = "data:image/png;base64," + base64.b64encode(png_bytes()).decode()


@pytest.mark.parametrize("url", [DATA_URL, base64.b64encode(png_bytes()).decode(), "file://cat.png"],
                         ids=["data URL", "raw base64", "file under --media-path"])
def test_image_reply_equals_in_process_chat(server, files, url):
    c = server.client()
    r = c.chat.completions.create(model=server.model_id, messages=user(image_part(url)), max_tokens=MAX_TOKENS,
                                  temperature=0)
    text, n_prompt = in_process(files, "gemma3", user({"type": "image", "image": png_bytes()}))
    assert r.choices[0].message.content == text
    assert r.usage.prompt_tokens == n_prompt  # the image's rows count as prompt positions


def test_streamed_image_reply(server, files):
    c = server.client()
    stream = c.chat.completions.create(model=server.model_id, messages=user(image_part(DATA_URL)),
                                       max_tokens=MAX_TOKENS, temperature=0, stream=True)
    text = "".join(ch.choices[0].delta.content or "" for ch in stream if ch.choices)
    assert text == in_process(files, "gemma3", user({"type": "image", "image": png_bytes()}))[0]


def chat_reply(server, messages) -> str:
    return server.client().chat.completions.create(model=server.model_id, messages=messages, max_tokens=MAX_TOKENS,
                                                   temperature=0).choices[0].message.content


@pytest.mark.parametrize("source", ["base64", "url (a data URL)"])
@pytest.mark.parametrize("stream", [False, True])
def test_anthropic_image_block_is_the_chat_reply(server, source, stream):
    """/v1/messages through the anthropic client with an image block: the chat completion's reply for
    the same image_url part (temperature 0)."""
    anthropic = pytest.importorskip("anthropic", reason="the Messages API test needs the anthropic client")
    data = base64.b64encode(png_bytes()).decode()
    src = ({"type": "base64", "media_type": "image/png", "data": data} if source == "base64"
           else {"type": "url", "url": DATA_URL})
    claude = anthropic.Anthropic(base_url=server.url, api_key=KEY, max_retries=0)
    args = dict(model=server.model_id, max_tokens=MAX_TOKENS, extra_body={"temperature": 0}, messages=[{"role": "user", "content": [
        {"type": "text", "text": "Describe "}, {"type": "image", "source": src}, {"type": "text", "text": " briefly."}]}])
    if stream:
        with claude.messages.stream(**args) as s:
            text = "".join(s.text_stream)
    else:
        text = claude.messages.create(**args).content[0].text
    assert text == chat_reply(server, user(image_part(DATA_URL)))
    count = claude.messages.count_tokens(model=server.model_id, messages=args["messages"]).input_tokens  # (a beta in older SDKs)
    assert count == in_process_count(server, user(image_part(DATA_URL)))


def in_process_count(server, messages) -> int:
    """The chat's prompt positions, as the chat completion's usage counts them."""
    return server.client().chat.completions.create(model=server.model_id, messages=messages, max_tokens=1,
                                                   temperature=0).usage.prompt_tokens


@pytest.mark.parametrize("stream", [False, True])
def test_responses_input_image_is_the_chat_reply(server, stream):
    """/v1/responses through the openai client with an input_image item part: the chat completion's reply
    (temperature 0); a second turn by previous_response_id keeps the image in the conversation."""
    c = server.client()
    content = [{"type": "input_text", "text": "Describe "}, {"type": "input_image", "image_url": DATA_URL,
                                                            "detail": "auto"},
               {"type": "input_text", "text": " briefly."}]
    args = dict(model=server.model_id, max_output_tokens=MAX_TOKENS, temperature=0,
                input=[{"role": "user", "content": content}])
    r = [e for e in c.responses.create(stream=True, **args)][-1].response if stream else c.responses.create(**args)
    assert r.output_text == chat_reply(server, user(image_part(DATA_URL)))
    more = c.responses.create(model=server.model_id, max_output_tokens=MAX_TOKENS, temperature=0, input="Again",
                              previous_response_id=r.id)
    assert more.output_text == chat_reply(server, user(image_part(DATA_URL)) + [
        {"role": "assistant", "content": r.output_text}, {"role": "user", "content": "Again"}])


BAD = [  # (what, part, words in the message)
    ("file outside --media-path", image_part("file://../outside.png"), "is not allowed"),
    ("absolute file path", image_part("file:///etc/passwd"), "is not allowed"),
    ("missing file", image_part("file://nope.png"), "does not exist"),
    ("not base64", image_part("this is not base64!"), "nor valid base64"),
    ("data URL of text", image_part("data:text/plain;base64,aGVsbG8="), "a data URL must be"),
    ("corrupt image", image_part("data:image/png;base64," + base64.b64encode(b"not a png").decode()),
     "not an image Pillow can decode"),
    ("audio without an audio encoder", {"type": "input_audio", "input_audio": {
        "data": base64.b64encode(wav_bytes()).decode(), "format": "wav"}}, "has no audio encoder"),
    ("unknown part type", {"type": "video_url", "video_url": {"url": "x"}}, "unsupported content type 'video_url'"),
]


@pytest.mark.parametrize("what, part, words", BAD, ids=[b[0] for b in BAD])
def test_bad_media(server, what, part, words):
    code, answer = http(server.url + "/v1/chat/completions",
                        json.dumps({"messages": user(part), "max_tokens": 1}), key=KEY)
    assert code == 400, answer
    assert words in answer["error"]["message"] and answer["error"]["param"] == "messages"
    assert "messages[0].content[1]" in answer["error"]["message"] or what == "unknown part type"


def test_audio_part(files):
    """input_audio (a WAV, base64) through an audio projector: the reply equals the in-process chat's."""
    s = Server(files["text"], "--mmproj", files["qwen2a"], "--api-key", KEY)
    try:
        audio = {"data": base64.b64encode(wav_bytes()).decode(), "format": "wav"}
        part = {"type": "input_audio", "input_audio": audio}
        r = s.client().chat.completions.create(model=s.model_id, messages=user(part), max_tokens=MAX_TOKENS,
                                               temperature=0)
        # the Responses API's input_audio part: the same reply
        answer = s.client().responses.create(model=s.model_id, max_output_tokens=MAX_TOKENS, temperature=0, input=[
            {"role": "user", "content": [{"type": "input_text", "text": "Describe "}, part,
                                         {"type": "input_text", "text": " briefly."}]}])
    finally:
        s.stop()
    assert r.choices[0].message.content == in_process(files, "qwen2a", user({"type": "audio", "audio": wav_bytes()}))[0]
    assert answer.output_text == r.choices[0].message.content
