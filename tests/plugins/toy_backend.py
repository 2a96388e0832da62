"""A third-party backend written only against torchggml's public API: the TOY reg with one
accelerator device, TOY0, whose memory is a torch storage it manages itself and whose backend
computes ADD, MUL and SCALE on F32 tensors. Loaded by tests with ggml.backend_load(<this file>)
or through a `torchggml.backends` entry point; torchggml itself knows nothing about it."""
import torch

import torchggml as ggml

SUPPORTED = {ggml.Op.ADD: torch.add, ggml.Op.MUL: torch.mul}


class ToyBuffer(ggml.Buffer):
    def __init__(self, buft, size):
        self.bytes = torch.zeros(max(size, 1), dtype=torch.uint8)
        super().__init__(buft, size, self.bytes.data_ptr())
        self.storage = self.bytes.untyped_storage()  # lets ggml.to_torch view tensors in it

    def _slice(self, tensor, offset, size):
        start = tensor.data - self.base + offset
        return self.bytes[start:start + size]

    def set_tensor(self, tensor, data, offset, size):
        self._slice(tensor, offset, size).copy_(data[:size])

    def get_tensor(self, tensor, out, offset, size):
        out[:size].copy_(self._slice(tensor, offset, size))

    def clear(self, value):
        self.bytes.fill_(value)


class ToyBufferType(ggml.BufferType):
    def alloc_buffer(self, size):
        return ToyBuffer(self, size)

    def get_alignment(self):
        return 64


class ToyBackend(ggml.Backend):
    def graph_compute(self, graph):
        for node in graph.nodes:
            if node.op in (ggml.Op.RESHAPE, ggml.Op.VIEW, ggml.Op.PERMUTE, ggml.Op.TRANSPOSE):
                continue
            if not self.device.supports_op(node):
                raise ggml.UnsupportedOpError(f"TOY0 cannot run op {node.op.name}")
            a = ggml.to_torch(node.src[0])
            if node.op == ggml.Op.SCALE:
                ggml.to_torch(node).copy_(a * ggml.get_op_params_f32(node, 0) + ggml.get_op_params_f32(node, 1))
            else:
                ggml.to_torch(node).copy_(SUPPORTED[node.op](a, ggml.to_torch(node.src[1])))
        return ggml.Status.SUCCESS


class ToyDevice(ggml.Device):
    def __init__(self, reg):
        super().__init__("TOY0", "a toy accelerator from a plugin", ggml.DeviceType.ACCEL, reg)
        self.buffer_type = ToyBufferType("TOY0", self)

    def get_memory(self):
        return 1 << 30, 1 << 30

    def init_backend(self, params=None):
        return ToyBackend(self)

    def get_buffer_type(self):
        return self.buffer_type

    def supports_op(self, op):
        srcs = [s for s in op.src if s is not None]
        types_ok = all(t.type == ggml.Type.F32 for t in [op, *srcs])
        if op.op == ggml.Op.SCALE:
            return types_ok
        return op.op in SUPPORTED and types_ok and ggml.are_same_shape(srcs[0], srcs[1])


class ToyReg(ggml.Reg):
    def __init__(self):
        super().__init__("TOY")
        self.devices = [ToyDevice(self)]

    def get_devices(self):
        return self.devices

    def proc_get_features(self):
        return {"TOY": "1"}


def backend_reg():
    return ToyReg()
