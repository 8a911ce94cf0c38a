"""The output models written layer by layer (streamed caffemodels, weights quantized a block of
rows at a time) are byte for byte the models written from whole in-memory nets.

Reference: the eager path that still builds the whole net (``fake_quant_net`` /
``deploy_net`` with every blob attached, serialised by protobuf's ``SerializeToString``
through ``caffemodel_bytes``), and the whole-tensor quantization formula."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from amct_torch.algorithms.quant import channel_view, quantize
from amct_torch.caffe.graph import load_caffe
from amct_torch.caffe.netio import caffemodel_bytes
from amct_torch.export import deploy_net, fake_quant_net, save_quant_models
from amct_torch.export import layer_quant as lqmod
from amct_torch.export.caffe.text import prototxt_text
from helpers.caffe_nets import make_net
from helpers.exports import minmax_records, small_body
from helpers.runtimes import ort_run

#: the export tests' small net with wider layers (fc1: 300×2048 weights), then a Softmax
BODY = small_body(conv1=64, conv2=128, fc1=300) + \
    'layer { name: "prob" type: "Softmax" bottom: "fc1" top: "prob" }\n'


@pytest.fixture(scope="module")
def net(tmp_path_factory):
    folder = tmp_path_factory.mktemp("big")
    rng = np.random.default_rng(0)
    f = lambda *s: rng.standard_normal(s).astype(np.float32)
    blobs = {"conv1": [f(64, 3, 3, 3), f(64)], "conv2": [f(128, 64, 1, 1), f(128)],
             "conv3": [f(128, 64, 1, 1)], "fc1": [f(300, 2048) * 0.05, f(300)]}
    proto, model = make_net(folder, BODY, {"data": [2, 3, 8, 8]}, blobs)
    gm = load_caffe(proto, model)
    x = torch.from_numpy(rng.standard_normal((2, 3, 8, 8)).astype(np.float32))
    return folder, gm, minmax_records(gm, x)


def _whole(gm, recs) -> dict[str, bytes]:
    out = {}
    for kind, build in (("fake_quant", fake_quant_net), ("deploy", deploy_net)):
        emitted = build(gm, recs).attach_blobs()
        out[f"{kind}_model.prototxt"] = prototxt_text(emitted.net).encode()
        out[f"{kind}_weights.caffemodel"] = caffemodel_bytes(emitted.net)
    return out


def _streamed(gm, recs, prefix) -> dict[str, bytes]:
    save_quant_models(gm, recs, save_type="Both", save_path=str(prefix))
    return {k: open(f"{prefix}_{k}", "rb").read() for k in
            ("fake_quant_model.prototxt", "fake_quant_weights.caffemodel",
             "deploy_model.prototxt", "deploy_weights.caffemodel")}


def test_streamed_models_equal_the_whole_net_serialisation(net, tmp_path):
    _, gm, recs = net
    want = _whole(gm, recs)
    got = _streamed(gm, recs, tmp_path / "s")
    assert got.keys() == want.keys()
    for k in want:
        assert got[k] == want[k], k
    assert len(want["fake_quant_weights.caffemodel"]) > 4 * 300 * 2048  # fc1 took the direct path


def test_row_blocks_give_the_same_files(net, tmp_path, monkeypatch):
    """Quantizing in blocks of 1000 elements (every weighted layer split, a block not a whole
    number of rows of fc1) writes the same bytes as whole tensors."""
    _, gm, recs = net
    whole = _streamed(gm, recs, tmp_path / "w")
    monkeypatch.setattr(lqmod, "CHUNK_ELEMENTS", 1000)
    assert _streamed(gm, recs, tmp_path / "b") == whole


@pytest.mark.parametrize("kind,shape,groups,per_channel", [
    ("Convolution", (70, 3, 3, 3), 1, True),
    ("InnerProduct", (33, 100), 1, False),
    ("Deconvolution", (12, 5, 3, 3), 3, True),  # channel view along axis 1 and the groups
])
def test_quantize_rows_is_the_whole_tensor_formula(kind, shape, groups, per_channel, monkeypatch):
    rng = np.random.default_rng(3)
    w = torch.from_numpy(rng.standard_normal(shape).astype(np.float32))
    c_out = shape[1] * groups if kind == "Deconvolution" else shape[0]
    sw = torch.from_numpy(rng.uniform(0.005, 0.02, c_out if per_channel else 1).astype(np.float32))
    s = channel_view(sw, shape, kind, groups)
    q = quantize(w, s)
    monkeypatch.setattr(lqmod, "CHUNK_ELEMENTS", 50)
    q8, fake = lqmod.quantize_rows(w, s)
    np.testing.assert_array_equal(q8, q.numpy())
    assert fake.tobytes() == (q.float() * s).numpy().astype(np.float32).tobytes()


def test_streamed_onnx_models_equal_the_whole_serialisation(net, tmp_path):
    """``export_onnx`` writes each model from its arrays; the file is byte for byte the model
    built with every initializer from ``from_array`` and serialised by protobuf (so the
    outputs are those of the whole build), passes onnx's full check, and ONNX Runtime runs it."""
    import onnx
    from onnx import numpy_helper

    from amct_torch.export.onnx import qdq

    _, gm, recs = net
    fpath, qpath = qdq.export_onnx(gm, recs, str(tmp_path / "m"))
    plan = lqmod.plan_layers(gm, recs)
    pr = qdq.probe(gm)
    for path, p, kind in ((fpath, {}, "float"), (qpath, plan, "quant")):
        model, b = qdq._build(gm, p, "uint8", None, kind, probed=pr, stream=True)
        assert b.streamed  # some initializers took the streamed path
        for t in model.graph.initializer:
            if t.name in b.streamed:
                t.CopyFrom(numpy_helper.from_array(b.streamed[t.name], t.name))
        whole, _ = qdq._build(gm, p, "uint8", None, kind, probed=pr)
        got = open(path, "rb").read()
        assert got == model.SerializeToString() == whole.SerializeToString()
        onnx.checker.check_model(onnx.load_from_string(got), full_check=True)
    x = np.random.default_rng(5).standard_normal((2, 3, 8, 8)).astype(np.float32)
    for path in (fpath, qpath):
        assert np.isfinite(ort_run(path, x)["prob"]).all()


def test_fake_quant_graph_built_layer_by_layer_equals_the_whole_net_build(net):
    """The torch fake-quant model built from blobs made layer by layer has the weights of the
    one built from the whole emitted net (equal weights: equal outputs), and runs."""
    from amct_torch.export import fake_quant_graph
    from amct_torch.export.caffe.fakequant import graph_from_net

    _, gm, recs = net
    got = fake_quant_graph(gm, recs)
    emitted = fake_quant_net(gm, recs)
    want = graph_from_net(emitted.net, gm.caffe_inputs, emitted.arrays)
    a, b = got.state_dict(), want.state_dict()
    assert a.keys() == b.keys() and len(a) == 7  # 4 weights, 3 biases
    for k in a:
        assert torch.equal(a[k], b[k]), k
    x = torch.from_numpy(np.random.default_rng(9).standard_normal((2, 3, 8, 8)).astype(np.float32))
    with torch.no_grad():
        y = got(x)
    assert set(y) == {"prob"} and torch.isfinite(y["prob"]).all()


def test_fake_quant_graph_shares_no_storage_with_the_source_graph(net):
    """The fake-quant model takes its fresh fake-quant weights as they are, but every tensor
    it shares values with the source graph (biases, unquantized layers) is its own copy."""
    from amct_torch.export import fake_quant_graph

    _, gm, recs = net
    before = {k: v.clone() for k, v in gm.state_dict().items()}
    fq = fake_quant_graph(gm, recs)
    src = {t.untyped_storage().data_ptr() for t in gm.state_dict().values()}
    assert all(t.untyped_storage().data_ptr() not in src for t in fq.state_dict().values())
    with torch.no_grad():
        for t in fq.state_dict().values():
            if t.is_floating_point():
                t.add_(1.0)
    for k, v in gm.state_dict().items():
        assert torch.equal(v, before[k]), k
