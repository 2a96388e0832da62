"""Multi-buffers: several buffers handled as one (ggml_backend_multi_buffer_*), e.g. a model's
weights spread over a few allocations. Tensors live in the member buffers; the multi-buffer
frees, clears and sets the usage of all of them at once."""
from __future__ import annotations

from .impl import Buffer, BufferUsage


class MultiBuffer(Buffer):
    def __init__(self, buffers):
        buffers = list(buffers)
        if not buffers:
            raise ValueError("backend_multi_buffer_alloc_buffer: at least one buffer is needed")
        for b in buffers:
            if not isinstance(b, Buffer):
                raise TypeError(f"backend_multi_buffer_alloc_buffer: expected Buffers, got {type(b).__name__}")
        super().__init__(buffers[0].buft, sum(b.size for b in buffers), 0)
        self.buffers = buffers

    @property
    def name(self) -> str:
        return self.buffers[0].name

    def __repr__(self):
        return f"<ggml.MultiBuffer {self.name} x{len(self.buffers)} {self.size} bytes usage={self.usage.name}>"

    def _no_tensors(self, *args):
        raise TypeError(f"multi-buffer {self.name}: tensors live in its member buffers, not in the multi-buffer")

    set_tensor = get_tensor = memset_tensor = _no_tensors

    def clear(self, value: int) -> None:
        for b in self.buffers:
            if b.size:
                b.clear(value)

    def free(self) -> None:
        super().free()
        for b in self.buffers:
            b.free()

    def reset(self) -> None:
        for b in self.buffers:
            b.reset()

    def set_usage(self, usage: BufferUsage) -> None:
        super().set_usage(usage)
        for b in self.buffers:
            b.set_usage(usage)

    def is_multi_buffer(self) -> bool:
        return True


def backend_multi_buffer_alloc_buffer(buffers) -> MultiBuffer:
    """One buffer made of `buffers` (it takes ownership: freeing it frees them)."""
    return MultiBuffer(buffers)


def backend_buffer_is_multi_buffer(buffer: Buffer) -> bool:
    return buffer.is_multi_buffer()


def backend_multi_buffer_set_usage(buffer: Buffer, usage: BufferUsage) -> None:
    if not buffer.is_multi_buffer():
        raise TypeError(f"backend_multi_buffer_set_usage: buffer {buffer.name} is not a multi-buffer")
    buffer.set_usage(usage)
