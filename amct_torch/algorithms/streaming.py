"""The state of streaming IFMR and its update in tensor ops, with no host read.

Why: on a GPU every Python-side decision about the data waits for the device. Every quantity
that depends on the data (count, range, histogram frame, top/bottom buffers) is a tensor on the
data's device, and each batch goes through the same fixed-shape operations whatever its values
(an unchanged frame re-frames bit for bit the same). The result is the state the sequential
definition gives, identical to the compiled CPU path. docs/algorithms.md, "The sync-free design"."""
from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import Any

import torch

from amct_torch.algorithms import histogram
from amct_torch.algorithms.select import extreme_values


@dataclass
class StreamState:
    """Streaming-IFMR statistics. ``count`` int64 0-d (elements seen); ``top`` float32 [K]
    the largest values, descending, −inf padded; ``bottom`` the smallest, ascending, +inf
    padded; ``counts`` int64 / ``dsum`` float64 [nbins + 1] the histogram on the power-of-two
    grid (``histogram.py``; last slot: overflow); ``frame`` int64 [2] (e, base); ``range``
    float64 [2] (min, max seen; +inf/−inf before any data)."""

    count: torch.Tensor
    top: torch.Tensor
    bottom: torch.Tensor
    counts: torch.Tensor
    dsum: torch.Tensor
    frame: torch.Tensor
    range: torch.Tensor

    def __post_init__(self) -> None:
        self.backend_cache: Any = None  # what a backend derives from the tensors (kernels/ops.py), not state

    @classmethod
    def empty(cls, nbins: int, topk: int, device) -> StreamState:
        return cls(count=torch.zeros((), dtype=torch.int64, device=device),
                   top=torch.full((topk,), -math.inf, device=device),
                   bottom=torch.full((topk,), math.inf, device=device),
                   counts=torch.zeros(nbins + 1, dtype=torch.int64, device=device),
                   dsum=torch.zeros(nbins + 1, dtype=torch.float64, device=device),
                   frame=_pair(histogram.MIN_EXP, 0, torch.int64, device),
                   range=_pair(math.inf, -math.inf, torch.float64, device))

    def clone(self) -> StreamState:
        return StreamState(**{f.name: getattr(self, f.name).clone() for f in fields(self)})

    @property
    def nbins(self) -> int:
        return self.counts.numel() - 1


def _pair(a, b, dtype: torch.dtype, device) -> torch.Tensor:
    """[a, b] made on the device by fills (no host-to-device copy, which a CUDA sync check flags)."""
    t = torch.full((2,), a, dtype=dtype, device=device)
    t[1:].fill_(b)
    return t


def fold_overflow(st: StreamState) -> None:
    """Move the overflow slot into the last bin (``histogram.fold_overflow``)."""
    histogram.fold_overflow(st.counts, st.dsum)


def update(st: StreamState, x: torch.Tensor) -> torch.Tensor:
    """Add the non-empty flat float32 batch ``x`` to ``st`` in place, in fixed-shape tensor
    ops only; every state tensor keeps its storage (written with ``copy_``), so the update can
    be captured in a CUDA graph and replayed. Returns a 0-d bool tensor: the batch held NaN or
    Inf (the state is then meaningless, but every index stays in bounds; the caller raises
    when factors are asked)."""
    nbins, k = st.nbins, st.top.numel()
    lo, hi = torch.aminmax(x)
    gmin = torch.minimum(st.range[0], lo.double())
    gmax = torch.maximum(st.range[1], hi.double())
    floor = torch.where(st.count > 0, st.frame[0], torch.full_like(st.frame[0], histogram.MIN_EXP))
    e, base = histogram.frame_of(gmin, gmax, nbins, floor)
    fold_overflow(st)
    c, d = histogram.reframe(st.counts[:nbins], st.dsum[:nbins], st.frame[0], st.frame[1], e, base)
    st.counts[:nbins].copy_(c)
    st.dsum[:nbins].copy_(d)
    scale = torch.ldexp(torch.ones((), dtype=torch.float32, device=x.device), -e)
    histogram.accumulate_in_frame(x, scale, base.float(), st.counts, st.dsum)
    n = min(k, x.numel())
    st.top.copy_(torch.topk(torch.cat([st.top, extreme_values(x, n, largest=True)]), k).values)
    st.bottom.copy_(torch.topk(torch.cat([st.bottom, extreme_values(x, n, largest=False)]), k, largest=False).values)
    st.frame.copy_(torch.stack([e, base]))
    st.range.copy_(torch.stack([gmin, gmax]))
    st.count.add_(x.numel())
    return ~(torch.isfinite(lo) & torch.isfinite(hi))
