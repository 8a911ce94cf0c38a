"""Prototxt fields the schema does not know are never ignored without a word: ``inspect`` lists
each with its layer, building a model refuses them (exit 2, one line naming file, layer and
field) unless allowed; the forks' ``ceil_mode`` is read.

References: hand-worked output sizes (Caffe's pooled-size formula), OpenCV's Caffe importer
(which reads ``ceil_mode``), and the field names of real fork schemas and prototxts: shicai's
DenseNet (``pooling_param { ceil_mode: false }``), PSPNet's caffe.proto
(``batch_norm_param.update_global_stats``), NVIDIA Caffe (``convolution_param.
cudnn_math_override``), MobileNet-YOLO / SSD (``save_output_param.resize_param``)."""
from __future__ import annotations

import json
import os

import numpy as np
import pytest

from amct_torch.caffe.graph import load_caffe
from amct_torch.cli import main
from amct_torch.errors import ModelError
from helpers.caffe_nets import assert_close, rand, run_cv

HEAD = 'name: "n"\ninput: "data"\ninput_shape { dim: 1 dim: 3 dim: 16 dim: 16 }\n'

#: (a fork's field inside a parameter message a layer we run uses, the layer text carrying it)
FORK_FIELDS = {
    "convolution_param.cudnn_math_override": (
        'layer { name: "conv" type: "Convolution" bottom: "data" top: "conv"\n'
        '  convolution_param { num_output: 4 kernel_size: 3 cudnn_math_override: 1 } }\n'),
    "deconvolution convolution_param.cudnn_math_override": (
        'layer { name: "conv" type: "Deconvolution" bottom: "data" top: "conv"\n'
        '  convolution_param { num_output: 4 kernel_size: 2 stride: 2 cudnn_math_override: 1 } }\n'),
    "batch_norm_param.update_global_stats": (
        'layer { name: "conv" type: "BatchNorm" bottom: "data" top: "conv"\n'
        '  batch_norm_param { use_global_stats: true update_global_stats: false } }\n'),
    "pooling_param.torch_pooling": (
        'layer { name: "conv" type: "Pooling" bottom: "data" top: "conv"\n'
        '  pooling_param { pool: AVE kernel_size: 2 stride: 2 torch_pooling: true } }\n'),
    "inner_product_param.fork_field": (
        'layer { name: "conv" type: "InnerProduct" bottom: "data" top: "conv"\n'
        '  inner_product_param { num_output: 4 fork_field { a: 1 b: "x" } } }\n'),
    "layer-level field": (
        'layer { name: "conv" type: "ReLU" bottom: "data" top: "conv" engine_hint: 3 }\n'),
}


#: a quantizable layer after the one under test (inspect needs something to quantize)
TAIL = ('layer { name: "q" type: "InnerProduct" bottom: "conv" top: "q"\n'
        '  inner_product_param { num_output: 2 } }\n')


def _write(tmp_path, body: str, name: str = "net") -> str:
    path = os.path.join(str(tmp_path), f"{name}.prototxt")
    with open(path, "w") as f:
        f.write(HEAD + body + TAIL)
    return path


def test_ceil_mode_false_is_floor_as_opencv(tmp_path):
    """112x112, 3x3 stride 2 pad 1 (DenseNet's pool1): ceil gives 57 (Caffe's default), floor
    ⌊(112 + 2 - 3)/2⌋ + 1 = 56 (shicai's fork, OpenCV); the values as OpenCV's."""
    body = ('layer { name: "pool1" type: "Pooling" bottom: "data" top: "pool1"\n'
            '  pooling_param { pool: MAX kernel_size: 3 stride: 2 pad: 1 %s } }\n')
    x = rand(1, 3, 112, 112, seed=3)
    for extra, size in (("ceil_mode: false", 56), ("ceil_mode: true", 57), ("", 57)):
        path = os.path.join(str(tmp_path), f"p{size}{len(extra)}.prototxt")
        with open(path, "w") as f:
            f.write(HEAD.replace("16 dim: 16", "112 dim: 112") + body % extra)
        gm = load_caffe(path)
        out = gm(__import__("torch").from_numpy(x))["pool1"].numpy()
        assert out.shape == (1, 3, size, size)
        ref = run_cv(path, "", {"data": x}, ["pool1"])["pool1"]
        assert_close(out, ref, 1e-6)


def test_ceil_mode_contradicting_round_mode_is_refused(tmp_path):
    path = _write(tmp_path, 'layer { name: "p" type: "Pooling" bottom: "data" top: "p"\n'
                            '  pooling_param { kernel_size: 3 stride: 2 round_mode: CEIL ceil_mode: false } }\n')
    with pytest.raises(ModelError, match="round_mode and ceil_mode disagree") as err:
        load_caffe(path)
    assert err.value.layer == "p"


@pytest.mark.parametrize("case", sorted(FORK_FIELDS))
def test_fork_field_listed_refused_and_allowed(tmp_path, capsys, case):
    body = FORK_FIELDS[case]
    field = case.split(".")[-1] if "." in case else "engine_hint"
    path = _write(tmp_path, body)
    # inspect: listed with its layer, the model not supported (exit 3) unless allowed
    assert main(["inspect", path, "--no-onnx", "--json"]) == 3
    res = json.loads(capsys.readouterr().out)
    assert [(f["layer"], f["field"].split(".")[-1]) for f in res["unknown_fields"]] == [("conv", field)]
    assert main(["inspect", path, "--no-onnx", "--allow-unknown-fields"]) == 0
    text = capsys.readouterr().out
    assert "unknown fields 1" in text and "layer 'conv'" in text and field in text
    # the loader refuses it naming file, layer and field; allowed, the layer runs without it
    with pytest.raises(ModelError) as err:
        load_caffe(path)
    assert err.value.file == path and err.value.layer == "conv" and field in err.value.message
    gm = load_caffe(path, allow_unknown_fields=True)
    assert len(list(gm(__import__("torch").zeros(1, 3, 16, 16)).values())) == 1


def test_calibrate_refuses_unless_allowed(tmp_path, capsys):
    """The command line: exit 2 with one line naming file, layer and field, nothing written;
    ``--allow-unknown-fields`` runs, and the field is written back into the models."""
    path = _write(tmp_path, FORK_FIELDS["convolution_param.cudnn_math_override"])
    from google.protobuf import text_format

    from amct_torch.caffe.netio import caffemodel_bytes
    from amct_torch.proto import amct_caffe_pb2 as pb
    net = text_format.Parse(HEAD, pb.NetParameter())
    for name, arrs in (("conv", (rand(4, 3, 3, 3), rand(4, seed=1))), ("q", (rand(2, 784, seed=4), rand(2)))):
        layer = net.layer.add(name=name)
        for arr in arrs:
            blob = layer.blobs.add()
            blob.shape.dim.extend(arr.shape)
            blob.data.extend(arr.reshape(-1).tolist())
    weights = os.path.join(str(tmp_path), "w.caffemodel")
    with open(weights, "wb") as f:
        f.write(caffemodel_bytes(net))
    data = os.path.join(str(tmp_path), "d.npy")
    np.save(data, rand(4, 3, 16, 16, seed=2))
    prefix = os.path.join(str(tmp_path), "out", "m")
    argv = ["calibrate", "-q", path, weights, data, "-o", prefix, "--report-batches", "0", "--batch-num", "1"]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and path in err[0] and "layer 'conv'" in err[0]
    assert "convolution_param.cudnn_math_override" in err[0] and "--allow-unknown-fields" in err[0]
    assert not os.path.exists(os.path.dirname(prefix)) or not os.listdir(os.path.dirname(prefix))
    assert main(argv + ["--allow-unknown-fields"]) == 0
    capsys.readouterr()
    with open(prefix + "_deploy_model.prototxt") as f:
        assert "cudnn_math_override: 1" in f.read()


def test_python_api_keyword(tmp_path):
    from amct_torch.caffe.unknown_fields import unknown_fields_allowed
    path = _write(tmp_path, FORK_FIELDS["batch_norm_param.update_global_stats"])
    with pytest.raises(ModelError, match="update_global_stats"):
        load_caffe(path)
    with unknown_fields_allowed():
        load_caffe(path)
    assert load_caffe(path, allow_unknown_fields=True) is not None


def test_damaged_first_token_is_named(tmp_path):
    """``nput: "image"``: the error says which field was dropped, not only that the names are
    missing."""
    path = os.path.join(str(tmp_path), "bad.prototxt")
    with open(path, "w") as f:
        f.write('nput: "image"\ninput_shape { dim: 1 dim: 3 dim: 8 dim: 8 }\n'
                'layer { name: "c" type: "ReLU" bottom: "image" top: "c" }\n')
    with pytest.raises(ModelError, match=r"without 'input' names.*'nput: \"image\"'") as err:
        load_caffe(path)
    assert err.value.file == path
