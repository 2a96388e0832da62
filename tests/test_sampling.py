"""The sampler shared by Model.generate, `run` and the server: penalties, min_p, logprobs, stop strings."""
from __future__ import annotations

import math

import pytest
import torch

from torchggml.models.sampling import Sampler, SamplingParams, StopStrings, sample_token


def test_penalties_follow_llama_cpp():
    logits = torch.tensor([2.0, -1.0, 0.5, 3.0, -2.0], dtype=torch.float64)
    history = [0, 0, 1, 3, 3, 3]
    p = SamplingParams(temperature=0, repeat_penalty=2.0, frequency_penalty=0.5, presence_penalty=0.25)
    got = Sampler(p, history)._penalized(logits)
    # llama.cpp: a seen token's logit divided by the penalty (multiplied when <= 0), then
    # count * frequency + presence subtracted
    expect = [2.0 / 2 - 2 * 0.5 - 0.25, -1.0 * 2 - 1 * 0.5 - 0.25, 0.5, 3.0 / 2 - 3 * 0.5 - 0.25, -2.0]
    assert got.tolist() == pytest.approx(expect)
    # only the last repeat_last_n tokens count
    last2 = Sampler(SamplingParams(repeat_penalty=2.0, repeat_last_n=2), history)._penalized(logits)
    assert last2.tolist() == pytest.approx([2.0, -1.0, 0.5, 1.5, -2.0])


def test_min_p_drops_unlikely_tokens():
    probs = torch.tensor([0.5, 0.3, 0.15, 0.05])
    logits = probs.log()
    gen = torch.Generator().manual_seed(0)
    seen = {sample_token(logits, 1.0, 0, 1.0, gen, min_p=0.2) for _ in range(400)}
    assert seen == {0, 1, 2}  # 0.05 < 0.2 * 0.5


def test_greedy_respects_the_allowed_mask_and_logprobs_are_the_models():
    logits = torch.tensor([1.0, 4.0, 2.0, 3.0])
    allowed = torch.tensor([True, False, True, True])
    c = Sampler(SamplingParams(temperature=0, logprobs=2)).sample(logits, allowed)
    ref = torch.log_softmax(logits.double(), 0)
    assert c.token == 3 and c.logprob == pytest.approx(float(ref[3]))
    assert [t for t, _ in c.top] == [1, 3] and c.top[0][1] == pytest.approx(float(ref[1]))
    with pytest.raises(ValueError, match="allows no token"):
        Sampler(SamplingParams(temperature=0)).sample(logits, torch.zeros(4, dtype=torch.bool))


def _chain_reference(logits, temperature, top_k, top_p, min_p, allowed=None):
    """The draw's distribution in float64 written out plainly: {token: probability} over the kept tokens."""
    x = [float(v) for v in logits]
    if allowed is not None:
        x = [v if a else -math.inf for v, a in zip(x, allowed)]
    if temperature <= 0:
        return {max(range(len(x)), key=lambda i: x[i]): 1.0}
    order = sorted(range(len(x)), key=lambda i: -x[i])[:top_k or len(x)]
    e = [math.exp(x[i] / temperature - x[order[0]] / temperature) for i in order]
    p = [v / sum(e) for v in e]
    kept, mass = [], 0.0
    for i, q in zip(order, p):
        if mass >= top_p and top_p < 1:
            break
        kept.append((i, q))
        mass += q
    kept = [(i, q) for i, q in kept if q > 0 and q >= min_p * kept[0][1]]
    total = sum(q for _, q in kept)
    return {i: q / total for i, q in kept}


POST_SAMPLING = [  # temperature, top_k, top_p, min_p, allowed
    (1.0, 0, 1.0, 0.0, None),
    (0.7, 5, 1.0, 0.0, None),
    (1.0, 0, 0.8, 0.0, None),
    (1.3, 6, 0.9, 0.1, None),
    (1.0, 4, 1.0, 0.0, [True, False] * 5),   # a grammar's mask: fewer allowed than top_k
    (0.0, 40, 0.95, 0.05, None),             # greedy: the chosen token's 1
]


@pytest.mark.parametrize("temperature,top_k,top_p,min_p,allowed", POST_SAMPLING)
def test_post_sampling_probs_are_the_draws(temperature, top_k, top_p, min_p, allowed):
    logits = torch.tensor([1.5, 0.2, 3.0, -1.0, 2.2, 0.9, 2.9, -0.3, 1.1, 0.0])
    mask = None if allowed is None else torch.tensor(allowed)
    ref = _chain_reference(logits, temperature, top_k, top_p, min_p, allowed)
    params = SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p, seed=3, logprobs=20,
                            post_sampling_probs=True)
    sampler = Sampler(params)
    counts = {}
    for _ in range(2000):
        c = sampler.sample(logits, mask)
        assert c.prob == pytest.approx(ref[c.token], rel=1e-12)
        assert [t for t, _ in c.top_probs] == sorted(ref, key=lambda i: -ref[i])  # every kept one, most probable first
        assert [q for _, q in c.top_probs] == pytest.approx([ref[t] for t, _ in c.top_probs], rel=1e-12)
        counts[c.token] = counts.get(c.token, 0) + 1
    # and they are what the draw does: frequencies within 4 standard deviations
    for t, q in ref.items():
        assert abs(counts.get(t, 0) / 2000 - q) <= 4 * math.sqrt(q * (1 - q) / 2000) + 1e-9
    assert set(counts) <= set(ref)
    few = Sampler(params.__class__(**{**params.__dict__, "logprobs": 2})).sample(logits, mask)
    assert len(few.top_probs) == min(2, len(ref))


@pytest.mark.parametrize("field,value", [("temperature", -1.0), ("top_p", 1.5), ("min_p", -0.1),
                                         ("repeat_penalty", 0.0), ("frequency_penalty", 3.0),
                                         ("logprobs", 21), ("temperature", math.nan)])
def test_bad_sampling_params(field, value):
    with pytest.raises(ValueError, match=field):
        SamplingParams(**{field: value})


STOP_CASES = [  # (stops, pieces, shown text, stopped)
    (["END"], ["abc", "deE", "N", "Dxyz"], "abcde", True),
    (["END"], ["abc", "E", "x"], "abcEx", False),
    (["\n\n", "###"], ["one\n", "two\n", "\nthree"], "one\ntwo", True),
    (["##"], ["a#", "#b"], "a", True),
    ([], ["a", "b"], "ab", False),
]


@pytest.mark.parametrize("stops,pieces,text,stopped", STOP_CASES)
def test_stop_strings(stops, pieces, text, stopped):
    s = StopStrings(stops)
    shown = "".join(s.push(p) for p in pieces) + s.flush()
    assert (shown, s.stopped) == (text, stopped)


@pytest.fixture(scope="module")
def demo():
    from torchggml.gguf.writer.demo import demo_model_path
    from torchggml.models import load_model
    m = load_model(demo_model_path())
    yield m
    m.close()


def test_generate_stop_and_logprobs(demo):
    prompt = "Once upon a time"
    full = "".join(demo.generate(prompt, max_tokens=12, temperature=0))
    stop = full[5:8]
    assert "".join(demo.generate(prompt, max_tokens=12, temperature=0, stop=[stop])) == full[:full.index(stop)]
    choices = list(demo.generate_tokens(prompt, 5, SamplingParams(temperature=0, logprobs=3)))
    ids = demo.tokenize(prompt) + [c.token for c in choices]
    demo.reset()
    logits = demo.eval(ids)  # every position's logits, computed separately
    ref = torch.log_softmax(logits.double(), dim=-1)
    n = len(demo.tokenize(prompt))
    for i, c in enumerate(choices):
        row = ref[n - 1 + i]
        assert c.token == int(row.argmax()) and c.logprob == pytest.approx(float(row[c.token]), abs=1e-4)
        assert [t for t, _ in c.top] == row.topk(3).indices.tolist()


def test_generate_penalties_change_the_text(demo):
    prompt = "Once upon a time"
    plain = "".join(demo.generate(prompt, max_tokens=16, temperature=0))
    penalized = "".join(demo.generate(prompt, max_tokens=16, temperature=0, repeat_penalty=5.0,
                                      presence_penalty=2.0, repeat_last_n=-1))
    assert plain != penalized
    params = SamplingParams(temperature=0, repeat_penalty=5.0, presence_penalty=2.0, repeat_last_n=-1)
    ids = [c.token for c in demo.generate_tokens(prompt, 16, params)]
    assert demo.detokenize(ids) == penalized
    assert len(set(ids)) == len(ids)  # every repetition made much less likely


def test_embed_is_the_hidden_state_before_the_head(demo):
    """Model.embed's per-token states times the output matrix are eval's logits; pooling as llama.cpp."""
    from torchggml.interop import to_torch
    ids = demo.tokenize("The scheduler cuts the graph")
    demo.reset()
    logits = demo.eval(ids)
    demo.reset()
    hidden = demo.embed(ids, pooling="none", normalize=-1)
    head = to_torch(demo.weights.output).float()  # [n_vocab, n_embd]
    assert torch.allclose(hidden @ head.T, logits, atol=1e-4, rtol=1e-4)
    assert torch.allclose(demo.embed(ids, normalize=-1), hidden.mean(0), atol=1e-6)  # no pooling type: mean
    assert torch.equal(demo.embed(ids, pooling="cls", normalize=-1), hidden[0])
    assert torch.equal(demo.embed(ids, pooling="last", normalize=-1), hidden[-1])
    unit = hidden.mean(0).double() / hidden.mean(0).double().norm()  # default: L2, as --embd-normalize 2
    assert torch.allclose(demo.embed(ids), unit.float(), atol=1e-6)
    demo.eval(ids[:3], seq_id=0)
    demo.embed(ids)  # another sequence: sequence 0 keeps its cells
    assert demo.memory.seq_len(0) == 3 and demo.n_past == 3
    demo.reset()
    with pytest.raises(ValueError, match="pooling"):
        demo.embed(ids, pooling="max")


LOGITS = [2.0, 1.0, 0.5, -1.0]
BIAS = [  # (logit_bias, the greedy token)
    ((), 0),
    (((0, -math.inf),), 1),             # banned (false in a request)
    (((0, -math.inf), (1, -math.inf)), 2),
    (((3, 3.5),), 3),                   # -1 + 3.5 > 2
    (((3, 1.5), (3, 1.6)), 3),          # a token listed twice gets both biases
    (((2, 1.0),), 0),                   # 1.5 < 2
]


@pytest.mark.parametrize("bias,token", BIAS)
def test_logit_bias_is_added_before_the_chain(bias, token):
    """llama.cpp's logit-bias sampler: added to the logits first (the greedy pick moves), while the
    reported log-probabilities stay the model's own."""
    logits = torch.tensor(LOGITS)
    choice = Sampler(SamplingParams(temperature=0, logit_bias=bias, logprobs=1)).sample(logits)
    assert choice.token == token
    assert choice.logprob == pytest.approx(float(torch.log_softmax(logits.double(), -1)[token]))
    drawn = {Sampler(SamplingParams(temperature=1.0, top_k=0, top_p=1.0, logit_bias=bias, seed=s)).sample(logits).token
             for s in range(40)}
    assert not drawn & {t for t, b in bias if b == -math.inf}


@pytest.mark.parametrize("bias", [((0, math.nan),), ((0, math.inf),)])
def test_logit_bias_must_be_finite_or_a_ban(bias):
    with pytest.raises(ValueError, match="logit_bias"):
        SamplingParams(logit_bias=bias)


@pytest.mark.parametrize("temperature", [0.8, 1e-3, 1e-260, 1e260])
@pytest.mark.parametrize("values", ["distinct", "ties", "masked"])
def test_top_k_candidates_are_those_of_the_divided_logits(temperature, values):
    """The top-k candidates (selected before the division by the temperature where that keeps
    the order) are the k highest of logits / temperature in float64, same ids, same values."""
    from torchggml.models.sampling import _candidates
    g = torch.Generator().manual_seed(3)
    x = torch.randn(5000, generator=g) * 4
    if values == "ties":
        x = torch.round(x)
    elif values == "masked":  # a grammar's mask: fewer allowed tokens than k
        x[torch.rand(5000, generator=g) < 0.995] = -math.inf
    ids, probs = _candidates(x, temperature, 40, 1.0, 0.0)
    want_values, want_ids = torch.topk(x.double() / temperature, 40)
    assert torch.equal(ids, want_ids)
    assert torch.equal(probs, torch.softmax(want_values, dim=-1))
