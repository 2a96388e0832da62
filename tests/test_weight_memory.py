"""Where CPU weights live (ModelParams.use_mmap): views of the file's mapping, or read into CPU
memory in huge pages, which a decode step streams faster than the mapping's 4 KiB pages."""
from __future__ import annotations

import mmap
import os
import shutil
import sys

import numpy as np
import pytest
import torch

import torchggml as ggml
from torchggml.gguf.loader import GGUFError, open_gguf
from torchggml.models import load_model
from torchggml.models.params import ModelParams


def _logits(model, tokens):
    model.reset()
    return model.eval(tokens)


def test_weights_read_into_memory_give_the_same_logits(demo_path):
    mapped = load_model(demo_path, n_ctx=32, progress=False, use_mmap=True)
    read_in = load_model(demo_path, n_ctx=32, progress=False, use_mmap=False)
    try:
        assert mapped.weight_buffers.cpu_read_in == 0 and "read into memory" not in mapped.describe()
        total = sum(info.nbytes for info in read_in.file.tensors.values())
        assert read_in.weight_buffers.cpu_read_in == total
        assert f"{total / 2**20:.0f} MiB of CPU weights read into memory" in read_in.describe()
        # the weights' memory is no longer the file's mapping
        region = read_in.file.data_region()
        start, end = region.ctypes.data, region.ctypes.data + region.size
        for t in read_in.weight_buffers.tensors.values():
            assert not start <= t.data < end, t.name
        tokens = [1, 5, 9, 14]
        torch.testing.assert_close(_logits(read_in, tokens), _logits(mapped, tokens), rtol=0, atol=0)
    finally:
        mapped.close()
        read_in.close()


@pytest.mark.skipif(not os.path.exists("/proc/self/smaps"), reason="/proc/self/smaps is Linux's")
def test_smaps_fields_are_read_for_the_mapping_holding_an_address():
    """The huge-page probe's reader: a field of the mapping that holds an address."""
    from torchggml.gguf.loader import _smaps_field
    m = mmap.mmap(-1, 8 << 20, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    a = np.frombuffer(m, np.uint8)
    a[::4096] = 1  # every page touched: resident
    assert _smaps_field(a.ctypes.data + (5 << 20), "Rss:") >= 8 << 10
    assert _smaps_field(a.ctypes.data, "NoSuchField:") is None
    del a


def test_converting_a_weight_bounds_its_temporaries(monkeypatch):
    """A weight converted to the fused layout by torch ops (IQ4_NL here) is decomposed at most 1M
    values at a time: the temporaries of a chunk (int64 indices among them, ~8 bytes a value)
    are freed into malloc's heap, where glibc keeps blocks under its raised mmap threshold
    resident (4M-value chunks left ~50 MB there after SmolLM2's IQ4_NL tied head was converted,
    1M ~8 MB); the converted weight is the one a single chunk gives."""
    from torchggml.devices.cpu.layouts import fused
    n, k = 96, 16384
    raw = torch.from_numpy(np.random.default_rng(0).integers(0, 256, (n, k // 32, 18), dtype=np.uint8))
    raw[:, :, :2] = torch.tensor([0x00, 0x3C], dtype=torch.uint8)  # each block's scale: 1.0 in half
    raw = raw.reshape(n, -1)
    chunks, decompose = [], fused.decompose
    monkeypatch.setattr(fused, "decompose", lambda qtype, blocks, k: chunks.append(blocks.shape[0] * k)
                        or decompose(qtype, blocks, k))
    p = fused.packed_blocks(ggml.Type.IQ4_NL, raw)
    assert sum(chunks) == n * k and max(chunks) <= 1 << 20 and len(chunks) == 2
    monkeypatch.setattr(fused, "CONVERT_ROWS_VALUES", n * k)
    whole = fused.packed_blocks(ggml.Type.IQ4_NL, raw)
    assert np.array_equal(p.q, whole.q) and np.array_equal(p.scale, whole.scale)


def test_small_files_are_not_probed_for_huge_pages(demo_path):
    assert open_gguf(demo_path).maps_in_huge_pages(probes=10**6) is False


def test_reading_a_tensor_of_a_file_truncated_since_opened_raises(demo_path, tmp_path):
    path = tmp_path / "m.gguf"
    shutil.copy(demo_path, path)
    file = open_gguf(path)
    name = max(file.tensors, key=lambda n: file.tensors[n].offset)  # the last tensor
    out = np.empty(file.tensors[name].nbytes, np.uint8)
    file.read_into(name, out)
    assert np.array_equal(out, file.tensor_data(name))
    os.truncate(path, file.data_offset + file.tensors[name].offset + 8)
    with pytest.raises(GGUFError, match=r"m\.gguf: the model file was truncated"):
        file.read_into(name, out)


@pytest.mark.skipif(not (sys.platform.startswith("linux") and hasattr(mmap, "MADV_HUGEPAGE")),
                    reason="transparent huge pages are Linux's (madvise MADV_HUGEPAGE)")
def test_large_cpu_buffers_ask_for_huge_pages():
    dev = ggml.backend_dev_by_type(ggml.DeviceType.CPU)
    big = dev.get_buffer_type().alloc_buffer(8 << 20)
    try:
        def flags(address):
            with open("/proc/self/smaps") as f:
                inside = False
                for line in f:
                    head = line.split(maxsplit=1)[0]
                    if "-" in head and not head.endswith(":"):
                        lo, hi = (int(v, 16) for v in head.split("-"))
                        inside = lo <= address < hi
                    elif inside and head == "VmFlags:":
                        return line.split()[1:]
        assert "hg" in flags(big.get_base())
        big.clear(7)  # usable as any buffer
        assert int(ggml.storage.byte_view(big, (8 << 20) - 1, 1)[0]) == 7
    finally:
        big.free()


@pytest.mark.parametrize("argv,want", [([], True), (["--no-mmap"], False)])
def test_mmap_flags(argv, want):
    import argparse
    from torchggml.cli.models import add_model_options, model_params
    p = argparse.ArgumentParser()
    add_model_options(p)
    assert model_params(p.parse_args(argv)).use_mmap is want


def test_use_mmap_must_be_a_bool():
    with pytest.raises(TypeError, match="use_mmap must be True or False, got 'yes'"):
        ModelParams(use_mmap="yes")


def test_page_in_keeps_the_file_and_reports_its_pages(demo_path, tmp_path, capsys):
    """page_in drops the file's cached pages and reads them again (through a mapping advised
    huge pages): the bytes are the file's, and it says whether the file maps in huge pages
    before and after (a file this small never counts: fewer 2 MiB spans than probes)."""
    from torchggml.cli import main
    from torchggml.gguf.loader import page_in
    path = tmp_path / "m.gguf"
    shutil.copy(demo_path, path)
    data = path.read_bytes()
    assert page_in(path) == (False, False)
    assert path.read_bytes() == data
    assert main(["page-in", str(path)]) == 0
    assert "still in 4 KiB pages" in capsys.readouterr().out
