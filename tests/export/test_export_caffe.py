"""Fake-quant and deploy Caffe models: OpenCV (a real Caffe consumer, Quant/DeQuant as custom
Python layers) runs our fake-quant files like our torch fake-quant model; the deploy files
decode back to the record and an integer-only simulation written here matches."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from amct_torch.caffe.graph import layer_modules, load_caffe
from amct_torch.caffe.netio import parse_caffemodel
from amct_torch.errors import ExportError
from amct_torch.export import fake_quant_graph, save_quant_models, unpack_deq_scale
from amct_torch.fusion import fuse_bn
from amct_torch.record import LayerRecord
from helpers.caffe_nets import make_net, run_cv
from helpers.data import natural_images_bgr
from helpers.exports import SMALL_BODY, minmax_records, register_cv_layers, small_blobs


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    folder = tmp_path_factory.mktemp("small")
    proto, model = make_net(folder, SMALL_BODY, {"data": [2, 3, 8, 8]}, small_blobs(np.random.default_rng(0)))
    gm = load_caffe(proto, model)
    x = torch.from_numpy(np.random.default_rng(1).standard_normal((2, 3, 8, 8)).astype(np.float32))
    recs = minmax_records(gm, x)
    return folder, gm, recs, x


def _cv_run(prefix, x, out):
    register_cv_layers()
    return run_cv(f"{prefix}_fake_quant_model.prototxt", f"{prefix}_fake_quant_weights.caffemodel",
                  {"data": x}, [out])[out]


def test_small_fake_quant_in_opencv_matches_torch(small):
    folder, gm, recs, x = small
    prefix = str(folder / "s")
    save_quant_models(gm, recs, save_type="Both", save_path=prefix)
    fq = fake_quant_graph(gm, recs)
    with torch.no_grad():
        ours = fq(x)["fc1"].numpy()
    got = _cv_run(prefix, x.numpy(), "fc1")
    # OpenCV's Quant computes with the file's float32(1/scale_d) (multiply), ours with the exact
    # scale_d (divide): a value on a rounding boundary may move by one input step of a layer;
    # through fc1 (|w| ~0.2·N(0,1), 64 inputs) that is far below one output step scale_d(fc1).
    step = recs["fc1"].scale_d
    assert np.abs(got.reshape(ours.shape) - ours).max() <= 2 * step
    # and the fake-quant really quantizes: it differs from the float model
    with torch.no_grad():
        flt = gm(x)["fc1"].numpy()
    assert np.abs(flt - ours).max() > 1e-4
    text = open(f"{prefix}_fake_quant_model.prototxt").read()
    assert "offset: " in text and 'offset: "' not in text  # the OpenCV-readable uint8 form
    # conv2 and conv3 read the same blob with the same factors: one shared Quant
    info = json.load(open(f"{prefix}_quant.json"))
    shared = [q for q in info["quant_layers"] if q["quantized_layers"] == ["conv2", "conv3"]]
    assert len(shared) == 1 or recs["conv2"].scale_d != recs["conv3"].scale_d


def test_nsfw_fake_quant_in_opencv_matches_torch(tmp_path, nsfw_model):
    gm = fuse_bn(load_caffe(*nsfw_model)).graph
    x = torch.from_numpy(natural_images_bgr(count=2))
    recs = minmax_records(gm, x)
    prefix = str(tmp_path / "n")
    save_quant_models(gm, recs, save_type="Fakequant", save_path=prefix)
    with torch.no_grad():
        ours = fake_quant_graph(gm, recs)(x)["prob"].numpy()
    got = _cv_run(prefix, x.numpy(), "prob").reshape(ours.shape)
    # 53 conv layers: a boundary flip (1/scale_d vs scale_d) moves an activation by one step;
    # the probabilities then agree to a few 1e-3 and the class is the same.
    assert np.abs(got - ours).max() < 5e-3
    assert (got.argmax(1) == ours.argmax(1)).all()


def test_deploy_decodes_to_record_and_integer_simulation_matches(small):
    folder, gm, recs, x = small
    prefix = str(folder / "d")
    save_quant_models(gm, recs, save_type="Both", save_path=prefix)
    net = parse_caffemodel(f"{prefix}_deploy_weights.caffemodel")
    layers = {l.name: l for l in net.layer}
    mods = layer_modules(gm)
    for name in ("conv1", "conv2", "conv3", "fc1"):
        r, m = recs[name], mods[name]
        w = m.weight.detach().numpy()
        sw = np.asarray(r.scale_w, np.float32).reshape([-1] + [1] * (w.ndim - 1))
        want = np.clip(np.round(w / sw), -128, 127).astype(np.int8)  # ARQ grid, written here
        blob = layers[name].blobs[0]
        got = np.frombuffer(blob.int8_data, np.int8).reshape(list(blob.shape.dim))
        np.testing.assert_array_equal(got, want)
        c = w.shape[0]
        deq, shift, off = unpack_deq_scale(np.asarray(layers[f"{name}_dequant_layer"].blobs[0].uint64_data, np.uint64))
        sw_c = np.broadcast_to(np.asarray(r.scale_w, np.float32), (c,))
        np.testing.assert_array_equal(deq, np.float32(r.scale_d) * sw_c)
        assert (shift == 0).all() and (off == 0).all()
        if m.bias is not None:
            b = m.bias.detach().numpy().astype(np.float64)
            want_b = np.rint(b / (np.float64(np.float32(r.scale_d)) * sw_c.astype(np.float64)))
            np.testing.assert_array_equal(np.asarray(layers[name].blobs[1].int32_data), want_b)
        else:
            assert len(layers[name].blobs) == 1

    # integer-only simulation of conv1: int8 inputs x int8 weights -> int32 acc -> deq_scale
    r = recs["conv1"]
    q = np.clip(np.round(x.numpy() / np.float32(r.scale_d)) + r.offset_d, -128, 127).astype(np.int64)
    w8 = np.frombuffer(layers["conv1"].blobs[0].int8_data, np.int8).reshape(3, 3, 3, 3).astype(np.int64)
    b32 = np.asarray(layers["conv1"].blobs[1].int32_data, np.int64)
    xi = np.pad(q - r.offset_d, ((0, 0), (0, 0), (1, 1), (1, 1)))
    acc = np.zeros((2, 3, 8, 8), np.int64)
    for i in range(3):
        for j in range(3):
            acc += np.einsum("nchw,oc->nohw", xi[:, :, i:i + 8, j:j + 8], w8[:, :, i, j])
    acc += b32.reshape(1, 3, 1, 1)
    assert np.abs(acc).max() < 2 ** 31
    deq = np.float32(r.scale_d) * np.asarray(r.scale_w, np.float32)
    y_int = acc * deq.reshape(1, 3, 1, 1)
    fq = fake_quant_graph(gm, recs)
    seen = {}
    fq.get_submodule("conv1").register_forward_hook(lambda m, i, o: seen.setdefault("y", o))
    with torch.no_grad():
        fq(x)
    # differs only by the bias rounding (half an accumulator step) and float summation order
    assert np.abs(y_int - seen["y"].numpy()).max() <= deq.max()


def test_int32_bias_overflow_names_layer(small, tmp_path):
    folder, gm, recs, x = small
    bad = dict(recs)
    r = recs["conv1"]
    bad["conv1"] = LayerRecord(1e-9, r.offset_d, [1e-9] * 3, [0] * 3)
    with pytest.raises(ExportError, match="skip_layers") as err:
        save_quant_models(gm, bad, save_type="Both", save_path=str(tmp_path / "o"))
    assert err.value.layer == "conv1"
    assert not list(tmp_path.iterdir())  # nothing half-written


def test_written_fake_quant_model_loads_back_in_torch(small):
    """``load_caffe`` reads the fake-quant files we write (Quant offset in the OpenCV-readable
    uint8 number form) and computes what the in-memory fake-quant model computes."""
    folder, gm, recs, x = small
    prefix = str(folder / "back")
    save_quant_models(gm, recs, save_type="Fakequant", save_path=prefix)
    loaded = load_caffe(f"{prefix}_fake_quant_model.prototxt", f"{prefix}_fake_quant_weights.caffemodel")
    offsets = {m.caffe_name: m.offset for m in loaded.modules() if getattr(m, "caffe_type", "") == "Quant"}
    assert offsets and any(o < 0 for o in offsets.values())  # negative offsets survive the uint8 form
    with torch.no_grad():
        ours = fake_quant_graph(gm, recs)(x)["fc1"].numpy()
        back = loaded(x)["fc1"].numpy()
    # the file keeps float32(1/scale_d): the same rounding-boundary tolerance as OpenCV above
    assert np.abs(back - ours).max() <= 2 * recs["fc1"].scale_d
