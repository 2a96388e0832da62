#!/usr/bin/env python
"""llama-perplexity's method and memory through libllama (llama-cpp-python's library), for a
machine where the llama-perplexity binary is not built:

    python scripts/libllama_perplexity.py MODEL.gguf TEXT N_CTX THREADS

as llama-perplexity's defaults: windows of N_CTX tokens (BOS first), one batch of N_CTX tokens
(n_batch = N_CTX) in micro-batches of 512 (n_ubatch), logits asked for the second half only
(llama.cpp's output buffer then holds N_CTX/2 rows), each row scored in float64 from that buffer
(a numpy view, no copy). scripts/bench_memory.py runs it under /usr/bin/time -v."""
import ctypes, math, sys
import numpy as np
import llama_cpp as L

path, text_path, n_ctx, n_threads = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
L.llama_backend_init()
mp = L.llama_model_default_params()
model = L.llama_model_load_from_file(path.encode(), mp)
cp = L.llama_context_default_params()
cp.n_ctx, cp.n_batch, cp.n_ubatch, cp.n_threads, cp.n_threads_batch = n_ctx, n_ctx, 512, n_threads, n_threads
ctx = L.llama_init_from_model(model, cp)
vocab = L.llama_model_get_vocab(model)
n_vocab = L.llama_vocab_n_tokens(vocab)
text = open(text_path, encoding="utf-8").read().encode()
buf = (L.llama_token * (len(text) + 16))()
n = L.llama_tokenize(vocab, text, len(text), buf, len(buf), True, False)
tokens = list(buf[:n])
bos = L.llama_vocab_bos(vocab)
first = n_ctx // 2
batch = L.llama_batch_init(n_ctx, 0, 1)
nll, count = 0.0, 0
for start in range(0, n // n_ctx * n_ctx, n_ctx):
    L.llama_memory_clear(L.llama_get_memory(ctx), True)
    w = tokens[start:start + n_ctx]
    w[0] = bos
    for k, t in enumerate(w):
        batch.token[k], batch.pos[k], batch.n_seq_id[k] = t, k, 1
        batch.seq_id[k][0] = 0
        batch.logits[k] = k >= first
    batch.n_tokens = n_ctx
    assert L.llama_decode(ctx, batch) == 0
    logits = np.ctypeslib.as_array(L.llama_get_logits(ctx), shape=(n_ctx - first, n_vocab))  # no copy
    for j in range(n_ctx - first - 1):
        row = logits[j].astype(np.float64)
        m = row.max()
        nll += m + math.log(np.exp(row - m).sum()) - row[w[first + j + 1]]
        count += 1
    print(f"[{start // n_ctx + 1}]{math.exp(nll / count):.4f}", end=" ", flush=True)
print(f"\nFinal estimate: PPL = {math.exp(nll / count):.4f} ({count} tokens scored)")
