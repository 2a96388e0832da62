"""The recurrent and hybrid memories (models/recurrent_state.py) on the tiny models of
gguf/writer/tiny.py: micro-batched prompts leave the same states as one batch, sequences keep
their own slots (reset, copy, several in one batch), equal-split micro-batches, clear errors."""
from __future__ import annotations

import pytest
import numpy as np
import torch

from torchggml.backend.tensor_io import backend_tensor_get
from torchggml.gguf.writer.tiny import CASES_BY_NAME, write_tiny_model
from torchggml.models import load_model
from torchggml.models.kv_cache import KVCache
from torchggml.models.recurrent_state import HybridMemory, RecurrentState

TOKENS = list(CASES_BY_NAME["mamba"].tokens)


@pytest.fixture(scope="module")
def paths(tmp_path_factory):
    d = tmp_path_factory.mktemp("recurrent")
    names = ("mamba2", "rwkv6", "granitehybrid", "llama-moe")
    return {name: write_tiny_model(d / f"{name}.gguf", name) for name in names}


def states(model, seq_id: int) -> torch.Tensor:
    """Every recurrent layer's r and s rows of one sequence, concatenated."""
    rs = model.memory.recurrent
    slot = rs.slot_of[seq_id]
    rows = [backend_tensor_get(t).reshape(t.ne[1], -1)[slot] for t in (*rs.r.values(), *rs.s.values())]
    return torch.cat(rows)


@pytest.mark.parametrize("name, kind", [("mamba2", RecurrentState), ("rwkv6", RecurrentState),
                                        ("granitehybrid", HybridMemory), ("llama-moe", KVCache)])
def test_model_picks_the_memory_of_its_architecture(paths, name, kind):
    model = load_model(paths[name], progress=False, n_ctx=64)
    assert type(model.memory) is kind
    if kind is HybridMemory:  # KV only on the attention layer (head_count_kv (0, 2, 0))
        assert [t is not None for t in model.memory.kv.k] == [False, True, False]
        assert sorted(model.memory.rs.s) == [0, 2]
    model.close()


@pytest.mark.parametrize("name", ["mamba2", "rwkv6", "granitehybrid"])
def test_micro_batches_leave_the_states_of_one_batch(paths, name):
    one = load_model(paths[name], progress=False, n_ctx=64)
    one.eval(TOKENS)
    micro = load_model(paths[name], progress=False, n_ctx=64, n_batch=3)
    micro.eval(TOKENS[:7])
    micro.eval(TOKENS[7:])
    assert torch.allclose(states(one, 0), states(micro, 0), rtol=1e-5, atol=1e-6)
    assert one.memory.seq_len(0) == micro.memory.seq_len(0) == len(TOKENS)
    one.close()
    micro.close()


def test_sequences_keep_their_own_states(paths):
    model = load_model(paths["mamba2"], progress=False, n_ctx=64)
    alone = model.eval(TOKENS[:6], seq_id=5)
    model.reset()
    model.eval(TOKENS[6:], seq_id=2)                     # another sequence first
    both = model.eval_batch([TOKENS[:6], TOKENS[:3]], seq_ids=[5, 7])
    torch.testing.assert_close(both[0], alone, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(both[1], alone[:3], rtol=1e-4, atol=1e-5)
    model.reset(5)                                       # its slot zeroed and freed; 2 and 7 stay
    assert sorted(model.memory.recurrent.slot_of) == [2, 7] and model.memory.seq_len(5) == 0
    torch.testing.assert_close(model.eval(TOKENS[:6], seq_id=5), alone, rtol=1e-4, atol=1e-5)
    model.close()


@pytest.mark.parametrize("name", ["rwkv6", "granitehybrid", "llama-moe"])
def test_copy_continues_from_the_same_states(paths, name):
    """seq_cp: the recurrent states, and in a hybrid (or a transformer) the KV cells too."""
    model = load_model(paths[name], progress=False, n_ctx=64)
    model.eval(TOKENS[:8], seq_id=0)
    model.memory.copy(0, 1)
    if model.memory.recurrent is not None:
        torch.testing.assert_close(states(model, 1), states(model, 0))
    assert model.memory.seq_len(1) == model.memory.seq_len(0) == 8
    a, b = model.eval(TOKENS[8:10], seq_id=0), model.eval(TOKENS[8:10], seq_id=1)
    torch.testing.assert_close(a, b)
    model.close()


def test_equal_split_micro_batches():
    seq_ids = np.array([0] * 5 + [1] * 2 + [2] * 4)
    parts = RecurrentState.ubatches(RecurrentState.__new__(RecurrentState), seq_ids, 4)
    for part in parts:  # equal shares of each sequence present, grouped by sequence
        counts = np.bincount(seq_ids[part])
        assert len(set(counts[counts > 0].tolist())) == 1 and len(part) <= 4
        assert np.array_equal(seq_ids[part], np.sort(seq_ids[part], kind="stable"))
    assert np.array_equal(np.sort(np.concatenate(parts)), np.arange(11))


def test_too_many_sequences_is_a_clear_error(paths):
    model = load_model(paths["mamba2"], progress=False, n_ctx=64, n_seq_max=2)
    with pytest.raises(ValueError, match="n_seq_max"):
        model.eval_batch([[1], [2], [3]])
    assert model.n_past == 0  # nothing was evaluated
    model.close()


def test_non_finite_logits_clear_the_sequences_the_call_wrote(paths):
    """Recurrent states are overwritten in place, so a failed call cannot be undone: the sequences
    it wrote are cleared (zero slots, position 0), the others keep their states."""
    from torchggml import backend_tensor_get, backend_tensor_set
    from torchggml.models.model import NonFiniteLogitsError
    model = load_model(paths["granitehybrid"], progress=False, n_ctx=64)
    model.eval(TOKENS[:4], seq_id=0)
    model.eval(TOKENS[:5], seq_id=1)
    kept = states(model, 1)
    norm = model.weights.layers[0].attn_norm
    saved = backend_tensor_get(norm).clone()
    backend_tensor_set(norm, torch.full_like(saved, float("nan")))
    try:
        with pytest.raises(NonFiniteLogitsError):
            model.eval(TOKENS[4:8], seq_id=0)
    finally:
        backend_tensor_set(norm, saved)
    assert model.memory.seq_len(0) == 0 and 0 not in model.memory.recurrent.slot_of
    assert model.memory.seq_len(1) == 5 and torch.equal(states(model, 1), kept)
    fresh = load_model(paths["granitehybrid"], progress=False, n_ctx=64)
    torch.testing.assert_close(model.eval(TOKENS[:4], seq_id=0), fresh.eval(TOKENS[:4]))  # zeros again
    model.close()
    fresh.close()


@pytest.mark.parametrize("name, kept", [("llama-moe", True), ("mamba2", False), ("granitehybrid", False)])
def test_keep_prefix_where_the_memory_can_go_back(paths, name, kept):
    """A KV cache drops a sequence's tail (the prompt cache's reuse); recurrent and hybrid
    memories cannot, and say so by changing nothing."""
    model = load_model(paths[name], n_ctx=64, progress=False)
    model.eval(TOKENS[:8], seq_id=0)
    assert model.keep_prefix(0, 3) is kept
    assert model.memory.seq_len(0) == (3 if kept else 8)
    if kept:  # position 3 is next: the same logits as a fresh evaluation of the 4 tokens
        again = model.eval(TOKENS[3:4], seq_id=0)
        model.reset()
        assert torch.allclose(again, model.eval(TOKENS[:4], seq_id=0)[-1:], atol=1e-5)
