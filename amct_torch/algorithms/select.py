"""The k largest (or smallest) values of a flat tensor with fixed shapes only.

Why: IFMR needs exact order statistics near the ends of the data, and the streaming observer
folds every batch's extremes into its buffers. ``torch.topk`` over millions of values is slow
on a CPU and a boolean-mask gather would make the shape depend on the data (a host sync on
CUDA). The k rows (of ``CHUNK`` values) with the most extreme row extremes always hold the k
most extreme values — a value outside them has k row extremes at least as extreme above it —
so one reduction pass and a top-k of k·CHUNK values give the exact answer, with shapes that
depend only on the input's size.
"""
from __future__ import annotations

import torch

#: values per row of the first pruning pass
CHUNK = 256


def extreme_values(x: torch.Tensor, k: int, largest: bool = True) -> torch.Tensor:
    """The ``k`` largest values of flat ``x`` sorted descending (``largest``), or the k
    smallest ascending; k ≤ x.numel(). Exact (the same multiset as ``torch.topk``)."""
    n = x.numel()
    m = n // CHUNK
    if m < 4 * k:
        return torch.topk(x, k, largest=largest, sorted=True).values
    body = x[:m * CHUNK].view(m, CHUNK)
    ext = body.amax(dim=1) if largest else body.amin(dim=1)
    rows = torch.topk(ext, k, largest=largest, sorted=False).indices
    cand = torch.cat([body[rows].reshape(-1), x[m * CHUNK:]])
    return torch.topk(cand, k, largest=largest, sorted=True).values
