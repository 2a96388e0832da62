"""Buffer types and buffers: the mirrored functions (backend_buft_*, backend_buffer_*). They
check arguments and call the interfaces of backend/impl.py (BufferType, Buffer)."""
from __future__ import annotations

from .impl import Buffer, BufferFreedError, BufferType, BufferUsage, check_not_freed
from ..enums import Status
from ..tensor import Tensor

__all__ = ["Buffer", "BufferType", "BufferUsage", "BufferFreedError", "check_not_freed"]  # with the functions below


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
