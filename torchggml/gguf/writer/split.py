"""A GGUF file split into several, as llama.cpp's gguf-split --split-max-tensors N writes them:
PREFIX-00001-of-0000K.gguf with the metadata and split.no / split.count / split.tensors.count, the
others with those three keys only; each holds the next N tensors in file order (the bytes as they
are). The loader opens the result from its first file.

    split_gguf("model.gguf", "out/model", max_tensors=64)   # -> the paths written
"""
from __future__ import annotations

from ..loader import SPLIT_KEYS, open_gguf, split_path
from .stream import StreamWriter, kv_record


def split_gguf(src: str, prefix: str, max_tensors: int) -> list[str]:
    if max_tensors < 1:
        raise ValueError(f"split_gguf: max_tensors must be at least 1, not {max_tensors}")
    f = open_gguf(src)
    try:
        if f.parts:
            raise ValueError(f"split_gguf: {src} is already split in {1 + len(f.parts)} files")
        names = list(f.tensors)
        groups = [names[i:i + max_tensors] for i in range(0, len(names), max_tensors)] or [[]]
        head = [f.kv_record(k) for k in f.metadata if k not in SPLIT_KEYS]
        paths = []
        for i, group in enumerate(groups):
            split = [kv_record("split.no", "uint16", i), kv_record("split.count", "uint16", len(groups)),
                     kv_record("split.tensors.count", "int32", len(names))]
            path = split_path(prefix, i, len(groups))
            w = StreamWriter(path, (head if i == 0 else []) + split,
                             [(n, list(f.tensors[n].ne), int(f.tensors[n].type), f.tensors[n].nbytes) for n in group],
                             f.alignment)
            for n in group:
                w.write(f.tensor_data(n))
            w.close()
            paths.append(path)
        return paths
    finally:
        f.close()
