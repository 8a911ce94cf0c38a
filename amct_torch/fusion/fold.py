"""The arithmetic of BN folding, as pure tensor functions (no graph, no modules' bookkeeping).

Caffe's BatchNorm (test phase) followed by Scale is one per-channel affine map
``y = a·x + c`` with ``a = γ/sqrt(var + eps)`` and ``c = β − mean·a``. Folding it into the
neighbouring weighted layer only rescales that layer's weights and shifts its bias. Everything
is computed in float64 and returned in the weights' own dtype so that the fused model differs
from the unfused one only by float32 rounding of the final values.
"""
from __future__ import annotations

from typing import Optional

import torch


def bn_scale_affine(mean: torch.Tensor, var: torch.Tensor, eps: float, gamma: torch.Tensor,
                    beta: Optional[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """(a, c) in float64 such that Scale(BatchNorm(x)) == a·x + c per channel."""
    a = gamma.double() / torch.sqrt(var.double() + eps)
    c = -mean.double() * a
    if beta is not None:
        c = c + beta.double()
    return a, c


def _bias64(bias: Optional[torch.Tensor], n: int, like: torch.Tensor) -> torch.Tensor:
    if bias is None:
        return torch.zeros(n, dtype=torch.float64, device=like.device)
    return bias.double()


def fold_output_side(weight: torch.Tensor, bias: Optional[torch.Tensor], a: torch.Tensor, c: torch.Tensor,
                     *, transposed: bool = False, groups: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    """Weights and bias of ``layer`` followed by the per-output-channel map ``a·y + c``.

    ``weight`` is in torch layout: (C_out, …) for Convolution and InnerProduct, and
    (C_in, C_out/groups, kh, kw) for Deconvolution (``transposed``), whose output channel
    ``g·(C_out/groups) + j`` is weight axis 1 index ``j`` of the rows of group ``g``.
    W' = W·a per output channel, b' = b·a + c (that is (b − mean)·α + β)."""
    w = weight.double()
    a = a.to(w.device)
    c = c.to(w.device)
    n_out = a.numel()
    if transposed:
        cin, per = w.shape[0], w.shape[1]
        rest = tuple(w.shape[2:])
        w5 = w.reshape((groups, cin // groups, per) + rest)
        w_new = (w5 * a.reshape((groups, 1, per) + (1,) * len(rest))).reshape(w.shape)
    else:
        w_new = w * a.reshape((-1,) + (1,) * (w.dim() - 1))
    b_new = _bias64(bias, n_out, w) * a + c
    return w_new.to(weight.dtype), b_new.to(weight.dtype)


def fold_input_side(weight: torch.Tensor, bias: Optional[torch.Tensor], a: torch.Tensor,
                    c: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Weights and bias of a group-1 convolution whose input first goes through ``a·x + c``
    per input channel: W'[o,i] = W[o,i]·a_i, b'_o = b_o + Σ_{i,k} W[o,i,k]·c_i.

    Exact only when the convolution pads nothing: a padded border would see c where the
    unfused net sees zeros (the caller checks pad 0 and group 1)."""
    w = weight.double()
    a = a.to(w.device)
    c = c.to(w.device)
    view = (1, -1) + (1,) * (w.dim() - 2)
    w_new = w * a.reshape(view)
    shift = (w * c.reshape(view)).flatten(1).sum(dim=1)
    b_new = _bias64(bias, w.shape[0], w) + shift
    return w_new.to(weight.dtype), b_new.to(weight.dtype)


def all_finite(*tensors: torch.Tensor) -> bool:
    """True when every value of every tensor is finite (no NaN, no ±inf)."""
    return all(bool(torch.isfinite(t).all()) for t in tensors)
