"""Buffer types and buffers (ggml_backend_buffer_type_i / ggml_backend_buffer_i).

A subclass implements the abstract methods; every other method has ggml's documented default.
The mirrored functions (backend_buft_*, backend_buffer_*) check arguments and call these.
"""
from __future__ import annotations

import sys
from abc import ABC, abstractmethod
from enum import IntEnum

from ..enums import Status
from ..tensor import Tensor, nbytes


class BufferFreedError(RuntimeError):
    """A freed buffer, or a tensor in one, was used (set, get, memset, copy, compute)."""


def check_not_freed(buffer: "Buffer", what: str, tensor: Tensor | None = None) -> None:
    """BufferFreedError naming the operation, the tensor and the buffer when it was freed."""
    if buffer.freed:
        subject = f"{tensor.describe()} in buffer {buffer.name!r}" if tensor is not None else f"buffer {buffer.name!r}"
        raise BufferFreedError(f"{what}: {subject} was used after the buffer was freed")


class BufferUsage(IntEnum):
    ANY = 0
    WEIGHTS = 1
    COMPUTE = 2


class BufferType(ABC):
    """ggml_backend_buffer_type: an allocator of buffers of one kind of memory on one device."""

    def __init__(self, name: str, device=None):
        self.name = name
        self.device = device

    def __repr__(self):
        return f"<ggml.BufferType {self.name}>"

    @abstractmethod
    def alloc_buffer(self, size: int) -> "Buffer":
        """Allocate a buffer of `size` bytes; raise MemoryError when the device is out of memory."""

    def get_name(self) -> str:
        return self.name

    def get_alignment(self) -> int:
        return 32

    def get_max_size(self) -> int:
        return sys.maxsize

    def get_alloc_size(self, tensor: Tensor) -> int:
        return nbytes(tensor)

    def is_host(self) -> bool:
        return False

    def get_device(self):
        return self.device


class Buffer(ABC):
    """ggml_backend_buffer: `size` bytes at address `base` in one kind of memory."""

    def __init__(self, buft: BufferType, size: int, base: int):
        self.buft = buft
        self.size = int(size)
        self.base = int(base)
        self.usage = BufferUsage.ANY
        self.freed = False

    @property
    def name(self) -> str:
        return self.buft.name

    def __repr__(self):
        return f"<ggml.Buffer {self.name} {self.size} bytes usage={self.usage.name}>"

    # --- required
    @abstractmethod
    def set_tensor(self, tensor: Tensor, data, offset: int, size: int) -> None:
        """Write `size` bytes of `data` (a flat uint8 torch tensor) at tensor.data + offset."""

    @abstractmethod
    def get_tensor(self, tensor: Tensor, out, offset: int, size: int) -> None:
        """Read `size` bytes at tensor.data + offset into `out` (a flat uint8 torch tensor)."""

    @abstractmethod
    def clear(self, value: int) -> None:
        """Set every byte of the buffer to `value`."""

    # --- optional, with ggml's defaults
    def get_base(self) -> int:
        return self.base

    def free(self) -> None:
        """Give the memory back. Any later set/get/memset/copy/compute of a tensor in this
        buffer raises BufferFreedError; freeing twice is allowed."""
        self.freed = True

    def init_tensor(self, tensor: Tensor) -> Status:
        return Status.SUCCESS

    def memset_tensor(self, tensor: Tensor, value: int, offset: int, size: int) -> None:
        raise NotImplementedError(f"buffer {self.name} cannot memset tensors")

    def cpy_tensor(self, src: Tensor, dst: Tensor) -> bool:
        """Copy src into dst (dst lives in this buffer) without a host round trip; False if unable."""
        return False

    def reset(self) -> None:
        pass

    def set_usage(self, usage: BufferUsage) -> None:
        self.usage = BufferUsage(usage)

    def is_multi_buffer(self) -> bool:
        return False


# ---------------------------------------------------------------- mirrored functions

def backend_buft_name(buft: BufferType) -> str:
    return buft.get_name()


def backend_buft_alloc_buffer(buft: BufferType, size: int) -> Buffer:
    """A new buffer of `size` bytes; MemoryError (naming the buffer type) when it can't be had."""
    if size > buft.get_max_size():
        raise MemoryError(f"{buft.get_name()}: {size} bytes exceeds the buffer type's max size {buft.get_max_size()}")
    return buft.alloc_buffer(size)


def backend_buft_get_alignment(buft: BufferType) -> int:
    return buft.get_alignment()


def backend_buft_get_max_size(buft: BufferType) -> int:
    return buft.get_max_size()


def backend_buft_get_alloc_size(buft: BufferType, tensor: Tensor) -> int:
    return buft.get_alloc_size(tensor)


def backend_buft_is_host(buft: BufferType) -> bool:
    return buft.is_host()


def backend_buft_get_device(buft: BufferType):
    return buft.get_device()


def backend_buffer_name(buffer: Buffer) -> str:
    return buffer.name


def backend_buffer_free(buffer: Buffer | None) -> None:
    if buffer is not None:
        buffer.free()


def backend_buffer_get_base(buffer: Buffer) -> int:
    return buffer.get_base()


def backend_buffer_get_size(buffer: Buffer) -> int:
    return buffer.size


def backend_buffer_init_tensor(buffer: Buffer, tensor: Tensor) -> Status:
    return buffer.init_tensor(tensor)


def backend_buffer_get_alignment(buffer: Buffer) -> int:
    return buffer.buft.get_alignment()


def backend_buffer_get_max_size(buffer: Buffer) -> int:
    return buffer.buft.get_max_size()


def backend_buffer_get_alloc_size(buffer: Buffer, tensor: Tensor) -> int:
    return buffer.buft.get_alloc_size(tensor)


def backend_buffer_clear(buffer: Buffer, value: int) -> None:
    check_not_freed(buffer, "backend_buffer_clear")
    if buffer.size:
        buffer.clear(value)


def backend_buffer_is_host(buffer: Buffer) -> bool:
    return buffer.buft.is_host()


def backend_buffer_set_usage(buffer: Buffer, usage: BufferUsage) -> None:
    buffer.set_usage(usage)


def backend_buffer_get_usage(buffer: Buffer) -> BufferUsage:
    return buffer.usage


def backend_buffer_get_type(buffer: Buffer) -> BufferType:
    return buffer.buft


def backend_buffer_reset(buffer: Buffer) -> None:
    buffer.reset()
