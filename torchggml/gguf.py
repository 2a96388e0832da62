"""GGUF files -> ggml tensors in weight buffers, through the `gguf` package's GGUFReader.

    f = open_gguf("model.gguf")             # header, metadata and tensor table, checked
    f.get("llama.block_count")              # metadata (decoded on first use)
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
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

import numpy as np

from .backend_impl import BufferType, Buffer, BufferUsage
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


def _import_gguf():
    try:
        import gguf
    except ImportError as e:  # pragma: no cover - gguf is a dependency
        raise ImportError("reading GGUF files needs the `gguf` package: pip install gguf") from e
    return gguf


def _checked_reader_class(path: str):
    """GGUFReader, with the tensor table checked before the reader builds its arrays, so a bad
    entry is reported by tensor name instead of as a numpy reshape error."""
    gguf = _import_gguf()

    class CheckedReader(gguf.GGUFReader):
        def _build_tensors(self, start_offs, fields):
            infos = []
            for f in fields:
                if len(f.parts) != 6:  # unknown reader layout: let the reader do its own checks
                    return super()._build_tensors(start_offs, fields)
                _, name_data, _, dims, raw_type, offs = f.parts
                name = bytes(name_data).decode("utf-8", errors="replace")
                infos.append((name, [int(d) for d in dims], int(raw_type[0]), int(offs[0])))
            self.checked_infos = _check_tensor_table(path, infos, start_offs, len(self.data), self.alignment)
            return super()._build_tensors(start_offs, fields)

    return CheckedReader


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
        reader_cls = _checked_reader_class(self.path)
        try:
            # "c": copy-on-write mapping, writable for torch, never written back to the file
            self.reader = reader_cls(self.path, "c")
        except GGUFError:
            raise
        except Exception as e:  # the reader reports header damage as numpy/struct errors
            size = os.path.getsize(self.path)
            raise GGUFError(f"{self.path}: the GGUF header (metadata and tensor table) cannot be read "
                            f"from this {size}-byte file: it is truncated or corrupt "
                            f"({type(e).__name__}: {e})") from None
        self.data_offset = int(self.reader.data_offset)
        self.alignment = int(self.reader.alignment)
        self.file_size = int(len(self.reader.data))
        infos = getattr(self.reader, "checked_infos", None) or self._infos_from_reader()
        self.tensors: dict[str, TensorInfo] = {t.name: t for t in infos}
        self._values: dict[str, Any] = {}

    def __repr__(self):
        return f"<GGUFFile {self.path} arch={self.arch!r} {len(self.tensors)} tensors>"

    def _infos_from_reader(self) -> list[TensorInfo]:
        infos = [(t.name, [int(d) for d in t.shape], int(t.tensor_type), t.data_offset - self.data_offset)
                 for t in self.reader.tensors]
        return _check_tensor_table(self.path, infos, self.data_offset, self.file_size, self.alignment)

    # ------------------------------------------------------------ metadata

    @property
    def keys(self) -> list[str]:
        """Metadata keys, in file order (the reader's GGUF.* header pseudo-keys excluded)."""
        return [k for k in self.reader.fields if not k.startswith("GGUF.")]

    def get(self, key: str, default=_MISSING):
        """The value of metadata `key` (str, int, float, bool or a list); `default` when it is
        absent, GGUFError naming the file and key when there is no default."""
        if key in self._values:
            return self._values[key]
        f = self.reader.fields.get(key)
        if f is None:
            if default is _MISSING:
                raise GGUFError(f"{self.path}: metadata key {key!r} is missing")
            return default
        try:
            value = f.contents()
        except Exception as e:
            raise GGUFError(f"{self.path}: metadata key {key!r} cannot be decoded: {e}") from None
        if isinstance(value, np.generic):
            value = value.item()
        self._values[key] = value
        return value

    def array_length(self, key: str) -> int | None:
        """The number of items of an array value without decoding it (None for scalars)."""
        f = self.reader.fields.get(key)
        gguf = _import_gguf()
        if f is None or f.types[0] != gguf.GGUFValueType.ARRAY:
            return None
        return len(f.data)

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
        return self.reader.data[self.data_offset:]

    def tensor_data(self, name: str) -> np.ndarray:
        """The raw bytes of one tensor (no copy)."""
        info = self.tensor_info(name)
        return self.data_region()[info.offset: info.offset + info.nbytes]

    def close(self) -> None:
        """Drop the mapping (tensors in zero-copy buffers keep their own reference alive)."""
        self.reader = None


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
    from .backend_impl import DeviceType
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
    from .torch_backend.cpu import backend_cpu_buffer_from_ptr
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
