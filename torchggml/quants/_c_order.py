"""float32 arithmetic as ggml's C quantizers evaluate it, vectorised over blocks.

The searching quantizers (K formats, IQ4) accumulate sums one element after another and pick
scales with strict comparisons; torch.sum's pairwise order rounds differently and argmax
treats NaN as a maximum. These helpers keep C's order and rules, so results match the C
reference bit for bit on any input, overflowing ones included.
"""
from __future__ import annotations

import torch


def over(numerator: float, t: torch.Tensor) -> torch.Tensor:
    """numerator / t, correctly rounded (`2 / t` in torch is `t.reciprocal() * 2`)."""
    return torch.div(t.new_full((), numerator), t)


def sqrtf(x: torch.Tensor) -> torch.Tensor:
    """C's sqrtf, correctly rounded: torch's float32 sqrt on the CPU can be one ulp off, a
    float64 square root rounded to float32 never is (53 >= 2*24 + 2 bits). MPS has no
    float64; there float32 has to do."""
    if x.device.type == "mps":
        return torch.sqrt(x)
    return torch.sqrt(x.double()).float()


def nearest_int(x: torch.Tensor) -> torch.Tensor:
    """ggml's nearest_int bit for bit: add 1.5 * 2^23 in float32 and read the low mantissa bits.

    Round half to even for |x| < 2^22; beyond that (and for inf/NaN) the same wrapped value as
    C, which the callers then clamp. int32 result.
    """
    shifted = (x.float() + 12582912.0).view(torch.int32)
    return (shifted & 0x007FFFFF) - 0x00400000


def wrap_int8(v: torch.Tensor) -> torch.Tensor:
    """An int stored into C's int8_t (two's complement wrap), as int32."""
    return ((v + 128) & 0xFF) - 128


def ordered_sum(terms: torch.Tensor, from_first: bool = False) -> torch.Tensor:
    """Sum over the last axis in float32, left to right, as C's `s = 0; s += t[i]` loop.

    from_first: start from t[0] instead of 0 (`s = t[0]; for i >= 1 ...`), which differs only
    in the sign of an all-zero sum.
    """
    parts = terms.movedim(-1, 0).contiguous()
    acc = parts[0].clone() if from_first else torch.zeros_like(parts[0]).add_(parts[0])
    for part in parts[1:]:
        acc.add_(part)
    return acc


def first_max(values: torch.Tensor, keys: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """C's running `if (key > best_key) { best_key = key; best = value; }` from 0 over the last
    axis: (best value, best key), both 0 where no key exceeds 0. The first of equal keys wins
    and NaN keys never do. keys default to the values themselves."""
    keys = values if keys is None else keys
    candidates = torch.where(keys > 0, keys, float("-inf"))
    at = candidates.argmax(dim=-1, keepdim=True)
    found = candidates.gather(-1, at) > 0
    zero = torch.zeros((), dtype=values.dtype, device=values.device)
    best = torch.where(found, values.gather(-1, at), zero).squeeze(-1)
    best_key = torch.where(found, keys.gather(-1, at), zero).squeeze(-1)
    return best, best_key


def first_min_max(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """C's `min = max = x[0]; if (x[i] < min) ...; if (x[i] > max) ...` per row, [n, 1] each:
    of equal values the first wins, which decides the sign of a zero (amin/amax may return
    either)."""
    return (x.gather(-1, x.argmin(dim=-1, keepdim=True)),
            x.gather(-1, x.argmax(dim=-1, keepdim=True)))


def signed_amax(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """ggml's `if (fabsf(x) > amax) { amax = fabsf(x); max = x; }`: (max, amax) per row."""
    return first_max(x, x.abs())
