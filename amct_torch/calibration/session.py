"""The calibration state of a graph: observers fed by hooks for ``batch_num`` batches, then
factors computed once and merged into the record.

Why hooks on the user's module: AMCT hands the user a model to run in their own data loop, on
any device. Forward pre-hooks see each quantized layer's input; a hook on the whole module
counts batches. After the ``batch_num``-th batch the factors are computed and merged into the
record and the hooks removed. A loop with work between the last batch and the factors (folding
several processes' statistics) keeps the session open (``kept_open()``) and calls ``finish()``."""
from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Callable, Optional

import torch
from torch import nn

from amct_torch.calibration import backends
from amct_torch.calibration.observer_plan import CalibGroup
from amct_torch.errors import AmctError, CalibrationError

log = logging.getLogger("amct_torch.calibration")

Factors = dict[str, tuple[float, int, Optional[int], Optional[int], Optional[int]]]


def _make_observer(layer: str, cfg, ifmr_mode: str):
    from amct_torch.calibration.observers import make_observer
    return make_observer(layer, cfg, ifmr_mode=ifmr_mode)


def input_chw(x: torch.Tensor) -> tuple[int, int, int]:
    """The record's channels/height/width of a layer input: N×C×H×W → (C, H, W); N×C → (C, 1, 1)."""
    s = list(x.shape[1:]) + [1, 1, 1]
    return int(s[0]), int(s[1]), int(s[2])


class CalibrationSession:
    """Calibrate ``groups`` on the first ``batch_num`` forwards of ``model``.

    ``on_finish(factors)`` receives ``{record key: (scale_d, offset_d, c, h, w)}`` (c/h/w None
    for joint Eltwise entries) once, after the last counted batch; the default writes nothing
    (``api.quantize_model`` passes a record merger).

    ``finish_when_done``: finish by itself after the ``batch_num``-th forward (AMCT's
    behaviour, the default). False keeps the session open until ``finish()`` is called; the
    calibration loop sets it while it runs (see ``kept_open``).

    ``summaries``: keep each observer's ``ActivationSummary`` at finish (the visual report's
    histograms); False for callers that write no report (the summaries cost time at finish).
    """

    def __init__(self, model: nn.Module, groups: Sequence[CalibGroup], batch_num: int,
                 on_finish: Optional[Callable[[Factors], None]] = None,
                 ifmr_mode: str = "streaming", finish_when_done: bool = True,
                 summaries: bool = True) -> None:
        if batch_num < 1:
            raise CalibrationError(f"batch_num must be >= 1, got {batch_num}")
        self.model = model
        self.groups = list(groups)
        self.batch_num = int(batch_num)
        self.on_finish = on_finish
        self.finish_when_done = bool(finish_when_done)
        self.observers = [_make_observer(g.layers[0], g.config, ifmr_mode) for g in self.groups]
        # choose (on a CPU: build and verify) the observers' backend now, never inside a hook
        first = next(iter(model.parameters()), None)
        backends.prepare(first.device if first is not None else torch.device("cpu"))
        self.batches_seen = 0
        self.factors: Optional[Factors] = None
        #: record key -> ``summaries.ActivationSummary`` of its observer, kept by ``finish`` when
        #: ``keep_summaries`` (the visual report's histograms; the observers themselves are freed)
        self.summaries: dict = {}
        self.keep_summaries = bool(summaries)
        self._handles: list = []
        self._attach()

    # -- hooks ---------------------------------------------------------------------------
    def _attach(self) -> None:
        for group, obs in zip(self.groups, self.observers):
            mod = self.model.get_submodule(group.hook_target)
            self._handles.append(mod.register_forward_pre_hook(self._feeder(group, obs)))
        self._handles.append(self.model.register_forward_hook(self._count_batch))

    def _feeder(self, group: CalibGroup, obs) -> Callable:
        def hook(_module: nn.Module, args: tuple) -> None:
            with torch.no_grad():
                for i in group.arg_indices:
                    x = args[i]
                    if group.shape is None and not group.joint:
                        group.shape = input_chw(x)
                    obs.update(x, batch=self.batches_seen)
        return hook

    def _count_batch(self, _module: nn.Module, _args: tuple, _out) -> None:
        self.batches_seen += 1
        log.debug("calibration batch %d/%d", self.batches_seen, self.batch_num)
        if self.finish_when_done and self.batches_seen >= self.batch_num:
            self.finish()

    @contextmanager
    def kept_open(self) -> Iterator[CalibrationSession]:
        """Within this block the session does not finish by itself (whatever the batch count);
        the previous ``finish_when_done`` comes back on leaving it."""
        before, self.finish_when_done = self.finish_when_done, False
        try:
            yield self
        finally:
            self.finish_when_done = before

    def detach(self) -> None:
        """Remove every hook (the module becomes the plain float model again)."""
        for h in self._handles:
            h.remove()
        self._handles = []

    # -- results -------------------------------------------------------------------------
    @property
    def done(self) -> bool:
        return self.factors is not None

    def finish(self) -> Factors:
        """Compute every group's factors (once), hand them to ``on_finish`` and detach.

        Called automatically after ``batch_num`` batches unless the session is kept open;
        calling it earlier calibrates on the batches seen so far (at least one is needed)."""
        if self.factors is not None:
            return self.factors
        self.detach()
        if self.batches_seen == 0:
            raise CalibrationError("no calibration batch was run through the model")
        from amct_torch.calibration.summaries import summarize
        factors: Factors = {}
        for group, obs in zip(self.groups, self.observers):
            try:
                scale, offset = obs.compute()
            except AmctError:
                raise
            except (RuntimeError, ValueError) as err:
                raise CalibrationError(f"cannot compute activation factors: {err}",
                                       layer=group.layers[0]) from None
            c, h, w = group.shape if group.shape is not None else (None, None, None)
            summary = summarize(obs, float(scale), int(offset)) if self.keep_summaries else None
            for name in group.layers:
                factors[name] = (float(scale), int(offset), c, h, w)
                if summary is not None:
                    self.summaries[name] = summary
        self.factors = factors
        self.observers = []  # free the statistics
        if self.on_finish is not None:
            self.on_finish(factors)
        log.info("calibrated %d activation group(s) for %d record entries on %d batch(es)",
                 len(self.groups), len(factors), self.batches_seen)
        backends.warn_if_slow()
        return factors


def group_summary(groups: Sequence[CalibGroup]) -> Mapping[str, list[str]]:
    """``{first layer: all layers}`` of groups shared by several layers (for logging)."""
    return {g.layers[0]: list(g.layers) for g in groups if len(g.layers) > 1}
