"""The AMCT workflow on the bundled example model: create_quant_config → init → quantize_model
→ run batch_num batches → record. Each expectation is checked against something computed
independently here: the layer list from the prototxt text, the layers' inputs captured with a
plain forward hook on the fused float model, and the algorithm functions called directly."""
from __future__ import annotations

import os

import numpy as np
import pytest
import torch
from google.protobuf import text_format

from amct_torch import RecordError, create_quant_config, init, quantize_model, save_model
from amct_torch.algorithms import hfmg
from amct_torch.algorithms.ifmr import ifmr_exact
from amct_torch.caffe.graph import layer_modules, load_caffe
from amct_torch.config import layer_infos_from_net
from amct_torch.fusion import fuse_bn
from amct_torch.proto import amct_caffe_pb2 as pb
from amct_torch.record import read_record, validate_record
from amct_torch.workflow.examples import example_data, example_model

BATCH = 30


@pytest.fixture(scope="module")
def example():
    proto, weights = example_model()
    x, _ = example_data("calib")
    return proto, weights, [torch.from_numpy(x[i:i + BATCH]) for i in range(0, len(x), BATCH)]


def quantizable_from_text(proto: str) -> set[str]:
    """Convolution, InnerProduct and AVE non-global Pooling layers, read from the prototxt."""
    net = text_format.Parse(open(proto).read(), pb.NetParameter())
    out = set()
    for l in net.layer:
        if l.type in ("Convolution", "InnerProduct") or l.type == "Pooling" and l.pooling_param.pool == pb.PoolingParameter.AVE \
                and not l.pooling_param.global_pooling:
            out.add(l.name)
    return out


def calibrate(tmp_path, proto, weights, batches, batch_num=2, cfg_text=None, mode="exact",
              extra=0, device="cpu"):
    cfg_json = str(tmp_path / "config.json")
    quant_cfg = None
    if cfg_text is not None:
        quant_cfg = str(tmp_path / "quant.cfg")
        open(quant_cfg, "w").write(f"batch_num: {batch_num}\n" + cfg_text)
    create_quant_config(cfg_json, proto, weights, batch_num=batch_num, config_defination=quant_cfg)
    record = str(tmp_path / "record.txt")
    graph = init(cfg_json, proto, weights, record)
    model = quantize_model(graph, str(tmp_path / "mod.prototxt"), str(tmp_path / "mod.caffemodel"),
                           ifmr_mode=mode).to(device)
    with torch.no_grad():
        for b in batches[:batch_num + extra]:
            model(b.to(device))
    return graph, read_record(record)


def captured_inputs(proto, weights, batches, names, all_args=False):
    """Inputs of ``names`` on the fused float model, captured with plain forward pre-hooks."""
    fused = fuse_bn(load_caffe(proto, weights)).graph
    mods = layer_modules(fused)
    seen = {n: [] for n in names}
    for n in names:
        mods[n].register_forward_pre_hook(
            lambda m, a, n=n: seen[n].extend(t.detach().clone() for t in (a if all_args else a[:1])))
    with torch.no_grad():
        for b in batches:
            fused(b)
    return seen


def test_record_lists_exactly_the_quantizable_layers_with_valid_factors(tmp_path, example):
    proto, weights, batches = example
    graph, rec = calibrate(tmp_path, proto, weights, batches)
    assert set(rec) == quantizable_from_text(proto)
    validate_record(rec, layer_infos_from_net(load_caffe(proto, weights).caffe_net), "record")
    for name in ("fc1", "fc2"):
        assert len(rec[name].scale_w) == 1          # InnerProduct per tensor
    assert len(rec["conv1"].scale_w) == 16          # per channel (num_output 16)
    assert rec["pool2"].scale_w == [1.0] and rec["pool2"].offset_w == [0]
    assert os.path.isfile(tmp_path / "mod.prototxt") and os.path.isfile(tmp_path / "mod.caffemodel")


def test_scale_d_equals_ifmr_on_independently_captured_inputs(tmp_path, example):
    proto, weights, batches = example
    graph, rec = calibrate(tmp_path, proto, weights, batches, batch_num=3)
    names = sorted(rec)
    seen = captured_inputs(proto, weights, batches[:3], names)
    for n in names:
        data = torch.cat([t.reshape(-1) for t in seen[n]])
        ref = ifmr_exact(data)
        assert rec[n].scale_d == pytest.approx(float(np.float32(ref.scale)), rel=1e-6), n
        assert rec[n].offset_d == ref.offset, n
        c, h, w = (list(seen[n][0].shape[1:]) + [1, 1])[:3]
        assert (rec[n].channels, rec[n].height, rec[n].width) == (c, h, w), n


def test_streaming_mode_within_one_candidate_of_exact(tmp_path, example):
    proto, weights, batches = example
    _, rec = calibrate(tmp_path, proto, weights, batches, batch_num=3, mode="streaming")
    seen = captured_inputs(proto, weights, batches[:3], sorted(rec))
    for n in rec:
        data = torch.cat([t.reshape(-1) for t in seen[n]])
        ref = ifmr_exact(data)
        ratios = np.float32(0.7) + np.arange(60, dtype=np.float32) * np.float32(0.01)
        cands = (ratios * np.float32(ref.max_init) - np.float32(ref.min_init)) / np.float32(255)
        near = cands[max(ref.index - 1, 0):ref.index + 2]
        assert np.min(np.abs(near - rec[n].scale_d) / near) < 1e-5, n


def test_weight_factors_are_arq_of_the_fused_weights(tmp_path, example):
    proto, weights, batches = example
    _, rec = calibrate(tmp_path, proto, weights, batches, batch_num=1)
    fused = layer_modules(fuse_bn(load_caffe(proto, weights)).graph)
    for n in ("conv1", "conv3"):
        w = fused[n].weight.detach().reshape(fused[n].weight.shape[0], -1)
        mx, mn = w.max(1).values, w.min(1).values
        ref = torch.where(mx > -mn, mx / 127, -mn / 128)
        np.testing.assert_allclose(rec[n].scale_w, ref.numpy(), rtol=1e-6)
    w = fused["fc1"].weight.detach()
    ref = float(w.max() / 127 if w.max() > -w.min() else -w.min() / 128)
    assert rec["fc1"].scale_w[0] == pytest.approx(ref, rel=1e-6)


def test_forwards_after_batch_num_change_nothing(tmp_path, example):
    proto, weights, batches = example
    graph, rec = calibrate(tmp_path, proto, weights, batches, batch_num=2)
    before = open(graph.record_file).read()
    mtime = os.stat(graph.record_file).st_mtime_ns
    with torch.no_grad():
        for b in batches[2:]:
            graph.fused(b)
    assert open(graph.record_file).read() == before
    assert os.stat(graph.record_file).st_mtime_ns == mtime
    # and the record equals one made with exactly batch_num batches
    other = tmp_path / "other"
    other.mkdir()
    _, rec2 = calibrate(other, proto, weights, batches, batch_num=2, extra=0)
    assert rec == rec2


def test_extra_forwards_within_one_run_do_not_feed_observers(tmp_path, example):
    proto, weights, batches = example
    _, rec_more = calibrate(tmp_path, proto, weights, batches, batch_num=1, extra=3)
    seen = captured_inputs(proto, weights, batches[:1], ["conv1"])
    ref = ifmr_exact(seen["conv1"][0])
    assert rec_more["conv1"].scale_d == pytest.approx(ref.scale, rel=1e-6)


def test_skip_layers_and_skip_types(tmp_path, example):
    proto, weights, batches = example
    _, rec = calibrate(tmp_path, proto, weights, batches, batch_num=1,
                       cfg_text='skip_layers: "conv2"\nskip_layer_types: "InnerProduct"\n')
    assert set(rec) == quantizable_from_text(proto) - {"conv2", "fc1", "fc2"}


def test_hfmg_override_and_symmetric_type_override(tmp_path, example):
    proto, weights, batches = example
    cfg = ('override_layer_configs { layer_name: "conv2" calibration_config { '
           'arq_quantize { channel_wise: true } hfmg_quantize { num_of_bins: 1024 } } }\n'
           'override_layer_types { layer_type: "InnerProduct" calibration_config { '
           'arq_quantize { channel_wise: false } ifmr_quantize { asymmetric: false } } }\n')
    _, rec = calibrate(tmp_path, proto, weights, batches, batch_num=1, cfg_text=cfg)
    seen = captured_inputs(proto, weights, batches[:1], ["conv2", "fc1", "conv3"])
    x = seen["conv2"][0].reshape(-1)
    mn, mx = float(x.min()), float(x.max())
    ref = hfmg.hfmg_factors(hfmg.histogram(x, mn, mx, 1024), mn, mx, True)
    assert rec["conv2"].scale_d == pytest.approx(ref.scale, rel=1e-6)
    assert rec["conv2"].offset_d == ref.offset
    sym = ifmr_exact(seen["fc1"][0], asymmetric=False)
    assert rec["fc1"].offset_d == 0 and rec["fc1"].scale_d == pytest.approx(sym.scale, rel=1e-6)
    # conv3 keeps the default (asymmetric IFMR)
    assert rec["conv3"].scale_d == pytest.approx(ifmr_exact(seen["conv3"][0]).scale, rel=1e-6)


def test_activation_offset_false_gives_symmetric_factors(tmp_path, example):
    proto, weights, batches = example
    _, rec = calibrate(tmp_path, proto, weights, batches, batch_num=1,
                       cfg_text="activation_offset: false\n")
    assert all(r.offset_d == 0 for r in rec.values())


def test_joint_quant_records_the_eltwise_with_one_factor_over_all_inputs(tmp_path, example):
    proto, weights, batches = example
    graph, rec = calibrate(tmp_path, proto, weights, batches, batch_num=2, cfg_text="joint_quant: true\n")
    assert "res_add" in rec
    r = rec["res_add"]
    assert r.scale_w == [] and r.offset_w == [] and r.channels is None
    seen = captured_inputs(proto, weights, batches[:2], ["res_add"], all_args=True)
    ref = ifmr_exact(torch.cat([t.reshape(-1) for t in seen["res_add"]]))
    assert r.scale_d == pytest.approx(ref.scale, rel=1e-6) and r.offset_d == ref.offset
    # without joint_quant there is no Eltwise entry
    plain = tmp_path / "plain"
    plain.mkdir()
    _, rec2 = calibrate(plain, proto, weights, batches, batch_num=1)
    assert "res_add" not in rec2


def test_save_model_refuses_missing_factors_and_writes_nothing(tmp_path, example):
    proto, weights, batches = example
    cfg_json = str(tmp_path / "c.json")
    create_quant_config(cfg_json, proto, weights, batch_num=3)
    graph = init(cfg_json, proto, weights, str(tmp_path / "record.txt"))
    model = quantize_model(graph, str(tmp_path / "m.prototxt"), str(tmp_path / "m.caffemodel"))
    with torch.no_grad():
        model(batches[0])  # 1 of 3 batches
    out = tmp_path / "out"
    out.mkdir()
    with pytest.raises(RecordError) as err:
        save_model(graph, "Both", str(out / "model"))
    assert "record.txt" in str(err.value) and err.value.layer is not None
    assert os.listdir(out) == []


def test_calibration_runs_on_the_device_the_user_moves_the_model_to(tmp_path, example, device):
    proto, weights, batches = example
    _, rec = calibrate(tmp_path, proto, weights, batches, batch_num=1, device=device)
    seen = captured_inputs(proto, weights, batches[:1], ["conv2"])
    assert rec["conv2"].scale_d == pytest.approx(ifmr_exact(seen["conv2"][0]).scale, rel=1e-5)
