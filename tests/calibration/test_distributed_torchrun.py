"""Distributed calibration under a real ``torchrun`` (2 processes, gloo on CPU) on the bundled
example model, against a plain single-process AMCT-workflow run on the same batches.

The single-process reference is the user's own loop over the model ``quantize_model`` returns
(no code of calibration/distributed.py involved). IFMR exact must be bit-identical (its merge
is a concatenation and the shards are contiguous); IFMR streaming and HFMG are compared with
the tolerance docs/distributed.md states. Only rank 0 may write into the output folder.

Run as a script, this file is the torchrun worker.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import torch

if __name__ == "__main__":  # run as a script by the test itself: tests/ holds the helpers
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from helpers.configs import use_hfmg

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MODES = ("exact", "streaming", "hfmg")
BATCH_NUM = 5       # uneven shards on 2 ranks: 3 + 2
BATCH_SIZE = 36


def batches(n: int = BATCH_NUM) -> list[torch.Tensor]:
    from amct_torch.workflow.examples import example_data
    x, _ = example_data("calib")
    return [torch.from_numpy(x[i * BATCH_SIZE:(i + 1) * BATCH_SIZE]) for i in range(n)]


def write_config(path: str, mode: str, n: int = BATCH_NUM) -> None:
    """JSON quant config for the example: IFMR everywhere, or HFMG everywhere."""
    from amct_torch.config import create_quant_config
    from amct_torch.workflow.examples import example_model
    model, weights = example_model()
    create_quant_config(path, model, weights, batch_num=n)
    if mode == "hfmg":
        use_hfmg(path, num_of_bins=4096)


def ifmr_mode(mode: str) -> str:
    return "exact" if mode == "exact" else "streaming"


def single_process_record(tmp: str, mode: str, n: int = BATCH_NUM) -> dict:
    """The reference: AMCT workflow, the user's plain loop over all batches."""
    from amct_torch.api import init, quantize_model
    from amct_torch.record import read_record
    from amct_torch.workflow.examples import example_model
    model, weights = example_model()
    cfg = os.path.join(tmp, f"{mode}.json")
    write_config(cfg, mode, n)
    rec = os.path.join(tmp, f"{mode}_single_record.txt")
    graph = init(cfg, model, weights, rec)
    m = quantize_model(graph, os.path.join(tmp, "m.prototxt"), os.path.join(tmp, "m.caffemodel"),
                       ifmr_mode=ifmr_mode(mode))
    with torch.no_grad():
        for b in batches(n):
            m(b)
    assert graph.session.done
    return read_record(rec)


def worker(out: str) -> None:
    """One rank: the AMCT workflow with private paths on ranks > 0, sharded calibration."""
    import tempfile

    from amct_torch.api import init, quantize_model
    from amct_torch.calibration.distributed import init_distributed, rank_output, shutdown
    from amct_torch.calibration.loop import run_calibration
    from amct_torch.workflow.examples import example_model

    ctx = init_distributed("cpu")
    model, weights = example_model()
    scratch = tempfile.mkdtemp()
    sent = {}
    for mode in MODES:
        cfg = os.path.join(scratch, f"{mode}.json")
        write_config(cfg, mode)
        graph = init(cfg, model, weights, rank_output(os.path.join(out, f"{mode}_record.txt"), ctx))
        m = quantize_model(graph, rank_output(os.path.join(out, f"{mode}_modified.prototxt"), ctx),
                           rank_output(os.path.join(out, f"{mode}_modified.caffemodel"), ctx),
                           ifmr_mode=ifmr_mode(mode))
        run_calibration(m, graph.session, batches(), ctx=ctx)
        sent[mode] = dict(ctx.bytes_sent)
    for mode in MODES:  # one batch: rank 1 calibrates nothing and contributes an empty state
        cfg = os.path.join(scratch, f"{mode}1.json")
        write_config(cfg, mode, 1)
        graph = init(cfg, model, weights, rank_output(os.path.join(out, f"{mode}_one_record.txt"), ctx))
        m = quantize_model(graph, os.path.join(scratch, "m.prototxt"), os.path.join(scratch, "m.caffemodel"),
                           ifmr_mode=ifmr_mode(mode))
        run_calibration(m, graph.session, batches(1), ctx=ctx)
    with open(os.path.join(scratch, "ignored"), "w"):
        pass
    if ctx.is_writer:
        with open(os.path.join(out, "bytes_rank0.json"), "w") as f:
            json.dump({"world": ctx.world_size, "backend": ctx.backend, "sent": sent}, f)
    shutdown(ctx)


@pytest.fixture(scope="module")
def torchrun_out(tmp_path_factory):
    out = str(tmp_path_factory.mktemp("dist_out"))
    cwd = str(tmp_path_factory.mktemp("dist_cwd"))
    env = dict(os.environ, PYTHONPATH=ROOT, OMP_NUM_THREADS="1")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", "--standalone",
           os.path.abspath(__file__), out]
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return out, cwd


def test_only_rank0_writes(torchrun_out):
    out, cwd = torchrun_out
    expected = {f"{m}_{s}" for m in MODES
                for s in ("record.txt", "modified.prototxt", "modified.caffemodel", "one_record.txt")}
    assert set(os.listdir(out)) == expected | {"bytes_rank0.json"}
    assert os.listdir(cwd) == []


def test_ifmr_exact_identical(torchrun_out, tmp_path):
    from amct_torch.record import read_record
    dist_rec = read_record(os.path.join(torchrun_out[0], "exact_record.txt"))
    ref = single_process_record(str(tmp_path), "exact")
    assert list(dist_rec) == list(ref)
    for name, r in ref.items():
        d = dist_rec[name]
        assert (d.scale_d, d.offset_d) == (r.scale_d, r.offset_d), name       # IFMR exact: bit-identical
        assert d.scale_w == r.scale_w and d.offset_w == r.offset_w, name      # ARQ: identical
        assert (d.channels, d.height, d.width) == (r.channels, r.height, r.width), name


@pytest.mark.parametrize("mode", ["streaming", "hfmg"])
def test_merged_modes_within_tolerance(torchrun_out, tmp_path, mode):
    """Tolerance (docs/distributed.md): scale_d within 1 % and offset_d within 1 of the
    single-process value; weights identical."""
    from amct_torch.record import read_record
    dist_rec = read_record(os.path.join(torchrun_out[0], f"{mode}_record.txt"))
    ref = single_process_record(str(tmp_path), mode)
    assert list(dist_rec) == list(ref)
    for name, r in ref.items():
        d = dist_rec[name]
        assert d.scale_d == pytest.approx(r.scale_d, rel=0.01), name
        assert abs(d.offset_d - r.offset_d) <= 1, name
        assert d.scale_w == r.scale_w, name


@pytest.mark.parametrize("mode", MODES)
def test_rank_without_batches(torchrun_out, tmp_path, mode):
    """batch_num 1 on 2 ranks: rank 1's empty state merges away; the record is the
    one-process record of that batch, identical for every mode."""
    from amct_torch.record import read_record
    dist_rec = read_record(os.path.join(torchrun_out[0], f"{mode}_one_record.txt"))
    ref = single_process_record(str(tmp_path), mode, 1)
    assert {n: (r.scale_d, r.offset_d, r.channels) for n, r in dist_rec.items()} == \
        {n: (r.scale_d, r.offset_d, r.channels) for n, r in ref.items()}


def test_bytes_sent_per_layer(torchrun_out):
    """Rank 0 reports the bytes it contributed per calibration group; for IFMR exact that is at
    least its own activations (3 batches of the layer input, float32)."""
    with open(os.path.join(torchrun_out[0], "bytes_rank0.json")) as f:
        info = json.load(f)
    assert info["world"] == 2 and info["backend"] == "gloo"
    from amct_torch.workflow.examples import example_data
    x, _ = example_data("calib")
    first = info["sent"]["exact"]["conv1"]
    assert first >= 3 * BATCH_SIZE * int(np.prod(x.shape[1:])) * 4
    # streaming state is fixed-size: far smaller than the data for conv2's larger input
    assert info["sent"]["streaming"]["conv2"] < info["sent"]["exact"]["conv2"]


if __name__ == "__main__":
    sys.path.insert(0, ROOT)
    worker(sys.argv[1])
