"""The ONNX preflight checks the layout of the chosen ``--onnx-target`` before calibration.

- A combination the target cannot express fails before any calibration batch, naming the
  model file, the layer and the option to change (CLI: exit 2, no output file): TensorRT with
  a ``joint_quant`` config whose layers are all symmetric but whose global
  ``activation_offset`` is on -- the Eltwise SUMs that joint_quant quantizes take the global
  setting, so the per-layer check of the config cannot see them; before, the run calibrated
  and then failed while writing the outputs.
- The same config with ``activation_offset: false`` runs, and the written model has only
  zero point 0 (read back from the file).
- What the preflight builds for a target is that target's layout (its activation type, no
  integer form, its rewrite), seen by wrapping the rewrite.
"""
from __future__ import annotations

import os

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

import amct_torch.export.onnx.preflight as preflight
from amct_torch.caffe.graph import load_caffe
from amct_torch.cli import main
from amct_torch.errors import ExportError
from helpers.caffe_nets import make_net, rand
from helpers.exports import SMALL_BODY, small_blobs

JOINT_ASYMMETRIC = ("activation_offset: true\njoint_quant: true\n"
                    "common_config { ifmr_quantize { asymmetric: false } }\n")


def _small(tmp_path):
    """conv1 -> ReLU -> AVE pool -> conv2, conv3 -> Eltwise SUM 'sum' -> fc1, and its data."""
    proto, model = make_net(tmp_path, SMALL_BODY, {"data": [1, 3, 8, 8]}, small_blobs(np.random.default_rng(0)))
    data = tmp_path / "x.npy"
    np.save(data, rand(4, 3, 8, 8, seed=1))
    return proto, model, str(data)


def _calibrate(tmp_path, cfg_text: str, *extra: str) -> tuple[int, str]:
    proto, model, data = _small(tmp_path)
    cfg = tmp_path / "quant.cfg"
    cfg.write_text(cfg_text)
    rc = main(["calibrate", "-q", proto, model, data, "-o", str(tmp_path / "out" / "m"), "--onnx",
               "--config", str(cfg), "--report-batches", "0", *extra])
    return rc, proto


def test_tensorrt_joint_quant_asymmetric_eltwise_exits_2_before_calibration(tmp_path, capsys, monkeypatch):
    import amct_torch.workflow.job as job

    def no_calibration(*a, **k):
        raise AssertionError("calibration started")
    monkeypatch.setattr(job, "run_calibration", no_calibration)
    rc, proto = _calibrate(tmp_path, JOINT_ASYMMETRIC, "--onnx-target", "tensorrt")
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2, err
    line = err[-1]
    assert proto in line and "layer 'sum'" in line and "joint_quant" in line and "activation_offset: false" in line, line
    assert "--onnx-target tensorrt" in line
    assert not os.path.exists(tmp_path / "out")  # no file of the run, nor its folder


def test_the_same_joint_quant_config_runs_for_the_default_target(tmp_path):
    """The refusal is the target's: ONNX Runtime takes the asymmetric Eltwise."""
    rc, _ = _calibrate(tmp_path, JOINT_ASYMMETRIC)
    assert rc == 0 and os.path.exists(tmp_path / "out" / "m_quant.onnx")


def test_tensorrt_joint_quant_symmetric_writes_zero_points_0(tmp_path):
    rc, _ = _calibrate(tmp_path, JOINT_ASYMMETRIC.replace("activation_offset: true", "activation_offset: false"),
                       "--onnx-target", "tensorrt")
    assert rc == 0
    model = onnx.load(str(tmp_path / "out" / "m_quant.onnx"))
    inits = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    zps = [inits[n.input[2]] for n in model.graph.node
           if n.op_type in ("QuantizeLinear", "DequantizeLinear") and len(n.input) > 2]
    assert zps and all(z.dtype == np.int8 and not z.any() for z in zps)
    # the joint Eltwise's inputs are quantized: the Add reads dequantized values only
    prod = {o: n for n in model.graph.node for o in n.output}
    add = next(n for n in model.graph.node if n.op_type == "Add" and n.name.startswith("sum"))
    assert all(prod[i].op_type == "DequantizeLinear" for i in add.input), [prod[i].op_type for i in add.input]


def test_api_preflight_names_the_joint_eltwise(tmp_path):
    proto, model, _ = _small(tmp_path)
    gm = load_caffe(proto, model)
    names = ["conv1", "pool1", "conv2", "conv3", "fc1"]
    # the default config (a list of names) is asymmetric: refused for tensorrt, naming the first layer
    with pytest.raises(ExportError, match="zero point 0") as e:
        preflight.preflight_onnx(gm, names, model_file=proto, target="tensorrt")
    assert e.value.layer == "conv1" and e.value.file == proto
    # accepted for the other targets
    for target in ("onnxruntime", "openvino"):
        assert preflight.preflight_onnx(gm, names, model_file=proto, target=target).quantized == len(names)


@pytest.mark.parametrize("target", ["openvino", "tensorrt"])
def test_preflight_builds_the_targets_layout(tmp_path, monkeypatch, target):
    """The model the preflight checks is the target's: no integer form, the target's activation
    type, the target's rewrite applied (a 1x1 stride-2 convolution's subsampling as a Slice for
    openvino)."""
    body = ('layer { name: "conv1" type: "Convolution" bottom: "data" top: "conv1" convolution_param { num_output: 8 kernel_size: 3 pad: 1 } }\n'
            'layer { name: "relu1" type: "ReLU" bottom: "conv1" top: "conv1" }\n'
            'layer { name: "proj" type: "Convolution" bottom: "conv1" top: "proj" convolution_param { num_output: 8 kernel_size: 1 stride: 2 } }\n'
            'layer { name: "fc" type: "InnerProduct" bottom: "proj" top: "fc" inner_product_param { num_output: 4 } }\n')
    proto, model = make_net(tmp_path, body, {"data": [1, 3, 8, 8]},
                            {"conv1": [rand(8, 3, 3, 3, seed=1), rand(8, seed=2)], "proj": [rand(8, 8, 1, 1, seed=3), rand(8, seed=4)],
                             "fc": [rand(4, 128, seed=5) * 0.1, rand(4, seed=6)]})
    from amct_torch.config.types import LayerQuantConfig, QuantConfig
    qc = QuantConfig(layers={n: LayerQuantConfig(asymmetric=False) for n in ("conv1", "proj", "fc")})
    seen: list[onnx.ModelProto] = []
    real = preflight.apply_target

    def spy(name, m):
        seen.append(m)
        return real(name, m)
    monkeypatch.setattr(preflight, "apply_target", spy)
    preflight.preflight_onnx(load_caffe(proto, model), qc, model_file=proto, target=target)
    assert len(seen) == 1  # one QDQ build: no integer form whose zero-point choice needs two
    ops = [n.op_type for n in seen[0].graph.node]
    assert "ConvInteger" not in ops and "MatMulInteger" not in ops
    zp = {n.input[2] for n in seen[0].graph.node if n.op_type == "QuantizeLinear"}
    types = {t.data_type for t in seen[0].graph.initializer if t.name in zp}
    assert types == {onnx.TensorProto.UINT8 if target == "openvino" else onnx.TensorProto.INT8}
    if target == "openvino":
        assert "Slice" in ops
    # a rewrite that breaks the model is found before calibration, naming the model file
    monkeypatch.setattr(preflight, "apply_target", lambda name, m: _broken(real(name, m)))
    with pytest.raises(ExportError) as e:
        preflight.preflight_onnx(load_caffe(proto, model), qc, model_file=proto, target=target)
    assert e.value.file == proto and f"--onnx-target {target}" in str(e.value)


def _broken(model: onnx.ModelProto) -> onnx.ModelProto:
    """The model with one node reading a value nothing produces."""
    model.graph.node.append(onnx.helper.make_node("Relu", ["no_such_value"], ["dangling"], name="dangling"))
    return model
