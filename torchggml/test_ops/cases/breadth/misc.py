"""Breadth: the small ops' cases (CUMSUM, TRI, FILL, DIAG, ROLL, PAD_REFLECT_1D,
TIMESTEP_EMBEDDING, UPSCALE / interpolate, XIELU, SWIGLU_OAI), each where its builder exists."""
from __future__ import annotations

import torch

import torchggml as ggml
from ..glu import _swiglu_oai_ref
from ..unary import _xielu_ref
from ..values import ggml_permute, uniform, rounded
from .common import T, new_table, has, maybe_view, viewed


def _one(table, op, desc, ne, fn, ref, type=T.F32, max_nmse=1e-7, init=None):
    def build(ctx):
        a = ggml.new_tensor(ctx, type, list(ne))
        return fn(ctx, a), [a]
    table.case(op, desc, build, ref, max_nmse=max_nmse, init=init)


def _regions(table):
    for ne in ((10, 5, 4, 3), (127, 5, 4, 3), (128, 5, 4, 3), (128, 128, 4, 4), (255, 5, 4, 3), (256, 5, 4, 3),
               (511, 5, 4, 3), (512, 5, 4, 3), (1023, 5, 4, 3), (1024, 5, 4, 3), (2047, 5, 4, 3), (2048, 5, 4, 3),
               (201 * 1204, 1, 1, 1), (312 * 1205, 1, 1, 1), (20481, 4, 1, 1)):
        _one(table, "cumsum", f"ne={list(ne)}", ne, ggml.cumsum, lambda a: torch.cumsum(a, -1), max_nmse=1e-10)
    tri = {ggml.TriType.LOWER: (torch.tril, -1), ggml.TriType.LOWER_DIAG: (torch.tril, 0),
           ggml.TriType.UPPER: (torch.triu, 1), ggml.TriType.UPPER_DIAG: (torch.triu, 0)}
    for tri_type, (fn, k) in tri.items():
        _one(table, "tri", f"type={tri_type.name},ne=[10, 10, 4, 3]", (10, 10, 4, 3),
             lambda ctx, a, t=tri_type: ggml.tri(ctx, a, t), lambda a, fn=fn, k=k: fn(a, k), max_nmse=0)
    for c, ne in ((0.0, (10, 10, 4, 3)), (2.0, (303, 207, 11, 3)), (-152.0, (800, 600, 4, 4)), (3.5, (2048, 512, 2, 2))):
        _one(table, "fill", f"c={c},ne={list(ne)}", ne, lambda ctx, a, c=c: ggml.fill(ctx, a, c),
             lambda a, c=c: torch.full_like(a, c), max_nmse=0)
    for ne in ((10, 1, 4, 3), (79, 1, 19, 13), (256, 1, 8, 16)):
        _one(table, "diag", f"ne={list(ne)}", ne, ggml.diag, lambda a: torch.diag_embed(a[:, :, 0, :]), max_nmse=0)


def _image(table):
    for shifts, permute in (((3, -2, 1, -1), False), ((3, -2, 1, -1), True)):
        def fn(ctx, a, shifts=shifts, permute=permute):
            return ggml.roll(ctx, ggml.permute(ctx, a, 0, 2, 1, 3) if permute else a, *shifts)

        def ref(a, shifts=shifts, permute=permute):
            x = ggml_permute(a, (0, 2, 1, 3)) if permute else a
            return torch.roll(x, shifts[::-1], dims=(0, 1, 2, 3))
        _one(table, "roll", f"shifts={list(shifts)},permute={int(permute)}", (10, 5, 4, 3), fn, ref, max_nmse=0)
    for ne, p0, p1 in (((512, 34, 1, 1), 10, 9), ((3000, 384, 1, 1), 10, 9)):
        _one(table, "pad_reflect_1d", f"ne={list(ne)},pad_0={p0},pad_1={p1}", ne,
             lambda ctx, a, p0=p0, p1=p1: ggml.pad_reflect_1d(ctx, a, p0, p1),
             lambda a, p0=p0, p1=p1: torch.nn.functional.pad(a[0], (p0, p1), mode="reflect").unsqueeze(0), max_nmse=0)
    if has("timestep_embedding"):
        from ..image import _timestep_ref
        _one(table, "timestep_embedding", "ne=[2, 1, 1, 1],dim=320,max_period=10000", (2, 1, 1, 1),
             lambda ctx, a: ggml.timestep_embedding(ctx, a, 320, 10000), _timestep_ref(320, 10000),
             init={0: uniform(0, 1000)})
    if has("interpolate"):
        _interpolation(table)


def _interpolation(table):
    from ..image import _interp_ref
    S = ggml.ScaleMode
    flags = {name: int(getattr(ggml.ScaleFlag, name)) for name in ("ALIGN_CORNERS", "ANTIALIAS")
             if hasattr(ggml, "ScaleFlag") and hasattr(ggml.ScaleFlag, name)}
    modes = [(S.NEAREST, 0), (S.BILINEAR, 0), (S.BICUBIC, 0)]
    if "ANTIALIAS" in flags:
        modes.append((S.BILINEAR, flags["ANTIALIAS"]))
    for mode, flag in modes:
        name = mode.name.lower()
        aa = bool(flag)
        for transpose in (False, True):
            def fn(ctx, a, mode=mode, flag=flag, transpose=transpose):
                x = ggml.transpose(ctx, a) if transpose else a
                return ggml.interpolate(ctx, x, x.ne[0] * 2, x.ne[1] * 2, x.ne[2], x.ne[3], int(mode) | flag)

            def ref(a, name=name, aa=aa, transpose=transpose):
                x = a.transpose(-1, -2) if transpose else a
                return _interp_ref((x.shape[-2] * 2, x.shape[-1] * 2), name, False, aa)(x)
            _one(table, "upscale", f"ne=[512, 512, 3, 2],scale_factor=2,mode={name}{',antialias' if aa else ''},"
                 f"transpose={int(transpose)}", (512, 512, 3, 2), fn, ref, max_nmse=1e-10)
        for src, dst in (((2, 5, 7, 11), (5, 7, 11, 13)), ((5, 7, 11, 13), (2, 5, 7, 11))):
            if src[2:] != dst[2:] and mode != S.NEAREST:
                # ggml resamples dims 2 and 3 by nearest; the torch reference covers dims 0 and 1 only
                continue
            _one(table, "upscale", f"ne={list(src)},ne_tgt={list(dst)},mode={name}{',antialias' if aa else ''}", src,
                 lambda ctx, a, dst=dst, mode=mode, flag=flag: ggml.interpolate(ctx, a, *dst, int(mode) | flag),
                 _nearest_ref(dst) if mode == S.NEAREST else None, max_nmse=1e-10)
    if "ALIGN_CORNERS" in flags:
        for mode in (S.BILINEAR, S.BICUBIC):
            for src, dst in (((1, 4, 3, 2), (2, 8, 3, 2)), ((4, 1, 3, 2), (1, 1, 3, 2))):
                _one(table, "upscale", f"ne={list(src)},ne_tgt={list(dst)},mode={mode.name.lower()},align_corners", src,
                     lambda ctx, a, dst=dst, mode=mode: ggml.interpolate(ctx, a, *dst, int(mode) | flags["ALIGN_CORNERS"]),
                     _interp_ref((dst[1], dst[0]), mode.name.lower(), True), max_nmse=1e-10)


def _nearest_ref(ne):
    """Nearest over every dim: source index floor(i * src / dst)."""
    def ref(a):
        for dim, n in enumerate(reversed(ne)):
            idx = (torch.arange(n) * a.shape[dim]) // n
            a = a.index_select(dim, idx)
        return a
    return ref


def _activations(table):
    for type in (T.F32, T.F16):
        for ne in ((10, 5, 4, 3), (512, 16, 1, 1)):
            _one(table, "xielu", f"type={type.name},ne={list(ne)}", ne,
                 lambda ctx, a: ggml.xielu(ctx, a, 4.0, 20.0, 0.5, 1e-7),
                 lambda a, type=type: rounded(type, _xielu_ref(4.0, 20.0, 0.5, 1e-7)(a)))
    for v in (0, 1):
        for alpha in (0.5, 1.702):
            for limit in (2.0, 7.0):
                ne = (128, 2, 2, 2)

                def build(ctx, v=v, alpha=alpha, limit=limit, ne=ne):
                    ra, a = maybe_view(ctx, T.F32, ne, bool(v))
                    rb, b = maybe_view(ctx, T.F32, ne, bool(v))
                    return ggml.swiglu_oai(ctx, a, b, alpha, limit), [ra, rb]
                table.case("swiglu_oai", f"ne={list(ne)},v={v},alpha={alpha},limit={limit}", build,
                           lambda a, b, v=v, ref=_swiglu_oai_ref(alpha, limit): ref(viewed(a, 128, v), viewed(b, 128, v)),
                           init={0: uniform(-10, 10), 1: uniform(-10, 10)})


def cases():
    table = new_table()
    if has("cumsum"):
        _regions(table)
    if has("roll"):
        _image(table)
    _activations(table)
    # cases whose reference torch has no direct form (bilinear/bicubic across dims 2 and 3) stay out
    return [c for c in table if c.reference is not None]
