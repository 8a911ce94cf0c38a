"""What the job checks before calibrating, so that nothing fails a finished job: the images the
per-layer report reads afterwards, the activation memory at the input size after
preprocessing."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from amct_torch.caffe.graph import load_caffe
from amct_torch.caffe.memory import check_activation_memory, checked_first_batch, estimate_activation_memory
from amct_torch.cli import main
from amct_torch.errors import ModelError
from amct_torch.workflow.examples import example_model


def _pngs(folder, n: int, bad: int = -1) -> str:
    import cv2
    folder.mkdir()
    rng = np.random.default_rng(3)
    for i in range(n):
        ok, png = cv2.imencode(".png", rng.integers(0, 256, (16, 16), dtype=np.uint8))
        data = png.tobytes()
        (folder / f"im{i}.png").write_bytes(data[:40] if i == bad else data)
    return str(folder)


def test_an_unreadable_held_out_image_fails_before_calibration(tmp_path, capsys, monkeypatch):
    from amct_torch.workflow import job
    calibrated = []
    real = job.run_calibration
    monkeypatch.setattr(job, "run_calibration", lambda *a, **k: calibrated.append(1) or real(*a, **k))
    model, weights = example_model()
    data = _pngs(tmp_path / "imgs", 4, bad=2)  # batch 1 calibrates (im0, im1); im2 is held out
    code = main(["calibrate", model, weights, data, "--device", "cpu", "-q", "--batch-num", "1",
                 "--batch-size", "2", "--report-batches", "1", "-o", str(tmp_path / "o" / "m")])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and "im2.png" in err, err
    assert calibrated == [] and not (tmp_path / "o").exists()


def test_an_earlier_output_it_cannot_replace_fails_before_calibration(tmp_path, capsys, monkeypatch):
    # a sticky folder (/tmp-like) holding an earlier record of another user: refused up front,
    # not at the commit after calibrating; nothing published, the earlier file untouched
    import os

    from amct_torch.workflow import job
    calibrated = []
    real = job.run_calibration
    monkeypatch.setattr(job, "run_calibration", lambda *a, **k: calibrated.append(1) or real(*a, **k))
    model, weights = example_model()
    data = _pngs(tmp_path / "imgs", 2)
    out = tmp_path / "o"
    out.mkdir()
    os.chmod(out, 0o1777)
    (out / "m_record.txt").write_text("old")
    monkeypatch.setattr(os, "geteuid", lambda: 65534)  # this run is another user's
    code = main(["calibrate", model, weights, data, "--device", "cpu", "-q", "--batch-num", "1",
                 "-o", str(out / "m")])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and "m_record.txt" in err, err
    assert calibrated == [] and os.listdir(out) == ["m_record.txt"]
    assert (out / "m_record.txt").read_text() == "old"


def test_activation_memory_uses_the_shape_after_preprocessing():
    model, weights = example_model()
    gm = load_caffe(model, weights)
    per = estimate_activation_memory(gm).bytes_at(1)
    declared = (1, 16, 16)
    check_activation_memory(gm, 1, model, available=int(per * 2), sample_shape=declared)
    with pytest.raises(ModelError, match="after preprocessing") as err:  # 7000x7000: 191,406x the values
        check_activation_memory(gm, 1, model, available=int(per * 2), sample_shape=(1, 7000, 7000))
    assert err.value.file == model
    # the first batch's real shape is checked before it is passed on
    big = [torch.zeros(2, 1, 700, 700)]
    with pytest.raises(ModelError):
        next(_checked_with_room(big, gm, model, int(per * 2)))


def _checked_with_room(batches, gm, model, room):
    from amct_torch.caffe import memory
    real = memory.available_memory
    memory.available_memory = lambda device=None: (room, "given")
    try:
        yield from checked_first_batch(batches, gm, model)
    finally:
        memory.available_memory = real
