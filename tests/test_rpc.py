"""Remote devices over ggml's RPC protocol on loopback: graphs and GGUF models computed on a
torchggml rpc-server equal local results; the server's buffers, weight cache and graph reuse;
malformed messages close only their connection; a server that goes away is a named error; a
small fuzz run. Interop with upstream's RPC (llama-cpp-python) is in test_rpc_interop.py."""
from __future__ import annotations

import importlib.util
import json
import logging
import os
import socket
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest
import torch

import torchggml as ggml
from torchggml.devices.rpc import (RPCServer, RPCServerGoneError, RPCError, backend_rpc_init, backend_rpc_add_server,
                           backend_is_rpc, backend_rpc_buffer_type, backend_rpc_get_device_memory,
                           backend_rpc_reg, close_connection, close_server)
from torchggml.devices.rpc import protocol as P
from torchggml.devices.rpc.client import connection
from torchggml.devices.rpc.protocol import Cmd

ROOT = Path(__file__).resolve().parents[1]
GOLDEN = Path(os.environ.get("TORCHGGML_GOLDEN", ROOT.parent / "shared" / "golden"))
HAVE_GOLDEN = (GOLDEN / "manifest.json").exists()
MANIFEST = {e["model"].split("/")[-1]: e for e in json.loads((GOLDEN / "manifest.json").read_text())} if HAVE_GOLDEN else {}
needs_golden = pytest.mark.skipif(not HAVE_GOLDEN, reason=f"golden data not found at {GOLDEN}")
MAX_ERR_FLOAT, MAX_ERR_QUANT = 2e-3, 4e-2  # test_models.py's thresholds (llama.cpp's F16 KV cache, q8 activations)


@pytest.fixture(scope="module")
def server():
    srv = RPCServer("127.0.0.1:0", ["CPU"]).start()
    yield srv
    close_server(srv.endpoint)
    srv.close()


def rel_err(a, b) -> float:
    return float(np.linalg.norm(np.asarray(a, dtype=np.float64) - b) / np.linalg.norm(b))


# ---------------------------------------------------------------- graphs: remote == local

def _mm(ctx, x):
    w = ggml.new_tensor_2d(ctx, ggml.Type.F32, 64, 48)
    return ggml.mul_mat(ctx, w, x), {w: torch.randn(48, 64)}


def _mm_q8(ctx, x):
    w = ggml.new_tensor_2d(ctx, ggml.Type.Q8_0, 64, 48)  # ne0 % 512 != 0: INIT_TENSOR/GET_ALLOC_SIZE path
    return ggml.mul_mat(ctx, w, x), {w: ggml.quants.quantize(ggml.Type.Q8_0, torch.randn(48, 64))}


def _norm_softmax(ctx, x):
    g = ggml.new_tensor_1d(ctx, ggml.Type.F32, 64)
    return ggml.soft_max(ctx, ggml.mul(ctx, ggml.rms_norm(ctx, x, 1e-5), g)), {g: torch.rand(64)}


def _views(ctx, x):
    t = ggml.cont(ctx, ggml.transpose(ctx, x))
    return ggml.cpy(ctx, ggml.scale(ctx, t, 0.5), ggml.new_tensor_2d(ctx, ggml.Type.F16, 8, 64)), {}


def _rows(ctx, x):
    ids = ggml.new_tensor_1d(ctx, ggml.Type.I32, 5)
    return ggml.get_rows(ctx, x, ids), {ids: torch.tensor([7, 0, 3, 3, 1], dtype=torch.int32)}


GRAPHS = {"mul_mat": _mm, "mul_mat_q8_0": _mm_q8, "rms_norm_mul_soft_max": _norm_softmax,
          "transpose_cont_cpy_f16": _views, "get_rows": _rows}


def _compute(backend, build, seed):
    torch.manual_seed(seed)
    ctx = ggml.init(no_alloc=True)
    x = ggml.new_tensor_2d(ctx, ggml.Type.F32, 64, 8)
    out, data = build(ctx, x)
    g = ggml.new_graph(ctx)
    ggml.build_forward_expand(g, out)
    buf = ggml.backend_alloc_ctx_tensors(ctx, backend)
    ggml.backend_tensor_set(x, torch.randn(8, 64))
    for t, v in data.items():
        ggml.backend_tensor_set(t, v)
    assert ggml.backend_graph_compute(backend, g) == ggml.Status.SUCCESS
    result = ggml.backend_tensor_get(out)
    ggml.backend_buffer_free(buf)
    return result


@pytest.mark.parametrize("name", GRAPHS)
def test_graph_on_server_equals_local(server, name):
    remote = backend_rpc_init(server.endpoint, 0)
    assert backend_is_rpc(remote) and not backend_is_rpc(ggml.backend_cpu_init())
    ours = _compute(remote, GRAPHS[name], seed=1)
    local = _compute(ggml.backend_cpu_init(), GRAPHS[name], seed=1)
    assert ours.dtype == local.dtype and torch.equal(ours, local)  # the same CPU kernels on both sides


def test_server_of_a_simulated_accelerator():
    """Any torchggml device can be served: here SIM0 (its buffers are not host memory)."""
    if ggml.backend_dev_by_name("SIM0") is None:
        pytest.skip("no SIM devices (TORCHGGML_SIM_DEVICES)")
    srv = RPCServer("127.0.0.1:0", ["SIM0"]).start()
    try:
        for name in ("mul_mat", "rms_norm_mul_soft_max"):
            ours = _compute(backend_rpc_init(srv.endpoint, 0), GRAPHS[name], seed=2)
            local = _compute(ggml.backend_dev_init(ggml.backend_dev_by_name("SIM0")), GRAPHS[name], seed=2)
            assert torch.equal(ours, local)
    finally:
        close_server(srv.endpoint)
        srv.close()


def test_cli_lists_a_servers_devices(server, capsys):
    from torchggml.cli import main
    assert main(["devices", "--rpc", server.endpoint]) == 0
    out = capsys.readouterr().out
    assert f"RPC[{server.endpoint}]" in out and server.endpoint in out
    assert main(["devices", "--rpc", "127.0.0.1:1"]) == 1
    assert "cannot connect to the RPC server at 127.0.0.1:1" in capsys.readouterr().err


def test_graph_recompute_and_buffer_commands(server):
    be = backend_rpc_init(server.endpoint, 0)
    ctx = ggml.init(no_alloc=True)
    a = ggml.new_tensor_1d(ctx, ggml.Type.F32, 16)
    b = ggml.new_tensor_1d(ctx, ggml.Type.F32, 16)
    c = ggml.add(ctx, a, b)
    g = ggml.new_graph(ctx)
    ggml.build_forward_expand(g, c)
    buf = ggml.backend_alloc_ctx_tensors(ctx, be)
    assert buf.name.startswith("RPC0[") and ggml.backend_buffer_get_size(buf) >= 3 * 64
    ggml.backend_buffer_clear(buf, 0)
    ggml.backend_tensor_set(a, torch.arange(16.0))
    ggml.backend_tensor_memset(b, 0)
    ggml.backend_tensor_set(b, torch.full((4,), 2.0), offset=8)     # a partial write: b[2:6] = 2
    before = dict(server.stats.commands)
    for _ in range(2):  # the second time: the same graph at the same addresses -> GRAPH_RECOMPUTE
        ggml.backend_graph_compute(be, g)
    served = {k: v - before.get(k, 0) for k, v in server.stats.commands.items()}
    assert served.get("GRAPH_COMPUTE") == 1 and served.get("GRAPH_RECOMPUTE") == 1
    expect = torch.arange(16.0)
    expect[2:6] += 2
    assert torch.equal(ggml.backend_tensor_get(c), expect)
    assert torch.equal(ggml.backend_tensor_get(c, offset=4, size=8).view(torch.float32), expect[1:3])
    ggml.backend_tensor_copy(c, a)  # both on the server: COPY_TENSOR, no host round trip
    assert torch.equal(ggml.backend_tensor_get(a), expect)
    free, total = backend_rpc_get_device_memory(server.endpoint, 0)
    assert 0 < free <= total
    assert backend_rpc_buffer_type(server.endpoint, 0) is be.get_default_buffer_type()
    ggml.backend_buffer_free(buf)


def test_reg_devices_and_proc_addresses(server):
    reg = backend_rpc_add_server(server.endpoint)
    assert reg is backend_rpc_add_server(server.endpoint)        # one reg per endpoint
    assert reg.get_name() == f"RPC[{server.endpoint}]" and len(reg.get_devices()) == 1
    dev = reg.get_devices()[0]
    assert dev.get_name().startswith("RPC") and dev.get_description() == server.endpoint
    assert dev.get_props().caps.async_ and ggml.backend_dev_type(dev) == ggml.DeviceType.GPU
    base = backend_rpc_reg()
    assert base.get_name() == "RPC" and base.get_devices() == []
    assert ggml.backend_reg_get_proc_address(base, "ggml_backend_rpc_add_server")(server.endpoint) is reg
    # 7.0.1 servers answer GET_DEVICE_SUPPORTS_OP: an op the server's CPU lacks is refused
    ctx = ggml.init(no_alloc=True)
    x = ggml.new_tensor_1d(ctx, ggml.Type.F32, 8)
    assert dev.supports_op(ggml.add(ctx, x, x))
    lacking = ggml.dup_tensor(ctx, x)  # an op no torchggml device computes (ggml aborts in its builder)
    lacking.op, lacking.src[0] = ggml.Op.FLASH_ATTN_BACK, x
    assert not ggml.backend_dev_supports_op(ggml.backend_dev_by_name("CPU"), lacking)
    assert not dev.supports_op(lacking)


def test_scheduler_splits_between_server_and_cpu(server):
    """Weights on the server, the input on the CPU: the scheduler copies between them."""
    remote, cpu = backend_rpc_init(server.endpoint, 0), ggml.backend_cpu_init()
    torch.manual_seed(3)
    W, X = torch.randn(32, 64), torch.randn(4, 64)
    wctx = ggml.init(no_alloc=True)
    w = ggml.new_tensor_2d(wctx, ggml.Type.F32, 64, 32)
    wbuf = ggml.backend_alloc_ctx_tensors(wctx, remote)
    ggml.backend_buffer_set_usage(wbuf, ggml.BufferUsage.WEIGHTS)
    ggml.backend_tensor_set(w, W)
    ctx = ggml.init(no_alloc=True)
    x = ggml.new_tensor_2d(ctx, ggml.Type.F32, 64, 4)
    ggml.set_input(x)
    y = ggml.mul_mat(ctx, w, x)
    z = ggml.soft_max(ctx, y)
    g = ggml.new_graph(ctx)
    ggml.build_forward_expand(g, z)
    sched = ggml.backend_sched_new([remote, cpu])
    ggml.backend_sched_alloc_graph(sched, g)
    ggml.backend_tensor_set(x, X)
    ggml.backend_sched_graph_compute(sched, g)
    assert ggml.backend_sched_get_tensor_backend(sched, y) is remote
    ref = torch.softmax(X @ W.T, dim=-1)
    torch.testing.assert_close(ggml.backend_tensor_get(z), ref, rtol=1e-5, atol=1e-6)
    ggml.backend_sched_free(sched)
    ggml.backend_buffer_free(wbuf)


# ---------------------------------------------------------------- GGUF models

_local_models: dict = {}


@needs_golden
@pytest.mark.parametrize("name", ["llama-F32.gguf", "llama-Q4_0.gguf"])
def test_golden_model_on_server(server, name):
    from torchggml.models import load_model
    entry = MANIFEST[name]
    ref = np.load(GOLDEN / entry["logits"])
    remote = backend_rpc_add_server(server.endpoint).get_devices()[0]
    model = load_model(GOLDEN / entry["model"], rpc=[server.endpoint], devices=[remote], progress=False)
    assert model.placement.devices == [remote]  # embeddings, layers and head on the server
    ours = model.eval(entry["tokens"]).numpy()
    # the server's CPU holds weights in its plain buffer type: locally the same (repack=False)
    local = load_model(GOLDEN / entry["model"], progress=False, repack=False).eval(entry["tokens"]).numpy()
    quant = entry["weights"] not in ("F32", "F16")
    assert rel_err(ours, ref) <= (MAX_ERR_QUANT if quant else MAX_ERR_FLOAT)
    assert rel_err(ours, local) <= 1e-5  # the server runs the same kernels as the local CPU
    assert (ours.argmax(1) == ref.argmax(1)).mean() >= 0.9


@needs_golden
def test_rpc_devices_count_as_accelerators_for_n_gpu_layers(server):
    from torchggml.models import load_model
    entry = MANIFEST["llama-F32.gguf"]
    from torchggml.models.placement import gpu_devices
    remote = backend_rpc_add_server(server.endpoint).get_devices()[0]
    model = load_model(GOLDEN / entry["model"], rpc=[server.endpoint], devices=[remote], n_gpu_layers=1,
                       progress=False)
    assert model.placement.layers == [ggml.backend_dev_by_name("CPU"), remote]  # the last layer offloaded
    assert gpu_devices()[0] is remote  # registered, and first among the accelerators (llama.cpp's order)
    ref = np.load(GOLDEN / entry["logits"])
    assert rel_err(model.eval(entry["tokens"]).numpy(), ref) <= MAX_ERR_FLOAT


# ---------------------------------------------------------------- the weight cache

def test_weight_cache_spares_the_second_upload(tmp_path):
    """A weight above 10 MiB goes by hash first; the server saves it in cache_dir, and a new
    connection's upload of the same bytes is answered from the cache (upstream's SET_TENSOR_HASH)."""
    srv = RPCServer("127.0.0.1:0", ["CPU"], cache_dir=tmp_path).start()
    try:
        data = torch.randn(3 * 2**20)  # 12 MiB
        sent = []
        for _ in range(2):
            be = backend_rpc_init(srv.endpoint, 0)
            ctx = ggml.init(no_alloc=True)
            w = ggml.new_tensor_1d(ctx, ggml.Type.F32, data.numel())
            buf = ggml.backend_alloc_ctx_tensors(ctx, be)
            ggml.backend_buffer_set_usage(buf, ggml.BufferUsage.WEIGHTS)
            conn = connection(srv.endpoint)
            start = conn.bytes_sent
            ggml.backend_tensor_set(w, data)
            sent.append(conn.bytes_sent - start)
            assert torch.equal(ggml.backend_tensor_get(w), data)
            close_connection(srv.endpoint)  # the next upload comes from a new connection
        assert [p.name for p in tmp_path.iterdir()] == [f"{P.fnv_hash(data.numpy().view(np.uint8)):016x}"]
        assert sent[0] > data.numel() * 4 and sent[1] < 4096
        assert srv.stats.commands["SET_TENSOR_HASH"] == 2 and srv.stats.commands["SET_TENSOR"] == 1
    finally:
        close_server(srv.endpoint)
        srv.close()


def test_fnv_hash_is_upstreams():
    assert P.fnv_hash(b"") == 0xcbf29ce484222325
    assert P.fnv_hash(b"a") == 0xaf63dc4c8601ec8c  # FNV-1a 64 test vectors
    assert P.fnv_hash(b"foobar") == 0x85944171f73967e8
    big = np.arange(1000, dtype=np.uint8)
    assert P.fnv_hash(big) == P._fnv_python(big.tobytes())  # the compiled loop and the plain one agree


# ---------------------------------------------------------------- never trust the wire

def _raw(endpoint, hello=True):
    host, port = P.parse_endpoint(endpoint)
    s = socket.create_connection((host, port), timeout=10)
    if hello:
        P.send_command(s, Cmd.HELLO, bytes(P.CONN_CAPS_SIZE))
        assert P.U64.unpack(P.recv_exact(s, 8))[0] == P.HELLO_RSP.size
        major, minor, patch, _, _ = P.HELLO_RSP.unpack(P.recv_exact(s, P.HELLO_RSP.size))
        assert (major, minor, patch) == (P.PROTO_MAJOR, P.PROTO_MINOR, P.PROTO_PATCH)
    return s


def _alloc(s, size=256):
    P.send_command(s, Cmd.ALLOC_BUFFER, P.ALLOC_BUFFER_REQ.pack(0, size))
    P.recv_exact(s, 8)
    handle, _ = P.ALLOC_BUFFER_RSP.unpack(P.recv_exact(s, 16))
    P.send_command(s, Cmd.BUFFER_GET_BASE, P.U64.pack(handle))
    P.recv_exact(s, 8)
    return handle, P.U64.unpack(P.recv_exact(s, 8))[0]


def _t(handle, data, ne=(16, 1, 1, 1), type_=0, op=0, src=(), tid=1, nb=None):
    nb = nb or (4, 4 * ne[0], 4 * ne[0] * ne[1], 4 * ne[0] * ne[1] * ne[2])
    return P.pack_tensor(tid, type_, handle, ne, nb, op, [0] * 16, 0, list(src) + [0] * (10 - len(src)), 0, 0,
                         data, "t")


def _frame(cmd, payload, size=None):
    return P.U8.pack(cmd) + P.U64.pack(len(payload) if size is None else size) + payload


# name -> (message built from (handle, base), text the logged reason contains)
MALFORMED = {
    "no HELLO first": (lambda h, b: _frame(Cmd.DEVICE_COUNT, b""), "expected HELLO first"),
    "unknown command": (lambda h, b: _frame(77, b""), "unknown or misplaced command 77"),
    "wrong request size": (lambda h, b: _frame(Cmd.GET_ALIGNMENT, b"\0" * 8), "GET_ALIGNMENT request of 8 bytes"),
    "huge size field": (lambda h, b: _frame(Cmd.GRAPH_COMPUTE, b"", 2**63), "larger than any graph"),
    "missing device": (lambda h, b: _frame(Cmd.GET_DEVICE_MEMORY, P.U32.pack(3)), "device 3 does not exist"),
    "foreign buffer handle": (lambda h, b: _frame(Cmd.FREE_BUFFER, P.U64.pack(h ^ 0x100)), "is not a buffer of this connection"),
    "unknown type": (lambda h, b: _frame(Cmd.GET_TENSOR, _t(h, b, type_=200) + P.TENSOR_RANGE.pack(0, 4)), "unknown type id 200"),
    "unknown op": (lambda h, b: _frame(Cmd.INIT_TENSOR, _t(h, b, op=250)), "op id 250 is not known"),
    "tensor past its buffer": (lambda h, b: _frame(Cmd.GET_TENSOR, _t(h, b + 240) + P.TENSOR_RANGE.pack(0, 4)), "lie outside buffer"),
    "read past the tensor": (lambda h, b: _frame(Cmd.GET_TENSOR, _t(h, b) + P.TENSOR_RANGE.pack(60, 8)), "outside tensor"),
    "write past the tensor": (lambda h, b: _frame(Cmd.SET_TENSOR, _t(h, b) + P.SET_TENSOR_HEAD.pack(0, 0) + b"\0" * 65), "outside tensor"),
    "data without buffer": (lambda h, b: _frame(Cmd.INIT_TENSOR, _t(0, b)), "without a buffer"),
    "graph node count lies": (lambda h, b: _frame(Cmd.GRAPH_COMPUTE, P.GRAPH_HEAD.pack(0, 1000) + P.U32.pack(0)), "cannot hold 1000 node ids"),
    "graph tensor count lies": (lambda h, b: _frame(Cmd.GRAPH_COMPUTE, P.GRAPH_HEAD.pack(0, 1) + P.U64.pack(1) + P.U32.pack(5) + _t(h, b)), "need"),
    "graph node not sent": (lambda h, b: _frame(Cmd.GRAPH_COMPUTE, P.GRAPH_HEAD.pack(0, 1) + P.U64.pack(9) + P.U32.pack(1) + _t(h, b)), "is not among the graph's tensors"),
    "graph source not sent": (lambda h, b: _frame(Cmd.GRAPH_COMPUTE, P.GRAPH_HEAD.pack(0, 1) + P.U64.pack(1) + P.U32.pack(1) + _t(h, b, op=2, src=(5, 6))), "is not in the graph"),
    "node shape disagrees with its sources": (lambda h, b: _frame(Cmd.GRAPH_COMPUTE, P.GRAPH_HEAD.pack(0, 1) + P.U64.pack(2) + P.U32.pack(2)
                                                  + _t(h, b) + _t(h, b + 64, ne=(8, 1, 1, 1), op=2, src=(1, 1), tid=2)),
                                              "is not source 0's [16, 1, 1, 1]"),
    "mul_mat of mismatched rows": (lambda h, b: _frame(Cmd.GRAPH_COMPUTE, P.GRAPH_HEAD.pack(0, 1) + P.U64.pack(3) + P.U32.pack(3)
                                                      + _t(h, b) + _t(h, b + 64, ne=(8, 2, 1, 1), tid=2)
                                                      + _t(h, b + 128, ne=(16, 2, 1, 1), op=29, src=(1, 2), tid=3)),
                                   "cannot be multiplied"),
    "recompute before compute": (lambda h, b: _frame(Cmd.GRAPH_RECOMPUTE, P.U32.pack(0)), "without a stored graph"),
    "truncated message": (lambda h, b: _frame(Cmd.GET_TENSOR, _t(h, b) + P.TENSOR_RANGE.pack(0, 4))[:100],
                          "truncated message"),
}


@pytest.mark.parametrize("case", MALFORMED)
def test_malformed_message_closes_only_that_connection(server, case, caplog):
    build, reason = MALFORMED[case]
    other = backend_rpc_init(server.endpoint, 0)  # another client, connected throughout
    s = _raw(server.endpoint, hello=case != "no HELLO first")
    handle, base = _alloc(s) if case != "no HELLO first" else (0, 0)
    with caplog.at_level(logging.WARNING, logger="torchggml.devices.rpc"):
        try:
            s.sendall(build(handle, base))
            s.shutdown(socket.SHUT_WR)
        except OSError:
            pass  # already closed by the server
        s.settimeout(10)
        try:
            assert s.recv(1) == b""  # the server closed the connection...
        except ConnectionResetError:
            pass                     # ...with our unread bytes still in its queue: a reset
        s.close()
    assert any(reason in r.getMessage() for r in caplog.records), [r.getMessage() for r in caplog.records]
    # the server serves the others: the connected client and a new one
    free, _ = backend_rpc_get_device_memory(server.endpoint, 0)
    assert free > 0 and other.get_device().get_memory()[0] > 0
    _raw(server.endpoint).close()


def test_connections_beyond_the_limit_are_refused(caplog):
    srv = RPCServer("127.0.0.1:0", ["CPU"], max_connections=2).start()
    try:
        held = [_raw(srv.endpoint), _raw(srv.endpoint)]
        with caplog.at_level(logging.WARNING, logger="torchggml.devices.rpc"):
            extra = socket.create_connection(("127.0.0.1", srv.port), timeout=10)
            try:
                assert extra.recv(1) == b""
            except ConnectionResetError:
                pass
        assert any("2 connections already" in r.getMessage() for r in caplog.records)
        held[0].close()
        for _ in range(100):  # its session ends, and a new client is served again
            if len(srv.sessions) < 2:
                break
            threading.Event().wait(0.05)
        _raw(srv.endpoint).close()
        held[1].close()
    finally:
        srv.close()


def test_client_gets_a_named_error_when_the_server_goes_away():
    srv = RPCServer("127.0.0.1:0", ["CPU"]).start()
    endpoint = srv.endpoint
    be = backend_rpc_init(endpoint, 0)
    ctx = ggml.init(no_alloc=True)
    t = ggml.new_tensor_1d(ctx, ggml.Type.F32, 4)
    ggml.backend_alloc_ctx_tensors(ctx, be)
    srv.close()
    with pytest.raises(RPCServerGoneError, match=f"RPC server at {endpoint} went away during GET_TENSOR"):
        ggml.backend_tensor_get(t)
    close_connection(endpoint)
    with pytest.raises(RPCServerGoneError, match=f"cannot connect to the RPC server at {endpoint}"):
        backend_rpc_init(endpoint, 0)  # its reg is remembered, its connection is not
    close_server(endpoint)


def test_version_mismatch_is_refused():
    """A server answering HELLO with another major version is refused (upstream's check)."""
    listener = socket.create_server(("127.0.0.1", 0))

    def old_server():
        conn, _ = listener.accept()
        P.recv_exact(conn, 1 + 8 + P.CONN_CAPS_SIZE)
        P.send_response(conn, P.HELLO_RSP.pack(6, 0, 0, 0, bytes(P.CONN_CAPS_SIZE)))
        conn.recv(1)
        conn.close()

    th = threading.Thread(target=old_server, daemon=True)
    th.start()
    endpoint = f"127.0.0.1:{listener.getsockname()[1]}"
    with pytest.raises(RPCError, match=r"protocol 6\.0\.0, this client 7\.0"):
        backend_rpc_init(endpoint, 0)
    th.join(5)
    listener.close()


def test_binds_loopback_by_default_and_warns_otherwise():
    srv = RPCServer("127.0.0.1:0", ["CPU"])
    assert srv.host == "127.0.0.1"
    srv.close()
    with pytest.warns(UserWarning, match="not a loopback address"):
        RPCServer("0.0.0.0:0", ["CPU"]).close()
    assert "127.0.0.1" in [a.default for a in __import__("torchggml.cli", fromlist=["x"]).build_parser()
                           ._subparsers._group_actions[0].choices["rpc-server"]._actions if a.dest == "host"]


def test_fuzz_small():
    """scripts/fuzz_rpc.py's scenarios, bounded: every connection closed, no hang, no crash."""
    spec = importlib.util.spec_from_file_location("fuzz_rpc", ROOT / "scripts" / "fuzz_rpc.py")
    fuzz = importlib.util.module_from_spec(spec)
    sys.modules["fuzz_rpc"] = fuzz
    spec.loader.exec_module(fuzz)
    srv = RPCServer("127.0.0.1:0", ["CPU"]).start()
    try:
        tally = fuzz.fuzz(srv.endpoint, messages=400, seconds=30, seed=7, timeout=5)
    finally:
        srv.close()
    assert tally.messages >= 400 or tally.rounds > 50
    assert tally.hangs == 0 and tally.crashes == 0 and tally.closed_cleanly == tally.rounds
    assert srv.stats.closed_violation > 0  # the malformed ones were refused, with reasons


# ---------------------------------------------------------------- pipeline parallel across processes

def start_server_process(*extra) -> tuple[subprocess.Popen, str]:
    """`python -m torchggml rpc-server --port 0` in a child process; its endpoint from its banner."""
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.Popen([sys.executable, "-m", "torchggml", "rpc-server", "--port", "0", *extra],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    for line in proc.stdout:
        if "endpoint" in line:
            return proc, line.split(":", 1)[1].strip()
    proc.kill()
    raise RuntimeError(f"rpc-server did not start: {proc.stdout.read()}")


@needs_golden
def test_model_split_over_two_server_processes_and_the_cpu():
    """Layer 0 on one rpc-server process, layer 1 on another, the output head on the local CPU:
    the scheduler copies activations between them; the logits equal the local ones."""
    from torchggml.models import load_model
    procs = [start_server_process(), start_server_process()]
    try:
        entry = MANIFEST["llama-F16.gguf"]
        model = load_model(GOLDEN / entry["model"], rpc=[ep for _, ep in procs], tensor_split=[1, 1, 0],
                           progress=False)
        names = [d.get_name() for d in model.placement.layers]
        assert len(set(names)) == 2 and all(n.startswith("RPC") for n in names)
        assert model.placement.output.get_name() == "CPU"
        ours = model.eval(entry["tokens"][:8]).numpy()
        steps = [model.eval([t]).numpy() for t in entry["tokens"][8:12]]
        ours = np.concatenate([ours] + steps)
        ref = np.load(GOLDEN / entry["logits"])[:12]
        local = load_model(GOLDEN / entry["model"], progress=False)
        local_logits = np.concatenate([local.eval(entry["tokens"][:8]).numpy()]
                                      + [local.eval([t]).numpy() for t in entry["tokens"][8:12]])
        # within the golden threshold of llama.cpp's logits and of the local run's (the server
        # processes' CPU tables may take another F16 product path than this process's)
        assert rel_err(ours, ref) <= MAX_ERR_FLOAT and rel_err(ours, local_logits) <= MAX_ERR_FLOAT
    finally:
        for proc, ep in procs:
            close_server(ep)
            proc.terminate()
            proc.wait(10)
