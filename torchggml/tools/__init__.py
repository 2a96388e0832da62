"""The tools llama.cpp users expect, as `torchggml` subcommands: perplexity (llama-perplexity),
bench (llama-bench) and quantize (llama-quantize). cli.py wires them."""
