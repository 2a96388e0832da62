"""Reliability, round 4 (issue 43), GGUF verdicts: files llama.cpp refuses are refused at load with
the file and the key or tensor named, and a file llama.cpp loads (context_length 0) loads. The
server's findings are in test_server_limits.py."""
from __future__ import annotations

import numpy as np
import pytest

from torchggml import Type
from torchggml.gguf.loader import GGUFError
from torchggml.gguf.writer.demo import demo_model_path
from torchggml.gguf.writer.rewrite import header_parts, serialize
from torchggml.models import load_model

I16 = int(Type.I16)


def _mutant(tmp_path, edit):
    """The demo model (every tensor F32) edited, its data laid out again for the new types."""
    kvs, tensors, alignment, data = header_parts(demo_model_path())
    old = [(t[3], int(np.prod(t[1])) * 4) for t in tensors]
    edit(kvs, tensors)
    out = b""
    for t, (start, size) in zip(tensors, old):
        out += bytes(-len(out) % alignment)
        t[3] = len(out)
        out += data[start:start + size] if t[2] != I16 else data[start:start + size // 2]
    path = tmp_path / "mutant.gguf"
    path.write_bytes(serialize(kvs, tensors, alignment, out))
    return path


def _drop(key):
    return lambda kvs, tensors: kvs.remove(next(kv for kv in kvs if kv[0] == key))


def _add(key, type_name, value):
    return lambda kvs, tensors: kvs.append([key, type_name, value])


def _retype_tensor(name, type_id):
    def edit(kvs, tensors):
        next(t for t in tensors if t[0] == name)[2] = type_id
    return edit


REFUSED = [  # (id, edit, the error's pattern)
    ("tokenizer-model-without-tokens", _drop("tokenizer.ggml.tokens"),
     r"mutant\.gguf: 'tokenizer\.ggml\.model' is 'gpt2' but the file has no token list"),
    ("array-of-arrays-known-key", _add("general.tags", "array[array[int32]]", [[1, 2], [3]]),
     r"mutant\.gguf.*general\.tags.*an array of arrays"),
    ("array-of-arrays-unknown-key", _add("x.nested", "array[array[string]]", [["a"], ["b", "c"]]),
     r"mutant\.gguf.*x\.nested.*an array of arrays"),
    ("i16-token-embd", _retype_tensor("token_embd.weight", I16),
     r"mutant\.gguf: tensor 'token_embd\.weight' has type I16; token embeddings must be float or quantized"),
]


@pytest.mark.parametrize("edit,pattern", [r[1:] for r in REFUSED], ids=[r[0] for r in REFUSED])
def test_files_llama_cpp_refuses_are_refused_at_load(tmp_path, edit, pattern):
    path = _mutant(tmp_path, edit)
    with pytest.raises(GGUFError, match=pattern):
        load_model(path).close()


def _set(key, type_name, value):
    def edit(kvs, tensors):
        next(kv for kv in kvs if kv[0] == key)[1:] = [type_name, value]
    return edit


LOADED = [  # (id, edit, n_ctx given, the context it gets)
    ("context-length-0", _set("llama.context_length", "uint32", 0), None, 4096),
    ("context-length-0-with-n-ctx", _set("llama.context_length", "uint32", 0), 64, 64),
]


@pytest.mark.parametrize("edit,n_ctx,expected", [r[1:] for r in LOADED], ids=[r[0] for r in LOADED])
def test_files_llama_cpp_loads_are_loaded(tmp_path, edit, n_ctx, expected):
    model = load_model(_mutant(tmp_path, edit), **({"n_ctx": n_ctx} if n_ctx else {}))
    try:
        assert model.n_ctx == expected and model.hp.n_ctx_train == 0
        assert model.generate(model.tokenize("Once"), max_tokens=2)  # and it runs
    finally:
        model.close()
