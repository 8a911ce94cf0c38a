"""The float ONNX model written during calibration: the same file as written after it, put in
place only with the quant model, and never left behind."""
from __future__ import annotations

import os

import numpy as np
import pytest
import torch

from amct_torch.caffe.graph import load_caffe
from amct_torch.errors import ExportError
from amct_torch.export.onnx.float_ahead import FloatAhead
from amct_torch.export.onnx.qdq import export_onnx
from amct_torch.fusion import fuse_bn
from helpers.caffe_nets import make_net
from helpers.exports import minmax_records, small_blobs, small_body
from helpers.runtimes import ort_run


def _graph(tmp_path):
    proto, model = make_net(tmp_path, small_body(), {"data": (1, 3, 8, 8)}, small_blobs(np.random.default_rng(0)))
    gm = fuse_bn(load_caffe(proto, model), do_fusion=True).graph
    x = torch.randn(4, 3, 8, 8, generator=torch.Generator().manual_seed(1))
    return gm, minmax_records(gm, x), x


def _hidden(folder) -> list[str]:
    return sorted(n for n in os.listdir(folder) if n.startswith("."))


def test_written_ahead_equals_written_after(tmp_path):
    gm, records, x = _graph(tmp_path)
    (tmp_path / "after").mkdir()
    (tmp_path / "ahead").mkdir()
    after = export_onnx(gm, records, str(tmp_path / "after" / "m"))
    ahead = FloatAhead(gm, str(tmp_path / "ahead" / "m"))
    staged = ahead.wait()
    assert not os.path.exists(staged[1])  # not in place before the quant model is
    got = export_onnx(gm, records, str(tmp_path / "ahead" / "m"), float_staged=staged)
    ahead.discard()  # handed on: nothing to remove
    for a, b in zip(after, got):
        with open(a, "rb") as fa, open(b, "rb") as fb:
            assert fa.read() == fb.read()
    assert _hidden(tmp_path / "ahead") == []
    (y,) = ort_run(got[0], {"data": x.numpy()}).values()
    ref = next(iter(gm(x).values())).detach().numpy()
    np.testing.assert_allclose(y, ref, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("started", [False, True])
def test_discarded_leaves_no_file(tmp_path, started):
    gm, _, _ = _graph(tmp_path)
    ahead = FloatAhead(gm, str(tmp_path / "m"))
    if started:
        ahead.start()
    ahead.discard()
    assert sorted(os.listdir(tmp_path)) == ["net.caffemodel", "net.prototxt"]


def test_quant_model_refused_removes_the_float_file_too(tmp_path, monkeypatch):
    gm, records, _ = _graph(tmp_path)
    ahead = FloatAhead(gm, str(tmp_path / "m"))
    staged = ahead.wait()
    import amct_torch.export.onnx.qdq as qdq

    def refuse(*a, **k):
        raise ExportError("refused", layer="conv1")
    monkeypatch.setattr(qdq, "check_runtime", refuse)
    with pytest.raises(ExportError):
        export_onnx(gm, records, str(tmp_path / "m"), float_staged=staged)
    assert _hidden(tmp_path) == [] and not os.path.exists(staged[1])


def test_a_write_error_comes_back_on_wait(tmp_path):
    gm, _, _ = _graph(tmp_path)
    ahead = FloatAhead(gm, str(tmp_path / "gone" / "m"))  # no such folder
    with pytest.raises(OSError):
        ahead.wait()
    ahead.discard()


def test_float_staged_for_another_path_is_refused(tmp_path):
    gm, records, _ = _graph(tmp_path)
    ahead = FloatAhead(gm, str(tmp_path / "a"))
    staged = ahead.wait()
    with pytest.raises(ValueError):
        export_onnx(gm, records, str(tmp_path / "b"), float_staged=staged)
    assert not os.path.exists(staged[0])  # handed on: removed with the refusal
    staged = FloatAhead(gm, str(tmp_path / "a")).wait()
    with pytest.raises(ValueError):
        export_onnx(gm, records, str(tmp_path / "a"), float_staged=staged, target="openvino")
    assert _hidden(tmp_path) == []
