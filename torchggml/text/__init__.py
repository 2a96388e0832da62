"""Text: llama.cpp's tokenizers (tokenizer.py, tokenizer_models.py, tokenizer_pre.py) and chat
templates (chat.py)."""
