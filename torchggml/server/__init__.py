"""`torchggml serve`: an OpenAI-compatible HTTP server with continuous batching.

engine.py (the batching thread over Model.eval_batch), grammar.py (llguidance constraints),
protocol.py (request bodies and OpenAI-style errors), app.py (the ASGI app: endpoints, streaming,
metrics, API key), cli.py (the `serve` subcommand). FastAPI, uvicorn and llguidance come with the
optional extra: pip install 'torchggml[server]'.
"""
