"""The command's read-ahead of the Caffe model: the same net as an ordinary read, used only
for the files it read, and never the reason for a different error."""
from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

from amct_torch.caffe import read_ahead
from amct_torch.caffe.graph import load_caffe
from amct_torch.caffe.netio import read_net
from amct_torch.errors import ModelError
from helpers.caffe_nets import make_net

BODY = ('layer { name: "conv" type: "Convolution" bottom: "data" top: "conv" '
        'convolution_param { num_output: 4 kernel_size: 3 } } '
        'layer { name: "fc" type: "InnerProduct" bottom: "conv" top: "fc" '
        'inner_product_param { num_output: 5 } }')


@pytest.fixture(autouse=True)
def _nothing_pending():
    read_ahead._pending.clear()
    yield
    read_ahead._pending.clear()


def _net(tmp_path):
    rng = np.random.default_rng(0)
    blobs = {"conv": [rng.standard_normal((4, 3, 3, 3)).astype(np.float32),
                      rng.standard_normal(4).astype(np.float32)],
             "fc": [rng.standard_normal((5, 4 * 4 * 4)).astype(np.float32),
                    rng.standard_normal(5).astype(np.float32)]}
    return make_net(tmp_path, BODY, {"data": (1, 3, 6, 6)}, blobs)


def test_file_readers_import_without_torch():
    """What the read-ahead thread runs must not import torch, or it would wait for the import
    it is meant to run beside."""
    code = ("import sys; import amct_torch.caffe.read_ahead, amct_torch.caffe.netio, "
            "amct_torch.caffe.stream_reader; print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_read_ahead_gives_the_ordinary_read_once(tmp_path):
    proto, model = _net(tmp_path)
    read_ahead.start(proto, model)
    got = read_ahead.take(proto, model)
    ref = read_net(proto, model)
    assert got is not None
    assert got.net == ref.net and got.inputs == ref.inputs
    assert sorted(got.blobs) == sorted(ref.blobs) == ["conv", "fc"]
    for name in ref.blobs:
        for a, b in zip(got.blobs[name], ref.blobs[name]):
            assert a.dtype == b.dtype and np.array_equal(a, b)
    assert read_ahead.take(proto, model) is None  # taken once: nothing held afterwards


def test_read_ahead_of_other_files_is_not_used(tmp_path):
    proto, model = _net(tmp_path)
    other = tmp_path / "other"
    other.mkdir()
    proto2, model2 = _net(other)
    read_ahead.start(proto, model)
    assert read_ahead.take(proto2, model2) is None
    assert read_ahead.take(proto, None) is None
    assert read_ahead.take(proto, model) is not None


def test_files_changed_after_the_read_started_are_read_again(tmp_path):
    proto, model = _net(tmp_path)
    read_ahead.start(proto, model)
    read_ahead._pending[next(iter(read_ahead._pending))].wait()
    # a new caffemodel in place of the one read (another inode, size and time)
    swap = tmp_path / "swap"
    swap.mkdir()
    _, new_model = make_net(swap, BODY.replace("num_output: 5", "num_output: 6"), {"data": (1, 3, 6, 6)})
    os.replace(new_model, model)
    assert read_ahead.take(proto, model) is None  # the job reads the files again itself


def test_a_failed_read_ahead_leaves_the_error_to_the_job(tmp_path):
    proto, model = _net(tmp_path)
    with open(model, "r+b") as f:  # a truncated caffemodel
        f.truncate(os.path.getsize(model) // 2)
    with pytest.raises(ModelError) as plain:
        load_caffe(proto, model)
    read_ahead.start(proto, model)
    with pytest.raises(ModelError) as ahead:
        load_caffe(proto, model)
    assert str(ahead.value) == str(plain.value)
    assert ahead.value.file == plain.value.file == model
    assert not read_ahead._pending


def test_a_fifo_is_not_read_ahead(tmp_path):
    proto, _ = _net(tmp_path)
    fifo = str(tmp_path / "weights.fifo")
    os.mkfifo(fifo)
    read_ahead.start(proto, fifo)  # would block a thread forever on open()
    assert not read_ahead._pending


def test_the_command_takes_what_it_read_ahead(tmp_path):
    """After ``amct-torch calibrate`` nothing read ahead is left behind (the job used it)."""
    from amct_torch.cli import main

    proto, model = _net(tmp_path)
    data = tmp_path / "data.npy"
    np.save(data, np.random.default_rng(2).standard_normal((4, 3, 6, 6)).astype(np.float32))
    rc = main(["calibrate", proto, model, str(data), "--output", str(tmp_path / "out" / "m"),
               "--batch-num", "1", "--device", "cpu", "-q"])
    assert rc == 0
    assert not read_ahead._pending
