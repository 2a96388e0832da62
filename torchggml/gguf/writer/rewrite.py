"""A GGUF file taken apart and written back with changes, for tests and the fuzzer: its metadata
as editable [key, type name, value] lists, its tensor table as [name, ne, type id, offset] lists
and its tensor-data region, and `serialize` to write them as a GGUF v3 file.

    kvs, tensors, alignment, data = header_parts(path)
    next(kv for kv in kvs if kv[0] == "llama.rope.freq_base")[1:] = ["uint32", 10000]
    path.write_bytes(serialize(kvs, tensors, alignment, data))

Type names are the reader's (gguf/reader.py): "uint32", "float32", "string", "array[int32]"...
"""
from __future__ import annotations

import struct

import numpy as np

from ..loader import _scan

# GGUF value type ids and struct codes by name
TYPES = {"uint8": (0, "B"), "int8": (1, "b"), "uint16": (2, "H"), "int16": (3, "h"), "uint32": (4, "I"),
         "int32": (5, "i"), "float32": (6, "f"), "bool": (7, "?"), "uint64": (10, "Q"), "int64": (11, "q"),
         "float64": (12, "d")}


def header_parts(path) -> tuple[list, list, int, bytes]:
    """(kvs, tensors, alignment, data region) of the GGUF file at `path` (checked by the reader)."""
    h = _scan(str(path))
    with open(path, "rb") as f:
        f.seek(h.data_offset)
        data = f.read()
    kvs = [[k, t, h.values.get(k)] for k, t in h.value_types.items()]
    tensors = [[t.name, list(t.ne), t.type_id, t.offset] for t in h.tensors]
    return kvs, tensors, h.alignment, data


def _pack_string(text: str) -> bytes:
    raw = text.encode("utf-8")
    return struct.pack("<Q", len(raw)) + raw


def _pack_value(type_name: str, value) -> bytes:
    """Type id and value, as GGUF stores a metadata value."""
    if type_name == "string":
        return struct.pack("<I", 8) + _pack_string(value)
    if type_name.startswith("array["):
        item = type_name[6:-1]
        if item.startswith("array["):  # each item: an array without its value type id
            return struct.pack("<IIQ", 9, 9, len(value)) + b"".join(_pack_value(item, v)[4:] for v in value)
        if item == "string":
            return struct.pack("<IIQ", 9, 8, len(value)) + b"".join(_pack_string(v) for v in value)
        tid, code = TYPES[item]
        return struct.pack("<IIQ", 9, tid, len(value)) + np.asarray(value).astype("<" + code).tobytes()
    tid, code = TYPES[type_name]
    return struct.pack("<I" + code, tid, value)


def serialize(kvs: list, tensors: list, alignment: int, data: bytes) -> bytes:
    """A GGUF v3 file: kvs [(key, type name, value)], tensors [(name, ne, type id, offset)] and the
    tensor-data region (offsets count from its start)."""
    out = [b"GGUF", struct.pack("<IQQ", 3, len(tensors), len(kvs))]
    for key, type_name, value in kvs:
        out += [_pack_string(key), _pack_value(type_name, value)]
    for name, ne, type_id, offset in tensors:
        out += [_pack_string(name), struct.pack(f"<I{len(ne)}QIQ", len(ne), *ne, type_id, offset)]
    head = b"".join(out)
    return head + bytes(-len(head) % alignment) + data
