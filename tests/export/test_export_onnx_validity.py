"""No ONNX model a runtime refuses: every model the exporter writes passes onnx.checker's full
check and loads in ONNX Runtime (default optimizations) before it is written, and a refusal is
an ExportError naming the user's model file and the layer, with no file written.

The reported case: an SSD head convolution without bias (Normalize → conv → Permute → Flatten)
in the integer form fed its int32 accumulator to a DequantizeLinear; ORT's QDQ propagation
copied that pair across the Permute and then refused its own QuantizeLinear with an int32 zero
point. The references are ONNX Runtime itself and the plain QDQ form (integer_ops=False) run by
ORT with its optimizations off (the standard ONNX semantics of the fake-quant model)."""
from __future__ import annotations

import os

import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto, helper, numpy_helper

from amct_torch.caffe.graph import load_caffe
from amct_torch.errors import ExportError
from amct_torch.export.onnx import integer, qdq
from amct_torch.export.onnx.qdq import export_onnx
from amct_torch.export.onnx.validate import check_runtime
from helpers.caffe_nets import make_net, rand
from helpers.data import natural_images_bgr
from helpers.exports import minmax_records
from helpers.runtimes import ort_run, ort_session
from helpers.ssd import ssd_net

HEAD = '''
layer { name: "conv6" type: "Convolution" bottom: "data" top: "conv6" convolution_param { num_output: 8 kernel_size: 3 pad: 1 } }
layer { name: "relu6" type: "ReLU" bottom: "conv6" top: "conv6" }
layer { name: "conv6_norm" type: "Normalize" bottom: "conv6" top: "conv6_norm" norm_param { across_spatial: false channel_shared: false } }
layer { name: "conv6_norm_mbox_conf" type: "Convolution" bottom: "conv6_norm" top: "conv6_norm_mbox_conf" convolution_param { num_output: 6 kernel_size: 3 pad: 1 BIAS } }
layer { name: "perm" type: "Permute" bottom: "conv6_norm_mbox_conf" top: "perm" permute_param { order: 0 order: 2 order: 3 order: 1 } }
layer { name: "flat" type: "Flatten" bottom: "perm" top: "flat" flatten_param { axis: 1 } }
'''


def _head_net(tmp_path, bias: bool):
    blobs = {"conv6": [rand(8, 3, 3, 3, seed=1), rand(8, seed=2)], "conv6_norm": [np.full(8, 10.0, np.float32)],
             "conv6_norm_mbox_conf": [rand(6, 8, 3, 3, seed=3)] + ([rand(6, seed=4)] if bias else [])}
    body = HEAD.replace("BIAS", "" if bias else "bias_term: false")
    proto, model = make_net(tmp_path, body, {"data": [1, 3, 8, 8]}, blobs, name=f"head{int(bias)}")
    gm = load_caffe(proto, model)
    return proto, gm, minmax_records(gm, torch.from_numpy(rand(2, 3, 8, 8, seed=5)))


@pytest.mark.parametrize("bias,form", [(False, "float"), (False, "int32"), (True, "int32"), (True, "float")])
def test_ssd_head_integer_form_loads_and_computes_the_qdq_model(tmp_path, bias, form):
    """The head conv is written in the integer form (its output is not requantized); ORT loads
    the model with its optimizations, and without them computes what the plain QDQ form does."""
    proto, gm, recs = _head_net(tmp_path, bias)
    _, qp = export_onnx(gm, recs, str(tmp_path / "m"), bias=form, file=proto)
    model = onnx.load(qp)
    onnx.checker.check_model(model, full_check=True)
    ops = [n.op_type for n in model.graph.node]
    assert "ConvInteger" in ops and not any(  # no int32 tensor reaches a DequantizeLinear
        n.op_type == "DequantizeLinear" and any(i.endswith("_acc") or "_acc_" in i for i in n.input)
        for n in model.graph.node)
    x = rand(3, 3, 8, 8, seed=6)
    got, = ort_run(qp, x).values()
    assert got.shape == (3, 8 * 8 * 6) and np.isfinite(got).all()
    _, plain = export_onnx(gm, recs, str(tmp_path / "p"), bias=form, file=proto, integer_ops=False)
    ref, = ort_run(plain, x, "DISABLE_ALL").values()
    mine, = ort_run(qp, x, "DISABLE_ALL").values()
    np.testing.assert_allclose(mine, ref, rtol=0, atol=1e-5 * float(np.abs(ref).max()))


def test_ssd_face_detector_without_head_bias_calibrates_to_a_loadable_qdq_model(tmp_path, capsys):
    """The reported detector shape end to end: Normalize, Permute, Flatten, PriorBox,
    DetectionOutput, head convolutions without bias; ``calibrate --onnx`` exits 0 and ORT
    loads and runs both models at batch 2."""
    from amct_torch.cli import main
    proto, model = ssd_net(tmp_path, head_bias=False)
    data = tmp_path / "calib.npy"
    imgs = natural_images_bgr(size=64, count=4, seed=1) / 64.0
    np.save(data, imgs)
    out = str(tmp_path / "out" / "ssd")
    rc = main(["calibrate", "-q", proto, model, str(data), "-o", out, "--onnx", "--report-batches", "0"])
    assert rc == 0, capsys.readouterr().err
    for suffix in ("_float.onnx", "_quant.onnx"):
        det = ort_run(out + suffix, imgs[:2])["detection_out"]
        assert det.shape[-1] == 7 and np.isfinite(det).all()
    ops = {n.op_type for n in onnx.load(out + "_quant.onnx").graph.node}
    assert "ConvInteger" in ops


def _old_int32_dequantize(b, graph_outputs):
    """The writer before the fix: the accumulator rescaled by an int32 DequantizeLinear (used
    here to check that such a model is refused in the user's terms, never written)."""
    done = integer.rewrite(b, graph_outputs)
    for _k, node in enumerate(list(b.nodes)):
        if node.op_type != "Cast" or not node.name.endswith("_Cast"):
            continue
        mul = next(n for n in b.nodes if n.op_type == "Mul" and node.output[0] in n.input)
        scale = b.arrays[mul.input[1]].reshape(-1)
        zp = b.init(node.name + "_zero", np.zeros(scale.size, np.int32) if scale.size > 1 else np.array(0, np.int32))
        sc = b.init(node.name + "_scale1d", scale if scale.size > 1 else scale.reshape(()))
        dq = helper.make_node("DequantizeLinear", [node.input[0], sc, zp], list(mul.output),
                              name=node.name + "_dq", **({"axis": 1} if scale.size > 1 else {}))
        b.nodes[b.nodes.index(node)] = dq
        b.nodes.remove(mul)
    return done


def test_refused_model_names_model_file_and_layer_and_writes_nothing(tmp_path, monkeypatch):
    proto, gm, recs = _head_net(tmp_path, bias=False)
    monkeypatch.setattr(qdq, "rewrite", _old_int32_dequantize)
    prefix = str(tmp_path / "out")
    with pytest.raises(ExportError) as ei:
        export_onnx(gm, recs, prefix, file="record.txt", model_file=proto)
    err = ei.value
    assert err.file == proto and err.layer == "conv6_norm_mbox_conf", str(err)
    assert "ONNX Runtime refuses" in str(err) and "out_quant.onnx" in str(err)
    assert not os.path.exists(prefix + "_float.onnx") and not os.path.exists(prefix + "_quant.onnx")
    assert not [f for f in os.listdir(tmp_path) if ".onnx" in f]


def test_check_runtime_maps_an_ort_refusal_to_the_layer():
    """A hand-written valid ONNX model that ORT 1.32 refuses (an int32 DequantizeLinear before a
    Transpose, the reported shape): the error names the file and the layer owning the value."""
    acc = helper.make_tensor_value_info("acc", TensorProto.INT32, [1, 2, 2, 2])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8])
    inits = [numpy_helper.from_array(np.array([0.5, 0.25], np.float32), "head_scale"),
             numpy_helper.from_array(np.zeros(2, np.int32), "head_acc_zero")]
    nodes = [helper.make_node("DequantizeLinear", ["acc", "head_scale", "head_acc_zero"], ["d"], axis=1),
             helper.make_node("Transpose", ["d"], ["t"], perm=[0, 2, 3, 1]),
             helper.make_node("Flatten", ["t"], ["y"], axis=1)]
    model = helper.make_model(helper.make_graph(nodes, "g", [acc], [y], inits),
                              opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model, full_check=True)  # valid ONNX ...
    with pytest.raises(Exception, match="int32"):  # ... that ORT refuses
        ort_session(model.SerializeToString())
    owners = {"head_acc_zero": "head", "head_scale": "head"}
    with pytest.raises(ExportError) as ei:
        check_runtime(model.SerializeToString(), "net.prototxt",
                      lambda t: next((v for k, v in owners.items() if k in t), None), "the model m_quant.onnx")
    assert ei.value.file == "net.prototxt" and ei.value.layer == "head"
    assert "m_quant.onnx" in str(ei.value) and "[ONNXRuntimeError]" not in str(ei.value)


def test_written_models_have_no_unused_initializers(tmp_path):
    """The folded priors and the weights the integer form replaced are not written (ORT used
    to note every one of them when loading)."""
    proto, model = ssd_net(tmp_path, head_bias=False)
    gm = load_caffe(proto, model)
    recs = minmax_records(gm, torch.from_numpy(natural_images_bgr(size=64, count=2, seed=1) / 64.0))
    for path in export_onnx(gm, recs, str(tmp_path / "m"), file=proto):
        m = onnx.load(path)
        used = {i for n in m.graph.node for i in n.input}
        used |= {i for n in m.graph.node for a in n.attribute if a.type == onnx.AttributeProto.GRAPH
                 for sn in a.g.node for i in sn.input}
        assert [t.name for t in m.graph.initializer if t.name not in used] == []


# -- the preflight: the same models, placeholder factors, before calibration -----------------
def _config(gm):
    from amct_torch.config import default_quant_config, layer_infos_from_net
    return default_quant_config(layer_infos_from_net(gm.caffe_net))


def test_preflight_finds_a_runtime_refusal_before_calibration(tmp_path, monkeypatch):
    """With the writer that produced the reported model, the preflight (no records, no data)
    already names the file and the layer ORT refuses."""
    from amct_torch.export.onnx.preflight import preflight_onnx
    proto, gm, _ = _head_net(tmp_path, bias=False)
    assert preflight_onnx(gm, _config(gm), model_file=proto).quantized == 2
    monkeypatch.setattr(qdq, "rewrite", _old_int32_dequantize)
    with pytest.raises(ExportError) as ei:
        preflight_onnx(gm, _config(gm), model_file=proto)
    assert ei.value.file == proto and ei.value.layer == "conv6_norm_mbox_conf"


def test_preflight_builds_the_quantized_form(tmp_path):
    """The preflight builds the QDQ model from the config alone: per-channel weights of a
    grouped Deconvolution with two output channels per group (no single ONNX axis) are written
    as float values there, as the exporter writes them; the float form has no quantized layer."""
    from amct_torch.export.onnx.preflight import preflight_onnx
    body = ('layer { name: "conv" type: "Convolution" bottom: "data" top: "conv" convolution_param { num_output: 4 kernel_size: 3 pad: 1 } }\n'
            'layer { name: "up" type: "Deconvolution" bottom: "conv" top: "up" convolution_param { num_output: 4 kernel_size: 2 stride: 2 group: 2 } }\n')
    proto, model = make_net(tmp_path, body, {"data": [1, 3, 8, 8]},
                            {"conv": [rand(4, 3, 3, 3, seed=1), rand(4, seed=2)], "up": [rand(4, 2, 2, 2, seed=3), rand(4, seed=4)]})
    gm = load_caffe(proto, model)
    assert preflight_onnx(gm, None, model_file=proto).quantized == 0
    both = preflight_onnx(gm, _config(gm), model_file=proto)
    assert both.quantized == 2 and both.quant_nodes > both.float_nodes
    assert preflight_onnx(gm, ["conv"], model_file=proto).quantized == 1


def test_preflight_checks_the_output_names(tmp_path):
    from amct_torch.export.onnx.preflight import preflight_onnx
    proto, model = ssd_net(tmp_path)
    gm = load_caffe(proto, model)
    with pytest.raises(ExportError) as ei:
        preflight_onnx(gm, _config(gm), outputs=["mbox_loc", "ghost"], model_file=proto)
    assert ei.value.file == proto and "'ghost'" in str(ei.value) and "'mbox_loc'" not in str(ei.value)
    res = preflight_onnx(gm, _config(gm), outputs=["mbox_loc"], model_file=proto, speed=True)
    assert res.quantized == 9 and res.quant_nodes > res.float_nodes


def test_preflight_models_carry_no_weights(tmp_path):
    """The preflight's models hold no array larger than LIGHT_ELEMENTS: the weights are graph
    inputs of the same shape and type as the exporter's initializers. With the placeholder
    offset of a ReLU'd input (-128, as the calibrated record has after each ReLU here) the
    model has the exporter's very nodes."""
    from amct_torch.export.onnx.preflight import placeholder_plan
    proto, model = ssd_net(tmp_path, head_bias=False)
    gm = load_caffe(proto, model)
    recs = minmax_records(gm, torch.from_numpy(natural_images_bgr(size=64, count=2, seed=1) / 64.0))
    _, qp = export_onnx(gm, recs, str(tmp_path / "m"), file=proto, dynamic_spatial=False)
    real = {t.name: (t.data_type, list(t.dims)) for t in onnx.load(qp).graph.initializer}
    light, _ = qdq._build(gm, placeholder_plan(gm, _config(gm), offset_d=-128), "uint8", proto, "quant",
                          dynamic_spatial=False, light=True)
    assert all(np.prod(t.dims) <= qdq.LIGHT_ELEMENTS for t in light.graph.initializer)
    shape_only = {i.name: (i.type.tensor_type.elem_type, [d.dim_value for d in i.type.tensor_type.shape.dim])
                  for i in light.graph.input[1:]}
    assert shape_only and all(real[n] == v for n, v in shape_only.items()), shape_only
    assert [(n.op_type, n.name) for n in light.graph.node] == [(n.op_type, n.name) for n in onnx.load(qp).graph.node]


def test_without_onnxruntime_the_checker_alone_runs(tmp_path, monkeypatch, caplog):
    """onnxruntime is optional: without it the models are still checked by onnx.checker and
    written, with one warning that says so (and inspect's answer says how it checked)."""
    import importlib.util
    import logging

    from amct_torch.export.onnx import validate
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "onnxruntime" else real(name, *a))
    monkeypatch.setattr(validate, "_warned", [])
    proto, gm, recs = _head_net(tmp_path, bias=False)
    with caplog.at_level(logging.WARNING, logger="amct_torch"):
        paths = export_onnx(gm, recs, str(tmp_path / "m"), file=proto)
        export_onnx(gm, recs, str(tmp_path / "n"), file=proto)
    assert all(os.path.exists(p) for p in paths)
    assert caplog.text.count("onnxruntime is not installed") == 1
    assert validate.runtime_status() == "onnx.checker only (onnxruntime is not installed)"
    monkeypatch.setattr(qdq, "rewrite", _old_int32_dequantize)  # only a runtime refuses this one
    export_onnx(gm, recs, str(tmp_path / "o"), file=proto)
    onnx.checker.check_model(onnx.load(str(tmp_path / "o_quant.onnx")), full_check=True)
