"""ggml's scale searches for the K formats, vectorised over sub-blocks.

Each takes sub-blocks x [m, n] (float32) and returns the chosen scale per sub-block and the
quants L [m, n] (int32), with ggml's names and semantics (ggml-quants.c: make_qx_quants,
make_q3_quants, make_qkx2_quants). Work is vectorised over sub-blocks; what C does one
after another stays a loop: make_qx_quants tries its 19 scales at once and loops only to
pick one, make_qkx2_quants loops over its candidates (an accepted fit moves the origin of the
next), make_q3_quants over the elements of its coordinate descent.
"""
from __future__ import annotations

import torch

from ._c_order import first_min_max, nearest_int, ordered_sum, over, signed_amax

GROUP_MAX_EPS = 1e-15  # ggml: sub-blocks whose largest |x| is below this quantize to zero


def _f32(values, device) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.float32, device=device)


def _steps(first: int, last: int, skip_zero: bool, device) -> torch.Tensor:
    """0.1f * is for is in first..last, in float32 (as C evaluates `0.1f*is`)."""
    steps = [i for i in range(first, last + 1) if not (skip_zero and i == 0)]
    return _f32(steps, device) * _f32(0.1, device)


def make_qx_quants(x: torch.Tensor, nmax: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric quants in [0, 2*nmax) (rmse_type 1: weights x*x, no importance): the scale
    -max/nmax refined by trying -max/(nmax +- 0.1*is), is = 1..9, keeping the one with the
    largest sum(w*x*l)^2 / sum(w*l*l)."""
    m = x.shape[0]
    max_, amax = signed_amax(x)
    numerators = torch.cat([_f32([nmax], x.device), nmax + _steps(-9, 9, True, x.device)]).neg()
    iscale = numerators / max_.unsqueeze(-1)                                    # [m, C]
    l = nearest_int(iscale.unsqueeze(-1) * x.unsqueeze(1)).clamp_(-nmax, nmax - 1)
    lf = l.float()
    w = (x * x).unsqueeze(1)
    wx = w * x.unsqueeze(1)
    sumlx, suml2 = ordered_sum(torch.stack([wx * lf, w * lf * lf]))            # [m, C] each
    scale = torch.where(suml2[:, 0] != 0, sumlx[:, 0] / suml2[:, 0], 0.0)
    best = scale * sumlx[:, 0]
    choice = torch.zeros(m, dtype=torch.long, device=x.device)
    for c in range(1, iscale.shape[1]):
        slx, sl2 = sumlx[:, c], suml2[:, c]
        take = (sl2 > 0) & (slx * slx > best * sl2)
        this_scale = slx / sl2
        scale = torch.where(take, this_scale, scale)
        best = torch.where(take, this_scale * slx, best)
        choice = torch.where(take, c, choice)
    L = l.gather(1, choice.view(m, 1, 1).expand(m, 1, x.shape[1])).squeeze(1) + nmax
    dead = (amax < GROUP_MAX_EPS).unsqueeze(-1)
    return torch.where(dead[:, 0], 0.0, scale), torch.where(dead, 0, L)


def make_q3_quants(x: torch.Tensor, nmax: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric quants in [0, 2*nmax) (do_rmse): l = round(-nmax/max * x), then up to 5
    passes of coordinate descent, each element in order moved to the quant that its
    least-squares fit suggests when that raises sum(w*x*l)^2 / sum(w*l*l), w = x*x."""
    max_, amax = signed_amax(x)
    L = nearest_int(over(-nmax, max_).unsqueeze(-1) * x).clamp_(-nmax, nmax - 1)
    w = x * x
    wx = w * x
    lf = L.float()
    sumlx, suml2 = ordered_sum(torch.stack([wx * lf, w * lf * lf]))
    for _ in range(5):
        # a pass that changes nothing leaves the state as it was, so running on where C
        # breaks out changes nothing either; stop once no sub-block changes
        any_change = False
        for i in range(x.shape[1]):
            xi, wi, wxi, Li = x[:, i], w[:, i], wx[:, i], L[:, i]
            li = Li.float()
            slx = sumlx - wxi * li  # the sums without element i
            sl2 = suml2 - wi * li * li
            new_l = nearest_int(xi * sl2 / slx).clamp_(-nmax, nmax - 1)
            nl = new_l.float()
            new_slx = slx + wxi * nl
            new_sl2 = sl2 + wi * nl * nl
            take = ((slx > 0) & (new_l != Li) & (new_sl2 > 0)
                    & (new_slx * new_slx * suml2 > sumlx * sumlx * new_sl2))
            if not take.any():
                continue
            any_change = True
            L[:, i] = torch.where(take, new_l, Li)
            sumlx = torch.where(take, new_slx, sumlx)
            suml2 = torch.where(take, new_sl2, suml2)
        if not any_change:
            break
    scale = torch.where(suml2 > 0, sumlx / suml2, 0.0)
    dead = amax < GROUP_MAX_EPS
    return torch.where(dead, 0.0, scale), torch.where(dead.unsqueeze(-1), 0, L + nmax)


def _fit_error(scale, mn, L, x, weights, use_mad: bool) -> torch.Tensor:
    """sum(w * |scale*L + min - x|) (use_mad) or sum(w * (scale*L + min - x)^2), in C order."""
    diff = scale * L.float() + mn - x
    return ordered_sum(weights * (diff.abs() if use_mad else diff * diff)).unsqueeze(-1)


def make_qkx2_quants(x: torch.Tensor, weights: torch.Tensor, nmax: int, rmin: float,
                     rdelta: float, nstep: int, use_mad: bool):
    """Asymmetric quants in [0, nmax]: x ~ scale * L - the_min. Starts from the range
    [min(x, 0), max(x)], then tries nstep + 1 scales (rmin + rdelta*is + nmax) / range with a
    weighted least-squares scale and min each, keeping the lowest weighted error (absolute
    with use_mad, else squared). As in C, an accepted fit's min becomes the origin of the
    next candidates' range, so candidates run one after another.
    Returns (scale [m], the_min [m] >= 0, L [m, n])."""
    lo, hi = first_min_max(x)
    lo = torch.where(lo > 0, 0.0, lo)
    sum_w = ordered_sum(weights, from_first=True).unsqueeze(-1)
    sum_x = ordered_sum(weights * x, from_first=True).unsqueeze(-1)

    iscale = over(nmax, hi - lo)
    L = nearest_int(iscale * (x - lo)).clamp_(0, nmax)
    scale = over(1, iscale)
    best_error = _fit_error(scale, lo, L, x, weights, use_mad)
    mn = lo
    factors = (rmin + _f32(range(nstep + 1), x.device) * _f32(rdelta, x.device)) + nmax
    for factor in factors:
        Laux = nearest_int(factor / (hi - mn) * (x - mn)).clamp_(0, nmax)
        lf = Laux.float()
        wl = weights * lf
        sum_l, sum_l2, sum_xl = (s.unsqueeze(-1) for s in ordered_sum(torch.stack([wl, wl * lf, wl * x])))
        D = sum_w * sum_l2 - sum_l * sum_l
        this_scale = (sum_w * sum_xl - sum_x * sum_l) / D
        this_min = (sum_l2 * sum_x - sum_l * sum_xl) / D
        clipped = this_min > 0
        this_min = torch.where(clipped, 0.0, this_min)
        this_scale = torch.where(clipped, sum_xl / sum_l2, this_scale)
        cur_error = _fit_error(this_scale, this_min, Laux, x, weights, use_mad)
        take = (D > 0) & (cur_error < best_error)
        best_error = torch.where(take, cur_error, best_error)
        scale = torch.where(take, this_scale, scale)
        mn = torch.where(take, this_min, mn)
        L = torch.where(take, Laux, L)
    flat = hi == lo  # one value (after the min was raised to 0): all quants 0, scale 0
    return (torch.where(flat, 0.0, scale).squeeze(-1), torch.where(flat, -lo, -mn).squeeze(-1),
            torch.where(flat, 0, L))
