"""Layers sharing a name (HED's five ``Crop`` layers are all "crop") run as Caffe runs them, the
user's names come back unchanged in the Caffe models written, and a quantized layer whose name
is shared is refused with one line (the record is keyed by name).

References: OpenCV's Caffe importer (it accepts shared names), the prototxt text written back
read with a plain regex, and Caffe's rule that the caffemodel's blobs of a name go to the last
layer of that name (an earlier one keeps its filler: here a constant filler, hand-checked)."""
from __future__ import annotations

import os
import re

import numpy as np
import pytest
import torch

from amct_torch.caffe.graph import load_caffe
from amct_torch.caffe.netio import read_net, save_caffe
from amct_torch.cli import main
from helpers.caffe_nets import assert_close, make_net, rand, run_cv

# HED's side outputs, shrunk: two upsampling deconvolutions cropped back to the input's size by
# two Crop layers that share the name "crop"
HED_LIKE = """
layer { name: "conv1" type: "Convolution" bottom: "data" top: "conv1"
  convolution_param { num_output: 4 kernel_size: 3 pad: 1 } }
layer { name: "pool1" type: "Pooling" bottom: "conv1" top: "pool1"
  pooling_param { pool: MAX kernel_size: 2 stride: 2 } }
layer { name: "score-dsn1" type: "Convolution" bottom: "conv1" top: "score-dsn1"
  convolution_param { num_output: 1 kernel_size: 1 } }
layer { name: "crop" type: "Crop" bottom: "score-dsn1" bottom: "data" top: "upscore-dsn1" }
layer { name: "score-dsn2" type: "Convolution" bottom: "pool1" top: "score-dsn2"
  convolution_param { num_output: 1 kernel_size: 1 } }
layer { name: "upsample_2" type: "Deconvolution" bottom: "score-dsn2" top: "score-dsn2-up"
  convolution_param { num_output: 1 kernel_size: 4 stride: 2 } }
layer { name: "crop" type: "Crop" bottom: "score-dsn2-up" bottom: "data" top: "upscore-dsn2" }
layer { name: "sigmoid-dsn1" type: "Sigmoid" bottom: "upscore-dsn1" top: "sigmoid-dsn1" }
layer { name: "sigmoid-dsn2" type: "Sigmoid" bottom: "upscore-dsn2" top: "sigmoid-dsn2" }
"""


def _hed_blobs():
    return {"conv1": [rand(4, 3, 3, 3, seed=1, scale=0.3), rand(4, seed=2)],
            "score-dsn1": [rand(1, 4, 1, 1, seed=3), rand(1, seed=4)],
            "score-dsn2": [rand(1, 4, 1, 1, seed=5), rand(1, seed=6)],
            "upsample_2": [rand(1, 1, 4, 4, seed=7), rand(1, seed=8)]}


def test_shared_crop_names_run_as_opencv_and_come_back_unchanged(tmp_path):
    proto, model = make_net(tmp_path, HED_LIKE, {"data": (1, 3, 12, 12)}, _hed_blobs())
    gm = load_caffe(proto, model)
    x = rand(1, 3, 12, 12, seed=9)
    with torch.no_grad():
        ours = {k: v.numpy() for k, v in gm(torch.from_numpy(x)).items()}
    ref = run_cv(proto, model, {"data": x}, ["sigmoid-dsn1", "sigmoid-dsn2"])
    for k in ref:
        assert ours[k].shape == (1, 1, 12, 12)
        assert_close(ours[k], ref[k], 1e-5)
    # inside: distinct names; written back: the user's, in the same order
    names = [layer.name for layer in read_net(proto).net.layer]
    assert len(set(names)) == len(names) and names.count("crop") == 1
    out_proto, out_model = str(tmp_path / "back.prototxt"), str(tmp_path / "back.caffemodel")
    save_caffe(gm, out_proto, out_model)
    with open(proto) as f:
        before = re.findall(r'name: "([^"]+)"', f.read())
    with open(out_proto) as f:
        text = f.read()
    assert re.findall(r'name: "([^"]+)"', text) == before
    assert "amct" not in text and "#" not in text
    again = run_cv(out_proto, out_model, {"data": x}, ["sigmoid-dsn2"])["sigmoid-dsn2"]
    assert_close(again, ref["sigmoid-dsn2"], 1e-6)


def test_caffemodel_blobs_go_to_the_last_layer_of_a_name(tmp_path):
    """Two Scale layers named "s": the caffemodel's blob reaches the second; the first keeps
    its constant filler (2.0), as Caffe's name index (the last layer of a name) decides."""
    body = """
layer { name: "s" type: "Scale" bottom: "data" top: "a"
  scale_param { filler { type: "constant" value: 2.0 } } }
layer { name: "s" type: "Scale" bottom: "a" top: "b" }
"""
    proto, model = make_net(tmp_path, body, {"data": (1, 2, 3, 3)},
                            {"s": [np.array([3.0, 5.0], np.float32)]})
    # make_net writes the blob on both layers of the name; keep it on the last only
    from amct_torch.caffe.netio import parse_caffemodel, write_net
    net = parse_caffemodel(model)
    net.layer[1].ClearField("blobs")
    write_net(net, proto, model)
    gm = load_caffe(proto, model)
    x = np.ones((1, 2, 3, 3), np.float32)
    out = gm(torch.from_numpy(x))["b"].numpy()
    assert np.allclose(out[0, :, 0, 0], [2.0 * 3.0, 2.0 * 5.0])


def test_a_quantized_layer_with_a_shared_name_is_refused(tmp_path, capsys):
    body = """
layer { name: "conv" type: "Convolution" bottom: "data" top: "c1"
  convolution_param { num_output: 2 kernel_size: 1 weight_filler { type: "constant" value: 0.5 } } }
layer { name: "conv" type: "Convolution" bottom: "c1" top: "c2"
  convolution_param { num_output: 2 kernel_size: 1 } }
"""
    blobs = {"conv": [rand(2, 2, 1, 1), rand(2)]}
    proto, model = make_net(tmp_path, body, {"data": (1, 2, 4, 4)}, blobs)
    assert main(["inspect", proto, model, "--no-onnx"]) == 3
    out = capsys.readouterr().out
    assert "2 layers are named 'conv'" in out
    data = str(tmp_path / "d.npy")
    np.save(data, rand(2, 2, 4, 4, seed=3))
    prefix = str(tmp_path / "out" / "m")
    rc = main(["calibrate", "-q", proto, model, data, "-o", prefix, "--report-batches", "0"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1
    assert proto in err[0] and "layer 'conv'" in err[0] and "distinct names" in err[0]
    assert not os.path.exists(prefix + "_record.txt")


@pytest.mark.parametrize("skip", [False, True])
def test_calibrate_keeps_shared_names_of_unquantized_layers(tmp_path, capsys, skip):
    """HED-like net through calibrate: the fake-quant and deploy prototxts carry the two
    "crop" layers under their own name."""
    proto, model = make_net(tmp_path, HED_LIKE, {"data": (1, 3, 12, 12)}, _hed_blobs())
    data = str(tmp_path / "d.npy")
    np.save(data, rand(4, 3, 12, 12, seed=3))
    prefix = str(tmp_path / "out" / "m")
    argv = ["calibrate", "-q", proto, model, data, "-o", prefix, "--report-batches", "0"]
    if skip:
        argv += ["--skip-layers", "upsample_2"]
    assert main(argv) == 0, capsys.readouterr().err
    for kind in ("fake_quant_model", "deploy_model"):
        with open(f"{prefix}_{kind}.prototxt") as f:
            text = f.read()
        assert len(re.findall(r'name: "crop"\s', text)) == 2, kind
