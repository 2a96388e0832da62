"""`torchggml serve`: an OpenAI-compatible HTTP server with continuous batching.

engine.py (the batching thread over Model.eval_batch), grammar.py (llguidance constraints),
protocol.py (request bodies and OpenAI-style errors), limits.py (what one request may ask, checked
before any work), http.py (uvicorn's protocol with a header deadline), app.py (the ASGI app:
endpoints, streaming, metrics, API key, readiness); the `serve` subcommand is torchggml/cli/serve.py.
FastAPI, uvicorn and llguidance come with the optional extra: pip install 'torchggml[server]'.
docs/server.md lists the limits and options.
"""
