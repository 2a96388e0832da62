"""Remote devices over ggml's RPC protocol (ggml-rpc.h): the client (a server's devices as
torchggml devices) and the server (torchggml devices served to llama.cpp and torchggml).
Each name is imported from its module on first use (PEP 562): the CPU's kernel table reads
shapes.py's rules without the client's and the server's imports."""
from __future__ import annotations

from ...lazy import lazy_exports

_EXPORTS = {**dict.fromkeys(("PROTO_MAJOR", "PROTO_MINOR", "PROTO_PATCH", "DEFAULT_PORT", "RPCError",
                             "RPCServerGoneError"), ".protocol"),
            **dict.fromkeys(("RPCBackend", "RPCBuffer", "RPCBufferType", "RPCDevice", "RPCReg", "backend_rpc_init",
                             "backend_is_rpc", "backend_rpc_buffer_type", "backend_rpc_get_device_memory",
                             "backend_rpc_reg", "backend_rpc_add_server", "close_connection", "close_server"),
                            ".client"),
            **dict.fromkeys(("RPCServer", "backend_rpc_start_server"), ".server")}
__all__ = list(_EXPORTS)


__getattr__ = lazy_exports(__name__, _EXPORTS)
