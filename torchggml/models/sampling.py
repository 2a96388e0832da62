"""Choosing the next token from a row of logits."""
from __future__ import annotations

import math
import numbers

import torch


def sample_token(logits: torch.Tensor, temperature: float = 0.8, top_k: int = 40, top_p: float = 0.95,
                 generator: torch.Generator | None = None) -> int:
    """Temperature, then top-k, then top-p (nucleus) sampling; greedy when temperature <= 0."""
    check_sampling(temperature, top_k, top_p)
    if temperature <= 0:
        return int(torch.argmax(logits))
    logits = logits.double() / temperature
    if 0 < top_k < logits.numel():
        kth = torch.topk(logits, top_k).values[-1]
        logits = logits.masked_fill(logits < kth, -math.inf)
    probs = torch.softmax(logits, dim=-1)
    if 0 < top_p < 1:
        sorted_p, order = torch.sort(probs, descending=True)
        # keep the smallest prefix whose mass reaches top_p (always at least one token)
        keep = torch.cumsum(sorted_p, 0) - sorted_p < top_p
        probs = torch.zeros_like(probs).scatter_(0, order[keep], sorted_p[keep])
    return int(torch.multinomial(probs, 1, generator=generator))


def check_sampling(temperature: float, top_k: int, top_p: float) -> None:
    """ValueError/TypeError naming the sampling option that is not a usable number."""
    for name, value in (("temperature", temperature), ("top_p", top_p)):
        if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value):
            raise ValueError(f"sampling: {name} must be a finite number, got {value!r}")
    if isinstance(top_k, bool) or not isinstance(top_k, numbers.Integral):
        raise TypeError(f"sampling: top_k must be an integer, got {top_k!r}")
