"""The RPC client: a remote ggml RPC server's devices as torchggml devices (ggml-rpc.h).

One `Connection` per endpoint (upstream's dispatcher), shared by the server's devices, buffer
types, buffers and backends. The socket is the queue: commands without a response
(SET_TENSOR, GRAPH_COMPUTE, ...) return once written, so the server computes while the client
goes on; a command with a response (GET_TENSOR, ...) waits for it, and the server answers in
order, after the work queued before it. The server holds the memory: a remote buffer's base is
the server's address, tensors in it carry remote addresses, and their bytes cross the wire
only through set/get/copy.

A server that goes away raises `RPCServerGoneError` naming the endpoint and the command.
"""
from __future__ import annotations

import itertools
import socket
import struct
import threading

import numpy as np
import torch

from ...backend.impl import (Backend, Buffer, BufferType, BufferUsage, Device, DeviceCaps, DeviceType,
                            Event, Reg)
from ...enums import Op, Status
from ...tensor import Tensor, memory_buffer, nbytes
from ...types import is_quantized
from . import protocol as P
from .protocol import Cmd, RPCError, RPCServerGoneError

RPC_GUID = bytes([0x99, 0x68, 0x5b, 0x6c, 0xd2, 0x83, 0x3d, 0x24, 0x25, 0x36, 0x72, 0xe1, 0x5b, 0x0e, 0x14, 0x03])
_U32_MAX = 2**32 - 1
# upstream's ggml_op_alloc_size_may_expand: outputs a backend may allocate larger than nbytes
ALLOC_SIZE_MAY_EXPAND = frozenset(getattr(Op, n) for n in ("FLASH_ATTN_EXT", "MUL_MAT", "MUL_MAT_ID", "CUMSUM",
                                                           "ARGSORT", "TOP_K") if hasattr(Op, n))


class Connection:
    """One TCP connection to a server, opened with HELLO; `call` sends a command and, for the
    commands that answer, returns the response bytes (of the size the layout expects)."""

    def __init__(self, endpoint: str, timeout: float | None = None):
        self.endpoint = endpoint
        host, port = P.parse_endpoint(endpoint)
        self.lock = threading.Lock()
        self.bytes_sent = 0
        self.bytes_received = 0
        try:
            self.sock = socket.create_connection((host, port), timeout=timeout)
        except OSError as e:
            raise RPCServerGoneError(f"cannot connect to the RPC server at {endpoint}: {e}") from None
        self.sock.settimeout(None)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        rsp = self.call(Cmd.HELLO, bytes(P.CONN_CAPS_SIZE), response_size=P.HELLO_RSP.size)
        major, minor, patch, _, _ = P.HELLO_RSP.unpack(rsp)
        self.version = (major, minor, patch)
        if major != P.PROTO_MAJOR or minor > P.PROTO_MINOR:
            self.close()
            raise RPCError(f"RPC server at {endpoint} speaks protocol {major}.{minor}.{patch}, "
                           f"this client {P.PROTO_MAJOR}.{P.PROTO_MINOR}.x")
        # 7.0.1: the server answers GET_DEVICE_SUPPORTS_OP
        self.has_supports_op = (major, minor) == (P.PROTO_MAJOR, P.PROTO_MINOR) and patch >= 1

    def call(self, cmd: Cmd, *parts, response_size: int | None = None, into=None):
        """Send `cmd` with the payload parts; with `response_size`, wait for the answer and
        return it (read into `into`, a writable uint8 buffer, when given)."""
        with self.lock:
            try:
                P.send_command(self.sock, cmd, *parts)
                self.bytes_sent += 9 + sum(memoryview(p).nbytes for p in parts)
                if response_size is None:
                    return None
                size = P.U64.unpack(P.recv_exact(self.sock, 8))[0]
                if size != response_size:
                    raise RPCError(f"RPC server at {self.endpoint} answered {cmd.name} with {size} bytes, "
                                   f"expected {response_size}")
                out = P.recv_exact(self.sock, size, into)
                self.bytes_received += 8 + size
                return out
            except (EOFError, OSError) as e:
                raise RPCServerGoneError(f"the RPC server at {self.endpoint} went away during {cmd.name}: "
                                         f"{e or type(e).__name__}") from None

    def barrier(self) -> None:
        """Wait until the server has done everything sent before: it answers in order, so one
        small command with an answer (DEVICE_COUNT) is the barrier."""
        self.call(Cmd.DEVICE_COUNT, response_size=4)

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass


_connections: dict[str, Connection] = {}
_connections_lock = threading.Lock()


def connection(endpoint: str) -> Connection:
    """The endpoint's connection (opened once, as upstream's get_dispatcher)."""
    with _connections_lock:
        conn = _connections.get(endpoint)
        if conn is None:
            conn = _connections[endpoint] = Connection(endpoint)
        return conn


def close_connection(endpoint: str) -> None:
    """Forget the endpoint's connection (the server frees that connection's buffers)."""
    with _connections_lock:
        conn = _connections.pop(endpoint, None)
    if conn is not None:
        conn.close()


# ---------------------------------------------------------------- serialized tensors and graphs

def serialize_tensor(t: Tensor | None, conn: Connection, use_count: int = 0) -> bytes:
    """rpc_tensor of t: its remote buffer and address when t lives on this connection's server,
    0 and 0 otherwise; ids are the client objects' ids, as upstream sends pointers."""
    if t is None:
        return P.NULL_TENSOR
    buf = memory_buffer(t)
    if isinstance(buf, RPCBuffer) and buf.conn is conn and t.data is not None:
        handle, data = buf.handle, t.data
    else:
        handle, data = 0, 0
    ne, nb = t.ne, t.nb
    if max(ne) > _U32_MAX or max(nb) > _U32_MAX:
        raise ValueError(f"RPC: {t.describe()} has sizes or strides above 2^32 (ne={list(ne)}, nb={list(nb)}), "
                         f"which ggml's rpc_tensor cannot carry")
    return P.pack_tensor(id(t), int(t.type), handle, ne, nb, int(t.op), t.op_params, t.flags,
                         [id(s) if s is not None else 0 for s in t.src],
                         id(t.view_src) if t.view_src is not None else 0, t.view_offs, data, t.name, use_count)


def serialize_graph(device: int, graph, conn: Connection) -> bytes:
    """| device | n_nodes | node ids | n_tensors | every tensor the nodes reach (sources and view
    sources, each once) with its use count among the nodes |"""
    nodes = graph.nodes
    uses: dict[int, int] = {}
    for n in nodes:
        for s in n.src:
            if s is not None:
                uses[id(s)] = uses.get(id(s), 0) + 1
    seen: dict[int, Tensor] = {}
    stack = list(reversed(nodes))
    while stack:  # every reachable tensor once (order does not matter to the server)
        t = stack.pop()
        if id(t) in seen:
            continue
        seen[id(t)] = t
        stack.extend(s for s in t.src if s is not None and id(s) not in seen)
        if t.view_src is not None and id(t.view_src) not in seen:
            stack.append(t.view_src)
    parts = [P.GRAPH_HEAD.pack(device, len(nodes)), struct.pack(f"<{len(nodes)}Q", *map(id, nodes)),
             P.U32.pack(len(seen))]
    parts += [serialize_tensor(t, conn, uses.get(i, 0)) for i, t in seen.items()]
    return b"".join(parts)


# ---------------------------------------------------------------- buffer types and buffers

class RPCBufferType(BufferType):
    """Memory of one device of a server ("RPC<device>[<endpoint>]")."""

    def __init__(self, endpoint: str, device_index: int, device=None):
        super().__init__(f"RPC{device_index}[{endpoint}]", device)
        self.endpoint, self.device_index = endpoint, device_index
        conn = connection(endpoint)
        req = P.U32.pack(device_index)
        self.alignment = P.U64.unpack(conn.call(Cmd.GET_ALIGNMENT, req, response_size=8))[0]
        self.max_size = P.U64.unpack(conn.call(Cmd.GET_MAX_SIZE, req, response_size=8))[0]
        self._alloc_sizes: dict = {}

    def get_alignment(self) -> int:
        return self.alignment

    def get_max_size(self) -> int:
        return self.max_size

    def alloc_buffer(self, size: int) -> "RPCBuffer":
        conn = connection(self.endpoint)
        rsp = conn.call(Cmd.ALLOC_BUFFER, P.ALLOC_BUFFER_REQ.pack(self.device_index, int(size)), response_size=16)
        handle, remote_size = P.ALLOC_BUFFER_RSP.unpack(rsp)
        if handle == 0:
            raise MemoryError(f"{self.name}: the server could not allocate {size} bytes (out of memory, or "
                              f"past its per-client quota, --client-memory: its log says which)")
        base = P.U64.unpack(conn.call(Cmd.BUFFER_GET_BASE, P.U64.pack(handle), response_size=8))[0]
        return RPCBuffer(self, conn, handle, remote_size, base)

    def get_alloc_size(self, tensor: Tensor) -> int:
        # ask the server only where its device may want more than nbytes: quantized rows it
        # pads (CUDA pads to 512 elements), and ops that keep scratch data beside their output
        padded = is_quantized(tensor.type) and tensor.ne[0] % 512 and tensor.view_src is None
        if not (padded or tensor.op in ALLOC_SIZE_MAY_EXPAND):
            return nbytes(tensor)
        key = (int(tensor.type), int(tensor.op), bytes(tensor.op_params), tuple(tensor.ne), tuple(tensor.nb))
        if key not in self._alloc_sizes:
            conn = connection(self.endpoint)
            parts = [P.U32.pack(self.device_index), serialize_tensor(tensor, conn)]
            parts += [serialize_tensor(s, conn) for s in tensor.src]
            self._alloc_sizes[key] = P.U64.unpack(conn.call(Cmd.GET_ALLOC_SIZE, *parts, response_size=8))[0]
        return max(self._alloc_sizes[key], nbytes(tensor))


def _payload(data: torch.Tensor, size: int) -> np.ndarray:
    """The first `size` bytes of a flat uint8 torch tensor as a numpy array (a host copy when
    it lives on a device)."""
    return data[:size].cpu().numpy()


class RPCBuffer(Buffer):
    """A buffer on the server (`handle`), its base the server's address."""

    def __init__(self, buft: RPCBufferType, conn: Connection, handle: int, size: int, base: int):
        super().__init__(buft, size, base)
        self.conn, self.handle = conn, handle

    def init_tensor(self, tensor: Tensor) -> Status:
        if is_quantized(tensor.type) and tensor.ne[0] % 512 and tensor.view_src is None:
            self.conn.call(Cmd.INIT_TENSOR, serialize_tensor(tensor, self.conn))
        return Status.SUCCESS

    def set_tensor(self, tensor: Tensor, data, offset: int, size: int) -> None:
        wire = serialize_tensor(tensor, self.conn)
        payload = _payload(data, size)
        flag = 0
        if size > P.HASH_THRESHOLD and self.usage == BufferUsage.WEIGHTS:
            digest = P.fnv_hash(payload)
            rsp = self.conn.call(Cmd.SET_TENSOR_HASH, wire, P.SET_HASH_TAIL.pack(offset, digest), response_size=1)
            if rsp[0]:
                return  # the server had these bytes in its cache
            flag = 1   # ask it to keep them
        self.conn.call(Cmd.SET_TENSOR, wire, P.SET_TENSOR_HEAD.pack(flag, offset), payload)

    def get_tensor(self, tensor: Tensor, out, offset: int, size: int) -> None:
        req = serialize_tensor(tensor, self.conn) + P.TENSOR_RANGE.pack(offset, size)
        if out.device.type == "cpu" and out.is_contiguous():
            self.conn.call(Cmd.GET_TENSOR, req, response_size=size, into=memoryview(out[:size].numpy()))
        else:
            raw = self.conn.call(Cmd.GET_TENSOR, req, response_size=size)
            out[:size].copy_(torch.frombuffer(bytearray(raw), dtype=torch.uint8))

    def memset_tensor(self, tensor: Tensor, value: int, offset: int, size: int) -> None:
        self.conn.call(Cmd.MEMSET_TENSOR, serialize_tensor(tensor, self.conn), P.MEMSET_TAIL.pack(offset, size, value))

    def clear(self, value: int) -> None:
        self.conn.call(Cmd.BUFFER_CLEAR, P.BUFFER_CLEAR_REQ.pack(self.handle, value))

    def cpy_tensor(self, src: Tensor, dst: Tensor) -> bool:
        sbuf, dbuf = memory_buffer(src), memory_buffer(dst)
        if not (isinstance(sbuf, RPCBuffer) and isinstance(dbuf, RPCBuffer) and sbuf.conn is dbuf.conn):
            return False  # different servers: the caller goes through host memory
        rsp = self.conn.call(Cmd.COPY_TENSOR, serialize_tensor(src, self.conn), serialize_tensor(dst, self.conn),
                             response_size=1)
        return bool(rsp[0])

    def free(self) -> None:
        if not self.freed:
            try:
                self.conn.call(Cmd.FREE_BUFFER, P.U64.pack(self.handle))
            except RPCServerGoneError:
                pass  # the server is gone, and the buffer with it
        super().free()


# ---------------------------------------------------------------- backends, devices, regs

class RPCBackend(Backend):
    """A stream on a server's device. graph_compute sends the graph (or GRAPH_RECOMPUTE when the
    same graph, at the same addresses, was the device's last) and returns at once."""

    def __init__(self, device: "RPCDevice"):
        super().__init__(device, f"RPC{device.index}[{device.endpoint}]")
        self.guid = RPC_GUID
        self.conn = connection(device.endpoint)

    def graph_compute(self, graph) -> Status:
        if not graph.nodes:
            return Status.SUCCESS
        key = (graph.uid, tuple(n.data for n in graph.nodes))
        if self.device.last_graph == key:
            self.conn.call(Cmd.GRAPH_RECOMPUTE, P.U32.pack(self.device.index))
        else:
            self.device.last_graph = key
            self.conn.call(Cmd.GRAPH_COMPUTE, serialize_graph(self.device.index, graph, self.conn))
        return Status.SUCCESS

    def set_tensor_async(self, tensor, data, offset, size):  # ordered by the connection
        memory_buffer(tensor).set_tensor(tensor, data, offset, size)

    def get_tensor_async(self, tensor, out, offset, size):
        memory_buffer(tensor).get_tensor(tensor, out, offset, size)

    def synchronize(self) -> None:
        self.conn.barrier()

    # one in-order stream per server: work queued after event_wait already follows the recorded
    # work on the same connection; event_synchronize is the barrier
    def event_record(self, event) -> None:
        pass

    def event_wait(self, event) -> None:
        pass


class RPCDevice(Device):
    """Device `index` of the server at `endpoint`, named RPC<n> (n counts every server's
    devices in the order they were added, as upstream names them)."""

    def __init__(self, endpoint: str, index: int, name: str, reg=None):
        super().__init__(name, endpoint, DeviceType.GPU, reg)
        self.endpoint, self.index = endpoint, index
        self.last_graph = None
        self._buft: RPCBufferType | None = None
        self._supports: dict = {}

    def get_memory(self) -> tuple[int, int]:
        return backend_rpc_get_device_memory(self.endpoint, self.index)

    def get_caps(self) -> DeviceCaps:
        return DeviceCaps(async_=True, host_buffer=False, buffer_from_host_ptr=False, events=True,
                          mmap_support=False)

    def init_backend(self, params=None) -> RPCBackend:
        return RPCBackend(self)

    def get_buffer_type(self) -> RPCBufferType:
        if self._buft is None:
            self._buft = RPCBufferType(self.endpoint, self.index, self)
        return self._buft

    def supports_op(self, op) -> bool:
        conn = connection(self.endpoint)
        if not conn.has_supports_op:
            return True  # servers before 7.0.1 cannot say: upstream assumes every op
        key = (int(op.op), bytes(op.op_params), int(op.type), tuple(op.ne),
               tuple((int(s.type), tuple(s.ne), tuple(s.nb)) if s is not None else None for s in op.src))
        if key not in self._supports:
            parts = [P.U32.pack(self.index), serialize_tensor(op, conn)] + [serialize_tensor(s, conn) for s in op.src]
            self._supports[key] = bool(conn.call(Cmd.GET_DEVICE_SUPPORTS_OP, *parts, response_size=1)[0])
        return self._supports[key]

    def supports_buft(self, buft) -> bool:
        return isinstance(buft, RPCBufferType) and buft.endpoint == self.endpoint and buft.device_index == self.index

    def event_new(self) -> Event:
        return Event(self)

    def event_synchronize(self, event) -> None:
        connection(self.endpoint).barrier()


class RPCReg(Reg):
    """RPC[<endpoint>]: the devices of one server (backend_rpc_add_server), or, without an
    endpoint, upstream's "RPC" reg: no devices, and the proc addresses that add servers."""

    def __init__(self, endpoint: str | None = None, devices=()):
        super().__init__(f"RPC[{endpoint}]" if endpoint else "RPC")
        self.endpoint = endpoint
        self.devices = list(devices)

    def get_devices(self):
        return self.devices

    def proc_rpc_add_server(self, endpoint):
        return backend_rpc_add_server(endpoint)

    def proc_rpc_start_server(self, endpoint, cache_dir=None, n_threads=None, devices=None):
        from .server import backend_rpc_start_server
        return backend_rpc_start_server(endpoint, cache_dir, n_threads, devices)


_base_reg = RPCReg()
_server_regs: dict[str, RPCReg] = {}
_device_names = itertools.count()
_regs_lock = threading.Lock()


# ---------------------------------------------------------------- ggml-rpc.h

def backend_rpc_reg() -> RPCReg:
    """The "RPC" reg (no devices; proc addresses rpc_add_server, rpc_start_server)."""
    return _base_reg


def backend_rpc_add_server(endpoint: str) -> RPCReg | None:
    """A reg whose devices are the server's (RPC0, RPC1... across servers); the same reg for
    the same endpoint; None when the server has no devices. Register it with backend_register
    to make its devices enumerable (llama.cpp's --rpc does)."""
    with _regs_lock:
        reg = _server_regs.get(endpoint)
        if reg is not None:
            return reg
        n = P.U32.unpack(connection(endpoint).call(Cmd.DEVICE_COUNT, response_size=4))[0]
        if n == 0:
            return None
        reg = RPCReg(endpoint)
        reg.devices = [RPCDevice(endpoint, i, f"RPC{next(_device_names)}", reg) for i in range(n)]
        _server_regs[endpoint] = reg
        return reg


def close_server(endpoint: str) -> None:
    """Forget a server: its reg leaves the registry (when registered) and the RPC0.. devices it
    gave stop being found, and its connection closes (the server frees that connection's
    buffers). Not in ggml-rpc.h: for a server that went away, or tests that start many."""
    from ...backend.registry import backend_unload
    with _regs_lock:
        reg = _server_regs.pop(endpoint, None)
    if reg is not None:
        try:
            backend_unload(reg)
        except ValueError:
            pass  # never registered
    close_connection(endpoint)


def _device(endpoint: str, device: int) -> RPCDevice:
    reg = backend_rpc_add_server(endpoint)
    if reg is None or not 0 <= device < len(reg.devices):
        raise ValueError(f"RPC server at {endpoint} has no device {device} "
                         f"({0 if reg is None else len(reg.devices)} devices)")
    return reg.devices[device]


def backend_rpc_init(endpoint: str, device: int = 0) -> RPCBackend:
    return _device(endpoint, device).init_backend()


def backend_is_rpc(backend) -> bool:
    return backend is not None and getattr(backend, "guid", None) == RPC_GUID


def backend_rpc_buffer_type(endpoint: str, device: int = 0) -> RPCBufferType:
    return _device(endpoint, device).get_buffer_type()


def backend_rpc_get_device_memory(endpoint: str, device: int = 0) -> tuple[int, int]:
    """(free, total) bytes of the server's device."""
    rsp = connection(endpoint).call(Cmd.GET_DEVICE_MEMORY, P.U32.pack(device), response_size=16)
    return P.DEVICE_MEMORY_RSP.unpack(rsp)
