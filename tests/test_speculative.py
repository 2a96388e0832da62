"""Speculative decoding (models/speculative.py, batch_generator.py): drafts proposed by prompt lookup
or a draft model, checked by the model in one batch; the text is plain decoding's."""
from __future__ import annotations

import pytest

from torchggml.models import load_model
from torchggml.models.speculative import ModelDraft, NgramDraft, make_draft

REPEATING = "Once upon a time there was a graph. Once upon a time there was a graph. Once upon"


@pytest.mark.parametrize("context, k, n_max, want", [
    ([1, 2, 3, 9, 1, 2, 3], 2, 3, [9, 1]),            # the 3-token tail seen before
    ([1, 2, 3, 9, 5, 2, 3], 3, 3, [9, 5, 2]),         # only a 2-token tail matches
    ([4, 7, 4, 8, 4], 1, 3, [8]),                      # the last earlier occurrence wins
    ([1, 2, 3, 4], 4, 3, []),                          # nothing repeats
    ([5, 5], 4, 3, [5]),                               # the draft stops at the context's end
    ([7], 4, 3, []),                                   # too short to look up
])
def test_ngram_draft_proposes_what_followed_the_tail(context, k, n_max, want):
    assert NgramDraft(n_max=n_max).propose(0, context, k) == want


@pytest.mark.parametrize("draft", ["ngram", "model"])
def test_speculative_generation_gives_plain_decodings_text(demo, demo_path, draft):
    plain = "".join(demo.generate(REPEATING, max_tokens=40, temperature=0))
    drafter = load_model(demo_path, progress=False) if draft == "model" else draft
    try:
        fast = "".join(demo.generate(REPEATING, max_tokens=40, temperature=0, draft=drafter, n_draft=6))
    finally:
        if draft == "model":
            drafter.close()
    t = demo.timings
    assert fast == plain and t.gen_tokens == 40
    assert t.accepted > 0 and t.drafted >= t.accepted
    if draft == "model":  # the model drafting for itself: every draft is taken
        assert t.accepted == t.drafted


def test_sampling_with_a_draft_follows_the_seed(demo):
    """At temperature > 0 every token is still drawn from the model's rows: a seed gives one text."""
    a = "".join(demo.generate(REPEATING, max_tokens=16, temperature=0.9, seed=3, draft="ngram"))
    b = "".join(demo.generate(REPEATING, max_tokens=16, temperature=0.9, seed=3, draft="ngram"))
    assert a == b and a


def test_a_draft_model_needs_the_same_vocabulary(demo, tmp_path):
    from torchggml.gguf.writer.tiny import write_tiny_model
    other = load_model(write_tiny_model(tmp_path / "qwen3moe.gguf", "qwen3moe"), progress=False)
    try:
        with pytest.raises(ValueError, match="same vocabulary"):
            ModelDraft(other, demo)
    finally:
        other.close()
    with pytest.raises(ValueError, match="draft="):
        make_draft(42, demo)


@pytest.mark.parametrize("copies, as_f32", [(1, False), (2, True)])
def test_a_deepened_target_keeps_its_sources_predictions(demo, demo_path, tmp_path, copies, as_f32):
    """scripts/make_deep_target.py (the speculative benchmark's constructed target): zero-output copies
    of each layer leave the logits the source's exactly; the source drafts for it, every draft taken."""
    import os
    import sys

    import torch
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "scripts"))
    from make_deep_target import deepen
    path = str(tmp_path / "deep.gguf")
    assert deepen(demo_path, path, copies, as_f32) == demo.hp.n_layer * (1 + copies)
    deep = load_model(path, progress=False)
    try:
        ids = demo.tokenize(REPEATING)
        demo.reset()
        assert torch.equal(deep.eval(ids, logits="all"), demo.eval(ids, logits="all"))
        fast = "".join(deep.generate(REPEATING, max_tokens=12, temperature=0, draft=demo, n_draft=4))
        assert fast == "".join(demo.generate(REPEATING, max_tokens=12, temperature=0))
        assert deep.timings.accepted == deep.timings.drafted > 0
    finally:
        deep.close()
