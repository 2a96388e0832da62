"""GGUF files -> ggml tensors in weight buffers. The project's one GGUF reader (models,
tokenizer, CLI): header and metadata parsed here, tensor data memory-mapped.

    f = open_gguf("model.gguf")             # header, metadata and tensor table, checked
    f.get("llama.block_count")              # metadata
    w = load_weights(f, buft_of=lambda name: cpu_buffer_type())

The reader memory-maps the file (copy-on-write, so the mapping is writable but the file is
never modified). Weights placed in CPU memory are zero-copy: one CPU buffer covers the file's
tensor-data region and each tensor's address is `base + its offset`. Weights for other
devices are copied into buffers of those devices, with a progress bar. Every weight buffer
carries BufferUsage.WEIGHTS.

A truncated, corrupt or unsupported file raises GGUFError naming the file, the tensor (or
key) and the problem.
"""
from __future__ import annotations

import os
import struct
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

import numpy as np

from .backend.buffer import BufferType, Buffer, BufferUsage
from .context import Context, new_tensor_impl
from .tensor import Tensor, set_name
from .types import Type, type_traits, type_name

__all__ = ["GGUFError", "TensorInfo", "GGUFFile", "open_gguf", "Weights", "load_weights"]

_MISSING = object()


class GGUFError(ValueError):
    """A GGUF file that cannot be used: truncated, corrupt, unsupported, or missing a key."""


@dataclass(frozen=True)
class TensorInfo:
    """One entry of the file's tensor table. `ne` is in ggml order (ne[0] innermost, 1-4
    dims); `offset` counts from the start of the tensor-data region."""
    name: str
    type: Type
    ne: tuple[int, ...]
    offset: int
    nbytes: int

    @property
    def n_elements(self) -> int:
        return int(np.prod(self.ne))


_SCALAR_FORMATS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?",
                   10: "Q", 11: "q", 12: "d"}  # GGUF value type -> struct format
_STRING, _ARRAY = 8, 9
DEFAULT_ALIGNMENT = 32


class _HeaderCursor:
    """Sequential reader of a GGUF header (key/values, then the tensor table) in either byte
    order. Arrays of numbers are read as one numpy array, strings as str (invalid UTF-8
    replaced), so a 150k-token vocabulary reads in a fraction of a second."""

    def __init__(self, buf, endian: str):
        self.buf, self.pos, self.endian = buf, 4, endian  # after the magic

    def scalar(self, code: str):
        (value,) = struct.unpack_from(self.endian + code, self.buf, self.pos)
        self.pos += struct.calcsize(code)
        return value

    def string(self) -> str:
        n = self.scalar("Q")
        if self.pos + n > len(self.buf):
            raise ValueError(f"a string of {n} bytes at offset {self.pos} runs past the end")
        raw = self.buf[self.pos:self.pos + n]
        self.pos += n
        return str(raw, "utf-8", errors="replace")

    def value(self, vtype: int, key: str):
        if vtype == _STRING:
            return self.string()
        if vtype == _ARRAY:
            etype, count = self.scalar("I"), self.scalar("Q")
            if etype == _STRING:
                return [self.string() for _ in range(count)]
            if etype not in _SCALAR_FORMATS:
                raise GGUFError(f"metadata key {key!r}: array of unknown value type {etype}")
            dtype = np.dtype(_SCALAR_FORMATS[etype]).newbyteorder(self.endian)
            arr = np.frombuffer(self.buf, dtype=dtype, count=count, offset=self.pos)
            self.pos += dtype.itemsize * count
            return arr.astype(dtype.newbyteorder("="))
        if vtype not in _SCALAR_FORMATS:
            raise GGUFError(f"metadata key {key!r} has unknown value type {vtype}")
        return self.scalar(_SCALAR_FORMATS[vtype])


def _read_header(path: str, buf) -> tuple[dict[str, Any], list, int]:
    """(metadata, [(name, dims, raw type, offset)], end of the tensor table) of a GGUF file."""
    (version,) = struct.unpack_from("<I", buf, 4)
    endian = ">" if version & 0xFFFF == 0 else "<"  # a big-endian file reads as 0xVV000000
    cur = _HeaderCursor(buf, endian)
    version = cur.scalar("I")
    if version < 2:
        raise GGUFError(f"{path}: GGUF version {version} is not supported (need 2 or later)")
    n_tensors, n_kv = cur.scalar("Q"), cur.scalar("Q")
    metadata: dict[str, Any] = {}
    for _ in range(n_kv):
        key = cur.string()
        try:
            metadata[key] = cur.value(cur.scalar("I"), key)
        except GGUFError as e:
            raise GGUFError(f"{path}: {e}") from None
    infos = []
    for _ in range(n_tensors):
        name = cur.string()
        dims = [cur.scalar("Q") for _ in range(cur.scalar("I"))]
        infos.append((name, dims, cur.scalar("I"), cur.scalar("Q")))
    return metadata, infos, cur.pos


def _check_tensor_table(path, infos, data_offset: int, file_size: int, alignment: int) -> list[TensorInfo]:
    """TensorInfos for (name, dims, raw type id, relative offset) entries; GGUFError on the
    first entry that is unsupported or does not fit in the file."""
    out = []
    for name, dims, raw_type, offset in infos:
        where = f"{path}: tensor {name!r}"
        try:
            type = Type(raw_type)
        except ValueError:
            raise GGUFError(f"{where} has unknown or unsupported ggml type id {raw_type}") from None
        tr = type_traits(type)
        if not 1 <= len(dims) <= 4 or any(d < 0 for d in dims):
            raise GGUFError(f"{where} has invalid dimensions {dims}")
        if dims[0] % tr.blck_size:
            raise GGUFError(f"{where}: ne[0]={dims[0]} is not a multiple of {tr.name}'s block size "
                            f"{tr.blck_size}")
        if offset % alignment:
            raise GGUFError(f"{where}: data offset {offset} is not aligned to {alignment} bytes "
                            f"(the file is corrupt)")
        nbytes = int(np.prod(dims)) // tr.blck_size * tr.type_size
        start = data_offset + offset
        if start + nbytes > file_size:
            raise GGUFError(f"{where} ({type_name(type)}, ne={dims}) needs bytes [{start}, "
                            f"{start + nbytes}) but the file has {file_size} bytes: the file is "
                            f"truncated or corrupt")
        out.append(TensorInfo(name, type, tuple(dims), offset, nbytes))
    return out


def _check_magic(path: str) -> None:
    with open(path, "rb") as f:
        magic = f.read(4)
    if magic != b"GGUF":
        raise GGUFError(f"{path}: not a GGUF file (starts with {magic!r}, expected b'GGUF')")


class GGUFFile:
    """An open GGUF file: metadata, tensor table, and the memory-mapped tensor data."""

    def __init__(self, path: str | os.PathLike):
        self.path = os.fspath(path)
        if not os.path.isfile(self.path):
            raise FileNotFoundError(f"GGUF file not found: {self.path}")
        _check_magic(self.path)
        # "c": copy-on-write mapping, writable for torch, never written back to the file
        self.data = np.memmap(self.path, dtype=np.uint8, mode="c")
        self.file_size = int(len(self.data))
        try:
            self.metadata, infos, header_end = _read_header(self.path, memoryview(self.data))
        except GGUFError:
            raise
        except Exception as e:  # struct/numpy errors: the header runs past the end of the file
            raise GGUFError(f"{self.path}: the GGUF header (metadata and tensor table) cannot be read "
                            f"from this {self.file_size}-byte file: it is truncated or corrupt "
                            f"({type(e).__name__}: {e})") from None
        self.alignment = int(self.metadata.get("general.alignment", DEFAULT_ALIGNMENT))
        if self.alignment <= 0 or self.alignment & (self.alignment - 1):
            raise GGUFError(f"{self.path}: general.alignment = {self.alignment} is not a power of two")
        self.data_offset = -(-header_end // self.alignment) * self.alignment
        checked = _check_tensor_table(self.path, infos, self.data_offset, self.file_size, self.alignment)
        self.tensors: dict[str, TensorInfo] = {t.name: t for t in checked}

    def __repr__(self):
        return f"<GGUFFile {self.path} arch={self.arch!r} {len(self.tensors)} tensors>"

    # ------------------------------------------------------------ metadata

    @property
    def keys(self) -> list[str]:
        """Metadata keys, in file order."""
        return list(self.metadata)

    def get(self, key: str, default=_MISSING):
        """The value of metadata `key` (str, int, float, bool or a list); `default` when it is
        absent, GGUFError naming the file and key when there is no default. `self.metadata`
        holds the same values with arrays of numbers as numpy arrays."""
        value = self.metadata.get(key, _MISSING)
        if value is _MISSING:
            if default is _MISSING:
                raise GGUFError(f"{self.path}: metadata key {key!r} is missing")
            return default
        return value.tolist() if isinstance(value, np.ndarray) else value

    def array_length(self, key: str) -> int | None:
        """The number of items of an array value (None for scalars and absent keys)."""
        value = self.metadata.get(key)
        return len(value) if isinstance(value, (list, np.ndarray)) else None

    @property
    def arch(self) -> str:
        return str(self.get("general.architecture", ""))

    def arch_get(self, suffix: str, default=_MISSING):
        """Metadata `{arch}.{suffix}`, e.g. arch_get("block_count")."""
        return self.get(f"{self.arch}.{suffix}", default)

    # ------------------------------------------------------------ tensor data

    def tensor_info(self, name: str) -> TensorInfo:
        try:
            return self.tensors[name]
        except KeyError:
            raise GGUFError(f"{self.path}: tensor {name!r} is missing") from None

    def data_region(self) -> np.ndarray:
        """The tensor-data region of the mapping as flat uint8 (no copy)."""
        return self.data[self.data_offset:]

    def tensor_data(self, name: str) -> np.ndarray:
        """The raw bytes of one tensor (no copy)."""
        info = self.tensor_info(name)
        return self.data_region()[info.offset: info.offset + info.nbytes]

    def close(self) -> None:
        """Drop the mapping (tensors in zero-copy buffers keep their own reference alive)."""
        self.data = None


def open_gguf(path: str | os.PathLike) -> GGUFFile:
    """Open and check a GGUF file (metadata and tensor table; the data stays mapped)."""
    return GGUFFile(path)


# ---------------------------------------------------------------- weights

@dataclass
class Weights:
    """Weight tensors by name, and the contexts and buffers that hold them."""
    tensors: dict[str, Tensor] = field(default_factory=dict)
    buffers: list[Buffer] = field(default_factory=list)
    contexts: list[Context] = field(default_factory=list)

    def __getitem__(self, name: str) -> Tensor:
        return self.tensors[name]

    def get(self, name: str, default=None):
        return self.tensors.get(name, default)

    def nbytes(self) -> int:
        return sum(b.size for b in self.buffers)

    def free(self) -> None:
        for b in self.buffers:
            b.free()
        self.buffers.clear()


def is_cpu_buft(buft: BufferType) -> bool:
    """Host memory of the CPU device: weights there can be views of the file's mapping."""
    from .backend.device import DeviceType
    dev = buft.get_device()
    return buft.is_host() and dev is not None and dev.get_type() == DeviceType.CPU


def load_weights(file: GGUFFile, buft_of: Callable[[str], BufferType], names: Iterable[str] | None = None,
                 progress: bool = True) -> Weights:
    """Create a ggml tensor for each weight (all of the file's tensors, or `names`) in the
    buffer type `buft_of(name)` returns. CPU weights are views of the file's mapping; the
    others are uploaded to one new buffer per buffer type."""
    names = list(file.tensors) if names is None else list(names)
    groups: dict[int, tuple[BufferType, list[str]]] = {}
    for name in names:
        file.tensor_info(name)  # clear error for a missing tensor
        buft = buft_of(name)
        groups.setdefault(id(buft), (buft, []))[1].append(name)
    weights = Weights()
    for buft, group in groups.values():
        if is_cpu_buft(buft):
            _map_weights(file, group, weights)
        else:
            _upload_weights(file, buft, group, weights, progress)
    for buffer in weights.buffers:
        buffer.set_usage(BufferUsage.WEIGHTS)
    return weights


def _new_weight_tensor(ctx: Context, info: TensorInfo) -> Tensor:
    t = new_tensor_impl(ctx, info.type, list(info.ne))
    set_name(t, info.name)
    return t


def _map_weights(file: GGUFFile, names: list[str], weights: Weights) -> None:
    """Zero copy: one CPU buffer over the file's data region, tensors at base + offset."""
    from . import backend_cpu_buffer_from_ptr
    from .alloc import backend_tensor_alloc
    region = file.data_region()
    if region.size == 0:
        raise GGUFError(f"{file.path}: the file has no tensor data")
    buffer = backend_cpu_buffer_from_ptr(region)
    ctx = Context(0, no_alloc=True)
    for name in names:
        info = file.tensors[name]
        t = _new_weight_tensor(ctx, info)
        backend_tensor_alloc(buffer, t, buffer.get_base() + info.offset)
        weights.tensors[name] = t
    weights.buffers.append(buffer)
    weights.contexts.append(ctx)


def _upload_weights(file: GGUFFile, buft: BufferType, names: list[str], weights: Weights,
                    progress: bool) -> None:
    from .alloc import backend_alloc_ctx_tensors_from_buft
    from .backend.tensor_io import backend_tensor_set
    from tqdm import tqdm
    ctx = Context(0, no_alloc=True)
    tensors = [_new_weight_tensor(ctx, file.tensors[name]) for name in names]
    buffer = backend_alloc_ctx_tensors_from_buft(ctx, buft)
    total = sum(file.tensors[n].nbytes for n in names)
    desc = f"loading {os.path.basename(file.path)} -> {buft.get_name()}"
    with tqdm(total=total, unit="B", unit_scale=True, desc=desc, disable=not progress, leave=False) as bar:
        for name, t in zip(names, tensors):
            backend_tensor_set(t, file.tensor_data(name))
            bar.update(file.tensors[name].nbytes)
            weights.tensors[name] = t
    if buffer is not None:
        weights.buffers.append(buffer)
    weights.contexts.append(ctx)
