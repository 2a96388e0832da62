"""The RPC server: torchggml devices served to ggml RPC clients (llama.cpp's --rpc, torchggml's).

`RPCServer(endpoint, devices)` listens on TCP; each connection gets a thread and a `Session`
(upstream's rpc_server: its own buffers, freed when the connection closes, and the last graph
per device for GRAPH_RECOMPUTE). Commands run one at a time across sessions (one lock), so
the devices' backends are never driven concurrently.

Nothing from the wire is trusted: request sizes must equal the command's layout (SET_TENSOR's
data and GRAPH_COMPUTE's tensor list must add up exactly), device indices, tensor types and op
ids must exist, buffer handles must belong to the session, every tensor's bytes
[data, data + nbytes) must lie in its buffer, offsets and sizes of reads and writes in the
tensor and the buffer, graph node and source ids must name tensors of the message, and every
node must have memory, an op its device supports and, for the ops whose kernels index their
sources by shape, the shape ggml's rules give it (shapes.py); a view must lie where its source
and offset put it. A violation closes that connection with a logged reason ("torchggml.devices.rpc"
logger); the server keeps serving the others. (The kernels check what they read beyond that:
a fused or specialised kernel whose inputs' views would not span its reads is not used.)

Memory: a fresh buffer reads as zeros (never the server's earlier heap contents), and each
connection may hold at most `client_memory` bytes of buffers (ALLOC_BUFFER answers upstream's
"allocation failed" past it, with the reason logged).

Time: HELLO must arrive within `handshake_timeout` seconds of connecting; once a message has
begun, a pause of `message_timeout` seconds in its bytes (or in reading the answer) drops the
connection; a connection idle for `idle_timeout` seconds between messages is dropped when it
holds no buffers, and, when it holds some, only when the server is full and another client
would be refused (llama.cpp's clients keep their connection, and their weights, between
requests).

ggml's RPC has no authentication: the server binds to 127.0.0.1 unless told otherwise and
warns when bound to another address.
"""
from __future__ import annotations

import ipaddress
import re
import logging
import os
import socket
import struct
import threading
import time
import warnings
from array import array
from dataclasses import dataclass, field
from pathlib import Path

import torch

from ...backend.impl import Buffer
from ...enums import Op, Status
from ...graph import CGraph
from ...storage import byte_view
from ...tensor import Tensor, nbytes, are_same_layout, MAX_SRC
from ...types import Type, type_traits
from . import protocol as P
from .protocol import Cmd, WireTensor
from .shapes import check_node

log = logging.getLogger("torchggml.devices.rpc")

MAX_GRAPH_NODES = 1 << 18      # a graph message naming more nodes is refused (llama.cpp's graphs: < 2^16)
# seconds (None: no limit); see the module's docstring and docs/rpc.md
HANDSHAKE_TIMEOUT, MESSAGE_TIMEOUT, IDLE_TIMEOUT = 10.0, 30.0, 600.0
EXPOSED_WARNING = ("the RPC server is bound to {host}, not a loopback address: ggml's RPC has no "
                   "authentication, anyone who can reach {host}:{port} can read and write its memory. "
                   "Never expose it to an open network.")


class ProtocolViolation(Exception):
    """A malformed or unacceptable message: the connection is closed with this reason."""


def _require(ok: bool, reason: str, *args) -> None:
    if not ok:
        raise ProtocolViolation(reason % args if args else reason)


@dataclass
class ServerStats:
    """Counts since the server started (the fuzz script reports them)."""
    connections: int = 0
    closed_by_peer: int = 0       # the client closed at a message boundary
    closed_violation: int = 0     # a malformed message, closed by the server with a reason
    closed_error: int = 0         # a command failed (a kernel raised...), closed with a reason
    closed_timeout: int = 0       # no HELLO in time, a stalled message, or idle too long
    refused_memory: int = 0       # ALLOC_BUFFER answered 0: out of memory or over the client's quota
    reasons: dict = field(default_factory=dict)
    commands: dict = field(default_factory=dict)  # command name -> how many were served

    def count(self, kind: str, reason: str = "") -> None:
        setattr(self, kind, getattr(self, kind) + 1)
        if reason:
            key = re.sub(r"'[^']*'|0x[0-9a-f]+|\d+", "#", reason)[:70]  # the kind, not the values
            self.reasons[key] = self.reasons.get(key, 0) + 1


# ---------------------------------------------------------------- one connection

class Session:
    """One client connection: its buffers (handle -> Buffer) and last graph per device."""

    def __init__(self, server: "RPCServer", sock: socket.socket, peer: str):
        self.server, self.sock, self.peer = server, sock, peer
        self.buffers: dict[int, Buffer] = {}
        self.graphs: dict[int, CGraph] = {}
        self.next_handle = 1
        self.held = 0                      # bytes of this connection's buffers
        self.idle_since: float | None = None  # waiting for the next message since (monotonic)
        self.evicted = False               # closed by the server to make room (idle_timeout)

    # ---- the loop
    def serve(self) -> None:
        stats = self.server.stats
        try:
            self._hello()
            while True:
                head = self._recv_head()
                if head is None and self.evicted:
                    raise ConnectionError("evicted")
                if head is None:
                    stats.count("closed_by_peer")
                    log.info("RPC connection from %s closed by the client", self.peer)
                    return
                self._dispatch(*head)
        except ProtocolViolation as e:
            stats.count("closed_violation", str(e))
            log.warning("RPC connection from %s closed: %s", self.peer, e)
        except TimeoutError as e:
            stats.count("closed_timeout", str(e))
            log.warning("RPC connection from %s closed: %s", self.peer, e)
        except (EOFError, ConnectionError, OSError) as e:
            if self.evicted:
                stats.count("closed_timeout", "idle, evicted for a new client")
                log.warning("RPC connection from %s closed: idle for %s s while another client waited",
                            self.peer, self.server.idle_timeout)
                return
            stats.count("closed_violation", f"truncated message: {e}")
            log.warning("RPC connection from %s closed: truncated message (%s)", self.peer, e)
        except Exception as e:  # a command failed on the device: that client's graph, not the server
            stats.count("closed_error", f"{type(e).__name__}: {e}")
            log.warning("RPC connection from %s closed: %s: %s", self.peer, type(e).__name__, e)
        finally:
            self._close()

    def _close(self) -> None:
        with self.server.lock:
            for buf in self.buffers.values():
                buf.free()
            self.buffers.clear()
            self.graphs.clear()
        try:
            self.sock.close()
        except OSError:
            pass

    def _hello(self) -> None:
        timeout = self.server.handshake_timeout
        deadline = None if timeout is None else time.monotonic() + timeout
        try:
            cmd = P.recv_exact(self.sock, 1, deadline=deadline)[0]
            _require(cmd == Cmd.HELLO, "expected HELLO first, got command %d", cmd)
            size = P.U64.unpack(P.recv_exact(self.sock, 8, deadline=deadline))[0]
            _require(size == P.HELLO_REQ.size, "HELLO of %d bytes, protocol %d needs %d",
                     size, P.PROTO_MAJOR, P.HELLO_REQ.size)
            P.recv_exact(self.sock, size, deadline=deadline)  # the client's transport caps: TCP only here
        except TimeoutError:
            raise TimeoutError(f"no HELLO within {timeout} s of connecting") from None
        self.sock.settimeout(self.server.message_timeout)
        P.send_response(self.sock, P.HELLO_RSP.pack(P.PROTO_MAJOR, P.PROTO_MINOR, P.PROTO_PATCH, 0,
                                                    bytes(P.CONN_CAPS_SIZE)))

    def _recv_head(self):
        """(cmd, size) of the next request; None when the client closed between messages.
        Waiting for it is idle time (idle_timeout); its bytes and the answer, message time."""
        idle = self.server.idle_timeout
        self.idle_since = time.monotonic()
        self.sock.settimeout(None if self.buffers else idle)  # holders are evicted only to make room
        try:
            first = self.sock.recv(1)
        except TimeoutError:
            raise TimeoutError(f"idle for {idle} s without buffers") from None
        finally:
            self.idle_since = None
        self.sock.settimeout(self.server.message_timeout)
        if not first:
            return None
        cmd = first[0]
        _require(cmd in Cmd._value2member_map_ and cmd not in (Cmd.NONE, Cmd.HELLO),
                 "unknown or misplaced command %d", cmd)
        size = P.U64.unpack(P.recv_exact(self.sock, 8))[0]
        return Cmd(cmd), size

    def _dispatch(self, cmd: Cmd, size: int) -> None:
        commands = self.server.stats.commands
        commands[cmd.name] = commands.get(cmd.name, 0) + 1
        handler = getattr(self, "cmd_" + cmd.name.lower())
        if cmd in (Cmd.SET_TENSOR, Cmd.GRAPH_COMPUTE):
            handler(size)  # variable sizes: the handler reads and checks its own payload
            return
        expected = P.REQUEST_SIZE[cmd]
        _require(size == expected, "%s request of %d bytes, expected %d", cmd.name, size, expected)
        payload = P.recv_exact(self.sock, size) if size else memoryview(b"")
        with self.server.lock:
            response = handler(payload)
        if cmd in P.HAS_RESPONSE:
            P.send_response(self.sock, response)

    # ---- checks
    def device_index(self, index: int) -> int:
        _require(index < len(self.server.backends), "device %d does not exist (%d devices)",
                 index, len(self.server.backends))
        return index

    def buffer(self, handle: int) -> Buffer:
        buf = self.buffers.get(handle)
        _require(buf is not None, "buffer handle %#x is not a buffer of this connection", handle)
        return buf

    def tensor(self, w: WireTensor, need_memory: bool = True) -> Tensor:
        """A Tensor from an rpc_tensor, its type, op, buffer and byte range checked."""
        _require(w.type in Type._value2member_map_, "tensor '%s': unknown type id %d", w.name, w.type)
        tr = type_traits(Type(w.type))
        _require(tr.blck_size > 0 and tr.type_size > 0, "tensor '%s': type %s has no layout", w.name, tr.name)
        _require(w.ne[0] % tr.blck_size == 0, "tensor '%s': ne[0]=%d is not a multiple of %s's block size",
                 w.name, w.ne[0], tr.name)
        _require(w.op in Op._value2member_map_, "tensor '%s': op id %d is not known to this server",
                 w.name, w.op)
        t = Tensor(None, Type(w.type), list(w.ne), list(w.nb))
        t.op = Op(w.op)
        t.op_params = array("i", w.op_params)
        t.flags = w.flags
        t.name = w.name
        if w.buffer:
            buf = self.buffer(w.buffer)
            size = nbytes(t)
            _require(buf.base <= w.data and w.data + size <= buf.base + buf.size,
                     "tensor '%s': %d bytes at %#x lie outside buffer %#x [%#x, %#x)",
                     w.name, size, w.data, w.buffer, buf.base, buf.base + buf.size)
            t.buffer, t.data = buf, w.data
        else:
            _require(w.data == 0, "tensor '%s': data %#x without a buffer", w.name, w.data)
            _require(not need_memory, "tensor '%s' has no buffer", w.name)
        return t

    @staticmethod
    def check_range(t: Tensor, offset: int, size: int, what: str) -> None:
        total = nbytes(t)
        _require(offset <= total and size <= total - offset,
                 "%s: %d bytes at offset %d are outside tensor '%s' (%d bytes)", what, size, offset, t.name, total)

    # ---- commands (payload -> response bytes, or None)
    def cmd_device_count(self, payload):
        return P.U32.pack(len(self.server.backends))

    def _default_buft(self, device: int):
        return self.server.backends[self.device_index(device)].get_default_buffer_type()

    def cmd_get_alignment(self, payload):
        return P.U64.pack(self._default_buft(P.U32.unpack(payload)[0]).get_alignment())

    def cmd_get_max_size(self, payload):
        return P.U64.pack(min(self._default_buft(P.U32.unpack(payload)[0]).get_max_size(), 2**64 - 1))

    def cmd_get_device_memory(self, payload):
        device = self.server.backends[self.device_index(P.U32.unpack(payload)[0])].get_device()
        free, total = device.get_memory()
        return P.DEVICE_MEMORY_RSP.pack(free, total)

    def cmd_alloc_buffer(self, payload):
        device, size = P.ALLOC_BUFFER_REQ.unpack(payload)
        buft = self._default_buft(device)
        free, _ = self.server.backends[device].get_device().get_memory()
        quota = self.server.client_memory
        refused = (f"{free} bytes free" if size > free else
                   f"this connection holds {self.held} bytes, its quota is {quota}"
                   if quota is not None and self.held + size > quota else None)
        if refused is None:
            try:
                buf = buft.alloc_buffer(size)
            except MemoryError as e:
                refused = str(e)
        if refused is not None:  # an answer of 0 is upstream's "allocation failed"
            self.server.stats.count("refused_memory")
            log.warning("RPC %s: ALLOC_BUFFER of %d bytes refused (%s)", self.peer, size, refused)
            return P.ALLOC_BUFFER_RSP.pack(0, 0)
        zero_fresh(buf)
        handle = self.next_handle = self.next_handle + 1
        handle = (handle << 4) | 0xB  # never 0, and not an address a client could guess from the base
        self.buffers[handle] = buf
        self.held += buf.size
        return P.ALLOC_BUFFER_RSP.pack(handle, buf.size)

    def cmd_buffer_get_base(self, payload):
        return P.U64.pack(self.buffer(P.U64.unpack(payload)[0]).get_base())

    def cmd_free_buffer(self, payload):
        handle = P.U64.unpack(payload)[0]
        buf = self.buffer(handle)
        self.graphs.clear()  # stored graphs may point into it
        self.held -= buf.size
        buf.free()
        del self.buffers[handle]

    def cmd_buffer_clear(self, payload):
        handle, value = P.BUFFER_CLEAR_REQ.unpack(payload)
        self.buffer(handle).clear(value)

    def cmd_memset_tensor(self, payload):
        t = self.tensor(WireTensor.unpack(payload))
        offset, size, value = P.MEMSET_TAIL.unpack_from(payload, P.TENSOR_SIZE)
        self.check_range(t, offset, size, "MEMSET_TENSOR")
        _require(t.buffer.memset_tensor is not None, "buffer %s cannot memset", t.buffer.name)
        if size:
            t.buffer.memset_tensor(t, value, offset, size)

    def cmd_init_tensor(self, payload):
        t = self.tensor(WireTensor.unpack(payload), need_memory=False)
        if t.buffer is not None:
            t.buffer.init_tensor(t)

    def cmd_get_tensor(self, payload):
        t = self.tensor(WireTensor.unpack(payload))
        offset, size = P.TENSOR_RANGE.unpack_from(payload, P.TENSOR_SIZE)
        self.check_range(t, offset, size, "GET_TENSOR")
        out = torch.empty(size, dtype=torch.uint8)
        if size:
            t.buffer.get_tensor(t, out, offset, size)
        return out.numpy()

    def cmd_copy_tensor(self, payload):
        src = self.tensor(WireTensor.unpack(payload, 0))
        dst = self.tensor(WireTensor.unpack(payload, P.TENSOR_SIZE))
        _require(dst.data + nbytes(src) <= dst.buffer.base + dst.buffer.size,
                 "COPY_TENSOR: %d bytes of '%s' do not fit buffer of '%s'", nbytes(src), src.name, dst.name)
        ok = are_same_layout(src, dst) and bool(dst.buffer.cpy_tensor(src, dst))
        return P.U8.pack(ok)

    def cmd_get_alloc_size(self, payload):
        t, backend = self._op_tensor(payload)
        buft = t.buffer.buft if t.buffer is not None else backend.get_default_buffer_type()
        return P.U64.pack(buft.get_alloc_size(t))

    def cmd_get_device_supports_op(self, payload):
        t, backend = self._op_tensor(payload)
        return P.U8.pack(bool(backend.supports_op(t)))

    def _op_tensor(self, payload):
        """GET_ALLOC_SIZE / GET_DEVICE_SUPPORTS_OP: | device u32 | tensor | srcs[MAX_SRC] |"""
        device = self.device_index(P.U32.unpack_from(payload)[0])
        t = self.tensor(WireTensor.unpack(payload, 4), need_memory=False)
        for i in range(MAX_SRC):
            w = WireTensor.unpack(payload, 4 + (1 + i) * P.TENSOR_SIZE)
            if w.id:
                t.src[i] = self.tensor(w, need_memory=False)
        return t, self.server.backends[device]

    def cmd_set_tensor_hash(self, payload):
        t = self.tensor(WireTensor.unpack(payload))
        offset, digest = P.SET_HASH_TAIL.unpack_from(payload, P.TENSOR_SIZE)
        data = self.server.cached(digest)
        if data is None:
            return P.U8.pack(0)
        self.check_range(t, offset, len(data), "SET_TENSOR_HASH")
        t.buffer.set_tensor(t, torch.frombuffer(data, dtype=torch.uint8) if len(data) else torch.empty(0, dtype=torch.uint8),
                            offset, len(data))
        return P.U8.pack(1)

    def cmd_set_tensor(self, size: int):
        """| rpc_tensor | cache flag u8 | offset u64 | data |: the header is checked before the
        data is read, and the data is read only as far as the tensor's range allows."""
        head = P.TENSOR_SIZE + P.SET_TENSOR_HEAD.size
        _require(size >= head, "SET_TENSOR of %d bytes is shorter than its %d-byte header", size, head)
        header = P.recv_exact(self.sock, head)
        with self.server.lock:
            t = self.tensor(WireTensor.unpack(header))
            flag, offset = P.SET_TENSOR_HEAD.unpack_from(header, P.TENSOR_SIZE)
            self.check_range(t, offset, size - head, "SET_TENSOR")
        data = bytearray(size - head)
        P.recv_exact(self.sock, len(data), memoryview(data))
        with self.server.lock:
            _require(not t.buffer.freed, "SET_TENSOR: buffer freed meanwhile")
            if flag and self.server.cache_dir is not None:
                self.server.store(data)
            if data:
                t.buffer.set_tensor(t, torch.frombuffer(data, dtype=torch.uint8), offset, len(data))

    def cmd_graph_compute(self, size: int):
        _require(size >= P.GRAPH_HEAD.size + 4, "GRAPH_COMPUTE of %d bytes is too short", size)
        _require(size <= P.graph_message_size(MAX_GRAPH_NODES, 4 * MAX_GRAPH_NODES),
                 "GRAPH_COMPUTE of %d bytes is larger than any graph this server takes", size)
        payload = P.recv_growing(self.sock, size)
        device, n_nodes = P.GRAPH_HEAD.unpack_from(payload)
        self.device_index(device)
        _require(n_nodes <= MAX_GRAPH_NODES, "graph of %d nodes (at most %d)", n_nodes, MAX_GRAPH_NODES)
        _require(size >= P.graph_message_size(n_nodes, 0), "graph message of %d bytes cannot hold %d node ids",
                 size, n_nodes)
        node_ids = struct.unpack_from(f"<{n_nodes}Q", payload, P.GRAPH_HEAD.size)
        n_tensors = P.U32.unpack_from(payload, P.GRAPH_HEAD.size + 8 * n_nodes)[0]
        _require(size == P.graph_message_size(n_nodes, n_tensors),
                 "graph message of %d bytes, %d nodes and %d tensors need %d", size, n_nodes, n_tensors,
                 P.graph_message_size(n_nodes, n_tensors))
        base = P.graph_message_size(n_nodes, 0)
        with self.server.lock:
            graph = self._build_graph(device, node_ids, [WireTensor.unpack(payload, base + i * P.TENSOR_SIZE)
                                                         for i in range(n_tensors)])
            self._compute(device, graph)
            self.graphs[device] = graph

    def cmd_graph_recompute(self, payload):
        device = self.device_index(P.U32.unpack(payload)[0])
        graph = self.graphs.get(device)
        _require(graph is not None, "GRAPH_RECOMPUTE without a stored graph on device %d", device)
        self._compute(device, graph)

    def _build_graph(self, device: int, node_ids, wires: list[WireTensor]) -> CGraph:
        by_id: dict[int, Tensor] = {}
        for w in wires:
            _require(w.id != 0 and w.id not in by_id, "graph tensor id %#x is null or repeated", w.id)
            by_id[w.id] = self.tensor(w, need_memory=False)
        for w in wires:  # links by id, no recursion: a deep graph is a long chain
            t = by_id[w.id]
            for i, sid in enumerate(w.src):
                if sid:
                    _require(sid in by_id, "tensor '%s': source %d (id %#x) is not in the graph", w.name, i, sid)
                    t.src[i] = by_id[sid]
            if w.view_src:
                _require(w.view_src in by_id, "tensor '%s': view source %#x is not in the graph", w.name, w.view_src)
                t.view_src, t.view_offs = by_id[w.view_src], w.view_offs
                src = t.view_src
                _require(t.buffer is None or src.buffer is None
                         or (t.buffer is src.buffer and t.data == src.data + t.view_offs),
                         "view '%s' is not at its source '%s' + %d", w.name, src.name, t.view_offs)
        backend = self.server.backends[device]
        graph = CGraph(max(len(node_ids), 1))
        for nid in node_ids:
            node = by_id.get(nid)
            _require(node is not None, "graph node id %#x is not among the graph's tensors", nid)
            _require(node.buffer is not None, "graph node '%s' (%s) has no memory", node.name, node.op.name)
            bad_shape = check_node(node)
            _require(bad_shape is None, "graph node '%s' (%s): %s", node.name, node.op.name, bad_shape)
            _require(backend.supports_op(node), "op %s of node '%s' is not supported by device %s",
                     node.op.name, node.name, backend.get_device().name)
            graph.nodes.append(node)
            graph.visited.add(id(node))
        return graph

    def _compute(self, device: int, graph: CGraph) -> None:
        backend = self.server.backends[device]
        status = backend.graph_compute(graph)
        backend.synchronize()
        if status != Status.SUCCESS:
            raise RuntimeError(f"graph compute on {backend.name} returned {Status(status).name}")


# ---------------------------------------------------------------- the server

def _devices(devices) -> list:
    from ...backend.registry import backend_dev_by_name, backend_dev_count, backend_dev_get
    from ...backend.impl import DeviceType
    if not devices:  # upstream's default: the first GPU-like device, else the CPU
        all_devs = [backend_dev_get(i) for i in range(backend_dev_count())]
        gpus = [d for d in all_devs if d.get_type() in (DeviceType.GPU, DeviceType.IGPU)
                and not d.get_name().startswith("RPC")]
        cpus = [d for d in all_devs if d.get_type() == DeviceType.CPU]
        return gpus[:1] or cpus[:1]
    out = []
    for d in devices:
        dev = backend_dev_by_name(d) if isinstance(d, str) else d
        if dev is None:
            raise ValueError(f"RPC server: no device named {d!r}")
        out.append(dev)
    return out


def _is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


class RPCServer:
    """Serves `devices` (names or Device objects; default: the first GPU, else the CPU) at
    `endpoint` ("host:port"; port 0 picks a free one). `cache_dir` keeps weights sent with the
    cache flag, named by their FNV-1a hash, for SET_TENSOR_HASH. start() serves in a background
    thread, serve_forever() in this one. Timeouts are seconds (None or 0: none); `client_memory`
    bytes a connection may hold (-1: the largest served device's total memory, None: no quota)."""

    def __init__(self, endpoint: str = f"127.0.0.1:{P.DEFAULT_PORT}", devices=None, cache_dir=None,
                 n_threads: int | None = None, max_connections: int = 64,
                 handshake_timeout: float | None = HANDSHAKE_TIMEOUT, message_timeout: float | None = MESSAGE_TIMEOUT,
                 idle_timeout: float | None = IDLE_TIMEOUT, client_memory: int | None = -1):
        from ...backend.device import backend_dev_init, backend_dev_backend_reg
        host, port = P.parse_endpoint(endpoint, listening=True)
        self.devices = _devices(devices)
        self.backends = [backend_dev_init(d) for d in self.devices]
        if n_threads:
            for d, b in zip(self.devices, self.backends):
                reg = backend_dev_backend_reg(d)
                set_n_threads = reg.get_proc_address("ggml_backend_set_n_threads") if reg is not None else None
                if set_n_threads is not None:
                    set_n_threads(b, n_threads)
        self.cache_dir = Path(cache_dir) if cache_dir else None
        if self.cache_dir is not None:
            self.cache_dir.mkdir(parents=True, exist_ok=True)
        self.max_connections = max_connections  # more at once are refused (each is a thread)
        self.handshake_timeout, self.message_timeout, self.idle_timeout = (
            t if t else None for t in (handshake_timeout, message_timeout, idle_timeout))
        if client_memory == -1:
            client_memory = max(d.get_memory()[1] for d in self.devices)
        self.client_memory = client_memory
        self.lock = threading.RLock()
        self.stats = ServerStats()
        self.sessions: set[Session] = set()
        if not _is_loopback(host):
            warnings.warn(EXPOSED_WARNING.format(host=host, port=port), stacklevel=2)
            log.warning(EXPOSED_WARNING.format(host=host, port=port))
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self.listener = socket.create_server((host, port), family=family, reuse_port=False)
        self.host, self.port = host, self.listener.getsockname()[1]
        self._thread: threading.Thread | None = None
        self._closing = False

    @property
    def endpoint(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"

    def describe(self) -> str:
        lines = [f"torchggml RPC server, protocol {P.PROTO_MAJOR}.{P.PROTO_MINOR}.{P.PROTO_PATCH}",
                 f"  endpoint    : {self.endpoint}",
                 f"  local cache : {self.cache_dir or 'n/a'}",
                 f"  timeouts    : handshake {self.handshake_timeout} s, message {self.message_timeout} s, "
                 f"idle {self.idle_timeout} s",
                 f"  per client  : {'no quota' if self.client_memory is None else f'{self.client_memory >> 20} MiB'}",
                 "  devices:"]
        for i, d in enumerate(self.devices):
            free, total = d.get_memory()
            lines.append(f"    {i}: {d.get_name()} {d.get_description()} ({total >> 20} MiB, {free >> 20} MiB free)")
        return "\n".join(lines)

    # ---- the weight cache (cache_dir/<16 hex digits of the FNV-1a hash>)
    def _cache_file(self, digest: int) -> Path:
        return self.cache_dir / f"{digest:016x}"

    def cached(self, digest: int) -> bytearray | None:
        if self.cache_dir is None:
            return None
        path = self._cache_file(digest)
        return bytearray(path.read_bytes()) if path.is_file() else None

    def store(self, data) -> None:
        path = self._cache_file(P.fnv_hash(data))
        tmp = path.with_suffix(f".tmp{os.getpid()}.{threading.get_ident()}")
        tmp.write_bytes(data)
        tmp.replace(path)  # readers never see half a file
        log.info("RPC cache: saved %d bytes to %s", len(data), path)

    # ---- serving
    def _serve_one(self, session: Session) -> None:
        try:
            session.serve()
        finally:
            self.sessions.discard(session)

    def serve_forever(self) -> None:
        while not self._closing:
            try:
                sock, addr = self.listener.accept()
            except OSError:
                if self._closing:
                    return
                raise
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            peer = f"{addr[0]}:{addr[1]}"
            self.stats.count("connections")
            if len(self.sessions) >= self.max_connections:
                self._evict_idle()
            if len(self.sessions) >= self.max_connections:
                self.stats.count("closed_violation", "too many connections")
                log.warning("RPC connection from %s refused: %d connections already", peer, len(self.sessions))
                sock.close()
                continue
            log.info("RPC connection from %s", peer)
            session = Session(self, sock, peer)
            self.sessions.add(session)
            threading.Thread(target=self._serve_one, args=(session,), daemon=True,
                             name=f"rpc-session-{peer}").start()

    def _evict_idle(self) -> None:
        """Make room for a new client: close the connection idle longest, if idle_timeout or more."""
        if self.idle_timeout is None:
            return
        now = time.monotonic()
        idle = [(now - s.idle_since, s) for s in list(self.sessions) if s.idle_since is not None]
        idle = [(d, s) for d, s in idle if d >= self.idle_timeout]
        if not idle:
            return
        _, session = max(idle, key=lambda x: x[0])
        session.evicted = True
        self.sessions.discard(session)
        try:
            session.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

    def start(self) -> "RPCServer":
        self._thread = threading.Thread(target=self.serve_forever, daemon=True, name=f"rpc-server-{self.port}")
        self._thread.start()
        return self

    def close(self) -> None:
        """Stop accepting and close every connection (their buffers are freed)."""
        self._closing = True
        try:
            self.listener.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.listener.close()
        for s in list(self.sessions):
            try:
                s.sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        if self._thread is not None:
            self._thread.join(timeout=5)

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.close()


def zero_fresh(buf: Buffer) -> None:
    """A new buffer's bytes set to 0 unless its memory is known to be (fresh anonymous pages): a
    client must never read what the server's memory held before."""
    if getattr(buf, "zero_filled", False):
        return
    storage = getattr(buf, "storage", None)
    if storage is not None and storage.device.type == "cpu":  # the heap's few MiB at most (larger: mapped)
        byte_view(buf, 0, buf.size).numpy().fill(0)  # one thread's memset: torch's fill_ wakes its pool
    else:
        buf.clear(0)


def backend_rpc_start_server(endpoint: str, cache_dir: str | None = None, n_threads: int | None = None,
                             devices=None) -> None:
    """ggml_backend_rpc_start_server: serve `devices` at `endpoint` until interrupted (blocks)."""
    server = RPCServer(endpoint, devices, cache_dir, n_threads)
    print(server.describe(), flush=True)
    try:
        server.serve_forever()
    finally:
        server.close()
