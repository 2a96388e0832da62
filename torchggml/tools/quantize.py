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
Every tensor is dequantized to float32 (torchggml.quants.dequantize) and quantized to its new
type (torchggml.quants.quantize, bit-equal to llama.cpp's reference quantizers); the metadata is
copied with general.file_type and general.quantization_version set. No importance matrix: the
IQ1/IQ2/IQ3 mixes, which need one, are not offered.
"""
from __future__ import annotations

import re
import sys
import time

import numpy as np
import torch

from ..types import Type, blck_size

from .file_types import ALIASES, CHOICES, FILE_TYPE_IDS

# file type -> (id as llama.cpp numbers it, default block type)
FILE_TYPES = {name: (ftype_id, Type[block]) for name, (ftype_id, block) in FILE_TYPE_IDS.items()}

FALLBACK = {Type.Q2_K: Type.Q4_0, Type.Q3_K: Type.Q4_0, Type.Q4_K: Type.Q5_0, Type.Q5_K: Type.Q5_1,
            Type.Q6_K: Type.Q8_0, Type.IQ4_XS: Type.IQ4_NL}


def file_type(name: str) -> str:
    key = name.upper()
    key = ALIASES.get(key, key)
    if key not in FILE_TYPES:
        raise ValueError(f"quantize: unknown type {name!r}; choose one of {CHOICES}")
    return key


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
                     ("attn_k.weight", "attn_k"), ("attn_output.weight", "attn_output"), ("ffn_down", "ffn_down")):
        if key in name:
            return cat
    return "other"


class Mix:
    """The tensor types of one file type for one model (its layer count, GQA, experts, tying)."""

    def __init__(self, ftype: str, arch: str, n_layer: int, n_gqa: int, n_expert: int, tied_output: bool):
        self.ftype, self.default = ftype, FILE_TYPES[ftype][1]
        self.arch, self.n_layer, self.n_gqa, self.n_expert, self.tied = arch, n_layer, n_gqa, n_expert, tied_output

    def type_for(self, name: str, ne: list[int], current: Type) -> Type:
        if not is_quantizable(name, len(ne)):
            return current
        t = self.default
        if self.default not in (Type.F32, Type.F16, Type.BF16):
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
        if cat == "output" or (cat == "token_embd" and self.tied):
            return Type.Q8_0 if ne[0] % blck_size(t) else t if t == Type.Q8_0 else Type.Q6_K
        if cat == "attn_v":
            if f == "Q2_K":
                t = Type.Q4_K if self.n_gqa >= 4 else Type.Q3_K
            elif f == "Q3_K_M":
                t = Type.Q5_K if il < 2 else Type.Q4_K
            elif f == "Q3_K_L":
                t = Type.Q5_K
            elif f in ("IQ4_NL", "IQ4_XS") and self.n_gqa >= 4:
                t = Type.Q5_K
            elif f in ("Q4_K_M", "Q5_K_M") and more_bits(il, n):
                t = Type.Q6_K
            elif f == "Q4_K_S" and il < 4:
                t = Type.Q5_K
            if self.arch == "llama" and n == 80 and t in (Type.Q3_K, Type.Q4_K):
                t = Type.Q5_K  # llama.cpp's 70B rule
            if self.n_expert == 8:
                t = Type.Q8_0
        elif cat == "attn_k":
            if self.n_expert == 8:
                t = Type.Q8_0
        elif cat == "ffn_down":
            if f == "Q2_K":
                t = Type.Q3_K
            elif f == "Q3_K_M":
                t = Type.Q5_K if il < n // 16 else Type.Q4_K
            elif f == "Q3_K_L":
                t = Type.Q5_K
            elif f == "Q4_K_M":
                if more_bits(il, n):
                    t = Type.Q6_K
            elif f in ("IQ4_NL", "IQ4_XS") and il < n // 8:
                t = Type.Q5_K
            elif f == "Q5_K_M" and more_bits(il, n):
                t = Type.Q6_K
            elif f == "Q4_K_S" and il < n // 8:
                t = Type.Q5_K
        elif cat == "attn_output":
            k_mixes = ("Q2_K", "Q3_K_S", "Q3_K_M", "IQ4_NL", "Q4_K_S", "Q4_K_M", "IQ4_XS")
            if self.n_expert == 8:
                if f in k_mixes:
                    t = Type.Q5_K
            else:
                t = {"Q2_K": Type.Q3_K, "Q3_K_M": Type.Q4_K, "Q3_K_L": Type.Q5_K}.get(f, t)
        return t


def plan(path: str, ftype: str) -> list[tuple[str, Type, Type]]:
    """(tensor name, current type, new type) of every tensor, in file order."""
    from ..gguf.loader import open_gguf
    f = open_gguf(path)
    arch = f.arch
    n_layer = int(f.get(f"{arch}.block_count"))
    n_head = f.get(f"{arch}.attention.head_count", 1)
    n_head_kv = f.get(f"{arch}.attention.head_count_kv", n_head)
    n_head, n_head_kv = (x[0] if isinstance(x, list) else x for x in (n_head, n_head_kv))
    mix = Mix(file_type(ftype), arch, n_layer, max(1, int(n_head) // max(1, int(n_head_kv))),
              int(f.get(f"{arch}.expert_count", 0)), "output.weight" not in f.tensors)
    out = [(name, Type(t.type), mix.type_for(name, list(t.ne), Type(t.type))) for name, t in f.tensors.items()]
    f.close()
    return out


def check_requantize(src: str, changes: list[tuple[str, Type, Type]]) -> None:
    """As llama-quantize: converting a tensor that is already quantized loses quality twice
    over, so it needs --allow-requantize."""
    from ..types import is_quantized
    for name, old, new in changes:
        if new != old and is_quantized(old):
            raise ValueError(f"quantize: {src}: {name} is already {old.name}: requantizing from type {old.name} is "
                             f"disabled (--allow-requantize to do it anyway; quality drops below a quantization "
                             f"of the original F32/F16/BF16 file)")


def quantize_file(src: str, dst: str, ftype: str, log=None, allow_requantize: bool = False
                  ) -> list[tuple[str, Type, Type]]:
    """Write `dst`: `src` with its tensors quantized as the file type's mix says (a quantized
    tensor converted to another type only with allow_requantize, as llama-quantize)."""
    import gguf
    from ..quants import dequantize, quantize
    ftype = file_type(ftype)
    changes = plan(src, ftype)
    if not allow_requantize:
        check_requantize(src, changes)
    types = {name: new for name, _, new in changes}
    reader = gguf.GGUFReader(src)
    arch = reader.get_field("general.architecture").contents()
    writer = gguf.GGUFWriter(dst, arch)
    for field in reader.fields.values():
        if field.name.startswith("GGUF.") or field.name in ("general.architecture", "general.file_type",
                                                             "general.quantization_version"):
            continue
        sub = field.types[-1] if field.types[0] == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(field.name, field.contents(), field.types[0], sub_type=sub)
    writer.add_file_type(FILE_TYPES[ftype][0])
    writer.add_quantization_version(gguf.GGML_QUANT_VERSION)
    for t in reader.tensors:
        new = types[t.name]
        ne = [int(x) for x in t.shape]
        old = Type(int(t.tensor_type))
        if new == old:
            data = np.asarray(t.data)
        else:
            raw = torch.from_numpy(np.array(t.data, copy=True).view(np.uint8).reshape(-1, _row_bytes(old, ne[0])))
            values = dequantize(old, raw)
            data = quantize(new, values).numpy()
        rows = list(reversed(ne[1:]))
        if new in (Type.F32, Type.F16):
            writer.add_tensor(t.name, data.view(np.float32 if new == Type.F32 else np.float16).reshape(rows + [ne[0]]))
        else:  # bytes [..., row bytes]: gguf works out the values' shape from the type
            writer.add_tensor(t.name, data.view(np.uint8).reshape(rows + [_row_bytes(new, ne[0])]),
                              raw_dtype=gguf.GGMLQuantizationType(int(new)))
        if log is not None:
            log(f"{t.name:40s} {old.name:>6s} -> {new.name:6s} {'x'.join(map(str, ne))}")
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return [(name, None, new) for name, new in types.items()]


def _row_bytes(t: Type, n: int) -> int:
    from ..types import row_size
    return row_size(t, n)


def cmd_quantize(args) -> int:
    start = time.perf_counter()
    log = (lambda line: print(line, file=sys.stderr)) if args.verbose else None
    ftype = file_type(args.type)
    if ftype != args.type.upper():
        print(f"quantize: {args.type} is an alias for {ftype}", file=sys.stderr)
    quantize_file(args.input, args.output, ftype, log, args.allow_requantize)
    import os
    size_in, size_out = os.path.getsize(args.input), os.path.getsize(args.output)
    print(f"{args.input} ({size_in / 2**20:.2f} MiB) -> {args.output} ({size_out / 2**20:.2f} MiB) as "
          f"{ftype} in {time.perf_counter() - start:.1f} s")
    return 0
