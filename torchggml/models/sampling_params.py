"""SamplingParams and its DEFAULTS, apart from the sampler (sampling.py) so that the command
line can show the defaults without importing torch."""
from __future__ import annotations

import math
from dataclasses import dataclass, fields

# OpenAI allows at most 20 alternatives per token (top_logprobs)
MAX_TOP_LOGPROBS = 20


@dataclass(frozen=True)
class SamplingParams:
    """temperature: <= 0 is greedy. top_k: 0 keeps every token. top_p: 1 keeps every token.
    min_p: drop tokens whose probability is below min_p times the most likely one's (0: off).
    repeat_penalty: llama.cpp's (1: off): a logit of a recent token is divided by it (multiplied
    when negative). frequency_penalty / presence_penalty: OpenAI's (0: off): a recent token's logit
    less count * frequency_penalty + presence_penalty. repeat_last_n: how many recent tokens the
    penalties look at (-1: all). seed: the draw's generator (None: random). logprobs: None, or how
    many alternatives (0..20) to report beside each token's own log-probability. logit_bias:
    (token id, bias) pairs added to the logits before the chain (-inf bans the token), as
    llama.cpp's logit-bias sampler; the reported log-probabilities are the raw logits'.
    post_sampling_probs: with logprobs, also report the probabilities of the draw itself (among
    the candidates the chain kept), as llama-server's post_sampling_probs."""
    temperature: float = 0.8
    top_k: int = 40
    top_p: float = 0.95
    min_p: float = 0.0
    repeat_penalty: float = 1.0
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    repeat_last_n: int = 64
    seed: int | None = None
    logprobs: int | None = None
    logit_bias: tuple[tuple[int, float], ...] = ()
    post_sampling_probs: bool = False

    def __post_init__(self):
        checks = [("temperature", self.temperature >= 0),
                  ("top_k", self.top_k >= 0), ("top_p", 0 <= self.top_p <= 1), ("min_p", 0 <= self.min_p <= 1),
                  ("repeat_penalty", self.repeat_penalty > 0),
                  ("frequency_penalty", -2 <= self.frequency_penalty <= 2),
                  ("presence_penalty", -2 <= self.presence_penalty <= 2),
                  ("repeat_last_n", self.repeat_last_n >= -1),
                  ("logprobs", self.logprobs is None or 0 <= self.logprobs <= MAX_TOP_LOGPROBS),
                  ("logit_bias", all(not math.isnan(b) and b != math.inf for _, b in self.logit_bias))]
        ranges = {"temperature": ">= 0", "top_k": ">= 0", "top_p": "in [0, 1]", "min_p": "in [0, 1]",
                  "repeat_penalty": "> 0", "frequency_penalty": "in [-2, 2]", "presence_penalty": "in [-2, 2]",
                  "repeat_last_n": ">= -1", "logprobs": f"in [0, {MAX_TOP_LOGPROBS}]",
                  "logit_bias": "finite biases (or -inf: banned)"}
        for name, ok in checks:
            value = getattr(self, name)
            if isinstance(value, float) and math.isnan(value):
                ok = False
            if not ok:
                raise ValueError(f"sampling: {name}={value!r} must be {ranges[name]}")

    @classmethod
    def names(cls) -> list[str]:
        return [f.name for f in fields(cls)]


#: the sampling defaults, stated once (the CLI's and the server's options take theirs from here)
DEFAULTS = SamplingParams()
