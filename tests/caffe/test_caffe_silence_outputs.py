"""A blob read only by ``Silence`` is a net output (colorization ends with ``Silence`` on
``class8_ab``, the blob users read by name); read by another layer too, it is not.

References: OpenCV's Caffe importer (reads the blob by name), ONNX Runtime on the exported
float model."""
from __future__ import annotations

import numpy as np
import torch

from amct_torch.caffe.graph import load_caffe
from amct_torch.cli import main
from helpers.caffe_nets import assert_close, make_net, rand, run_cv

# colorization's tail (richzhang/colorization deploy_v2), shrunk: class scores, a fixed
# temperature Scale, Softmax, the 1x1 convolution onto ab, then Silence on it
COLOR_TAIL = """
layer { name: "conv8_313" type: "Convolution" bottom: "data_l" top: "conv8_313"
  convolution_param { num_output: 6 kernel_size: 1 } }
layer { name: "conv8_313_rh" type: "Scale" bottom: "conv8_313" top: "conv8_313_rh"
  scale_param { bias_term: false } }
layer { name: "class8_313_rh" type: "Softmax" bottom: "conv8_313_rh" top: "class8_313_rh" }
layer { name: "class8_ab" type: "Convolution" bottom: "class8_313_rh" top: "class8_ab"
  convolution_param { num_output: 2 kernel_size: 1 } }
layer { name: "Silence" type: "Silence" bottom: "class8_ab" }
"""


def _blobs():
    return {"conv8_313": [rand(6, 1, 1, 1, seed=1), rand(6, seed=2)],
            "conv8_313_rh": [np.full(6, 2.606, np.float32)],
            "class8_ab": [rand(2, 6, 1, 1, seed=3), rand(2, seed=4)]}


def test_silenced_blob_is_the_output_as_opencv_reads_it(tmp_path):
    proto, model = make_net(tmp_path, COLOR_TAIL, {"data_l": (1, 1, 8, 8)}, _blobs())
    gm = load_caffe(proto, model)
    x = rand(1, 1, 8, 8, seed=5, scale=3.0)
    with torch.no_grad():
        out = gm(torch.from_numpy(x))
    assert list(out) == ["class8_ab"]
    ref = run_cv(proto, model, {"data_l": x}, ["class8_ab"])["class8_ab"]
    assert_close(out["class8_ab"].numpy(), ref, 1e-5)


def test_silence_beside_a_real_reader_leaves_only_the_real_output(tmp_path):
    body = COLOR_TAIL + """
layer { name: "relu" type: "ReLU" bottom: "class8_ab" top: "ab_relu" }
"""
    proto, model = make_net(tmp_path, body, {"data_l": (1, 1, 8, 8)}, _blobs())
    assert list(load_caffe(proto, model)(torch.zeros(1, 1, 8, 8))) == ["ab_relu"]


def test_calibrate_onnx_exports_the_silenced_output(tmp_path, capsys):
    import onnxruntime as ort
    proto, model = make_net(tmp_path, COLOR_TAIL, {"data_l": (1, 1, 8, 8)}, _blobs())
    data = str(tmp_path / "d.npy")
    np.save(data, rand(4, 1, 8, 8, seed=6, scale=3.0))
    prefix = str(tmp_path / "out" / "m")
    assert main(["calibrate", "-q", proto, model, data, "-o", prefix, "--onnx",
                 "--report-batches", "0"]) == 0, capsys.readouterr().err
    x = rand(1, 1, 8, 8, seed=7, scale=3.0)
    with torch.no_grad():
        ref = load_caffe(proto, model)(torch.from_numpy(x))["class8_ab"].numpy()
    sess = ort.InferenceSession(prefix + "_float.onnx", providers=["CPUExecutionProvider"])
    assert [o.name for o in sess.get_outputs()] == ["class8_ab"]
    assert_close(sess.run(None, {"data_l": x})[0], ref, 1e-5)
    q = ort.InferenceSession(prefix + "_quant.onnx", providers=["CPUExecutionProvider"])
    assert [o.name for o in q.get_outputs()] == ["class8_ab"]
