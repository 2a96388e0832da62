"""Memory planning: tallocr (linear), gallocr (graph planner) and context tensor allocation."""
from __future__ import annotations

from .tensor import Tensor, nbytes
from .enums import Status


def _align(offset: int, alignment: int) -> int:
    return -(-offset // alignment) * alignment


def backend_tensor_alloc(buffer, tensor: Tensor, addr: int) -> Status:
    """Place tensor at address addr inside buffer (ggml_backend_tensor_alloc)."""
    if tensor.buffer is not None or tensor.data is not None:
        raise ValueError(f"backend_tensor_alloc: {tensor.describe()} is already allocated")
    if tensor.view_src is not None:
        raise ValueError(f"backend_tensor_alloc: {tensor.describe()} is a view; use backend_view_init")
    base = buffer.get_base()
    size = buffer.buft.get_alloc_size(tensor)
    if addr < base or addr + size > base + buffer.size:
        raise MemoryError(f"backend_tensor_alloc: {tensor.describe()} ({size} bytes at offset {addr - base}) "
                          f"does not fit in buffer {buffer.name} of {buffer.size} bytes")
    tensor.buffer = buffer
    tensor.data = addr
    return buffer.init_tensor(tensor)


def backend_view_init(tensor: Tensor) -> Status:
    """Give a view the address of its source (ggml_backend_view_init)."""
    src = tensor.view_src
    if src is None or src.buffer is None or src.data is None:
        raise ValueError(f"backend_view_init: the source of {tensor.describe()} is not allocated")
    tensor.buffer = src.buffer
    tensor.data = src.data + tensor.view_offs
    return src.buffer.init_tensor(tensor)


def backend_alloc_ctx_tensors_from_buft(ctx, buft):
    """Allocate every unallocated tensor of ctx in one buffer of buft; views get their source's
    address. Returns the buffer, or None when there was nothing to allocate."""
    alignment = buft.get_alignment()
    todo = [t for t in ctx.tensors if t.data is None and t.view_src is None]
    offsets = []
    size = 0
    for t in todo:
        offsets.append(size)
        size = _align(size + buft.get_alloc_size(t), alignment)
    if size == 0:
        return None
    buffer = buft.alloc_buffer(size)
    for t, offs in zip(todo, offsets):
        backend_tensor_alloc(buffer, t, buffer.get_base() + offs)
    for t in ctx.tensors:
        if t.data is None and t.view_src is not None:
            backend_view_init(t)
    return buffer


def backend_alloc_ctx_tensors(ctx, backend):
    return backend_alloc_ctx_tensors_from_buft(ctx, backend.get_default_buffer_type())
