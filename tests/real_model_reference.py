"""A float64 forward pass of the two real models' architectures (llama: SmolLM2; gemma3: Gemma 3
270M), written from the architectures' definitions (llama.cpp's graphs for them: src/models/
llama.cpp and gemma3.cpp) on weights dequantized by the gguf package: the reference that
tests/test_real_models.py holds torchggml's logits to. Nothing of torchggml is used.

Weights are dequantized a layer at a time and the output head a block of rows at a time, so a
262k-token head never exists in float64 whole.
"""
from __future__ import annotations

import math

import numpy as np

HEAD_ROWS = 16384  # output-head rows dequantized at a time


class Weights:
    def __init__(self, path):
        import gguf
        self.reader = gguf.GGUFReader(str(path))
        self.tensors = {t.name: t for t in self.reader.tensors}

    def field(self, key, default=None):
        f = self.reader.get_field(key)
        return default if f is None else f.contents()

    def get(self, name: str, rows: slice | None = None) -> np.ndarray:
        """The tensor as float64 [rows, cols] (ggml's ne reversed), optionally some rows only."""
        from gguf.quants import dequantize
        t = self.tensors[name]
        data = t.data if rows is None else t.data[rows]
        return dequantize(np.asarray(data), t.tensor_type).astype(np.float64)

    def n_rows(self, name: str) -> int:
        return int(self.tensors[name].data.shape[0])


def rms_norm(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w


def rope(x: np.ndarray, positions: np.ndarray, base: float, neox: bool) -> np.ndarray:
    """x [n_tokens, n_head, d]: ggml's rope; pairs (i, i + d/2) with neox, else (2i, 2i + 1)."""
    d = x.shape[-1]
    theta = positions[:, None] * base ** (-np.arange(0, d, 2) / d)  # [n_tokens, d/2]
    cos, sin = np.cos(theta)[:, None, :], np.sin(theta)[:, None, :]
    if neox:
        a, b = x[..., : d // 2], x[..., d // 2:]
        return np.concatenate([a * cos - b * sin, a * sin + b * cos], axis=-1)
    a, b = x[..., 0::2], x[..., 1::2]
    out = np.empty_like(x)
    out[..., 0::2], out[..., 1::2] = a * cos - b * sin, a * sin + b * cos
    return out


def attention(q, k, v, scale: float, window: int | None) -> np.ndarray:
    """Causal attention, q [n, n_head, d], k/v [n, n_head_kv, d] (grouped); `window`: a token sees
    the tokens less than `window` positions back (llama.cpp's standard sliding window)."""
    n, n_head, _ = q.shape
    group = n_head // k.shape[1]
    k, v = np.repeat(k, group, axis=1), np.repeat(v, group, axis=1)
    scores = np.einsum("ihd,jhd->hij", q, k) * scale
    i, j = np.arange(n)[:, None], np.arange(n)[None, :]
    masked = (j > i) | ((i - j) >= window if window else False)
    scores = np.where(masked[None], -np.inf, scores)
    scores -= scores.max(axis=-1, keepdims=True)
    p = np.exp(scores)
    p /= p.sum(axis=-1, keepdims=True)
    return np.einsum("hij,jhd->ihd", p, v).reshape(n, -1)


def gelu_tanh(x):
    return 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)))


def silu(x):
    return x / (1 + np.exp(-x))


def logits(path, tokens: list[int]) -> np.ndarray:
    """float64 [len(tokens), n_vocab]: every position's logits."""
    w = Weights(path)
    arch = w.field("general.architecture")
    gemma = arch == "gemma3"
    key = lambda k, d=None: w.field(f"{arch}.{k}", d)  # noqa: E731
    n_layer, n_embd = int(key("block_count")), int(key("embedding_length"))
    n_head, n_head_kv = int(key("attention.head_count")), int(key("attention.head_count_kv"))
    head_dim = int(key("attention.key_length", n_embd // n_head))
    eps = float(key("attention.layer_norm_rms_epsilon"))
    base = float(key("rope.freq_base", 10000.0))
    ids = np.asarray(tokens)
    x = np.stack([w.get("token_embd.weight", slice(t, t + 1))[0] for t in ids])
    if gemma:
        x = x * math.sqrt(n_embd)
    pos = np.arange(len(ids), dtype=np.float64)
    n = len(ids)
    for il in range(n_layer):
        g = lambda name: w.get(f"blk.{il}.{name}.weight")  # noqa: E731
        h = rms_norm(x, g("attn_norm"), eps)
        q = (h @ g("attn_q").T).reshape(n, n_head, head_dim)
        k = (h @ g("attn_k").T).reshape(n, n_head_kv, head_dim)
        v = (h @ g("attn_v").T).reshape(n, n_head_kv, head_dim)
        if gemma:
            swa = il % 6 < 5  # five sliding-window layers, then a global one
            q, k = rms_norm(q, g("attn_q_norm"), eps), rms_norm(k, g("attn_k_norm"), eps)
            layer_base, window = (10000.0, int(key("attention.sliding_window"))) if swa else (base, None)
            q, k = rope(q, pos, layer_base, True), rope(k, pos, layer_base, True)
        else:
            q, k, window = rope(q, pos, base, False), rope(k, pos, base, False), None
        a = attention(q, k, v, 1 / math.sqrt(head_dim), window) @ g("attn_output").T
        if gemma:
            a = rms_norm(a, g("post_attention_norm"), eps)
        x = x + a
        h = rms_norm(x, g("ffn_norm"), eps)
        act = gelu_tanh if gemma else silu
        f = (act(h @ g("ffn_gate").T) * (h @ g("ffn_up").T)) @ g("ffn_down").T
        if gemma:
            f = rms_norm(f, g("post_ffw_norm"), eps)
        x = x + f
    x = rms_norm(x, w.get("output_norm.weight"), eps)
    head = "output.weight" if "output.weight" in w.tensors else "token_embd.weight"
    rows = w.n_rows(head)
    return np.concatenate([x @ w.get(head, slice(r, min(r + HEAD_ROWS, rows))).T
                           for r in range(0, rows, HEAD_ROWS)], axis=1)
