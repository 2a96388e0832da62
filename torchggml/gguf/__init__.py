"""GGUF files: the reader (reader.py), weights to buffers (loader.py), the writers (writer/)."""
