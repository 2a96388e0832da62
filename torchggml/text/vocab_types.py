"""The vocabulary types llama.cpp knows, by the file's tokenizer.ggml.model: apart from the
tokenizers (tokenizer.py) so that a load checks the key without importing them (and regex)."""

#: tokenizer.ggml.model -> llama_vocab_type
VOCAB_TYPES = {"llama": "SPM", "gpt2": "BPE", "gemma4": "BPE", "whitespace": "BPE", "bert": "WPM",
               "t5": "UGM", "rwkv": "RWKV", "none": "NONE", "no_vocab": "NONE"}
