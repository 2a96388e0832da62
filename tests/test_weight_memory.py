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
from torchggml.gguf import GGUFError, open_gguf
from torchggml.models import load_model
from torchggml.models import loading
from torchggml.models.params import ModelParams


@pytest.fixture(scope="module")
def demo_path():
    from torchggml.gguf_writer.demo import demo_model_path
    return demo_model_path()


def _logits(model, tokens):
    model.reset()
    return model.eval(tokens)


def test_weights_read_into_memory_give_the_same_logits(demo_path):
    mapped = load_model(demo_path, n_ctx=32, progress=False, use_mmap=True)
    read_in = load_model(demo_path, n_ctx=32, progress=False, use_mmap=False)
    try:
        assert mapped.weights.cpu_read_in == 0 and "read into memory" not in mapped.describe()
        total = sum(info.nbytes for info in read_in.file.tensors.values())
        assert read_in.weights.cpu_read_in == total
        assert f"{total / 2**20:.0f} MiB of CPU weights read into memory" in read_in.describe()
        # the weights' memory is no longer the file's mapping
        region = read_in.file.data_region()
        start, end = region.ctypes.data, region.ctypes.data + region.size
        for t in read_in.weights.tensors.values():
            assert not start <= t.data < end, t.name
        tokens = [1, 5, 9, 14]
        torch.testing.assert_close(_logits(read_in, tokens), _logits(mapped, tokens), rtol=0, atol=0)
    finally:
        mapped.close()
        read_in.close()


class _File:
    """What weights_to_copy asks of a GGUFFile."""

    def __init__(self, nbytes: int, huge: bool):
        self.file_size, self.data_offset, self.huge = nbytes, 0, huge

    def maps_in_huge_pages(self) -> bool:
        return self.huge


BIG = loading.COPY_MIN_BYTES
# (use_mmap, data bytes, the kernel maps the file in huge pages) -> copied: matrix weight, norm
COPY_CASES = [
    (True, BIG, False, (False, False)),     # always views
    (False, 1 << 20, True, (True, True)),   # always read in, every tensor
    (None, BIG, False, (True, False)),      # 4 KiB pages: the matrix weights read into huge pages
    (None, BIG, True, (False, False)),      # the mapping is in huge pages already
    (None, BIG - 1, False, (False, False)),  # a small file: views
]


@pytest.mark.parametrize("use_mmap,nbytes,huge,want", COPY_CASES,
                         ids=[f"{c[0]}-{c[1]}-{'huge' if c[2] else 'small'}" for c in COPY_CASES])
def test_which_weights_are_read_into_memory(use_mmap, nbytes, huge, want):
    copy = loading.weights_to_copy(_File(nbytes, huge), use_mmap)
    got = tuple(copy is not None and copy(name) for name in ("blk.0.ffn_up.weight", "blk.0.attn_norm.weight"))
    assert got == want


def test_the_default_reads_matrix_weights_of_a_file_in_small_pages(demo_path, monkeypatch):
    monkeypatch.setattr(loading, "COPY_MIN_BYTES", 0)
    monkeypatch.setattr(ggml.gguf.GGUFFile, "maps_in_huge_pages", lambda self, probes=8: False)
    model = load_model(demo_path, n_ctx=32, progress=False)
    try:
        up, norm = model.weights["blk.0.ffn_up.weight"], model.weights["blk.0.attn_norm.weight"]
        region = model.file.data_region()
        assert not region.ctypes.data <= up.data < region.ctypes.data + region.size
        assert region.ctypes.data <= norm.data < region.ctypes.data + region.size
        assert 0 < model.weights.cpu_read_in < sum(i.nbytes for i in model.file.tensors.values())
    finally:
        model.close()


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
        assert int(ggml.memory.byte_view(big, (8 << 20) - 1, 1)[0]) == 7
    finally:
        big.free()


@pytest.mark.parametrize("argv,want", [([], None), (["--mmap"], True), (["--no-mmap"], False)])
def test_mmap_flags(argv, want):
    import argparse
    from torchggml.models.cli_commands import add_model_options, model_params
    p = argparse.ArgumentParser()
    add_model_options(p)
    assert model_params(p.parse_args(argv)).use_mmap is want


def test_use_mmap_must_be_a_bool_or_none():
    with pytest.raises(TypeError, match="use_mmap must be True, False or None, got 'yes'"):
        ModelParams(use_mmap="yes")
