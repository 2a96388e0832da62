"""GGUF loading: metadata, the tensor table, zero-copy CPU weights, uploads to other devices, and
clear errors for truncated, corrupt and unsupported files (damaged copies of a golden file)."""
from __future__ import annotations

import os
import struct
from pathlib import Path

import numpy as np
import pytest
import torch

import torchggml as ggml
from torchggml.backend.buffer import BufferUsage
from torchggml.gguf.loader import GGUFError, load_weights, open_gguf
from torchggml.devices.cpu import cpu_buffer_type

GOLDEN = Path(os.environ.get("TORCHGGML_GOLDEN", Path(__file__).resolve().parents[2] / "shared" / "golden"))
pytestmark = pytest.mark.skipif(not (GOLDEN / "manifest.json").exists(), reason=f"golden data not found at {GOLDEN}")

F32_MODEL = GOLDEN / "models" / "llama-F32.gguf"
MIXED_MODEL = GOLDEN / "models" / "llama-Q4_K_M.gguf"  # q4_K, q6_K and f32 tensors


def _reader(path):
    import gguf
    return gguf.GGUFReader(path)


# ---------------------------------------------------------------- reading

@pytest.mark.parametrize("path", [F32_MODEL, MIXED_MODEL], ids=lambda p: p.name)
def test_tensor_table_matches_the_gguf_reader(path):
    f = open_gguf(path)
    ref = _reader(path)
    assert f.arch == "llama"
    assert f.get("llama.block_count") == 2
    assert f.arch_get("attention.head_count_kv") == 4
    assert f.get("llama.attention.layer_norm_rms_epsilon") == pytest.approx(1e-5)
    assert list(f.tensors) == [t.name for t in ref.tensors]
    for t in ref.tensors:
        info = f.tensors[t.name]
        assert info.type == ggml.Type(int(t.tensor_type))
        assert list(info.ne) == [int(n) for n in t.shape]
        assert info.nbytes == t.n_bytes
        assert f.data_offset + info.offset == t.data_offset


def test_missing_key_and_default():
    f = open_gguf(F32_MODEL)
    assert f.get("no.such.key", 7) == 7
    with pytest.raises(GGUFError, match=r"llama-F32\.gguf.*'no\.such\.key' is missing"):
        f.get("no.such.key")


def test_cpu_weights_are_zero_copy_views_of_the_mapping():
    f = open_gguf(MIXED_MODEL)
    w = load_weights(f, lambda name: cpu_buffer_type())
    region = f.data_region()
    start = region.ctypes.data
    ref = {t.name: t for t in _reader(MIXED_MODEL).tensors}
    assert len(w.buffers) == 1 and w.buffers[0].usage == BufferUsage.WEIGHTS
    for name, t in w.tensors.items():
        info = f.tensors[name]
        assert t.type == info.type and t.ne[:len(info.ne)] == list(info.ne)
        assert t.data == start + info.offset  # an address inside the file mapping: no copy
        raw = ggml.to_torch(t, raw=ggml.is_quantized(t.type))
        assert raw.data_ptr() == start + info.offset
        assert np.array_equal(raw.numpy().reshape(-1).view(np.uint8), ref[name].data.reshape(-1).view(np.uint8))


def _sim_device():
    try:
        from torchggml.models.placement import find_device
        return find_device("SIM0")
    except ValueError:
        return None


def test_weights_for_another_device_are_uploaded():
    dev = _sim_device()
    if dev is None:
        pytest.skip("SIM device not available")
    f = open_gguf(MIXED_MODEL)
    on_sim = {"output.weight", "blk.1.ffn_down.weight", "blk.0.attn_norm.weight"}
    w = load_weights(f, lambda n: dev.get_buffer_type() if n in on_sim else cpu_buffer_type(), progress=False)
    assert len(w.buffers) == 2 and all(b.usage == BufferUsage.WEIGHTS for b in w.buffers)
    for name in on_sim:
        t = w[name]
        assert t.buffer.buft is dev.get_buffer_type()
        got = ggml.backend_tensor_get(t).numpy().reshape(-1).view(np.uint8)
        assert np.array_equal(got, f.tensor_data(name))


# ---------------------------------------------------------------- damaged files

def _type_field_offset(data: bytes, name: bytes) -> int:
    """Byte offset of the type id in a tensor's info entry (after its name and dims)."""
    i = data.index(name) + len(name)
    n_dims = struct.unpack_from("<I", data, i)[0]
    return i + 4 + 8 * n_dims


def _patched(fmt: str, where: str, value):
    def damage(data: bytes) -> bytes:
        b = bytearray(data)
        offset = _type_field_offset(data, b"token_embd.weight") + (4 if where == "offset" else 0)
        struct.pack_into(fmt, b, offset, value)
        return bytes(b)
    return damage


DAMAGE = [
    # (id, how the copy is damaged, the error must match)
    ("truncated-data", lambda d: d[: len(d) // 2],
     r"tensor 'blk\.0\.ffn_down\.weight' .* needs bytes \[\d+, \d+\) but the file has \d+ bytes: the file is truncated"),
    ("truncated-last-byte", lambda d: d[:-1], r"tensor 'output\.weight' .*truncated"),
    ("truncated-header", lambda d: d[:600], r"at byte \d+ of 600; the file is truncated or corrupt"),
    ("truncated-magic", lambda d: d[:3], r"not a GGUF file"),
    ("bad-magic", lambda d: b"GGML" + d[4:], r"not a GGUF file \(starts with b'GGML'"),
    ("unknown-type-id", _patched("<I", "type", 99), r"tensor 'token_embd\.weight' has unknown or unsupported ggml type id 99"),
    ("removed-type-id", _patched("<I", "type", 31), r"tensor 'token_embd\.weight' has unknown or unsupported ggml type id 31"),
    ("offset-past-end", _patched("<Q", "offset", 1 << 40), r"tensor 'token_embd\.weight' .* needs bytes .* truncated or corrupt"),
    ("misaligned-offset", _patched("<Q", "offset", 7), r"tensor 'token_embd\.weight': data offset 7 is not aligned"),
]


@pytest.mark.parametrize("damage,pattern", [d[1:] for d in DAMAGE], ids=[d[0] for d in DAMAGE])
def test_damaged_file_fails_with_a_clear_error(tmp_path, damage, pattern):
    path = tmp_path / "damaged.gguf"
    path.write_bytes(damage(F32_MODEL.read_bytes()))
    with pytest.raises(GGUFError, match=pattern) as err:
        open_gguf(path)
    assert str(path) in str(err.value)  # the message names the file


def test_load_model_reports_a_truncated_file(tmp_path):
    path = tmp_path / "short.gguf"
    path.write_bytes(F32_MODEL.read_bytes()[:-1000])
    with pytest.raises(GGUFError, match=r"short\.gguf: tensor 'output\.weight'"):
        ggml_load(path)


def test_missing_file():
    with pytest.raises(FileNotFoundError, match="no-such.gguf"):
        open_gguf("/nonexistent/no-such.gguf")


def ggml_load(path):
    from torchggml.models import load_model
    return load_model(path)


def _mapped_kb(path) -> int:
    """Resident kB of this process's mappings of `path` (/proc/self/smaps)."""
    total, inside = 0, False
    with open("/proc/self/smaps") as f:
        for line in f:
            fields = line.split()
            if "-" in fields[0] and len(fields) >= 5 and ":" in fields[3]:  # a mapping's header line
                inside = len(fields) >= 6 and fields[5] == os.fspath(path)
            elif inside and fields[0] == "Rss:":
                total += int(fields[1])
    return total


needs_smaps = pytest.mark.skipif(not os.path.exists("/proc/self/smaps"), reason="needs Linux's /proc/self/smaps")


@needs_smaps
def test_release_gives_back_a_tensors_mapped_pages(tmp_path):
    import gguf
    values = np.arange(1 << 18, dtype=np.float32).reshape(256, 1024)  # 1 MiB
    w = gguf.GGUFWriter(tmp_path / "m.gguf", "llama")
    w.add_tensor("big", values)
    w.add_tensor("small", np.ones(16, np.float32))
    w.write_header_to_file(); w.write_kv_data_to_file(); w.write_tensors_to_file(); w.close()
    f = open_gguf(tmp_path / "m.gguf")
    assert f.tensor_data("big").view(np.float32).sum() == values.sum()  # every page read
    before = _mapped_kb(f.path)
    f.release("big")
    after = _mapped_kb(f.path)
    assert before - after >= (values.nbytes - 2 * 4096) // 1024, (before, after)
    assert np.array_equal(f.tensor_data("big").view(np.float32).reshape(256, 1024), values)  # read again
    assert np.array_equal(f.tensor_data("small").view(np.float32), np.ones(16, np.float32))


@needs_smaps
def test_repacked_weights_leave_no_mapped_copy(tmp_path):
    """Weights repacked at load give their pages of the file's mapping back: what stays mapped is
    the weights used in place (embeddings, norms)."""
    from torchggml.gguf.writer.demo import DEMO_CONFIG, write_model
    from torchggml.models import load_model
    path = write_model(tmp_path / "mxfp4.gguf", DEMO_CONFIG, "MXFP4")  # repacked (the block types of IN_PLACE_KINDS stay)
    model = load_model(path, progress=False)
    repacked = [n for n, t in model.weight_buffers.tensors.items() if not t.buffer.ggml_layout]
    assert repacked
    in_place = sum(info.nbytes for n, info in model.file.tensors.items() if n not in repacked)
    assert _mapped_kb(path) * 1024 <= in_place + 64 * 4096
    model.close()


# ---------------------------------------------------------------- split models

@pytest.fixture(scope="module")
def split_demo(tmp_path_factory):
    """The demo model and its parts, split by our writer as gguf-split --split-max-tensors 12."""
    from torchggml.gguf.writer.demo import demo_model_path
    from torchggml.gguf.writer.split import split_gguf
    return demo_model_path(), split_gguf(demo_model_path(), str(tmp_path_factory.mktemp("split") / "demo"), 12)


def test_split_model_opens_from_its_first_file(split_demo):
    src, parts = split_demo
    assert len(parts) == 4 and parts[0].endswith("demo-00001-of-00004.gguf")
    whole, split = open_gguf(src), open_gguf(parts[0])
    assert list(split.tensors) == list(whole.tensors)
    assert sorted({t.part for t in split.tensors.values()}) == [0, 1, 2, 3]
    for name in whole.tensors:
        assert np.array_equal(split.tensor_data(name), whole.tensor_data(name)), name
    assert {k: v for k, v in split.metadata.items() if not k.startswith("split.")}.keys() == whole.metadata.keys()
    assert (split.get("split.no"), split.get("split.count"), split.get("split.tensors.count")) == (0, 4, len(whole.tensors))


def test_split_model_runs_as_the_whole_one(split_demo):
    from torchggml.models import load_model
    src, parts = split_demo
    logits = []
    for path in (src, parts[0]):
        m = load_model(path, n_ctx=64, progress=False)
        logits.append(m.eval(m.tokenize("Once upon a time"), logits="all"))
        m.close()
    assert torch.equal(logits[0], logits[1])


@pytest.mark.parametrize("damage, pattern", [
    ("missing", "demo-00001-of-00004.gguf: part 3 of 4 of the split model is missing: .*demo-00003-of-00004.gguf"),
    ("second", "demo-00002-of-00004.gguf: part 2 of a model split in 4 files: load its first file "
               "\\(.*demo-00001-of-00004.gguf\\)"),
    ("renamed", "model.gguf: the first of 4 split files \\(split.count\\) must be named NAME-00001-of-00004.gguf"),
    ("swapped", "demo-00003-of-00004.gguf: split.no is 3, expected 2"),
])
def test_split_model_errors_name_the_file(tmp_path, split_demo, damage, pattern):
    import shutil
    _, parts = split_demo
    copies = [shutil.copy(p, tmp_path) for p in parts]
    first = copies[0]
    if damage == "missing":
        os.remove(copies[2])
    elif damage == "second":
        first = copies[1]
    elif damage == "renamed":
        first = shutil.move(copies[0], tmp_path / "model.gguf")
    else:
        os.replace(copies[3], copies[2])
    with pytest.raises(GGUFError, match=pattern) as e:
        open_gguf(first)
    assert "\n" not in str(e.value)


def test_llama_cpp_loads_our_split_model(split_demo):
    llama_cpp = pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed (the llama.cpp comparisons)")
    src, parts = split_demo
    out = []
    for path in (src, parts[0]):
        llm = llama_cpp.Llama(model_path=str(path), n_ctx=64, logits_all=True, verbose=False)
        tokens = llm.tokenize(b"Once upon a time")
        llm.eval(tokens)
        out.append(np.array(llm.scores[:len(tokens)]))
        llm.close()
    assert np.array_equal(out[0], out[1])


# ---------------------------------------------------------------- string arrays (reader.py's strings())

def _string_array_header(items: list[bytes], order: str = "<", after: bytes = b"") -> bytes:
    """A GGUF header with no tensors and one key, "a", an array of the raw strings `items`,
    then (when given) a second key "b", a string of the bytes `after`."""
    def string(raw):
        return struct.pack(order + "Q", len(raw)) + raw
    kvs = string(b"a") + struct.pack(order + "IIQ", 9, 8, len(items)) + b"".join(string(i) for i in items)
    if after:
        kvs += string(b"b") + struct.pack(order + "I", 8) + string(after)
    return b"GGUF" + struct.pack(order + "IQQ", 3, 0, 2 if after else 1) + kvs


def _scan(data: bytes):
    from torchggml.gguf.reader import scan_header
    return scan_header("f.gguf", data, lambda entry: 0).values


STRING_ARRAYS = [  # id, strings (bytes); each also followed by another key
    ("vocabulary", [f"tok{i}".encode() for i in range(3000)]),
    ("one", [b"x"]),
    ("none", []),
    ("utf8", ["ĠThe".encode(), "▁日本".encode(), "🙂".encode(), b"\n", b" "]),
    ("empty-strings", [b"", b"", b"a", b""]),  # consecutive empty ones: read one by one
    ("nul-inside", [b"a\x00b", b"\x00", b"c"]),
    ("long", [b"x" * 300, b"y" * 70000, b"z"]),  # lengths with more than one byte
    ("longer-than-the-first-window", [bytes([65 + i % 26]) * 200 for i in range(500)]),
    ("a-length-7-zero-bytes-look-like", [b"\x05\x00\x00\x00\x00\x00\x00\x00", b"q"]),
    ("control-characters", [bytes([c]) for c in (9, 10, 13, 1, 27)]),
    ("every-control-character", [bytes([c]) for c in (*range(1, 32), 127)] + [b"x"]),  # read one by one
]


@pytest.mark.parametrize("order", ["<", ">"])
@pytest.mark.parametrize("items", [s[1] for s in STRING_ARRAYS], ids=[s[0] for s in STRING_ARRAYS])
def test_string_arrays_read_as_written(items, order):
    values = _scan(_string_array_header(items, order, after="après".encode()))
    assert values["a"] == [i.decode() for i in items]
    assert values["b"] == "après"  # the cursor ends where the array does


BAD_STRING_ARRAYS = [  # id, strings, the error's pattern (naming the item)
    ("invalid-utf8", [b"ok", b"\xc3\x28", b"ok"], r"metadata key 'a'\[1\]: the string is not valid UTF-8"),
    ("0xff-byte", [b"ok", b"ok", b"a\xffb"], r"'a'\[2\]: the string is not valid UTF-8"),
    ("lead-byte-at-the-end", [b"ok\xe2\x82", b"\xacok"], r"'a'\[0\]: the string is not valid UTF-8"),
    ("surrogate", [b"\xed\xa0\x80"], r"'a'\[0\]: the string is not valid UTF-8"),
]


@pytest.mark.parametrize("items,pattern", [s[1:] for s in BAD_STRING_ARRAYS], ids=[s[0] for s in BAD_STRING_ARRAYS])
def test_an_invalid_string_in_an_array_is_named(items, pattern):
    from torchggml.gguf.reader import GGUFError
    with pytest.raises(GGUFError, match=pattern):
        _scan(_string_array_header(items))


@pytest.mark.parametrize("cut", [1, 5, 9, 12])
def test_a_string_array_cut_short_is_named(cut):
    from torchggml.gguf.reader import GGUFError
    data = _string_array_header([b"abc", b"defgh", b"ij"])
    with pytest.raises(GGUFError, match=r"metadata key 'a'(\[\d\]|.*array count)"):
        _scan(data[:-cut])
