"""Tensor parallel across processes: `torchrun --nproc-per-node 2 -m torchggml eval MODEL
--tensor-parallel dist` on CPU (gloo over loopback) gives the single-process logits."""
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from test_models import GOLDEN, HAVE_GOLDEN, rel_err

ROOT = Path(__file__).resolve().parents[1]
TOKENS = "1,5,9,200,3,77,400,12,0,511,256,128,64,32,16,8"


def _torchrun() -> list[str] | None:
    exe = shutil.which("torchrun")
    if exe:
        return [exe]
    try:
        import torch.distributed.run  # noqa: F401
        return [sys.executable, "-m", "torch.distributed.run"]
    except ImportError:
        return None


@pytest.mark.skipif(not HAVE_GOLDEN, reason="golden data not found")
@pytest.mark.skipif(_torchrun() is None, reason="torchrun is not available")
@pytest.mark.parametrize("model,max_err", [("llama-F32", 1e-4)])
def test_torchrun_two_ranks_give_single_process_logits(tmp_path, model, max_err):
    import torch.distributed as dist
    if not dist.is_available() or not dist.is_gloo_available():
        pytest.skip("torch.distributed with gloo is not available")
    path = GOLDEN / "models" / f"{model}.gguf"
    out = tmp_path / "logits.npy"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    env.pop("TORCHGGML_SIM_DEVICES", None)
    cmd = [*_torchrun(), "--standalone", "--nproc-per-node", "2", "-m", "torchggml", "eval", str(path),
           "--tensor-parallel", "dist", "--tokens", TOKENS, "--chunks", "8,1,1,1,1,1,1,1,1", "-o", str(out)]
    run = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=240)
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout.count("argmax:") == 1  # rank 0 prints, rank 1 stays quiet

    import torchggml as ggml
    single = ggml.load_model(path, progress=False)
    tokens = [int(t) for t in TOKENS.split(",")]
    ref = np.concatenate([single.eval(tokens[:8]).numpy()] + [single.eval([t]).numpy() for t in tokens[8:]])
    single.close()
    err = rel_err(np.load(out), ref)
    assert err <= max_err, f"torchrun tensor parallel vs one process: relative L2 {err:.2e}"
