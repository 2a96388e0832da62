"""GGUF files -> ggml tensors in weight buffers. The project's one GGUF reader (models,
tokenizer, CLI): the reader (reader.py) scans and checks the header and decodes the metadata, the tensor
data is memory-mapped.

    f = open_gguf("model.gguf")             # header, metadata and tensor table, checked
    f.get("llama.block_count")              # metadata
    w = load_weights(f, buft_of=lambda name: cpu_buffer_type())

The reader memory-maps the file (copy-on-write, so the mapping is writable but the file is
never modified). Weights placed in CPU memory are zero-copy: one CPU buffer covers the file's
tensor-data region and each tensor's address is `base + its offset`. Weights for other
devices are copied into buffers of those devices, with a progress bar. Every weight buffer
carries BufferUsage.WEIGHTS.

A model split in several files (llama.cpp's gguf-split: NAME-00001-of-0000N.gguf, the first with
the metadata and split.count / split.no / split.tensors.count, every part with split.no) is opened
from its first file: the tensor table holds every part's tensors, each read from its own file.

A truncated, corrupt or unsupported file raises GGUFError naming the file, the tensor (or
key) and the problem.
"""
from __future__ import annotations

import dataclasses
import math
import mmap
import os
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

import numpy as np

from .. import config
from ..backend.impl import BufferType, Buffer, BufferUsage
from ..context import Context, new_tensor_impl
from .reader import (ATTENTION_FREE_ARCHS, PER_LAYER_KEYS, _PER_LAYER_MAY_BE_ZERO, GGUFError, Header,
                          TensorEntry, check_hparam, scan_header)
from ..tensor import Tensor, set_name
from ..types import Type, type_traits

__all__ = ["GGUFError", "TensorInfo", "GGUFFile", "open_gguf", "WeightBuffers", "load_weights", "split_path",
           "split_prefix"]

_MISSING = object()


@dataclass(frozen=True)
class TensorInfo:
    """One entry of the file's tensor table. `ne` is in ggml order (ne[0] innermost, 1-4
    dims); `offset` counts from the start of the tensor-data region."""
    name: str
    type: Type
    ne: tuple[int, ...]
    offset: int
    nbytes: int
    part: int = 0        # the file of a split model that holds it (0: the first)

    @property
    def n_elements(self) -> int:
        return int(np.prod(self.ne))


def _entry_nbytes(path: str):
    """type_check for scan_header: a known type, ne[0] a multiple of the block size; the size."""
    def check(entry: TensorEntry) -> int:
        where = f"{path}: tensor {entry.name!r}"
        try:
            type = Type(entry.type_id)
        except ValueError:
            raise GGUFError(f"{where} has unknown or unsupported ggml type id {entry.type_id}") from None
        tr = type_traits(type)
        if entry.ne[0] % tr.blck_size:
            raise GGUFError(f"{where}: ne[0]={entry.ne[0]} is not a multiple of {tr.name}'s block size "
                            f"{tr.blck_size}")
        return math.prod(entry.ne) // tr.blck_size * tr.type_size
    return check


def _scan(path: str) -> Header:
    """The checked header, read through a read-only mapping that is closed right after."""
    with open(path, "rb") as f:
        if os.fstat(f.fileno()).st_size < 4:
            raise GGUFError(f"{path}: not a GGUF file (starts with {f.read(4)!r}, expected b'GGUF')")
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
            return scan_header(path, mm, _entry_nbytes(path))


def _check_hparams(path: str, h: Header, n_tensors: int) -> None:
    """Known hyper-parameters: type and range (see reader.HPARAM_RULES); block_count can
    not exceed the number of tensors (each layer has some)."""
    arch = h.values.get("general.architecture")
    prefix = f"{arch}." if isinstance(arch, str) else None
    for key, type_name in h.value_types.items():
        suffix = key[len(prefix):] if prefix and key.startswith(prefix) else None
        if arch in ATTENTION_FREE_ARCHS and suffix in _PER_LAYER_MAY_BE_ZERO and h.values.get(key) == 0:
            continue
        check_hparam(path, key, suffix, h.values.get(key), type_name)
    def scalar(suffix):
        value = h.values.get(f"{arch}.{suffix}")
        return value if isinstance(value, int) else None

    n_layer = scalar("block_count")
    if n_tensors and n_layer is not None and n_layer > n_tensors:
        raise GGUFError(f"{path}: metadata key '{arch}.block_count' = {n_layer} is more than the "
                        f"{n_tensors} tensors in the file")
    for suffix in PER_LAYER_KEYS:  # llama.cpp's get_key_or_arr: one item per layer
        value = h.values.get(f"{arch}.{suffix}")
        if isinstance(value, list) and n_layer is not None and len(value) != n_layer:
            raise GGUFError(f"{path}: metadata key '{arch}.{suffix}' has {len(value)} items for "
                            f"'{arch}.block_count' = {n_layer} layers")
    n_head, n_head_kv, n_embd = scalar("attention.head_count"), scalar("attention.head_count_kv"), scalar("embedding_length")
    if n_head and n_head_kv and n_head % n_head_kv:
        raise GGUFError(f"{path}: metadata key '{arch}.attention.head_count_kv' = {n_head_kv} does not "
                        f"divide '{arch}.attention.head_count' = {n_head}")
    head_dim = scalar("attention.key_length") or (n_embd // n_head if n_embd and n_head else None)
    n_rot = scalar("rope.dimension_count")
    if n_rot is not None and head_dim and (n_rot % 2 or n_rot > head_dim):
        raise GGUFError(f"{path}: metadata key '{arch}.rope.dimension_count' = {n_rot} must be even and at "
                        f"most the head size {head_dim}")


def _smaps_field(address: int, field: str) -> int | None:
    """A field of /proc/self/smaps (in kB) for the mapping that holds `address`; None when
    unreadable."""
    try:
        with open("/proc/self/smaps") as f:
            inside = False
            for line in f:
                head = line.split(maxsplit=1)[0]
                if "-" in head and not head.endswith(":"):  # a mapping's first line: lo-hi ...
                    lo, hi = (int(v, 16) for v in head.split("-"))
                    inside = lo <= address < hi
                elif inside and head == field:
                    return int(line.split()[1])
    except (OSError, ValueError):
        pass
    return None


def _advise_huge_pages(data: np.memmap) -> None:
    """Ask for the mapping in huge pages (MADV_HUGEPAGE): where the kernel holds the file's
    pages in 2 MiB folios (Linux 6.x page caches with large folios), it then maps them whole,
    and the weights stream as fast as from anonymous huge pages (a decode step reads them all;
    4 KiB pages stop the CPU's prefetchers at each page). No effect elsewhere."""
    mapping = getattr(data, "_mmap", None)
    if mapping is not None and hasattr(mmap, "MADV_HUGEPAGE"):
        try:
            mapping.madvise(mmap.MADV_HUGEPAGE)
        except OSError:
            pass


def split_path(prefix: str, index: int, count: int) -> str:
    """llama.cpp's name of part `index` (from 0) of a model split in `count` files."""
    return f"{prefix}-{index + 1:05d}-of-{count:05d}.gguf"


def split_prefix(path: str, index: int, count: int) -> str | None:
    """The prefix of a split model's part path (split_path's inverse), None if not so named."""
    postfix = f"-{index + 1:05d}-of-{count:05d}.gguf"
    return path[:-len(postfix)] if path.endswith(postfix) and len(path) > len(postfix) else None


SPLIT_KEYS = ("split.no", "split.count", "split.tensors.count")


class GGUFFile:
    """An open GGUF file: metadata, tensor table, and the memory-mapped tensor data (of every
    part, for a split model opened from its first file)."""

    def __init__(self, path: str | os.PathLike, _split_part: bool = False):
        self.path = os.fspath(path)
        if os.path.isdir(self.path):
            raise IsADirectoryError(f"{self.path} is a directory, not a GGUF file")
        if not os.path.isfile(self.path):
            raise FileNotFoundError(f"GGUF file not found: {self.path}")
        header = _scan(self.path)  # every count, length and data range checked, metadata decoded
        n_split = 0 if _split_part else header.values.get("split.count", 0)
        n_split = n_split if isinstance(n_split, int) else 0
        n_tensors = header.values.get("split.tensors.count", len(header.tensors)) if n_split > 1 else len(header.tensors)
        _check_hparams(self.path, header, n_tensors)
        # "c": copy-on-write mapping, writable for torch, never written back to the file
        self.data = np.memmap(self.path, dtype=np.uint8, mode="c")
        _advise_huge_pages(self.data)
        # the mapped file itself (not the path, which may be replaced): see check_unchanged
        self._fd = os.open(self.path, os.O_RDONLY)
        self._identity = self._stat_identity()
        self.data_offset = header.data_offset
        self.alignment = header.alignment
        self.file_size = int(len(self.data))
        checked = _entry_nbytes(self.path)
        self.tensors: dict[str, TensorInfo] = {
            e.name: TensorInfo(e.name, Type(e.type_id), e.ne, e.offset, checked(e)) for e in header.tensors}
        #: every metadata value by key, in file order: str, int, float, bool, lists (of strings,
        #: or of up to 65536 numbers) and numpy arrays (longer numeric arrays, e.g. token scores)
        self.metadata: dict[str, Any] = {k: header.values.get(k) for k in header.value_types}
        self.value_types: dict[str, str] = dict(header.value_types)
        self._kv_spans = header.kv_spans
        self.parts: list[GGUFFile] = []  # a split model's other files, in order
        if n_split > 1:
            self._open_parts(header, n_split)

    def _open_parts(self, header: Header, n_split: int) -> None:
        """The other files of a split model: each named as llama.cpp names it, with its split.no;
        their tensors join the table (no name twice), as many as split.tensors.count says."""
        no = header.values.get("split.no", 0)
        prefix = split_prefix(self.path, 0, n_split)
        if no != 0:
            first = split_path(split_prefix(self.path, no, n_split) or "NAME", 0, n_split)
            raise GGUFError(f"{self.path}: part {no + 1} of a model split in {n_split} files: load its first "
                            f"file ({first})")
        if prefix is None:
            raise GGUFError(f"{self.path}: the first of {n_split} split files (split.count) must be named "
                            f"NAME-00001-of-{n_split:05d}.gguf, as llama.cpp's gguf-split names them")
        for index in range(1, n_split):
            path = split_path(prefix, index, n_split)
            if not os.path.isfile(path):
                raise GGUFError(f"{self.path}: part {index + 1} of {n_split} of the split model is missing: {path}")
            part = GGUFFile(path, _split_part=True)
            if part.metadata.get("split.no") != index:
                raise GGUFError(f"{path}: split.no is {part.metadata.get('split.no')}, expected {index} "
                                f"(part {index + 1} of {n_split})")
            for name, info in part.tensors.items():
                if name in self.tensors:
                    raise GGUFError(f"{path}: tensor {name!r} is also in an earlier part of the split model")
                self.tensors[name] = dataclasses.replace(info, part=index)
            self.parts.append(part)
        expected = header.values.get("split.tensors.count")
        if expected is not None and expected != len(self.tensors):
            raise GGUFError(f"{self.path}: split.tensors.count is {expected} but the {n_split} files hold "
                            f"{len(self.tensors)} tensors")

    def file_of(self, name: str) -> "GGUFFile":
        """The file (this one or a part) that holds a tensor's data."""
        part = self.tensor_info(name).part
        return self if part == 0 else self.parts[part - 1]

    def kv_record(self, key: str) -> bytes:
        """A metadata entry's bytes as the file stores them (key, value type, value)."""
        start, end = self._kv_spans[key]
        return bytes(self.data[start:end])

    def __repr__(self):
        return f"<GGUFFile {self.path} arch={self.arch!r} {len(self.tensors)} tensors>"

    # ------------------------------------------------------------ metadata

    @property
    def keys(self) -> list[str]:
        """Metadata keys, in file order."""
        return list(self.metadata)

    def get(self, key: str, default=_MISSING):
        """The value of metadata `key` (str, int, float, bool or a list); `default` when it is
        absent, GGUFError naming the file and key when there is no default."""
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
        return self.file_of(name).data_region()[info.offset: info.offset + info.nbytes]

    def __del__(self):
        fd = getattr(self, "_fd", None)
        if fd is not None:
            try:
                os.close(fd)
            except (AttributeError, OSError):  # at interpreter exit the os module may be gone already
                pass

    def _stat_identity(self) -> tuple[int, int]:
        st = os.fstat(self._fd)
        return st.st_size, st.st_mtime_ns

    def check_unchanged(self) -> None:
        """GGUFError when the mapped file was truncated or rewritten since it was opened. CPU
        weights are views of the mapping: reading a page past a truncated end would kill the
        process with SIGBUS instead of raising, so evaluation checks this first. (A file replaced
        by a new one at the same path is harmless: the mapping keeps the old one.)"""
        for part in self.parts:
            part.check_unchanged()
        if self._fd is None:
            return
        size, mtime = self._stat_identity()
        if (size, mtime) != self._identity:
            change = f"truncated to {size} bytes" if size < self.file_size else "modified"
            raise GGUFError(f"{self.path}: the model file was {change} while loaded (it had {self.file_size} "
                            f"bytes); its weights can no longer be read: load it again")

    def release(self, name: str) -> None:
        """Give back the process's pages of one tensor's bytes in the mapping (madvise
        MADV_DONTNEED on the whole pages inside its range; pages shared with a neighbour stay):
        once the tensor is converted into a buffer of its own (a repacked layout, an
        accelerator), the mapped copy would only add its size to the resident memory. Reading the
        bytes again faults them back in from the file."""
        if self.tensor_info(name).part:
            return self.file_of(name).release(name)
        mapping = getattr(self.data, "_mmap", None)
        if mapping is None or not hasattr(mmap, "MADV_DONTNEED"):
            return  # no mapping (closed, or not an mmap), or no madvise on this system
        info = self.tensor_info(name)
        start = self.data_offset + info.offset  # the mapping starts at the file's first byte
        first, end = -(-start // mmap.PAGESIZE) * mmap.PAGESIZE, (start + info.nbytes) // mmap.PAGESIZE * mmap.PAGESIZE
        if end > first:
            mapping.madvise(mmap.MADV_DONTNEED, first, end - first)

    def maps_in_huge_pages(self, probes: int = 8) -> bool:
        """Whether the kernel maps this file's tensor data in 2 MiB pages (it does where the page
        cache holds the file in 2 MiB folios: Linux 6.x filesystems with large folios, the file
        read in whole; pages written or read in small pieces stay small): `probes` 2 MiB spans
        spread over the data are touched and /proc/self/smaps asked how many are PMD-mapped;
        True when three quarters are. False where that cannot be known (another OS, no THP, a
        file with fewer spans than probes)."""
        mapping = getattr(self.data, "_mmap", None)
        if mapping is None or not hasattr(mmap, "MADV_HUGEPAGE") or not os.path.exists("/proc/self/smaps"):
            return False
        huge = 2 << 20
        base = self.data.ctypes.data
        first = -(-(base + self.data_offset) // huge) * huge  # the first 2 MiB boundary in the data
        spans = (base + self.file_size - first) // huge
        if spans < probes:
            return False
        for i in range(probes):  # each fault maps its span, whole where the page cache allows
            int(self.data[first + (i * spans // probes) * huge - base])
        pmd_kib = _smaps_field(first, "FilePmdMapped:")
        return pmd_kib is not None and pmd_kib >= (huge >> 10) * probes * 3 // 4

    def read_into(self, name: str, out: np.ndarray) -> None:
        """Read one tensor's bytes from the file into `out` (uint8, its size): the kernel copies
        them from the page cache, where copying out of the mapping faults it in a 4 KiB page at a
        time (several times slower). GGUFError if the file ends early."""
        info = self.tensor_info(name)
        view, done = memoryview(out).cast("B"), 0
        while done < info.nbytes:  # reads return at most ~2 GiB
            n = os.preadv(self._fd, [view[done:]], self.data_offset + info.offset + done)
            if n <= 0:
                self.check_unchanged()
                raise GGUFError(f"{self.path}: tensor {name!r} ends past the end of the file")
            done += n

    def close(self) -> None:
        """Close the file's mapping (and with it the file descriptor). Numpy or torch views of
        the mapping that are still alive keep it open; it closes when the last one goes."""
        for part in self.parts:
            part.close()
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        data, self.data = self.data, None
        mapping = getattr(data, "_mmap", None)
        if mapping is not None:
            try:
                mapping.close()
            except BufferError:  # views still exported: the mapping closes with the last one
                pass


def page_in(path: str | os.PathLike) -> tuple[bool, bool]:
    """Have the kernel hold a model file in the page cache in 2 MiB folios, so that mappings
    (use_mmap=True, advised huge pages) map it in huge pages: where the probe finds 4 KiB pages,
    the file's cached pages are dropped (posix_fadvise DONTNEED: clean pages no process maps)
    and read again through a mapping advised MADV_HUGEPAGE, whose faults read 2 MiB folios (Linux
    6.x with large-folio filesystems; elsewhere nothing changes). Costs one read of the file from
    disk; the folios stay while the page cache keeps the file. Returns (huge before, huge after)."""
    before = open_gguf(path).maps_in_huge_pages()
    if before or not (hasattr(os, "posix_fadvise") and hasattr(mmap, "MADV_HUGEPAGE")):
        return before, before
    fd = os.open(os.fspath(path), os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        with mmap.mmap(fd, 0, access=mmap.ACCESS_READ) as mapping:
            mapping.madvise(mmap.MADV_HUGEPAGE)
            data = np.frombuffer(mapping, np.uint8)
            int(data[::mmap.PAGESIZE].sum())  # fault every page in: readahead in 2 MiB folios
            del data
    finally:
        os.close(fd)
    return before, open_gguf(path).maps_in_huge_pages()


def open_gguf(path: str | os.PathLike) -> GGUFFile:
    """Open and check a GGUF file (metadata and tensor table; the data stays mapped)."""
    return GGUFFile(path)


# ---------------------------------------------------------------- weights

@dataclass
class WeightBuffers:
    """Weight tensors by name, and the contexts and buffers that hold them."""
    tensors: dict[str, Tensor] = field(default_factory=dict)
    buffers: list[Buffer] = field(default_factory=list)
    contexts: list[Context] = field(default_factory=list)
    #: bytes of CPU weights read into CPU memory instead of mapped (load_weights' `copy`)
    cpu_read_in: int = 0

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


# The float fields of each block type (ggml's block structs): (byte offset, f16 or f32). Every
# other field is an integer, so a block decodes to finite values exactly when these are finite.
_F16, _F32 = 2, 4
_BLOCK_SCALES = {
    Type.Q4_0: ((0, _F16),), Type.Q4_1: ((0, _F16), (2, _F16)), Type.Q5_0: ((0, _F16),),
    Type.Q5_1: ((0, _F16), (2, _F16)), Type.Q8_0: ((0, _F16),), Type.Q8_1: ((0, _F16),),
    Type.Q2_K: ((80, _F16), (82, _F16)), Type.Q3_K: ((108, _F16),), Type.Q4_K: ((0, _F16), (2, _F16)),
    Type.Q5_K: ((0, _F16), (2, _F16)), Type.Q6_K: ((208, _F16),), Type.Q8_K: ((0, _F32),),
    Type.IQ2_XXS: ((0, _F16),), Type.IQ2_XS: ((0, _F16),), Type.IQ2_S: ((0, _F16),),
    Type.IQ3_XXS: ((0, _F16),), Type.IQ3_S: ((0, _F16),), Type.IQ1_S: ((0, _F16),),
    Type.IQ4_NL: ((0, _F16),), Type.IQ4_XS: ((0, _F16),), Type.TQ1_0: ((52, _F16),),
    Type.TQ2_0: ((64, _F16),),
}


def check_tensor_values(file: GGUFFile, name: str) -> None:
    """GGUFError naming the file and tensor when one of its values, or for block types one of
    its blocks' float scales, is NaN or inf (what llama.cpp's --check-tensors checks)."""
    import torch
    info = file.tensor_info(name)
    data = torch.from_numpy(np.ascontiguousarray(file.tensor_data(name)))
    plain = {Type.F32: torch.float32, Type.F16: torch.float16, Type.BF16: torch.bfloat16}.get(info.type)
    if plain is not None:
        fields = [("value", data.view(plain))]
    else:
        blocks = data.view(-1, type_traits(info.type).type_size)
        fields = [(f"block scale at byte {off}", blocks[:, off:off + size].contiguous().view(
            torch.float16 if size == _F16 else torch.float32)) for off, size in _BLOCK_SCALES.get(info.type, ())]
    for what, values in fields:
        bad = ~torch.isfinite(values.reshape(-1))
        if bool(bad.any()):
            raise GGUFError(f"{file.path}: tensor {name!r} ({info.type.name}): {what} #{int(bad.nonzero()[0])} "
                            f"is not finite (the file is corrupt, or its type is not what the table says)")


def is_cpu_buft(buft: BufferType) -> bool:
    """Host memory of the CPU device: weights there can be views of the file's mapping."""
    from ..backend.impl import DeviceType
    dev = buft.get_device()
    return buft.is_host() and dev is not None and dev.get_type() == DeviceType.CPU


def load_weights(file: GGUFFile, buft_of: Callable[[str], BufferType], names: Iterable[str] | None = None,
                 progress: bool = True, check_values: bool = False,
                 copy: Callable[[str], bool] | None = None) -> WeightBuffers:
    """Create a ggml tensor for each weight (all of the file's tensors, or `names`) in the
    buffer type `buft_of(name)` returns. CPU weights are views of the file's mapping, but those
    for which `copy(name)` is true (weights every token reads whole: a CPU buffer's huge pages
    stream faster than the mapping's pages); the others are uploaded to one new buffer per
    buffer type, each tensor's mapped pages given back once copied. check_values: first check
    that every value is finite (see check_tensor_values)."""
    names = list(file.tensors) if names is None else list(names)
    file.check_unchanged()
    groups: dict[tuple[int, bool], tuple[BufferType, list[str]]] = {}
    for name in names:
        file.tensor_info(name)  # clear error for a missing tensor
        if check_values:
            check_tensor_values(file, name)
        buft = buft_of(name)
        mapped = is_cpu_buft(buft) and not (copy is not None and copy(name))
        groups.setdefault((id(buft), mapped), (buft, []))[1].append(name)
    weights = WeightBuffers()
    for (_, mapped), (buft, group) in groups.items():
        if mapped:
            _map_weights(file, group, weights)
        else:
            _upload_weights(file, buft, group, weights, progress)
            if is_cpu_buft(buft):
                weights.cpu_read_in += sum(file.tensors[name].nbytes for name in group)
    for buffer in weights.buffers:
        buffer.set_usage(BufferUsage.WEIGHTS)
    return weights


def _host_bytes(t: Tensor) -> np.ndarray | None:
    """A numpy view of t's bytes where its buffer is CPU memory in ggml's layout (the file is
    then read straight into it), else None."""
    from ..storage import TorchBuffer, tensor_bytes
    buffer = t.buffer
    if not (isinstance(buffer, TorchBuffer) and buffer.ggml_layout and buffer.buft.is_host()
            and buffer.storage.device.type == "cpu"):
        return None
    return tensor_bytes(t).numpy()


def _new_weight_tensor(ctx: Context, info: TensorInfo) -> Tensor:
    t = new_tensor_impl(ctx, info.type, list(info.ne))
    set_name(t, info.name)
    return t


def _map_weights(file: GGUFFile, names: list[str], weights: WeightBuffers) -> None:
    """Zero copy: one CPU buffer over each file's data region (a split model's parts each),
    tensors at base + offset."""
    from ..devices.cpu import backend_cpu_buffer_from_ptr
    from ..alloc import backend_tensor_alloc
    by_part: dict[int, list[str]] = {}
    for name in names:
        by_part.setdefault(file.tensors[name].part, []).append(name)
    for part, group in by_part.items():
        region = file.file_of(group[0]).data_region()
        if region.size == 0:
            raise GGUFError(f"{file.file_of(group[0]).path}: the file has no tensor data")
        buffer = backend_cpu_buffer_from_ptr(region)
        ctx = Context(0, no_alloc=True)
        for name in group:
            info = file.tensors[name]
            t = _new_weight_tensor(ctx, info)
            backend_tensor_alloc(buffer, t, buffer.get_base() + info.offset)
            weights.tensors[name] = t
        weights.buffers.append(buffer)
        weights.contexts.append(ctx)


PROGRESS_MIN_BYTES = 64 * 2**20  # smaller uploads take well under a second: no bar


def show_progress(wanted: bool, total_bytes: int) -> bool:
    """A progress bar only when asked for, on a terminal (a bar's carriage returns would fill a
    log), for uploads of PROGRESS_MIN_BYTES and more, and unless TORCHGGML_PROGRESS=0."""
    import sys
    stream = sys.stderr  # where tqdm writes
    return (wanted and total_bytes >= PROGRESS_MIN_BYTES and config.value("TORCHGGML_PROGRESS")
            and hasattr(stream, "isatty") and stream.isatty())


def _upload_weights(file: GGUFFile, buft: BufferType, names: list[str], weights: WeightBuffers,
                    progress: bool) -> None:
    from ..alloc import backend_alloc_ctx_tensors_from_buft
    from ..backend.tensor_io import backend_tensor_set
    from tqdm import tqdm
    ctx = Context(0, no_alloc=True)
    tensors = [_new_weight_tensor(ctx, file.tensors[name]) for name in names]
    buffer = backend_alloc_ctx_tensors_from_buft(ctx, buft)
    if buffer is not None:  # before the data: a remote (RPC) buffer offers its weight cache
        buffer.set_usage(BufferUsage.WEIGHTS)
    total = sum(file.tensors[n].nbytes for n in names)
    desc = f"loading {os.path.basename(file.path)} -> {buft.get_name()}"
    with tqdm(total=total, unit="B", unit_scale=True, desc=desc, disable=not show_progress(progress, total),
              leave=False) as bar:
        for name, t in zip(names, tensors):  # tensor by tensor, each one's mapped pages given back
            if _host_bytes(t) is not None and file._fd is not None:
                file.read_into(name, _host_bytes(t))
            else:
                backend_tensor_set(t, file.tensor_data(name))
            file.release(name)
            bar.update(file.tensors[name].nbytes)
            weights.tensors[name] = t
    if buffer is not None:
        weights.buffers.append(buffer)
    weights.contexts.append(ctx)
