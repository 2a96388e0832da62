"""Chat templates (torchggml.text.chat, Model.chat, `torchggml run --chat`) and the lazily built
tokenizer of a model."""
from __future__ import annotations

import pytest

from torchggml.text.chat import ChatTemplateError, render_chat

CHATML = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
          "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
LLAMA2 = ("{{ bos_token }}{% for m in messages %}{% if m['role'] == 'user' %}[INST] {{ m['content'] }} [/INST]"
          "{% elif m['role'] == 'assistant' %} {{ m['content'] }}{{ eos_token }}"
          "{% else %}{{ raise_exception('roles must be user or assistant') }}{% endif %}{% endfor %}")
MESSAGES = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!"},
            {"role": "user", "content": "2+2?"}]


@pytest.mark.parametrize("template, add_generation_prompt, expected", [
    (CHATML, True, "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nHello!<|im_end|>\n"
                   "<|im_start|>user\n2+2?<|im_end|>\n<|im_start|>assistant\n"),
    (CHATML, False, "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nHello!<|im_end|>\n"
                    "<|im_start|>user\n2+2?<|im_end|>\n"),
    (LLAMA2, True, "<s>[INST] Hi [/INST] Hello!</s>[INST] 2+2? [/INST]"),
    ("{{ messages | tojson }}", True, '[{"role": "user", "content": "Hi"}, {"role": "assistant", '
                                      '"content": "Hello!"}, {"role": "user", "content": "2+2?"}]'),
])
def test_render_chat(template, add_generation_prompt, expected):
    assert render_chat(template, MESSAGES, add_generation_prompt=add_generation_prompt,
                       bos_token="<s>", eos_token="</s>") == expected


@pytest.mark.parametrize("template, messages, match", [
    (None, MESSAGES, "has no tokenizer.chat_template"),
    (LLAMA2, [{"role": "system", "content": "x"}], "roles must be user or assistant"),
    ("{{ messages.append(1) }}", MESSAGES, "chat template failed"),          # the sandbox is immutable
    ("{{ ''.__class__.__mro__ }}", MESSAGES, "chat template failed"),        # no attribute escapes
    ("{% for %}", MESSAGES, "does not compile"),
    (CHATML, ["hello"], "message 0 must be a mapping"),
])
def test_bad_templates_and_messages_raise(template, messages, match):
    with pytest.raises(ChatTemplateError, match=match):
        render_chat(template, messages)


@pytest.fixture(scope="module")
def chat_model_path(tmp_path_factory):
    from torchggml.gguf.writer.demo import DEMO_CONFIG, write_model
    return write_model(tmp_path_factory.mktemp("chat") / "chat.gguf", DEMO_CONFIG, "F16",
                       chat_template=CHATML)


def test_model_chat_renders_then_generates(chat_model_path):
    from torchggml.models import load_model
    model = load_model(chat_model_path, progress=False)
    prompt = model.chat_prompt(MESSAGES[:1])
    assert prompt == "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    ids = model.tokenize(prompt, parse_special=True)
    reply = "".join(model.chat(MESSAGES[:1], max_tokens=4, temperature=0.0))
    assert reply == "".join(model.generate(ids, max_tokens=4, temperature=0.0))
    model.close()


def test_cli_run_chat(chat_model_path, capsys):
    from torchggml.models import load_model
    from torchggml.cli.models import main
    model = load_model(chat_model_path, progress=False)
    reply = "".join(model.chat([{"role": "user", "content": "Hi"}], max_tokens=3, temperature=0.0))
    model.close()
    assert main(["run", chat_model_path, "--chat", "-p", "Hi", "-n", "3", "--temp", "0"]) == 0
    out, err = capsys.readouterr()
    assert out == reply + "\n"  # the reply only: the prompt went through the template
    assert "prompt eval time =" in err and "eval time        =     3 runs" in err


def test_cli_run_chat_without_template_falls_back_to_chatml(capsys):
    """A file without tokenizer.chat_template chats in chatml, as llama.cpp falls back to, and
    says so."""
    from torchggml.cli.models import main
    from torchggml.gguf.writer.demo import demo_model_path
    assert main(["run", demo_model_path(), "--chat", "-p", "Hi", "-n", "2", "--temp", "0"]) == 0
    assert "has no tokenizer.chat_template: using chatml, as llama.cpp does" in capsys.readouterr().err


@pytest.mark.parametrize("file_template, override, name, noted", [
    (CHATML, None, "file", False),          # the file's own
    (None, None, "chatml", True),           # llama.cpp's fallback, said
    (CHATML, "gemma", "gemma", False),      # --chat-template NAME wins
    (None, "{{ messages[0]['content'] }}", "custom", False),
])
def test_choose_template(file_template, override, name, noted):
    from torchggml.text.chat import choose_template
    chosen = choose_template(file_template, override)
    assert chosen.name == name and (chosen.note is not None) == noted


def test_unknown_builtin_template_is_an_error_naming_the_choices():
    from torchggml.text.chat import choose_template
    with pytest.raises(ChatTemplateError, match="unknown chat template 'zephyr'; choose one of chatml, gemma"):
        choose_template(None, "zephyr")


def test_run_and_serve_choose_the_same_template(chat_model_path):
    """run --chat (Model.chat) and serve (ServerState.chat_prompt) render the same prompt."""
    pytest.importorskip("fastapi")
    from torchggml.models import load_model
    from torchggml.gguf.writer.demo import demo_model_path
    from torchggml.server.app import ServerState
    from torchggml.server.protocol import ChatRequest
    for path in (chat_model_path, demo_model_path()):
        model = load_model(path, progress=False)
        engine = type("Engine", (), {"slot_ctx": model.n_ctx})()  # only the context size is asked
        state = ServerState(model, engine, model_id="m")
        ids, stops = state.chat_prompt(ChatRequest(messages=[{"role": "user", "content": "Hi"}]))
        prompt = model.chat_prompt([{"role": "user", "content": "Hi"}])
        assert ids == model.tokenize(prompt, add_special=True, parse_special=True)
        assert stops == model.chat_stops()
        model.close()


def test_unknown_pre_tokenizer_model_still_evaluates_ids(tmp_path):
    from torchggml.models import load_model
    from torchggml.gguf.writer.demo import DEMO_CONFIG, write_model
    from torchggml.text.tokenizer import TokenizerError
    path = write_model(tmp_path / "odd.gguf", DEMO_CONFIG, "F16", tokenizer_pre="no-such-pre")
    model = load_model(path, progress=False)
    logits = model.eval([1, 5, 9])
    assert logits.shape == (3, model.n_vocab)
    assert model.tokenizer.detokenize([5, 9])  # pieces need no pre-tokenizer
    with pytest.raises(TokenizerError, match=r"odd\.gguf: tokenizer\.ggml\.pre 'no-such-pre' is not supported"):
        model.tokenize("hello")
    model.close()


def test_chat_template_from_a_real_vocabulary():
    """Qwen2's own template (in the golden vocabulary file): default system message, ChatML
    turns; the special tokens of the rendered prompt become single tokens."""
    import os
    from pathlib import Path
    from torchggml.models import load_model
    golden = Path(os.environ.get("TORCHGGML_GOLDEN", Path(__file__).resolve().parents[2] / "shared" / "golden"))
    path = golden / "vocab" / "ggml-vocab-qwen2.gguf"
    if not path.is_file():
        pytest.skip("golden data absent")
    model = load_model(path, vocab_only=True)
    prompt = model.chat_prompt(MESSAGES[:1])
    assert prompt == ("<|im_start|>system\nYou are a helpful assistant<|im_end|>\n"
                      "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n")
    ids = model.tokenize(prompt, parse_special=True)
    im_start = model.tokenizer.text_to_token("<|im_start|>")
    assert ids.count(im_start) == 3 and model.detokenize(ids) == prompt
