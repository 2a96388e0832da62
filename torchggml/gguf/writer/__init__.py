"""GGUF files the project writes itself, beside the reader (gguf.py): the built-in demo model and
the benchmark models (demo.py), and one tiny seeded model per architecture with llama.cpp's
logits for it in tests/data/archs (tiny.py). Written with the gguf package's GGUFWriter."""
