"""A calibration checkpoint resumes only the run it belongs to: other weights (same layers),
other calibration settings, a batch count out of range, malformed shapes or unknown keys are a
CalibrationError naming the checkpoint file (never a silent wrong result or a traceback)."""
from __future__ import annotations

import os

import pytest
import torch

import amct_torch
from amct_torch.errors import CalibrationError
from amct_torch.workflow.examples import example_data, example_model


def _session(tmp, weights=None, batch_num=4):
    model, default_weights = example_model()
    weights = weights or default_weights
    cfg = os.path.join(tmp, "c.json")
    amct_torch.create_quant_config(cfg, model, weights, batch_num=batch_num)
    graph = amct_torch.init(cfg, model, weights, os.path.join(tmp, "r.txt"))
    m = amct_torch.quantize_model(graph, os.path.join(tmp, "m.prototxt"), os.path.join(tmp, "m.caffemodel"))
    return graph.session, m


def _saved(tmp_path, batches=1):
    from amct_torch.calibration.checkpoint import save_checkpoint
    (tmp_path / "a").mkdir()
    s, m = _session(str(tmp_path / "a"))
    x, _ = example_data("calib")
    with torch.no_grad():
        for i in range(batches):
            m(torch.from_numpy(x[i * 8:(i + 1) * 8]))
    path = str(tmp_path / "job.ckpt")
    save_checkpoint(s, path)
    return path


def _other_weights(tmp_path) -> str:
    """The example caffemodel with conv1's weights doubled (same layers, other values)."""
    from amct_torch.proto import amct_caffe_pb2 as pb
    _, weights = example_model()
    net = pb.NetParameter()
    net.ParseFromString(open(weights, "rb").read())
    layer = next(l for l in list(net.layer) + list(net.layers) if l.name == "conv1")
    vals = [2 * v for v in layer.blobs[0].data]
    layer.blobs[0].ClearField("data")
    layer.blobs[0].data.extend(vals)
    path = str(tmp_path / "other.caffemodel")
    with open(path, "wb") as f:
        f.write(net.SerializeToString())
    return path


def test_checkpoint_of_other_weights_is_refused(tmp_path):
    from amct_torch.calibration.checkpoint import load_checkpoint
    path = _saved(tmp_path)
    (tmp_path / "b").mkdir()
    s2, _ = _session(str(tmp_path / "b"), weights=_other_weights(tmp_path))
    with pytest.raises(CalibrationError, match="weights") as err:
        load_checkpoint(s2, path)
    assert err.value.file == path


def _edited(path, tmp_path, edit) -> str:
    state = torch.load(path, weights_only=True)
    edit(state)
    out = str(tmp_path / "edited.ckpt")
    torch.save(state, out)
    return out


@pytest.mark.parametrize("name,edit", [
    ("batches_seen_1e12", lambda s: s.__setitem__("batches_seen", torch.tensor(10 ** 12))),
    ("batches_seen_negative", lambda s: s.__setitem__("batches_seen", torch.tensor(-3))),
    ("batches_seen_float", lambda s: s.__setitem__("batches_seen", torch.tensor(1.5))),
    ("batches_seen_vector", lambda s: s.__setitem__("batches_seen", torch.tensor([1, 2]))),
    ("shapes_wrong_rows", lambda s: s.__setitem__("shapes", torch.zeros(1, 3, dtype=torch.int64))),
    ("shapes_negative", lambda s: s.__setitem__("shapes", -5 * torch.ones_like(s["shapes"]))),
    ("key_not_a_group", lambda s: s.__setitem__("gX/top", torch.zeros(3))),
    ("key_group_out_of_range", lambda s: s.__setitem__("g999/top", torch.zeros(3))),
    ("key_unknown", lambda s: s.__setitem__("surprise", torch.zeros(1))),
    ("state_wrong_length", lambda s: s.__setitem__("g0/top", torch.cat([s["g0/top"], s["g0/top"][:1]]))),
    ("state_missing", lambda s: s.pop("g1/top")),
])
def test_malformed_checkpoint_is_refused(tmp_path, name, edit):
    from amct_torch.calibration.checkpoint import load_checkpoint
    bad = _edited(_saved(tmp_path), tmp_path, edit)
    (tmp_path / "b").mkdir()
    s2, _ = _session(str(tmp_path / "b"))
    with pytest.raises(CalibrationError) as err:
        load_checkpoint(s2, bad)
    assert err.value.file == bad


def test_quantize_refuses_a_checkpoint_of_other_settings(tmp_path):
    """A run with batch_num 4 stopped after 2 batches leaves its checkpoint; a run with
    batch_num 5 on the same model and data does not resume from it."""
    model, weights = example_model()
    x, _ = example_data("calib")
    ckpt = str(tmp_path / "job.ckpt")

    def stops_after_two():
        for i in range(2):
            yield torch.from_numpy(x[i * 8:(i + 1) * 8])
        raise RuntimeError("the job is pre-empted")

    with pytest.raises(RuntimeError, match="pre-empted"):
        amct_torch.quantize(model, weights, stops_after_two(), output=str(tmp_path / "a" / "m"),
                            batch_num=4, device="cpu", quiet=True, report=False, checkpoint=ckpt)
    assert os.path.exists(ckpt)
    batches = [torch.from_numpy(x[i * 8:(i + 1) * 8]) for i in range(5)]
    with pytest.raises(CalibrationError, match="settings") as err:
        amct_torch.quantize(model, weights, batches, output=str(tmp_path / "b" / "m"),
                            batch_num=5, device="cpu", quiet=True, report=False, checkpoint=ckpt)
    assert err.value.file == ckpt
    # the same settings resume it and give the uninterrupted result
    res = amct_torch.quantize(model, weights, batches[:4], output=str(tmp_path / "c" / "m"),
                              batch_num=4, device="cpu", quiet=True, report=False, checkpoint=ckpt)
    ref = amct_torch.quantize(model, weights, batches[:4], output=str(tmp_path / "d" / "m"),
                              batch_num=4, device="cpu", quiet=True, report=False)
    assert {k: (r.scale_d, r.offset_d) for k, r in res.records.items()} == \
        {k: (r.scale_d, r.offset_d) for k, r in ref.records.items()}
