"""Test session set-up: two simulated accelerators and Triton's CPU interpreter, so every
multi-device and kernel path runs on a machine without a GPU. Set before torchggml or triton
is imported by any test module."""
import contextlib
import os
from pathlib import Path

import pytest

os.environ.setdefault("TORCHGGML_SIM_DEVICES", "2")
os.environ.setdefault("TRITON_INTERPRET", "1")
# tests check results, not speed: sleeping OpenMP workers keep a shared 2-core runner usable
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
os.environ.setdefault("TORCHGGML_GOLDEN", str(Path(__file__).resolve().parents[1].parent / "shared" / "golden"))


# ---------------------------------------------------------------- the slow marker

def pytest_addoption(parser):
    parser.addoption("--slow", action="store_true", help="also run the tests marked slow (the large tables)")


def pytest_configure(config):
    config.addinivalue_line("markers", "slow: large tables, run with --slow")


def pytest_collection_modifyitems(config, items):
    if config.getoption("--slow"):
        return
    skip = pytest.mark.skip(reason="slow: run with pytest --slow")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip)


# ---------------------------------------------------------------- shared fixtures

@pytest.fixture(scope="session")
def golden() -> Path:
    """The golden data folder (GGUF models with llama.cpp's logits, vocabularies)."""
    return Path(os.environ["TORCHGGML_GOLDEN"])


@pytest.fixture(scope="session")
def demo_path() -> str:
    """The built-in demo model's file (seeded weights, written once into the cache)."""
    from torchggml.gguf.writer.demo import demo_model_path
    return demo_model_path()


@pytest.fixture(scope="module")
def demo(demo_path):
    """The demo model, loaded once per test module (a module that changes its options loads its own)."""
    from torchggml.models import load_model
    model = load_model(demo_path, progress=False)
    yield model
    model.close()


@pytest.fixture(scope="session")
def llama_cpp():
    """llama-cpp-python (the llama.cpp oracle), or the test skips saying it is absent."""
    return pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed (the llama.cpp comparisons)")


@contextlib.contextmanager
def serving(model, model_id: str = "tiny", parallel: int = 1, api_key: str | None = None, loras=(), **state_options):
    """`model` served in this process (fastapi's TestClient: an httpx client, also for the openai
    and anthropic SDKs as their http_client), with LoRA adapters `loras` ((path, scale) as serve
    --lora-scaled); the engine stopped afterwards."""
    testclient = pytest.importorskip("fastapi.testclient", reason="the server extra is not installed")
    from torchggml.server.app import ServerState, create_app
    from torchggml.server.engine import Engine
    engine = Engine(model, parallel)
    state = ServerState(model, engine, model_id, **state_options)
    if loras:
        from torchggml.server.lora_adapters import load_adapters
        state.lora_paths, state.lora_scales = load_adapters(model, engine, list(loras)), engine.lora
    try:
        with testclient.TestClient(create_app(state, api_key)) as client:
            yield client
    finally:
        engine.stop()
