"""``export_onnx(target=...)`` / ``--onnx-target``: the QDQ model laid out for the runtime that
runs it.

- openvino: compiled by OpenVINO's CPU plugin, every convolution and FC that ONNX Runtime runs
  as an int8 kernel on the default model runs in u8/i8 in OpenVINO too (read from OpenVINO's
  compiled runtime model), on nsfw's ResNet-50, a depthwise detector and a PReLU face net, and
  its outputs are as close to the float model's as ORT's are.
- tensorrt: TensorRT's published explicit-quantization rules, written out below and checked
  on the graph (no GPU here), and the model still computes the fake-quant numbers in ORT.
- onnxruntime (default): byte for byte the model written without the option.
- an asymmetric quant config with target tensorrt is refused (exit 2) before calibration.
"""
from __future__ import annotations

import os

import numpy as np
import onnx
import pytest
import torch
from onnx import numpy_helper

from amct_torch.caffe.graph import load_caffe
from amct_torch.cli import main
from amct_torch.errors import ExportError
from amct_torch.export import export_onnx
from amct_torch.fusion import fuse_bn
from helpers.data import natural_images_bgr, nsfw_dir
from helpers.exports import minmax_records, sqnr_db
from helpers.runtimes import openvino_available, openvino_compile, openvino_counts, openvino_layers, ort_counts, ort_run
from helpers.target_nets import depthwise_detector, onet_like

needs_openvino = pytest.mark.skipif(openvino_available() is not None, reason=str(openvino_available()))


def _net(kind: str, tmp_path):
    """(fused graph, calibration images, held-out images) of a test net."""
    if kind == "nsfw":
        d = nsfw_dir()
        proto, model, size, scale = (os.path.join(d, "deploy.prototxt"),
                                     os.path.join(d, "resnet_50_1by2_nsfw.caffemodel"), (224, 224), 1.0)
    elif kind == "onet":
        (proto, model), size, scale = onet_like(tmp_path), (48, 48), 1 / 128
    else:
        (proto, model), size, scale = depthwise_detector(tmp_path), (120, 160), 1 / 128

    def images(seed, count):
        x = natural_images_bgr(size=max(size), count=count, seed=seed)[:, :, :size[0], :size[1]]
        return np.ascontiguousarray(x * scale, dtype=np.float32)
    return fuse_bn(load_caffe(proto, model)).graph, images(1, 2), images(5, 4)


def _symmetric(recs):
    """The same records with symmetric activations (offset 0, scale max|x|/127) as AMCT's
    activation_offset: false gives."""
    out = {}
    for n, r in recs.items():
        lo, hi = -128 - r.offset_d, 127 - r.offset_d  # the asymmetric grid's range in steps
        r2 = type(r)(float(np.float32(max(abs(lo), abs(hi)) * r.scale_d / 127)), 0)
        r2.scale_w, r2.offset_w = r.scale_w, r.offset_w
        out[n] = r2
    return out


def _ov_run(compiled, x: np.ndarray) -> list[np.ndarray]:
    res = compiled.create_infer_request().infer({0: x})
    return [res[o] for o in compiled.outputs]


@needs_openvino
@pytest.mark.parametrize("kind", ["nsfw", "dwdet", "onet"])
def test_openvino_runs_every_ort_int8_layer_in_int8(tmp_path, kind):
    gm, calib, held = _net(kind, tmp_path)
    recs = minmax_records(gm, torch.from_numpy(calib))
    fp, ort_q = export_onnx(gm, recs, str(tmp_path / "ort"))
    _, ov_q = export_onnx(gm, recs, str(tmp_path / "ov"), target="openvino")
    want = ort_counts(ort_q)
    compiled = openvino_compile(ov_q)
    got = openvino_counts(compiled)
    # every conv / FC ORT runs as an int8 kernel runs in u8/i8 in OpenVINO, none in float
    assert want["conv_int8"] > 0 and got["conv_int8"] >= want["conv_int8"], (got, want)
    assert got["fc_int8"] >= want["fc_int8"], (got, want)
    assert got["conv_float"] == 0 and got["fc_float"] == 0, [l for l in openvino_layers(compiled)
                                                              if l[1] not in ("u8", "i8")]
    # the numbers: as close to the float model as ORT's int8 model is (within 3 dB), top-1
    # (nsfw) as the float model
    ref = list(ort_run(fp, held).values())
    ort_out, ov_out = list(ort_run(ort_q, held).values()), _ov_run(compiled, held)
    for r, a, b in zip(ref, ort_out, ov_out):
        assert sqnr_db(r, b) >= min(sqnr_db(r, a) - 3.0, 30.0), (sqnr_db(r, a), sqnr_db(r, b))
    if kind == "nsfw":
        assert np.array_equal(ov_out[0].argmax(1), ref[0].argmax(1))


@needs_openvino
def test_openvino_target_strided_pointwise_is_exact(tmp_path):
    """The subsampling moved in front of the quantizer gives ORT's numbers of the default
    plain-QDQ form (the same products), to float rounding, with optimizations off."""
    gm, calib, held = _net("nsfw", tmp_path)
    recs = minmax_records(gm, torch.from_numpy(calib))
    _, plain = export_onnx(gm, recs, str(tmp_path / "plain"), integer_ops=False)
    _, ov_q = export_onnx(gm, recs, str(tmp_path / "ov"), target="openvino")
    strided = [n for n in onnx.load(ov_q).graph.node if n.op_type == "Conv"
               and any(a.name == "strides" and list(a.ints) != [1, 1] for a in n.attribute)
               and any(a.name == "kernel_shape" and list(a.ints) == [1, 1] for a in n.attribute)]
    assert strided == []
    a, b = ort_run(plain, held, "DISABLE_ALL"), ort_run(ov_q, held, "DISABLE_ALL")
    assert a.keys() == b.keys()
    for k in a:
        np.testing.assert_allclose(a[k], b[k], atol=1e-6)


def test_default_target_is_the_output_without_the_option(tmp_path):
    gm, calib, _ = _net("dwdet", tmp_path)
    recs = minmax_records(gm, torch.from_numpy(calib))
    a = export_onnx(gm, recs, str(tmp_path / "a"))
    b = export_onnx(gm, recs, str(tmp_path / "b"), target="onnxruntime")
    for pa, pb in zip(a, b):
        with open(pa, "rb") as fa, open(pb, "rb") as fb:
            assert fa.read() == fb.read()


# -- TensorRT's explicit-quantization rules, as published, written plainly -------------------
def _tensorrt_rule_violations(model: onnx.ModelProto) -> list[str]:
    """1. Q/DQ zero points are INT8 and 0 (symmetric; no UINT8 anywhere).
    2. Activation scales are per-tensor (scalars); per-channel scales only on constant weights,
       along the output-channel axis (Conv: 0; Gemm with transB=1: 0).
    3. Every Conv/Gemm reads its data input and its weights through a DequantizeLinear, the
       weights being an INT8 constant.
    4. No integer-arithmetic ops TensorRT lacks (ConvInteger, MatMulInteger).
    5. A residual Add fed by a Conv: its other input comes through a DequantizeLinear or is
       a Conv output itself (the two-convolution projection form)."""
    g = model.graph
    inits = {t.name: numpy_helper.to_array(t) for t in g.initializer}
    prod = {o: n for n in g.node for o in n.output}
    bad = []
    for n in g.node:
        if n.op_type in ("QuantizeLinear", "DequantizeLinear"):
            zp = inits.get(n.input[2]) if len(n.input) > 2 else None
            if zp is None or zp.dtype != np.int8 or np.any(zp != 0):
                bad.append(f"{n.name}: zero point {None if zp is None else (zp.dtype, zp.ravel()[:3])}")
            scale = inits[n.input[1]]
            if scale.size > 1 and not (n.op_type == "DequantizeLinear" and n.input[0] in inits):
                bad.append(f"{n.name}: per-channel scale on an activation")
        if n.op_type in ("ConvInteger", "MatMulInteger") or any(
                t.dtype == np.uint8 for t in (inits.get(i) for i in n.input) if t is not None):
            bad.append(f"{n.name}: {n.op_type} / uint8")
        if n.op_type in ("Conv", "Gemm"):
            for k in (0, 1):
                src = prod.get(n.input[k])
                if src is None or src.op_type != "DequantizeLinear":
                    bad.append(f"{n.name}: input {k} not dequantized")
                elif k == 1:
                    w, s = inits.get(src.input[0]), inits[src.input[1]]
                    axis = next((a.i for a in src.attribute if a.name == "axis"), 1)
                    if w is None or w.dtype != np.int8:
                        bad.append(f"{n.name}: weights not an int8 constant")
                    elif s.size > 1 and (axis != 0 or s.size != w.shape[0]):
                        bad.append(f"{n.name}: weight axis {axis}")
                    trans_b = next((a.i for a in n.attribute if a.name == "transB"), 0)
                    if n.op_type == "Gemm" and s.size > 1 and not trans_b:
                        bad.append(f"{n.name}: per-channel Gemm weights without transB")
        if n.op_type == "Add":
            srcs = [prod.get(i) for i in n.input]
            kinds = [s.op_type if s is not None else "input" for s in srcs]
            if "Conv" in kinds and not all(k in ("Conv", "DequantizeLinear") for k in kinds):
                bad.append(f"{n.name}: residual input from {kinds}")
    return bad


@pytest.mark.parametrize("kind", ["nsfw", "dwdet", "onet"])
def test_tensorrt_target_follows_tensorrts_rules(tmp_path, kind):
    gm, calib, held = _net(kind, tmp_path)
    recs = _symmetric(minmax_records(gm, torch.from_numpy(calib)))
    fp, default = export_onnx(gm, recs, str(tmp_path / "ort"))
    _, trt = export_onnx(gm, recs, str(tmp_path / "trt"), target="tensorrt")
    assert _tensorrt_rule_violations(onnx.load(trt)) == []
    if kind == "nsfw":  # the rules are not met by the default form (so the check can fail)
        assert _tensorrt_rule_violations(onnx.load(default)) != []
        adds = [n for n in onnx.load(trt).graph.node if n.op_type == "Add"]
        assert len(adds) == 16
    # the numbers (ORT, no GPU): as close to the float model as the default model's
    ref, a, b = ort_run(fp, held), ort_run(default, held), ort_run(trt, held)
    assert ref.keys() == a.keys() == b.keys()
    for r, x, y in zip(ref.values(), a.values(), b.values()):
        assert sqnr_db(r, y) >= min(sqnr_db(r, x) - 3.0, 25.0), (sqnr_db(r, x), sqnr_db(r, y))


def test_tensorrt_target_refuses_an_asymmetric_record(tmp_path):
    gm, calib, _ = _net("onet", tmp_path)
    recs = minmax_records(gm, torch.from_numpy(calib))
    assert any(r.offset_d != 0 for r in recs.values())
    with pytest.raises(ExportError, match="zero point 0"):
        export_onnx(gm, recs, str(tmp_path / "m"), target="tensorrt")
    assert not os.path.exists(tmp_path / "m_quant.onnx")


def _calibrate(tmp_path, *extra):
    proto, model = onet_like(tmp_path)
    data = tmp_path / "data.npy"
    np.save(data, (natural_images_bgr(size=48, count=2, seed=1) / 128).astype(np.float32))
    return main(["calibrate", "-q", proto, model, str(data), "-o", str(tmp_path / "out" / "m"),
                 "--onnx", "--report-batches", "0", *extra])


def test_tensorrt_with_asymmetric_activations_exits_2_before_calibration(tmp_path, capsys, monkeypatch):
    import amct_torch.workflow.job as job

    def no_calibration(*a, **k):
        raise AssertionError("calibration started")
    monkeypatch.setattr(job, "run_calibration", no_calibration)
    assert _calibrate(tmp_path, "--onnx-target", "tensorrt") == 2
    err = capsys.readouterr().err
    assert "activation_offset: false" in err and "--no-activation-offset" in err, err
    # a config file that asks for asymmetric activations: refused after reading it, still
    # before calibration, naming the file and the field
    cfg = tmp_path / "quant.cfg"
    cfg.write_text("activation_offset: true\n")
    assert _calibrate(tmp_path, "--onnx-target", "tensorrt", "--config", str(cfg)) == 2
    err = capsys.readouterr().err
    assert "activation_offset: false" in err and "quant.cfg" in err, err
    assert not os.path.exists(tmp_path / "out" / "m_record.txt")


def test_tensorrt_cli_writes_the_symmetric_model(tmp_path):
    assert _calibrate(tmp_path, "--onnx-target", "tensorrt", "--no-activation-offset") == 0
    model = onnx.load(str(tmp_path / "out" / "m_quant.onnx"))
    assert _tensorrt_rule_violations(model) == []


def _ssd(tmp_path):
    from helpers.ssd import ssd_net
    proto, model = ssd_net(tmp_path)[:2]
    gm = fuse_bn(load_caffe(proto, model)).graph
    recs = minmax_records(gm, torch.from_numpy(natural_images_bgr(size=64, count=4, seed=1) / 64.0))
    return gm, recs


@needs_openvino
def test_openvino_target_ssd_with_detection_output(tmp_path):
    """An SSD net (strided 1×1 convolutions, heads, DetectionOutput's If subgraph reading outer
    values): the rewrite keeps every value a subgraph reads, and OpenVINO runs every
    convolution ORT runs in int8 in int8."""
    gm, recs = _ssd(tmp_path)
    _, ort_q = export_onnx(gm, recs, str(tmp_path / "ort"))
    _, ov_q = export_onnx(gm, recs, str(tmp_path / "ov"), target="openvino")
    want, got = ort_counts(ort_q), openvino_counts(openvino_compile(ov_q))
    assert want["conv_int8"] > 0 and got["conv_int8"] >= want["conv_int8"] and got["conv_float"] == 0, (got, want)


def test_tensorrt_target_ssd(tmp_path):
    gm, recs = _ssd(tmp_path)
    _, trt = export_onnx(gm, _symmetric(recs), str(tmp_path / "trt"), target="tensorrt")
    assert _tensorrt_rule_violations(onnx.load(trt)) == []
