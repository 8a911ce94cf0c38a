"""Deconvolution in ONNX Runtime: its float ConvTranspose (over dequantized uint8 input and
int8 weights, what the QDQ model runs) against the same arithmetic in integer operators
(input codes stuffed with the zero point between samples, padded, ConvInteger with the flipped
and transposed weights, Cast, Mul). One JSON line per shape: the integer form's relative
difference and both median latencies (1 thread). Why: ORT 1.32 has no int8 transposed
convolution (QLinearConvTranspose is not registered); this measures whether the integer
form would be worth writing. Run: .venv/bin/python benchmarks/bench_export_deconv.py
"""
from __future__ import annotations

import json
import time

import numpy as np
import onnxruntime as ort
from onnx import TensorProto as T
from onnx import helper, numpy_helper


def inits(d):
    return [numpy_helper.from_array(v, k) for k, v in d.items()]


def sess(m):
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    so.log_severity_level = 3
    return ort.InferenceSession(m.SerializeToString(), so, providers=["CPUExecutionProvider"])


def bench(s, x, n=20):
    s.run(None, {"x": x})
    t = []
    for _ in range(n):
        t0 = time.perf_counter()
        s.run(None, {"x": x})
        t.append(time.perf_counter() - t0)
    return 1000 * float(np.median(t))


def case(name, cin, cout, g, k, st, p, H):
    rng = np.random.default_rng(0)
    w = rng.integers(-127, 128, (cin, cout // g, k, k)).astype(np.int8)
    sw = np.float32(0.01); sx = np.float32(0.05); zx = np.uint8(120)
    x = rng.integers(0, 256, (1, cin, H, H)).astype(np.uint8)
    # A: DQ -> ConvTranspose (float weights)
    a = helper.make_graph([
        helper.make_node("DequantizeLinear", ["x", "sx", "zx"], ["xf"]),
        helper.make_node("DequantizeLinear", ["w", "sw"], ["wf"]),
        helper.make_node("ConvTranspose", ["xf", "wf"], ["y"], kernel_shape=[k, k], strides=[st, st], pads=[p]*4, group=g)],
        "a", [helper.make_tensor_value_info("x", T.UINT8, [1, cin, H, H])], [helper.make_tensor_value_info("y", T.FLOAT, None)],
        inits({"sx": sx, "zx": zx, "w": w, "sw": sw}))
    ma = helper.make_model(a, opset_imports=[helper.make_opsetid("", 17)])
    # B: stuff with zp, pad k-1-p, ConvInteger with flipped, transposed weights
    cpg, opg = cin // g, cout // g
    wc = w.reshape(g, cpg, opg, k, k).transpose(0, 2, 1, 3, 4).reshape(cout, cpg, k, k)[:, :, ::-1, ::-1]
    wu = (wc.astype(np.int16) + 128).astype(np.uint8)
    q = k - 1 - p
    nodes = [
        helper.make_node("Unsqueeze", ["x", "ax"], ["x6"]),  # N C H 1 W 1
        helper.make_node("Pad", ["x6", "pads6", "zx"], ["x6p"]),
        helper.make_node("Reshape", ["x6p", "shp"], ["xs"]),
        helper.make_node("Pad", ["xs", "pads4", "zx"], ["xp"]),
        helper.make_node("ConvInteger", ["xp", "wu", "zx", "wz"], ["acc"], kernel_shape=[k, k], group=g),
        helper.make_node("Cast", ["acc"], ["accf"], to=T.FLOAT),
        helper.make_node("Mul", ["accf", "dq"], ["y"])]
    HS = H * st
    b = helper.make_graph(nodes, "b", [helper.make_tensor_value_info("x", T.UINT8, [1, cin, H, H])],
                          [helper.make_tensor_value_info("y", T.FLOAT, None)],
                          inits({"ax": np.array([3, 5], np.int64),
                                 "pads6": np.array([0, 0, 0, 0, 0, 0, 0, 0, 0, st - 1, 0, st - 1], np.int64),
                                 "shp": np.array([1, cin, HS, HS], np.int64),
                                 # drop the trailing st-1 stuffed rows: negative pad at the end
                                 "pads4": np.array([0, 0, q, q, 0, 0, q - (st - 1), q - (st - 1)], np.int64),
                                 "zx": zx, "wu": np.ascontiguousarray(wu), "wz": np.uint8(128), "dq": np.float32(sx * sw)}))
    mb = helper.make_model(b, opset_imports=[helper.make_opsetid("", 17)])
    sa, sb = sess(ma), sess(mb)
    ya, yb = sa.run(None, {"x": x})[0], sb.run(None, {"x": x})[0]
    err = float(np.abs(ya - yb).max() / np.abs(ya).max())
    print(json.dumps(dict(case=name, cin=cin, cout=cout, group=g, kernel=k, stride=st, pad=p, size=H,
                          rel_diff=err, float_convtranspose_ms=round(bench(sa, x), 3),
                          integer_form_ms=round(bench(sb, x), 3))))


if __name__ == "__main__":
    case("fcn8s_upscore2", 21, 21, 1, 4, 2, 0, 16)
    case("fcn8s_upscore8", 21, 21, 1, 16, 8, 0, 34)
    case("bilinear_grouped", 64, 64, 64, 4, 2, 1, 32)
    case("decoder", 256, 128, 1, 4, 2, 1, 28)
    case("hed_upsample_2", 1, 1, 1, 4, 2, 0, 64)
    case("grouped_313", 313, 313, 313, 4, 2, 1, 56)
