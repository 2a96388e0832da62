"""Choosing the next token from a row of logits: one sampler for Model.generate, `torchggml run`
and the server (torchggml.server), so a request gives the same tokens through every door.

    params = SamplingParams(temperature=0.7, top_k=40, min_p=0.05, repeat_penalty=1.1, seed=1)
    sampler = Sampler(params, history=prompt_ids)     # penalties see the prompt's last tokens
    choice = sampler.sample(logits_row)               # TokenChoice: token, logprob, top
    sampler.accept(choice.token)

The chain, in order: logit biases (llama.cpp's logit-bias sampler), repeat/frequency/presence penalties (llama.cpp's penalties sampler, over
the last repeat_last_n tokens), an allowed-token mask (a grammar's), temperature, top-k, top-p,
min-p, then a draw; temperature <= 0 takes the most likely allowed token. Log-probabilities (the
OpenAI `logprobs`) are those of the model: log-softmax of the raw logits, before any of the chain.
With post_sampling_probs (llama-server's) a choice also carries the probabilities of the draw
itself: over the candidates the chain kept, normalized (greedy: the chosen token's 1).

StopStrings cuts streamed text at the first stop string, holding back a tail that may be the
start of one.
"""
from __future__ import annotations

import collections

import math
from dataclasses import dataclass, field

import torch

from .sampling_params import DEFAULTS, MAX_TOP_LOGPROBS, SamplingParams  # noqa: F401  (torch-free: the CLI's defaults)




@dataclass
class TokenChoice:
    """A sampled token; with SamplingParams.logprobs set, its log-probability and the `logprobs`
    most likely tokens' (id, log-probability), most likely first."""
    token: int
    logprob: float | None = None
    top: list[tuple[int, float]] = field(default_factory=list)
    # with SamplingParams.post_sampling_probs: the token's probability in the draw and the `logprobs`
    # most probable kept candidates' (id, probability), most probable first (zero ones left out)
    prob: float | None = None
    top_probs: list[tuple[int, float]] = field(default_factory=list)


class Sampler:
    """The sampling state of one sequence: its generator and its recent tokens (for penalties)."""

    def __init__(self, params: SamplingParams | None = None, history=()):
        self.params = params or SamplingParams()
        seed = self.params.seed
        self.generator = torch.Generator().manual_seed(seed if seed is not None else torch.seed() & 0xFFFFFFFF)
        self.history: list[int] = [int(t) for t in history]

    def accept(self, token: int) -> None:
        self.history.append(int(token))

    def sample(self, logits: torch.Tensor, allowed: torch.Tensor | None = None) -> TokenChoice:
        """The next token from one row of logits [n_vocab]; `allowed` (bool [n_vocab]) restricts
        the choice (a grammar's mask). ValueError when the mask allows nothing."""
        p = self.params
        logits = logits.reshape(-1)
        choice = TokenChoice(-1)
        if p.logprobs is not None:
            logprobs = torch.log_softmax(logits.double(), dim=-1)
            if p.logprobs:
                values, ids = torch.topk(logprobs, min(p.logprobs, logprobs.numel()))
                choice.top = [(int(i), float(v)) for i, v in zip(ids, values)]
        work = self._penalized(self._biased(logits))
        if allowed is not None:
            if not bool(allowed.any()):
                raise ValueError("sampling: the grammar allows no token here")
            work = work.masked_fill(~allowed, -math.inf)
        ids, probs = _candidates(work, p.temperature, p.top_k, p.top_p, p.min_p)
        choice.token = _draw(ids, probs, self.generator, p.temperature <= 0)
        if p.logprobs is not None:
            choice.logprob = float(logprobs[choice.token])
            if p.post_sampling_probs:
                choice.prob, choice.top_probs = _kept(ids, probs, choice.token, p.logprobs)
        return choice

    def _biased(self, logits: torch.Tensor) -> torch.Tensor:
        if not self.params.logit_bias:
            return logits
        ids = torch.tensor([t for t, _ in self.params.logit_bias], dtype=torch.int64)
        bias = torch.tensor([b for _, b in self.params.logit_bias], dtype=torch.float64)
        return logits.double().index_add(0, ids, bias)  # a token listed twice gets both

    def _penalized(self, logits: torch.Tensor) -> torch.Tensor:
        p = self.params
        if (p.repeat_penalty == 1 and not p.frequency_penalty and not p.presence_penalty) or not self.history:
            return logits
        recent = self.history if p.repeat_last_n == -1 else self.history[-p.repeat_last_n:] if p.repeat_last_n else []
        if not recent:
            return logits
        ids, counts = torch.unique(torch.tensor(recent, dtype=torch.int64), return_counts=True)
        out = logits.double().clone()
        seen = out[ids]
        seen = torch.where(seen <= 0, seen * p.repeat_penalty, seen / p.repeat_penalty)
        out[ids] = seen - counts.double() * p.frequency_penalty - p.presence_penalty
        return out


# temperatures for which dividing float32 logits in float64 neither overflows nor reaches the
# subnormal range, so distinct logits stay distinct and in order (see _candidates)
_KEEPS_ORDER = (1e-250, 1e250)


def _candidates(logits: torch.Tensor, temperature: float, top_k: int, top_p: float,
                min_p: float) -> tuple[torch.Tensor | None, torch.Tensor]:
    """The draw's candidates: (their token ids, None for the whole vocabulary in order; their
    unnormalized probabilities, 0 for those the chain dropped). Temperature, then top-k, top-p
    (nucleus) and min-p; greedy (temperature <= 0) keeps the most likely token alone. With top-k
    the later steps run over the k candidates only (as llama.cpp's sampler chain)."""
    if temperature <= 0:
        return torch.argmax(logits).reshape(1), torch.ones(1, dtype=torch.float64)
    ids = None
    if 0 < top_k < logits.numel() and logits.dtype == torch.float32 and _KEEPS_ORDER[0] < temperature < _KEEPS_ORDER[1]:
        # the k highest before the division: the same k values, in the same order, as after it
        # (float32 values stay distinct divided in float64 by such a temperature), without
        # converting and dividing the whole vocabulary
        logits, ids = torch.topk(logits, top_k)
        logits = logits.double() / temperature
    else:
        logits = logits.double() / temperature
        if 0 < top_k < logits.numel():
            logits, ids = torch.topk(logits, top_k)  # (sorted, highest first)
    probs = torch.softmax(logits, dim=-1)
    if 0 < top_p < 1:
        sorted_p, order = (probs, torch.arange(probs.numel())) if ids is not None else torch.sort(probs, descending=True)
        # keep the smallest prefix whose mass reaches top_p (always at least one token)
        keep = torch.cumsum(sorted_p, 0) - sorted_p < top_p
        probs = torch.zeros_like(probs).scatter_(0, order[keep], sorted_p[keep])
    if min_p > 0:
        probs = probs.masked_fill(probs < min_p * probs.max(), 0.0)
    return ids, probs


def _draw(ids: torch.Tensor | None, probs: torch.Tensor, generator: torch.Generator | None, greedy: bool) -> int:
    """A token drawn from the candidates (greedy: the one kept, no draw)."""
    k = 0 if greedy else int(torch.multinomial(probs, 1, generator=generator))
    return k if ids is None else int(ids[k])


def _kept(ids: torch.Tensor | None, probs: torch.Tensor, token: int, n: int) -> tuple[float, list[tuple[int, float]]]:
    """The drawn token's probability and the n most probable kept candidates' (llama-server's
    post_sampling_probs: the distribution the draw used, normalized; zero ones left out)."""
    probs = probs / probs.sum()
    nonzero = int(torch.count_nonzero(probs))
    values, order = torch.topk(probs, min(n, nonzero))
    token_ids = order if ids is None else ids[order]
    where = (ids if ids is not None else torch.arange(probs.numel())) == token
    return float(probs[where][0]), [(int(i), float(v)) for i, v in zip(token_ids, values)]


def sample_token(logits: torch.Tensor, temperature: float = DEFAULTS.temperature, top_k: int = DEFAULTS.top_k,
                 top_p: float = DEFAULTS.top_p, generator: torch.Generator | None = None,
                 min_p: float = DEFAULTS.min_p) -> int:
    """Temperature, then top-k, then top-p (nucleus), then min-p sampling; greedy when temperature <= 0
    (the sampler's draw without penalties or logprobs)."""
    return _draw(*_candidates(logits.reshape(-1), temperature, top_k, top_p, min_p), generator, temperature <= 0)


class StopStrings:
    """Streamed text cut at the first of `stops`: push(text) returns the text that can be shown
    now (a tail that may begin a stop string is held back) and sets `stopped` when a stop string
    appeared (the stop string and what follows are dropped, as OpenAI does; `word` is the one found);
    flush() the held tail.

    The stops are one Aho-Corasick automaton: a push scans the held tail and the new text once,
    whatever the number of stops (the held tail is shorter than the longest stop)."""

    def __init__(self, stops=()):
        self.stops = [s for s in stops if s]
        self.held = ""
        self.stopped = False
        self.word: str | None = None
        self._goto: list[dict[str, int]] = [{}]  # trie: node -> char -> node
        self._fail = [0]
        self._depth = [0]
        self._longest = [0]  # the longest stop ending at this node (0: none)
        for stop in self.stops:
            node = 0
            for ch in stop:
                if ch not in self._goto[node]:
                    self._goto.append({})
                    self._fail.append(0)
                    self._depth.append(self._depth[node] + 1)
                    self._longest.append(0)
                    self._goto[node][ch] = len(self._goto) - 1
                node = self._goto[node][ch]
            self._longest[node] = len(stop)
        queue = collections.deque(self._goto[0].values())
        while queue:  # breadth first: a node's failure link is set before its children's
            node = queue.popleft()
            if not self._longest[node]:
                self._longest[node] = self._longest[self._fail[node]]
            for ch, child in self._goto[node].items():
                f = self._fail[node]
                while f and ch not in self._goto[f]:
                    f = self._fail[f]
                self._fail[child] = self._goto[f][ch] if node and ch in self._goto[f] else 0
                queue.append(child)

    def _scan(self, text: str) -> tuple[int, int]:
        """(where the earliest-starting stop in `text` begins or -1, the longest suffix of `text`
        that begins a stop)."""
        node, cut = 0, -1
        for i, ch in enumerate(text):
            while node and ch not in self._goto[node]:
                node = self._fail[node]
            node = self._goto[node].get(ch, 0)
            if self._longest[node]:
                start = i + 1 - self._longest[node]
                cut = start if cut < 0 else min(cut, start)
        return cut, self._depth[node]

    def push(self, text: str) -> str:
        if self.stopped:
            return ""
        if not self.stops:
            return text
        text = self.held + text
        cut, keep = self._scan(text)
        if cut >= 0:
            self.stopped, self.held = True, ""
            self.word = max((s for s in self.stops if text.startswith(s, cut)), key=len)
            return text[:cut]
        self.held = text[len(text) - keep:] if keep else ""
        return text[:len(text) - keep]

    def flush(self) -> str:
        held, self.held = self.held, ""
        return "" if self.stopped else held
