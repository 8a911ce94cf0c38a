"""``quantize(improve=...)`` end to end on the bundled example model (a trained LeNet on
digits): the list/"all" forms, ``_float.onnx`` always the float model (ONNX Runtime against
the float model loaded afresh), the QDQ model the improved one, and ``--improve all`` at least
as close to the float model as the default on the held-out test digits."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import amct_torch
from amct_torch import AmctError
from amct_torch.caffe import load_caffe
from amct_torch.workflow.examples import example_data, example_model

ort = pytest.importorskip("onnxruntime")


def float_logits(x: np.ndarray) -> np.ndarray:
    """The float model, loaded afresh from the files, cut before its Softmax: fc2's output."""
    gm = load_caffe(*example_model())
    out = {}
    from amct_torch.caffe.graph import layer_modules
    h = layer_modules(gm)["fc2"].register_forward_hook(lambda _m, _a, y: out.setdefault("fc2", y))
    with torch.no_grad():
        gm(torch.from_numpy(x))
    h.remove()
    return out["fc2"].numpy()


def quant_logits(result, x: np.ndarray) -> np.ndarray:
    from amct_torch.caffe.graph import layer_modules
    out = {}
    h = layer_modules(result.quant_model)["fc2"].register_forward_hook(lambda _m, _a, y: out.setdefault("fc2", y))
    with torch.no_grad():
        result.quant_model(torch.from_numpy(x).to(result.device))
    h.remove()
    return out["fc2"].cpu().numpy()


def sqnr(ref: np.ndarray, q: np.ndarray) -> float:
    ref, q = ref.astype(np.float64), q.astype(np.float64)
    return 10 * math.log10((ref ** 2).sum() / ((q - ref) ** 2).sum())


def run_onnx(path: str, x: np.ndarray) -> np.ndarray:
    sess = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    return sess.run(None, {sess.get_inputs()[0].name: x})[0]


@pytest.mark.parametrize("improve", ["bias_correction", "all", ["cle", "output_ranges"]])
def test_float_onnx_is_the_float_model(tmp_path, improve):
    calib, _ = example_data("calib")
    test, _ = example_data("test")
    test = test[:64]
    res = amct_torch.quantize(*example_model(), calib, output=str(tmp_path / "m"), batch_num=3,
                              onnx=True, device="cpu", quiet=True, improve=improve, report=False)
    assert res.improvement is not None and res.improvement["stages"][0]["name"] == "default"
    want = load_caffe(*example_model())
    with torch.no_grad():
        (ref,) = want(torch.from_numpy(test)).values()
    got = run_onnx(res.files["onnx_float"], test)
    np.testing.assert_allclose(got, ref.numpy(), rtol=1e-4, atol=1e-6)
    # the QDQ model is the improved model the job returns, not the float one
    with torch.no_grad():
        (q,) = res.quant_model(torch.from_numpy(test)).values()
    qdq = run_onnx(res.files["onnx"], test)
    assert np.abs(qdq - q.numpy()).max() < 0.02
    assert np.abs(qdq - ref.numpy()).max() > 0


def test_improve_all_not_worse_than_default_on_held_out(tmp_path):
    calib, _ = example_data("calib")
    test, _ = example_data("test")
    base = amct_torch.quantize(*example_model(), calib, output=str(tmp_path / "d"), batch_num=3,
                               device="cpu", quiet=True, report=False, save_type=None)
    best = amct_torch.quantize(*example_model(), calib, output=str(tmp_path / "a"), batch_num=3,
                               device="cpu", quiet=True, report=False, save_type=None, improve="all")
    ref = float_logits(test)
    d, a = sqnr(ref, quant_logits(base, test)), sqnr(ref, quant_logits(best, test))
    assert a >= d, (a, d, best.improvement)
    assert best.improvement["kept"] != "default"  # on this model the improvements are kept


def test_improve_names_and_errors(tmp_path):
    from amct_torch.improve.names import IMPROVEMENTS, improvement_list
    assert improvement_list("all") == IMPROVEMENTS
    assert improvement_list("bias_correction, cle") == ("cle", "bias_correction")  # fixed order
    assert improvement_list(["output_ranges"]) == ("output_ranges",)
    assert improvement_list(None) == () and improvement_list("") == ()
    calib, _ = example_data("calib")
    with pytest.raises(AmctError, match="unknown improvement 'nope'"):
        amct_torch.quantize(*example_model(), calib, output=str(tmp_path / "x"), improve="cle,nope")
