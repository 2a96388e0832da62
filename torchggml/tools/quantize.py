"""`torchggml quantize IN OUT TYPE`: llama-quantize's file types and mixes through torchggml.quants.

A file type (Q4_K_M, Q8_0, ...) names a default block type and, for the K mixes, llama.cpp's rules
(llama-quant.cpp) for tensors that get more bits:
- only weights ("*.weight") of 2 or more dimensions are quantized; norms, the MoE router
  (ffn_gate_inp), position embeddings and token types keep their type;
- output.weight (token_embd.weight when the output is tied to it) gets Q6_K unless the default
  is Q8_0; Q8_0 when its rows do not split into the default type's blocks;
- attn_v (and attn_qkv, attn_kv_b): Q2_K -> Q3_K (Q4_K with GQA >= 4), Q3_K_M -> Q5_K in the first
  two layers else Q4_K, Q3_K_L -> Q5_K, Q4_K_M/Q5_K_M -> Q6_K in "more bits" layers (the first and
  last eighth and every third between), Q4_K_S -> Q5_K in the first four layers, IQ4_NL/IQ4_XS
  -> Q5_K with GQA >= 4; a 70B llama (80 layers) gets Q5_K for Q3_K/Q4_K; 8 experts -> Q8_0;
- attn_k: 8 experts -> Q8_0;
- ffn_down: Q2_K -> Q3_K, Q2_K_S -> Q4_K in the first eighth, Q3_K_M -> Q5_K in the first
  sixteenth else Q4_K, Q3_K_L -> Q5_K, Q4_K_M/Q5_K_M -> Q6_K in "more bits" layers, Q4_K_S -> Q5_K
  and IQ4_NL/IQ4_XS -> Q5_K in the first eighth;
- attn_output: Q2_K -> Q3_K, Q3_K_M -> Q4_K, Q3_K_L -> Q5_K (with 8 experts: Q5_K for the K
  mixes);
- a tensor whose rows do not split into its type's blocks falls back (Q4_K -> Q5_0, Q5_K ->
  Q5_1, Q6_K -> Q8_0, Q2_K/Q3_K -> Q4_0, IQ4_XS -> IQ4_NL; F16 when that fails too).
With an importance matrix (--imatrix), llama.cpp's rules that depend on one apply too: IQ4_NL/
IQ4_XS keep ffn_down at their type, Q4_0/Q5_0 give the first eighth's ffn_down Q4_1/Q5_1.
Every tensor is read from the source's mapping in chunks of rows as float32 (dequantized by the
native dequantizers, devices/cpu/dequantize.py, when it is quantized, which needs --allow-requantize)
and quantized by the native kernels (devices/cpu/quantize.py: ggml_quantize_chunk's bytes, with the
tensor's importance-matrix slice) or, for the types they lack, the reference quantizers; the output
is written tensor by tensor (gguf/writer/stream.py) in llama-quantize's order (by layer, then name)
with its metadata (the input's records as they are, general.quantization_version and
general.file_type last, then quantize.imatrix.*), so that the file is byte for byte
llama-quantize's. A split source is read from its first file; --keep-split writes one output file
per input file, as llama-quantize.
"""
from __future__ import annotations

import contextlib
import os
import re
import sys
import time

import numpy as np
import torch

from ..types import Type, blck_size

from .file_types import ALIASES, CHOICES, FILE_TYPE_IDS

# file type -> (id as llama.cpp numbers it, default block type)
FILE_TYPES = {name: (ftype_id, Type[block]) for name, (ftype_id, block) in FILE_TYPE_IDS.items()}

GRID_TYPES = (Type.IQ1_S, Type.IQ1_M, Type.IQ2_XXS, Type.IQ2_XS, Type.IQ2_S, Type.IQ3_XXS, Type.IQ3_S)
FALLBACK = {Type.Q2_K: Type.Q4_0, Type.Q3_K: Type.Q4_0, Type.Q4_K: Type.Q5_0, Type.Q5_K: Type.Q5_1,
            Type.Q6_K: Type.Q8_0, Type.IQ4_XS: Type.IQ4_NL, Type.TQ1_0: Type.Q4_0, Type.TQ2_0: Type.Q4_0,
            **{t: Type.IQ4_NL for t in GRID_TYPES}}
# the mixes of 2 bits and below share their rules (llama-quant.cpp)
LOW_BIT_MIXES = ("IQ2_XXS", "IQ2_XS", "IQ1_S", "IQ2_S", "IQ2_M", "IQ1_M")
# llama-quantize refuses these target types without an importance matrix (but for the embeddings
# and output.weight), and Q2_K in a Q2_K_S file
IMATRIX_TYPES = (Type.IQ3_XXS, Type.IQ2_XXS, Type.IQ2_XS, Type.IQ2_S, Type.IQ1_M, Type.IQ1_S)


def file_type(name: str) -> str:
    key = name.upper()
    key = ALIASES.get(key, key)
    if key not in FILE_TYPES:
        raise ValueError(f"quantize: unknown type {name!r}; choose one of {CHOICES}")
    return key


def block_type(name: str, what: str = "type") -> Type:
    """A ggml type by its name (case-insensitive), as llama-quantize's --output-tensor-type,
    --token-embedding-type and --tensor-type take it."""
    try:
        return Type[name.upper()]
    except KeyError:
        raise ValueError(f"quantize: unknown {what} {name!r}; choose one of "
                         f"{', '.join(t.name for t in Type)}") from None


def tensor_type_option(text: str) -> tuple[str, Type]:
    """--tensor-type PATTERN=TYPE: the pattern lower-cased (a regular expression searched in
    tensor names, as llama-quantize's std::regex_search) and the type."""
    pattern, sep, name = text.partition("=")
    if not sep or not pattern or not name:
        raise ValueError(f"quantize: --tensor-type {text!r}: expected PATTERN=TYPE (e.g. attn_q=q8_0)")
    try:
        re.compile(pattern.lower())
    except re.error as e:
        raise ValueError(f"quantize: --tensor-type {text!r}: bad regular expression: {e}") from None
    return pattern.lower(), block_type(name, f"type in --tensor-type {text!r}")


def more_bits(i: int, n: int) -> bool:
    """llama.cpp's use_more_bits: the first and last eighth of the layers and every third between."""
    return i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2


def is_quantizable(name: str, n_dims: int) -> bool:
    return (n_dims >= 2 and name.endswith("weight") and "_norm.weight" not in name
            and "ffn_gate_inp.weight" not in name and name not in ("position_embd.weight", "token_types.weight"))


def _category(name: str) -> str:
    if name == "output.weight":
        return "output"
    if name == "token_embd.weight":
        return "token_embd"
    # attn_qkv and attn_kv_b follow attn_v's rules (llama.cpp tests attn_v-like tensors first)
    for key, cat in (("attn_qkv.weight", "attn_v"), ("attn_kv_b.weight", "attn_v"), ("attn_v.weight", "attn_v"),
                     ("attn_k.weight", "attn_k"), ("attn_q.weight", "attn_q"), ("attn_output.weight", "attn_output"),
                     ("ffn_up", "ffn_up"), ("ffn_gate", "ffn_gate"), ("ffn_down", "ffn_down")):
        if key in name:
            return cat
    return "other"


class Mix:
    """The tensor types of one file type for one model (its layer count, GQA, experts, tying)
    and llama-quantize's per-tensor options: output_type / embedding_type (--output-tensor-type,
    --token-embedding-type), patterns [(regex, type)] (--tensor-type), pure (--pure: the default
    type everywhere but where an option says), quantize_output (False: --leave-output-tensor)."""

    def __init__(self, ftype: str, arch: str, n_layer: int, n_gqa: int, n_expert: int, tied_output: bool,
                 has_imatrix: bool = False, output_type: Type | None = None, embedding_type: Type | None = None,
                 patterns=(), pure: bool = False, quantize_output: bool = True, order=None):
        self.ftype, self.default = ftype, FILE_TYPES[ftype][1]
        self.arch, self.n_layer, self.n_gqa, self.n_expert, self.tied = arch, n_layer, n_gqa, n_expert, tied_output
        self.has_imatrix = has_imatrix
        self.output_type, self.embedding_type = output_type, embedding_type
        self.patterns = [(re.compile(p), t) for p, t in patterns]
        self.pure, self.quantize_output = pure, quantize_output
        # llama.cpp counts attn_v, ffn_down, ffn_gate and ffn_up tensors in the order it quantizes
        # them and takes the count as the layer (the name's, for experts' ffn tensors): the same
        # as the name's layer in its usual order (by layer), not in --keep-split's (each file as
        # it is, e.g. blk.1, blk.10, blk.11, ...)
        self.ordinals = {}
        seen: dict[str, int] = {}
        for name in order or ():
            cat = _category(name)
            if cat in ("attn_v", "ffn_down", "ffn_gate", "ffn_up"):
                self.ordinals[name] = seen.get(cat, 0)
                seen[cat] = self.ordinals[name] + 1

    def type_for(self, name: str, ne: list[int], current: Type) -> Type:
        """llama_tensor_get_type: the options, then the mix's rules, then the fallback for rows
        that do not split into the type's blocks."""
        if not is_quantizable(name, len(ne)) or (name == "output.weight" and not self.quantize_output):
            return current
        cat = _category(name)
        if self.embedding_type is not None and cat == "token_embd":
            return self.embedding_type
        if self.output_type is not None and cat == "output":
            return self.output_type
        t = self.default
        if t in (Type.F32, Type.F16, Type.BF16):
            return t
        manual = next((pt for p, pt in self.patterns if p.search(name)), None)
        if manual is not None:
            t = manual
        elif not self.pure:
            t = self._mixed(name, ne, t)
        if ne[0] % blck_size(t):
            t = FALLBACK.get(t, t)
            if ne[0] % blck_size(t):
                t = Type.F16
        return t

    def _mixed(self, name: str, ne: list[int], t: Type) -> Type:
        f, cat = self.ftype, _category(name)
        m = re.match(r"blk\.(\d+)\.", name)
        il, n = (int(m.group(1)) if m else 0), self.n_layer
        gqa, n_exp = self.n_gqa, self.n_expert
        if name in self.ordinals and (cat == "attn_v" or n_exp <= 1):
            il = self.ordinals[name]
        if cat == "output" or (cat == "token_embd" and self.tied):
            if self.output_type is not None:
                return self.output_type
            if ne[0] % blck_size(t):
                return Type.Q8_0
            if f in LOW_BIT_MIXES or f == "IQ3_XXS":
                return Type.Q5_K
            return t if t == Type.Q8_0 else Type.Q6_K
        if cat == "token_embd":
            if f in ("IQ2_XXS", "IQ2_XS", "IQ1_S", "IQ1_M"):
                return Type.Q2_K
            return Type.IQ3_S if f in ("IQ2_S", "IQ2_M", "IQ3_XXS") else t
        if f in LOW_BIT_MIXES:
            s_or_m = f in ("IQ2_S", "IQ2_M")
            if cat == "attn_v":
                return Type.Q4_K if gqa >= 4 or n_exp >= 4 else Type.IQ3_S if s_or_m else Type.Q2_K
            if cat == "attn_k" and n_exp == 8:
                return Type.Q4_K
            if cat == "ffn_down" and il < n // 8:
                return Type.IQ3_S if s_or_m else Type.Q2_K
            if cat == "attn_output":
                if n_exp == 8:
                    return Type.Q5_K
                return Type.IQ2_XXS if f in ("IQ1_S", "IQ1_M") else Type.IQ3_S if s_or_m else t
            return t
        if cat == "attn_v":
            if f == "Q2_K":
                t = Type.Q4_K if gqa >= 4 else Type.Q3_K
            elif f == "Q2_K_S" and gqa >= 4:
                t = Type.Q4_K
            elif f == "IQ3_XXS":
                t = Type.Q4_K if gqa >= 4 else Type.IQ3_XXS if self.has_imatrix else Type.IQ3_S
            elif f in ("IQ3_XS", "IQ3_S") and gqa >= 4:
                t = Type.Q4_K
            elif f == "IQ3_M":
                t = Type.Q4_K
            elif f == "Q3_K_M":
                t = Type.Q5_K if il < 2 else Type.Q4_K
            elif f == "Q3_K_L":
                t = Type.Q5_K
            elif f in ("IQ4_NL", "IQ4_XS") and gqa >= 4:
                t = Type.Q5_K
            elif f in ("Q4_K_M", "Q5_K_M") and more_bits(il, n):
                t = Type.Q6_K
            elif f == "Q4_K_S" and il < 4:
                t = Type.Q5_K
            if self.arch == "llama" and n == 80 and t in (Type.Q3_K, Type.Q4_K):
                t = Type.Q5_K  # llama.cpp's 70B rule
            if n_exp == 8:
                t = Type.Q8_0
        elif cat in ("attn_k", "attn_q"):
            if cat == "attn_k" and n_exp == 8:
                t = Type.Q8_0
            elif f == "IQ3_XS":
                t = Type.IQ3_XXS
            elif f == "IQ3_XXS":
                t = Type.IQ2_S
        elif cat == "ffn_down":
            if f == "Q2_K":
                t = Type.Q3_K
            elif f == "Q2_K_S":
                if il < n // 8:
                    t = Type.Q4_K
            elif f == "IQ3_XXS" and not self.has_imatrix:
                t = Type.Q4_K if il < n // 8 else Type.Q3_K
            elif f == "Q3_K_M":
                t = Type.Q5_K if il < n // 16 else Type.Q4_K
            elif f == "IQ3_M" and (il < n // 8 or (n_exp == 8 and more_bits(il, n))):
                t = Type.Q4_K
            elif f == "Q3_K_L":
                t = Type.Q5_K
            elif f == "Q4_K_M":
                if more_bits(il, n):
                    t = Type.Q6_K
            elif f in ("IQ4_NL", "IQ4_XS") and il < n // 8 and not self.has_imatrix:
                t = Type.Q5_K
            elif f == "Q5_K_M" and more_bits(il, n):
                t = Type.Q6_K
            elif f == "Q4_K_S" and il < n // 8:
                t = Type.Q5_K
            elif f in ("Q4_0", "Q5_0") and self.has_imatrix and il < n // 8:
                t = Type.Q4_1 if f == "Q4_0" else Type.Q5_1  # llama.cpp's guard for the first ffn_down
        elif cat == "attn_output":
            if n_exp == 8:
                if f in ("Q2_K", "IQ3_XS", "IQ3_XXS", "Q3_K_S", "Q3_K_M", "IQ4_NL", "Q4_K_S", "Q4_K_M", "IQ3_S",
                         "IQ3_M", "IQ4_XS"):
                    t = Type.Q5_K
            else:
                t = {"Q2_K": Type.Q3_K, "IQ3_XXS": Type.IQ3_S, "Q3_K_M": Type.Q4_K, "Q3_K_L": Type.Q5_K,
                     "IQ3_M": Type.Q4_K}.get(f, t)
        elif cat in ("ffn_gate", "ffn_up"):
            if f == "IQ3_XS" and n // 8 <= il < 7 * n // 8:
                t = Type.IQ3_XXS
        return t


def tensor_order(names) -> list[str]:
    """llama-quantize's order of the tensors in its output (llama_model_loader's weights_map):
    by layer (tensors outside blk.N. first), then by name."""
    def key(name):
        m = re.match(r"blk\.(\d+)\.", name)
        return (int(m.group(1)) if m else -1, name.encode())
    return sorted(names, key=key)


def _mix(f, ftype: str, has_imatrix: bool, options: dict) -> Mix:
    arch = f.arch
    n_layer = int(f.get(f"{arch}.block_count"))
    n_head = f.get(f"{arch}.attention.head_count", 1)
    n_head_kv = f.get(f"{arch}.attention.head_count_kv", n_head)
    n_head, n_head_kv = (x[0] if isinstance(x, list) else x for x in (n_head, n_head_kv))
    return Mix(file_type(ftype), arch, n_layer, max(1, int(n_head) // max(1, int(n_head_kv))),
               int(f.get(f"{arch}.expert_count", 0)), "output.weight" not in f.tensors, has_imatrix, **options)


@contextlib.contextmanager
def _opened(src):
    """src: a path (opened here and closed after) or an open GGUFFile."""
    from ..gguf.loader import GGUFFile, open_gguf
    if isinstance(src, GGUFFile):
        yield src
        return
    f = open_gguf(src)
    try:
        yield f
    finally:
        f.close()


def plan(src, ftype: str, has_imatrix: bool = False, **options) -> list[tuple[str, Type, Type]]:
    """(tensor name, current type, new type) of every tensor of `src` (a path or a GGUFFile), in
    file order. options: Mix's (output_type, embedding_type, patterns, pure, quantize_output, and
    order: the tensors' order of quantization where it is not by layer, as --keep-split's)."""
    with _opened(src) as f:
        mix = _mix(f, ftype, has_imatrix, options)
        return [(name, Type(t.type), mix.type_for(name, list(t.ne), Type(t.type))) for name, t in f.tensors.items()]


def planned_bytes(src, planned: list[tuple[str, Type, Type]]) -> tuple[int, int]:
    """(bytes of the tensors' data now, after quantizing as planned)."""
    with _opened(src) as f:
        sizes = {name: (int(np.prod(t.ne[1:], dtype=np.int64)), int(t.ne[0])) for name, t in f.tensors.items()}
    before = sum(rows * _row_bytes(old, n) for name, old, _ in planned for rows, n in [sizes[name]])
    after = sum(rows * _row_bytes(new, n) for name, _, new in planned for rows, n in [sizes[name]])
    return before, after


def check_imatrix_needed(ftype: str, changes, weights: dict) -> None:
    """As llama-quantize: the lowest-bit types are refused without an importance matrix entry
    for the tensor (token_embd and output.weight excepted)."""
    for name, old, new in changes:
        if new == old or name in ("token_embd.weight", "output.weight"):
            continue
        if (new in IMATRIX_TYPES or (new == Type.Q2_K and ftype == "Q2_K_S")) and name not in weights:
            what = "no --imatrix given" if not weights else "the imatrix has no entry for it"
            raise ValueError(f"quantize: {name} would be {new.name}, which needs an importance matrix ({what}; "
                             f"collect one with `torchggml imatrix`)")


def check_requantize(src: str, changes: list[tuple[str, Type, Type]]) -> None:
    """As llama-quantize: converting a tensor that is already quantized loses quality twice
    over, so it needs --allow-requantize."""
    from ..types import is_quantized
    for name, old, new in changes:
        if new != old and is_quantized(old):
            raise ValueError(f"quantize: {src}: {name} is already {old.name}: requantizing from type {old.name} is "
                             f"disabled (--allow-requantize to do it anyway; quality drops below a quantization "
                             f"of the original F32/F16/BF16 file)")


QUANTIZATION_VERSION = 2  # ggml's GGML_QNT_VERSION, which llama-quantize writes
# tensors of fewer values convert on the calling thread alone (but to the IQ grid types, whose
# search is slow enough per value): on a busy machine each parallel region waits for its worker to
# be scheduled, and quantize runs two a tensor (a requantized 135M model's 210 tensors took 3-4x
# llama-quantize's time with every tensor in parallel)
SERIAL_BELOW = 1 << 21
CHUNK_BYTES = 64 << 20  # float32 rows converted at once: the memory a tensor's quantization holds beyond its output


def quantize_file(src: str, dst: str, ftype: str, log=None, imatrix: str | None = None,
                  include: list[str] | None = None, exclude: list[str] | None = None,
                  allow_requantize: bool = False, progress=None, imatrix_metadata: bool = True,
                  dry_run: bool = False, keep_split: bool = False, **options) -> list[tuple[str, Type, Type]]:
    """Write `dst`: `src` with its tensors quantized as the file type's mix says, in llama-quantize's
    tensor order and metadata, tensor by tensor (one tensor's output and a bounded chunk of float32
    rows in memory). imatrix: llama.cpp's importance matrix file (GGUF or the older .dat), its
    entries filtered by `include` / `exclude` (substrings of tensor names, as llama-quantize's
    --include-weights / --exclude-weights). options: the per-tensor options (Mix's). dry_run:
    check and plan only (nothing written); the plan is returned either way. A split `src` is read
    from its first file; keep_split writes `dst` (its .gguf dropped) as DST-00001-of-0000N.gguf...,
    the tensors in the files they were in (llama-quantize's --keep-split)."""
    from ..gguf.loader import open_gguf
    ftype = file_type(ftype)
    weights, imatrix_info = ({}, None) if imatrix is None else load_imatrix(imatrix)
    weights = filter_imatrix(weights, include, exclude)
    f = open_gguf(src)
    try:
        if keep_split:  # by file, then as each file holds them (llama-quantize sorts so)
            order = sorted(f.tensors, key=lambda n: (f.tensors[n].part, f.tensors[n].offset))
            options = {**options, "order": order}
        else:
            order = tensor_order(f.tensors)
        planned = plan(f, ftype, has_imatrix=bool(weights), **options)
        if not allow_requantize:
            check_requantize(src, planned)
        check_imatrix_fits(f, weights)
        if dry_run:
            return planned
        check_imatrix_needed(ftype, planned, weights)
        types = {name: new for name, _, new in planned}
        outputs = _outputs(f, dst, ftype, order, types, keep_split, weights, imatrix, imatrix_info, imatrix_metadata)
        for i, name in enumerate(order):
            t, new = f.tensors[name], types[name]
            qw = _imatrix_for(weights, name, list(t.ne)) if weights and new != t.type else None
            if new == t.type:
                data = f.tensor_data(name)
            else:
                with _threads(1 if t.n_elements < SERIAL_BELOW and new not in GRID_TYPES else None):
                    data = _convert(f.tensor_data(name), t.type, new, list(t.ne), qw)
            outputs[t.part if keep_split else 0].write(data)
            del data
            f.release(name)  # the source's mapped pages of it: resident memory stays one tensor's
            if log is not None:
                log(f"[{i + 1:4d}/{len(order)}] {name:40s} {t.type.name:>6s} -> {new.name:6s} "
                    f"{'x'.join(map(str, t.ne))}" + (" (imatrix)" if qw is not None else ""))
            if progress is not None:
                progress(i + 1, len(order), name)
        for out in outputs:
            out.close()
        return [(name, f.tensors[name].type, types[name]) for name in order]
    finally:
        f.close()


@contextlib.contextmanager
def _threads(n: int | None):
    """numba's thread count set to n (None: left as it is) for the block, then restored."""
    if n is None:
        yield
        return
    import numba
    before = numba.get_num_threads()
    numba.set_num_threads(n)
    try:
        yield
    finally:
        numba.set_num_threads(before)


def output_paths(dst: str, n_split: int, keep_split: bool) -> list[str]:
    """The files quantize writes: dst, or with keep_split llama-quantize's DST-0000i-of-0000N.gguf
    (dst's .gguf dropped) for each of the input's N files."""
    from ..gguf.loader import split_path
    if not keep_split:
        return [os.fspath(dst)]
    prefix = os.fspath(dst)
    prefix = prefix[:-len(".gguf")] if prefix.endswith(".gguf") else prefix
    return [split_path(prefix, i, n_split) for i in range(n_split)]


def _outputs(f, dst, ftype, order, types, keep_split, weights, imatrix, imatrix_info, imatrix_metadata):
    """One StreamWriter per output file, its header written: the input's metadata records as they
    are (split.* dropped; general.architecture first), general.quantization_version and
    general.file_type (llama-quantize sets these two last, in this order), quantize.imatrix.*, and
    for a split output split.no / split.count / split.tensors.count (the other files hold only these)."""
    from ..gguf.loader import SPLIT_KEYS
    from ..gguf.writer.stream import StreamWriter, kv_record
    n_split = 1 + len(f.parts) if keep_split else 1
    head = [f.kv_record("general.architecture")] + [
        f.kv_record(k) for k in f.metadata if k not in SPLIT_KEYS and k not in (
            "general.architecture", "general.file_type", "general.quantization_version")]
    head += [kv_record("general.quantization_version", "uint32", QUANTIZATION_VERSION),
             kv_record("general.file_type", "uint32", FILE_TYPES[ftype][0])]
    if weights and imatrix_metadata:  # llama-quantize's main adds these (llama_model_quantize alone does not)
        head.append(kv_record("quantize.imatrix.file", "string", os.fspath(imatrix)))
        if imatrix_info["datasets"]:
            head.append(kv_record("quantize.imatrix.dataset", "string", imatrix_info["datasets"][0]))
        head.append(kv_record("quantize.imatrix.entries_count", "uint32", len(weights)))
        if imatrix_info["chunk_count"] > 0:
            head.append(kv_record("quantize.imatrix.chunks_count", "uint32", imatrix_info["chunk_count"]))
    writers = []
    for i, path in enumerate(output_paths(dst, n_split, keep_split)):
        records = head if i == 0 else []
        if n_split > 1:
            records = records + [kv_record("split.no", "uint16", i), kv_record("split.count", "uint16", n_split),
                                 kv_record("split.tensors.count", "int32", len(order))]
        table = [(name, list(f.tensors[name].ne), int(types[name]),
                  _row_bytes(types[name], f.tensors[name].ne[0]) * int(np.prod(f.tensors[name].ne[1:], dtype=np.int64)))
                 for name in order if not keep_split or f.tensors[name].part == i]
        writers.append(StreamWriter(path, records, table, f.alignment))
    return writers


def _convert(raw: np.ndarray, old: Type, new: Type, ne: list[int], qw: np.ndarray | None) -> np.ndarray:
    """One tensor's bytes as `new`, converted in chunks of rows (within one expert, whose rows
    share an importance-matrix slice)."""
    from ..quants import quantize
    from ..devices.cpu.quantize import NATIVE_TYPES, quantize_native
    n_rows = int(np.prod(ne[1:], dtype=np.int64))
    rows_per_expert = ne[1] if len(ne) > 2 else n_rows
    raw = raw.reshape(n_rows, _row_bytes(old, ne[0]))
    out = np.empty((n_rows, _row_bytes(new, ne[0])), dtype=np.uint8)
    step = max(1, min(rows_per_expert, CHUNK_BYTES // (4 * ne[0])))
    buf = None if old == Type.F32 else np.empty((step, ne[0]), np.float32)
    for r0 in range(0, n_rows, step):
        r1 = min(n_rows, r0 + step, (r0 // rows_per_expert + 1) * rows_per_expert)
        values = _as_float32(old, raw[r0:r1], None if buf is None else buf[:r1 - r0])
        if new in NATIVE_TYPES:
            expert = r0 // rows_per_expert
            quantize_native(new, values, None if qw is None else qw[expert * ne[0]:(expert + 1) * ne[0]],
                            out=out[r0:r1])
        else:
            out[r0:r1] = quantize(new, torch.from_numpy(values)).numpy()
    return out


def _as_float32(t: Type, raw: np.ndarray, out: np.ndarray | None) -> np.ndarray:
    """Rows of type t (bytes) as float32: the native dequantizers (into `out`) for the types they
    read, the reference ones for the others."""
    import warnings
    from ..devices.cpu.dequantize import DEQUANTIZE_TYPES, dequantize_native
    from ..quants import dequantize
    if t == Type.F32:
        return raw.view(np.float32)
    if t in DEQUANTIZE_TYPES:
        return dequantize_native(t, raw, out)
    with warnings.catch_warnings():  # the file's read-only mapping: only read
        warnings.simplefilter("ignore", UserWarning)
        return dequantize(t, torch.from_numpy(raw)).numpy()


def _row_bytes(t: Type, n: int) -> int:
    from ..types import row_size
    return row_size(t, n)


# ---------------------------------------------------------------- importance matrices

def load_imatrix(path: str) -> tuple[dict[str, np.ndarray], dict]:
    """llama.cpp's importance matrix: {tensor name: mean squared activation per column, float32
    [n_per_row * n_expert]}, and {datasets, chunk_count, chunk_size}. Reads the GGUF format
    (NAME.in_sum2 / NAME.counts per tensor; the mean is in_sum2 / count, 1 where no count) and
    the older .dat one (sums already averaged per call, divided by the call count), as
    llama-quantize's load_imatrix does."""
    with open(path, "rb") as fh:
        magic = fh.read(4)
    if magic == b"GGUF":
        return _load_imatrix_gguf(path)
    return _load_imatrix_dat(path)


def _load_imatrix_gguf(path: str):
    import gguf
    reader = gguf.GGUFReader(path)
    fields = {f.name: f for f in reader.fields.values()}
    info = {"datasets": list(fields["imatrix.datasets"].contents()) if "imatrix.datasets" in fields else [],
            "chunk_count": int(fields["imatrix.chunk_count"].contents()) if "imatrix.chunk_count" in fields else 0,
            "chunk_size": int(fields["imatrix.chunk_size"].contents()) if "imatrix.chunk_size" in fields else 0}
    if not all(k in fields for k in ("imatrix.datasets", "imatrix.chunk_count", "imatrix.chunk_size")):
        raise ValueError(f"imatrix {path}: missing imatrix metadata (imatrix.datasets, chunk_count, chunk_size)")
    tensors = {t.name: t for t in reader.tensors}
    out = {}
    for tname, t in tensors.items():
        if not tname.endswith(".in_sum2"):
            continue
        name = tname[:-len(".in_sum2")]
        counts_t = tensors.get(name + ".counts")
        if counts_t is None:
            raise ValueError(f"imatrix {path}: {tname} has no {name}.counts")
        if int(t.tensor_type) != 0 or int(counts_t.tensor_type) != 0:
            raise ValueError(f"imatrix {path}: sums and counts of {name} must be F32")
        sums = np.asarray(t.data, dtype=np.float32).reshape(-1)
        counts = np.rint(np.asarray(counts_t.data, dtype=np.float64).reshape(-1))  # llama.cpp's lround
        ne0 = sums.size // counts.size
        values = np.ones_like(sums)
        for j, c in enumerate(counts):
            if c > 0:
                values[j * ne0:(j + 1) * ne0] = sums[j * ne0:(j + 1) * ne0] / np.float32(c)
        out[name] = values
    if not out:
        raise ValueError(f"imatrix {path}: no data (no *.in_sum2 tensors)")
    return out, info


def _load_imatrix_dat(path: str):
    data = open(path, "rb").read()
    pos = 0

    def take(fmt: str):
        nonlocal pos
        import struct
        size = struct.calcsize(fmt)
        if pos + size > len(data):
            raise ValueError(f"imatrix {path}: not a GGUF file and truncated as a .dat file at byte {pos}")
        values = struct.unpack_from(fmt, data, pos)
        pos += size
        return values

    (n_entries,) = take("<i")
    if n_entries < 1:
        raise ValueError(f"imatrix {path}: no data (neither a GGUF file nor a .dat file with entries)")
    out = {}
    for i in range(n_entries):
        (length,) = take("<i")
        name = data[pos:pos + length].decode("utf-8", "replace")
        pos += length
        ncall, nval = take("<ii")
        if nval < 1:
            raise ValueError(f"imatrix {path}: entry {i} ({name!r}) has {nval} values")
        sums = np.frombuffer(data, dtype="<f4", count=nval, offset=pos).astype(np.float32)
        pos += 4 * nval
        out[name] = sums / np.float32(ncall) if ncall > 0 else sums.copy()
    info = {"datasets": [], "chunk_count": 0, "chunk_size": 0}
    if pos < len(data):
        (info["chunk_count"],) = take("<i")
        if pos < len(data):
            (length,) = take("<i")
            if length > 0:
                info["datasets"].append(data[pos:pos + length].decode("utf-8", "replace"))
    return out, info


def filter_imatrix(weights: dict, include: list[str] | None, exclude: list[str] | None) -> dict:
    """llama-quantize's --exclude-weights (drop entries whose name contains one) then
    --include-weights (keep only entries whose name contains one)."""
    if exclude:
        weights = {k: v for k, v in weights.items() if not any(e in k for e in exclude)}
    if include:
        weights = {k: v for k, v in weights.items() if any(i in k for i in include)}
    return weights


def check_imatrix_fits(src, weights: dict) -> None:
    """Every imatrix entry the model has a tensor for holds that tensor's row length (times its
    experts), before anything is written: an importance matrix of another model fails here."""
    if not weights:
        return
    with _opened(src) as f:
        for name, t in f.tensors.items():
            if name in weights:
                _imatrix_for(weights, name, [int(x) for x in t.ne])
        if not any(name in f.tensors for name in weights):
            raise ValueError(f"quantize: no imatrix entry names a tensor of {f.path} (an importance matrix of "
                             f"another model?), e.g. {next(iter(weights))}")


def _imatrix_for(weights: dict, name: str, ne: list[int]) -> np.ndarray | None:
    qw = weights.get(name)
    if qw is None:
        return None
    want = ne[0] * (ne[2] if len(ne) > 2 else 1)
    if qw.size != want:
        if name == "token_embd.weight":  # llama-quantize ignores the embeddings' mismatch
            return None
        raise ValueError(f"quantize: the imatrix holds {qw.size} values for {name}, which needs {want} "
                         f"(an importance matrix of another model?)")
    if not np.isfinite(qw).all():
        raise ValueError(f"quantize: the imatrix entry of {name} has a non-finite value")
    return qw


def options_of(args) -> dict:
    """Mix's options from the command line's."""
    return {"output_type": None if args.output_tensor_type is None
            else block_type(args.output_tensor_type, "--output-tensor-type"),
            "embedding_type": None if args.token_embedding_type is None
            else block_type(args.token_embedding_type, "--token-embedding-type"),
            "patterns": [tensor_type_option(o) for o in args.tensor_type or ()],
            "pure": args.pure, "quantize_output": not args.leave_output_tensor}


def _bar(i: int, n: int, name: str) -> None:
    filled = 30 * i // max(1, n)
    print(f"\rquantize: [{'#' * filled}{'.' * (30 - filled)}] {i}/{n} {name[:40]:40s}", end="" if i < n else "\n",
          file=sys.stderr, flush=True)


def cmd_quantize(args) -> int:
    start = time.perf_counter()
    log = (lambda line: print(line, file=sys.stderr)) if args.verbose else None
    ftype = file_type(args.type)
    if ftype != args.type.upper():
        print(f"quantize: {args.type} is an alias for {ftype}", file=sys.stderr)
    if args.include_weights and args.exclude_weights:
        raise ValueError("quantize: --include-weights and --exclude-weights cannot be used together (as llama-quantize)")
    options = options_of(args)
    if args.dry_run:
        planned = quantize_file(args.input, args.output, ftype, imatrix=args.imatrix, include=args.include_weights,
                                exclude=args.exclude_weights, allow_requantize=args.allow_requantize, dry_run=True,
                                **options)
        sizes = dict(zip((n for n, _, _ in planned), range(len(planned))))
        for name in tensor_order(sizes):
            _, old, new = planned[sizes[name]]
            print(f"{name:48s} {old.name:>7s} -> {new.name}")
        before, after = planned_bytes(args.input, planned)
        print(f"dry run: {before / 2**20:.2f} MiB of tensors -> {after / 2**20:.2f} MiB as {ftype} (nothing written)")
        return 0
    progress = None
    if not args.verbose and sys.stderr.isatty():
        progress = _bar
    if args.nthreads:
        from ..devices.cpu.jit.loader import set_numba_threads
        set_numba_threads(args.nthreads)
        torch.set_num_threads(args.nthreads)
    quantize_file(args.input, args.output, ftype, log, imatrix=args.imatrix,
                  include=args.include_weights, exclude=args.exclude_weights,
                  allow_requantize=args.allow_requantize, progress=progress, keep_split=args.keep_split, **options)
    from ..gguf.loader import open_gguf
    f = open_gguf(args.input)
    inputs = [f.path] + [p.path for p in f.parts]
    f.close()
    outputs = output_paths(args.output, len(inputs), args.keep_split)
    size_in, size_out = (sum(os.path.getsize(p) for p in paths) for paths in (inputs, outputs))
    shown = outputs[0] if len(outputs) == 1 else f"{outputs[0]} (+{len(outputs) - 1} more)"
    print(f"{args.input} ({size_in / 2**20:.2f} MiB) -> {shown} ({size_out / 2**20:.2f} MiB) as "
          f"{ftype} in {time.perf_counter() - start:.1f} s")
    return 0
