"""ggml's RPC wire protocol (ggml-rpc.cpp), as bytes: commands, message layouts, the serialized
tensor (rpc_tensor) and graph, framing over a socket, and the FNV-1a hash of SET_TENSOR_HASH.

Protocol 7.0.x (llama-cpp-python 0.3.36's bundled ggml is 7.0.0; upstream HEAD 7.0.1 adds the
optional GET_DEVICE_SUPPORTS_OP, sent only to servers answering HELLO with patch >= 1).

Framing, little-endian, no padding:
    request : cmd (u8) | size (u64) | size bytes
    response: size (u64) | size bytes          (only the commands in HAS_RESPONSE answer)
A HELLO (24 bytes of transport capabilities, zero for TCP) must open every connection; the
server answers major, minor, patch, padding (u8 each) and its 24 capability bytes.
"""
from __future__ import annotations

import socket
import struct
import time
from enum import IntEnum

PROTO_MAJOR, PROTO_MINOR, PROTO_PATCH = 7, 0, 1
CONN_CAPS_SIZE = 24
HASH_THRESHOLD = 10 * 1024 * 1024  # SET_TENSOR_HASH first for weights larger than this
DEFAULT_PORT = 50052


class Cmd(IntEnum):
    ALLOC_BUFFER = 0
    GET_ALIGNMENT = 1
    GET_MAX_SIZE = 2
    BUFFER_GET_BASE = 3
    FREE_BUFFER = 4
    BUFFER_CLEAR = 5
    SET_TENSOR = 6
    SET_TENSOR_HASH = 7
    GET_TENSOR = 8
    COPY_TENSOR = 9
    GRAPH_COMPUTE = 10
    GET_DEVICE_MEMORY = 11
    INIT_TENSOR = 12
    GET_ALLOC_SIZE = 13
    HELLO = 14
    DEVICE_COUNT = 15
    GRAPH_RECOMPUTE = 16
    MEMSET_TENSOR = 17
    NONE = 18                     # client-side marker, never sent
    GET_DEVICE_SUPPORTS_OP = 19   # 7.0.1


# commands the server answers; the others are fire-and-forget (ordered by the connection)
HAS_RESPONSE = frozenset({Cmd.HELLO, Cmd.DEVICE_COUNT, Cmd.ALLOC_BUFFER, Cmd.GET_ALLOC_SIZE,
                          Cmd.GET_ALIGNMENT, Cmd.GET_MAX_SIZE, Cmd.BUFFER_GET_BASE,
                          Cmd.SET_TENSOR_HASH, Cmd.GET_TENSOR, Cmd.COPY_TENSOR,
                          Cmd.GET_DEVICE_MEMORY, Cmd.GET_DEVICE_SUPPORTS_OP})


class RPCError(RuntimeError):
    """A protocol-level failure (version mismatch, a malformed answer)."""


class RPCServerGoneError(RPCError, ConnectionError):
    """The RPC server closed the connection or could not be reached."""


# ---------------------------------------------------------------- rpc_tensor

MAX_DIMS, MAX_SRC, MAX_OP_PARAMS, MAX_NAME = 4, 10, 64, 64
# id, type, buffer, ne[4], nb[4], op, op_params[16], flags, src[10], view_src, view_offs, data, name, use_count
TENSOR = struct.Struct(f"<QIQ{MAX_DIMS}I{MAX_DIMS}II{MAX_OP_PARAMS // 4}ii{MAX_SRC}QQQQ{MAX_NAME}si")
TENSOR_SIZE = TENSOR.size  # 296
assert TENSOR_SIZE == 296 and TENSOR_SIZE % 8 == 0
NULL_TENSOR = bytes(TENSOR_SIZE)


class WireTensor:
    """An rpc_tensor unpacked: what the wire says, before any check."""

    __slots__ = ("id", "type", "buffer", "ne", "nb", "op", "op_params", "flags", "src",
                 "view_src", "view_offs", "data", "name", "use_count")

    @classmethod
    def unpack(cls, raw, offset: int = 0) -> "WireTensor":
        v = TENSOR.unpack_from(raw, offset)
        w = cls()
        w.id, w.type, w.buffer = v[0], v[1], v[2]
        w.ne, w.nb = list(v[3:7]), list(v[7:11])
        w.op, w.op_params, w.flags = v[11], v[12:28], v[28]
        w.src = v[29:39]
        w.view_src, w.view_offs, w.data = v[39], v[40], v[41]
        w.name = v[42].split(b"\0", 1)[0].decode("utf-8", "replace")
        w.use_count = v[43]
        return w


def pack_tensor(tid: int, type_: int, buffer: int, ne, nb, op: int, op_params, flags: int,
                src_ids, view_src: int, view_offs: int, data: int, name: str, use_count: int = 0) -> bytes:
    return TENSOR.pack(tid, type_, buffer, *ne, *nb, op, *op_params, flags, *src_ids, view_src,
                       view_offs, data, name.encode("utf-8")[:MAX_NAME - 1], use_count)


# ---------------------------------------------------------------- messages (fixed layouts)

HELLO_REQ = struct.Struct(f"<{CONN_CAPS_SIZE}s")
HELLO_RSP = struct.Struct(f"<BBBB{CONN_CAPS_SIZE}s")
U8, U32, U64 = struct.Struct("<B"), struct.Struct("<I"), struct.Struct("<Q")
ALLOC_BUFFER_REQ = struct.Struct("<IQ")           # device, size
ALLOC_BUFFER_RSP = struct.Struct("<QQ")           # remote handle, remote size
BUFFER_CLEAR_REQ = struct.Struct("<QB")           # handle, value
DEVICE_MEMORY_RSP = struct.Struct("<QQ")          # free, total
TENSOR_RANGE = struct.Struct("<QQ")               # offset, size (after an rpc_tensor)
MEMSET_TAIL = struct.Struct("<QQB")               # offset, size, value
SET_TENSOR_HEAD = struct.Struct("<BQ")            # cache flag, offset (after an rpc_tensor)
SET_HASH_TAIL = struct.Struct("<QQ")              # offset, hash
GRAPH_HEAD = struct.Struct("<II")                 # device, n_nodes

# request sizes of the fixed-layout commands (SET_TENSOR and GRAPH_COMPUTE vary)
REQUEST_SIZE = {
    Cmd.HELLO: HELLO_REQ.size,
    Cmd.DEVICE_COUNT: 0,
    Cmd.ALLOC_BUFFER: ALLOC_BUFFER_REQ.size,
    Cmd.GET_ALIGNMENT: U32.size,
    Cmd.GET_MAX_SIZE: U32.size,
    Cmd.BUFFER_GET_BASE: U64.size,
    Cmd.FREE_BUFFER: U64.size,
    Cmd.BUFFER_CLEAR: BUFFER_CLEAR_REQ.size,
    Cmd.MEMSET_TENSOR: TENSOR_SIZE + MEMSET_TAIL.size,
    Cmd.SET_TENSOR_HASH: TENSOR_SIZE + SET_HASH_TAIL.size,
    Cmd.INIT_TENSOR: TENSOR_SIZE,
    Cmd.GET_TENSOR: TENSOR_SIZE + TENSOR_RANGE.size,
    Cmd.COPY_TENSOR: 2 * TENSOR_SIZE,
    Cmd.GRAPH_RECOMPUTE: U32.size,
    Cmd.GET_DEVICE_MEMORY: U32.size,
    Cmd.GET_ALLOC_SIZE: U32.size + (1 + MAX_SRC) * TENSOR_SIZE,
    Cmd.GET_DEVICE_SUPPORTS_OP: U32.size + (1 + MAX_SRC) * TENSOR_SIZE,
}


def graph_message_size(n_nodes: int, n_tensors: int) -> int:
    """| device u32 | n_nodes u32 | node ids u64[n_nodes] | n_tensors u32 | rpc_tensor[n_tensors] |"""
    return GRAPH_HEAD.size + 8 * n_nodes + U32.size + TENSOR_SIZE * n_tensors


# ---------------------------------------------------------------- framing

def recv_exact(sock: socket.socket, size: int, into: memoryview | None = None,
               deadline: float | None = None) -> memoryview:
    """Exactly `size` bytes; EOFError when the peer closes first. With `deadline` (monotonic
    seconds) all of them must arrive before it (TimeoutError); else the socket's timeout bounds
    each wait for more bytes."""
    buf = into if into is not None else memoryview(bytearray(size))
    got = 0
    while got < size:
        if deadline is not None:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"{got} of {size} bytes before the deadline")
            sock.settimeout(left)
        n = sock.recv_into(buf[got:size], size - got)
        if n == 0:
            raise EOFError(f"connection closed after {got} of {size} bytes")
        got += n
    return buf


def recv_growing(sock: socket.socket, size: int, chunk: int = 16 << 20) -> memoryview:
    """Exactly `size` bytes, the buffer growing as they arrive: a peer announcing a large
    message costs memory only for what it really sends."""
    buf = bytearray()
    while len(buf) < size:
        n = min(chunk, size - len(buf))
        start = len(buf)
        buf.extend(bytes(n))
        recv_exact(sock, n, memoryview(buf)[start:])
    return memoryview(buf)


SEND_CHUNK = 16 << 20  # a socket timeout bounds each chunk's write (sendall's covers the whole call)


def _send(sock: socket.socket, header: bytes, parts) -> None:
    """header then the parts; small messages go out in one write (one TCP segment)."""
    if sum(memoryview(p).nbytes for p in parts) <= 4096:
        sock.sendall(header + b"".join(bytes(p) for p in parts))
        return
    sock.sendall(header)
    for p in parts:
        view = memoryview(p).cast("B")
        for start in range(0, view.nbytes, SEND_CHUNK):
            sock.sendall(view[start:start + SEND_CHUNK])


def send_command(sock: socket.socket, cmd: int, *parts) -> None:
    """cmd (u8) | size (u64) | the parts (bytes-like)."""
    _send(sock, U8.pack(cmd) + U64.pack(sum(memoryview(p).nbytes for p in parts)), parts)


def send_response(sock: socket.socket, *parts) -> None:
    """size (u64) | the parts."""
    _send(sock, U64.pack(sum(memoryview(p).nbytes for p in parts)), parts)


# ---------------------------------------------------------------- FNV-1a (SET_TENSOR_HASH, cache files)

FNV_OFFSET, FNV_PRIME = 0xcbf29ce484222325, 0x100000001b3


def _fnv_python(data) -> int:
    h = FNV_OFFSET
    for b in bytes(data):
        h = ((h ^ b) * FNV_PRIME) & 0xFFFFFFFFFFFFFFFF
    return h


try:
    import numba
    import numpy as np

    @numba.njit(cache=True, nogil=True)
    def _fnv_numba(data):  # uint64 arithmetic wraps, as in C
        h = np.uint64(FNV_OFFSET)
        p = np.uint64(FNV_PRIME)
        for i in range(data.shape[0]):
            h = (h ^ np.uint64(data[i])) * p
        return h

    def fnv_hash(data) -> int:
        """FNV-1a 64 of the bytes (upstream's hash of tensor data); data: bytes-like or uint8 array."""
        arr = np.frombuffer(memoryview(data).cast("B"), dtype=np.uint8) if not isinstance(data, np.ndarray) else data
        return int(_fnv_numba(arr)) if arr.size > 256 else _fnv_python(arr.tobytes())
except ImportError:  # numba is optional for the protocol: the pure loop is right, only slow
    def fnv_hash(data) -> int:
        return _fnv_python(data)


def parse_endpoint(endpoint: str, listening: bool = False) -> tuple[str, int]:
    """"host:port" (IPv6 as "[addr]:port") -> (host, port); ValueError naming the endpoint.
    A server (`listening`) may ask for port 0: any free port."""
    host, sep, port = str(endpoint).rpartition(":")
    if not sep or not host or not port.isdigit() or not (0 if listening else 1) <= int(port) < 65536:
        raise ValueError(f"RPC endpoint {endpoint!r} is not 'host:port'")
    return host.strip("[]"), int(port)
