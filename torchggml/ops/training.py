"""Training ops: the *_BACK ops the backward graph uses, the cross-entropy loss and the
optimizer steps (ggml.h's signatures, ggml's shape rules)."""
from __future__ import annotations

from ..enums import Op, TensorFlag
from ..tensor import (Tensor, are_same_shape, can_repeat, is_matrix, is_scalar, is_vector, nelements)
from ..types import Type
from ._common import new_op, same_as, require
from .rope import rope_ext, rope_multi

__all__ = ["repeat_back", "silu_back", "rms_norm_back", "get_rows_back", "soft_max_ext_back",
           "soft_max_ext_back_inplace", "rope_ext_back", "rope_multi_back", "flash_attn_back",
           "cross_entropy_loss", "cross_entropy_loss_back", "opt_step_adamw", "opt_step_sgd",
           "ADAMW_PARAMS", "SGD_PARAMS"]

ADAMW_PARAMS = 7  # alpha, beta1, beta2, eps, wd, beta1h = 1/(1 - beta1^t), beta2h = 1/(1 - beta2^t)
SGD_PARAMS = 2    # alpha, wd


def repeat_back(ctx, a: Tensor, b: Tensor) -> Tensor:
    """Sum the repetitions of b's shape in a into b's shape (the gradient of repeat)."""
    require(can_repeat(b, a), "repeat_back", "a's shape must be a multiple of b's (a.ne[i] % b.ne[i] == 0)", a, b)
    return new_op(ctx, Op.REPEAT_BACK, a.type, b.ne, [a])


def silu_back(ctx, a: Tensor, b: Tensor) -> Tensor:
    """dx from a = dy and b = x: dy * s * (1 + x * (1 - s)), s = sigmoid(x)."""
    require(are_same_shape(a, b), "silu_back", "dy (a) and x (b) must have the same shape", a, b)
    return same_as(ctx, Op.SILU_BACK, a, [a, b])


def rms_norm_back(ctx, a: Tensor, b: Tensor, eps: float) -> Tensor:
    """dx of rms_norm(x, eps) from a = dy and b = x (as ggml's backward pass calls it)."""
    require(are_same_shape(a, b), "rms_norm_back", "dy (a) and x (b) must have the same shape", a, b)
    require(eps >= 0.0, "rms_norm_back", f"eps must be >= 0, got {eps}", a)
    return same_as(ctx, Op.RMS_NORM_BACK, a, [a, b], [float(eps)])


def get_rows_back(ctx, a: Tensor, b: Tensor, c: Tensor) -> Tensor:
    """F32 [c.ne0, c.ne1]: zeros with the rows of a (gradients of get_rows' result) added at the
    row indices b (I32 vector); c (the data get_rows read) gives only the shape."""
    require(is_matrix(a) and is_vector(b) and b.type == Type.I32, "get_rows_back",
            "a must be a matrix and b an I32 vector", a, b)
    require(is_matrix(c) and a.ne[0] == c.ne[0], "get_rows_back", "c must be a matrix with a's row length", a, c)
    require(b.ne[0] == a.ne[1], "get_rows_back", "one index (b) per row of a", a, b)
    return new_op(ctx, Op.GET_ROWS_BACK, Type.F32, [c.ne[0], c.ne[1], 1, 1], [a, b])


def _soft_max_back(ctx, a: Tensor, b: Tensor, scale: float, max_bias: float, inplace: bool) -> Tensor:
    require(are_same_shape(a, b), "soft_max_ext_back", "dy (a) and y (b) must have the same shape", a, b)
    return same_as(ctx, Op.SOFT_MAX_BACK, a, [a, b], [float(scale), float(max_bias)], inplace=inplace)


def soft_max_ext_back(ctx, a: Tensor, b: Tensor, scale: float, max_bias: float) -> Tensor:
    """dx of soft_max_ext(x, scale) from a = dy and b = y (the soft_max result):
    scale * y * (dy - dot(y, dy)) per row. ggml computes it for max_bias == 0 only."""
    return _soft_max_back(ctx, a, b, scale, max_bias, False)


def soft_max_ext_back_inplace(ctx, a: Tensor, b: Tensor, scale: float, max_bias: float) -> Tensor:
    return _soft_max_back(ctx, a, b, scale, max_bias, True)


def _as_rope_back(t: Tensor) -> Tensor:
    t.op = Op.ROPE_BACK
    return t


def rope_ext_back(ctx, a: Tensor, b: Tensor, c: Tensor | None, n_dims: int, mode: int, n_ctx_orig: int,
                  freq_base: float, freq_scale: float, ext_factor: float, attn_factor: float,
                  beta_fast: float, beta_slow: float) -> Tensor:
    """dx of rope_ext from a = dy: the inverse rotation (rope_ext's arguments and checks)."""
    return _as_rope_back(rope_ext(ctx, a, b, c, n_dims, mode, n_ctx_orig, freq_base, freq_scale, ext_factor,
                                  attn_factor, beta_fast, beta_slow))


def rope_multi_back(ctx, a: Tensor, b: Tensor, c: Tensor | None, n_dims: int, sections, mode: int,
                    n_ctx_orig: int, freq_base: float, freq_scale: float, ext_factor: float,
                    attn_factor: float, beta_fast: float, beta_slow: float) -> Tensor:
    """dx of rope_multi from a = dy: the inverse rotation (rope_multi's arguments and checks)."""
    return _as_rope_back(rope_multi(ctx, a, b, c, n_dims, sections, mode, n_ctx_orig, freq_base, freq_scale,
                                    ext_factor, attn_factor, beta_fast, beta_slow))


def flash_attn_back(ctx, q: Tensor, k: Tensor, v: Tensor, d: Tensor, masked: bool) -> Tensor:
    """Upstream aborts here ("TODO: adapt to ggml_flash_attn_ext() changes"): no graph can hold
    FLASH_ATTN_BACK at the pinned commit, so torchggml refuses it the same way."""
    raise NotImplementedError("flash_attn_back: not available in ggml at this commit "
                              "(upstream aborts: it is not adapted to flash_attn_ext)")


def cross_entropy_loss(ctx, a: Tensor, b: Tensor) -> Tensor:
    """-sum(b * log_softmax(a)) / nrows(a): a = logits, b = labels (probabilities per row); F32 [1]."""
    require(are_same_shape(a, b), "cross_entropy_loss", "logits (a) and labels (b) must have the same shape", a, b)
    return new_op(ctx, Op.CROSS_ENTROPY_LOSS, a.type, [1, 1, 1, 1], [a, b])


def cross_entropy_loss_back(ctx, a: Tensor, b: Tensor, c: Tensor) -> Tensor:
    """d(loss)/d(logits) = (softmax(b) - c) * a / nrows(b): a = the loss's gradient (a scalar),
    b = logits, c = labels."""
    require(is_scalar(a), "cross_entropy_loss_back", "the loss gradient (a) must be a scalar", a)
    require(are_same_shape(b, c), "cross_entropy_loss_back", "logits (b) and labels (c) must have the same shape",
            b, c)
    return same_as(ctx, Op.CROSS_ENTROPY_LOSS_BACK, b, [a, b, c])


def _require_param(op: str, a: Tensor) -> None:
    require(bool(a.flags & TensorFlag.PARAM), op, "a must be a parameter (set_param)", a)


def opt_step_adamw(ctx, a: Tensor, grad: Tensor, m: Tensor, v: Tensor, adamw_params: Tensor) -> Tensor:
    """One AdamW step on a in place (a view of a): m, v are updated too; adamw_params holds F32
    [alpha, beta1, beta2, eps, wd, 1/(1-beta1^t), 1/(1-beta2^t)]."""
    _require_param("opt_step_adamw", a)
    for name, t in (("grad", grad), ("m", m), ("v", v)):
        require(are_same_shape(a, t), "opt_step_adamw", f"{name} must have a's shape", a, t)
    require(adamw_params.type == Type.F32 and nelements(adamw_params) == ADAMW_PARAMS, "opt_step_adamw",
            f"adamw_params must be F32 with {ADAMW_PARAMS} values", adamw_params)
    return new_op(ctx, Op.OPT_STEP_ADAMW, a.type, a.ne, [a, grad, m, v, adamw_params], like=a, inplace=True)


def opt_step_sgd(ctx, a: Tensor, grad: Tensor, sgd_params: Tensor) -> Tensor:
    """One SGD step on a in place: a = a * (1 - alpha * wd) - alpha * grad; sgd_params holds F32
    [alpha, wd]."""
    _require_param("opt_step_sgd", a)
    require(are_same_shape(a, grad), "opt_step_sgd", "grad must have a's shape", a, grad)
    require(sgd_params.type == Type.F32 and nelements(sgd_params) == SGD_PARAMS, "opt_step_sgd",
            f"sgd_params must be F32 with {SGD_PARAMS} values", sgd_params)
    return new_op(ctx, Op.OPT_STEP_SGD, a.type, a.ne, [a, grad, sgd_params], like=a, inplace=True)
