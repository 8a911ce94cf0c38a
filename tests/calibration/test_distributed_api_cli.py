"""Distributed calibration through the CLI and the one-call API: ``torchrun --nproc_per_node=2
-m amct_torch.cli calibrate ... --distributed`` (gloo on CPU) against a single-process
``amct_torch.quantize`` on the same .npy data. Only rank 0 writes outputs and prints; the
record matches (streaming IFMR: within the tolerance of docs/distributed.md; weights identical).
``quantize(checkpoint=...)`` resumes a calibration whose checkpoint holds the first batches."""
from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

import amct_torch
from amct_torch.workflow.examples import example_data, example_model

PKG_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(amct_torch.__file__)))
N, BS = 4, 36


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    d = tmp_path_factory.mktemp("data")
    x, _ = example_data("calib")
    path = str(d / "calib.npy")
    np.save(path, x[:N * BS])
    return path


def test_cli_torchrun_matches_single_process(data, tmp_path):
    from amct_torch.record import read_record
    from amct_torch.workflow import quantize
    model, weights = example_model()
    out = tmp_path / "out"
    env = dict(os.environ, PYTHONPATH=PKG_ROOT, OMP_NUM_THREADS="1")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", "--standalone",
           "-m", "amct_torch.cli", "calibrate", model, weights, data, "--batch-num", str(N),
           "--batch-size", str(BS), "--device", "cpu", "--distributed", "--quiet",
           "--output", str(out / "lenet"), "--report-batches", "0"]
    proc = subprocess.run(cmd, env=env, cwd=str(tmp_path), capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.count("quantized 6 layer(s)") == 1          # rank 0 alone prints
    names = sorted(os.listdir(out))
    assert "lenet_record.txt" in names and not [n for n in names if "rank" in n or n.endswith(".tmp")]
    assert sorted(os.listdir(tmp_path)) == ["out"]
    ref = quantize(model, weights, data, output=str(tmp_path / "single" / "lenet"), batch_num=N,
                   batch_size=BS, device="cpu", save_type=None, report=False, quiet=True).records
    got = read_record(str(out / "lenet_record.txt"))
    assert list(got) == list(ref)
    for name, r in ref.items():
        assert got[name].scale_d == pytest.approx(r.scale_d, rel=0.01), name
        assert abs(got[name].offset_d - r.offset_d) <= 1, name
        assert got[name].scale_w == r.scale_w, name


def test_quantize_resumes_from_checkpoint(data, tmp_path):
    """A checkpoint saved after 2 of 4 batches (by the AMCT workflow) lets quantize() finish
    with the record of an uninterrupted run."""
    import torch

    from amct_torch.api import init, quantize_model
    from amct_torch.calibration.checkpoint import save_checkpoint
    from amct_torch.config import create_quant_config
    from amct_torch.workflow import quantize
    model, weights = example_model()
    x = torch.from_numpy(np.load(data))
    cfg = str(tmp_path / "c.json")
    create_quant_config(cfg, model, weights, batch_num=N)
    graph = init(cfg, model, weights, str(tmp_path / "r.txt"))
    m = quantize_model(graph, str(tmp_path / "m.prototxt"), str(tmp_path / "m.caffemodel"))
    with torch.no_grad():
        for i in range(2):
            m(x[i * BS:(i + 1) * BS])
    ckpt = str(tmp_path / "job.ckpt")
    save_checkpoint(graph.session, ckpt)
    # the rest of the data would give other factors if the checkpoint were ignored
    resumed = quantize(model, weights, data, config=cfg, output=str(tmp_path / "a" / "m"), batch_num=N,
                       batch_size=BS, device="cpu", save_type=None, report=False, quiet=True,
                       checkpoint=ckpt).records
    ref = quantize(model, weights, data, config=cfg, output=str(tmp_path / "b" / "m"), batch_num=N,
                   batch_size=BS, device="cpu", save_type=None, report=False, quiet=True).records
    assert not os.path.exists(ckpt)
    assert {n: (r.scale_d, r.offset_d) for n, r in resumed.items()} == \
        {n: (r.scale_d, r.offset_d) for n, r in ref.items()}
