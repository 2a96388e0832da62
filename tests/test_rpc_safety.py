"""The RPC server against hostile clients (issue 43): graphs whose fused or specialised kernels
would read past their inputs (the decode-attention pattern with a CONT that reshapes), fresh
buffers that must read as zeros, connections that stall or idle, a per-client memory quota,
views that are not where their source puts them, and a bounded run of the structure-aware fuzz
mode (scripts/fuzz_rpc.py --graphs)."""
from __future__ import annotations

import importlib.util
import logging
import socket
import sys
import threading
import time
from pathlib import Path

import pytest
import torch

import torchggml as ggml
from torchggml.devices.rpc import RPCServer, backend_rpc_init, backend_rpc_get_device_memory, close_server
from torchggml.devices.rpc import protocol as P
from torchggml.devices.rpc.protocol import Cmd

ROOT = Path(__file__).resolve().parents[1]
T = ggml.Type


def _serve(**options) -> RPCServer:
    return RPCServer("127.0.0.1:0", ["CPU"], **options).start()


def _stop(srv: RPCServer) -> None:
    close_server(srv.endpoint)
    srv.close()


@pytest.fixture(scope="module")
def server():
    srv = _serve()
    yield srv
    _stop(srv)


def _alive(srv: RPCServer) -> bool:
    """The server answers a new client (and so was not taken down)."""
    free, total = backend_rpc_get_device_memory(srv.endpoint, 0)
    return 0 < free <= total


# ---------------------------------------------------------------- the 4-node pattern

def reshaped_attention(backend, d: int, seed: int = 0):
    """KQ = MUL_MAT(K, Q), P = SOFT_MAX(KQ), VT = CONT(v) with v a PERMUTE view of ne [1, D] and
    VT of ne [2, D/2], OUT = MUL_MAT(VT, P): every shape agrees with ggml's rules, but VT is not
    v's transpose. The V cells get a buffer of their own (a read past them is a read of the
    server's heap). Returns (OUT's values, the float64 reference, the buffers)."""
    gen = torch.Generator().manual_seed(seed)
    vctx = ggml.init(no_alloc=True)
    cells = ggml.new_tensor_3d(vctx, T.F16, d, 1, 1)
    vbuf = ggml.backend_alloc_ctx_tensors(vctx, backend)
    ctx = ggml.init(no_alloc=True)
    k = ggml.new_tensor_3d(ctx, T.F16, 8, 2, 1)
    q = ggml.new_tensor_3d(ctx, T.F32, 8, 1, 1)
    probs = ggml.soft_max(ctx, ggml.mul_mat(ctx, k, q))
    v = ggml.permute(ctx, cells, 1, 0, 2, 3)
    assert list(v.ne) == [1, d, 1, 1]
    vt = ggml.cont_2d(ctx, v, 2, d // 2)
    out = ggml.mul_mat(ctx, vt, probs)
    graph = ggml.new_graph(ctx)
    ggml.build_forward_expand(graph, out)
    buf = ggml.backend_alloc_ctx_tensors(ctx, backend)
    V = torch.randn(d, generator=gen).half()
    ggml.backend_tensor_set(cells, V)
    ggml.backend_tensor_set(k, torch.randn(2, 8, generator=gen).half())
    ggml.backend_tensor_set(q, torch.randn(8, generator=gen))
    assert ggml.backend_graph_compute(backend, graph) == ggml.Status.SUCCESS
    result = ggml.backend_tensor_get(out).reshape(-1)
    p = ggml.backend_tensor_get(probs).reshape(-1).half().double()  # F16 products round P to F16 (ggml's vec_dot type)
    ref = p[0] * V[0::2].double() + p[1] * V[1::2].double()   # VT's rows are v's values in order, 2 a row
    return result, ref, (vbuf, buf)


@pytest.mark.parametrize("where, d", [("rpc", 1024), ("rpc", 16 << 20), ("local", 1024)],
                         ids=["rpc-D=1024", "rpc-D=16M", "local-D=1024"])
def test_reshaping_cont_after_softmax_reads_only_its_inputs(server, where, d):
    """Was: the fused decode attention took n_kv from KQ and d_v from OUT and read D/2 values
    past v per cell (1 KB of the server's heap in the reply at D = 1,024, SIGSEGV at D = 16M).
    Now the nodes run unfused, and OUT is the product of VT and P (~100 MB at D = 16M)."""
    backend = backend_rpc_init(server.endpoint, 0) if where == "rpc" else ggml.backend_cpu_init()
    result, ref, buffers = reshaped_attention(backend, d)
    assert torch.isfinite(result).all()
    torch.testing.assert_close(result.double(), ref, rtol=1e-5, atol=1e-5)
    for b in buffers:
        ggml.backend_buffer_free(b)
    if where == "rpc":
        assert _alive(server)


def test_fused_attention_refuses_a_reshaping_cont():
    """The binding itself: the pattern's nodes, shapes agreeing but VT not v's transpose, bind no
    fused call (the unfused nodes run)."""
    from torchggml.devices.cpu.fusion import _bind_attention
    ctx = ggml.init(no_alloc=True)
    cells = ggml.new_tensor_3d(ctx, T.F16, 64, 1, 1)
    k = ggml.new_tensor_3d(ctx, T.F16, 8, 2, 1)
    q = ggml.new_tensor_3d(ctx, T.F32, 8, 1, 1)
    kq = ggml.mul_mat(ctx, k, q)
    probs = ggml.soft_max(ctx, kq)
    vt = ggml.cont_2d(ctx, ggml.permute(ctx, cells, 1, 0, 2, 3), 2, 32)
    out = ggml.mul_mat(ctx, vt, probs)
    buf = ggml.backend_alloc_ctx_tensors(ctx, ggml.backend_cpu_init())
    assert _bind_attention(out, kq, probs, vt) is None
    ggml.backend_buffer_free(buf)


@pytest.mark.parametrize("dims, row, ok", [
    (((2, 64), (3, 16)), 16, True),      # the last read ends at the span's end
    (((2, 64), (3, 16)), 17, False),     # one value past it
    (((2, 64), (4, 16)), 16, False),     # one cell too many
    (((0, 64),), 16, True),              # nothing read
    (((2, -64),), 1, False),             # negative strides are refused
])
def test_reads_within(dims, row, ok):
    from torchggml.devices.cpu.fast_ops import reads_within
    flat = torch.zeros(64 + 2 * 16 + 16).numpy()
    assert reads_within(flat, dims, row) is ok


# ---------------------------------------------------------------- fresh buffers read as zeros

def _buffers(backend, size: int, n: int):
    out = []
    for _ in range(n):
        ctx = ggml.init(no_alloc=True)
        t = ggml.new_tensor_1d(ctx, T.I8, size)
        out.append((t, ggml.backend_alloc_ctx_tensors(ctx, backend)))
    return out


@pytest.mark.parametrize("size", [4 << 10, 64 << 10, 8 << 20], ids=["4KiB", "64KiB", "8MiB-mapped"])
def test_fresh_buffer_reads_zeros(server, size):
    """Buffers the server allocates anew read as zeros (what GET_TENSOR of an uncomputed node
    returns), even where their memory held another client's bytes just before: buffers of the
    same size filled with a canary, then freed."""
    be = backend_rpc_init(server.endpoint, 0)
    for t, buf in _buffers(be, size, 4):
        ggml.backend_tensor_set(t, torch.full((size,), 0xA5, dtype=torch.uint8).view(torch.int8))
        ggml.backend_buffer_free(buf)
    fresh = _buffers(be, size, 4)
    assert [int(ggml.backend_tensor_get(t).view(torch.uint8).count_nonzero()) for t, _ in fresh] == [0] * 4
    for _, buf in fresh:
        ggml.backend_buffer_free(buf)


# ---------------------------------------------------------------- raw connections

def _raw(srv, hello=True) -> socket.socket:
    s = socket.create_connection(("127.0.0.1", srv.port), timeout=15)
    if hello:
        P.send_command(s, Cmd.HELLO, bytes(P.CONN_CAPS_SIZE))
        assert P.U64.unpack(P.recv_exact(s, 8))[0] == P.HELLO_RSP.size
        P.recv_exact(s, P.HELLO_RSP.size)
    return s


def _closed_by_server(s: socket.socket) -> bool:
    """Blocks until the server closes s (True) or 15 s pass (False)."""
    try:
        return s.recv(1) == b""
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False
    finally:
        s.close()


def _alloc(s, size=256) -> int:
    P.send_command(s, Cmd.ALLOC_BUFFER, P.ALLOC_BUFFER_REQ.pack(0, size))
    P.recv_exact(s, 8)
    handle, _ = P.ALLOC_BUFFER_RSP.unpack(P.recv_exact(s, 16))
    return handle


def _device_count(s) -> int:
    P.send_command(s, Cmd.DEVICE_COUNT)
    P.recv_exact(s, 8)
    return P.U32.unpack(P.recv_exact(s, 4))[0]


# name -> (what the client does, then goes quiet, the reason logged)
STALLS = {
    "no HELLO": (lambda srv: _raw(srv, hello=False), "no HELLO within 0.3 s"),
    "half a HELLO": (lambda srv: _sent(_raw(srv, hello=False), P.U8.pack(Cmd.HELLO) + b"\0\0"), "no HELLO within"),
    "stalled mid-header": (lambda srv: _sent(_raw(srv), P.U8.pack(Cmd.GET_ALIGNMENT) + b"\4\0"), "timed out"),
    "stalled mid-payload": (lambda srv: _sent(_raw(srv), P.U8.pack(Cmd.SET_TENSOR) + P.U64.pack(4096) + bytes(300)),
                            "timed out"),
    "idle without buffers": (lambda srv: _raw(srv), "idle for 0.3 s without buffers"),
}


def _sent(s, data):
    s.sendall(data)
    return s


@pytest.mark.parametrize("case", STALLS)
def test_stalled_or_idle_connection_is_dropped(case, caplog):
    srv = _serve(handshake_timeout=0.3, message_timeout=0.3, idle_timeout=0.3)
    try:
        with caplog.at_level(logging.WARNING, logger="torchggml.devices.rpc"):
            do, reason = STALLS[case]
            assert _closed_by_server(do(srv))
        assert srv.stats.closed_timeout == 1
        assert any(reason in r.getMessage() for r in caplog.records), [r.getMessage() for r in caplog.records]
        assert _alive(srv)
    finally:
        _stop(srv)


def _wait_for(predicate, seconds=15.0) -> bool:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if predicate():
            return True
        time.sleep(0.05)
    return False


def test_idle_connections_do_not_lock_out_clients():
    """--max-connections 2 held by two idle connections: they are dropped after the idle timeout
    and a real client is served."""
    srv = _serve(max_connections=2, idle_timeout=0.3)
    try:
        idle = [_raw(srv), _raw(srv)]
        assert all(_closed_by_server(s) for s in idle)
        assert _wait_for(lambda: not srv.sessions)
        assert _alive(srv)
    finally:
        _stop(srv)


def test_idle_holder_keeps_its_buffers_until_its_slot_is_needed():
    """A connection holding buffers (a llama.cpp client between requests, its weights on the
    server) outlives the idle timeout, and is dropped only when the server is full and a new
    client arrives."""
    srv = _serve(max_connections=1, idle_timeout=0.3)
    try:
        holder = _raw(srv)
        assert _alloc(holder) != 0
        time.sleep(0.6)                       # idle past the timeout: kept
        assert _device_count(holder) == 1
        time.sleep(0.6)                       # idle again, and now the slot is wanted
        newcomer = _raw(srv)
        assert _device_count(newcomer) == 1   # served
        assert _closed_by_server(holder)
        assert srv.stats.closed_timeout == 1
        newcomer.close()
    finally:
        _stop(srv)


# ---------------------------------------------------------------- the per-client quota

def test_client_memory_quota():
    srv = _serve(client_memory=1 << 20)
    try:
        be = backend_rpc_init(srv.endpoint, 0)
        buft = be.get_default_buffer_type()
        first = buft.alloc_buffer(600 << 10)
        with pytest.raises(MemoryError, match="past its per-client quota"):
            buft.alloc_buffer(600 << 10)      # 1.2 MiB in all: over the quota
        assert srv.stats.refused_memory == 1
        first.free()
        buft.alloc_buffer(600 << 10).free()   # freed memory counts no more
        assert _alive(srv)
    finally:
        _stop(srv)


@pytest.mark.parametrize("text, value", [("8G", 8 << 30), ("512M", 512 << 20), ("4096", 4096), ("1.5k", 1536),
                                         ("device", -1), ("none", None)])
def test_client_memory_option(text, value):
    from torchggml.cli import parse_size
    assert parse_size(text) == value


def test_client_memory_option_refuses_nonsense():
    from torchggml.cli import parse_size
    with pytest.raises(ValueError, match="is not a size"):
        parse_size("lots")


# ---------------------------------------------------------------- views where their source puts them

def _tensor(tid, handle, data, ne=(16, 1, 1, 1), op=0, src=(), view_src=0, view_offs=0):
    nb = (4, 4 * ne[0], 4 * ne[0] * ne[1], 4 * ne[0] * ne[1] * ne[2])
    return P.pack_tensor(tid, 0, handle, ne, nb, op, [0] * 16, 0, list(src) + [0] * (10 - len(src)), view_src,
                         view_offs, data, f"t{tid}")


def test_view_away_from_its_source_is_refused(server, caplog):
    s = _raw(server)
    handle = _alloc(s, 1024)
    P.send_command(s, Cmd.BUFFER_GET_BASE, P.U64.pack(handle))
    P.recv_exact(s, 8)
    base = P.U64.unpack(P.recv_exact(s, 8))[0]
    a = _tensor(1, handle, base)
    view = _tensor(2, handle, base + 512, op=int(ggml.Op.VIEW), src=(1,), view_src=1, view_offs=0)
    node = _tensor(3, handle, base + 256, op=int(ggml.Op.SCALE), src=(2,))
    with caplog.at_level(logging.WARNING, logger="torchggml.devices.rpc"):
        P.send_command(s, Cmd.GRAPH_COMPUTE, P.GRAPH_HEAD.pack(0, 1), P.U64.pack(3), P.U32.pack(3), a, view, node)
        s.settimeout(15)
        assert _closed_by_server(s)
    assert any("is not at its source" in r.getMessage() for r in caplog.records)
    assert _alive(server)


# ---------------------------------------------------------------- the structure-aware fuzz mode

def test_structured_fuzz_small():
    """scripts/fuzz_rpc.py's graph mode, bounded: no crash, no hang, and no reply byte outside
    what the graph legitimately wrote (the canary check)."""
    spec = importlib.util.spec_from_file_location("fuzz_rpc", ROOT / "scripts" / "fuzz_rpc.py")
    fuzz = importlib.util.module_from_spec(spec)
    sys.modules["fuzz_rpc"] = fuzz
    spec.loader.exec_module(fuzz)
    srv = _serve()
    try:
        tally = fuzz.fuzz_graphs(srv.endpoint, graphs=15, seconds=120, seed=11, timeout=120)
    finally:
        _stop(srv)
    assert tally.graphs >= 5 and tally.crashes == 0 and tally.hangs == 0
    assert tally.leaks == 0, tally.leak_examples
    assert tally.computed > 0  # some graphs ran (not all refused)
