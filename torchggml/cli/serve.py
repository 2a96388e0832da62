"""The `serve` subcommand:

    torchggml serve [MODEL] [--host 127.0.0.1] [--port 8080] [--parallel N] [--api-key KEY]
                    [--cache-ram MIB] [--cache-reuse N] [--slot-save-path DIR]
                    [--timeout S] [--max-body-size BYTES] [--max-connections N] ...
                    [--mmproj FILE [--media-path DIR]]
                    [model options as `run`: -d, -ngl, -ts, -tp, -c, -b, -fa, -ctk, -t]

The server listens at once and answers 503 "Loading model" until the model is loaded and warmed
(llama-server's readiness); the model loads on a thread beside it.
"""
from __future__ import annotations

import os
import sys
import threading

from .. import config
from .models import (add_chat_template_option, add_model_options, model_params, use_chat_template,
                     user_errors)


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
    from ..server.http import protocol_with
    from ..server.limits import Limits
    for name in ("timeout", "header_timeout", "max_body_size", "max_connections"):
        if getattr(args, name) <= 0:
            raise ValueError(f"serve: --{name.replace('_', '-')} must be positive, got {getattr(args, name)}")
    load_kernel_files(getattr(args, "kernels", None) or [])  # --kernels: registered before the model loads
    if args.parallel < 1:
        raise ValueError(f"serve: --parallel must be at least 1, got {args.parallel}")
    if args.cache_ram < 0:
        raise ValueError(f"serve: --cache-ram must not be negative, got {args.cache_ram}")
    if args.cache_reuse < 0:
        raise ValueError(f"serve: --cache-reuse must not be negative, got {args.cache_reuse}")
    if args.slot_save_path is not None and not os.path.isdir(args.slot_save_path):
        raise ValueError(f"serve: --slot-save-path {args.slot_save_path!r} is not a directory")
    # recurrent and hybrid models keep one state per slot
    params = model_params(args).with_options(progress=False, n_seq_max=args.parallel)
    api_key = args.api_key or config.value("TORCHGGML_API_KEY") or None
    state = ServerState(None, None, args.alias or os.path.basename(path), args.pooling,
                        Limits(max_body_bytes=args.max_body_size), args.strict_model_name,
                        args.request_timeout or None, args.reasoning_format, args.media_path,
                        slot_save_path=args.slot_save_path)
    app = create_app(state, api_key, args.timeout)
    held = {}
    failed = []

    def load():
        try:
            held["model"] = model = load_model(path, params)
            print(model.describe(), file=sys.stderr)
            use_chat_template(model, args)
            draft = None
            if args.model_draft:
                from ..models.speculative import ModelDraft
                held["draft"] = draft_model = load_model(args.model_draft, params)
                draft = ModelDraft(draft_model, model)
            elif args.draft_ngram:
                from ..models.speculative import NgramDraft
                draft = NgramDraft()
            mm = None
            if args.mmproj:  # images and audio in chat messages: the projector on the model's input device
                from ..mtmd import Multimodal, load_mmproj
                held["mm"] = mm = Multimodal(model, load_mmproj(args.mmproj, model.placement.input))
                print(f"{args.mmproj}: projector {mm.mmproj.projector}", file=sys.stderr)
            held["engine"] = engine = Engine(model, args.parallel, args.queue_size, draft=draft,
                                             n_draft=args.draft_max, cache_ram=args.cache_ram << 20,
                                             cache_reuse=args.cache_reuse)
            if engine.cache_reuse_off:  # (as llama-server: a warning, and no reuse)
                print(f"--cache-reuse is ignored: {engine.cache_reuse_off}", file=sys.stderr)
            loras = [(path, 1.0) for path in args.lora or []] + [(p, float(x)) for p, x in args.lora_scaled or []]
            if loras:
                from ..server.lora_adapters import load_adapters
                if args.lora_init_without_apply:
                    loras = [(path, 0.0) for path, _ in loras]
                state.lora_paths = load_adapters(model, engine, loras)
                state.lora_scales = engine.lora
            state.attach(model, engine, mm)
            from ..models.warmup import install as notice_compiles
            notice_compiles()  # a line for each kernel whose compiling runs past a second
            state.warm_up()
            print(f"serving {state.model_id} on http://{args.host}:{args.port} ({args.parallel} slots over one "
                  f"context of {engine.slot_ctx} tokens{', API key required' if api_key else ''})",
                  file=sys.stderr)
        except BaseException as e:  # the server cannot serve: stop it, and say why
            failed.append(e)
            server.should_exit = True

    server = uvicorn.Server(uvicorn.Config(
        app, host=args.host, port=args.port, log_level=args.log_level, timeout_graceful_shutdown=2,
        http=protocol_with(args.header_timeout), timeout_keep_alive=args.keep_alive,
        limit_concurrency=args.max_connections))
    threading.Thread(target=load, name="torchggml-load", daemon=True).start()
    try:
        server.run()
    finally:
        state.pool.shutdown(wait=False, cancel_futures=True)
        if "engine" in held:
            held["engine"].stop()
        if "mm" in held:  # (closes its model too)
            held.pop("mm").close()
            held.pop("model")
        for name in ("model", "draft"):
            if name in held:
                held[name].close()
    if failed:
        raise failed[0]
    return 0


def add_subcommands(subparsers) -> None:
    p = subparsers.add_parser("serve", help="an OpenAI-compatible HTTP server (no MODEL: the built-in demo)")
    p.add_argument("model", nargs="?", help="GGUF file (default: the built-in demo model)")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1: this machine only)")
    p.add_argument("--port", type=int, default=8080, help="port to listen on")
    p.add_argument("-np", "--parallel", type=int, default=4, metavar="N",
                   help="slots: sequences decoded together over one KV cache of n_ctx cells, which any of them "
                        "may fill while the others are idle (default 4, as llama-server)")
    p.add_argument("-cram", "--cache-ram", type=int, default=8192, metavar="MIB",
                   help="host-memory prompt cache: prompts whose cells a slot gave up are kept with their KV cells, "
                        "up to MIB mebibytes (default 8192, as llama-server; 0: none)")
    p.add_argument("--cache-reuse", type=int, default=0, metavar="N",
                   help="after a prompt diverges from a slot's cells, move cached runs of at least N tokens that "
                        "continue it to their new positions, K re-rotated (llama-server's; default 0: off; "
                        "plain-rope F16/F32 K caches only)")
    p.add_argument("--slot-save-path", default=None, metavar="DIR",
                   help="folder for POST /slots/{id}?action=save|restore files (default: slot actions off)")
    p.add_argument("--queue-size", type=int, default=64, metavar="N",
                   help="requests' sequences that may wait for a slot; more are refused with 503")
    p.add_argument("--api-key", default=None, metavar="KEY",
                   help="require 'Authorization: Bearer KEY' (also $TORCHGGML_API_KEY)")
    p.add_argument("--alias", default=None, metavar="NAME", help="the model's name in the API (default: file name)")
    p.add_argument("--pooling", choices=("mean", "cls", "last", "rank"), default=None,
                   help="embeddings' pooling (default: the file's pooling type, mean when it has none); rank: "
                        "a reranker's classifier head, for /v1/rerank")
    p.add_argument("--log-level", default="warning", choices=("critical", "error", "warning", "info", "debug"),
                   help="the HTTP server's log level")
    add_chat_template_option(p)
    p.add_argument("--reasoning-format", default="auto", choices=("auto", "none"),
                   help="auto (default): a reasoning model's thinking (<think>, gpt-oss's analysis channel) "
                        "as reasoning_content; none: left in content")
    p.add_argument("--timeout", type=float, default=600.0, metavar="S",
                   help="seconds a request body may take to arrive, and a client may leave a response unread "
                        "(a stalled stream is cancelled); llama-server's read/write timeout (default 600)")
    p.add_argument("--header-timeout", type=float, default=10.0, metavar="S",
                   help="seconds a connection has to send a request's headers (default 10)")
    p.add_argument("--keep-alive", type=float, default=5.0, metavar="S",
                   help="seconds an idle keep-alive connection stays open (default 5)")
    p.add_argument("--request-timeout", type=float, default=0.0, metavar="S",
                   help="seconds a sequence may generate; then it ends with finish_reason 'length' (default 0: none)")
    p.add_argument("--max-body-size", type=int, default=8 << 20, metavar="BYTES",
                   help="largest request body; larger ones are answered 413 (default 8 MiB)")
    p.add_argument("--max-connections", type=int, default=256, metavar="N",
                   help="open connections and requests at once; past it new requests get 503 (default 256)")
    p.add_argument("--strict-model-name", action="store_true",
                   help="answer 404 to a request naming another model (default: serve any name, as llama-server)")
    p.add_argument("--lora", action="append", metavar="FILE",
                   help="a LoRA adapter (GGUF, llama.cpp's format) at scale 1; repeat for several; their scales: "
                        "POST /lora-adapters, or a request's lora field")
    p.add_argument("--lora-scaled", action="append", nargs=2, metavar=("FILE", "SCALE"),
                   help="a LoRA adapter at this scale")
    p.add_argument("--lora-init-without-apply", action="store_true",
                   help="load the adapters at scale 0 (apply them later: POST /lora-adapters)")
    p.add_argument("--mmproj", default=None, metavar="FILE",
                   help="the model's multimodal projector (mmproj GGUF): image_url and input_audio parts in chats")
    p.add_argument("--media-path", default=None, metavar="DIR",
                   help="file:// media URLs may name files in this folder (default: none allowed)")
    p.add_argument("-md", "--model-draft", default=None, metavar="FILE",
                   help="speculative decoding with this draft model (the same vocabulary)")
    p.add_argument("--draft-ngram", action="store_true",
                   help="speculative decoding with prompt lookup (drafts copied from the context)")
    p.add_argument("--draft-max", type=int, default=16, metavar="N", help="tokens drafted per step (default 16)")
    add_model_options(p)
    p.set_defaults(func=cmd_serve)
