"""Fuzz a torchggml RPC server on loopback with random, mutated and truncated messages, or
(--graphs) with well-formed graphs whose shapes agree.

    PYTHONPATH=. python scripts/fuzz_rpc.py --messages 2000 --seconds 120
    PYTHONPATH=. python scripts/fuzz_rpc.py --endpoint 127.0.0.1:50052   # a server already running
    PYTHONPATH=. python scripts/fuzz_rpc.py --graphs 3000 --seconds 1200  # the structure-aware mode

Without --endpoint the server runs in a child process (`python -m torchggml rpc-server`), so a
crash is seen as that process dying. Each round opens a connection, sends one scenario, closes
its side and waits (at most --timeout seconds) for the server to close the connection: that is
"closed cleanly"; no close in time is a hang. After every round a fresh client must still
complete HELLO and DEVICE_COUNT (otherwise: a crash). Bounded by --messages and --seconds.

Scenarios: bytes without HELLO; a bad HELLO; random command bytes and sizes; fixed-layout
requests with random contents; messages truncated anywhere; rpc_tensors with a real buffer
handle and random types, ops, shapes, offsets; graphs with random node counts, ids and links;
valid SET_TENSOR/GET_TENSOR/GRAPH_COMPUTE messages with random bit flips.

The structure-aware mode (--graphs N) builds graphs with torchggml's own op builders, so every
node's shape agrees with its sources as ggml's rules want (what random bytes never reach):
decode attention MUL_MAT(K, Q) -> SOFT_MAX -> MUL_MAT(CONT(V^T), .) with V^T a permute, a
transpose or a view with free strides, and CONTs that transpose or reshape (issue 43's 4-node
pattern and its relatives), and chains of TRANSPOSE / PERMUTE / VIEW (free strides and offsets)
/ CONT / CPY / GET_ROWS (row ids sometimes out of range) / MUL_MAT / SOFT_MAX / SCALE / ADD.
Each graph gets a buffer of exactly its size, filled first with a canary pattern, then its
inputs; it is computed, and every node read back. The same messages go to a reference server
in this process whose CPU computes with the torch kernels only (bounds-checked): a reply that
differs from the reference's is a leak (bytes the graph did not legitimately write), a server
that dies a crash.
"""
from __future__ import annotations

import argparse
import collections
import os
import random
import re
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field

from torchggml.devices.rpc import protocol as P
from torchggml.devices.rpc.protocol import Cmd

CAPS = bytes(P.CONN_CAPS_SIZE)


@dataclass
class Tally:
    rounds: int = 0
    messages: int = 0
    closed_cleanly: int = 0
    hangs: int = 0
    crashes: int = 0

    def table(self) -> str:
        rows = [("rounds (connections)", self.rounds), ("messages sent", self.messages),
                ("connections closed cleanly", self.closed_cleanly), ("hangs", self.hangs),
                ("crashes", self.crashes)]
        return "\n".join(["| measure | count |", "| --- | ---: |"] + [f"| {k} | {v} |" for k, v in rows])


def _hello(sock) -> None:
    P.send_command(sock, Cmd.HELLO, CAPS)
    size = P.U64.unpack(P.recv_exact(sock, 8))[0]
    P.recv_exact(sock, size)


def _call(sock, cmd, payload: bytes, rsp: int):
    P.send_command(sock, cmd, payload)
    size = P.U64.unpack(P.recv_exact(sock, 8))[0]
    assert size == rsp, (cmd, size)
    return P.recv_exact(sock, size)


def alive(endpoint: str, timeout: float) -> bool:
    """A fresh client completes HELLO and DEVICE_COUNT."""
    host, port = P.parse_endpoint(endpoint)
    try:
        with socket.create_connection((host, port), timeout=timeout) as s:
            _hello(s)
            return P.U32.unpack(_call(s, Cmd.DEVICE_COUNT, b"", 4))[0] >= 1
    except (OSError, EOFError, AssertionError):
        return False


class Scenarios:
    """Each scenario writes messages to a connected socket and returns how many it sent."""

    def __init__(self, rng: random.Random):
        self.rng = rng

    def rand_bytes(self, n_max: int = 600) -> bytes:
        return self.rng.randbytes(self.rng.randint(0, n_max))

    def truncate(self, msg: bytes) -> bytes:
        return msg[:self.rng.randint(0, max(len(msg) - 1, 0))]

    def flip(self, msg: bytes, n: int = 3) -> bytes:
        b = bytearray(msg)
        for _ in range(n):
            if b:
                b[self.rng.randrange(len(b))] ^= 1 << self.rng.randrange(8)
        return bytes(b)

    @staticmethod
    def framed(cmd: int, payload: bytes, size: int | None = None) -> bytes:
        return P.U8.pack(cmd) + P.U64.pack(len(payload) if size is None else size) + payload

    def tensor(self, handle: int, base: int, size: int, valid: bool = True, tid: int | None = None, src=()) -> bytes:
        r = self.rng
        ne = [r.choice([1, 2, 4, 32, 256, 0, 2**31]) for _ in range(4)] if not valid else [r.choice([1, 4, 32]), r.choice([1, 2, 3]), 1, 1]
        type_ = r.choice([0, 1, 2, 8, 12, 30, 39, 99, 2**31]) if not valid else r.choice([0, 1])
        es = 4 if type_ == 0 else 2
        nb = [es, es * ne[0], es * ne[0] * ne[1], es * ne[0] * ne[1] * ne[2]] if valid else [r.getrandbits(32) for _ in range(4)]
        data = base + (r.randrange(0, max(size // 2, 1)) & ~31 if valid else r.choice([0, 1, size, size * 2, 2**63]) - (0 if valid else 0))
        op = r.choice([0, 1, 2, 29, 99, 255]) if not valid else r.choice([0, 2])
        srcs = list(src) + [0] * (P.MAX_SRC - len(src))
        return P.pack_tensor(tid if tid is not None else r.getrandbits(64) | 1, type_,
                             handle if r.random() < 0.9 else r.getrandbits(64), ne, nb, op,
                             [r.getrandbits(31) for _ in range(16)], r.getrandbits(5), srcs,
                             0, 0, data if handle else 0, "fuzz", 0)

    # ---- scenarios
    def no_hello(self, sock) -> int:
        sock.sendall(self.rand_bytes())
        return 1

    def bad_hello(self, sock) -> int:
        sock.sendall(self.framed(Cmd.HELLO, self.rand_bytes(40)))
        return 1

    def random_commands(self, sock) -> int:
        _hello(sock)
        n = self.rng.randint(1, 4)
        for _ in range(n):
            cmd = self.rng.choice(list(range(0, 24)) + [255])
            payload = self.rand_bytes(1200)
            size = len(payload) if self.rng.random() < 0.7 else self.rng.choice([0, 8, 2**40, 2**64 - 1])
            sock.sendall(self.framed(cmd, payload, size))
        return n + 1

    def fixed_layouts(self, sock) -> int:
        _hello(sock)
        cmd = self.rng.choice([c for c in P.REQUEST_SIZE if c != Cmd.HELLO])
        payload = self.rng.randbytes(P.REQUEST_SIZE[cmd])
        msg = self.framed(cmd, payload)
        sock.sendall(self.truncate(msg) if self.rng.random() < 0.3 else msg)
        return 2

    def with_buffer(self, sock) -> int:
        """A real buffer, then tensors in and around it (sets, gets, memsets, copies, graphs)."""
        _hello(sock)
        r = self.rng
        size = r.choice([64, 4096])
        handle, rsize = P.ALLOC_BUFFER_RSP.unpack(_call(sock, Cmd.ALLOC_BUFFER, P.ALLOC_BUFFER_REQ.pack(0, size), 16))
        base = P.U64.unpack(_call(sock, Cmd.BUFFER_GET_BASE, P.U64.pack(handle), 8))[0]
        sent = 3
        for _ in range(r.randint(1, 5)):
            valid = r.random() < 0.5
            t = self.tensor(handle, base, size, valid)
            kind = r.choice(["set", "get", "memset", "copy", "graph", "hash", "init", "alloc_size", "free", "clear"])
            if kind == "set":
                data = self.rand_bytes(r.choice([8, 64, 5000]))
                msg = self.framed(Cmd.SET_TENSOR, t + P.SET_TENSOR_HEAD.pack(0, r.choice([0, 4, 2**63])) + data)
            elif kind == "get":
                msg = self.framed(Cmd.GET_TENSOR, t + P.TENSOR_RANGE.pack(r.choice([0, 8]), r.choice([0, 4, 64, 2**62])))
            elif kind == "memset":
                msg = self.framed(Cmd.MEMSET_TENSOR, t + P.MEMSET_TAIL.pack(r.choice([0, 8]), r.choice([4, 2**64 - 1]), 7))
            elif kind == "copy":
                msg = self.framed(Cmd.COPY_TENSOR, t + self.tensor(handle, base, size, valid))
            elif kind == "hash":
                msg = self.framed(Cmd.SET_TENSOR_HASH, t + P.SET_HASH_TAIL.pack(0, r.getrandbits(64)))
            elif kind == "init":
                msg = self.framed(Cmd.INIT_TENSOR, t)
            elif kind == "alloc_size":
                msg = self.framed(Cmd.GET_ALLOC_SIZE, P.U32.pack(r.choice([0, 1, 7])) + t + P.NULL_TENSOR * P.MAX_SRC)
            elif kind == "free":
                msg = self.framed(Cmd.FREE_BUFFER, P.U64.pack(handle if valid else r.getrandbits(64)))
            elif kind == "clear":
                msg = self.framed(Cmd.BUFFER_CLEAR, P.BUFFER_CLEAR_REQ.pack(handle if valid else r.getrandbits(64), 3))
            else:
                msg = self.framed(Cmd.GRAPH_COMPUTE, self.graph(handle, base, size, valid))
            if r.random() < 0.3:
                msg = self.flip(msg)
            if r.random() < 0.2:
                msg = self.truncate(msg)
            sock.sendall(msg)
            sent += 1
        return sent

    def valid_graph(self, sock) -> int:
        """A real graph (c = op(a, b) over F32 rows in a real buffer), computed, then the same
        message with bits flipped: shapes, types, ops and links that disagree reach the kernels."""
        _hello(sock)
        r = self.rng
        handle, _ = P.ALLOC_BUFFER_RSP.unpack(_call(sock, Cmd.ALLOC_BUFFER, P.ALLOC_BUFFER_REQ.pack(0, 4096), 16))
        base = P.U64.unpack(_call(sock, Cmd.BUFFER_GET_BASE, P.U64.pack(handle), 8))[0]
        n = 16
        nb = [4, 4 * n, 4 * n, 4 * n]
        op = r.choice([2, 6, 7, 29, 21, 40, 45, 57])  # ADD, MUL, DIV, MUL_MAT, ..., any id the server knows or not
        a = P.pack_tensor(1, 0, handle, [n, 1, 1, 1], nb, 0, [0] * 16, 0, [0] * P.MAX_SRC, 0, 0, base, "a")
        b = P.pack_tensor(2, 0, handle, [n, 1, 1, 1], nb, 0, [0] * 16, 0, [0] * P.MAX_SRC, 0, 0, base + 64, "b")
        c = P.pack_tensor(3, 0, handle, [n, 1, 1, 1], nb, op, [0] * 16, 16, [1, 2] + [0] * (P.MAX_SRC - 2),
                          0, 0, base + 128, "c")
        msg = P.GRAPH_HEAD.pack(0, 1) + P.U64.pack(3) + P.U32.pack(3) + a + b + c
        sock.sendall(self.framed(Cmd.GRAPH_COMPUTE, msg))
        for _ in range(r.randint(1, 3)):
            sock.sendall(self.framed(Cmd.GRAPH_COMPUTE, self.flip(msg, r.randint(1, 4))))
        return 5

    def graph(self, handle: int, base: int, size: int, valid: bool) -> bytes:
        r = self.rng
        ids = [r.getrandbits(48) | 1 for _ in range(r.randint(1, 6))]
        tensors = [self.tensor(handle, base, size, valid, tid=i,
                               src=[r.choice(ids + [0, r.getrandbits(64)])] * r.randint(0, 2)) for i in ids]
        nodes = [r.choice(ids + [0, r.getrandbits(64)]) for _ in range(r.randint(0, 4))]
        n_nodes = len(nodes) if r.random() < 0.8 else r.choice([2**20 + 1, 2**32 - 1, len(nodes) + 1])
        n_tensors = len(tensors) if r.random() < 0.8 else r.choice([0, 2**32 - 1, len(tensors) + 1])
        return (P.GRAPH_HEAD.pack(r.choice([0, 0, 0, 5]), n_nodes) + b"".join(P.U64.pack(n) for n in nodes)
                + P.U32.pack(n_tensors) + b"".join(tensors))

    def all(self):
        return [self.no_hello, self.bad_hello, self.random_commands, self.fixed_layouts,
                self.with_buffer, self.with_buffer, self.valid_graph, self.valid_graph]


def wait_closed(sock, timeout: float) -> bool:
    """Read until the server closes (responses to valid requests are drained); False on timeout."""
    sock.settimeout(timeout)
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            if not sock.recv(65536):
                return True
    except socket.timeout:
        return False
    except OSError:  # reset by the server: closed as well
        return True
    return False


def fuzz(endpoint: str, messages: int, seconds: float, seed: int = 0, timeout: float = 5.0,
         server_alive=None) -> Tally:
    rng = random.Random(seed)
    scen = Scenarios(rng).all()
    tally = Tally()
    host, port = P.parse_endpoint(endpoint)
    t_end = time.monotonic() + seconds
    while tally.messages < messages and time.monotonic() < t_end:
        tally.rounds += 1
        try:
            with socket.create_connection((host, port), timeout=timeout) as s:
                try:
                    tally.messages += rng.choice(scen)(s)
                    s.shutdown(socket.SHUT_WR)
                except (OSError, EOFError, AssertionError):
                    tally.messages += 1  # the server closed while we were still writing
                if wait_closed(s, timeout):
                    tally.closed_cleanly += 1
                else:
                    tally.hangs += 1
        except OSError:
            pass
        if not (server_alive() if server_alive else True) or not alive(endpoint, timeout):
            tally.crashes += 1
            break
    return tally


# ---------------------------------------------------------------- the structure-aware mode

CANARY = bytes([0x5A, 0x3C, 0xC3, 0xA5])  # the buffers' bytes before the graph writes


@dataclass
class GraphTally:
    graphs: int = 0
    messages: int = 0
    computed: int = 0        # both servers computed it and every node was read back
    refused: int = 0         # the server closed the connection (a refused graph, a kernel's error)
    disagreements: int = 0   # one server refused what the other computed
    leaks: int = 0           # a node read back with other values than the reference's
    hangs: int = 0
    crashes: int = 0
    leak_examples: list = field(default_factory=list)
    families: collections.Counter = field(default_factory=collections.Counter)

    def table(self) -> str:
        rows = [("graphs", self.graphs), ("messages sent (to the server under test)", self.messages),
                ("graphs computed and read back", self.computed), ("graphs refused (connection closed)", self.refused),
                ("refused by one server only", self.disagreements), ("replies unlike the reference's (leaks)", self.leaks),
                ("hangs", self.hangs), ("crashes", self.crashes)]
        return "\n".join(["| measure | count |", "| --- | ---: |"] + [f"| {k} | {v} |" for k, v in rows])


class GraphMaker:
    """Random graphs from torchggml's builders: (graph nodes, input values by tensor)."""

    def __init__(self, rng: random.Random):
        self.rng = rng

    def make(self):
        import torchggml as ggml
        ctx = ggml.init(no_alloc=True)
        family = self.rng.choice(["attention", "attention", "chain", "chain", "chain"])
        for _ in range(20):  # a builder may refuse a random choice (its own checks): draw again
            try:
                inputs = {}
                out = getattr(self, family)(ggml, ctx, inputs)
                graph = ggml.new_graph(ctx)
                ggml.build_forward_expand(graph, out)
                return family, list(graph.nodes), inputs
            except (ValueError, AssertionError, IndexError):
                ctx = ggml.init(no_alloc=True)
        raise RuntimeError("no graph built in 20 draws")

    def _input(self, ggml, ctx, inputs, type_, ne):
        t = ggml.new_tensor(ctx, type_, list(ne))
        inputs[t] = None
        return t

    def _free_view(self, ggml, t):
        """A view of t with random sizes, strides and offset (inside t's bytes, mostly)."""
        r = self.rng
        es = 4 if t.type == ggml.Type.F32 else 2
        total = t.nb[3] * t.ne[3]
        ne = [r.randint(1, 16), r.randint(1, 8), r.randint(1, 4)]
        nb1 = es * (ne[0] + r.choice([0, 0, 1, 7]))
        nb2 = nb1 * (ne[1] + r.choice([0, 0, 2]))
        extent = (ne[0] - 1) * es + (ne[1] - 1) * nb1 + (ne[2] - 1) * nb2 + es
        room = total - extent
        offset = es * r.randint(0, max(room // es, 0)) if r.random() < 0.9 else total  # 10%: past t
        return ne, nb1, nb2, offset

    def attention(self, ggml, ctx, inputs):
        """MUL_MAT(K, Q) -> SOFT_MAX (a mask at times) -> MUL_MAT(V^T, .), V^T = CONT of a permute,
        a transpose or a free view of the V cells, or a CONT that reshapes it (issue 43)."""
        r, F16, F32 = self.rng, ggml.Type.F16, ggml.Type.F32
        d_k, n_kv, n_tok = r.choice([8, 16, 64]), r.randint(1, 40), r.randint(1, 5)
        n_head_kv = r.choice([1, 2])
        n_head = n_head_kv * r.choice([1, 2])
        k = self._input(ggml, ctx, inputs, F16, [d_k, n_kv, n_head_kv])
        q = self._input(ggml, ctx, inputs, F32, [d_k, n_tok, n_head])
        kq = ggml.mul_mat(ctx, k, q)
        mask = self._input(ggml, ctx, inputs, r.choice([F16, F32]), [n_kv, n_tok + r.choice([0, 3])]) \
            if r.random() < 0.5 else None
        probs = ggml.soft_max_ext(ctx, kq, mask, r.choice([1.0, 0.125]), 0.0)
        d_v = r.choice([8, 16, 64, 1024])
        how = r.choice(["permute", "permute", "transpose", "view", "reshape"])
        if how == "view":
            cells = self._input(ggml, ctx, inputs, F16, [r.randint(n_kv, 2 * n_kv), d_v + r.choice([0, 4]), n_head_kv])
            v = ggml.view_3d(ctx, cells, n_kv, d_v, n_head_kv, cells.nb[1] if r.random() < 0.5 else 2 * r.randint(1, 64),
                             cells.nb[2], 2 * r.randint(0, 4))
        elif how == "reshape":  # v ne [1, D]: CONT to [n_kv, D / n_kv] (the finding, any D)
            cells = self._input(ggml, ctx, inputs, F16, [d_v * n_kv, 1, n_head_kv])
            v = ggml.permute(ctx, cells, 1, 0, 2, 3)
        else:
            cells = self._input(ggml, ctx, inputs, F16, [d_v, n_kv, n_head_kv])
            v = (ggml.permute(ctx, cells, 1, 0, 2, 3) if how == "permute"
                 else ggml.transpose(ctx, cells))
        v_t = ggml.cont_3d(ctx, v, n_kv, d_v, n_head_kv) if how == "reshape" else ggml.cont(ctx, v)
        return ggml.mul_mat(ctx, v_t, probs)

    def chain(self, ggml, ctx, inputs):
        r = self.rng
        x = self._input(ggml, ctx, inputs, r.choice([ggml.Type.F32, ggml.Type.F16]),
                        [r.randint(1, 48), r.randint(1, 12), r.randint(1, 3)])
        for _ in range(r.randint(2, 6)):
            op = r.choice(["transpose", "permute", "view", "cont", "reshape", "cpy", "get_rows", "mul_mat",
                           "soft_max", "scale", "add"])
            if op == "transpose":
                x = ggml.transpose(ctx, x)
            elif op == "permute":
                x = ggml.permute(ctx, x, *r.choice([(1, 0, 2, 3), (0, 2, 1, 3), (2, 0, 1, 3), (1, 2, 0, 3)]))
            elif op == "view":
                ne, nb1, nb2, offset = self._free_view(ggml, x if x.view_src is None else x.view_src)
                x = ggml.view_3d(ctx, x if x.view_src is None else x.view_src, *ne, nb1, nb2, offset)
            elif op == "cont":
                x = ggml.cont(ctx, x)
            elif op == "reshape":  # CONT to another shape of as many values
                n = x.ne[0] * x.ne[1] * x.ne[2] * x.ne[3]
                a = r.choice([d for d in range(1, min(n, 64) + 1) if n % d == 0])
                x = ggml.cont_2d(ctx, x, a, n // a)
            elif op == "cpy":
                n = x.ne[0] * x.ne[1] * x.ne[2] * x.ne[3]
                a = r.choice([d for d in range(1, min(n, 64) + 1) if n % d == 0])
                dst = self._input(ggml, ctx, inputs, r.choice([ggml.Type.F32, ggml.Type.F16]), [n // a, a])
                x = ggml.cpy(ctx, x, dst)
            elif op == "get_rows":
                x = ggml.cont_2d(ctx, x, x.ne[0], x.ne[1] * x.ne[2] * x.ne[3])
                ids = self._input(ggml, ctx, inputs, ggml.Type.I32, [r.randint(1, 8)])
                inputs[ids] = ("rows", x.ne[1])
                x = ggml.get_rows(ctx, x, ids)
            elif op == "mul_mat":
                w = self._input(ggml, ctx, inputs, r.choice([ggml.Type.F32, ggml.Type.F16]), [x.ne[0], r.randint(1, 32)])
                x = ggml.mul_mat(ctx, w, x if x.type == ggml.Type.F32 else ggml.cpy(
                    ctx, x, self._input(ggml, ctx, inputs, ggml.Type.F32, list(x.ne))))
            elif op == "soft_max" and x.type == ggml.Type.F32:
                x = ggml.soft_max(ctx, ggml.cont(ctx, x))
            elif op == "scale":
                x = ggml.scale(ctx, x, r.choice([0.5, -2.0]))
            elif op == "add":
                y = self._input(ggml, ctx, inputs, x.type, [x.ne[0], 1, 1])
                x = ggml.add(ctx, x, y)
        return x


def _wire_graph(nodes, inputs, rng):
    """(tensors in wire order, offsets in the buffer, buffer size) of a graph: every tensor the
    nodes reach, the roots placed one after another (32-byte aligned), views at root + offset."""
    from torchggml.tensor import nbytes
    seen, stack = {}, list(reversed(nodes))
    while stack:
        t = stack.pop()
        if id(t) in seen:
            continue
        seen[id(t)] = t
        stack.extend(s for s in t.src if s is not None)
        if t.view_src is not None:
            stack.append(t.view_src)
    tensors = list(seen.values())
    offsets, end = {}, 0
    for t in tensors:
        if t.view_src is None:
            offsets[id(t)] = end
            end += -(-nbytes(t) // 32) * 32
    for t in tensors:
        if t.view_src is not None:
            offsets[id(t)] = offsets[id(t.view_src)] + t.view_offs
    return tensors, offsets, max(end, 32)


def _input_bytes(t, spec, rng) -> bytes:
    import numpy as np
    from torchggml.tensor import nelements
    n = nelements(t)
    if spec is not None:  # row ids: mostly in range, at times one past either end
        _, rows = spec
        ids = [rng.randrange(rows) if rng.random() < 0.9 else rng.choice([-1, rows, 2**31 - 1]) for _ in range(n)]
        return np.array(ids, np.int32).tobytes()
    values = np.array([rng.gauss(0.0, 1.0) for _ in range(n)], np.float32)
    return (values.astype(np.float16) if t.type.name == "F16" else values).tobytes()


def _graph_session(endpoint, tensors, offsets, size, nodes, payloads, timeout):
    """One connection: buffer, canary, inputs, GRAPH_COMPUTE, every node read back. Returns
    (messages sent, [node bytes], None when the server closed the connection, or "timeout"
    when it neither answered nor closed within `timeout` seconds)."""
    from torchggml.tensor import nbytes
    host, port = P.parse_endpoint(endpoint)
    ids = {id(t): i + 1 for i, t in enumerate(tensors)}
    sent = 0
    with socket.create_connection((host, port), timeout=timeout) as s:
        try:
            _hello(s)
            handle, _ = P.ALLOC_BUFFER_RSP.unpack(_call(s, Cmd.ALLOC_BUFFER, P.ALLOC_BUFFER_REQ.pack(0, size), 16))
            base = P.U64.unpack(_call(s, Cmd.BUFFER_GET_BASE, P.U64.pack(handle), 8))[0]
            sent += 3

            def wire(t):
                return P.pack_tensor(ids[id(t)], int(t.type), handle, list(t.ne), list(t.nb), int(t.op),
                                     list(t.op_params), t.flags, [ids.get(id(x), 0) for x in t.src],
                                     ids.get(id(t.view_src), 0), t.view_offs, base + offsets[id(t)], t.name[:60])
            whole = P.pack_tensor(10**6, 24, handle, [size, 1, 1, 1], [1, size, size, size], 0, [0] * 16, 0,
                                  [0] * P.MAX_SRC, 0, 0, base, "canary")  # I8 over the whole buffer
            canary = (CANARY * (size // len(CANARY) + 1))[:size]
            P.send_command(s, Cmd.SET_TENSOR, whole, P.SET_TENSOR_HEAD.pack(0, 0), canary)
            for t, data in payloads:
                P.send_command(s, Cmd.SET_TENSOR, wire(t), P.SET_TENSOR_HEAD.pack(0, 0), data)
            graph = (P.GRAPH_HEAD.pack(0, len(nodes)) + b"".join(P.U64.pack(ids[id(n)]) for n in nodes)
                     + P.U32.pack(len(tensors)) + b"".join(wire(t) for t in tensors))
            P.send_command(s, Cmd.GRAPH_COMPUTE, graph)
            sent += 2 + len(payloads)
            replies = []
            for n in nodes:
                sent += 1
                replies.append(bytes(_call(s, Cmd.GET_TENSOR, wire(n) + P.TENSOR_RANGE.pack(0, nbytes(n)), nbytes(n))))
            return sent, replies
        except TimeoutError:
            return sent, "timeout"
        except (OSError, EOFError, AssertionError):
            return sent, None


def _canary(offset: int, size: int) -> bytes:
    """The canary's bytes at [offset, offset + size) of a buffer."""
    start = offset % len(CANARY)
    return (CANARY * ((start + size) // len(CANARY) + 1))[start:start + size]


def _same_values(t, a: bytes, b: bytes) -> bool:
    """The node's bytes as its type's values, equal within the kernels' rounding (the fast
    kernels and the torch ones sum in other orders; F16 products round to F16 first)."""
    import numpy as np
    if t.type.name not in ("F32", "F16"):
        return a == b
    dtype = np.float32 if t.type.name == "F32" else np.float16
    x, y = np.frombuffer(a, dtype).astype(np.float64), np.frombuffer(b, dtype).astype(np.float64)
    scale = max(1.0, float(np.nanmax(np.abs(y[np.isfinite(y)]))) if np.isfinite(y).any() else 1.0)
    return bool(np.allclose(x, y, rtol=2e-2, atol=2e-2 * scale, equal_nan=True))


def fuzz_graphs(endpoint: str, graphs: int, seconds: float, seed: int = 0, timeout: float = 120.0,
                server_alive=None) -> GraphTally:
    """The structure-aware mode: `graphs` random graphs (or `seconds`), each sent to the server
    at `endpoint` and to an in-process reference server (CPU, torch kernels only). `timeout`
    is generous: a server's first graphs may wait for its kernels to compile."""
    from torchggml.devices.rpc import RPCServer
    rng = random.Random(seed)
    maker = GraphMaker(rng)
    tally = GraphTally()
    ref = RPCServer("127.0.0.1:0", ["CPU"]).start()
    ref.backends[0].set_use_ref(True)
    t_end = time.monotonic() + seconds
    try:
        while tally.graphs < graphs and time.monotonic() < t_end:
            family, nodes, inputs = maker.make()
            tensors, offsets, size = _wire_graph(nodes, inputs, rng)
            size = size + rng.choice([0, 0, 32, 4096])  # mostly exactly its size: a read past it is the heap
            payloads = [(t, _input_bytes(t, spec, rng)) for t, spec in inputs.items() if id(t) in offsets]
            tally.graphs += 1
            tally.families[family] += 1
            sent, got = _graph_session(endpoint, tensors, offsets, size, nodes, payloads, timeout)
            tally.messages += sent
            if got == "timeout":  # no answer, no close: a hang
                tally.hangs += 1
                got = None
            _, want = _graph_session(ref.endpoint, tensors, offsets, size, nodes, payloads, timeout)
            want = None if want == "timeout" else want
            if got is None or want is None:
                tally.refused += got is None
                tally.disagreements += (got is None) != (want is None)
            else:
                tally.computed += 1
                # a node is the reference's values, or, where the server fused it away (an
                # intermediate nobody else reads, as ggml's backends fuse), the buffer's canary
                bad = [n for n, a, b in zip(nodes, got, want)
                       if not (_same_values(n, a, b) or a == _canary(offsets[id(n)], len(a)))]
                if bad:
                    tally.leaks += 1
                    if len(tally.leak_examples) < 5:
                        tally.leak_examples.append(f"{family}: {bad[0].op.name} ne={list(bad[0].ne)} nb={list(bad[0].nb)}")
            if not (server_alive() if server_alive else True) or not alive(endpoint, timeout):
                tally.crashes += 1
                break
    finally:
        ref.close()
    return tally


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--endpoint", help="fuzz a server already running (default: start one)")
    ap.add_argument("--messages", type=int, default=2000)
    ap.add_argument("--seconds", type=float, default=120)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--timeout", type=float, default=5.0)
    ap.add_argument("--graphs", type=int, help="the structure-aware mode: this many well-formed graphs")
    args = ap.parse_args()
    proc = None
    endpoint = args.endpoint
    if endpoint is None:
        port = _free_port()
        endpoint = f"127.0.0.1:{port}"
        log = tempfile.TemporaryFile("w+")  # the server's log (a pipe nobody reads would block it)
        proc = subprocess.Popen([sys.executable, "-m", "torchggml", "rpc-server", "--port", str(port),
                                 "--device", "CPU"], stdout=subprocess.DEVNULL, stderr=log,
                                env=dict(os.environ))
        for _ in range(300):
            if alive(endpoint, 1.0):
                break
            time.sleep(0.1)
        else:
            proc.kill()
            log.seek(0)
            sys.exit(f"the RPC server did not start: {log.read()[-2000:]}")
    t0 = time.monotonic()
    try:
        server_alive = (lambda: proc.poll() is None) if proc else None
        if args.graphs:
            tally = fuzz_graphs(endpoint, args.graphs, args.seconds, args.seed, max(args.timeout, 120.0), server_alive)
        else:
            tally = fuzz(endpoint, args.messages, args.seconds, args.seed, args.timeout, server_alive)
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait(10)
    print(f"fuzzed {endpoint} for {time.monotonic() - t0:.1f} s (seed {args.seed})\n")
    print(tally.table())
    if args.graphs:
        print("\ngraph families:", dict(tally.families))
        for example in tally.leak_examples:
            print("  leak:", example)
    if proc is not None:  # why the server closed connections, most frequent first
        log.seek(0)
        kinds = collections.Counter(re.sub(r"'[^']*'|0x[0-9a-f]+|\d+", "#", line.split(" closed: ", 1)[1]).strip()[:80]
                                    for line in log if " closed: " in line)
        print(f"\nthe server's reasons for closing ({sum(kinds.values())} connections), most frequent:")
        for kind, n in kinds.most_common(12):
            print(f"  {n:6d}  {kind}")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


if __name__ == "__main__":
    main()
