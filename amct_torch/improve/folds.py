"""Cross-fitted judging of the improvement stages, for nets whose outputs have few positions.

Why: the stage guard (``pipeline._better``) compares per-output SQNR on the held-out rows. On
a net whose outputs are one position per sample (a classifier's logits, the 1x1 heads of a
cascade detector such as MTCNN's), a held-out batch of 16 crops gives 16 values per output
channel, and each half of it 8: the SQNR of a stage then moves by about half a dB from one
draw of crops to the next, more than the gains judged (measured on the MTCNN nets: the bias
correction of the 48-px net scored -0.27 dB on its 16 held-out crops and +0.23 dB on 200
others). Holding out more rows would starve the fitting, which has only the other batches.

What: the rows are used twice with the roles swapped. Fold 1 is the pipeline's own split (fit
on the first rows, held out the last batch); fold 2 fits on fold 1's held-out rows and holds
out fold 1's fitting rows. Each candidate is fitted once per fold, and scored on that fold's
held-out rows only, so every calibration row is judged by a model that was not fitted on it
and the guard sees twice the rows; its two "halves" are the two folds. The model kept is one
fold's (``pipeline._better``: fold 1's if it gains the margin on its own held-out rows, else
fold 2's if that one does), so it is never worse than the default on the rows it was not
fitted on, and the other fold adds the evidence that the same procedure, fitted on other rows,
does not lose.

When: only where an output has fewer than ``MIN_HELD_VALUES`` held-out values per channel
and the net is small (at most ``MAX_INPUT`` input values per sample and ``MAX_PARAMS``
parameters): the refining pass runs twice, affordable on such nets (MTCNN's jobs take 0.1-0.4
s) but not on a large one (a face-embedding net with a small input and 20 M weights).
"""
from __future__ import annotations

from typing import Optional

import torch

#: an output with fewer held-out values per channel (rows x its positions) than this starves
#: the stage guard
MIN_HELD_VALUES = 256
#: the cross-fitting's cost guard: input values per sample at most this (MTCNN's 48x48x3 = 6912;
#: a 224x224x3 classifier's 150528 stays with the single split)
MAX_INPUT = 1 << 15
#: and parameters at most this (MTCNN's 48-px net: 0.39 M)
MAX_PARAMS = 1 << 21


def values_per_channel(ref: list[torch.Tensor]) -> int:
    """The fewest held-out values per channel among the outputs ``ref`` (rows first, channels
    second): rows times the output's positions."""
    counts = [int(r.numel() // max(1, r.shape[1])) if r.dim() >= 2 else int(r.numel()) for r in ref]
    return min(counts) if counts else 0


def other_fold(data: tuple, n_fit: int, ref: list[torch.Tensor],
               max_fit: int, max_held: int, params: int = 0) -> Optional[tuple[tuple, int]]:
    """The second fold (its rows as ``split`` lays them out: fitting rows then held-out rows,
    and the number of fitting rows) when the held-out outputs ``ref`` are starved and the net
    (``params`` parameters) is small; else None (the single split)."""
    n_held = int(data[0].shape[0]) - n_fit
    if n_fit < 2 or n_held < 2 or values_per_channel(ref) >= MIN_HELD_VALUES:
        return None
    if data[0][0].numel() > MAX_INPUT or params > MAX_PARAMS:
        return None
    fit2 = tuple(t[n_fit:][:max_fit] for t in data)
    held2 = tuple(t[:n_fit][:max_held] for t in data)
    return tuple(torch.cat([f, h]) for f, h in zip(fit2, held2)), int(fit2[0].shape[0])
