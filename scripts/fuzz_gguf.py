"""GGUF fuzzer: deterministic mutants of GGUF models and vocabularies, each loaded and evaluated
(or, for a vocabulary file, tokenized) in a worker process with a time and a memory cap, every
outcome classified; with llama-cpp-python installed, each mutant torchggml accepts is checked
against llama.cpp (the oracle) in a worker of its own.

    python scripts/fuzz_gguf.py -n 10000                  # all sources, 1 worker pair
    python scripts/fuzz_gguf.py -n 300 --workers 2 --json out.json --seed 7 --no-oracle

Mutant i of seed s is always the same file: source i % n_sources, mutation drawn from
random.Random(f"{s}:{i}"). Sources (default_sources): the golden models (no vocabulary), the demo
model (a trained BPE vocabulary), tiny models carrying llama.cpp's SPM and GPT-2 vocabularies,
and llama.cpp's vocabulary files (tokenized only). Mutations: in place (metadata values, value
types, the tensor table, counts, raw header bytes, inserted/deleted bytes, truncation, tensor
data) and rewrites of the header (mutate_structured: tensor renames and swaps, reshapes keeping
the size, keys retyped to arrays or other integer/float types, keys dropped, tensors added or
dropped, the tokenizer's tokens, types, scores, merges, model, pre-tokenizer and special ids).

Outcomes:
    ok              loaded and evaluated (or tokenized), and llama.cpp agrees: it accepts the
                    file too, tokenizes the texts the same and its logits are within 5% of the
                    largest (logits_agree)
    ok-unchecked    loaded and evaluated, no oracle
    llama-nonfinite a tensor-data mutant whose logits are finite here and not in llama.cpp (its
                    f16/8-bit intermediates overflow on the corrupted weights; ours are f32)
    clear-error     an exception whose message names the file (GGUFError and friends)
    nonfinite-data  the weights' bytes were corrupted (a valid file) and eval raised
                    NonFiniteLogitsError: the expected, named error
  failures (must all be 0):
    unclear-error   an exception that does not name the file
    crash           the worker died (signal or exit)
    hang            no answer within --timeout seconds
    over-memory     the worker hit its address-space cap (RLIMIT_AS) or ran out of memory
    nonfinite-table a header/table mutation loaded and then produced non-finite logits
    wrong-accept    accepted here, refused (or crashed on) by llama.cpp
    wrong-tokens    tokenized differently from llama.cpp
    wrong-logits    logits different from llama.cpp's

Workers are long-lived (importing torch once, not per mutant) and are restarted when one dies,
hangs or has handled --recycle mutants. --json gets the summary every 250 mutants and at the end
(also when interrupted: Ctrl-C or SIGTERM report the mutants that finished). Exit status 1 when
any failure was seen.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import resource
import selectors
import signal
import struct
import subprocess
import sys
import tempfile
import time
from collections import Counter, defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # this checkout's torchggml, also when another one is installed
    sys.path.insert(0, str(ROOT))
from torchggml.gguf.writer.rewrite import TYPES as _TYPES, serialize  # noqa: E402
GOLDEN = Path(os.environ.get("TORCHGGML_GOLDEN", ROOT.parent / "shared" / "golden"))
GOLDEN_SOURCES = ("llama-Q4_0.gguf", "llama-Q4_K_M.gguf", "llama-F16.gguf", "qwen2-F32.gguf", "qwen3-F16-tied.gguf")
FAILURES = ("unclear-error", "crash", "hang", "over-memory", "nonfinite-table", "wrong-accept", "wrong-logits",
            "wrong-tokens")
OUTCOMES = ("ok", "ok-unchecked", "llama-nonfinite", "clear-error", "nonfinite-data") + FAILURES
TOKENS = (1, 5, 9, 200)
STARTUP_TIMEOUT = 600  # seconds for a worker's imports and warm-up (a busy machine is slow)
REPACK_EVERY = 8  # one mutant in 8 loads with repacked CPU weights (slower), the others without

# ---------------------------------------------------------------- the sources and their fields

VOCAB_FILES = ("ggml-vocab-llama-spm.gguf", "ggml-vocab-gpt-2.gguf", "ggml-vocab-llama-bpe.gguf",
               "ggml-vocab-qwen2.gguf")
VOCAB_MODELS = ("ggml-vocab-llama-spm.gguf", "ggml-vocab-gpt-2.gguf")  # also fuzzed as whole models
TEXTS = ("Hello world", " Hello World!", "  leading spaces,\n\nnew lines\tand tabs ", "3333 12345 1.5e-3",
         "Äpfel ünïcödé 日本語 🙂 ½", "<s> special </s> <|endoftext|> [INST]", "")


class Source:
    """One original file: its bytes, the byte position of every header field (from the gguf
    reader, for in-place mutations) and its decoded header (for mutations that rewrite it).
    vocab_only: a vocabulary file without weights (tokenized, not evaluated)."""

    def __init__(self, path: Path):
        import gguf
        from torchggml.gguf.loader import _scan
        self.path = path
        self.data = path.read_bytes()
        r = gguf.GGUFReader(path)
        base = r.data.ctypes.data
        self.data_offset = int(r.data_offset)
        self.arch = str(bytes(r.fields["general.architecture"].parts[-1]), "utf-8")

        def parts(field):
            return [(p.ctypes.data - base, p.dtype) for p in field.parts]
        self.counts = [parts(r.fields[k])[0] for k in ("GGUF.tensor_count", "GGUF.kv_count")]
        self.kvs = {name: parts(f) for name, f in r.fields.items() if not name.startswith("GGUF.")}
        self.tensors = [parts(t.field) for t in r.tensors]
        self.header = _scan(str(path))
        self.vocab_only = not self.header.tensors
        self.has_vocab = "tokenizer.ggml.tokens" in self.header.value_types

    @property
    def mode(self) -> str:
        return "vocab" if self.vocab_only else "model"


# ---------------------------------------------------------------- rewriting a GGUF (structured mutations)

_INT_RANGES = {"uint8": (0, 2**8 - 1), "int8": (-2**7, 2**7 - 1), "uint16": (0, 2**16 - 1),
               "int16": (-2**15, 2**15 - 1), "uint32": (0, 2**32 - 1), "int32": (-2**31, 2**31 - 1),
               "uint64": (0, 2**64 - 1), "int64": (-2**63, 2**63 - 1)}


def _parts(src: Source):
    """The source's header as editable lists, and its tensor-data region."""
    h = src.header
    kvs = [[k, t, h.values.get(k)] for k, t in h.value_types.items()]
    tensors = [[t.name, list(t.ne), t.type_id, t.offset] for t in h.tensors]
    return kvs, tensors, h.alignment, src.data[h.data_offset:]


def _retyped(rng: random.Random, type_name: str, value, n_layer: int):
    """(new type name, value): the same number as an array, another integer width, float <-> int,
    bool or string."""
    if isinstance(value, bool):
        value = int(value)
    choices = ["array1", "array_layers", "array2", "string"]
    if isinstance(value, int):
        choices += [t for t, (lo, hi) in _INT_RANGES.items() if t != type_name and lo <= value <= hi]
        choices += ["float32", "float64", "bool"]
    else:
        choices += ["uint32", "int32", "float64"]
    new = rng.choice(choices)
    if new.startswith("array"):
        item = type_name if type_name in _TYPES else "int32"
        n = {"array1": 1, "array2": 2, "array_layers": max(1, n_layer)}[new]
        return f"array[{item}]", [value] * n
    if new == "string":
        return "string", str(value)
    if new in ("float32", "float64"):
        return new, float(value)
    if new == "bool":
        return "bool", bool(value)
    lo, hi = _INT_RANGES[new]
    v = int(value) if value == value and abs(value) != float("inf") else 0
    return new, min(hi, max(lo, v))


def _reshaped(rng: random.Random, ne: list, type_id: int) -> list | None:
    """Another shape with the same number of elements and whole blocks in ne[0]."""
    from torchggml.types import Type, type_traits
    blck = type_traits(Type(type_id)).blck_size
    n = 1
    for d in ne:
        n *= d
    options = [list(reversed(ne)), [n], ne + [1], [ne[0] // 2, ne[1] * 2] + ne[2:] if len(ne) >= 2 else None,
               [ne[0] * ne[1]] + ne[2:] if len(ne) >= 2 else None, [ne[0], 1] + ne[1:],
               [ne[0] * 2, ne[1] // 2] + ne[2:] if len(ne) >= 2 and ne[1] % 2 == 0 else None]
    options = [o for o in options if o and o != ne and len(o) <= 4 and all(d > 0 for d in o) and o[0] % blck == 0
               and (o[0] * (o[1] if len(o) > 1 else 1)) > 0]
    options = [o for o in options if _prod(o) == n]
    return rng.choice(options) if options else None


def _prod(ne) -> int:
    n = 1
    for d in ne:
        n *= d
    return n


# names a renamed tensor may get: another role of the same layer, another layer, a typo
_ROLES = ("attn_q", "attn_k", "attn_v", "attn_output", "attn_norm", "ffn_norm", "ffn_gate", "ffn_up", "ffn_down",
          "attn_q_norm", "attn_k_norm", "attn_qkv")


def _new_name(rng: random.Random, name: str, n_layer: int) -> str:
    r = rng.random()
    if r < 0.3:  # a typo
        i = rng.randrange(len(name))
        return name[:i] + rng.choice("abcdefghijklmnopqrstuvwxyz0123456789._") + name[i + 1:]
    if r < 0.5 and name.startswith("blk."):
        rest = name.split(".", 2)[2]
        return f"blk.{rng.choice([n_layer, n_layer + 5, 0, 1])}.{rest}"
    if r < 0.8 and name.startswith("blk."):
        _, il, rest = name.split(".", 2)
        return f"blk.{il}.{rng.choice(_ROLES)}.{rest.rsplit('.', 1)[-1]}"
    return rng.choice(["output.weight", "output_x.weight", "token_embd.weight", "rope_freqs.weight",
                       "output_norm.bias", name + "_old"])


def mutate_structured(src: Source, rng: random.Random, kind: str) -> tuple[str, bytes] | None:
    """The mutations that rewrite the header: rename, swap, reshape, retype, drop_key, add_tensor,
    drop_tensor, vocab. None when the source has nothing this kind can change."""
    kvs, tensors, alignment, data = _parts(src)
    arch = src.arch
    n_layer = src.header.values.get(f"{arch}.block_count", 1)
    n_layer = n_layer if isinstance(n_layer, int) else 1
    if kind == "rename" and tensors:
        t = rng.choice(tensors + [x for x in tensors if x[0] == "output.weight"] * 4)  # the head often
        old, t[0] = t[0], _new_name(rng, t[0], n_layer)
        detail = f"{old}->{t[0]}"
    elif kind == "swap" and len(tensors) > 1:  # two names swapped: a valid file, other semantics
        same = [(a, b) for a in tensors for b in tensors if a is not b and a[1:3] == b[1:3]]
        a, b = rng.choice(same) if same and rng.random() < 0.8 else rng.sample(tensors, 2)
        a[0], b[0] = b[0], a[0]
        detail = f"{a[0]}<->{b[0]}"
    elif kind == "reshape" and tensors:
        t = rng.choice(tensors)
        ne = _reshaped(rng, t[1], t[2])
        if ne is None:
            return None
        detail, t[1] = f"{t[0]} {t[1]}->{ne}", ne
    elif kind == "retype":
        numeric = [kv for kv in kvs if kv[1] in _TYPES and kv[0] != "general.alignment" or kv[0] == "general.alignment" and rng.random() < 0.1]
        if not numeric:
            return None
        kv = rng.choice(numeric)
        old = kv[1]
        kv[1], kv[2] = _retyped(rng, kv[1], kv[2], n_layer)
        detail = f"{kv[0]} {old}->{kv[1]} {_short(kv[2])}"
    elif kind == "drop_key":
        kv = rng.choice([kv for kv in kvs if kv[0] != "general.architecture"] or kvs)
        kvs.remove(kv)
        detail = kv[0]
    elif kind == "add_tensor" and tensors:
        import numpy as np
        n_embd = src.header.values.get(f"{arch}.embedding_length", 16)
        n_embd = n_embd if isinstance(n_embd, int) and 0 < n_embd < 2**16 else 16
        name = rng.choice(["output.bias", "rope_freqs.weight", "blk.0.extra.weight", "token_embd_norm.weight",
                           "blk.0.attn_q.bias", "output_norm.bias", f"blk.{n_layer}.attn_norm.weight"])
        if any(t[0] == name for t in tensors):
            return None
        start = len(data) + (-len(data) % alignment)
        values = np.ones(n_embd, dtype="<f4") * rng.choice([0.0, 1.0, 0.5])
        data = data + bytes(start - len(data)) + values.tobytes()
        tensors.append([name, [n_embd], 0, start])
        detail = name
    elif kind == "drop_tensor" and tensors:
        name, _, _, offset = tensors.pop()
        data = data[:offset]
        detail = name
    elif kind == "vocab" and src.has_vocab:
        detail = _mutate_vocab(rng, kvs)
    else:
        return None
    return f"{kind}:{detail}", serialize(kvs, tensors, alignment, data)


def _mutate_vocab(rng: random.Random, kvs: list) -> str:
    """One change to the tokenizer's metadata: a token's text, type or score, a merge, the
    model or pre-tokenizer name, a special token id, or an array shortened."""
    import numpy as np
    by_key = {kv[0]: kv for kv in kvs}
    tokens = by_key["tokenizer.ggml.tokens"]
    n = len(tokens[2])
    r = rng.random()
    if r < 0.25:
        tokens[2] = list(tokens[2])
        i = rng.randrange(n)
        new = rng.choice(["", " ", tokens[2][rng.randrange(n)], "<s>", "\u2581\u2581", "a" * 300, "\ufffd", "<0xFF>",
                          "<0xZZ>", "[UNK]", chr(rng.randrange(32, 0x2FFF))])
        old, tokens[2][i] = tokens[2][i], new
        return f"token {i} {old!r}->{new!r}"
    if r < 0.4 and "tokenizer.ggml.token_type" in by_key:
        kv = by_key["tokenizer.ggml.token_type"]
        kv[2] = np.array(kv[2]).copy()
        i = rng.randrange(len(kv[2]))
        kv[2][i] = rng.choice([0, 1, 2, 3, 4, 5, 6, 7, -1, 99])
        return f"token_type {i}->{kv[2][i]}"
    if r < 0.5 and "tokenizer.ggml.scores" in by_key:
        kv = by_key["tokenizer.ggml.scores"]
        kv[2] = np.array(kv[2], dtype=np.float32).copy()
        i = rng.randrange(len(kv[2]))
        kv[2][i] = rng.choice([float("nan"), float("inf"), -1e30, 1e30, 0.0])
        return f"score {i}->{kv[2][i]}"
    if r < 0.65 and "tokenizer.ggml.merges" in by_key:
        kv = by_key["tokenizer.ggml.merges"]
        kv[2] = list(kv[2])
        i = rng.randrange(len(kv[2]))
        new = rng.choice(["", "a", "a b c", "  ", kv[2][rng.randrange(len(kv[2]))], "zz qq", "Ġ Ġ"])
        old, kv[2][i] = kv[2][i], new
        return f"merge {i} {old!r}->{new!r}"
    if r < 0.75:
        key = rng.choice(["tokenizer.ggml.model", "tokenizer.ggml.pre"])
        new = rng.choice(["llama", "gpt2", "bert", "t5", "rwkv", "none", "plamo2", "default", "qwen2", "llama3",
                          "gpt-2", "unknown-x", ""])
        if key not in by_key:
            kvs.append([key, "string", new])
        else:
            by_key[key][1:] = ["string", new]
        return f"{key}->{new!r}"
    if r < 0.9:
        key = rng.choice(["tokenizer.ggml.bos_token_id", "tokenizer.ggml.eos_token_id",
                          "tokenizer.ggml.unknown_token_id", "tokenizer.ggml.padding_token_id",
                          "tokenizer.ggml.add_bos_token", "tokenizer.ggml.add_eos_token"])
        value = (rng.choice([True, False]) if key.endswith(("bos_token", "eos_token"))
                 else rng.choice([0, 1, 2, n - 1, n, n + 5, 2**32 - 1]))
        kind = "bool" if isinstance(value, bool) else "uint32"
        if key in by_key:
            by_key[key][1:] = [kind, value]
        else:
            kvs.append([key, kind, value])
        return f"{key}->{value}"
    key = rng.choice([k for k in ("tokenizer.ggml.scores", "tokenizer.ggml.token_type", "tokenizer.ggml.tokens",
                                  "tokenizer.ggml.merges") if k in by_key])
    kv = by_key[key]
    kv[2] = kv[2][:len(kv[2]) - rng.choice([1, 2, len(kv[2]) // 2])]
    return f"{key} shortened to {len(kv[2])}"


def _short(value) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _interesting(rng: random.Random, value, dtype):
    kind, size = dtype.kind, dtype.itemsize
    if kind == "f":
        return rng.choice([0.0, -0.0, float("nan"), float("inf"), float("-inf"), -1.0, 1e38, 1e-38,
                           value * 2, value / 2, -value, rng.uniform(-1e6, 1e6)])
    bits = 8 * size
    lo, hi = (0, 2**bits - 1) if kind in "ub" else (-2**(bits - 1), 2**(bits - 1) - 1)
    v = int(value)
    cands = [0, 1, 2, hi, hi - 1, lo, 2**(bits - 1) - 1, v + 1, v - 1, v * 2, v // 2, v + 32, v - 32,
             rng.randint(lo, hi), rng.randint(0, 4096)]
    return min(hi, max(lo, rng.choice(cands)))


def _set_part(buf: bytearray, rng: random.Random, offset: int, dtype) -> str:
    """Overwrite one element of a header part with an interesting value of its type."""
    import numpy as np
    code = {("f", 4): "f", ("f", 8): "d", ("u", 1): "B", ("i", 1): "b", ("u", 2): "H", ("i", 2): "h",
            ("u", 4): "I", ("i", 4): "i", ("u", 8): "Q", ("i", 8): "q", ("b", 1): "B"}.get((dtype.kind, dtype.itemsize))
    if code is None or offset + struct.calcsize(code) > len(buf):
        return "skip"
    old = struct.unpack_from("<" + code, buf, offset)[0]
    new = _interesting(rng, old, np.dtype(dtype))
    struct.pack_into("<" + code, buf, offset, new)
    return f"{old!r}->{new!r}"


# mutation kinds and their weights: byte-level ones (in place, from the field positions) and
# structured ones (the header rewritten: mutate_structured)
MODEL_KINDS = {"kv_value": 14, "hparam": 10, "tensor_info": 12, "count": 3, "kv_type": 4, "header_bytes": 7,
               "splice": 6, "truncate": 6, "data": 6, "rename": 9, "swap": 4, "reshape": 6, "retype": 9,
               "drop_key": 4, "add_tensor": 3, "drop_tensor": 2}
VOCAB_KINDS = {"kv_value": 10, "kv_type": 3, "header_bytes": 5, "splice": 4, "truncate": 3, "retype": 6,
               "drop_key": 5, "vocab": 40}
STRUCTURED = ("rename", "swap", "reshape", "retype", "drop_key", "add_tensor", "drop_tensor", "vocab")


def mutate(src: Source, rng: random.Random) -> tuple[str, bytes]:
    """(kind, mutant bytes). Only the `data` kind touches the tensor data region."""
    kinds = dict(VOCAB_KINDS if src.vocab_only else MODEL_KINDS)
    if src.has_vocab and not src.vocab_only:
        kinds["vocab"] = 12
    kind = rng.choices(list(kinds), weights=list(kinds.values()))[0]
    if kind in STRUCTURED:
        mutant = mutate_structured(src, rng, kind)
        if mutant is not None:
            return mutant
        kind = "kv_value"
    buf = bytearray(src.data)
    if kind in ("kv_value", "hparam"):
        keys = [k for k in src.kvs if kind == "kv_value" or k.startswith(src.arch + ".")]
        key = rng.choice(keys)
        parts = src.kvs[key]
        # the value parts come after key length, key bytes and value type
        off, dtype = rng.choice(parts[3:] if len(parts) > 3 else parts)
        if dtype.kind == "u" and dtype.itemsize == 1 and kind == "kv_value" and rng.random() < 0.5:
            off, dtype = rng.choice(parts)  # sometimes the key itself
        detail = _set_part(buf, rng, off, dtype)
        return f"{kind}:{key}:{detail}", bytes(buf)
    if kind == "tensor_info":
        parts = rng.choice(src.tensors)
        off, dtype = rng.choice(parts[2:])  # n_dims, dims, type, offset (not the name's length)
        return f"{kind}:{_set_part(buf, rng, off, dtype)}", bytes(buf)
    if kind == "count":
        off, _ = rng.choice(src.counts)
        n = struct.unpack_from("<Q", buf, off)[0]
        new = rng.choice([n - 1, n + 1, 0, 2**32 - 1, 2**63, n * 2])
        struct.pack_into("<Q", buf, off, max(0, new) % 2**64)
        return f"{kind}:{n}->{new}", bytes(buf)
    if kind == "kv_type":
        parts = src.kvs[rng.choice(list(src.kvs))]
        off, _ = parts[2]
        struct.pack_into("<I", buf, off, rng.choice([*range(13), 13, 255, 2**32 - 1]))
        return kind, bytes(buf)
    if kind == "header_bytes":
        for _ in range(rng.randint(1, 8)):
            buf[rng.randrange(4, src.data_offset)] = rng.randrange(256)
        return kind, bytes(buf)
    if kind == "splice":
        at = rng.randrange(4, src.data_offset)
        n = rng.randint(1, 64)
        if rng.random() < 0.5:
            return f"{kind}:delete {n} at {at}", bytes(buf[:at] + buf[at + n:])
        return f"{kind}:insert {n} at {at}", bytes(buf[:at] + bytes(rng.randrange(256) for _ in range(n)) + buf[at:])
    if kind == "truncate":
        in_header = rng.random() < 0.6 or src.data_offset >= len(buf)
        end = rng.randrange(0, src.data_offset) if in_header else rng.randrange(src.data_offset, len(buf))
        return f"{kind}:{end}", bytes(buf[:end])
    for _ in range(rng.randint(1, 16)):
        buf[rng.randrange(src.data_offset, len(buf))] = rng.randrange(256)
    return "data", bytes(buf)


# ---------------------------------------------------------------- the worker processes

def worker_main(mem_cap_mb: int, role: str) -> None:
    """Read tasks from stdin, answer one JSON line each. role "torchggml" loads and evaluates
    the mutant; role "llama.cpp" (the oracle) does the same through llama-cpp-python. Results
    too large for a line (logits) go to the task's `out` file."""
    import warnings
    warnings.simplefilter("ignore")
    import numpy as np
    import torch
    torch.set_num_threads(1)  # workers run side by side: more threads only oversubscribe the cores
    evaluate = _llama_cpp_eval if role == "llama.cpp" else _torchggml_eval
    if role == "llama.cpp":
        _skip_python_chat_templates()
        mem_cap_mb *= 4  # the oracle's memory is not under test: only its verdict counts
    from torchggml.models.model import NonFiniteLogitsError
    # warm up with a clean model so lazy initialisation is not counted against the cap
    evaluate(str(GOLDEN / "models" / GOLDEN_SOURCES[0]), "model", True, False)
    vm = _vm_bytes()
    cap = vm + mem_cap_mb * 2**20
    resource.setrlimit(resource.RLIMIT_AS, (cap, cap))
    # the protocol gets its own descriptor; fd 1 goes where stderr goes, so that stray prints,
    # Python's or C's (llama.cpp writes to stdout), cannot break it
    out = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    out.write(json.dumps({"ready": True}) + "\n")  # the time limit counts from here
    out.flush()
    for line in sys.stdin:
        task = json.loads(line)
        path, tokens = task["path"], None
        try:
            result = evaluate(path, task["mode"], task["repack"], task["tokenize"])
            outcome, detail = "ok", ""
            if "logits" in result:
                np.save(task["out"], result.pop("logits"))
            tokens = result.get("tokens")
        except NonFiniteLogitsError as e:
            outcome, detail = "nonfinite", str(e)
        except MemoryError as e:
            outcome, detail = "over-memory", f"MemoryError: {e}"
        except Exception as e:
            text = f"{type(e).__name__}: {e}"
            if "not enough memory" in text or "can't allocate memory" in text.lower():
                outcome = "over-memory"
            else:
                outcome = "clear-error" if path in str(e) or role == "llama.cpp" else "unclear-error"
            detail = text
        out.write(json.dumps({"outcome": outcome, "detail": detail[:400], "tokens": tokens}) + "\n")
        out.flush()


def _skip_python_chat_templates() -> None:
    """llama-cpp-python compiles every chat template of the file with Jinja when it loads a
    model; llama.cpp itself does not read them then, so a damaged template is not llama.cpp's
    verdict on the file (the fuzz never chats): compile none."""
    from llama_cpp import llama_chat_format

    class NotCompiled:
        def __init__(self, *args, **kwargs):
            pass

        def to_chat_handler(self):
            return None

    llama_chat_format.Jinja2ChatFormatter = NotCompiled


def _torchggml_eval(path: str, mode: str, repack: bool, tokenize: bool) -> dict:
    from torchggml.models import load_model
    if mode == "vocab":
        model = load_model(path, vocab_only=True, progress=False)
    else:
        # check_tensors: a table whose type was swapped for one of the same size decodes the bytes
        # into NaN/inf scales; the check rejects it at load instead of at eval
        model = load_model(path, n_ctx=16, n_batch=16, progress=False, repack=repack, check_tensors=True)
    try:
        result = {}
        if tokenize or mode == "vocab":
            result["tokens"] = [[model.tokenize(t, True, special) for t in TEXTS] for special in (False, True)]
            for ids in result["tokens"][1]:
                model.detokenize(ids)
        if mode == "model":
            import torch
            ids = [t % model.n_vocab for t in TOKENS]
            # a second call reads the cache the first one wrote
            result["logits"] = torch.cat([model.eval(ids[:3]), model.eval(ids[3:])]).numpy()
        return result
    finally:
        model.close()


def _llama_cpp_eval(path: str, mode: str, repack: bool, tokenize: bool) -> dict:
    """The oracle: llama.cpp's verdict on the file, its logits and its tokens."""
    import llama_cpp
    import numpy as np
    if mode == "vocab":
        llm = llama_cpp.Llama(path, vocab_only=True, verbose=False)
    else:
        llm = llama_cpp.Llama(path, n_ctx=16, n_batch=16, logits_all=True, n_threads=1, verbose=False)
    try:
        result = {}
        if tokenize or mode == "vocab":
            result["tokens"] = [[_llama_tokens(llm, t.encode(), special) for t in TEXTS] for special in (False, True)]
        if mode == "model":
            ids = [t % llm.n_vocab() for t in TOKENS]
            llm.eval(ids[:3])
            llm.eval(ids[3:])
            result["logits"] = np.array(llm.scores[:len(ids)], dtype=np.float32)
        return result
    finally:
        llm.close()


def _llama_tokens(llm, text: bytes, special: bool) -> list[int]:
    """llama.cpp's llama_tokenize into a buffer the size of the text (llama-cpp-python's
    tokenize allocates the model's n_ctx_train tokens: 8 GiB for a context length of 2^31-1)."""
    import llama_cpp
    vocab = llama_cpp.llama_model_get_vocab(llm._model.model)
    n = len(text) + 2
    while True:
        buf = (llama_cpp.llama_token * n)()
        got = llama_cpp.llama_tokenize(vocab, text, len(text), buf, n, True, special)
        if got >= 0:
            return list(buf[:got])
        n = -got


def logits_agree(ours, ref) -> tuple[bool, str]:
    """Same logits within the tolerance the clean sources need (different kernels and, for
    quantized weights, llama.cpp's 8-bit activations): 5% of the largest magnitude."""
    import numpy as np
    if ours.shape != ref.shape:
        return False, f"shapes {ours.shape} vs llama.cpp {ref.shape}"
    if not np.isfinite(ref).all():
        return False, "llama-nonfinite"
    err, scale = float(np.abs(ours - ref).max()), max(1.0, float(np.abs(ref).max()))
    return err <= 0.05 * scale, f"max |ours - llama.cpp| = {err:.4g} (largest logit {scale:.4g})"


def _vm_bytes() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmSize:"):
                return int(line.split()[1]) * 1024
    return 0


class Worker:
    """One worker process (role torchggml or llama.cpp) and the task it is running."""

    def __init__(self, index: int, tmpdir: str, mem_cap_mb: int, role: str = "torchggml"):
        self.path = os.path.join(tmpdir, f"mutant-{index}.gguf")
        self.out = os.path.join(tmpdir, f"logits-{index}-{role}.npy")
        self.mem_cap_mb, self.role = mem_cap_mb, role
        self.proc = None
        self.ready = False  # set by the worker's first line, after its imports and warm-up
        self.handled = 0
        self.task = None
        self.started = 0.0
        self.buffer = b""

    def start(self) -> None:
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
        self.proc = subprocess.Popen([sys.executable, __file__, "--worker", self.role, "--mem-cap-mb",
                                      str(self.mem_cap_mb)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                     env=env)
        os.set_blocking(self.proc.stdout.fileno(), False)
        self.handled, self.buffer, self.ready = 0, b"", False
        self.started = time.monotonic()

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()
            self.proc = None

    def submit(self, task, message: dict) -> None:
        self.task, self.started = task, time.monotonic()
        if os.path.exists(self.out):
            os.remove(self.out)
        self.proc.stdin.write((json.dumps(dict(message, out=self.out)) + "\n").encode())
        self.proc.stdin.flush()


class Pair:
    """A torchggml worker and, with the oracle, a llama.cpp worker sharing one mutant file: the
    oracle sees a mutant only when torchggml accepted it (a refusal is never silently wrong)."""

    def __init__(self, index: int, tmpdir: str, mem_cap_mb: int, oracle: bool):
        self.ours = Worker(index, tmpdir, mem_cap_mb)
        self.oracle = Worker(index, tmpdir, mem_cap_mb, "llama.cpp") if oracle else None
        self.pending = None  # (task, message, our answer) while the oracle works
        self.started = 0.0  # when the current mutant was made

    def workers(self):
        return [w for w in (self.ours, self.oracle) if w is not None]

    def idle(self) -> bool:
        return all(w.ready and w.task is None for w in self.workers()) and self.pending is None


def _oracle_available() -> bool:
    import importlib.util
    return importlib.util.find_spec("llama_cpp") is not None


def run(n: int, seed: int = 0, workers: int = 2, timeout: float = 60.0, mem_cap_mb: int = 2048,
        recycle: int = 400, sources=None, progress: bool = True, oracle: bool | None = None,
        checkpoint=None) -> dict:
    """Run mutants 0..n-1; the summary: counts per outcome, per mutation kind, and examples.
    oracle: compare every accepted mutant with llama.cpp (default: when llama-cpp-python is
    installed). checkpoint(summary so far) is called every 250 mutants. Interrupted (Ctrl-C,
    SIGTERM), the summary covers the mutants that finished ("interrupted": True)."""
    oracle = _oracle_available() if oracle is None else oracle
    sources = [Source(Path(p)) for p in (sources or default_sources())]
    counts, by_kind, examples = Counter(), defaultdict(Counter), defaultdict(list)
    by_source = defaultdict(Counter)
    seconds_by_source = Counter()
    t0 = time.monotonic()
    interrupted = False

    def summary() -> dict:
        seconds = time.monotonic() - t0
        return {"mutants": done, "interrupted": interrupted or done < n, "seed": seed, "seconds": round(seconds, 1),
                "s_per_mutant": round(seconds / max(done, 1), 3),
                "oracle": "llama.cpp (llama-cpp-python)" if oracle else None,
                "sources": [s.path.name for s in sources], "mem_cap_mb": mem_cap_mb, "timeout_s": timeout,
                "outcomes": {k: counts.get(k, 0) for k in OUTCOMES},
                "failures": sum(counts.get(k, 0) for k in FAILURES),
                "by_kind": {k: dict(v) for k, v in sorted(by_kind.items())},
                "by_source": {k: dict(v) for k, v in sorted(by_source.items())},
                "s_per_mutant_by_source": {k: round(seconds_by_source[k] / max(1, sum(v.values())), 3)
                                           for k, v in sorted(by_source.items())},
                "examples": dict(examples)}

    done = 0
    with tempfile.TemporaryDirectory(prefix="fuzz_gguf_") as tmpdir:
        pairs = [Pair(i, tmpdir, mem_cap_mb, oracle) for i in range(workers)]
        sel = selectors.DefaultSelector()
        next_i = 0

        def start(w: Worker) -> None:
            w.start()
            sel.register(w.proc.stdout, selectors.EVENT_READ, w)

        def restart(w: Worker) -> None:
            if w.proc is not None:
                sel.unregister(w.proc.stdout)
            w.stop()
            start(w)

        def record(pair: Pair, task, outcome: str, detail: str) -> None:
            nonlocal done
            i, src, kind = task
            seconds_by_source[src] += time.monotonic() - pair.started
            counts[outcome] += 1
            by_kind[kind.split(":")[0]][outcome] += 1
            by_source[src][outcome] += 1
            if outcome not in ("ok", "ok-unchecked") and len(examples[outcome]) < 12:
                examples[outcome].append({"mutant": i, "source": src, "mutation": kind, "detail": detail})
            if outcome in FAILURES and progress:
                print(f"FAIL {outcome} mutant {i} ({src}, {kind}): {detail}", file=sys.stderr, flush=True)
            done += 1
            if done % 250 == 0:
                if progress:
                    print(f"{done}/{n} {dict(counts)} {time.monotonic() - t0:.0f}s", file=sys.stderr, flush=True)
                if checkpoint is not None:
                    checkpoint(summary())

        def ours_answered(pair: Pair, task, message: dict, answer: dict) -> None:
            outcome, detail = answer["outcome"], answer["detail"]
            if outcome == "nonfinite":
                outcome = "nonfinite-data" if task[2] == "data" else "nonfinite-table"
            if outcome != "ok":
                return record(pair, task, outcome, detail)
            if pair.oracle is None:
                return record(pair, task, "ok-unchecked", "")
            pair.pending = (task, message, answer)
            try:
                pair.oracle.submit(task, message)
            except BrokenPipeError:
                oracle_answered(pair, {"outcome": "crash", "detail": "the oracle died"})

        def oracle_answered(pair: Pair, answer: dict) -> None:
            task, message, ours = pair.pending
            pair.pending = None
            if answer["outcome"] != "ok":
                return record(pair, task, "wrong-accept", f"llama.cpp: {answer['outcome']} {answer['detail']}")
            if ours["tokens"] != answer["tokens"]:
                return record(pair, task, "wrong-tokens", _first_difference(ours["tokens"], answer["tokens"]))
            if message["mode"] == "model":
                import numpy as np
                agree, detail = logits_agree(np.load(pair.ours.out), np.load(pair.oracle.out))
                if detail == "llama-nonfinite" and task[2] == "data":  # see the module doc
                    return record(pair, task, "llama-nonfinite", "llama.cpp's logits are not finite, ours are")
                if not agree:
                    return record(pair, task, "wrong-logits", detail)
            record(pair, task, "ok", "")

        def answered(w: Worker, pair: Pair, msg: dict) -> None:
            task, w.task = w.task, None
            w.handled += 1
            if w is pair.oracle:
                oracle_answered(pair, msg)
            else:
                ours_answered(pair, task, pair.ours.last_message, msg)

        owner = {}
        try:
            for pair in pairs:
                for w in pair.workers():
                    owner[id(w)] = pair
                    start(w)
            while done < n:
                for pair in pairs:
                    if pair.idle() and next_i < n:
                        for w in pair.workers():
                            if w.handled >= recycle:
                                restart(w)
                        if not pair.idle():
                            continue
                        src = sources[next_i % len(sources)]
                        kind, data = mutate(src, random.Random(f"{seed}:{next_i}"))
                        with open(pair.ours.path, "wb") as f:
                            f.write(data)
                        task = (next_i, src.path.name, kind)
                        pair.started = time.monotonic()
                        message = {"path": pair.ours.path, "repack": next_i % REPACK_EVERY == 0, "mode": src.mode,
                                   "tokenize": src.has_vocab}
                        pair.ours.last_message = message
                        try:
                            pair.ours.submit(task, message)
                        except BrokenPipeError:
                            pair.ours.task = None
                            record(pair, task, "crash", "the worker died before taking the mutant")
                            restart(pair.ours)
                        next_i += 1
                for key, _ in sel.select(timeout=1.0):
                    w = key.data
                    pair = owner[id(w)]
                    chunk = w.proc.stdout.read()
                    if chunk:
                        w.buffer += chunk
                        while b"\n" in w.buffer:
                            line, w.buffer = w.buffer.split(b"\n", 1)
                            try:
                                msg = json.loads(line)
                            except ValueError:  # not the protocol's: ignore it
                                continue
                            if msg.get("ready"):
                                w.ready = True
                            elif w.task is not None:
                                answered(w, pair, msg)
                    elif w.proc.poll() is not None:  # EOF: the worker died
                        if w.task is not None:
                            answered(w, pair, {"outcome": "crash", "tokens": None,
                                               "detail": f"{w.role} worker exit status {w.proc.returncode}"})
                        elif not w.ready:
                            raise RuntimeError(f"a fuzz worker ({w.role}) failed to start (exit status "
                                               f"{w.proc.returncode})")
                        restart(w)
                now = time.monotonic()
                for pair in pairs:
                    for w in pair.workers():
                        if w.task is not None and now - w.started > timeout:
                            answered(w, pair, {"outcome": "hang", "detail": f"{w.role}: no answer in {timeout:.0f} s",
                                               "tokens": None})
                            restart(w)
                        elif not w.ready and now - w.started > STARTUP_TIMEOUT:
                            raise RuntimeError(f"a fuzz worker did not start in {STARTUP_TIMEOUT} s")
        except (KeyboardInterrupt, SystemExit):  # report what finished
            interrupted = True
        finally:  # never leave workers behind, also on an interrupt
            for pair in pairs:
                for w in pair.workers():
                    w.stop()
    return summary()


def _first_difference(ours, ref) -> str:
    for special, (a_list, b_list) in enumerate(zip(ours or [], ref or [])):
        for text, a, b in zip(TEXTS, a_list, b_list):
            if a != b:
                return f"{text!r} (parse_special={bool(special)}): ours {a[:12]} vs llama.cpp {b[:12]}"
    return f"ours {str(ours)[:80]} vs llama.cpp {str(ref)[:80]}"


def vocab_model_path(vocab_name: str) -> Path:
    """A tiny llama model (Q8_0) with the vocabulary of a llama.cpp vocab file, written once to
    the cache: models with real tokenizers for the fuzzer."""
    from dataclasses import replace
    from torchggml.gguf.writer.tiny import TinyCase, write_tiny_model
    vocab = GOLDEN / "vocab" / vocab_name
    cache = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "torchggml" / "fuzz"
    path = cache / vocab_name.replace("ggml-vocab-", "model-")
    if path.exists():
        return path
    cache.mkdir(parents=True, exist_ok=True)
    vocab_src = Source(vocab)
    n_vocab = len(vocab_src.header.values["tokenizer.ggml.tokens"])
    tmp = path.with_suffix(".tmp")
    write_tiny_model(tmp, replace(TinyCase("llama-vocab", "llama"), n_vocab=n_vocab), "Q8_0")
    kvs, tensors, alignment, data = _parts(Source(tmp))
    kvs = [kv for kv in kvs if not kv[0].startswith("tokenizer.")]
    kvs += [[k, t, vocab_src.header.values.get(k)] for k, t in vocab_src.header.value_types.items()
            if k.startswith("tokenizer.")]
    path.write_bytes(serialize(kvs, tensors, alignment, data))
    tmp.unlink()
    return path


def default_sources(vocab: bool = True) -> list[Path]:
    """The golden models (no vocabulary), the demo model (a small trained BPE vocabulary) and,
    with vocab, tiny models carrying llama.cpp's SPM and GPT-2 vocabularies plus the vocabulary
    files themselves (tokenized only)."""
    paths = [GOLDEN / "models" / name for name in GOLDEN_SOURCES]
    from torchggml.gguf.writer.demo import demo_model_path
    paths = [p for p in paths if p.exists()] + [Path(demo_model_path())]
    if vocab:
        paths += [vocab_model_path(v) for v in VOCAB_MODELS if (GOLDEN / "vocab" / v).exists()]
        paths += [GOLDEN / "vocab" / v for v in VOCAB_FILES if (GOLDEN / "vocab" / v).exists()]
    return paths


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-n", "--mutants", type=int, default=1000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--timeout", type=float, default=60.0, help="seconds per mutant before it counts as a hang")
    ap.add_argument("--mem-cap-mb", type=int, default=2048, help="address space a worker may add (RLIMIT_AS)")
    ap.add_argument("--recycle", type=int, default=400, help="restart a worker after this many mutants")
    ap.add_argument("--json", help="write the summary (with failure examples) here")
    ap.add_argument("--no-oracle", action="store_true", help="do not compare with llama.cpp")
    ap.add_argument("--no-vocab", action="store_true", help="only the models without vocabularies")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        worker_main(args.mem_cap_mb, args.worker)
        return 0
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))  # run's cleanup stops the workers
    def write(summary):
        if args.json:
            Path(args.json).write_text(json.dumps(summary, indent=1))
    summary = run(args.mutants, args.seed, args.workers, args.timeout, args.mem_cap_mb, args.recycle,
                  sources=default_sources(vocab=not args.no_vocab), oracle=False if args.no_oracle else None,
                  checkpoint=write)
    write(summary)
    print(f"{'interrupted after ' if summary['interrupted'] else ''}{summary['mutants']} mutants in {summary['seconds']} s ({summary['s_per_mutant']} s each; seed "
          f"{summary['seed']}; oracle {summary['oracle']}; sources {', '.join(summary['sources'])})")
    for k in OUTCOMES:
        print(f"  {k:16s} {summary['outcomes'][k]}")
    for kind, c in summary["by_kind"].items():
        print(f"  {kind:14s} {c}")
    for source, c in summary["by_source"].items():
        print(f"  {source:36s} {summary['s_per_mutant_by_source'][source]:6.2f} s/mutant {c}")
    for k in FAILURES:
        for ex in summary["examples"].get(k, []):
            print(f"FAIL {k}: {ex}")
    return 1 if summary["failures"] else 0


if __name__ == "__main__":
    sys.exit(main())
