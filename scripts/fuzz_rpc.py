"""Fuzz a torchggml RPC server on loopback with random, mutated and truncated messages.

    PYTHONPATH=. python scripts/fuzz_rpc.py --messages 2000 --seconds 120
    PYTHONPATH=. python scripts/fuzz_rpc.py --endpoint 127.0.0.1:50052   # a server already running

Without --endpoint the server runs in a child process (`python -m torchggml rpc-server`), so a
crash is seen as that process dying. Each round opens a connection, sends one scenario, closes
its side and waits (at most --timeout seconds) for the server to close the connection: that is
"closed cleanly"; no close in time is a hang. After every round a fresh client must still
complete HELLO and DEVICE_COUNT (otherwise: a crash). Bounded by --messages and --seconds.

Scenarios: bytes without HELLO; a bad HELLO; random command bytes and sizes; fixed-layout
requests with random contents; messages truncated anywhere; rpc_tensors with a real buffer
handle and random types, ops, shapes, offsets; graphs with random node counts, ids and links;
valid SET_TENSOR/GET_TENSOR/GRAPH_COMPUTE messages with random bit flips.
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
from dataclasses import dataclass

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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--endpoint", help="fuzz a server already running (default: start one)")
    ap.add_argument("--messages", type=int, default=2000)
    ap.add_argument("--seconds", type=float, default=120)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--timeout", type=float, default=5.0)
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
        tally = fuzz(endpoint, args.messages, args.seconds, args.seed, args.timeout,
                     server_alive=(lambda: proc.poll() is None) if proc else None)
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait(10)
    print(f"fuzzed {endpoint} for {time.monotonic() - t0:.1f} s (seed {args.seed})\n")
    print(tally.table())
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
