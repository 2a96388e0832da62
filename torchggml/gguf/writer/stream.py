"""A GGUF v3 file written tensor by tensor (quantize's output): the header first (metadata records
and the tensor table, each tensor's size known), then each tensor's bytes as they are made, padded
to the alignment, so that no more than one tensor is held in memory.

    w = StreamWriter(path, [kv_record("general.architecture", "string", "llama"), raw_record, ...],
                     [(name, ne, type id, nbytes), ...], alignment=32)
    for data in tensors_in_table_order: w.write(data)
    w.close()

Metadata records are bytes as GGUF stores them (key, value type, value): kv_record packs one, and
GGUFFile.kv_record gives one of an open file's as it is there (long vocabularies copied, not decoded
and packed again).
"""
from __future__ import annotations

import struct

import numpy as np

from .rewrite import _pack_string, _pack_value


def kv_record(key: str, type_name: str, value) -> bytes:
    """A metadata record: type names as the reader's ("uint32", "string", "array[int32]"...)."""
    return _pack_string(key) + _pack_value(type_name, value)


class StreamWriter:
    def __init__(self, path, kv_records: list[bytes], tensors: list[tuple[str, list[int], int, int]],
                 alignment: int = 32):
        self.path, self.alignment = str(path), alignment
        self._sizes = [nbytes for _, _, _, nbytes in tensors]
        self._names = [name for name, _, _, _ in tensors]
        head = [b"GGUF", struct.pack("<IQQ", 3, len(tensors), len(kv_records)), *kv_records]
        offset = 0
        for name, ne, type_id, nbytes in tensors:
            head += [_pack_string(name), struct.pack(f"<I{len(ne)}QIQ", len(ne), *ne, type_id, offset)]
            offset += -(-nbytes // alignment) * alignment
        head = b"".join(head)
        self._file = open(self.path, "wb")
        self._file.write(head + bytes(-len(head) % alignment))
        self._next = 0

    def write(self, data: np.ndarray) -> None:
        """The next tensor's bytes (in table order)."""
        i = self._next
        if i >= len(self._sizes):
            raise ValueError(f"{self.path}: more tensors written than the {len(self._sizes)} in its table")
        data = np.ascontiguousarray(data).view(np.uint8).reshape(-1)
        if data.size != self._sizes[i]:
            raise ValueError(f"{self.path}: tensor {self._names[i]!r} has {data.size} bytes, its table entry "
                             f"{self._sizes[i]}")
        self._file.write(memoryview(data))
        self._file.write(bytes(-data.size % self.alignment))
        self._next += 1

    def close(self) -> None:
        if self._file.closed:
            return
        self._file.close()
        if self._next != len(self._sizes):
            raise ValueError(f"{self.path}: {self._next} of the {len(self._sizes)} tensors in its table were written")
