"""Memory: every buffer is a torch storage, and a tensor's memory is a torch view of it.

TorchBufferType / TorchBuffer: buffers over one torch.UntypedStorage (base = its real address)
of any torch device, pinned host memory included; buffer_from_torch wraps existing memory.
tensor_view / tensor_bytes / byte_view: zero-copy torch views of a tensor's memory, from
(storage, data - base, type, ne, nb). Every layer above (contexts, backends, kernels, interop)
reads and writes tensors through these.
"""
from __future__ import annotations

import torch

from .backend.impl import Buffer, BufferType, check_not_freed
from .enums import Status
from .tensor import Tensor, nbytes, round_up
from .types import type_traits


class UnallocatedTensorError(RuntimeError):
    pass


def _require_memory(t: Tensor):
    if t.data is None or t.buffer is None:
        raise UnallocatedTensorError(
            f"{t.describe()} has no memory: allocate it first (gallocr_alloc_graph, "
            f"backend_alloc_ctx_tensors, a scheduler, or a context with no_alloc=False)")
    check_not_freed(t.buffer, "tensor view", t)
    return t.buffer


def tensor_view(t: Tensor) -> torch.Tensor:
    """Zero-copy torch view of the tensor's memory: shape reversed(ne), strides from nb.

    Plain types give their dtype; block types give raw uint8 blocks [ne3, ne2, ne1, row_bytes].
    The view is cached on the tensor and rebuilt when its address or buffer changes.
    """
    cache = t._view_cache
    if cache is not None and cache[0] == t.data and cache[1] is t.buffer and not cache[1].freed:
        return cache[2]
    buffer = _require_memory(t)
    view = _build_view(t, buffer)
    t._view_cache = (t.data, t.buffer, view)
    return view


def _build_view(t: Tensor, buffer) -> torch.Tensor:
    if not buffer.ggml_layout:
        raise TypeError(f"{t.describe()} is stored in buffer {buffer.name!r} in a repacked layout, "
                        f"not ggml's: only the ops its buffer type supports can read it")
    storage = buffer.storage
    offset = t.data - buffer.base
    tr = type_traits(t.type)
    ne, nb = t.ne, t.nb
    if offset < 0 or offset + nbytes(t) > buffer.size:
        raise IndexError(f"{t.describe()} lies outside its buffer {buffer.name!r} "
                         f"(offset {offset}, {nbytes(t)} bytes, buffer size {buffer.size})")
    offset = t.data - storage.data_ptr()  # a buffer may start inside its storage
    if tr.dtype is not None:
        es = tr.type_size
        if offset % es or any(s % es for s in nb):
            raise ValueError(f"{t.describe()}: offset {offset} or strides {nb} not aligned to the element size {es}")
        shape = (ne[3], ne[2], ne[1], ne[0])
        stride = (nb[3] // es, nb[2] // es, nb[1] // es, nb[0] // es)
        dtype = tr.dtype
        offset //= es
    else:
        if nb[0] != tr.type_size:
            raise ValueError(f"{t.describe()}: blocks within a row must be contiguous for a raw view")
        shape = (ne[3], ne[2], ne[1], ne[0] // tr.blck_size * tr.type_size)
        stride = (nb[3], nb[2], nb[1], 1)
        dtype = torch.uint8
    view = torch.empty(0, dtype=dtype, device=storage.device).set_(storage, offset, shape, stride)
    # keep the user-facing rank: drop nothing, ggml tensors are always 4-D internally
    return view


def byte_view(buffer, offset: int, size: int) -> torch.Tensor:
    """A flat uint8 view of `size` bytes at `offset` inside the buffer."""
    check_not_freed(buffer, "byte view")
    if offset < 0 or size < 0 or offset + size > buffer.size:
        raise IndexError(f"{size} bytes at offset {offset} are outside buffer {buffer.name!r} of size {buffer.size}")
    storage = buffer.storage
    start = buffer.base - storage.data_ptr() + offset
    return torch.empty(0, dtype=torch.uint8, device=storage.device).set_(storage, start, (size,), (1,))


def tensor_bytes(t: Tensor, offset: int = 0, size: int | None = None) -> torch.Tensor:
    """Raw bytes [data + offset, data + offset + size) of a tensor, bounds-checked against nbytes."""
    buffer = _require_memory(t)
    total = nbytes(t)
    if size is None:
        size = total - offset
    if offset < 0 or size < 0 or offset + size > total:
        raise IndexError(f"{size} bytes at offset {offset} are past the end of {t.describe()}, "
                         f"which has {total} bytes")
    return byte_view(buffer, t.data - buffer.base + offset, size)


def strided_rows(t: Tensor, offset: int, size: int, n_copies: int, stride: int) -> torch.Tensor:
    """[n_copies, size] bytes of the tensor, rows `stride` bytes apart from data + offset (the
    2-D copies' tensor side: one strided torch copy moves them all)."""
    span = tensor_bytes(t, offset, (n_copies - 1) * stride + size)
    return span.as_strided((n_copies, size), (stride, 1))


def data_rows(data: torch.Tensor, size: int, n_copies: int, stride: int) -> torch.Tensor:
    """The same rows of a flat uint8 tensor (the 2-D copies' data side)."""
    return data.as_strided((n_copies, size), (stride, 1))


# ---------------------------------------------------------------- torch storages as buffers

# CPU buffers of at least this many bytes are asked for huge pages (huge_page_storage)
HUGE_PAGE_MIN_BYTES = 4 << 20


def huge_page_storage(n: int) -> torch.UntypedStorage | None:
    """n bytes of anonymous memory that the kernel backs with transparent huge pages (mmap, then
    madvise MADV_HUGEPAGE before any page is touched), as a torch storage that keeps the mapping
    alive; None where the system has no MADV_HUGEPAGE. Why: a decode step streams every weight
    once, and with 4 KiB pages the CPU's prefetchers stop at each page and the TLB misses
    (docs/benchmarks.md, "Huge pages")."""
    import mmap
    if not hasattr(mmap, "MADV_HUGEPAGE"):
        return None
    # private (a shared anonymous mapping is shmem, which THP's madvise mode leaves alone)
    mapping = mmap.mmap(-1, n, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    try:
        mapping.madvise(mmap.MADV_HUGEPAGE)
    except OSError:  # THP off in this kernel: plain pages
        pass
    return torch.frombuffer(mapping, dtype=torch.uint8).untyped_storage()


class TorchBufferType(BufferType):
    """Buffers of one torch device (`torch_device`), optionally pinned host memory; host buffers
    of HUGE_PAGE_MIN_BYTES and more in huge pages where `huge_pages` (the CPU's)."""

    def __init__(self, name: str, device, torch_device: str, host: bool, pinned: bool = False,
                 alignment: int = 32, huge_pages: bool = False):
        super().__init__(name, device)
        self.torch_device = torch.device(torch_device)
        self.host = host
        self.pinned = pinned
        self.alignment = alignment
        self.huge_pages = huge_pages

    def get_alignment(self) -> int:
        return self.alignment

    def is_host(self) -> bool:
        return self.host

    def alloc_buffer(self, size: int) -> "TorchBuffer":
        """A `buffer_class` over a new storage, its base aligned to the buffer type's alignment."""
        size = int(size)
        if size < 0:
            raise ValueError(f"{self.name}: negative buffer size {size}")
        # torch aligns storages to 64 bytes; larger alignments get slack to move the base up.
        # Zero-size buffers still get a real (1-byte) storage so that base is a valid address.
        n = max(size, 1) + (self.alignment if self.alignment > 64 else 0)
        try:
            storage, zero_filled = None, False
            if self.pinned:
                storage = torch.empty(n, dtype=torch.uint8, pin_memory=True).untyped_storage()
            elif self.huge_pages and n >= HUGE_PAGE_MIN_BYTES:
                storage = huge_page_storage(n)
                zero_filled = storage is not None  # anonymous pages: the kernel gives them zeroed
            if storage is None:
                storage = torch.UntypedStorage(n, device=self.torch_device)
        except (RuntimeError, torch.OutOfMemoryError, OSError) as e:
            raise MemoryError(f"{self.name}: failed to allocate a buffer of {size} bytes "
                              f"({size / 2**20:.1f} MiB) on {self.torch_device}: {e}") from None
        buffer = self.buffer_class(self, storage, size)
        buffer.base = round_up(buffer.base, self.alignment)
        buffer.zero_filled = zero_filled
        return buffer


class TorchBuffer(Buffer):
    """A buffer over a torch storage. `owner` keeps foreign memory (numpy arrays, mmaps) alive."""

    zero_filled = False  # its bytes are known to be 0 (fresh anonymous pages): see alloc_buffer

    def __init__(self, buft: BufferType, storage: torch.UntypedStorage, size: int, owner=None):
        super().__init__(buft, size, storage.data_ptr())
        self.storage = storage
        self.owner = owner

    def free(self) -> None:
        """Drop the storage. Torch views taken before (to_torch, tensor views) keep their
        memory alive and stay usable as plain torch tensors, but are no longer the buffer:
        ggml access to its tensors raises BufferFreedError from now on."""
        super().free()
        self.storage = None
        self.owner = None

    def set_tensor(self, tensor: Tensor, data: torch.Tensor, offset: int, size: int) -> None:
        tensor_bytes(tensor, offset, size).copy_(data[:size])

    def get_tensor(self, tensor: Tensor, out: torch.Tensor, offset: int, size: int) -> None:
        out[:size].copy_(tensor_bytes(tensor, offset, size))

    def memset_tensor(self, tensor: Tensor, value: int, offset: int, size: int) -> None:
        tensor_bytes(tensor, offset, size).fill_(value)

    def set_tensor_2d(self, tensor, data, offset, size, n_copies, stride_tensor, stride_data) -> None:
        strided_rows(tensor, offset, size, n_copies, stride_tensor).copy_(data_rows(data, size, n_copies, stride_data))

    def get_tensor_2d(self, tensor, out, offset, size, n_copies, stride_tensor, stride_data) -> None:
        data_rows(out, size, n_copies, stride_data).copy_(strided_rows(tensor, offset, size, n_copies, stride_tensor))

    def clear(self, value: int) -> None:
        byte_view(self, 0, self.size).fill_(value)

    def cpy_tensor(self, src: Tensor, dst: Tensor) -> bool:
        # any two torch storages copy directly (device to device without a host round trip)
        if not (isinstance(src.buffer, TorchBuffer) and isinstance(dst.buffer, TorchBuffer)) \
                or not (src.buffer.ggml_layout and dst.buffer.ggml_layout):
            return False
        tensor_bytes(dst).copy_(tensor_bytes(src))
        return True

    def init_tensor(self, tensor: Tensor) -> Status:
        return Status.SUCCESS


def buffer_from_torch(buft: BufferType, data, owner=None) -> TorchBuffer:
    """Wrap existing memory without copying: a torch tensor (any device), a numpy array, an
    mmap or any writable bytes-like object. The buffer keeps the memory alive."""
    if not isinstance(data, torch.Tensor):
        import numpy as np
        arr = data if isinstance(data, np.ndarray) else np.frombuffer(data, dtype=np.uint8)
        if not arr.flags.c_contiguous:
            raise ValueError("buffer_from_host_ptr: the array must be C-contiguous")
        owner = data
        data = torch.from_numpy(arr.view(np.uint8).reshape(-1)) if arr.size else torch.empty(0, dtype=torch.uint8)
    if not data.is_contiguous():
        raise ValueError("buffer_from_host_ptr: the tensor must be contiguous")
    buf = TorchBuffer(buft, data.untyped_storage(), data.numel() * data.element_size(),
                      owner if owner is not None else data)
    buf.base = data.data_ptr()  # the buffer covers [data, data + size), maybe inside a larger storage
    return buf


TorchBufferType.buffer_class = TorchBuffer  # subclasses name their own buffer class
