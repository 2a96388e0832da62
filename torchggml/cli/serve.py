"""The `serve` subcommand:

    torchggml serve [MODEL] [--host 127.0.0.1] [--port 8080] [--parallel N] [--api-key KEY]
                    [model options as `run`: -d, -ngl, -ts, -tp, -c, -b, -fa, -ctk, -t]
"""
from __future__ import annotations

import os
import sys

from .. import config
from .models import add_model_options, user_errors, model_params


@user_errors
def cmd_serve(args) -> int:
    try:
        import uvicorn
    except ImportError:
        print("torchggml serve needs the server extra: pip install 'torchggml[server]'", file=sys.stderr)
        return 1
    if args.tensor_parallel == "dist":
        raise ValueError("serve: --tensor-parallel dist (one process per rank) is not supported; give the "
                         "devices instead, e.g. -tp CUDA0,CUDA1")
    from ..models import load_model
    from ..server.app import ServerState, create_app
    from ..server.engine import Engine
    path = args.model
    if path is None:
        from ..gguf.writer.demo import demo_model_path
        path = demo_model_path()
        print(f"no model given: serving the built-in demo model {path}", file=sys.stderr)
    from ..devices.kernels.registered import load_kernel_files
    load_kernel_files(getattr(args, "kernels", None) or [])  # --kernels: registered before the model loads
    model = load_model(path, model_params(args).with_options(progress=False))
    print(model.describe(), file=sys.stderr)
    engine = Engine(model, args.parallel, args.queue_size)
    api_key = args.api_key or config.value("TORCHGGML_API_KEY") or None
    state = ServerState(model, engine, args.alias or os.path.basename(path), args.pooling)
    app = create_app(state, api_key)
    print(f"serving {state.model_id} on http://{args.host}:{args.port} ({args.parallel} parallel, "
          f"{engine.slot_ctx} tokens of context each{', API key required' if api_key else ''})", file=sys.stderr)
    try:
        uvicorn.run(app, host=args.host, port=args.port, log_level=args.log_level, timeout_graceful_shutdown=2)
    finally:
        engine.stop()
        model.close()
    return 0


def add_subcommands(subparsers) -> None:
    p = subparsers.add_parser("serve", help="an OpenAI-compatible HTTP server (no MODEL: the built-in demo)")
    p.add_argument("model", nargs="?", help="GGUF file (default: the built-in demo model)")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1: this machine only)")
    p.add_argument("--port", type=int, default=8080)
    p.add_argument("-np", "--parallel", type=int, default=1, metavar="N",
                   help="sequences decoded together (slots; each gets n_ctx / N tokens of context)")
    p.add_argument("--queue-size", type=int, default=64, metavar="N",
                   help="requests' sequences that may wait for a slot; more are refused with 503")
    p.add_argument("--api-key", default=None, metavar="KEY",
                   help="require 'Authorization: Bearer KEY' (also $TORCHGGML_API_KEY)")
    p.add_argument("--alias", default=None, metavar="NAME", help="the model's name in the API (default: file name)")
    p.add_argument("--pooling", choices=("mean", "cls", "last"), default=None,
                   help="embeddings' pooling (default: the file's pooling type, mean when it has none)")
    p.add_argument("--log-level", default="warning", choices=("critical", "error", "warning", "info", "debug"))
    add_model_options(p)
    p.set_defaults(func=cmd_serve)
