"""Remote devices over ggml's RPC protocol (ggml-rpc.h): the client (a server's devices as
torchggml devices) and the server (torchggml devices served to llama.cpp and torchggml)."""
from .protocol import (PROTO_MAJOR, PROTO_MINOR, PROTO_PATCH, DEFAULT_PORT, RPCError,
                       RPCServerGoneError)
from .client import (RPCBackend, RPCBuffer, RPCBufferType, RPCDevice, RPCReg, backend_rpc_init,
                     backend_is_rpc, backend_rpc_buffer_type, backend_rpc_get_device_memory,
                     backend_rpc_reg, backend_rpc_add_server, close_connection, close_server)
from .server import RPCServer, backend_rpc_start_server

__all__ = ["PROTO_MAJOR", "PROTO_MINOR", "PROTO_PATCH", "DEFAULT_PORT", "RPCError", "RPCServerGoneError",
           "RPCBackend", "RPCBuffer", "RPCBufferType", "RPCDevice", "RPCReg", "backend_rpc_init",
           "backend_is_rpc", "backend_rpc_buffer_type", "backend_rpc_get_device_memory", "backend_rpc_reg",
           "backend_rpc_add_server", "close_connection", "close_server", "RPCServer", "backend_rpc_start_server"]
