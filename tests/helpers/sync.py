"""Calibrating a model on a device where a host read is an error (shared by the sync-free
tests and benchmarks/bench_sync.py).

On the ``meta`` device tensors have shapes but no values: ``.item()``, ``.tolist()``,
``float()``/``bool()`` of a tensor and data-dependent shapes (mask indexing, ``nonzero``)
raise, so a forward that completes there issues no host synchronisation — the property a
CUDA calibration needs. ``SyncCounter`` counts the same reads on real (CPU) tensors.
"""
from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from typing import Optional

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from helpers.configs import use_hfmg

#: aten ops whose output shape or value needs the data on the host
_SYNC_OPS = {"_local_scalar_dense", "nonzero", "masked_select", "unique", "_unique2", "unique_consecutive",
             "unique_dim", "repeat_interleave", "nonzero_static"}
_TENSOR_READS = ("item", "tolist", "__bool__", "__float__", "__int__", "__index__", "numpy")


def calibration_model(tmp_path, model_file: str, weights_file: str, algo: str = "ifmr", batch_num: int = 100,
                      ifmr_mode: str = "streaming"):
    """A quantize_model'd model whose hooks feed ``batch_num`` batches' observers (more than a
    test runs, so no factor is computed), and its graph."""
    from amct_torch import create_quant_config, init, quantize_model
    cfg = os.path.join(tmp_path, f"{algo}.json")
    create_quant_config(cfg, model_file, weights_file, batch_num=batch_num)
    if algo == "hfmg":
        use_hfmg(cfg, num_of_bins=2048)
    graph = init(cfg, model_file, weights_file, os.path.join(tmp_path, f"{algo}_record.txt"))
    model = quantize_model(graph, os.path.join(tmp_path, f"{algo}.prototxt"),
                           os.path.join(tmp_path, f"{algo}.caffemodel"), ifmr_mode=ifmr_mode)
    return model, graph


class SyncCounter(TorchDispatchMode):
    """Counts host reads of tensor data: ops whose result needs the values on the host
    (item, nonzero, masked indexing…) and Python-side reads (``.tolist()``, ``float(t)``…)."""

    def __init__(self) -> None:
        super().__init__()
        self.count = 0
        self.where: dict[str, int] = {}

    def _hit(self, name: str) -> None:
        self.count += 1
        self.where[name] = self.where.get(name, 0) + 1

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        if name in _SYNC_OPS:
            self._hit(name)
        return func(*args, **(kwargs or {}))

    @contextlib.contextmanager
    def counting(self) -> Iterator[SyncCounter]:
        saved = {m: getattr(torch.Tensor, m) for m in _TENSOR_READS}

        def wrap(m, fn):
            def read(t, *a, **k):
                self._hit(m)
                return fn(t, *a, **k)
            return read
        try:
            for m, fn in saved.items():
                setattr(torch.Tensor, m, wrap(m, fn))
            with self:
                yield self
        finally:
            for m, fn in saved.items():
                setattr(torch.Tensor, m, fn)


def count_syncs(fn, *args, **kwargs) -> tuple[int, dict, Optional[object]]:
    """(host reads, by kind, result) of ``fn(*args, **kwargs)``."""
    counter = SyncCounter()
    with counter.counting():
        out = fn(*args, **kwargs)
    return counter.count, dict(counter.where), out
