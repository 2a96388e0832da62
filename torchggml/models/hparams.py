"""Hyper-parameters of a GGUF model, read as llama.cpp reads them (llama-model.cpp's common
keys; an architecture file adds its own through `Arch.read_hparams`)."""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from ..gguf.loader import GGUFFile, GGUFError

# rope.scaling.type values llama.cpp knows
ROPE_SCALINGS = ("none", "linear", "yarn", "longrope")


@dataclass
class HParams:
    arch: str
    n_vocab: int
    n_ctx_train: int
    n_embd: int
    n_layer: int
    n_head: int
    n_head_kv: int
    n_ff: int
    head_dim_k: int
    head_dim_v: int
    n_rot: int
    norm_eps: float
    rope_type: int = 0
    # rotary embedding: base, scaling (linear, YaRN, LongRoPE) and the YaRN corrections
    rope_freq_base: float = 10000.0
    rope_freq_scale: float = 1.0
    rope_scaling: str = "none"
    n_ctx_orig: int = 0
    yarn_ext_factor: float = 0.0
    yarn_attn_factor: float = 1.0
    yarn_beta_fast: float = 32.0
    yarn_beta_slow: float = 1.0
    yarn_log_mul: float = 0.0
    yarn_mscale: float = 1.0  # YaRN's mscale (deepseek2 may set it to yarn_log_mul, as llama.cpp)
    # mixture of experts
    n_expert: int = 0
    n_expert_used: int = 0
    n_ff_exp: int = 0
    n_ff_shexp: int = 0
    n_layer_nextn: int = 0  # prediction blocks after the n_layer blocks, skipped (not loaded) as llama.cpp
    n_expert_groups: int = 0  # grouped top-k routing (DeepSeek V3): the groups, and how many are kept
    n_group_used: int = 0
    # sliding-window attention: the window and which layers use it (with their own rope base)
    n_swa: int = 0
    swa_layers: list[bool] = field(default_factory=list)
    swa_chunked: bool = False  # windows are chunks of n_swa positions, not the last n_swa (llama4)
    swa_symmetric: bool = False  # windows reach n_swa // 2 positions both ways (modern-bert, non-causal)
    rope_freq_base_swa: float = 10000.0
    rope_freq_scale_swa: float = 1.0
    # attention scale (0: 1/sqrt(head_dim_k)) and tanh soft-capping (0: off)
    attention_scale: float = 0.0
    attn_temp_scale: float = 0.0  # Llama 4 / mistral3 query temperature (0: off)
    logit_scale: float = 1.0      # command-r's output scale
    attn_softcap: float = 0.0
    final_softcap: float = 0.0
    max_alibi_bias: float = 0.0  # ALiBi (bloom, mpt): the softmax's max_bias over -|p - p0| masks (0: off)
    clamp_kqv: float = 0.0  # q, k and v clamped to [-c, c] after their projections (olmo; 0: off)
    rope_sections: tuple = ()  # multi-axis RoPE: rotary pairs per axis (time, height, width, extra)
    n_deepstack: int = 0  # qwen3vl: input rows carry this many more n_embd slices, added after the first layers
    # encoders: attention over the whole sequence (attention.causal false), the classifier head's outputs
    causal_attn: bool = True
    n_cls_out: int = 1
    moe_every_n_layers: int = 0  # nomic-bert-moe: layers il with il % n == 1 have experts (0: none)
    dense_2_out: int = 0        # gemma-embedding's projections of the pooled vectors: dense_2's outputs,
    dense_3_in: int = 0         # dense_3's inputs (0: none)
    n_token_types: int = 0      # tokenizer.ggml.token_type_count (bert's token_types rows)
    ffn_act: str = "gelu"       # the FFN's activation where a file names it (modern-bert's hidden_activation)
    pooling_type_cls: int = -1  # classifier.pooling_type: what the rank head pools (1 mean, else the first token)
    # layers of several shapes (gemma4, gemma3n): the windowed layers' head sizes and rotary
    # dimensions (0: the dense layers'), the KV heads of each layer (empty: n_head_kv), and the
    # layers with a KV cache of their own: the first n_layer_kv (0: all; the others reuse one)
    head_dim_k_swa: int = 0
    head_dim_v_swa: int = 0
    n_rot_swa: int = 0
    n_head_kv_layers: list[int] = field(default_factory=list)
    n_layer_kv: int = 0
    n_embd_per_layer: int = 0   # per-layer token embeddings' width (gemma3n, gemma4; 0: none)
    nodes_per_layer: int = 64   # the graph's size per layer (gemma3n's AltUp layers need more)

    @property
    def n_embd_inp(self) -> int:
        """The width of input embedding rows (llama.cpp's n_embd_inp): n_embd, and qwen3vl's deepstack slices."""
        return self.n_embd * (1 + self.n_deepstack)

    @property
    def n_embd_k_gqa(self) -> int:
        return self.head_dim_k * self.n_head_kv

    @property
    def n_embd_v_gqa(self) -> int:
        return self.head_dim_v * self.n_head_kv

    @property
    def kq_scale(self) -> float:
        return self.attention_scale or 1.0 / math.sqrt(self.head_dim_k)

    def is_swa(self, il: int) -> bool:
        return bool(self.swa_layers) and self.swa_layers[il]

    def head_dims(self, il: int) -> tuple[int, int]:
        """Layer il's (head_dim_k, head_dim_v)."""
        if self.head_dim_k_swa and self.is_swa(il):
            return self.head_dim_k_swa, self.head_dim_v_swa
        return self.head_dim_k, self.head_dim_v

    def layer_n_rot(self, il: int) -> int:
        return self.n_rot_swa if self.n_rot_swa and self.is_swa(il) else self.n_rot

    def layer_n_head_kv(self, il: int) -> int:
        return self.n_head_kv_layers[il] if self.n_head_kv_layers else self.n_head_kv

    def kv_dims(self, il: int) -> tuple[int, int, int]:
        """Layer il's KV cache rows: (head_dim_k, head_dim_v, n_head_kv)."""
        return (*self.head_dims(il), self.layer_n_head_kv(il))

    def has_kv(self, il: int) -> bool:
        """Whether layer il stores K and V of its own (llama.cpp's has_kv)."""
        return not self.n_layer_kv or il < self.n_layer_kv

    def set_swa_pattern(self, n_pattern: int) -> None:
        """llama.cpp's pattern: of every n_pattern layers the last one is dense, the rest slide
        (n_pattern 0 or 1: every layer slides only when 0)."""
        self.swa_layers = [n_pattern == 0 or il % n_pattern < n_pattern - 1 for il in range(self.n_layer)]

    def rope_base_scale(self, il: int) -> tuple[float, float]:
        if self.is_swa(il):
            return self.rope_freq_base_swa, self.rope_freq_scale_swa
        return self.rope_freq_base, self.rope_freq_scale


class KeyReader:
    """`{arch}.suffix` keys of one file; a per-layer array must be uniform unless asked for."""

    def __init__(self, f: GGUFFile):
        self.f, self.arch = f, f.arch

    def has(self, suffix: str) -> bool:
        return self.f.arch_get(suffix, None) is not None

    def get(self, suffix: str, default=...):
        value = self.f.arch_get(suffix) if default is ... else self.f.arch_get(suffix, default)
        if isinstance(value, list):
            if not value or any(v != value[0] for v in value):
                raise GGUFError(f"{self.f.path}: {self.arch}.{suffix} varies per layer ({value}); not supported")
            value = value[0]
        return value

    def get_list(self, suffix: str):
        return self.f.arch_get(suffix, None)


def read_hparams(f: GGUFFile, arch) -> HParams:
    """The keys every architecture shares (llama_model::load_hparams), then the architecture's
    own (`arch.read_hparams`), then the rotary corrections derived from them (llama_context)."""
    keys = KeyReader(f)
    get = keys.get
    per_layer = getattr(arch, "per_layer_keys", ())

    def get_max(suffix, default=...):
        """A per-layer array the architecture reads itself (arch.per_layer_keys; hybrids give
        0 KV heads to their recurrent layers): its largest value here."""
        value = keys.get_list(suffix) if suffix in per_layer else None
        return max(value) if isinstance(value, list) else get(suffix, default)

    n_embd = int(get("embedding_length"))
    # recurrent models (mamba, rwkv) have no attention heads: head_count 0 or absent
    n_head = int(get_max("attention.head_count", 0 if getattr(arch, "memory", "kv") != "kv" else ...))
    head_dim_k = int(get("attention.key_length", n_embd // n_head if n_head else 0))
    n_vocab = _vocab_size(f)
    n_layer = int(get("block_count"))
    eps = get("attention.layer_norm_rms_epsilon", None)
    if eps is None:
        eps = get("attention.layer_norm_epsilon")
    hp = HParams(
        arch=f.arch, n_vocab=n_vocab, n_ctx_train=int(get("context_length")), n_embd=n_embd,
        n_layer=n_layer, n_head=n_head, n_head_kv=int(get_max("attention.head_count_kv", n_head)),
        n_ff=int(get_max("feed_forward_length", 0)), head_dim_k=head_dim_k,
        head_dim_v=int(get("attention.value_length", n_embd // n_head if n_head else 0)),
        n_rot=int(get("rope.dimension_count", head_dim_k)), norm_eps=float(eps), rope_type=int(arch.rope_type),
        rope_freq_base=float(get("rope.freq_base", 10000.0)),
        n_expert=int(get("expert_count", 0)), n_expert_used=int(get("expert_used_count", 0)),
        n_ff_exp=int(get("expert_feed_forward_length", 0)),
        n_ff_shexp=int(get("expert_shared_feed_forward_length", 0)),
    )
    if hp.n_expert and not 0 < hp.n_expert_used <= hp.n_expert:
        raise GGUFError(f"{f.path}: {f.arch}.expert_used_count {hp.n_expert_used} must be in 1..{hp.n_expert}")
    hp.n_expert_groups = int(get("expert_group_count", 0))
    hp.n_group_used = int(get("expert_group_used_count", 0))
    if hp.n_expert_groups > 1 and (hp.n_expert % hp.n_expert_groups or not 0 < hp.n_group_used < hp.n_expert_groups):
        raise GGUFError(f"{f.path}: {f.arch}.expert_group_count {hp.n_expert_groups} / expert_group_used_count "
                        f"{hp.n_group_used} do not split {hp.n_expert} experts")
    hp.causal_attn = bool(get("attention.causal", True))
    labels = keys.get_list("classifier.output_labels")
    hp.n_cls_out = len(labels) if labels else 1
    hp.pooling_type_cls = int(get("classifier.pooling_type", -1))
    _read_rope_scaling(keys, hp)
    arch.read_hparams(hp, keys)
    _derive_yarn(hp)
    return hp


INTEGER_TYPES = ("I8", "I16", "I32", "I64")


def _vocab_size(f: GGUFFile) -> int:
    """n_vocab: token_embd's second dimension, which must match the file's vocabulary when it has
    one (llama.cpp sizes the embedding by the vocabulary and refuses any other shape)."""
    embd = f.tensor_info("token_embd.weight")
    if len(embd.ne) < 2:
        raise GGUFError(f"{f.path}: tensor 'token_embd.weight' has shape {list(embd.ne)}, expected "
                        f"[n_embd, n_vocab]")
    if embd.type.name in INTEGER_TYPES:  # llama.cpp cannot look rows up in them: refused at load
        raise GGUFError(f"{f.path}: tensor 'token_embd.weight' has type {embd.type.name}; token embeddings must "
                        f"be float or quantized")
    model = f.get("tokenizer.ggml.model", None)
    if model not in (None, "none", "no_vocab") and f.array_length("tokenizer.ggml.tokens") is None:
        raise GGUFError(f"{f.path}: 'tokenizer.ggml.model' is {model!r} but the file has no token list "
                        f"'tokenizer.ggml.tokens' (llama.cpp: cannot find tokenizer vocab)")
    sizes = {f"{f.arch}.vocab_size": f.get(f"{f.arch}.vocab_size", None),
             "tokenizer.ggml.tokens": f.array_length("tokenizer.ggml.tokens")}
    if all(n is None for n in sizes.values()):  # llama.cpp sizes token_embd by one of them
        raise GGUFError(f"{f.path}: the vocabulary size is unknown: the file has neither metadata key "
                        f"'{f.arch}.vocab_size' nor 'tokenizer.ggml.tokens'")
    for key, n in sizes.items():
        if n is not None and n != embd.ne[1]:
            raise GGUFError(f"{f.path}: tensor 'token_embd.weight' has shape {list(embd.ne)}, but '{key}' "
                            f"says the vocabulary has {n} tokens")
    return int(embd.ne[1])


def _read_rope_scaling(keys: KeyReader, hp: HParams) -> None:
    """rope.scaling.*: the type and the factor (freq_scale = 1/factor)."""
    get = keys.get
    scaling = str(get("rope.scaling.type", "linear")).lower()
    if scaling not in ROPE_SCALINGS:
        raise GGUFError(f"{keys.f.path}: rope scaling {scaling!r} is not supported ({', '.join(ROPE_SCALINGS)})")
    factor = float(get("rope.scaling.factor", 0.0) or get("rope.scale_linear", 0.0) or 0.0)
    hp.rope_scaling = scaling
    hp.rope_freq_scale = 1.0 if scaling == "none" or factor == 0.0 else 1.0 / factor
    hp.n_ctx_orig = int(get("rope.scaling.original_context_length", hp.n_ctx_train))
    hp.yarn_attn_factor = float(get("rope.scaling.attn_factor", 1.0))  # multiplied into the derived one


def _derive_yarn(hp: HParams) -> None:
    """YaRN's extrapolation mix and attention factor, exactly as llama_context derives them."""
    rope_attn_factor, hp.yarn_attn_factor = hp.yarn_attn_factor, 1.0
    hp.yarn_ext_factor = 1.0 if hp.rope_scaling == "yarn" else 0.0
    if hp.yarn_ext_factor != 0.0:
        def mscale(scale: float, m: float) -> float:
            return 1.0 if scale <= 1.0 else 0.1 * m * math.log(scale) + 1.0
        scale = 1.0 / hp.rope_freq_scale
        log_mul = hp.yarn_log_mul
        hp.yarn_attn_factor = (mscale(scale, hp.yarn_mscale) / mscale(scale, log_mul) if log_mul
                               else mscale(scale, hp.yarn_mscale))
        # rope_ext multiplies by the same mscale again when ext_factor != 0: cancel it here
        hp.yarn_attn_factor /= 1.0 + 0.1 * math.log(scale)
    hp.yarn_attn_factor *= rope_attn_factor


def read_swa_pattern(hp: HParams, keys: KeyReader, n_pattern: int) -> None:
    """attention.sliding_window_pattern: a per-layer bool array, or the period (llama.cpp's
    load_swa_pattern); `n_pattern` when the file has neither."""
    value = keys.get_list("attention.sliding_window_pattern")
    if isinstance(value, list):
        if len(value) != hp.n_layer:
            raise GGUFError(f"{keys.f.path}: {keys.arch}.attention.sliding_window_pattern has {len(value)} "
                            f"entries for {hp.n_layer} layers")
        hp.swa_layers = [bool(v) for v in value]
    else:
        hp.set_swa_pattern(int(value) if value is not None else n_pattern)
