"""The evaluator ``accuracy_based_auto_calibration`` uses when the net measures its own accuracy.

Why: a train/test net already says how it is judged: its TEST data layers and an ``Accuracy``
layer. With it no user code is needed: calibration runs the first ``batch_num`` batches of the
TEST data, a model's metric is its first Accuracy top averaged over ``iterations`` batches as
``caffe test`` prints it, and a quantized model passes when it loses at most
``max_drop_points`` percentage points against the float model.
"""
from __future__ import annotations

from typing import Any, Optional

import torch

from amct_torch.errors import ModelError


def accuracy_top(gm: Any, model_file: Optional[str] = None) -> str:
    """The top of the net's first Accuracy layer (the metric), or a ModelError."""
    for layer in gm.meta.get("caffe_head", []):
        if layer.type == "Accuracy" and layer.top:
            return str(layer.top[0])
    raise ModelError("the net has no Accuracy layer in its TEST phase: accuracy-driven calibration "
                     "without an evaluator needs a train/test net that measures its accuracy",
                     file=model_file)


class NetAccuracyEvaluator:
    """AMCT's evaluator methods over the net's own data and Accuracy layer.

    ``batch_num``: the calibration batches; ``iterations``: the batches each evaluation
    averages over (from the first, as ``caffe test``); ``max_drop_points``: the accuracy a
    quantized model may lose, in percentage points."""

    def __init__(self, model_file: str, weights_file: str, *, batch_num: int, max_drop_points: float = 0.5,
                 iterations: int = 50, device: Optional[str] = None, quiet: bool = True) -> None:
        from amct_torch.caffe.graph import load_caffe
        from amct_torch.caffe.head import NetHead
        from amct_torch.calibration.loop import resolve_device
        from amct_torch.inputs.caffe_data import PhaseData

        gm = load_caffe(model_file, weights_file)
        self.metric = accuracy_top(gm, model_file)
        self.device = resolve_device(device)
        self.names = [n for n, _ in gm.caffe_inputs]
        self.head = NetHead(gm.meta.get("caffe_head", []), model_file).to(self.device)
        self.data = PhaseData(gm.meta.get("caffe_data_layers", []), model_file)
        self.batch_num, self.iterations = int(batch_num), int(iterations)
        self.max_drop_points, self.quiet = float(max_drop_points), quiet

    def _inputs(self, batch: dict) -> list[torch.Tensor]:
        return [torch.from_numpy(batch[n]).to(self.device) for n in self.names]

    def calibration(self, model: Any) -> None:
        """The first ``batch_num`` batches of the TEST data through ``model``."""
        batches = self.data.batches()
        with torch.no_grad():
            for _ in range(self.batch_num):
                model(*self._inputs(next(batches)))

    def evaluate(self, model: Any) -> float:
        """The mean of the Accuracy top over ``iterations`` batches (a fraction, as Caffe)."""
        from amct_torch.caffe.head import NetOutput
        from amct_torch.quality.net_scores import score, torch_forward

        sums, _, _ = score(torch_forward(model, self.device), self.head, [NetOutput(self.metric, 0.0)],
                           self.data, self.iterations, f"evaluating {self.metric}", self.quiet)
        return sums.means()[self.metric]

    def metric_eval(self, original_metric: float, new_metric: float) -> tuple[bool, float]:
        """(passes, the drop in points): passes when the drop is at most ``max_drop_points``."""
        drop = (float(original_metric) - float(new_metric)) * 100.0
        return drop <= self.max_drop_points + 1e-9, drop

    def close(self) -> None:
        self.data.close()
