"""ONNX QDQ export: ONNX Runtime (CPU) runs it like our torch fake-quant model, and its graph
optimizer turns it into int8 kernels."""
from __future__ import annotations

import collections

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch

from conftest import natural_images_bgr
from export_helpers import minmax_records
from amct_torch.caffe.graph import load_caffe
from amct_torch.export import export_onnx, fake_quant_graph
from amct_torch.fusion import fuse_bn

INT8_KERNELS = {"QLinearConv", "ConvInteger", "QLinearMatMul", "MatMulInteger", "QGemm",
                "MatMulIntegerToFloat", "QLinearAveragePool"}


@pytest.fixture(scope="module")
def nsfw_fused(nsfw_model):
    gm = fuse_bn(load_caffe(*nsfw_model)).graph
    calib = torch.from_numpy(natural_images_bgr(count=4, seed=1))
    return gm, minmax_records(gm, calib)


@pytest.mark.parametrize("activations", ["int8", "uint8"])
def test_nsfw_qdq_in_onnxruntime(tmp_path, nsfw_fused, activations):
    gm, recs = nsfw_fused
    fp, qp = export_onnx(gm, recs, str(tmp_path / "m"), activations=activations)
    for p in (fp, qp):
        m = onnx.load(p)
        onnx.checker.check_model(m, full_check=True)
        assert m.opset_import[0].version >= 13
    qm = onnx.load(qp)
    dq_axes = [a.i for n in qm.graph.node if n.op_type == "DequantizeLinear" for a in n.attribute
               if a.name == "axis"]
    assert dq_axes  # per-channel weights
    x = natural_images_bgr(count=4, seed=3)
    with torch.no_grad():
        flt = gm(torch.from_numpy(x))["prob"].numpy()
        fq = fake_quant_graph(gm, recs)(torch.from_numpy(x))["prob"].numpy()
    so = ort.SessionOptions()
    so.optimized_model_filepath = str(tmp_path / "opt.onnx")
    got_q = ort.InferenceSession(qp, so, providers=["CPUExecutionProvider"]).run(None, {"data": x})[0]
    got_f = ort.InferenceSession(fp, providers=["CPUExecutionProvider"]).run(None, {"data": x})[0]
    np.testing.assert_allclose(got_f, flt, atol=1e-5)
    # int8 kernels vs float fake-quant: accumulation order and the int32 bias rounding move a
    # value near a rounding boundary by one step of some layer; the softmax output then stays
    # within 1e-2 (one step of its 8-bit grid would be 1/255) and the class is identical.
    assert np.abs(got_q - fq).max() < 1 / 255
    assert (got_q.argmax(1) == fq.argmax(1)).all()
    assert np.abs(fq - flt).max() > 0  # it is a quantized model
    ops = collections.Counter(n.op_type for n in onnx.load(str(tmp_path / "opt.onnx")).graph.node)
    assert ops["QLinearConv"] >= 20, ops
    assert INT8_KERNELS & set(ops)
