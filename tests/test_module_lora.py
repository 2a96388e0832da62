"""Model.as_module() and LoRA: the module's logits equal Model.eval, its parameters are zero-copy
(float) or dequantize on access (quantized), the KV cache is a buffer, .to() moves it; a
20-step LoRA fine-tune of the demo model lowers its loss, and the saved GGUF adapter loads back
(here and, when llama-cpp-python is installed, in llama.cpp)."""
from __future__ import annotations

import dataclasses
import importlib.util
import subprocess
import sys

import numpy as np
import pytest
import torch

from torchggml.gguf.loader import GGUFError
from torchggml.models import load_model
from torchggml.gguf.writer.demo import DEMO_CONFIG, generated_model
from torchggml.models.module import QuantizedWeight

TEXT = "Once upon a time there was a small program that wanted to run a language model"


@pytest.fixture(autouse=True)
def one_thread():
    """The demo model's products are tiny: one torch thread is fastest, and on a busy machine
    two threads spinning in OpenMP barriers are ten times slower."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture(scope="module")
def demo_dir(tmp_path_factory):
    return str(tmp_path_factory.mktemp("demo"))


@pytest.fixture(scope="module")
def demo_path(demo_dir):
    return generated_model(DEMO_CONFIG, "F32", directory=demo_dir)


def fresh(path, **kw):
    return load_model(path, n_ctx=64, progress=False, **kw)


@pytest.mark.parametrize("devices", ["CPU", "SIM0", "SIM0,CPU"])
def test_module_logits_equal_model_eval(demo_path, devices):
    from torchggml.models.placement import find_device
    try:
        [find_device(d) for d in devices.split(",")]
    except ValueError:
        pytest.skip(f"no {devices} devices")
    model = fresh(demo_path, devices=devices.split(","))  # two devices: through the scheduler
    ids = model.tokenize(TEXT)
    expected = model.eval(ids)
    module = model.as_module()
    assert isinstance(module, torch.nn.Module)
    assert torch.equal(module(torch.tensor(ids)), expected)
    # positions continue a sequence through the cache, as eval's micro-batches do
    head = module(torch.tensor(ids[:5]))
    tail = module(torch.tensor(ids[5:]), torch.arange(5, len(ids)))
    assert torch.allclose(torch.cat([head, tail]), expected, atol=1e-4)


def test_parameters_are_zero_copy_and_the_kv_cache_is_a_buffer(demo_path):
    model = fresh(demo_path)
    module = model.as_module()
    params = dict(module.named_parameters())
    assert set(params) == set(model.weight_buffers.tensors)
    from torchggml import to_torch
    w = model.weight_buffers.tensors["blk.0.attn_q.weight"]
    assert params["blk.0.attn_q.weight"].data_ptr() == to_torch(w).data_ptr()
    assert not any(p.requires_grad for p in params.values())
    state = module.state_dict()
    assert "blk.3.ffn_down.weight" in state and not any(k.startswith("kv_cache") for k in state)
    buffers = dict(module.named_buffers())
    assert buffers["kv_cache.cache_k_l0"].data_ptr() == to_torch(model.memory.k[0]).data_ptr()


def test_quantized_weights_dequantize_on_access(demo_dir):
    import gguf
    path = generated_model(DEMO_CONFIG, "Q8_0", directory=demo_dir)
    model = load_model(path, n_ctx=256, progress=False, repack=False)
    module = model.as_module()
    p = module.get_parameter("blk.1.ffn_up.weight")
    assert isinstance(p, QuantizedWeight) and not p.requires_grad
    assert p.shape == (DEMO_CONFIG.n_ff, DEMO_CONFIG.n_embd) and p.dtype == torch.float32
    reader = gguf.GGUFReader(path)
    info = next(t for t in reader.tensors if t.name == "blk.1.ffn_up.weight")
    reference = torch.from_numpy(gguf.quants.dequantize(info.data, info.tensor_type).copy())
    assert torch.equal(p * 1.0, reference)           # any op reads dequantized values
    assert torch.equal(module.state_dict()["blk.1.ffn_up.weight"].dequantize(), reference)


def test_lora_trains_beside_repacked_quantized_weights(demo_dir):
    """MXFP4 projections on the CPU live in CPU_REPACK (the fused layout): the forward uses them
    as they are, the backward reads their values from the file through QuantizedWeight."""
    path = generated_model(DEMO_CONFIG, "MXFP4", directory=demo_dir)
    model = load_model(path, n_ctx=64, progress=False)
    assert not model.weight_buffers.tensors["blk.0.attn_q.weight"].buffer.ggml_layout
    model.add_lora(2, ["attn_q", "ffn_down"], seed=1)
    module = model.as_module()
    ids = model.tokenize(TEXT)
    x, y = torch.tensor(ids[:-1]), torch.tensor(ids[1:])
    opt = torch.optim.Adam([p for p in module.parameters() if p.requires_grad], lr=1e-2)
    losses = []
    for _ in range(4):
        loss = torch.nn.functional.cross_entropy(module(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < losses[0]
    assert torch.allclose(module(x), model.eval(x.tolist()), atol=1e-4)


def test_module_moves_between_devices(demo_path):
    from torchggml.models.placement import find_device
    try:
        find_device("SIM0")
    except ValueError:
        pytest.skip("no SIM device")
    model = fresh(demo_path)
    model.add_lora(2, ["attn_q"], seed=3)
    with torch.no_grad():
        for p in model.lora.parameters().values():
            p.add_(0.01)
    module = model.as_module()
    ids = torch.tensor(model.tokenize(TEXT))
    on_cpu = module(ids)
    assert module.to("SIM0") is module
    assert module.model.placement.devices[0].get_name() == "SIM0"
    # the devices run different float32 kernels (the CPU's numba ones round sqrt correctly, as
    # ggml's sqrtf; torch's SLEEF sqrt is within 0.5001 ulp), which this small model amplifies to
    # ~3e-5 relative: compared as the golden tests compare devices, by relative L2 error
    on_sim = module(ids)
    assert ((on_sim - on_cpu).norm() / on_cpu.norm()).item() < 1e-4
    assert module.to("cpu") is module and torch.allclose(module(ids), on_cpu, atol=1e-4)


def test_a_20_step_lora_fine_tune_lowers_the_loss_and_the_adapter_round_trips(demo_path, tmp_path):
    model = fresh(demo_path)
    ids = model.tokenize(TEXT)
    base = model.eval(ids)
    model.reset()
    adapter = model.add_lora(4, ["attn_q", "attn_v", "ffn_up", "output"], alpha=8, seed=0)
    module = model.as_module()
    trainable = [p for p in module.parameters() if p.requires_grad]
    assert len(trainable) == 2 * len(adapter.pairs) == 2 * (3 * DEMO_CONFIG.n_layer + 1)
    assert torch.equal(module(torch.tensor(ids)), base)  # B starts at zero
    opt = torch.optim.Adam(trainable, lr=3e-3)
    x, y = torch.tensor(ids[:-1]), torch.tensor(ids[1:])
    losses = []
    for _ in range(20):
        loss = torch.nn.functional.cross_entropy(module(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < 0.5 * losses[0]
    tuned = model.eval(ids)  # Model.eval uses the adapter too
    model.reset()
    assert not torch.allclose(tuned, base)
    assert torch.allclose(module(torch.tensor(ids)), tuned, atol=1e-5)

    path = adapter.save(tmp_path / "adapter.gguf")
    import gguf
    reader = gguf.GGUFReader(path)
    fields = {k: reader.fields[k] for k in ("general.type", "adapter.type", "adapter.lora.alpha")}
    assert bytes(fields["general.type"].parts[-1]).decode() == "adapter"
    assert bytes(fields["adapter.type"].parts[-1]).decode() == "lora"
    assert float(fields["adapter.lora.alpha"].parts[-1][0]) == 8.0
    shapes = {t.name: [int(n) for n in t.shape] for t in reader.tensors}
    assert shapes["blk.0.attn_q.weight.lora_a"] == [DEMO_CONFIG.n_embd, 4]   # ne [n_in, rank]
    assert shapes["blk.0.attn_q.weight.lora_b"] == [4, DEMO_CONFIG.n_embd]   # ne [rank, n_out]

    other = fresh(demo_path)
    other.load_lora(path)
    assert torch.equal(other.eval(ids), tuned)
    if importlib.util.find_spec("llama_cpp") is None:
        pytest.skip("llama-cpp-python is not installed (optional): the adapter was not loaded in llama.cpp")
    out = tmp_path / "llama_cpp.npy"
    subprocess.run([sys.executable, "-c", LLAMA_CPP_LORA_LOGITS, demo_path, path, ",".join(map(str, ids)), str(out)],
                   check=True)
    ref = np.load(out)
    err = float(((tuned.numpy() - ref) ** 2).sum() / (ref ** 2).sum())
    assert err < 1e-5 and float(((base.numpy() - ref) ** 2).sum() / (ref ** 2).sum()) > 1e-3


# run in a child process: llama.cpp's OpenMP threads would slow torch down in this one
LLAMA_CPP_LORA_LOGITS = """
import sys, numpy as np, llama_cpp
model, adapter, ids, out = sys.argv[1:]
llm = llama_cpp.Llama(model_path=model, lora_path=adapter, n_ctx=64, n_batch=64, n_threads=2,
                      logits_all=True, verbose=False)
ids = [int(i) for i in ids.split(",")]
llm.eval(ids)
np.save(out, np.array(llm.scores[: len(ids)]))
"""


def test_the_module_keeps_a_few_graphs_and_backward_outlives_eviction(demo_path):
    model = fresh(demo_path)
    model.add_lora(2, ["ffn_up"])
    module = model.as_module()
    ids = torch.tensor(model.tokenize(TEXT))
    outs = [module(ids[:n]) for n in range(2, 3 + module.MAX_GRAPHS)]  # one shape more than kept
    assert len(module._functions) == module.MAX_GRAPHS
    sum(o.sum() for o in outs).backward()  # the first graph's backward still runs
    assert all(p.grad is not None for p in module.parameters() if p.requires_grad)
    first = model.lora
    model.set_lora(None)  # the module follows the model's adapters
    assert module(ids[:3]).shape == (3, model.n_vocab) and not any(p.requires_grad for p in module.parameters())
    assert first.pairs == {}  # set_lora freed the previous adapter


def test_lora_arguments_and_files_are_checked(demo_path, tmp_path):
    model = fresh(demo_path)
    with pytest.raises(ValueError, match="target 'attn_norm' matches no weight"):
        model.add_lora(4, ["attn_norm"])
    with pytest.raises(ValueError, match="rank must be positive"):
        model.add_lora(0)
    with pytest.raises(GGUFError, match="general.type is None, expected 'adapter'"):
        model.load_lora(demo_path)
    model.add_lora(2, ["ffn_down"])
    path = model.lora.save(tmp_path / "a.gguf")
    smaller = dataclasses.replace(DEMO_CONFIG, n_embd=128, n_ff=256)
    other = load_model(generated_model(smaller, "F32", directory=str(tmp_path)), n_ctx=64, progress=False)
    with pytest.raises(GGUFError, match="do not fit the weight"):
        other.load_lora(path)
