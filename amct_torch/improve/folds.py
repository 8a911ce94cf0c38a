"""Cross-fitting of the refining stage over the calibration rows, for the stage guard.

Why: the stage guard (``pipeline.py``) judges each candidate on rows no fitting has seen. Where
the data beyond the calibration batches has too few rows, every calibration row is judged once
by a model fitted without it: ``k`` contiguous blocks, the refining pass fitted on the others and
scored on each (``FOLDS_SMALL`` or ``FOLDS_LARGE`` blocks by the net's cost). The model kept is
the pass fitted on all rows, so the guard judges the procedure. Also here: whether a small net's
range search is limited to widening AMCT's clip (``refine.WIDER``)."""
from __future__ import annotations

import torch

#: an output with fewer held-out values per channel (rows x its positions) than this is starved
MIN_HELD_VALUES = 256
#: small nets: input values per sample at most this (MTCNN's 48x48x3 = 6912; a 224x224x3
#: classifier's 150528 is large) ...
MAX_INPUT = 1 << 15
#: ... and parameters at most this (MTCNN's 48-px net: 0.39 M)
MAX_PARAMS = 1 << 21
#: folds of the cross-fitting on a small net (each fold's pass is cheap there)
FOLDS_SMALL = 4
#: and on a large one: the pass runs once per fold and once more on all rows (cost)
FOLDS_LARGE = 2


def values_per_channel(ref: list[torch.Tensor]) -> int:
    """The fewest held-out values per channel among the outputs ``ref`` (rows first, channels
    second): rows times the output's positions."""
    counts = [int(r.numel() // max(1, r.shape[1])) if r.dim() >= 2 else int(r.numel()) for r in ref]
    return min(counts) if counts else 0


def small_net(sample: torch.Tensor, params: int) -> bool:
    """At most ``MAX_INPUT`` input values per sample and ``MAX_PARAMS`` parameters."""
    return sample.numel() <= MAX_INPUT and params <= MAX_PARAMS


def widen_only(ref_held: list[torch.Tensor], sample: torch.Tensor, params: int) -> bool:
    """The range search only widens AMCT's clips: a small net whose outputs on the per-layer
    guard rows (``ref_held``) are starved. A tighter clip trades the rare large values for the
    common small ones, and a few calibration rows rarely hold the rare ones."""
    return values_per_channel(ref_held) < MIN_HELD_VALUES and small_net(sample, params)


def blocks(n: int, k: int) -> list[torch.Tensor]:
    """``n`` row indices cut into ``k`` contiguous blocks (fewer when ``n < k``)."""
    return [b for b in torch.arange(n).chunk(min(k, n)) if b.numel()]


def fold_data(data: tuple, block: torch.Tensor) -> tuple[tuple, int]:
    """The refining pass's input for the fold that holds out ``block``: the other rows in
    order, their last quarter (at least one row) as the per-layer guard rows; and the number
    of fitting rows."""
    n = int(data[0].shape[0])
    keep = torch.ones(n, dtype=torch.bool)
    keep[block] = False
    idx = torch.nonzero(keep).flatten()
    rows = tuple(t[idx.to(t.device)] for t in data)
    m = int(idx.numel())
    return rows, m - max(1, m // 4)
