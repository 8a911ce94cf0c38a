"""``amct-torch demo``: the main job on the bundled example, with float vs int8 accuracy.

Why: the README's first command must show the product working on a fresh install with no
data to find: calibrate the bundled digits CNN on its calibration split, then compare the
float model and the int8 (fake-quant) model on the held-out split, and show the per-layer
report and the files written.
"""
from __future__ import annotations

import sys
from typing import Optional

import numpy as np
import torch


def accuracy(model: torch.nn.Module, inputs: np.ndarray, labels: np.ndarray,
             device: torch.device, batch: int = 256) -> float:
    """Top-1 accuracy in percent of a model whose single output holds the class scores."""
    hits = 0
    with torch.no_grad():
        for i in range(0, len(inputs), batch):
            out = model(torch.from_numpy(inputs[i:i + batch]).to(device))
            scores = next(iter(out.values())) if isinstance(out, dict) else out
            hits += int((scores.argmax(1).cpu().numpy() == labels[i:i + batch]).sum())
    return 100.0 * hits / len(inputs)


def run_demo(output: str = "amct_demo/lenet_digits", batch_num: int = 4,
             device: Optional[str] = None, quiet: bool = False, out=None) -> int:
    """Quantize the example model, print accuracies, the report and the outputs; exit code."""
    from amct_torch.caffe import load_caffe
    from amct_torch.quality import format_table
    from amct_torch.workflow.examples import example_data, example_model
    from amct_torch.workflow.job import quantize

    out = out or sys.stdout
    model_file, weights_file = example_model()
    calib, _ = example_data("calib")
    test_x, test_y = example_data("test")
    result = quantize(model_file, weights_file, calib, output=output, batch_num=batch_num,
                      device=device, save_type="Both",
                      report_data=test_x[:128], quiet=quiet)
    dev = result.device
    original = load_caffe(model_file, weights_file).to(dev)
    acc_f = accuracy(original, test_x, test_y, dev)
    acc_q = accuracy(result.quant_model, test_x, test_y, dev)
    print(f"example model: {model_file}", file=out)
    print(f"calibrated on {len(calib)} samples in {result.graph.config.batch_num} batches, "
          f"{len(result.records)} layers quantized, device {dev}", file=out)
    print(f"\naccuracy on {len(test_y)} held-out digits:", file=out)
    print(f"  float32  {acc_f:6.2f} %", file=out)
    print(f"  int8     {acc_q:6.2f} %   (drop {acc_f - acc_q:+.2f} points)", file=out)
    print("\nper-layer accuracy (fake-quant vs float output, worst first):", file=out)
    print(format_table(result.report or []), file=out)
    print("\nwritten:", file=out)
    for kind, p in result.files.items():
        print(f"  {kind:<22} {p}", file=out)
    return 0
