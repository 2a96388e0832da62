"""Buffers as torch storages: one torch.UntypedStorage per buffer, base = its real address."""
from __future__ import annotations

import torch

from ..backend.buffer import Buffer, BufferType
from ..enums import Status
from ..tensor import Tensor, round_up
from .views import byte_view, tensor_bytes


class TorchBufferType(BufferType):
    """Buffers of one torch device (`torch_device`), optionally pinned host memory."""

    def __init__(self, name: str, device, torch_device: str, host: bool, pinned: bool = False,
                 alignment: int = 32):
        super().__init__(name, device)
        self.torch_device = torch.device(torch_device)
        self.host = host
        self.pinned = pinned
        self.alignment = alignment

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
            if self.pinned:
                storage = torch.empty(n, dtype=torch.uint8, pin_memory=True).untyped_storage()
            else:
                storage = torch.UntypedStorage(n, device=self.torch_device)
        except (RuntimeError, torch.OutOfMemoryError) as e:
            raise MemoryError(f"{self.name}: failed to allocate a buffer of {size} bytes "
                              f"({size / 2**20:.1f} MiB) on {self.torch_device}: {e}") from None
        buffer = self.buffer_class(self, storage, size)
        buffer.base = round_up(buffer.base, self.alignment)
        return buffer


class TorchBuffer(Buffer):
    """A buffer over a torch storage. `owner` keeps foreign memory (numpy arrays, mmaps) alive.
    `ggml_layout` is False for buffers whose bytes are not ggml's tensor layout (repacked
    weights): such tensors are never viewed or copied as ggml data."""

    ggml_layout = True

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
