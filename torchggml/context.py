"""Context: owns tensor metadata (ggml_init). With no_alloc=False it also owns a CPU memory pool."""
from __future__ import annotations

from .storage import TorchBufferType, tensor_view
from .tensor import Tensor, MAX_DIMS, contiguous_strides, nbytes, round_up, set_name
from .types import Type, as_type

TENSOR_ALIGNMENT = 32  # ggml's GGML_MEM_ALIGN for context memory
# the memory of contexts with no_alloc=False: host memory of no device, as ggml's malloc'd
# context memory; the CPU computes on it (it supports every host buffer type)
CONTEXT_MEMORY = TorchBufferType("CPU", None, "cpu", host=True)


class Context:
    """ggml_context. Tensors created here are listed in creation order (ggml_get_first_tensor...).

    mem_size is the byte budget of the memory pool when no_alloc is False; with no_alloc=True
    tensors are metadata only and get memory later from an allocator (tallocr, gallocr, the
    scheduler or backend_alloc_ctx_tensors).
    """

    def __init__(self, mem_size: int = 0, no_alloc: bool = False):
        self.mem_size = int(mem_size)
        self.no_alloc = bool(no_alloc)
        self.tensors: list[Tensor] = []
        self._pool = None  # CPU buffer backing tensor data when no_alloc is False
        self._pool_used = 0

    def __repr__(self):
        return f"<ggml.Context {len(self.tensors)} tensors no_alloc={self.no_alloc}>"

    def _alloc_data(self, t: Tensor) -> None:
        size = nbytes(t)
        if self._pool is None:
            # host memory as ggml's malloc'd context memory: one buffer for the context
            self._pool = CONTEXT_MEMORY.alloc_buffer(max(self.mem_size, 1))
        offs = round_up(self._pool_used, TENSOR_ALIGNMENT)
        if offs + size > self.mem_size:
            raise MemoryError(
                f"context memory exhausted: {t.describe()} needs {size} bytes at offset {offs}, "
                f"mem_size is {self.mem_size} (create the context with a larger mem_size)")
        self._pool_used = offs + size
        t.buffer = self._pool
        t.data = self._pool.get_base() + offs

    def free(self) -> None:
        self.tensors.clear()
        if self._pool is not None:
            self._pool.free()
            self._pool = None


def init(mem_size: int = 16 * 1024 * 1024, mem_buffer=None, no_alloc: bool = False) -> Context:
    """ggml_init. `mem_buffer` is accepted for symmetry with C and must be None."""
    if mem_buffer is not None:
        raise ValueError("init: mem_buffer is not supported; tensors get torch storage memory")
    return Context(mem_size, no_alloc)


def free(ctx: Context) -> None:
    ctx.free()


def get_no_alloc(ctx: Context) -> bool:
    return ctx.no_alloc


def set_no_alloc(ctx: Context, no_alloc: bool) -> None:
    ctx.no_alloc = bool(no_alloc)


def get_first_tensor(ctx: Context):
    return ctx.tensors[0] if ctx.tensors else None


def get_next_tensor(ctx: Context, t: Tensor):
    i = ctx.tensors.index(t) + 1
    return ctx.tensors[i] if i < len(ctx.tensors) else None


def get_tensor(ctx: Context, name: str):
    for t in ctx.tensors:
        if t.name == name:
            return t
    return None


def used_mem(ctx: Context) -> int:
    return ctx._pool_used


# ---------------------------------------------------------------- tensor creation

def new_tensor_impl(ctx: Context, type, ne, view_src: Tensor | None = None, view_offs: int = 0,
                    nb=None) -> Tensor:
    """Create a tensor of `type` and shape `ne` (1..4 dims), optionally a view of `view_src` at
    `view_offs` with strides `nb` (contiguous strides when None)."""
    type = as_type(type)
    ne = [int(n) for n in ne]
    if not 1 <= len(ne) <= MAX_DIMS:
        raise ValueError(f"new_tensor: {len(ne)} dims; ggml tensors have 1 to 4")
    if any(n < 0 for n in ne):
        raise ValueError(f"new_tensor: negative dimension in ne={ne}")
    ne = ne + [1] * (MAX_DIMS - len(ne))
    if view_src is not None and view_src.view_src is not None:
        # views of views point at the root tensor, offsets folded
        view_offs += view_src.view_offs
        view_src = view_src.view_src
    t = Tensor(ctx, type, ne, list(nb) if nb is not None else contiguous_strides(type, ne), view_src, view_offs)
    if view_src is not None:
        _check_view_bounds(t, view_src, view_offs, nbytes(t))
        t.buffer = view_src.buffer
        if view_src.data is not None:
            t.data = view_src.data + view_offs
    elif not ctx.no_alloc:
        ctx._alloc_data(t)
    ctx.tensors.append(t)
    return t


def _check_view_bounds(t: Tensor, view_src: Tensor, view_offs: int, size: int) -> None:
    if view_offs < 0 or view_offs + size > nbytes(view_src):
        raise ValueError(
            f"view out of bounds: {size} bytes at offset {view_offs} of {view_src.describe()}, "
            f"which has {nbytes(view_src)} bytes")


def new_tensor(ctx: Context, type, ne) -> Tensor:
    return new_tensor_impl(ctx, type, ne)


def new_tensor_1d(ctx, type, ne0):
    return new_tensor_impl(ctx, type, [ne0])


def new_tensor_2d(ctx, type, ne0, ne1):
    return new_tensor_impl(ctx, type, [ne0, ne1])


def new_tensor_3d(ctx, type, ne0, ne1, ne2):
    return new_tensor_impl(ctx, type, [ne0, ne1, ne2])


def new_tensor_4d(ctx, type, ne0, ne1, ne2, ne3):
    return new_tensor_impl(ctx, type, [ne0, ne1, ne2, ne3])


def new_i32(ctx, value: int) -> Tensor:
    t = new_tensor_1d(ctx, Type.I32, 1)
    _set_host_value(t, value)
    return t


def new_f32(ctx, value: float) -> Tensor:
    t = new_tensor_1d(ctx, Type.F32, 1)
    _set_host_value(t, value)
    return t


def _set_host_value(t: Tensor, value) -> None:
    if t.data is None:
        raise ValueError("new_i32/new_f32 need a context with memory (no_alloc=False)")
    tensor_view(t).fill_(value)


def dup_tensor(ctx: Context, src: Tensor) -> Tensor:
    """A new tensor with src's type and shape (contiguous, no data copied)."""
    return new_tensor_impl(ctx, src.type, src.ne)


def view_tensor(ctx: Context, src: Tensor) -> Tensor:
    """A view of all of src (same type, shape and strides)."""
    t = new_tensor_impl(ctx, src.type, src.ne, src, 0, src.nb)
    set_name(t, f"{src.name} (view)")
    return t
