"""Interop with upstream ggml's RPC (the libggml-rpc that llama-cpp-python bundles), both ways,
on loopback: upstream's RPC server serves a torchggml client, and llama.cpp computes a model on a
torchggml rpc-server with the logits of its local run. Skipped, with the reason, where
llama-cpp-python or its libggml-rpc is missing (install it with CMAKE_ARGS="-DGGML_RPC=ON")."""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

import torchggml as ggml
from torchggml.devices.rpc import RPCServer, backend_rpc_add_server, backend_rpc_init, close_server
from torchggml.devices.rpc.client import connection

ROOT = Path(__file__).resolve().parents[1]
GOLDEN = Path(os.environ.get("TORCHGGML_GOLDEN", ROOT.parent / "shared" / "golden"))
HAVE_GOLDEN = (GOLDEN / "manifest.json").exists()
MANIFEST = {e["model"].split("/")[-1]: e for e in json.loads((GOLDEN / "manifest.json").read_text())} if HAVE_GOLDEN else {}
MAX_ERR_FLOAT, MAX_ERR_QUANT = 2e-3, 4e-2


def _llama_lib_dir() -> Path | None:
    try:
        import llama_cpp
    except Exception:
        return None
    lib = Path(llama_cpp.__file__).parent / "lib"
    return lib if (lib / "libggml-rpc.so").exists() else None


LIB = _llama_lib_dir()
pytestmark = [pytest.mark.skipif(LIB is None, reason="llama-cpp-python with libggml-rpc is not installed "
                                                     "(CMAKE_ARGS=\"-DGGML_RPC=ON\" pip install llama-cpp-python)"),
              pytest.mark.skipif(not HAVE_GOLDEN, reason=f"golden data not found at {GOLDEN}")]

# upstream's server, started through its library: ggml_backend_rpc_start_server(endpoint,
# cache_dir, n_threads, n_devices, devices) with the CPU device; it serves until killed
UPSTREAM_SERVER = r"""
import ctypes, os, sys
lib = sys.argv[1]
for n in ("libggml-base.so", "libggml.so", "libggml-cpu.so", "libggml-rpc.so"):
    ctypes.CDLL(os.path.join(lib, n), mode=ctypes.RTLD_GLOBAL)
ggml = ctypes.CDLL(os.path.join(lib, "libggml.so"), mode=ctypes.RTLD_GLOBAL)
rpc = ctypes.CDLL(os.path.join(lib, "libggml-rpc.so"), mode=ctypes.RTLD_GLOBAL)
ggml.ggml_backend_dev_by_type.restype = ctypes.c_void_p
ggml.ggml_backend_dev_by_type.argtypes = [ctypes.c_int]
devs = (ctypes.c_void_p * 1)(ggml.ggml_backend_dev_by_type(0))  # GGML_BACKEND_DEVICE_TYPE_CPU
rpc.ggml_backend_rpc_start_server.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_size_t,
                                               ctypes.c_size_t, ctypes.c_void_p]
rpc.ggml_backend_rpc_start_server(sys.argv[2].encode(), None, 2, 1, devs)
"""

# llama.cpp (llama-cpp-python) evaluating a golden model locally, then with its layers on the RPC
# server's device: ggml_backend_rpc_add_server + ggml_backend_register, and the device passed in
# llama_model_params.devices (this llama-cpp-python has no rpc_servers argument, and its default
# device selection left the registered RPC device out in our runs)
LLAMA_CLIENT = r"""
import ctypes, json, os, sys
import numpy as np
import llama_cpp, llama_cpp.llama_cpp as C
lib, endpoint, model, tokens, out = sys.argv[1], sys.argv[2], sys.argv[3], json.loads(sys.argv[4]), sys.argv[5]
ggml = ctypes.CDLL(os.path.join(lib, "libggml.so"), mode=ctypes.RTLD_GLOBAL)
rpc = ctypes.CDLL(os.path.join(lib, "libggml-rpc.so"), mode=ctypes.RTLD_GLOBAL)

def run():
    llm = llama_cpp.Llama(model, n_ctx=256, logits_all=True, verbose=False, n_threads=2, n_gpu_layers=99)
    llm.eval(tokens)
    return np.array(llm.scores[:len(tokens)], dtype=np.float32)

local = run()
rpc.ggml_backend_rpc_add_server.restype = ctypes.c_void_p
rpc.ggml_backend_rpc_add_server.argtypes = [ctypes.c_char_p]
reg = rpc.ggml_backend_rpc_add_server(endpoint.encode())
ggml.ggml_backend_register.argtypes = [ctypes.c_void_p]
ggml.ggml_backend_register(reg)
ggml.ggml_backend_reg_dev_get.restype = ctypes.c_void_p
ggml.ggml_backend_reg_dev_get.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
devs = (ctypes.c_void_p * 2)(ggml.ggml_backend_reg_dev_get(reg, 0), None)
default_params = C.llama_model_default_params
def with_rpc_device():
    p = default_params()
    p.devices = ctypes.cast(devs, ctypes.c_void_p)
    return p
C.llama_model_default_params = with_rpc_device
remote = run()
np.savez(out, local=local, remote=remote)
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_listening(endpoint: str, proc, timeout: float = 30) -> None:
    host, port = endpoint.rsplit(":", 1)
    t_end = time.monotonic() + timeout
    while time.monotonic() < t_end:
        if proc.poll() is not None:
            raise RuntimeError(f"the server exited: {proc.stdout.read()}")
        try:
            socket.create_connection((host, int(port)), timeout=1).close()
            return
        except OSError:
            time.sleep(0.1)
    raise TimeoutError(f"nothing listens at {endpoint}")


@pytest.fixture(scope="module")
def upstream_server():
    endpoint = f"127.0.0.1:{_free_port()}"
    proc = subprocess.Popen([sys.executable, "-c", UPSTREAM_SERVER, str(LIB), endpoint],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    # upstream serves one client at a time: a probe connection would hold it; wait for the
    # banner instead, then for the socket
    for line in proc.stdout:
        if "transport" in line:
            break
    time.sleep(0.3)
    yield endpoint
    close_server(endpoint)
    proc.kill()
    proc.wait(10)


def rel_err(a, b) -> float:
    return float(np.linalg.norm(np.asarray(a, np.float64) - b) / np.linalg.norm(b))


def test_upstream_server_speaks_our_version(upstream_server):
    assert connection(upstream_server).version[:2] == (7, 0)
    reg = backend_rpc_add_server(upstream_server)
    assert len(reg.get_devices()) == 1
    free, total = reg.get_devices()[0].get_memory()
    assert 0 < free <= total


# graph, tolerance against the local torchggml CPU (upstream's CPU kernels differ: GELU from an
# F16 table, Q8_0 products with 8-bit activations)
GRAPH_CASES = {
    "mul_mat_f32": (lambda ctx, x, w: ggml.mul_mat(ctx, w, x), ggml.Type.F32, 1e-5),
    "mul_mat_q8_0": (lambda ctx, x, w: ggml.mul_mat(ctx, w, x), ggml.Type.Q8_0, 2e-2),
    "norm_softmax": (lambda ctx, x, w: ggml.soft_max(ctx, ggml.rms_norm(ctx, ggml.mul_mat(ctx, w, x), 1e-5)),
                     ggml.Type.F32, 1e-5),
    "gelu_add_f16": (lambda ctx, x, w: ggml.cpy(ctx, ggml.gelu(ctx, ggml.add(ctx, x, x)),
                                                ggml.new_tensor_2d(ctx, ggml.Type.F16, 64, 8)),
                     ggml.Type.F32, 2e-3),
}


def _graph(backend, case, seed=0):
    build, wtype, _ = GRAPH_CASES[case]
    torch.manual_seed(seed)
    ctx = ggml.init(no_alloc=True)
    x = ggml.new_tensor_2d(ctx, ggml.Type.F32, 64, 8)
    w = ggml.new_tensor_2d(ctx, wtype, 64, 48)
    out = build(ctx, x, w)
    g = ggml.new_graph(ctx)
    ggml.build_forward_expand(g, out)
    buf = ggml.backend_alloc_ctx_tensors(ctx, backend)
    ggml.backend_tensor_set(x, torch.randn(8, 64))
    W = torch.randn(48, 64)
    ggml.backend_tensor_set(w, W if wtype == ggml.Type.F32 else ggml.quants.quantize(wtype, W))
    ggml.backend_graph_compute(backend, g)
    result = ggml.backend_tensor_get(out).float()
    ggml.backend_buffer_free(buf)
    return result


@pytest.mark.parametrize("case", GRAPH_CASES)
def test_upstream_server_computes_our_graphs(upstream_server, case):
    ours = _graph(backend_rpc_init(upstream_server, 0), case)
    local = _graph(ggml.backend_cpu_init(), case)
    assert rel_err(ours.numpy(), local.numpy()) <= GRAPH_CASES[case][2]


@pytest.mark.parametrize("name", ["llama-F32.gguf", "llama-Q4_0.gguf"])
def test_upstream_server_runs_our_model(upstream_server, name):
    """torchggml's model graph (every op of a llama layer, the KV cache) on upstream's server."""
    from torchggml.models import load_model
    entry = MANIFEST[name]
    remote = backend_rpc_add_server(upstream_server).get_devices()[0]
    model = load_model(GOLDEN / entry["model"], rpc=[upstream_server], devices=[remote], progress=False)
    logits = model.eval(entry["tokens"]).numpy()
    ref = np.load(GOLDEN / entry["logits"])
    quant = entry["weights"] not in ("F32", "F16")
    assert rel_err(logits, ref) <= (MAX_ERR_QUANT if quant else MAX_ERR_FLOAT)
    assert (logits.argmax(1) == ref.argmax(1)).mean() >= 0.9


@pytest.mark.parametrize("name", ["llama-F32.gguf", "llama-Q4_0.gguf"])
def test_llama_cpp_computes_on_our_server(tmp_path, name):
    entry = MANIFEST[name]
    srv = RPCServer("127.0.0.1:0", ["CPU"]).start()
    try:
        out = tmp_path / "logits.npz"
        res = subprocess.run([sys.executable, "-c", LLAMA_CLIENT, str(LIB), srv.endpoint, str(GOLDEN / entry["model"]),
                              json.dumps(entry["tokens"]), str(out)], capture_output=True, text=True, timeout=300)
        assert res.returncode == 0, res.stderr[-3000:]
    finally:
        srv.close()
    served = srv.stats.commands
    assert served.get("GRAPH_COMPUTE", 0) >= 1 and served.get("SET_TENSOR", 0) >= 1  # it did run here
    logits = np.load(out)
    quant = entry["weights"] not in ("F32", "F16")
    # llama.cpp's local CPU quantizes activations for quantized products, our server does not
    assert rel_err(logits["remote"], logits["local"]) <= (MAX_ERR_QUANT if quant else MAX_ERR_FLOAT)
    assert (logits["remote"].argmax(1) == logits["local"].argmax(1)).mean() >= 0.9
    assert srv.stats.closed_violation == 0 and srv.stats.closed_error == 0


def test_model_split_over_upstreams_server_ours_and_the_cpu(upstream_server):
    """Layer 0 on upstream's RPC server, layer 1 on a torchggml one, the head local: the
    scheduler moves the activations between two implementations of the protocol."""
    from torchggml.models import load_model
    entry = MANIFEST["llama-F16.gguf"]
    ours = RPCServer("127.0.0.1:0", ["CPU"]).start()
    try:
        model = load_model(GOLDEN / entry["model"], rpc=[upstream_server, ours.endpoint], tensor_split=[1, 1, 0],
                           progress=False)
        assert [d.get_description() for d in model.placement.layers] == [upstream_server, ours.endpoint]
        logits = model.eval(entry["tokens"]).numpy()
        assert ours.stats.commands.get("GRAPH_COMPUTE", 0) >= 1
    finally:
        close_server(ours.endpoint)
        ours.close()
    assert rel_err(logits, np.load(GOLDEN / entry["logits"])) <= MAX_ERR_FLOAT
