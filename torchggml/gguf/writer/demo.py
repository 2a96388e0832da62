"""The built-in demo model: seeded random weights and a small byte-level BPE vocabulary that the
project trains itself (with `tokenizers`) on the text below, written as a GGUF file.

`torchggml run` with no model uses it, so the command works offline. The weights are random,
so the text it generates is gibberish made of real vocabulary pieces. The same writer makes the
larger benchmark models (scripts/bench_model.py).
"""
from __future__ import annotations

import hashlib
import json
import os
import tempfile
from dataclasses import dataclass, asdict, replace

import numpy as np
import torch

from ... import config

# The demo vocabulary's training text (written for this project).
CORPUS = """\
Once upon a time there was a small program that wanted to run a language model on any device.
It read the weights from a file, placed every layer where there was room, and computed one token
after another. The first token took a while, because the prompt had to be processed; the next
tokens came quickly, one at a time, each one looking back at everything that came before it.
The program kept a cache of keys and values, so that it never had to compute the past again.
When the cache was full, it stopped, and printed how many tokens it had made every second.
The people who used it wanted three things: the same answers as the reference, a clear error
when a file was broken, and speed. They measured the error of every model against the numbers
the reference had written down, and they were happy when the difference was small.
A graph is a list of operations. Each operation reads tensors and writes a tensor. The memory
planner gives every tensor an address, and reuses the memory of tensors that are no longer needed.
The scheduler cuts the graph where the device changes, and copies the inputs of each part to the
device that runs it. Matrix products are the largest cost; the rest is normalisation, rotation of
positions, attention, and a few additions. Numbers 0 1 2 3 4 5 6 7 8 9 10 100 1000, and some
punctuation: commas, periods. Questions? Answers! "Quotes" and (brackets) [too] {also}.
"""


@dataclass(frozen=True)
class ModelConfig:
    arch: str = "llama"
    n_embd: int = 256
    n_layer: int = 4
    n_head: int = 8
    n_head_kv: int = 4
    n_ff: int = 768
    n_ctx: int = 512
    n_vocab: int = 512          # target size of the trained vocabulary
    rms_eps: float = 1e-5
    rope_freq_base: float = 10000.0
    tied_output: bool = False


DEMO_CONFIG = ModelConfig()
DEMO_SEED = 1234
GENERATOR_VERSION = 2  # part of the cached files' names: bump when the generated weights change


# ---------------------------------------------------------------- vocabulary

@dataclass
class Vocab:
    tokens: list[str]   # byte-level BPE token texts (GPT-2's byte alphabet), id order
    types: list[int]    # tokenizer.ggml.token_type: 1 normal, 3 control
    merges: list[str]   # "left right", highest priority first
    bos_id: int
    eos_id: int


def train_vocab(n_vocab: int, corpus: str = CORPUS) -> Vocab:
    """A byte-level BPE vocabulary of up to n_vocab tokens: <s>, </s>, the 256 byte symbols and
    the merges `tokenizers`' BPE trainer learns from `corpus`."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    specials = ["<s>", "</s>"]
    hf = Tokenizer(models.BPE())
    hf.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(vocab_size=n_vocab, special_tokens=specials, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    hf.train_from_iterator([corpus], trainer)
    model = json.loads(hf.to_str())["model"]
    vocab = sorted(model["vocab"].items(), key=lambda kv: kv[1])
    tokens = [text for text, _ in vocab]
    if [i for _, i in vocab] != list(range(len(tokens))):
        raise RuntimeError("the trained vocabulary's ids are not contiguous")
    merges = [m if isinstance(m, str) else " ".join(m) for m in model["merges"]]
    types = [3 if t in specials else 1 for t in tokens]
    return Vocab(tokens, types, merges, tokens.index("<s>"), tokens.index("</s>"))


def add_vocab(writer, vocab: Vocab, tokenizer_pre: str = "gpt-2") -> None:
    """The vocabulary's tokenizer keys (byte-level BPE, BOS added)."""
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre(tokenizer_pre)
    writer.add_token_list(vocab.tokens)
    writer.add_token_types(vocab.types)
    writer.add_token_merges(vocab.merges)
    writer.add_bos_token_id(vocab.bos_id)
    writer.add_eos_token_id(vocab.eos_id)
    writer.add_add_bos_token(True)


# ---------------------------------------------------------------- weights and file

def output_row_scales(vocab: Vocab) -> np.ndarray:
    """Scales for the output head's rows, so that random weights still favour whole words: merged
    tokens x3 (their logits spread wider and win the softmax), printable ASCII bytes x1, control
    bytes, lone UTF-8 bytes and special tokens x0."""
    def scale(text: str, type: int) -> float:
        if type != 1:
            return 0.0
        if len(text) > 1:
            return 3.0
        return 1.0 if text == "\u0120" or 0x21 <= ord(text) <= 0x7E else 0.0
    return np.array([scale(t, ty) for t, ty in zip(vocab.tokens, vocab.types)], dtype=np.float32)


def random_weights(cfg: ModelConfig, n_vocab: int, seed: int, output_scales: np.ndarray | None = None) -> dict[str, np.ndarray]:
    """Seeded random weights (numpy, torch order) with scales that keep activations O(1);
    `output_scales` scales the rows of an untied output head."""
    return dict(weight_stream(cfg, n_vocab, seed, output_scales))


def weight_stream(cfg: ModelConfig, n_vocab: int, seed: int, output_scales: np.ndarray | None = None):
    """random_weights' (name, float32 array) pairs, made one at a time in file order (a 1B model's
    weights need not all be in memory at once)."""
    gen = torch.Generator().manual_seed(seed)
    head_dim = cfg.n_embd // cfg.n_head
    kv_dim = head_dim * cfg.n_head_kv

    def mat(rows, cols):  # ggml ne [cols, rows]
        return (torch.randn(rows, cols, generator=gen) / cols ** 0.5).numpy()

    def norm(n):
        return (1.0 + 0.1 * torch.randn(n, generator=gen)).numpy()

    yield "token_embd.weight", torch.randn(n_vocab, cfg.n_embd, generator=gen).numpy()
    for il in range(cfg.n_layer):
        p = f"blk.{il}."
        yield p + "attn_norm.weight", norm(cfg.n_embd)
        yield p + "attn_q.weight", mat(cfg.n_embd, cfg.n_embd)
        yield p + "attn_k.weight", mat(kv_dim, cfg.n_embd)
        yield p + "attn_v.weight", mat(kv_dim, cfg.n_embd)
        yield p + "attn_output.weight", mat(cfg.n_embd, cfg.n_embd)
        if cfg.arch == "qwen2":
            for name, n in (("attn_q.bias", cfg.n_embd), ("attn_k.bias", kv_dim), ("attn_v.bias", kv_dim)):
                yield p + name, (0.1 * torch.randn(n, generator=gen)).numpy()
        if cfg.arch == "qwen3":
            yield p + "attn_q_norm.weight", norm(head_dim)
            yield p + "attn_k_norm.weight", norm(head_dim)
        yield p + "ffn_norm.weight", norm(cfg.n_embd)
        yield p + "ffn_gate.weight", mat(cfg.n_ff, cfg.n_embd)
        yield p + "ffn_up.weight", mat(cfg.n_ff, cfg.n_embd)
        yield p + "ffn_down.weight", mat(cfg.n_embd, cfg.n_ff)
    yield "output_norm.weight", norm(cfg.n_embd)
    if not cfg.tied_output:
        out = mat(n_vocab, cfg.n_embd)
        if output_scales is not None:
            out *= output_scales[:, None]
        yield "output.weight", out


def write_model(path, cfg: ModelConfig = DEMO_CONFIG, weight_type: str = "F32", seed: int = DEMO_SEED,
                rope_scaling_factor: float | None = None, rope_freqs: np.ndarray | None = None,
                chat_template: str | None = None, tokenizer_pre: str = "gpt-2") -> str:
    """Write a llama/qwen2/qwen3 GGUF with random weights and the trained vocabulary. 2-D weights
    are stored as `weight_type` (F32, F16 or any type gguf.quants can quantize, e.g. Q4_0, Q8_0);
    norms and biases stay F32. Optionally linear rope scaling (metadata) or per-pair rope
    frequency divisors (a rope_freqs.weight tensor, as Llama 3.1 files have)."""
    import gguf
    qtype = gguf.GGMLQuantizationType[weight_type.upper()]
    vocab = train_vocab(cfg.n_vocab)
    n_vocab = len(vocab.tokens)
    head_dim = cfg.n_embd // cfg.n_head
    path = os.fspath(path)
    tmp = f"{path}.{os.getpid()}.tmp"
    w = gguf.GGUFWriter(tmp, cfg.arch)
    w.add_name(f"torchggml demo {cfg.arch} {weight_type.upper()}")
    w.add_context_length(cfg.n_ctx)
    w.add_embedding_length(cfg.n_embd)
    w.add_block_count(cfg.n_layer)
    w.add_feed_forward_length(cfg.n_ff)
    w.add_head_count(cfg.n_head)
    w.add_head_count_kv(cfg.n_head_kv)
    w.add_rope_dimension_count(head_dim)
    w.add_key_length(head_dim)
    w.add_value_length(head_dim)
    w.add_layer_norm_rms_eps(cfg.rms_eps)
    w.add_rope_freq_base(cfg.rope_freq_base)
    w.add_vocab_size(n_vocab)
    add_vocab(w, vocab, tokenizer_pre)
    if chat_template:
        w.add_chat_template(chat_template)
    if rope_scaling_factor is not None:
        w.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        w.add_rope_scaling_factor(rope_scaling_factor)
    scales = output_row_scales(vocab)

    def tensors():
        if rope_freqs is not None:
            yield "rope_freqs.weight", np.asarray(rope_freqs, dtype=np.float32)
        yield from weight_stream(cfg, n_vocab, seed, scales)
    write_tensors(w, tensors, qtype)
    os.replace(tmp, path)
    return path


def write_tensors(writer, weights, qtype, keep_f32=lambda name, data: False) -> None:
    """Add the tensors (matrices as qtype: F32, F16 or quantized by gguf.quants; vectors, and
    those keep_f32 names, as F32) and write the file. `weights`: a dict of arrays, or a function
    returning (name, array) pairs afresh, called twice (the shapes for the header, then the data
    tensor by tensor), so that only one tensor is in memory at a time."""
    import gguf
    pairs = weights if callable(weights) else lambda: iter(weights.items())

    def stored(name, data):  # (how the tensor is stored: an array or None for quantized, its raw type)
        if data.ndim == 1 or qtype == gguf.GGMLQuantizationType.F32 or keep_f32(name, data):
            return data, None
        if qtype == gguf.GGMLQuantizationType.F16:
            return data.astype(np.float16), None
        return None, qtype

    for name, data in pairs():
        array, raw = stored(name, data)
        if raw is None:
            writer.add_tensor_info(name, array.shape, array.dtype, array.nbytes)
        else:
            shape = gguf.quant_shape_to_byte_shape(data.shape, raw)
            writer.add_tensor_info(name, shape, np.dtype(np.uint8), int(np.prod(shape)), raw_dtype=raw)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    for name, data in pairs():
        array, raw = stored(name, data)
        writer.write_tensor_data(array if raw is None else gguf.quants.quantize(data, raw))
    writer.close()


def cache_dir() -> str:
    """Where generated models live: $TORCHGGML_CACHE, else ~/.cache/torchggml (else a temp dir)."""
    d = os.path.expanduser(config.value("TORCHGGML_CACHE"))
    try:
        os.makedirs(d, exist_ok=True)
    except OSError:
        d = os.path.join(tempfile.gettempdir(), "torchggml")
        os.makedirs(d, exist_ok=True)
    return d


def generated_model(cfg: ModelConfig = DEMO_CONFIG, weight_type: str = "F32", seed: int = DEMO_SEED,
                    directory: str | None = None) -> str:
    """The path of a generated model, written on first use (named by a hash of its recipe)."""
    recipe = json.dumps([GENERATOR_VERSION, asdict(cfg), weight_type.upper(), seed, CORPUS], sort_keys=True)
    digest = hashlib.sha256(recipe.encode()).hexdigest()[:12]
    name = f"{cfg.arch}-{cfg.n_embd}x{cfg.n_layer}-{weight_type.upper()}-{digest}.gguf"
    path = os.path.join(directory or cache_dir(), name)
    if not os.path.exists(path):
        write_model(path, cfg, weight_type, seed)
    return path


def demo_model_path(directory: str | None = None) -> str:
    """The built-in demo model (llama, dim 256, 4 layers, F32 weights), written on first use."""
    return generated_model(DEMO_CONFIG, "F32", DEMO_SEED, directory)


# ~100M parameters, for scripts/bench_model.py
BENCH_CONFIG = replace(DEMO_CONFIG, n_embd=768, n_layer=12, n_head=12, n_head_kv=12, n_ff=3072, n_ctx=1024)
