"""GET / POST /lora-adapters and the `lora` request field: LoRA adapters loaded by
`serve --lora FILE` (--lora-scaled FILE SCALE, --lora-init-without-apply), as llama-server's.

    GET  /lora-adapters  -> [{"id": 0, "path": "a.gguf", "scale": 1.0}, ...]
    POST /lora-adapters  [{"id": 0, "scale": 0.5}, ...]   the server's scales (an adapter left out: 0)
    "lora": [{"id": 0, "scale": 0.5}]  on a completion, chat, /completion or /infill request: this
                                        request's scales (an adapter left out: 0)

A request runs with its own scales or, without a `lora` field, the server's at the time it was
sent. Sequences with other scales than the running ones are not batched with them: they wait
until those end (engine.py), then the model's adapters take their scales (the graph is rebuilt)
and the slots' prompt cache is cleared.
"""
from __future__ import annotations

import math

from fastapi import Request
from pydantic import RootModel

from .protocol import APIError, LoraScale

ROUTES = {"/lora-adapters"}


class LoraScales(RootModel[list[LoraScale]]):
    pass


def scales_of(entries: list[LoraScale], n: int, param: str) -> tuple[float, ...]:
    """The scale of each of the n adapters: those given, 0 for the others."""
    scales = [0.0] * n
    for i, e in enumerate(entries):
        if not 0 <= e.id < n:
            loaded = f"ids 0..{n - 1}" if n else "none: serve with --lora FILE"
            raise APIError(400, f"{param}[{i}]: no LoRA adapter {e.id} (loaded: {loaded})", param)
        if not math.isfinite(e.scale):
            raise APIError(400, f"{param}[{i}]: the scale must be a finite number", param)
        scales[e.id] = float(e.scale)
    return tuple(scales)


def load_adapters(model, engine, files: list[tuple[str, float]]) -> list[str]:
    """Load (path, scale) adapters onto `model` and let `engine` change their scales; the paths."""
    from ..models.lora import LoraAdapter, LoraSet
    adapters = LoraSet(LoraAdapter.load(model, path, scale) for path, scale in files)
    model.set_lora(adapters)

    def set_scales(scales):
        adapters.set_scales(scales)
        model.set_lora(adapters)  # the next graph is built with the new scales
    engine.set_lora, engine.lora = set_scales, adapters.scales
    return [path for path, _ in files]


def register(app, state, serving) -> None:
    @app.get("/lora-adapters")
    async def get_adapters():
        return [{"id": i, "path": path, "scale": scale}
                for i, (path, scale) in enumerate(zip(state.lora_paths, state.lora_scales))]

    @app.post("/lora-adapters")
    async def set_adapters(request: Request):
        if not state.lora_paths:
            raise APIError(400, "no LoRA adapter is loaded (serve --lora FILE)", None)
        raw = await serving.parse_body(request, LoraScales)
        state.lora_scales = scales_of(raw.root, len(state.lora_paths), "body")
        return await get_adapters()
