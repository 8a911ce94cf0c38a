"""The example model's calibration set up the AMCT way (init + quantize_model), and its batches
with an optional SIGKILL before one of them: the checkpoint tests kill a real process mid-run
and resume it in another."""
from __future__ import annotations

import os
import signal

import torch

from helpers.configs import use_hfmg

BATCH_NUM = 6
BATCH_SIZE = 30


def batches(kill_at=None):
    from amct_torch.workflow.examples import example_data
    x, _ = example_data("calib")
    for i in range(BATCH_NUM):
        if i == kill_at:
            os.kill(os.getpid(), signal.SIGKILL)
        yield torch.from_numpy(x[i * BATCH_SIZE:(i + 1) * BATCH_SIZE])


def setup(tmp: str, mode: str, tag: str):
    """init + quantize_model of the example with IFMR (exact/streaming) or HFMG everywhere."""
    from amct_torch.api import init, quantize_model
    from amct_torch.config import create_quant_config
    from amct_torch.workflow.examples import example_model
    model, weights = example_model()
    cfg = os.path.join(tmp, f"{mode}.json")
    create_quant_config(cfg, model, weights, batch_num=BATCH_NUM)
    if mode == "hfmg":
        use_hfmg(cfg, num_of_bins=2048)
    rec = os.path.join(tmp, f"{mode}_{tag}_record.txt")
    graph = init(cfg, model, weights, rec)
    m = quantize_model(graph, os.path.join(tmp, f"{tag}.prototxt"), os.path.join(tmp, f"{tag}.caffemodel"),
                       ifmr_mode="exact" if mode == "exact" else "streaming")
    return graph, m
