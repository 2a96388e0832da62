"""Running an mmproj's encoder: one ggml graph per tile (its size fixes the graph's shapes), on
the device that holds the weights, through a scheduler (backend_sched) as Model runs its graphs.

ENCODERS names each projector type's graph builder (one file per projector: gemma3.py,
idefics3.py, internvl.py, ldp.py, lfm2.py, llava.py, qwen2vl.py, qwen3vl.py, pixtral.py,
qwen2a.py, ultravox.py, voxtral.py; the shared pieces in vit.py): build(ctx, mm, image, inputs)
returns the embeddings [n_embd_text, n_tokens] of the pixels `image` [W, H, 3, 1] and appends
(tensor, values) to `inputs` for any other input it reads (positions)."""
from __future__ import annotations

import torch

from ..backend.backend import backend_free
from ..backend.device import DeviceType
from ..backend.sched import (backend_sched_alloc_graph, backend_sched_free, backend_sched_graph_compute,
                             backend_sched_new, backend_sched_reset)
from ..backend.tensor_io import backend_tensor_get, backend_tensor_set
from ..context import Context, new_tensor_4d
from ..graph import build_forward_expand, new_graph_custom
from ..models.placement import cpu_device
from ..tensor import set_input, set_name, set_output
from ..types import Type
from . import gemma3, idefics3, internvl, ldp, lfm2, llava, pixtral, qwen2a, qwen2vl, qwen3vl, ultravox, voxtral
from .loader import MMProj, SUPPORTED_PROJECTORS
from .preprocess import PreprocessedImage, Tile

ENCODERS = {"gemma3": gemma3.build, "idefics3": idefics3.build, "mlp": llava.build,
            "qwen2vl_merger": qwen2vl.build, "qwen2.5vl_merger": qwen2vl.build, "pixtral": pixtral.build,
            "internvl": internvl.build, "lfm2": lfm2.build, "qwen3vl_merger": qwen3vl.build,
            "qwen2a": qwen2a.build, "ultravox": ultravox.build, "voxtral": voxtral.build,
            "ldp": ldp.build, "ldpv2": ldp.build}
assert set(ENCODERS) == set(SUPPORTED_PROJECTORS)

GRAPH_SIZE = 8192


class Encoder:
    """Encodes image tiles or audio chunks with the mmproj's graph on its device (the CPU's
    backend is the scheduler's last, where the input is written)."""

    def __init__(self, mm: MMProj, n_threads: int | None = None):
        self.mm = mm
        devices = [mm.device] if mm.device.get_type() == DeviceType.CPU else [mm.device, cpu_device()]
        self.backends = [d.init_backend() for d in devices]
        if n_threads is not None:
            for b in self.backends:
                if hasattr(b, "set_n_threads"):
                    b.set_n_threads(n_threads)
        self.sched = backend_sched_new(self.backends, None, GRAPH_SIZE, False, True)

    def encode_tile(self, tile: Tile | torch.Tensor) -> torch.Tensor:
        """One tile's float32 [3, H, W] pixels -> float32 [n_tokens, n_embd_text] on the CPU."""
        pixels = tile.pixels if isinstance(tile, Tile) else tile
        if self.mm.vision is None:
            raise ValueError(f"{self.mm.path}: an audio projector ({self.mm.projector}) encodes mel chunks, not images")
        if pixels.dim() != 3 or pixels.shape[0] != 3:
            raise ValueError(f"encode: pixels must be [3, H, W], got {list(pixels.shape)}")
        h, w = int(pixels.shape[1]), int(pixels.shape[2])
        p = self.mm.vision.patch_size
        if h % p or w % p:
            raise ValueError(f"{self.mm.path}: a {w}x{h} tile is not a multiple of the patch size {p}")
        return self._run(pixels, (w, h, 3, 1))

    def encode_mel(self, mel: torch.Tensor) -> torch.Tensor:
        """One audio chunk's float32 [n_mel, n_frames] log-mel -> [n_tokens, n_embd_text] on the CPU."""
        if self.mm.audio is None:
            raise ValueError(f"{self.mm.path}: projector {self.mm.projector} has no audio encoder")
        if mel.dim() != 2 or mel.shape[0] != self.mm.audio.n_mel:
            raise ValueError(f"encode: mel must be [{self.mm.audio.n_mel}, n_frames], got {list(mel.shape)}")
        return self._run(mel, (int(mel.shape[1]), self.mm.audio.n_mel, 1, 1))

    def _run(self, values: torch.Tensor, ne) -> torch.Tensor:
        ctx = Context(no_alloc=True)
        image = new_tensor_4d(ctx, Type.F32, *ne)
        set_name(image, "inp_raw")
        set_input(image)
        inputs: list = []
        out = ENCODERS[self.mm.projector](ctx, self.mm, image, inputs)
        set_name(out, "mmproj_out")
        set_output(out)
        graph = new_graph_custom(ctx, GRAPH_SIZE)
        build_forward_expand(graph, out)
        backend_sched_reset(self.sched)
        if not backend_sched_alloc_graph(self.sched, graph):
            raise MemoryError(f"{self.mm.path}: cannot allocate the encoder graph for input {list(ne)}")
        backend_tensor_set(image, values.detach().float().cpu().contiguous())
        for tensor, values in inputs:
            backend_tensor_set(tensor, values)
        status = backend_sched_graph_compute(self.sched, graph)
        if int(status) != 0:
            raise RuntimeError(f"{self.mm.path}: encoder graph compute failed with status {status!r}")
        return backend_tensor_get(out).reshape(out.ne[1], out.ne[0])

    def encode(self, image: PreprocessedImage) -> list[torch.Tensor]:
        """Every tile's embeddings, in the image's tile order."""
        return [self.encode_tile(t) for t in image.tiles]

    def close(self) -> None:
        backend_sched_free(self.sched)
        for b in self.backends:
            backend_free(b)
        self.backends = []
