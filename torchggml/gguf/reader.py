"""A bounded scan of a GGUF file's header (metadata and tensor table), before anything trusts it.

The `gguf` package's reader believes every count in the file: an array that claims 2^32 items
makes it build objects for minutes. This scan reads the header with plain struct unpacking and
checks every count and length against the bytes left in the file *before* using it, so a
corrupt header costs at most one pass over the file's bytes. It then checks the tensor table:
known types, 1-4 dimensions, block-size multiples, aligned offsets, data ranges inside the
file and laid out one after the other in table order (as ggml's own reader requires, so no
two overlap), and a data region that the table accounts for (no more than alignment padding
after the last tensor).

Every problem raises GGUFError naming the file and the key or tensor.
"""
from __future__ import annotations

import math
import struct
from dataclasses import dataclass, field

import numpy as np

__all__ = ["GGUFError", "Header", "TensorEntry", "scan_header", "check_hparam", "HPARAM_RULES", "PER_LAYER_KEYS"]


class GGUFError(ValueError):
    """A GGUF file that cannot be used: truncated, corrupt, unsupported, or missing a key."""


# GGUF value types: id -> (name, struct code); STRING and ARRAY have no fixed size
_STRING, _ARRAY = 8, 9
_FIXED = {0: ("uint8", "B"), 1: ("int8", "b"), 2: ("uint16", "H"), 3: ("int16", "h"), 4: ("uint32", "I"),
          5: ("int32", "i"), 6: ("float32", "f"), 7: ("bool", "?"), 10: ("uint64", "Q"), 11: ("int64", "q"),
          12: ("float64", "d")}
SUPPORTED_VERSIONS = (2, 3)
MAX_NAME = 64          # ggml's GGML_MAX_NAME: tensor names are shorter
MAX_DIMS = 4
MAX_NESTING = 4        # arrays of arrays of ...
MAX_ALIGNMENT = 1 << 20
_NUMERIC_KEEP = 1 << 16  # numeric arrays up to this many items are lists (per-layer hyper-parameters)


@dataclass(frozen=True)
class TensorEntry:
    name: str
    ne: tuple[int, ...]
    type_id: int
    offset: int          # from the start of the data region


@dataclass
class Header:
    version: int
    byte_order: str                                   # "<" or ">"
    values: dict[str, object] = field(default_factory=dict)   # every value except arrays of arrays
    value_types: dict[str, str] = field(default_factory=dict)  # key -> type name ("array[uint32]", ...)
    kv_spans: dict[str, tuple[int, int]] = field(default_factory=dict)  # key -> its record's bytes [start, end)
    tensors: list[TensorEntry] = field(default_factory=list)
    alignment: int = 32
    header_end: int = 0                                # where the tensor table ends
    data_offset: int = 0                               # header_end rounded up to the alignment


class _Cursor:
    """Reads values from `buf` at `pos`, never past its end, naming the file and `what`."""

    def __init__(self, path: str, buf, order: str):
        self.path, self.buf, self.order, self.pos = path, buf, order, 0
        self.size = len(buf)

    def left(self) -> int:
        return self.size - self.pos

    def fail(self, what: str, problem: str):
        raise GGUFError(f"{self.path}: {what}: {problem} (at byte {self.pos} of {self.size}; "
                        f"the file is truncated or corrupt)")

    def need(self, n: int, what: str) -> None:
        if n > self.left():
            self.fail(what, f"needs {n} bytes but only {self.left()} are left")

    def unpack(self, code: str, what: str):
        n = struct.calcsize(code)
        self.need(n, what)
        value = struct.unpack_from(self.order + code, self.buf, self.pos)[0]
        self.pos += n
        return value

    def count(self, what: str, item_size: int) -> int:
        """A u64 count of items of at least item_size bytes each, checked against the bytes left."""
        n = self.unpack("Q", what)
        if n * item_size > self.left():
            self.fail(what, f"count {n} needs at least {n * item_size} bytes but only {self.left()} are left")
        return n

    def string(self, what: str) -> str:
        n = self.count(f"{what} (string length)", 1)
        raw = bytes(self.buf[self.pos: self.pos + n])
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as e:
            self.fail(what, f"the string is not valid UTF-8 ({e.reason} at byte {e.start})")
        self.pos += n
        return text

    def strings(self, n: int, what: str) -> list[str]:
        """n strings, each checked (length, UTF-8), without a Python step per string where it
        can: where they start is found by _short_string_starts (or one Python pass over the
        length fields), then _split_strings decodes them all at once. A string cut short or not
        valid UTF-8 falls back to string() one by one, which names it."""
        found = _short_string_starts(self.buf, self.pos, n, self.order) if n else (np.zeros(0, np.int64), self.pos)
        if found is None:
            found = self._string_starts(n)
        out = _split_strings(self.buf, self.pos, *found) if found is not None else None
        if out is None:
            return [self.string(f"{what}[{i}]") for i in range(n)]
        self.pos = found[1]
        return out

    def _string_starts(self, n: int) -> tuple[np.ndarray, int] | None:
        """(where each of the n strings' length field is, from self.pos; where the last string
        ends), read one by one; None where one runs past the end of the buffer."""
        end, starts = self.pos, [0] * n
        length = struct.Struct(self.order + "Q").unpack_from
        try:
            for i in range(n):
                starts[i] = end
                end += 8 + length(self.buf, end)[0]
        except struct.error:  # a length field past the end of the buffer
            return None
        return (np.array(starts, dtype=np.int64) - self.pos, end) if end <= self.size else None


def _short_string_starts(buf, start: int, n: int, order: str) -> tuple[np.ndarray, int] | None:
    """_Cursor._string_starts for n strings shorter than 256 bytes, none empty or holding a NUL
    byte (a vocabulary's, a merge list's): every position in a window of the buffer whose next
    7 bytes (a little-endian length's high bytes) are zero is a candidate length field; the
    candidates are those fields when the first is at `start` and each next one follows the
    string its predecessor's length gives (checked for all). The window grows until it holds n
    candidates. None when they do not chain so: the caller reads the fields one by one."""
    size = len(buf)
    high, low = (slice(1, 8), 0) if order == "<" else (slice(0, 7), 7)  # the length's zero bytes, its value's byte
    window = min(size - start, 24 * n + 4096)
    while True:
        data = np.frombuffer(buf, np.uint8, count=window, offset=start)
        nonzero = data != 0
        m = window - 7  # positions with a whole length field in the window
        zero = ~nonzero[high.start:high.start + m]
        for k in range(high.start + 1, high.stop):
            zero &= ~nonzero[k:k + m]
        found = np.flatnonzero(zero)
        if len(found) >= n:
            found = found[:n]
            lengths = data[found + low].astype(np.int64)
            end = start + int(found[-1]) + 8 + int(lengths[-1])
            if found[0] == 0 and end <= size and (found[1:] == found[:-1] + 8 + lengths[:-1]).all():
                return found, end
            return None
        if window == size - start:
            return None
        window = min(size - start, 2 * window)


def _split_strings(buf, start: int, fields: np.ndarray, end: int) -> list[str] | None:
    """The strings of buf[start:end], each after its 8-byte length at `fields` (offsets from
    start), decoded at once: numpy drops the lengths but for one byte each, which becomes a
    control character that no string holds (_SEPARATORS), and one strict decode and one split
    give the strings. None where one is not valid UTF-8 (or every separator occurs in them)."""
    if not len(fields):
        return []
    keep = np.ones(end - start, dtype=bool)
    for k in range(7):
        keep[fields + k] = False
    data = np.frombuffer(buf, np.uint8, count=end - start, offset=start)[keep]
    separators = fields - 7 * np.arange(len(fields))  # each length's last byte, where it is now
    data[separators] = 0
    text = data.tobytes()  # the strings, each after a NUL that stands for its separator
    sep = next((c for c in _SEPARATORS if text.find(c) < 0), None)
    if sep is None:
        return None
    data[separators] = sep[0]
    try:  # a separator ends any multi-byte sequence cut at a string's end: invalid too
        parts = data.tobytes().decode("utf-8").split(sep.decode())
    except UnicodeDecodeError:
        return None
    del parts[0]  # before the first separator
    return parts


_SEPARATORS = [bytes([c]) for c in (*range(1, 32), 127)]  # ASCII controls: rare in vocabularies


def _min_size(type_id: int) -> int:
    if type_id in _FIXED:
        return struct.calcsize(_FIXED[type_id][1])
    return 8 if type_id == _STRING else 12


def _read_value(cur: _Cursor, type_id: int, what: str, depth: int = 0):
    """(value or None, type name). Scalars, strings, arrays of strings (lists) and numeric
    arrays (lists up to _NUMERIC_KEEP items, e.g. per-layer hyper-parameters; numpy arrays
    beyond, e.g. token scores) are decoded; arrays of arrays are checked and skipped (None)."""
    if type_id in _FIXED:
        name, code = _FIXED[type_id]
        return cur.unpack(code, what), name
    if type_id == _STRING:
        return cur.string(what), "string"
    if type_id != _ARRAY:
        cur.fail(what, f"unknown value type id {type_id}")
    if depth >= MAX_NESTING:
        cur.fail(what, f"arrays nested deeper than {MAX_NESTING}")
    item_type = cur.unpack("I", f"{what} (array item type)")
    if item_type == _ARRAY:  # llama.cpp's reader refuses them in any key ("has invalid GGUF type")
        cur.fail(what, "an array of arrays: GGUF readers (llama.cpp's) do not accept nested arrays")
    if item_type not in _FIXED and item_type != _STRING:
        cur.fail(what, f"unknown array item type id {item_type}")
    n = cur.count(f"{what} (array count)", _min_size(item_type))
    if item_type in _FIXED:
        name, code = _FIXED[item_type]
        size = struct.calcsize(code) * n
        if n <= _NUMERIC_KEEP:
            value = list(struct.unpack_from(f"{cur.order}{n}{code}", cur.buf, cur.pos))
        else:  # a copy in native byte order: the buffer may be a mapping closed after the scan
            dtype = np.dtype(cur.order + code)
            value = np.frombuffer(cur.buf, dtype=dtype, count=n, offset=cur.pos).astype(dtype.newbyteorder("="))
        cur.pos += size
        return value, f"array[{name}]"
    if item_type == _STRING:
        return cur.strings(n, what), "array[string]"
    for i in range(n):  # each item is an array with its own item type and count
        _read_value(cur, _ARRAY, f"{what}[{i}]", depth + 1)
    return None, "array[array]"


def scan_header(path: str, buf, type_check) -> Header:
    """Scan and check the header of the GGUF bytes `buf` (any buffer: bytes, mmap, memoryview).
    `type_check(entry) -> nbytes` checks one tensor's type and shape and returns its size."""
    size = len(buf)
    if size < 4 or bytes(buf[:4]) != b"GGUF":
        raise GGUFError(f"{path}: not a GGUF file (starts with {bytes(buf[:4])!r}, expected b'GGUF')")
    cur = _Cursor(path, buf, "<")
    cur.pos = 4
    version = cur.unpack("I", "version")
    if version & 0xFFFF == 0 and version:  # written on a big-endian machine
        cur.order, version = ">", struct.unpack(">I", struct.pack("<I", version))[0]
    if version not in SUPPORTED_VERSIONS:
        raise GGUFError(f"{path}: GGUF version {version} is not supported (supported: {SUPPORTED_VERSIONS})")
    h = Header(version, cur.order)
    # the smallest tensor-info entry: empty name, 1 dim, type, offset
    n_tensors = cur.count("tensor count", 8 + 4 + 8 + 4 + 8)
    n_kv = cur.count("metadata key count", 8 + 4 + 1)
    for i in range(n_kv):
        start = cur.pos
        key = cur.string(f"metadata key #{i}")
        if key in h.value_types:
            cur.fail(f"metadata key {key!r}", "the key appears twice")
        type_id = cur.unpack("I", f"metadata key {key!r} (value type)")
        value, type_name = _read_value(cur, type_id, f"metadata key {key!r}")
        h.value_types[key] = type_name
        h.kv_spans[key] = (start, cur.pos)
        if value is not None:
            h.values[key] = value
    h.alignment = _alignment(path, h)
    names = set()
    for i in range(n_tensors):
        name = cur.string(f"tensor #{i} name")
        what = f"tensor {name!r}"
        if len(name.encode()) >= MAX_NAME:
            cur.fail(what, f"the name is longer than {MAX_NAME - 1} bytes")
        if name in names:
            cur.fail(what, "the name appears twice in the tensor table")
        names.add(name)
        n_dims = cur.unpack("I", f"{what} (number of dimensions)")
        if not 1 <= n_dims <= MAX_DIMS:
            cur.fail(what, f"has {n_dims} dimensions (1 to {MAX_DIMS} are allowed)")
        ne = tuple(cur.unpack("Q", f"{what} (dimension {d})") for d in range(n_dims))
        type_id = cur.unpack("I", f"{what} (type)")
        offset = cur.unpack("Q", f"{what} (data offset)")
        h.tensors.append(TensorEntry(name, ne, type_id, offset))
    h.header_end = cur.pos
    h.data_offset = -(-cur.pos // h.alignment) * h.alignment
    _check_data_ranges(path, h, size, type_check)
    return h


def _alignment(path: str, h: Header) -> int:
    a = h.values.get("general.alignment", 32)
    if h.value_types.get("general.alignment", "uint32") != "uint32":
        raise GGUFError(f"{path}: metadata key 'general.alignment' must be a uint32, "
                        f"not {h.value_types['general.alignment']}")
    if not 1 <= a <= MAX_ALIGNMENT or a & (a - 1):
        raise GGUFError(f"{path}: metadata key 'general.alignment' = {a} is not a power of two "
                        f"between 1 and {MAX_ALIGNMENT}")
    return a


def _check_data_ranges(path: str, h: Header, file_size: int, type_check) -> None:
    """As ggml's own reader requires: in table order, each tensor's data starts where the
    previous one's (padded to the alignment) ends, and lies inside the file; the region ends
    within one alignment unit after the last tensor. A changed type, shape or offset, a table
    entry missing or added, or a changed alignment breaks one of these."""
    if not h.tensors:
        return
    region = file_size - h.data_offset
    if region < 0:
        raise GGUFError(f"{path}: the tensor data region starts at byte {h.data_offset}, past the end "
                        f"of the {file_size}-byte file: the file is truncated or corrupt")
    expected = end = 0
    for t in h.tensors:
        where = f"{path}: tensor {t.name!r}"
        nbytes = type_check(t)
        if t.offset % h.alignment:
            raise GGUFError(f"{where}: data offset {t.offset} is not aligned to {h.alignment} bytes "
                            f"(the file is corrupt)")
        start = h.data_offset + t.offset
        if start + nbytes > file_size:
            raise GGUFError(f"{where} (ne={list(t.ne)}) needs bytes [{start}, {start + nbytes}) but the "
                            f"file has {file_size} bytes: the file is truncated or corrupt")
        if t.offset != expected:
            raise GGUFError(f"{where}: data offset {t.offset} is not where the previous tensor's data "
                            f"ends ({expected}): tensors overlap or the table is corrupt")
        end = t.offset + nbytes
        expected = -(-end // h.alignment) * h.alignment
    if region - end >= h.alignment:
        raise GGUFError(f"{path}: {region - end} bytes after the last tensor's data are not described by "
                        f"the tensor table (a missing entry or a wrong alignment?): the file is corrupt")


# ---------------------------------------------------------------- hyper-parameters

# `{arch}.<suffix>` -> (kind, lowest, highest) of the hyper-parameters the architectures read.
# Types as llama.cpp's loader demands them (its get_key checks the exact type): an "int" is a
# uint32 scalar, a "float" a float32 scalar; the per-layer keys (PER_LAYER_KEYS, llama.cpp's
# get_key_or_arr) may instead be an int32/uint32 array with one item per layer, and for the keys
# in _PER_LAYER_MAY_BE_ZERO an item may be 0 (a layer without that part) as long as one is not.
HPARAM_RULES = {
    "context_length": ("int", 0, 2**31 - 1),  # 0 loads in llama.cpp (a context size must then be given)
    "embedding_length": ("int", 1, 2**20),
    "block_count": ("int", 1, 2**16),
    "feed_forward_length": ("int", 0, 2**24),  # 0 in some mixture-of-experts models
    "attention.head_count": ("int", 1, 2**16),
    "attention.head_count_kv": ("int", 1, 2**16),
    "attention.key_length": ("int", 1, 2**16),
    "attention.value_length": ("int", 1, 2**16),
    "attention.sliding_window": ("int", 0, 2**31 - 1),
    "rope.dimension_count": ("int", 0, 2**16),
    "rope.scaling.original_context_length": ("int", 0, 2**31 - 1),
    "vocab_size": ("int", 1, 2**31 - 1),
    "expert_count": ("int", 0, 2**16),
    "expert_used_count": ("int", 0, 2**16),
    "expert_feed_forward_length": ("int", 0, 2**24),
    "expert_shared_feed_forward_length": ("int", 0, 2**24),
    "attention.layer_norm_rms_epsilon": ("float", 1e-30, 1.0),  # 0 divides by zero on a zero row
    "attention.layer_norm_epsilon": ("float", 1e-30, 1.0),
    "rope.freq_base": ("float", 1e-6, 1e15),
    "rope.freq_base_swa": ("float", 1e-6, 1e15),
    "rope.scaling.factor": ("float", 0.0, 1e6),
    "rope.scale_linear": ("float", 0.0, 1e6),
    "rope.scaling.attn_factor": ("float", -1e6, 1e6),
    "rope.scaling.yarn_beta_fast": ("float", -1e6, 1e6),
    "rope.scaling.yarn_beta_slow": ("float", -1e6, 1e6),
    "rope.scaling.yarn_log_multiplier": ("float", -1e6, 1e6),
    "attention.temperature_scale": ("float", -1e6, 1e6),
    "attn_logit_softcapping": ("float", 0.0, 1e6),
    "final_logit_softcapping": ("float", 0.0, 1e6),
    "logit_scale": ("float", -1e6, 1e6),
}
PER_LAYER_KEYS = {"feed_forward_length", "attention.head_count", "attention.head_count_kv"}
_PER_LAYER_MAY_BE_ZERO = {"attention.head_count", "attention.head_count_kv"}
_SCALAR_TYPE = {"int": "uint32", "float": "float32"}
# architectures without attention: their converters write head counts of 0
ATTENTION_FREE_ARCHS = frozenset({"mamba", "mamba2", "rwkv6", "rwkv7"})
# token ids: uint32, as llama.cpp reads them; the tokenizer drops ids outside the vocabulary
_TOKEN_ID_SUFFIX = "_token_id"
# general and tokenizer keys and the types llama.cpp reads them as (its get_key checks the exact
# type; array data it casts to the C type it expects, so another item type would be garbage)
KEY_TYPES = {
    "general.architecture": ("string",), "general.name": ("string",), "general.file_type": ("uint32",),
    "tokenizer.ggml.model": ("string",), "tokenizer.ggml.pre": ("string",),
    "tokenizer.ggml.tokens": ("array[string]",), "tokenizer.ggml.merges": ("array[string]",),
    "tokenizer.ggml.token_type": ("array[int32]", "array[uint32]"), "tokenizer.ggml.scores": ("array[float32]",),
    "tokenizer.ggml.precompiled_charsmap": ("array[uint8]", "array[int8]"), "tokenizer.chat_template": ("string",),
    **{f"tokenizer.ggml.{flag}": ("bool",) for flag in (
        "add_bos_token", "add_eos_token", "add_sep_token", "add_space_prefix", "remove_extra_whitespaces",
        "normalizer.lowercase", "normalizer.strip_accents")},
}


def check_hparam(path: str, key: str, suffix: str | None, value, type_name: str) -> None:
    """GGUFError naming the file and key when a known hyper-parameter has the wrong type or is
    out of range. suffix: the key without its `{arch}.` prefix (None for other keys)."""
    if key.startswith("tokenizer.ggml.") and key.endswith(_TOKEN_ID_SUFFIX):
        if type_name != "uint32":
            raise GGUFError(f"{path}: metadata key {key!r} must be a uint32 token id, not {type_name}")
        return
    if key in KEY_TYPES:
        if type_name not in KEY_TYPES[key]:
            raise GGUFError(f"{path}: metadata key {key!r} must be {' or '.join(KEY_TYPES[key])}, not {type_name}")
        return
    rule = HPARAM_RULES.get(suffix) if suffix is not None else None
    if rule is None:
        return
    kind, lo, hi = rule
    scalar = _SCALAR_TYPE[kind]
    if type_name.startswith("array["):
        if suffix not in PER_LAYER_KEYS:
            raise GGUFError(f"{path}: metadata key {key!r} must be a {scalar}, not {type_name} ({_short(value)})")
        if type_name not in ("array[int32]", "array[uint32]") or not isinstance(value, list):
            raise GGUFError(f"{path}: metadata key {key!r} must be a {scalar} or a per-layer int32/uint32 "
                            f"array, not {type_name}")
    elif type_name != scalar:
        raise GGUFError(f"{path}: metadata key {key!r} must be a {scalar}, not {type_name} ({_short(value)})")
    items = value if isinstance(value, list) else [value]
    if not items:
        raise GGUFError(f"{path}: metadata key {key!r} is an empty array")
    may_be_zero = isinstance(value, list) and suffix in _PER_LAYER_MAY_BE_ZERO
    for v in items:
        if not ((math.isfinite(v) and lo <= v <= hi) or (may_be_zero and v == 0)):
            raise GGUFError(f"{path}: metadata key {key!r} = {_short(value)} is out of range "
                            f"(expected {lo} to {hi})")
    if may_be_zero and max(items) == 0:
        raise GGUFError(f"{path}: metadata key {key!r} is 0 for every layer")


def _short(value) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."
