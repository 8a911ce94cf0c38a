"""A written ONNX model file is checked through its view (``validate.file_view``): the file's own
bytes with each large initializer's ``raw_data`` referenced as external data of that same file.

References: the file itself, read back by onnx (``onnx.load``, and onnx's own external-data
loader to put the referenced bytes back), ``onnx.checker`` and ONNX Runtime given the file
whole. The view must be the file (same bytes once the references are resolved), and the checks
must refuse what they refuse on the file, naming the user's file and layer, leaving nothing
behind."""
from __future__ import annotations

import os

import numpy as np
import onnx
import pytest
from onnx import TensorProto, external_data_helper, helper, numpy_helper

from amct_torch.errors import ExportError
from amct_torch.export.onnx.validate import VIEW_BYTES, check_runtime, check_structure, file_view
from helpers.runtimes import ort_run, ort_session


def _conv_model(weight: np.ndarray, bias: np.ndarray, op: str = "Conv") -> onnx.ModelProto:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", int(weight.shape[1]), 8, 8])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", int(weight.shape[0]), 8, 8])
    inits = [numpy_helper.from_array(weight, "conv_w"), numpy_helper.from_array(bias, "conv_b"),
             numpy_helper.from_array(np.arange(4, dtype=np.int64) + 1, "small")]
    node = helper.make_node(op, ["x", "conv_w", "conv_b"], ["c"], name="conv", pads=[1, 1, 1, 1])
    relu = helper.make_node("Relu", ["c"], ["y"], name="relu")
    model = helper.make_model(helper.make_graph([node, relu], "g", [x], [y], inits),
                              opset_imports=[helper.make_opsetid("", 17)], producer_name="test")
    model.ir_version = 8
    return model


def _write(model: onnx.ModelProto, path) -> str:
    with open(path, "wb") as f:
        f.write(model.SerializeToString())
    return str(path)


def _weights(seed: int = 0, c_out: int = 64, c_in: int = 32) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((c_out, c_in, 3, 3)).astype(np.float32),
            rng.standard_normal(c_out).astype(np.float32))


def test_view_resolved_is_the_file_byte_for_byte(tmp_path):
    """onnx's external-data loader, given the view, puts back exactly the file's bytes; only the
    large initializer is referenced, the small ones stay in the view as they are."""
    w, b = _weights()
    path = _write(_conv_model(w, b), tmp_path / "m.onnx")
    data = file_view(path)
    assert data is not None and len(data) < w.nbytes // 10
    view = onnx.load_from_string(data)
    refs = {t.name: {e.key: e.value for e in t.external_data} for t in view.graph.initializer
            if t.data_location == TensorProto.EXTERNAL}
    assert list(refs) == ["conv_w"] and refs["conv_w"]["location"] == "m.onnx"
    raw = open(path, "rb").read()
    start, length = int(refs["conv_w"]["offset"]), int(refs["conv_w"]["length"])
    np.testing.assert_array_equal(np.frombuffer(raw[start:start + length], "<f4").reshape(w.shape), w)
    external_data_helper.load_external_data_for_model(view, str(tmp_path))
    for t in view.graph.initializer:
        t.ClearField("data_location")
    assert view.SerializeToString() == raw


def test_views_of_written_models_keep_every_initializer_value(tmp_path):
    """Every initializer of the view, resolved, has the value onnx.load reads from the file
    (float, int8 and int64 tensors, large and small)."""
    rng = np.random.default_rng(3)
    arrays = {"a": rng.standard_normal((200, 100)).astype(np.float32),
              "q": rng.integers(-128, 128, (300, 300)).astype(np.int8),
              "i": np.arange(VIEW_BYTES // 8, dtype=np.int64), "s": np.ones(3, np.float32)}
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])
    nodes = [helper.make_node("Identity", [k], [f"o_{k}"]) for k in arrays]
    outs = [helper.make_tensor_value_info(f"o_{k}", helper.np_dtype_to_tensor_dtype(a.dtype), list(a.shape))
            for k, a in arrays.items()]
    model = helper.make_model(helper.make_graph(nodes, "g", [x], outs,
                                                [numpy_helper.from_array(a, k) for k, a in arrays.items()]),
                              opset_imports=[helper.make_opsetid("", 17)])
    path = _write(model, tmp_path / "many.onnx")
    view = onnx.load_from_string(file_view(path))
    assert sorted(t.name for t in view.graph.initializer if t.data_location == TensorProto.EXTERNAL) == ["a", "i", "q"]
    external_data_helper.load_external_data_for_model(view, str(tmp_path))
    ref = {t.name: numpy_helper.to_array(t) for t in onnx.load(path).graph.initializer}
    got = {t.name: numpy_helper.to_array(t) for t in view.graph.initializer}
    assert got.keys() == ref.keys()
    for k in ref:
        np.testing.assert_array_equal(got[k], ref[k])
        assert got[k].dtype == ref[k].dtype


def test_checks_pass_a_valid_file_and_leave_nothing(tmp_path):
    w, b = _weights()
    path = _write(_conv_model(w, b), tmp_path / "m.onnx")
    check_structure(path, "net.prototxt", lambda _t: None, "the model m.onnx")
    assert check_runtime(path, "net.prototxt", lambda _t: None, "the model m.onnx")
    assert os.listdir(tmp_path) == ["m.onnx"]
    x = np.random.default_rng(1).standard_normal((1, 32, 8, 8)).astype(np.float32)
    assert ort_run(path, {"x": x})["y"].shape == (1, 64, 8, 8)


def test_checker_refusal_through_the_view_names_file_and_layer(tmp_path):
    """An op the checker does not know, beside a large weight: refused as on the file."""
    w, b = _weights()
    path = _write(_conv_model(w, b, op="Convolve"), tmp_path / "m.onnx")
    with pytest.raises(onnx.checker.ValidationError):  # the reference: the file itself
        onnx.checker.check_model(path, full_check=True)
    with pytest.raises(ExportError) as ei:
        check_structure(path, "net.prototxt", lambda t: "conv1" if "Convolve" in t else None, "the model m.onnx")
    assert ei.value.file == "net.prototxt" and ei.value.layer == "conv1"
    assert "onnx.checker refuses the model m.onnx" in str(ei.value)
    assert os.listdir(tmp_path) == ["m.onnx"]


def test_shape_inference_refusal_through_the_view(tmp_path):
    """The full check's strict shape inference sees the large weight's dims in the view: an
    output declared with other channels than the weight gives is refused as on the file."""
    w, b = _weights(c_out=64)
    model = _conv_model(w, b)
    model.graph.output[0].type.tensor_type.shape.dim[1].dim_value = 32
    path = _write(model, tmp_path / "m.onnx")
    with pytest.raises((onnx.checker.ValidationError, onnx.shape_inference.InferenceError)):
        onnx.checker.check_model(path, full_check=True)
    with pytest.raises(ExportError, match="onnx.checker refuses"):
        check_structure(path, "net.prototxt", lambda _t: None, "the model m.onnx")
    assert os.listdir(tmp_path) == ["m.onnx"]


def test_runtime_refusal_through_the_view_names_file_and_layer(tmp_path):
    """A valid model ORT refuses (an int32 DequantizeLinear before a Transpose), with a large
    weight in the same graph: ORT refuses the file, and the view's check names the layer."""
    w = np.random.default_rng(2).standard_normal((64, 512)).astype(np.float32)
    acc = helper.make_tensor_value_info("acc", TensorProto.INT32, [1, 2, 2, 2])
    v = helper.make_tensor_value_info("v", TensorProto.FLOAT, [1, 512])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8])
    z = helper.make_tensor_value_info("z", TensorProto.FLOAT, [1, 64])
    inits = [numpy_helper.from_array(np.array([0.5, 0.25], np.float32), "head_scale"),
             numpy_helper.from_array(np.zeros(2, np.int32), "head_acc_zero"),
             numpy_helper.from_array(w, "fc_w")]
    nodes = [helper.make_node("DequantizeLinear", ["acc", "head_scale", "head_acc_zero"], ["d"], axis=1),
             helper.make_node("Transpose", ["d"], ["t"], perm=[0, 2, 3, 1]),
             helper.make_node("Flatten", ["t"], ["y"], axis=1),
             helper.make_node("Gemm", ["v", "fc_w"], ["z"], transB=1)]
    model = helper.make_model(helper.make_graph(nodes, "g", [acc, v], [y, z], inits),
                              opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    path = _write(model, tmp_path / "m_quant.onnx")
    onnx.checker.check_model(path, full_check=True)
    assert file_view(path) is not None
    with pytest.raises(Exception, match="int32"):
        ort_session(path)
    owners = {"head_acc_zero": "head", "head_scale": "head"}
    with pytest.raises(ExportError) as ei:
        check_runtime(path, "net.prototxt", lambda t: next((v for k, v in owners.items() if k in t), None),
                      "the model m_quant.onnx")
    assert ei.value.file == "net.prototxt" and ei.value.layer == "head"
    assert "ONNX Runtime refuses the model m_quant.onnx" in str(ei.value)
    assert os.listdir(tmp_path) == ["m_quant.onnx"]


def test_raw_data_of_the_wrong_size_stays_in_the_view(tmp_path):
    """A large initializer whose raw_data does not match its dims is not referenced: the
    checks see it as the file holds it, and ORT refuses it as it refuses the file."""
    w, b = _weights()
    model = _conv_model(w, b)
    model.graph.initializer[0].raw_data = model.graph.initializer[0].raw_data[:-4]
    path = _write(model, tmp_path / "m.onnx")
    assert file_view(path) is None
    with pytest.raises(Exception):  # noqa: B017 - ONNX Runtime's own error classes, which vary by version
        ort_session(path)
    with pytest.raises(ExportError, match="ONNX Runtime refuses"):
        check_runtime(path, "net.prototxt", lambda _t: None, "the model m.onnx")


def test_a_file_that_is_not_a_message_has_no_view(tmp_path):
    """Truncated in the middle of a weight, or empty: no view; the checks read the file
    itself (and refuse it)."""
    w, b = _weights()
    raw = _conv_model(w, b).SerializeToString()
    cut = tmp_path / "cut.onnx"
    cut.write_bytes(raw[: len(raw) // 2])
    empty = tmp_path / "empty.onnx"
    empty.write_bytes(b"")
    assert file_view(str(cut)) is None and file_view(str(empty)) is None
    with pytest.raises(ExportError, match="ONNX Runtime refuses"):
        check_runtime(str(cut), "net.prototxt", lambda _t: None, "the model cut.onnx")
